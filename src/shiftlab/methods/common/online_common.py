"""Shared pieces of the online methods (TDA, DMN-ZS, ...): their view features, state checks.

Online methods keep a memory of earlier test samples' features keyed by pseudo-labels and
are fed one sample at a time in stream order (docs/ONLINE.md). Tie-breaking is deterministic
everywhere: stable sorts (ties keep the lower view or the older entry first), argmax returns
the lowest class index.
"""
from __future__ import annotations

import torch

from ..context import SampleContext
from ..kinds import STATE_VERSION, check_state  # noqa: F401  (their home: kinds.py; named here for older folders)


def view_features(ctx: SampleContext, n_views: int | None) -> torch.Tensor:
    """(N, D) features of the first `n_views` views (all with None); the engine and `predict` hand a
    method only its recipe's views already, this keeps a hand-built longer context correct too. (The
    context of the first views, features and pixels: `SampleContext.first_views`.)"""
    feats = ctx.image_features
    return feats if n_views is None else feats[:n_views]
