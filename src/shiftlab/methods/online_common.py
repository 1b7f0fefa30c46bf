"""Shared pieces of the online methods (TDA, DMN-ZS): view selection, text head, state checks.

Online methods keep a memory of earlier test samples' features keyed by pseudo-labels and
are fed one sample at a time in stream order (docs/ONLINE.md). Tie-breaking is deterministic
everywhere: stable sorts (ties keep the lower view or the older entry first), argmax returns
the lowest class index.
"""
from __future__ import annotations

import torch

from ..context import SampleContext
from .base import Method
from .prompt_tuning import entropy

_STATE_VERSION = 1


def _select_views(view_logits: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices of the max(1, int(N * ratio)) lowest-entropy views; ties keep the lower view first."""
    k = max(1, int(view_logits.shape[0] * ratio))
    return torch.argsort(entropy(view_logits), stable=True)[:k]


def _text_head(method: Method) -> torch.Tensor:
    head = method.config.text_head
    if head == "ensemble":
        return method.heads.ensemble
    if head == "zeroshot":
        return method.heads.zeroshot
    raise ValueError(f"{method.name}: text_head must be 'ensemble' or 'zeroshot', got {head!r}")


def _first_views(ctx: SampleContext, n_views: int | None) -> torch.Tensor:
    feats = ctx.image_features
    return feats if n_views is None else feats[:n_views]


def _check_state(name: str, state: dict, num_classes: int) -> None:
    if state.get("version") != _STATE_VERSION:
        raise ValueError(f"{name}: unsupported state version {state.get('version')!r}")
    if state.get("num_classes") != num_classes:
        raise ValueError(f"{name}: state was saved for {state.get('num_classes')} classes, this run has {num_classes}")
