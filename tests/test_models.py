"""Model loading: freezing, normalisation inside, every checkpoint format, the offline cache."""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shiftlab
from _imports import lazy_module
from conftest import TINY_CONFIG, make_tiny_model
from shiftlab.models import ModelLoadError, architectures
from shiftlab.models import loader as M
from shiftlab.models.checkpoints import cached_tag_file
from shiftlab.options import speaking_cli
from shiftlab.views import preprocess
from shiftlab.views.preprocess import OPENAI_MEAN, OPENAI_STD

open_clip = lazy_module("open_clip", optional=False)   # imported by the first test that reads it


GOLDEN_FILE = "tiny_clip_openai.pt"
RN50_URL_NAME = "RN50.pt"

pytestmark = pytest.mark.usefixtures("one_thread")


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
    assert architectures._is_openai_state_dict(sd)
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
    model = shiftlab.load_model("shiftlab-tiny", str(golden_dir / GOLDEN_FILE))
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
    model = shiftlab.load_model("shiftlab-tiny", str(path))
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


@pytest.mark.slow
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

    model = shiftlab.load_model("shiftlab-tiny", str(path))
    x = _images(2, seed=5)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert isinstance(model.clip.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)


@pytest.mark.slow
def test_torchscript_fp16_archive_like_openai(golden_dir, tmp_path):
    # OpenAI's released archives hold fp16 weights (the golden file's values are fp16-exact)
    sd = _golden_state_dict(golden_dir)
    assert any(v.dtype == torch.float16 for v in sd.values())
    path = tmp_path / "golden-jit.pt"
    _torchscript_archive(sd, path)
    model = shiftlab.load_model("shiftlab-tiny", str(path))
    plain = shiftlab.load_model("shiftlab-tiny", str(golden_dir / GOLDEN_FILE))
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
    model = shiftlab.load_model("shiftlab-tiny", str(path))
    assert model.logit_scale == pytest.approx(src.logit_scale)


# -- open_clip-format checkpoints ---------------------------------------------------------------

@pytest.mark.slow
def test_open_clip_checkpoint_with_module_prefix(tmp_path):
    src = make_tiny_model(seed=11)
    sd = {f"module.{k}": v.clone() for k, v in src.clip.state_dict().items()}
    path = tmp_path / "epoch_1.pt"
    torch.save({"epoch": 1, "name": "run", "state_dict": sd}, path)
    model = shiftlab.load_model("shiftlab-tiny", str(path))
    x = _images(2, seed=1)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.slow
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


@pytest.mark.slow
def test_non_openai_layout_goes_through_open_clip(tmp_path):
    # A custom-text CLIP has `text.*` keys, so it is not an OpenAI state dict.
    cfg = dict(TINY_CONFIG, custom_text=True)
    name = "shiftlab-tiny-customtext"
    torch.manual_seed(4)
    src = shiftlab.load_model(name, None, model_config=cfg)
    sd = src.clip.state_dict()
    assert not architectures._is_openai_state_dict(sd)
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

@pytest.mark.slow
def test_pickled_python_objects_need_trust(tmp_path):
    src = make_tiny_model(seed=21)
    path = tmp_path / "with_args.pt"
    torch.save({"state_dict": src.clip.state_dict(), "args": argparse.Namespace(lr=0.1, model="tiny")}, path)
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    msg = str(info.value)
    assert "trust_checkpoint=True" in msg and "--trust-checkpoint" not in msg and str(path) in msg

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
def network_attempts() -> list[str]:
    """Every name lookup and connection tried under `empty_cache`, in order (each was refused)."""
    return []


@pytest.fixture
def empty_cache(tmp_path, monkeypatch, network_attempts):
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
        network_attempts.append("connect")
        raise AssertionError("load_model tried to open a network connection")

    def no_dns(host, *args, **kwargs):
        network_attempts.append(f"resolve {host}")
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    return tmp_path


