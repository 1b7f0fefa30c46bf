"""TDA's caches, the torch-free half of what its family shares (TDA, BoostAdapter): TDA's config. The torch
half: tda_cache.py."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import ViewMethodConfig


@dataclass
class TDAConfig(ViewMethodConfig):
    """TDA's ImageNet-R hyperparameters, from the authors' `configs/imagenet_r.yaml` in
    github.com/kdiAAA/TDA (values read from verbatim copies of that file: positive
    shot_capacity 3, alpha 1.0, beta 8.0; negative shot_capacity 2, alpha 0.117, beta 1.0,
    entropy_threshold 0.2-0.5, mask_threshold 0.03-1.0). The view selection (10% lowest
    entropy, mean of their features and logits) and the entropy normalisation are those of
    `get_clip_logits` / `get_entropy` in the repository's `utils.py`; the classifier is
    `clip_classifier` over the 80 CLIP ImageNet templates (`datasets/imagenet_r.py`).
    Their model is the half-precision CLIP of `clip.load` on CUDA: `precision="fp16-pure"` (the
    `paper` protocol's) encodes the views and the text head with that model; the arithmetic after
    the encoders (logits, entropies, cache affinities) stays float32 here, fp16 in theirs.
    """
    pos_capacity: int = param(3, ge=0)             # positive cache: entries per class (0: no cache)
    pos_alpha: float = param(1.0, ge=0)
    pos_beta: float = param(8.0, ge=0)
    neg_capacity: int = param(2, ge=0)             # negative cache: entries per class (0: no cache)
    neg_alpha: float = param(0.117, ge=0)
    neg_beta: float = param(1.0, ge=0)
    neg_entropy_lower: float = param(0.2, ge=0)    # a sample enters the negative cache iff lower < H_norm < upper
    neg_entropy_upper: float = param(0.5, ge=0)
    neg_mask_lower: float = param(0.03, ge=0, le=1)   # negative pseudo-labels: classes with lower < p < upper
    neg_mask_upper: float = param(1.0, ge=0, le=1)
    view_ratio: float = param(0.1, gt=0, le=1)     # share of views (lowest entropy) averaged; at least one
    # "ensemble": 80 templates (the authors'); "zeroshot": one template
    text_head: str = param("ensemble", choices=("ensemble", "zeroshot"))
    # the "ensemble" head's templates; None: CLIP's 80 (`--protocol paper` sets the dataset's, datasets/*.py)
    templates: tuple[str, ...] | None = None
    # H_norm = H (nats) / log2(C) as the authors' code; "ln": / ln(C)
    entropy_norm: str = param("log2", choices=("log2", "ln"))
    # None: the model's exp(logit_scale); the authors' code multiplies by the literal 100.0
    # (`get_clip_logits`), which differs from a checkpoint's exp(logit_scale) in the last digits
    logit_scale: float | None = param(None, gt=0)
