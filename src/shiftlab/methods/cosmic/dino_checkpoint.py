"""COSMIC's DINOv2 checkpoint and the identity of its feature, torch-free: a run plan keys the feature-store entry
of the DINOv2 features with `dino_identity` before torch is imported (`COSMICSpec.frozen_encoder_identity`), and
dino.py builds and runs the model."""
from __future__ import annotations

import hashlib
import os
from typing import Any

from ...options import say_set

META_URL = "https://dl.fbaipublicfiles.com/dinov2/{arch}/{arch}_reg4_pretrain.pth"
DINO_FEATURE_VERSION = 1   # what dino_identity's feature is; a change of how it is computed is a new version
_DIGESTS: dict[str, str] = {}


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


def weights_sha256(path: str) -> str:
    """SHA-256 of a DINOv2 checkpoint file (read in 1 MiB blocks), once per process and path."""
    path = os.path.abspath(os.path.expanduser(path))
    if path not in _DIGESTS:
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
