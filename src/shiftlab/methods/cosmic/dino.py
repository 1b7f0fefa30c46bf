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

from typing import Any

import torch
import torch.nn.functional as F

from ..context import SampleContext
from .dino_checkpoint import DinoLoadError, checkpoint_path

_LOADED: dict[tuple, torch.nn.Module] = {}


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
