"""Model loading: freezing, normalisation inside, every checkpoint format, the offline cache."""
from __future__ import annotations

import argparse
import shutil
import socket
import time
from pathlib import Path

import open_clip
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shiftlab
from conftest import TINY_CONFIG, make_tiny_model
from shiftlab import models as M
from shiftlab.models import OPENAI_MEAN, OPENAI_STD, ModelLoadError

GOLDEN_FILE = "tiny_clip_openai.pt"
RN50_URL_NAME = "RN50.pt"

@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny ops: one thread is fastest and immune to oversubscribed CPUs (conftest restores the count).
    torch.set_num_threads(1)



# -- helpers ----------------------------------------------------------------------------------

def _images(n: int = 3, size: int = 64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=gen)


def _features(model: shiftlab.ClipModel, x01: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = open_clip.tokenize(["a photo of a goldfish.", "a photo of a great white shark."])
    with torch.no_grad():
        img = model.encode_pixels(x01)
        txt = model.clip.encode_text(tokens, normalize=True)
    return img, txt


def _golden_state_dict(golden_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(golden_dir / GOLDEN_FILE, map_location="cpu", weights_only=True)


def _tiny_openai_state_dict(seed: int) -> tuple[shiftlab.ClipModel, dict[str, torch.Tensor]]:
    """open_clip's ModifiedResNet CLIP uses OpenAI's key names: its state dict is an OpenAI state dict."""
    src = make_tiny_model(seed=seed)
    sd = {k: v.clone() for k, v in src.clip.state_dict().items()}
    assert M._is_openai_state_dict(sd)
    return src, sd


def _torchscript_archive(sd: dict[str, torch.Tensor], path: Path) -> None:
    """Save a TorchScript archive whose state_dict() has exactly the given (OpenAI) keys.

    OpenAI's released .pt files are scripted modules; their state dict carries the same dotted
    names as the plain state dict plus the scalar buffers input_resolution/context_length/vocab_size.
    """

    class Node(nn.Module):
        pass

    class Root(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    root = Root()
    for key, value in sd.items():
        *parents, leaf = key.split(".")
        mod: nn.Module = root
        for part in parents:
            if part not in mod._modules:
                mod.add_module(part, Node())
            mod = mod._modules[part]
        if value.is_floating_point():
            mod.register_parameter(leaf, nn.Parameter(value.clone(), requires_grad=False))
        else:
            mod.register_buffer(leaf, value.clone())
    torch.jit.script(root).save(str(path))


# -- frozen, eval, normalisation ---------------------------------------------------------------

def test_random_model_is_frozen_and_stays_in_eval():
    model = make_tiny_model(seed=3)
    params = list(model.parameters())
    assert params and not any(p.requires_grad for p in params)
    assert not model.training and all(not m.training for m in model.modules())

    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns, "the tiny model has a ModifiedResNet image tower with BatchNorm"
    before = [bn.running_mean.clone() for bn in bns]
    assert model.train() is model
    model.train(True)
    assert not model.training and all(not m.training for m in model.modules())
    with torch.no_grad():
        model(_images(4))
    # running statistics untouched: BatchNorm really ran in eval mode
    assert all(torch.equal(b, bn.running_mean) for b, bn in zip(before, bns))


def test_preprocess_facts(tiny_model):
    assert tiny_model.image_size == 64
    assert tiny_model.preprocess.mean == OPENAI_MEAN and tiny_model.preprocess.std == OPENAI_STD
    assert tiny_model.device == torch.device("cpu")
    assert tiny_model.logit_scale == pytest.approx(1 / 0.07, rel=1e-6)  # open_clip's random init


def test_normalisation_is_inside_the_model(tiny_model):
    x = _images(3)
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
    with torch.no_grad():
        got = tiny_model.encode_pixels(x)
        want = tiny_model.encode_normalized((x - mean) / std)
        manual = F.normalize(tiny_model.clip.encode_image((x - mean) / std), dim=-1)
        unnormalised = tiny_model.encode_normalized(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got, manual, rtol=0, atol=1e-6)
    torch.testing.assert_close(tiny_model(x), got, rtol=0, atol=0)
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(3), rtol=0, atol=1e-5)
    # the normalisation matters (guards against a no-op normalize)
    assert (got - unnormalised).abs().max() > 1e-3


# -- OpenAI checkpoints --------------------------------------------------------------------------

def test_golden_openai_state_dict_matches_open_clip_loader(golden_dir):
    torch.set_num_threads(1)
    model = shiftlab.load_model("tiny", str(golden_dir / GOLDEN_FILE))
    ref = open_clip.load_openai_model(str(golden_dir / GOLDEN_FILE), device="cpu").float().eval()
    x = _images(4)
    got_img, got_txt = _features(model, x)
    mean = torch.tensor(OPENAI_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(OPENAI_STD).view(1, 3, 1, 1)
    tokens = open_clip.tokenize(["a photo of a goldfish.", "a photo of a great white shark."])
    with torch.no_grad():
        want_img = ref.encode_image((x - mean) / std, normalize=True)
        want_txt = ref.encode_text(tokens, normalize=True)
    torch.testing.assert_close(got_img, want_img, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_txt, want_txt, rtol=0, atol=1e-6)
    assert model.logit_scale == pytest.approx(100.0, abs=1e-4)
    assert model.image_size == 64
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    # OpenAI's models were trained with QuickGELU: the text tower must use it
    acts = [blk.mlp.gelu for blk in model.clip.transformer.resblocks]
    assert acts and all(isinstance(a, open_clip.transformer.QuickGELU) for a in acts)
    # every float weight arrives as float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_float32_openai_state_dict_round_trips_losslessly(tmp_path):
    src, sd = _tiny_openai_state_dict(seed=31)
    # keys open_clip's OpenAI builder casts to fp16 (conv, attention, linear, text projection)
    keys = ["visual.conv1.weight", "transformer.resblocks.0.attn.in_proj_weight",
            "transformer.resblocks.1.mlp.c_fc.weight", "text_projection", "visual.attnpool.c_proj.weight"]
    for k in keys:
        assert sd[k].dtype == torch.float32
        assert not torch.equal(sd[k].half().float(), sd[k]), "test values must not be fp16-representable"
    path = tmp_path / "fp32_openai.pt"
    torch.save(sd, path)
    model = shiftlab.load_model("tiny", str(path))
    loaded = model.clip.state_dict()
    for k in keys:
        assert loaded[k].dtype == torch.float32
        assert torch.equal(loaded[k], sd[k]), f"{k} was rounded on load"
    assert set(loaded) == set(sd)
    for k, v in sd.items():
        assert torch.equal(loaded[k], v), k
    x = _images(2, seed=8)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_torchscript_openai_archive_loads(tmp_path):
    src, sd = _tiny_openai_state_dict(seed=32)
    scripted = dict(sd)
    # OpenAI's archives also carry these scalar buffers, which are not weights
    scripted["input_resolution"] = torch.tensor(64)
    scripted["context_length"] = torch.tensor(77)
    scripted["vocab_size"] = torch.tensor(49408)
    path = tmp_path / "RN-tiny-jit.pt"
    _torchscript_archive(scripted, path)
    reread = torch.jit.load(str(path), map_location="cpu").state_dict()
    assert set(reread) == set(scripted)

    model = shiftlab.load_model("tiny", str(path))
    x = _images(2, seed=5)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert isinstance(model.clip.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)


def test_torchscript_fp16_archive_like_openai(golden_dir, tmp_path):
    # OpenAI's released archives hold fp16 weights (the golden file's values are fp16-exact)
    sd = _golden_state_dict(golden_dir)
    assert any(v.dtype == torch.float16 for v in sd.values())
    path = tmp_path / "golden-jit.pt"
    _torchscript_archive(sd, path)
    model = shiftlab.load_model("tiny", str(path))
    plain = shiftlab.load_model("tiny", str(golden_dir / GOLDEN_FILE))
    x = _images(2, seed=5)
    for got, want in zip(_features(model, x), _features(plain, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_torchscript_archive_is_read_without_unpickling(tmp_path, monkeypatch):
    # The archive goes through torch.jit.load, never through pickle-based torch.load.
    src, sd = _tiny_openai_state_dict(seed=33)
    path = tmp_path / "jit.pt"
    _torchscript_archive(sd, path)

    def no_pickle(*a, **k):
        raise AssertionError("torch.load must not be used for a TorchScript archive")

    monkeypatch.setattr(torch, "load", no_pickle)
    model = shiftlab.load_model("tiny", str(path))
    assert model.logit_scale == pytest.approx(src.logit_scale)


# -- open_clip-format checkpoints ---------------------------------------------------------------

def test_open_clip_checkpoint_with_module_prefix(tmp_path):
    src = make_tiny_model(seed=11)
    sd = {f"module.{k}": v.clone() for k, v in src.clip.state_dict().items()}
    path = tmp_path / "epoch_1.pt"
    torch.save({"epoch": 1, "name": "run", "state_dict": sd}, path)
    model = shiftlab.load_model("shiftlab-tiny", str(path))
    x = _images(2, seed=1)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_safetensors_checkpoint(tmp_path):
    from safetensors.torch import save_file
    src = make_tiny_model(seed=12)
    path = tmp_path / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in src.clip.state_dict().items()}, str(path))
    model = shiftlab.load_model("shiftlab-tiny", str(path))
    x = _images(2, seed=2)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # the weights are really the file's, not a fresh random init
    other = make_tiny_model(seed=13)
    assert (_features(other, x)[0] - _features(model, x)[0]).abs().max() > 1e-4


def test_non_openai_layout_goes_through_open_clip(tmp_path):
    # A custom-text CLIP has `text.*` keys, so it is not an OpenAI state dict.
    cfg = dict(TINY_CONFIG, custom_text=True)
    name = "shiftlab-tiny-customtext"
    torch.manual_seed(4)
    src = shiftlab.load_model(name, None, model_config=cfg)
    sd = src.clip.state_dict()
    assert not M._is_openai_state_dict(sd)
    from safetensors.torch import save_file
    path = tmp_path / "custom.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    model = shiftlab.load_model(name, str(path))
    x = _images(2, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(model.encode_pixels(x), src.encode_pixels(x), rtol=0, atol=1e-6)

    # a checkpoint that does not fit the named architecture is refused with the offending keys
    broken = {k: v for k, v in sd.items() if not k.startswith("text.transformer.resblocks.1.")}
    save_file({k: v.contiguous() for k, v in broken.items()}, str(tmp_path / "broken.safetensors"))
    with pytest.raises(ModelLoadError, match="does not fit"):
        shiftlab.load_model(name, str(tmp_path / "broken.safetensors"))


# -- pickle safety ----------------------------------------------------------------------------

def test_pickled_python_objects_need_trust(tmp_path):
    src = make_tiny_model(seed=21)
    path = tmp_path / "with_args.pt"
    torch.save({"state_dict": src.clip.state_dict(), "args": argparse.Namespace(lr=0.1, model="tiny")}, path)
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    msg = str(info.value)
    assert "--trust-checkpoint" in msg and str(path) in msg

    model = shiftlab.load_model("shiftlab-tiny", str(path), trust_checkpoint=True)
    x = _images(1, seed=4)
    torch.testing.assert_close(_features(model, x)[0], _features(src, x)[0], rtol=0, atol=1e-6)


def test_non_mapping_checkpoint_is_refused(tmp_path):
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(ModelLoadError, match="expected a state dict"):
        shiftlab.load_model("shiftlab-tiny", str(path))


def test_missing_checkpoint_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "RN50.pt"
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", str(path))
    assert str(path) in str(info.value)


def test_unknown_model_and_tag():
    with pytest.raises(ModelLoadError, match="unknown model"):
        shiftlab.load_model("no-such-model-xyz", None)
    with pytest.raises(ModelLoadError, match="unknown pretrained tag"):
        shiftlab.load_model("RN50", "no-such-tag")


# -- the offline cache -------------------------------------------------------------------------

@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty home and caches, and no network at all."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("SHIFTLAB_MODEL_CACHE", str(tmp_path / "clip-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("load_model tried to open a network connection")

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    return tmp_path


def test_openai_resolves_to_quickgelu():
    assert M._model_name_for("RN50", openai_weights=True) == "RN50-quickgelu"
    assert M._model_name_for("RN50-quickgelu", openai_weights=True) == "RN50-quickgelu"
    assert M._model_name_for("RN50", openai_weights=False) == "RN50"


def test_offline_openai_tag_fails_fast_with_url_and_destination(empty_cache):
    start = time.monotonic()
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", "openai")
    elapsed = time.monotonic() - start
    assert elapsed < 5.0
    msg = str(info.value)
    url = open_clip.get_pretrained_cfg("RN50-quickgelu", "openai")["url"]
    assert url and url in msg
    assert str(empty_cache / "clip-cache" / RN50_URL_NAME) in msg
    assert "--download" in msg


def test_offline_download_request_fails_fast(empty_cache):
    start = time.monotonic()
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", "openai", allow_download=True)
    assert time.monotonic() - start < 5.0
    msg = str(info.value)
    assert open_clip.get_pretrained_cfg("RN50-quickgelu", "openai")["url"] in msg
    assert str(empty_cache / "clip-cache" / RN50_URL_NAME) in msg


def test_cached_openai_file_is_found(empty_cache):
    cache = empty_cache / "clip-cache"
    cache.mkdir()
    local, where = M._cached_pretrained_file("RN50-quickgelu", "openai", None)
    assert local is None and where.endswith(str(cache / RN50_URL_NAME))
    # stand-in weights under the expected file name (the real file is 256 MB)
    src, sd = _tiny_openai_state_dict(seed=34)
    torch.save(sd, cache / RN50_URL_NAME)
    local, where = M._cached_pretrained_file("RN50-quickgelu", "openai", None)
    assert local == str(cache / RN50_URL_NAME) and where == ""

    start = time.monotonic()
    model = shiftlab.load_model("RN50", "openai")
    assert time.monotonic() - start < 5.0
    assert model.name == "RN50-quickgelu"
    x = _images(2, seed=6)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert isinstance(model.clip.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)

    # an explicit cache_dir takes precedence over the environment
    other = empty_cache / "elsewhere"
    local, where = M._cached_pretrained_file("RN50-quickgelu", "openai", str(other))
    assert local is None and str(other / RN50_URL_NAME) in where
    other.mkdir()
    shutil.copy(cache / RN50_URL_NAME, other / RN50_URL_NAME)
    (cache / RN50_URL_NAME).unlink()
    assert shiftlab.load_model("RN50", "openai", cache_dir=str(other)).name == "RN50-quickgelu"


def test_hf_cache_snapshot_is_found(empty_cache, monkeypatch):
    cfg = open_clip.get_pretrained_cfg("RN50-quickgelu", "openai")
    org, repo = cfg["hf_hub"].rstrip("/").split("/")
    snap = empty_cache / "hf" / "hub" / f"models--{org}--{repo}" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    target = snap / "open_clip_model.safetensors"
    target.write_bytes(b"placeholder")
    local, _ = M._cached_pretrained_file("RN50-quickgelu", "openai", None)
    assert local == str(target)
    # HF_HUB_CACHE, when set, is where the hub cache lives
    monkeypatch.setenv("HF_HUB_CACHE", str(empty_cache / "hub2"))
    local, _ = M._cached_pretrained_file("RN50-quickgelu", "openai", None)
    assert local is None
