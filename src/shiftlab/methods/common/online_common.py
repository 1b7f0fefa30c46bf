"""Shared pieces of the online methods (TDA, DMN-ZS, ...): their view features, state checks.

Online methods keep a memory of earlier test samples' features keyed by pseudo-labels and
are fed one sample at a time in stream order (docs/ONLINE.md). Tie-breaking is deterministic
everywhere: stable sorts (ties keep the lower view or the older entry first), argmax returns
the lowest class index.
"""
from __future__ import annotations

import torch

from ..context import SampleContext

STATE_VERSION = 1


def view_features(ctx: SampleContext, n_views: int | None) -> torch.Tensor:
    """(N, D) features of the first `n_views` views (all with None); the engine and `predict` hand a
    method only its recipe's views already, this keeps a hand-built longer context correct too. (The
    context of the first views, features and pixels: `SampleContext.first_views`.)"""
    feats = ctx.image_features
    return feats if n_views is None else feats[:n_views]



def check_state(name: str, state: dict, num_classes: int) -> None:
    """Refuse an online state saved by another version or for another class count."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"{name}: unsupported state version {state.get('version')!r}")
    if state.get("num_classes") != num_classes:
        raise ValueError(f"{name}: state was saved for {state.get('num_classes')} classes, this run has {num_classes}")