def _cached(name: str, tag: str, cache_dir: str | None) -> tuple[str | None, str]:
    local, where = cached_tag_file(open_clip.get_pretrained_cfg(name, tag), cache_dir)
    return (str(local) if local is not None else None), where


def test_openai_resolves_to_quickgelu():
    assert architectures._quickgelu_name("RN50", quick_gelu=True) == "RN50-quickgelu"
    assert architectures._quickgelu_name("RN50-quickgelu", quick_gelu=True) == "RN50-quickgelu"
    assert architectures._quickgelu_name("RN50", quick_gelu=False) == "RN50"
    # the tag's own record says OpenAI's weights were trained with QuickGELU
    assert open_clip.get_pretrained_cfg("RN50", "openai")["quick_gelu"] is True


def _expensive_paths(monkeypatch) -> list[str]:
    """Record (and refuse) what makes an offline failure slow: building the architecture before the
    weights are found, and open_clip's download, whose hub client retries for a minute."""
    taken: list[str] = []

    def refuse(what):
        def call(*args, **kwargs):
            taken.append(what)
            raise AssertionError(f"load_model took the slow path: {what}")
        return call
    monkeypatch.setattr(M, "_create", refuse("build the architecture"))
    monkeypatch.setattr(M, "_load_file", refuse("load a checkpoint"))
    monkeypatch.setattr("open_clip.download_pretrained", refuse("download"))
    return taken


def test_offline_openai_tag_fails_fast_with_url_and_destination(empty_cache, network_attempts, monkeypatch):
    taken = _expensive_paths(monkeypatch)
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", "openai", allow_download=False)
    assert network_attempts == [] and taken == []       # decided from the cache alone
    msg = str(info.value)
    url = open_clip.get_pretrained_cfg("RN50-quickgelu", "openai")["url"]
    assert url and url in msg
    assert str(empty_cache / "clip-cache" / RN50_URL_NAME) in msg
    # the library names its keyword, the command line its flag (#34: Python errors said `--download`)
    assert "allow_download=True" in msg and "--download" not in msg and "--pretrained" not in msg
    from shiftlab.options import speaking_cli
    with speaking_cli(), pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", "openai", allow_download=False)
    assert "--download" in str(info.value) and "--pretrained /path/to/checkpoint" in str(info.value)


@pytest.mark.parametrize("download", [{"allow_download": True}, {}], ids=["asked", "by-default"])
def test_offline_download_request_fails_fast(empty_cache, network_attempts, monkeypatch, download):
    # issue 40 case 8: the README's `load_model("RN50", pretrained="openai")` downloads by default, as open_clip
    # does; offline that is one line, decided by a name lookup, never a minute of hub retries
    taken = _expensive_paths(monkeypatch)
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", "openai", **download)
    # one lookup per download host and nothing else: no connection, no download, no model built
    assert network_attempts and all(a.startswith("resolve ") for a in network_attempts)
    assert len(set(network_attempts)) == len(network_attempts) and taken == []
    msg = str(info.value)
    assert "no internet connection" in msg and "\n" not in msg
    assert open_clip.get_pretrained_cfg("RN50-quickgelu", "openai")["url"] in msg
    assert str(empty_cache / "clip-cache" / RN50_URL_NAME) in msg


