"""TDA as a differentiable function of the attacked views (`--attack-target adaptive`, mode state+bpda+eot).

Against the caches TDA holds when the sample arrives (state): the sample's feature, logits and entropy as
`TDA.summarize_sample` computes them but differentiable in the pixels, its own cache write done on a copy of the
caches (the method's are untouched: the attacked sample updates them afterwards as a clean one would), then
`TDA.readout`. BPDA: the confident-view selection and which entry a write keeps or evicts are decided on the
forward pass and constant on the backward pass; the written feature itself carries its gradient."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..common.confidence import select_confident
from ..common.differentiable import encode_views01
from ..head_kinds import text_head


def tda_logits(method: Any, views01: torch.Tensor) -> torch.Tensor:
    feats = encode_views01(method, views01[:, :method.config.views.n_views])
    return torch.stack([_one(method, f) for f in feats])


def _one(method: Any, features: torch.Tensor) -> torch.Tensor:
    """One sample's read-out: the method's own summary (its decisions: the selection, entropy, pseudo-label) with the
    feature, logits and probabilities it writes and reads replaced by their differentiable values."""
    cfg = method.config
    scale = method.model.logit_scale if cfg.logit_scale is None else cfg.logit_scale
    view_logits = scale * features @ text_head(method).T
    kept = select_confident(view_logits.detach(), cfg.view_ratio)     # the rule summarize_sample applies
    sel = view_logits[kept]
    sample = dataclasses.replace(method.summarize_sample(features.detach()), feature=features[kept].mean(0),
                                 logits=sel.mean(0), probs=sel.softmax(-1).mean(0))
    saved = method.pos_cache, method.neg_cache, method.seen
    method.pos_cache = {k: list(v) for k, v in saved[0].items()}
    method.neg_cache = {k: list(v) for k, v in saved[1].items()}
    try:
        method.update(sample)
        return method.readout(sample)
    finally:
        method.pos_cache, method.neg_cache, method.seen = saved
