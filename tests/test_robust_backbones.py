"""Robust CLIP backbones load in the formats they are published in (issue 41, point 4).

- FARE / TeCoA as open_clip repositories on the Hugging Face hub (`hf-hub:chs20/fare2-clip`: a whole CLIP,
  open_clip_pytorch_model.bin + open_clip_config.json);
- FARE's image tower alone as a plain state dict (.pt, the keys of `clip.visual`; RobustVLM's README loads it with
  `model.visual.load_state_dict(torch.load(path))`);
- TeCoA's image tower as R-TPT's rtpt.py and RobustVLM's CLIP_benchmark read it: `{"vision_encoder_state_dict":
  clip.visual's state dict, ...}`.
An image tower alone replaces the tower of the base CLIP `base_pretrained` names; the text tower stays the base's.
The stand-ins are random weights of the tiny architectures in those exact formats; no network is touched.
"""
from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import pytest
import torch

import shiftlab
from shiftlab.cli import main as cli_main
from shiftlab.models import ModelLoadError
from shiftlab.synthetic import make_imagenet_r

pytestmark = pytest.mark.usefixtures("one_thread")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _state(name: str, seed: int) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in shiftlab.load_model(name, None, seed=seed).clip.state_dict().items()}


def _visual(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len("visual."):]: v for k, v in sd.items() if k.startswith("visual.")}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    """A whole base CLIP per tiny architecture (seed 1) and image towers of other weights (seed 2) in the published
    formats: FARE's plain state dict and R-TPT's TeCoA wrapper (with the training facts such files carry)."""
    root = tmp_path_factory.mktemp("robust")
    out = {}
    for name in ("shiftlab-tiny", "shiftlab-tiny-vit"):
        out.update({f"{name}/base": root / f"{name}-base.pt", f"{name}/fare": root / f"{name}-fare_eps_2.pt",
                    f"{name}/tecoa": root / f"{name}-tecoa_eps1.pth.tar"})
        torch.save(_state(name, 1), out[f"{name}/base"])
        tower = _visual(_state(name, 2))
        torch.save(tower, out[f"{name}/fare"])
        torch.save({"epoch": 10, "vision_encoder_state_dict": tower}, out[f"{name}/tecoa"])
    return out


@pytest.mark.parametrize("name", ["shiftlab-tiny", "shiftlab-tiny-vit"])
@pytest.mark.parametrize("fmt", ["fare", "tecoa"])
def test_an_image_tower_replaces_the_base_clips_and_the_rest_stays_the_bases(weights, name, fmt):
    tower_file, base_file = weights[f"{name}/{fmt}"], weights[f"{name}/base"]
    model = shiftlab.load_model(name, str(tower_file), base_pretrained=str(base_file))
    got, base, tower = model.clip.state_dict(), torch.load(base_file), torch.load(tower_file)
    tower = tower.get("vision_encoder_state_dict", tower)
    for k, v in got.items():
        want = tower[k[len("visual."):]] if k.startswith("visual.") else base[k]
        assert torch.equal(v, want), k
    assert model.checkpoint_sha256 == _sha(tower_file) and model.base_checkpoint_sha256 == _sha(base_file)
    assert model.pretrained == str(tower_file) and model.base_pretrained == str(base_file)
    # the image features are the tower's: those of a whole CLIP holding the tower's weights
    whole = shiftlab.load_model(name, None, seed=2)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_pixels(x), whole.encode_pixels(x), rtol=0, atol=1e-5)


def test_an_image_tower_without_a_base_is_refused_in_one_line(weights):
    for base in (None, "none"):
        with pytest.raises(ModelLoadError, match="holds only an image tower") as err:
            shiftlab.load_model("shiftlab-tiny", str(weights["shiftlab-tiny/tecoa"]), base_pretrained=base)
        assert "\n" not in str(err.value) and "base_pretrained" in str(err.value)
    with pytest.raises(ModelLoadError, match="does not exist") as err:   # a base that is not there
        shiftlab.load_model("shiftlab-tiny", str(weights["shiftlab-tiny/fare"]), base_pretrained="no/such/base.pt")
    assert "\n" not in str(err.value) and "the base CLIP of" in str(err.value)