def test_a_tag_is_downloaded_by_default_then_read_from_the_cache(empty_cache, network_attempts, monkeypatch,
                                                                tiny_checkpoint):
    """Issue 40 case 8: online, `load_model(name, tag)` downloads without being asked (open_clip's default);
    the download is a local stand-in (a tag of the tiny CLIP whose 'download' copies a checkpoint), and
    the second call reads the cached file without a download."""
    cache = empty_cache / "clip-cache"
    cfg = {"url": "https://example.invalid/tiny/stand-in.pt", "quick_gelu": False}
    tags, cfgs = open_clip.list_pretrained_tags_by_model, open_clip.get_pretrained_cfg
    monkeypatch.setattr("open_clip.list_pretrained_tags_by_model",
                        lambda name: ["stand-in"] if name.startswith("shiftlab-tiny") else tags(name))
    monkeypatch.setattr("open_clip.get_pretrained_cfg",
                        lambda name, tag: dict(cfg) if tag == "stand-in" else cfgs(name, tag))
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: network_attempts.append(f"resolve {host}") or [])
    downloads = []

    def download(pretrained_cfg, cache_dir=None):
        downloads.append(pretrained_cfg["url"])
        cache.mkdir(exist_ok=True)
        target = cache / "stand-in.pt"
        shutil.copy(tiny_checkpoint, target)
        return str(target)
    monkeypatch.setattr("open_clip.download_pretrained", download)
    model = shiftlab.load_model("shiftlab-tiny", pretrained="stand-in")
    assert downloads == [cfg["url"]] and network_attempts       # asked the network (a name lookup), downloaded
    assert model.checkpoint_sha256 == hashlib.sha256(tiny_checkpoint.read_bytes()).hexdigest()
    network_attempts.clear()
    again = shiftlab.load_model("shiftlab-tiny", pretrained="stand-in")
    assert downloads == [cfg["url"]] and network_attempts == []   # the cached file: no network, no download
    assert again.checkpoint_sha256 == model.checkpoint_sha256


