"""COSMIC's second image tower: DINOv2 as timm builds it, loaded once per process.

The authors build Meta's DINOv2 ViT-L/14 with 4 registers (clip/dinoV2.py `load_dinov2('l')`, their vendored
`dinov2.hub.backbones.dinov2_vitl14_reg`) from `./pretrained/dinov2_vitl4_reg4_pretrain.pth`, and feed it the
same CLIP-normalised 224 px views as CLIP (clip/fix_clip.py get_image_features_aux); the feature is the
normalised class token after the final norm (`x_norm_clstoken`), L2-normalised. Here timm's
`vit_*_patch14_reg4_dinov2` (the same architecture; `dynamic_img_size`: the position embedding is resampled to
the input's grid, as DINOv2's `interpolate_pos_encoding` does) reads Meta's checkpoint through timm's own key
conversion, or runs with random weights (`dino_pretrained="none"`: tests, bench).
"""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from ...options import say_set
from ..context import SampleContext

META_URL = "https://dl.fbaipublicfiles.com/dinov2/{arch}/{arch}_reg4_pretrain.pth"
_LOADED: dict[tuple, torch.nn.Module] = {}
_DIGESTS: dict[str, str] = {}
DINO_FEATURE_VERSION = 1   # what dino_identity's feature is; a change of how it is computed is a new version


class DinoLoadError(ValueError):
    """COSMIC's DINOv2 weights cannot be had (one line: what to download and where)."""


def _meta_arch(model: str) -> str:
    size = model.split("_")[1]                       # vit_large_patch14_reg4_dinov2 -> large
    return {"large": "dinov2_vitl14", "base": "dinov2_vitb14", "small": "dinov2_vits14",
            "giant": "dinov2_vitg14"}.get(size, model)


def checkpoint_path(config: Any) -> str:
    """The DINOv2 checkpoint file of `config` ("none": random weights); a missing file is a one-line DinoLoadError
    saying what to download and where."""
    path = config.dino_pretrained
    if path == "none":
        return path
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        arch = _meta_arch(config.dino_model.split(".")[0])
        raise DinoLoadError(
            f"cosmic: DINOv2 weights {path!r} not found: download {META_URL.format(arch=arch)} to that path "
            f"(or pass {say_set('cosmic', 'dino_pretrained', 'FILE')}; {say_set('cosmic', 'dino_model', None)} "
            f"runs the CLIP-only variant)")
    return path


def load_dino(config: Any, device: torch.device) -> torch.nn.Module:
    """The DINOv2 of `config` (dino_model, dino_pretrained, dino_seed) on `device`, frozen, once per process."""
    key = (config.dino_model, config.dino_pretrained, config.dino_seed, str(device))
    if key in _LOADED:
        return _LOADED[key]
    import timm
    name = config.dino_model.split(".")[0]
    path = checkpoint_path(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.dino_seed)
        try:
            model = timm.create_model(name, pretrained=False, dynamic_img_size=True, dynamic_img_pad=True,
                                      num_classes=0)
        except RuntimeError as exc:
            raise DinoLoadError(f"cosmic: timm has no model {name!r}: {exc}") from None
    if path != "none":
        from timm.models.vision_transformer import checkpoint_filter_fn
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(checkpoint_filter_fn(state, model))
    model = model.to(device).eval().requires_grad_(False)
    _LOADED[key] = model
    return model


def weights_sha256(path: str) -> str:
    """SHA-256 of a DINOv2 checkpoint file (read in 1 MiB blocks), once per process and path."""
    path = os.path.abspath(os.path.expanduser(path))
    if path not in _DIGESTS:
        import hashlib
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[path] = digest.hexdigest()
    return _DIGESTS[path]


def dino_identity(config: Any) -> dict[str, Any]:
    """Everything that decides the DINOv2 feature of a view 0 besides its pixels: the timm model, its checkpoint's
    SHA-256 (or, with random weights, their seed), what it reads and returns; a feature-store key's `encoder`."""
    random = config.dino_pretrained == "none"
    return {"encoder": "cosmic.dinov2", "version": DINO_FEATURE_VERSION, "model": config.dino_model,
            "checkpoint_sha256": None if random else weights_sha256(checkpoint_path(config)),
            "random_seed": config.dino_seed if random else None,
            "reads": "view 0, CLIP-normalised, float32", "returns": "L2-normalised x_norm_clstoken"}


def encode_view0(config: Any, device: torch.device, view0: torch.Tensor) -> torch.Tensor:
    """(1, 3, S, S) normalised view 0 -> (d,) L2-normalised DINOv2 class token (after the final norm)."""
    model = load_dino(config, device)
    with torch.no_grad():
        tokens = model.forward_features(view0.to(device, torch.float32))    # (1, 1 + 4 + P, d), normed
    return F.normalize(tokens[0, 0], dim=-1)


def dino_features(config: Any, device: torch.device, ctx: SampleContext, encoder_id: str | None = None) -> torch.Tensor:
    """(d,) L2-normalised DINOv2 class token of view 0 (the CLIP-normalised pixels the CLIP tower reads): the one the
    engine put in `ctx.encoded[encoder_id]` (encoded once, or read from a feature store), else encoded here."""
    if encoder_id is not None and encoder_id in ctx.encoded:
        return ctx.encoded[encoder_id]
    if ctx.views is None:
        raise ValueError("cosmic: DINOv2 reads view 0's pixels, and neither they nor its stored feature are here")
    return encode_view0(config, device, ctx.views[:1])