def test_an_image_tower_of_another_architecture_is_refused_in_one_line(weights):
    # a ViT tower given for the ResNet's base, and the ResNet's TeCoA file given for the ViT
    for name, other in (("shiftlab-tiny", "shiftlab-tiny-vit"), ("shiftlab-tiny-vit", "shiftlab-tiny")):
        with pytest.raises(ModelLoadError, match="does not fit") as err:
            shiftlab.load_model(name, str(weights[f"{other}/tecoa"]), base_pretrained=str(weights[f"{name}/base"]))
        assert "\n" not in str(err.value) and "image tower" in str(err.value)


def test_a_whole_clip_ignores_the_base(weights):
    model = shiftlab.load_model("shiftlab-tiny", str(weights["shiftlab-tiny/base"]),
                                base_pretrained=str(weights["shiftlab-tiny/tecoa"]))
    assert model.base_pretrained is None and model.checkpoint_sha256 == _sha(weights["shiftlab-tiny/base"])


def test_hf_hub_open_clip_repository_of_chs20_loads_from_the_cache(tmp_path, monkeypatch):
    """`hf-hub:chs20/fare2-clip` as the hub holds it (a whole CLIP in open_clip_pytorch_model.bin with its
    open_clip_config.json), served from the Hugging Face cache; any network use fails the test."""
    def no_network(*args, **kwargs):
        raise AssertionError("load_model tried to use the network")
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hub" / "models--chs20--fare2-clip"
    blob_data = tmp_path / "weights.bin"
    torch.save(_state("shiftlab-tiny-vit", 3), blob_data)
    blob = repo / "blobs" / _sha(blob_data)
    blob.parent.mkdir(parents=True)
    blob_data.rename(blob)
    snap = repo / "snapshots" / "f00d"
    snap.mkdir(parents=True)
    (snap / "open_clip_pytorch_model.bin").symlink_to(Path("..", "..", "blobs", blob.name))
    pp = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]}
    (snap / "open_clip_config.json").write_text(json.dumps({"model_cfg": {}, "preprocess_cfg": pp}))
    model = shiftlab.load_model("shiftlab-tiny-vit", "hf-hub:chs20/fare2-clip", allow_download=False)
    assert model.weights_source == "hf-hub:chs20/fare2-clip" and model.checkpoint_sha256 == blob.name
    want = torch.load(blob)
    assert all(torch.equal(v, want[k]) for k, v in model.clip.state_dict().items())


def test_run_json_holds_the_towers_and_the_bases_digests(weights, tmp_path, capsys):
    data = make_imagenet_r(tmp_path / "data", classes=range(200), per_class=1, size=(32, 24))
    tower, base = weights["shiftlab-tiny/tecoa"], weights["shiftlab-tiny/base"]
    out = tmp_path / "run"
    argv = ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(tower), "--views", "1",
            "--workers", "0", "--device", "cpu", "--methods", "zeroshot", "--limit", "2", "--out", str(out)]
    assert cli_main([*argv, "--base-pretrained", str(base)]) == 0
    shared = json.loads((out / "run.json").read_text())["shared"]
    assert shared["pretrained"] == str(tower) and shared["checkpoint_sha256"] == _sha(tower)
    assert shared["base_pretrained"] == str(base) and shared["base_checkpoint_sha256"] == _sha(base)
    capsys.readouterr()
    # resuming over another base is refused, naming the field that differs
    torch.save(_state("shiftlab-tiny", 4), other := tmp_path / "other-base.pt")
    assert cli_main([*argv, "--base-pretrained", str(other), "--resume"]) != 0
    assert "base_checkpoint_sha256" in capsys.readouterr().err
    # without the base: refused in one line naming the flag
    assert cli_main([*argv[:-1], str(tmp_path / "run2")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--base-pretrained" in err[0] and "only an image tower" in err[0]
