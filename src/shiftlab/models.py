"""CLIP models over open_clip: loading, freezing, normalisation inside the model.

`load_model` is the one factory: it returns a `ClipModel` that carries its own
preprocessing facts (input size, mean, std), so model and transforms cannot drift
apart. The model takes images in [0, 1]; normalisation is its first layer, which
is what lets attacks work in pixel space.
"""
from __future__ import annotations

import json
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import open_clip
import torch
import torch.nn as nn
import torch.nn.functional as F

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to download or pass."""


@dataclass(frozen=True)
class Preprocess:
    image_size: int
    mean: tuple[float, float, float] = OPENAI_MEAN
    std: tuple[float, float, float] = OPENAI_STD


class ClipModel(nn.Module):
    """A frozen open_clip CLIP in eval mode with normalisation inside.

    - `encode_pixels(x01)`: images in [0, 1] -> L2-normalised features.
    - `encode_normalized(x)`: CLIP-normalised images -> L2-normalised features.
    - `logit_scale`: the learned temperature (100 for OpenAI CLIP) as a float.
    """

    def __init__(self, clip: nn.Module, name: str, pretrained: str | None, preprocess: Preprocess):
        super().__init__()
        self.clip = clip.eval()
        for p in self.clip.parameters():
            p.requires_grad_(False)
        self.name = name
        self.pretrained = pretrained
        self.preprocess = preprocess
        self.register_buffer("mean", torch.tensor(preprocess.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(preprocess.std).view(1, 3, 1, 1), persistent=False)

    def train(self, mode: bool = True):
        # BatchNorm must keep its running statistics: the model is never put in train mode.
        return super().train(False)

    @property
    def logit_scale(self) -> float:
        return float(self.clip.logit_scale.detach().exp())

    @property
    def device(self) -> torch.device:
        return self.clip.logit_scale.device

    @property
    def image_size(self) -> int:
        return self.preprocess.image_size

    def normalize(self, x01: torch.Tensor) -> torch.Tensor:
        return (x01 - self.mean.to(x01.dtype)) / self.std.to(x01.dtype)

    def encode_normalized(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.clip.encode_image(x), dim=-1)

    def encode_pixels(self, x01: torch.Tensor) -> torch.Tensor:
        return self.encode_normalized(self.normalize(x01))

    def forward(self, x01: torch.Tensor) -> torch.Tensor:
        return self.encode_pixels(x01)


def _is_openai_state_dict(sd: dict) -> bool:
    return "text_projection" in sd and "token_embedding.weight" in sd and (
        "visual.attnpool.positional_embedding" in sd or "visual.proj" in sd)


def _strip_prefix(sd: dict[str, Any]) -> dict[str, Any]:
    if "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def _read_checkpoint(path: Path, trust_checkpoint: bool) -> dict[str, torch.Tensor]:
    """Read a state dict without executing pickled code unless trusted.

    OpenAI's released `.pt` files are TorchScript archives: `torch.jit.load` reads
    them through TorchScript's own loader, which only rebuilds tensors and
    TorchScript code, never arbitrary Python objects.
    """
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path), device="cpu")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            is_torchscript = any(n.endswith("/constants.pkl") or n == "constants.pkl" for n in zf.namelist())
        if is_torchscript:
            return {k: v for k, v in torch.jit.load(str(path), map_location="cpu").state_dict().items()}
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError and friends
        if not trust_checkpoint:
            raise ModelLoadError(
                f"{path}: the checkpoint holds pickled Python objects beyond plain tensors "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). Loading it could run code "
                "from the file; pass --trust-checkpoint (trust_checkpoint=True) only if you trust its source."
            ) from exc
        sd = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(sd, dict):
        raise ModelLoadError(f"{path}: expected a state dict (a mapping of tensors), found {type(sd).__name__}")
    return _strip_prefix(sd)


def _build_from_openai_state_dict(sd: dict[str, torch.Tensor]) -> nn.Module:
    # open_clip's builder casts weights to fp16 before loading; reload in float32 afterwards
    # so that a float32 checkpoint is not rounded (lossless anyway for OpenAI's fp16 files).
    full = {k: v.clone() for k, v in sd.items()}
    model = open_clip.model.build_model_from_openai_state_dict(dict(sd), quick_gelu=True, cast_dtype=None)
    model.float()
    for key in ("input_resolution", "context_length", "vocab_size"):
        full.pop(key, None)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in full.items()})
    return model


def _model_name_for(name: str, openai_weights: bool) -> str:
    # OpenAI's ResNet CLIPs were trained with QuickGELU; plain "RN50" in open_clip means GELU.
    if openai_weights and not name.endswith("-quickgelu") and f"{name}-quickgelu" in open_clip.list_models():
        return f"{name}-quickgelu"
    return name


def _cached_pretrained_file(name: str, tag: str, cache_dir: str | None) -> tuple[str | None, str]:
    """Return (local file or None, where-to-download message) for an open_clip tag."""
    cfg = open_clip.get_pretrained_cfg(name, tag)
    if not cfg:
        raise ModelLoadError(
            f"unknown pretrained tag {tag!r} for model {name!r}; known tags: "
            f"{[t for m, t in open_clip.list_pretrained() if m == name] or 'none'}; "
            "or pass a path to a checkpoint file")
    url = cfg.get("url") or ""
    hf = cfg.get("hf_hub") or ""
    cache = Path(cache_dir or os.environ.get("SHIFTLAB_MODEL_CACHE", "~/.cache/clip")).expanduser()
    candidates = []
    if url:
        candidates.append(cache / os.path.basename(url))
    if hf:
        repo = hf.rstrip("/").split("/")
        hf_home = Path(os.environ.get("HF_HUB_CACHE")
                       or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub")
        snap = hf_home.expanduser() / f"models--{repo[0]}--{repo[1]}" / "snapshots"
        if snap.is_dir():
            for d in sorted(snap.iterdir()):
                for fname in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"):
                    candidates.append(d / fname)
    for c in candidates:
        if c.is_file():
            return str(c), ""
    where = f"{url} -> {candidates[0]}" if url else f"Hugging Face repo {hf} (into the HF cache)"
    return None, where


def _require_network(where: str) -> None:
    """Fail in milliseconds, not after a minute of hub retries, when no download host resolves."""
    import socket
    for host in ("huggingface.co", "openaipublic.azureedge.net"):
        try:
            socket.getaddrinfo(host, 443)
            return
        except OSError:
            continue
    raise ModelLoadError(f"no internet connection: cannot download the weights. Download {where} on a machine "
                         "with internet and copy the file there, or pass --pretrained /path/to/checkpoint.")


def load_model(name: str = "RN50", pretrained: str | None = "openai", *, device: str | torch.device = "cpu",
               cache_dir: str | None = None, allow_download: bool = False,
               trust_checkpoint: bool = False, model_config: dict | None = None) -> ClipModel:
    """Load a frozen CLIP model in eval mode with normalisation inside.

    `pretrained` is one of:
    - None: random weights (tests, demos);
    - an open_clip tag (e.g. "openai"): read from the cache; downloaded only when
      `allow_download` is true, otherwise a fast error says what to download;
    - a path to an OpenAI checkpoint (TorchScript archive or plain state dict),
      an open_clip checkpoint (.pt/.bin) or a .safetensors file.
    `model_config` registers a custom architecture under `name` (open_clip config dict).
    """
    if model_config is not None:
        open_clip.factory._MODEL_CONFIGS[name] = model_config
    path = Path(pretrained).expanduser() if pretrained and (os.sep in pretrained or Path(pretrained).suffix) else None
    if path is not None:
        if not path.is_file():
            raise ModelLoadError(f"checkpoint {path} does not exist (expected a .pt/.bin/.safetensors file)")
        sd = _read_checkpoint(path, trust_checkpoint)
        if _is_openai_state_dict(sd):
            clip = _build_from_openai_state_dict(sd)
            name = _model_name_for(name, openai_weights=True)
        else:
            if name not in open_clip.list_models():
                raise ModelLoadError(f"unknown model {name!r}; see `open_clip.list_models()`")
            clip = open_clip.create_model(name, pretrained=None)
            missing, unexpected = clip.load_state_dict(sd, strict=False)
            missing = [k for k in missing if k != "logit_bias"]
            if missing or unexpected:
                raise ModelLoadError(f"{path} does not fit {name}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    else:
        openai = pretrained == "openai"
        name = _model_name_for(name, openai_weights=openai)
        if name not in open_clip.list_models():
            raise ModelLoadError(f"unknown model {name!r}; see `open_clip.list_models()`")
        if pretrained is None:
            root = logging.getLogger()
            was_disabled, root.disabled = root.disabled, True   # open_clip warns "initialized randomly"
            try:
                clip = open_clip.create_model(name, pretrained=None)
            finally:
                root.disabled = was_disabled
        else:
            local, where = _cached_pretrained_file(name, pretrained, cache_dir)
            if local is not None:
                return load_model(name, local, device=device, trust_checkpoint=trust_checkpoint)
            if not allow_download:
                raise ModelLoadError(
                    f"weights {name}/{pretrained} are not in the cache and downloading was not requested. "
                    f"Download {where}, or run with --download on a machine with internet, "
                    "or pass --pretrained /path/to/checkpoint.")
            _require_network(where)
            try:
                clip = open_clip.create_model(name, pretrained=pretrained, cache_dir=cache_dir)
            except (RuntimeError, OSError) as exc:
                raise ModelLoadError(f"downloading {name}/{pretrained} failed ({exc}); download {where} "
                                     "by hand or pass --pretrained /path/to/checkpoint") from exc
    clip = clip.float()
    image_size = clip.visual.image_size
    if isinstance(image_size, (tuple, list)):
        image_size = image_size[0]
    model = ClipModel(clip, name, str(pretrained) if pretrained else None, Preprocess(int(image_size)))
    return model.to(device).eval()


def load_model_config(path: str | Path) -> dict:
    """Read an open_clip model config JSON (for custom architectures)."""
    with open(path) as fh:
        return json.load(fh)