@pytest.mark.slow
def test_cached_openai_file_is_found(empty_cache):
    cache = empty_cache / "clip-cache"
    cache.mkdir()
    local, where = _cached("RN50-quickgelu", "openai", None)
    assert local is None and where.endswith(str(cache / RN50_URL_NAME))
    # stand-in weights under the expected file name: a random RN50 in fp16 like OpenAI's (the architecture
    # is checked against the name, so the stand-in must be a real RN50)
    torch.manual_seed(34)
    src = shiftlab.load_model("RN50-quickgelu", None)
    sd = {k: v.half() if v.is_floating_point() else v for k, v in src.clip.state_dict().items()}
    src.clip.load_state_dict({k: v.float() for k, v in sd.items()})
    torch.save(sd, cache / RN50_URL_NAME)
    local, where = _cached("RN50-quickgelu", "openai", None)
    assert local == str(cache / RN50_URL_NAME) and where == ""

    # the empty_cache fixture fails any network connection: the load below is served from the cache
    model = shiftlab.load_model("RN50", "openai")
    assert model.name == "RN50-quickgelu"
    assert model.checkpoint_sha256 == hashlib.sha256((cache / RN50_URL_NAME).read_bytes()).hexdigest()
    x = _images(2, size=224, seed=6)
    for got, want in zip(_features(model, x), _features(src, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert isinstance(model.clip.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)

    # an explicit cache_dir takes precedence over the environment
    other = empty_cache / "elsewhere"
    local, where = _cached("RN50-quickgelu", "openai", str(other))
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
    local, _ = _cached("RN50-quickgelu", "openai", None)
    assert local == str(target)
    # HF_HUB_CACHE, when set, is where the hub cache lives
    monkeypatch.setenv("HF_HUB_CACHE", str(empty_cache / "hub2"))
    local, _ = _cached("RN50-quickgelu", "openai", None)
    assert local is None


# -- the model is what the user named -------------------------------------------------------------

def test_openai_checkpoint_of_another_architecture_is_refused_naming_both(tmp_path):
    # Loading the file's own architecture for `--model ViT-B-32 --pretrained rn_file.pt` (or `--model RN51`)
    # would label the run with a name that is not the model that ran.
    _, sd = _tiny_openai_state_dict(seed=40)
    path = tmp_path / "tiny_openai.pt"
    torch.save(sd, path)
    for wrong in ("ViT-B-32", "RN50"):
        with pytest.raises(ModelLoadError) as info:
            shiftlab.load_model(wrong, str(path))
        msg = str(info.value)
        assert f"'{wrong}'" in msg and "shiftlab-tiny" in msg and "ResNet 1-1-1-1 width 16, 64 px" in msg
        assert str(path) in msg and "\n" not in msg
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN51", str(path))
    msg = str(info.value)
    assert "unknown model 'RN51'" in msg and "shiftlab-tiny" in msg and "\n" not in msg
    # the matching name loads and is the name the model reports
    assert shiftlab.load_model("shiftlab-tiny", str(path)).name == "shiftlab-tiny"


def test_open_clip_checkpoint_of_another_shape_is_refused(tmp_path):
    from safetensors.torch import save_file
    cfg = dict(TINY_CONFIG, embed_dim=48)
    torch.manual_seed(5)
    wide = shiftlab.load_model("shiftlab-tiny-embed48", None, model_config=cfg)
    for suffix in (".pt", ".safetensors"):
        path = tmp_path / f"wide{suffix}"
        state = {k: v.contiguous() for k, v in wide.clip.state_dict().items()}
        torch.save(state, path) if suffix == ".pt" else save_file(state, str(path))
        with pytest.raises(ModelLoadError) as info:
            shiftlab.load_model("shiftlab-tiny", str(path))
        msg = str(info.value)
        assert "does not fit the model 'shiftlab-tiny'" in msg and "text_projection (64, 48) vs (64, 32)" in msg
        assert "embed 48" in msg and "\n" not in msg


def test_checkpoint_sha256_is_the_files(tmp_path, golden_dir):
    src, sd = _tiny_openai_state_dict(seed=41)
    path = tmp_path / "w.pt"
    torch.save(sd, path)
    model = shiftlab.load_model("shiftlab-tiny", f"file:{path}")
    assert model.checkpoint_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert model.pretrained == f"file:{path}"
    assert shiftlab.load_model("shiftlab-tiny", None).checkpoint_sha256 is None
    golden = shiftlab.load_model("shiftlab-tiny", str(golden_dir / GOLDEN_FILE))
    assert golden.checkpoint_sha256 == hashlib.sha256((golden_dir / GOLDEN_FILE).read_bytes()).hexdigest()


# -- tags vs paths: the explicit rule -----------------------------------------------------------------------

def test_pretrained_rule_tags_files_and_errors(tmp_path, monkeypatch):
    _, sd = _tiny_openai_state_dict(seed=42)
    monkeypatch.chdir(tmp_path)
    # a file whose name has no slash and no suffix is still a file, because it exists and is no tag
    torch.save(sd, tmp_path / "weights")
    assert shiftlab.load_model("shiftlab-tiny", "weights").checkpoint_sha256 is not None
    # file: says "a file", and the file must exist
    with pytest.raises(ModelLoadError, match=r"checkpoint file .*missing\.pt does not exist"):
        shiftlab.load_model("shiftlab-tiny", "file:missing.pt")
    # a name that is neither a tag nor a file
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", "opneai")
    msg = str(info.value)
    assert "unknown pretrained tag 'opneai' for model 'RN50'" in msg and "'openai'" in msg and "file:" in msg
    # a path-looking value that does not exist is called a missing file
    with pytest.raises(ModelLoadError, match=r"checkpoint file .*nowhere\.safetensors does not exist"):
        shiftlab.load_model("RN50", "nowhere.safetensors")
    with pytest.raises(ModelLoadError, match="expected hf-hub:ORG/REPO"):
        shiftlab.load_model("RN50", "hf-hub:just-a-name")


def test_hf_hub_weights_come_from_the_cache_with_the_repos_preprocessing(empty_cache):
    from safetensors.torch import save_file
    src = make_tiny_model(seed=43)
    snap = empty_cache / "hf" / "hub" / "models--someorg--tiny-clip" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in src.clip.state_dict().items()}, str(snap / "open_clip_model.safetensors"))
    pp = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bilinear", "resize_mode": "squash"}
    (snap / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CONFIG, "preprocess_cfg": pp}))
    model = shiftlab.load_model("shiftlab-tiny", "hf-hub:someorg/tiny-clip")
    assert model.preprocess == preprocess.Preprocess(64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear", "squash")
    x = _images(2, seed=9)
    with torch.no_grad():
        torch.testing.assert_close(model.encode_normalized(x), src.encode_normalized(x), rtol=0, atol=1e-6)
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache"):
        shiftlab.load_model("shiftlab-tiny", "hf-hub:someorg/absent", allow_download=False)
    with pytest.raises(ModelLoadError, match="no internet connection"):   # downloaded by default: offline, one line
        shiftlab.load_model("shiftlab-tiny", "hf-hub:someorg/absent")


# -- preprocessing comes from open_clip ------------------------------------------------------------------

def test_preprocess_is_the_tags_published_config():
    siglip = architectures.model_preprocess("ViT-B-16-SigLIP", "webli")
    openai = architectures.model_preprocess("RN50-quickgelu", "openai")
    assert tuple(siglip["mean"]) == (0.5, 0.5, 0.5) and siglip["resize_mode"] == "squash"
    assert tuple(openai["mean"]) == OPENAI_MEAN and openai["resize_mode"] == "shortest"
    # without a tag: what every published tag of the model agrees on
    assert architectures.model_preprocess("ViT-B-16-SigLIP") == siglip
    assert architectures.model_preprocess("RN50-quickgelu") == openai
    # tags that disagree (ViT-L-14: OpenAI's and DFN's mean/std) fall back to open_clip's default
    assert tuple(architectures.model_preprocess("ViT-L-14")["mean"]) == OPENAI_MEAN


@pytest.mark.slow
def test_random_weights_take_their_architectures_preprocessing():
    # Two open_clip configs whose published preprocessing differs: Perception Encoder tiny (384 px, mean/std 0.5,
    # bilinear squash) and the tiny OpenAI-style CLIP. Previously both got OpenAI's mean/std.
    torch.manual_seed(0)
    pe = shiftlab.load_model("PE-Core-T-16-384", None)
    tiny = make_tiny_model(seed=0)
    assert pe.preprocess == preprocess.Preprocess(384, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear", "squash")
    assert tiny.preprocess == preprocess.Preprocess(64)
    x = _images(1, size=384)
    torch.testing.assert_close(pe.normalize(x), (x - 0.5) / 0.5)
    with torch.no_grad():
        assert pe.encode_pixels(x).shape == (1, 512)


def test_custom_architectures_go_through_open_clips_registry():
    import json as _json
    cfg = dict(TINY_CONFIG, embed_dim=40)
    assert architectures.register_architecture("shiftlab-tiny-embed40", cfg) == "shiftlab-tiny-embed40"
    assert "shiftlab-tiny-embed40" in open_clip.list_models()
    assert open_clip.get_model_config("shiftlab-tiny-embed40") == _json.loads(_json.dumps(cfg))
    assert "shiftlab-tiny-embed40" not in open_clip.factory._MODEL_CONFIGS or any(
        str(p).endswith("shiftlab-tiny-embed40.json") for p in open_clip.factory._MODEL_CONFIG_PATHS)
    with pytest.raises(ModelLoadError, match="is an open_clip architecture"):
        architectures.register_architecture("RN50", cfg)
    assert not hasattr(M, "load_model_config")


def test_registering_an_architecture_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    # Every process that registered a config used to leave a shiftlab-model-configs-* folder behind
    # (thousands after a day of test runs); the registered config must survive its file's removal.
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = dict(TINY_CONFIG, embed_dim=24)
    architectures.register_architecture("shiftlab-tiny-embed24", cfg)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("shiftlab-")]   # (torch's own may appear)
    assert open_clip.get_model_config("shiftlab-tiny-embed24")["embed_dim"] == 24
    model = open_clip.create_model("shiftlab-tiny-embed24", pretrained=None)
    assert model.text_projection.shape[-1] == 24


# -- checkpoint errors are one line and accurate -----------------------------------------------------

def _assert_one_line_corrupt(path: Path) -> str:
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    msg = str(info.value)
    assert "corrupt" in msg and str(path) in msg and "\n" not in msg
    assert "trust" not in msg
    return msg


def test_truncated_and_garbage_pt_are_corrupt_not_untrusted(tmp_path):
    _, sd = _tiny_openai_state_dict(seed=44)
    good = tmp_path / "good.pt"
    torch.save(sd, good)
    data = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    _assert_one_line_corrupt(tmp_path / "truncated.pt")
    (tmp_path / "garbage.pt").write_bytes(bytes(range(256)) * 40)
    _assert_one_line_corrupt(tmp_path / "garbage.pt")
    (tmp_path / "text.pt").write_bytes(b"not a checkpoint\n" * 20)
    _assert_one_line_corrupt(tmp_path / "text.pt")
    legacy = tmp_path / "legacy.pt"
    torch.save(sd, legacy, _use_new_zipfile_serialization=False)
    (tmp_path / "legacy_truncated.pt").write_bytes(legacy.read_bytes()[:-100])
    _assert_one_line_corrupt(tmp_path / "legacy_truncated.pt")


def test_garbage_safetensors_header_is_corrupt(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes((10 ** 6).to_bytes(8, "little") + b"{not json")
    msg = _assert_one_line_corrupt(path)
    assert ".safetensors" in msg


def test_damaged_torchscript_archive_is_corrupt(tmp_path):
    import zipfile
    _, sd = _tiny_openai_state_dict(seed=45)
    path = tmp_path / "jit.pt"
    _torchscript_archive(sd, path)
    damaged = tmp_path / "damaged.pt"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(damaged, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("data.pkl"):
                data = data[: len(data) // 3]
            dst.writestr(item, data)
    msg = _assert_one_line_corrupt(damaged)
    assert "TorchScript" in msg


def test_trust_advice_only_for_a_valid_pickle_of_python_objects(tmp_path):
    src = make_tiny_model(seed=46)
    path = tmp_path / "with_args.pt"
    torch.save({"state_dict": src.clip.state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    msg = str(info.value)
    assert "trust_checkpoint=True" in msg and "argparse.Namespace" in msg and "corrupt" not in msg and "\n" not in msg
    with speaking_cli(), pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    assert "pass --trust-checkpoint if you trust this file" in str(info.value)


class _Payload:
    """Unpickling this runs os.system: what a hostile checkpoint would hold."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("layout", ["zip", "legacy", "plain_pickle"])
def test_a_malicious_pickle_is_untrusted_not_corrupt_and_never_run(tmp_path, layout):
    import pickle
    marker = tmp_path / "pwned"
    _, sd = _tiny_openai_state_dict(seed=47)
    path = tmp_path / f"{layout}.pt"
    payload = {"state_dict": sd, "extra": _Payload(marker)}
    if layout == "plain_pickle":
        path.write_bytes(pickle.dumps(payload, protocol=4))
    else:
        torch.save(payload, path, _use_new_zipfile_serialization=layout == "zip")
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    msg = str(info.value)
    assert not marker.exists(), "the payload ran"
    assert "untrusted pickle" in msg and "pass trust_checkpoint=True" in msg and "if you trust this file" in msg
    assert "corrupt" not in msg and "download it again" not in msg and "\n" not in msg and str(path) in msg
    assert "system" in msg                      # the refused object is named (posix.system / nt.system)


def test_a_truncated_malicious_pickle_is_corrupt_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "cut.pt"
    torch.save({"w": torch.zeros(3), "extra": _Payload(marker)}, path)
    cut = tmp_path / "cut_half.pt"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    msg = _assert_one_line_corrupt(cut)
    assert "download it again" in msg and not marker.exists()


def test_offline_hint_names_the_hugging_face_repository(empty_cache):
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("RN50", "openai")
    msg = str(info.value)
    assert "timm/resnet50_clip.openai" in msg          # what open_clip (and `make run`) downloads
    assert open_clip.get_pretrained_cfg("RN50-quickgelu", "openai")["url"] in msg
    assert "\n" not in msg


def test_cli_refuses_a_checkpoint_of_another_architecture_in_one_line(tmp_path, capsys, tiny_checkpoint):
    # A ResNet checkpoint run as `--model ViT-B-32` must not finish with exit 0 and records labelled
    # ViT-B-32: every number in them would be attributed to the wrong architecture.
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(200), per_class=1, size=(32, 24)).parent
    for wrong in ("ViT-B-32", "RN51"):
        out = tmp_path / f"run-{wrong}"
        code = cli_main(["run", "--data", str(data), "--model", wrong, "--pretrained", str(tiny_checkpoint),
                         "--views", "2", "--workers", "0", "--device", "cpu", "--methods", "zeroshot",
                         "--limit", "1", "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code != 0 and len(err.splitlines()) == 1, err
        assert wrong in err and "shiftlab-tiny" in err and "Traceback" not in err
        assert not out.exists()


def test_weights_downloaded_into_cache_dir_are_found(empty_cache):
    # `--download --cache-dir D` lets open_clip put the hub files under D; the next offline run must find them
    org, repo = open_clip.get_pretrained_cfg("RN50-quickgelu", "openai")["hf_hub"].strip("/").split("/")
    mine = empty_cache / "mine"
    snap = mine / f"models--{org}--{repo}" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "open_clip_model.safetensors").write_bytes(b"placeholder")
    assert _cached("RN50-quickgelu", "openai", None)[0] is None
    assert _cached("RN50-quickgelu", "openai", str(mine))[0] == str(snap / "open_clip_model.safetensors")


def _hub_cache_file(hub: Path, repo: str, data: bytes, blob_name: str | None = None) -> Path:
    """A Hugging Face cache entry as huggingface_hub writes it: snapshots/REV/FILE -> blobs/<sha256>."""
    import hashlib
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    blob = repo_dir / "blobs" / (blob_name or hashlib.sha256(data).hexdigest())
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    snap = repo_dir / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "open_clip_model.safetensors").symlink_to(Path("..", "..", "blobs", blob.name))
    return snap / "open_clip_model.safetensors"


def test_weights_source_is_the_hub_repo_only_for_a_blob_whose_content_matches_its_name(empty_cache, tmp_path):
    from safetensors.torch import save
    data = save({k: v.contiguous() for k, v in make_tiny_model(seed=44).clip.state_dict().items()})
    hub = empty_cache / "hf" / "hub"
    _hub_cache_file(hub, "someorg/tiny-clip", data)
    model = shiftlab.load_model("shiftlab-tiny", "hf-hub:someorg/tiny-clip")
    assert model.weights_source == "hf-hub:someorg/tiny-clip"
    assert model.checkpoint_sha256 == hashlib.sha256(data).hexdigest()
    # a blob whose name is not its content's SHA-256 proves nothing
    _hub_cache_file(hub, "someorg/renamed", data, blob_name="0" * 64)
    assert shiftlab.load_model("shiftlab-tiny", "hf-hub:someorg/renamed").weights_source is None
    # the same bytes copied out of the cache: a plain file of unknown digest
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(data)
    plain = shiftlab.load_model("shiftlab-tiny", str(copy))
    assert plain.weights_source is None and plain.checkpoint_sha256 == model.checkpoint_sha256
    assert shiftlab.load_model("shiftlab-tiny", None).weights_source is None   # random weights


def test_unknown_model_name_suggests_the_closest():
    from shiftlab.models import ModelLoadError, load_model
    with pytest.raises(ModelLoadError, match=r"unknown model 'RN5O' \(did you mean 'RN50'\?\)"):
        load_model("RN5O", pretrained=None)
