"""Shared pieces of the online methods (TDA, DMN-ZS, ...): their view features, state checks.

Online methods keep a memory of earlier test samples' features keyed by pseudo-labels and
are fed one sample at a time in stream order (docs/ONLINE.md). Tie-breaking is deterministic
everywhere: stable sorts (ties keep the lower view or the older entry first), argmax returns
the lowest class index.
"""
from __future__ import annotations

from typing import Any

import torch

from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import STATE_VERSION, check_state  # noqa: F401  (their home: kinds.py; named here for older folders)


def view_features(ctx: SampleContext, n_views: int | None) -> torch.Tensor:
    """(N, D) features of the first `n_views` views (all with None); the engine and `predict` hand a
    method only its recipe's views already, this keeps a hand-built longer context correct too. (The
    context of the first views, features and pixels: `SampleContext.first_views`.)"""
    feats = ctx.image_features
    return feats if n_views is None else feats[:n_views]


class OnlineStateAndHead:
    """Mixed in before `OnlineMethod` by the training-free online methods (DOTA, ECALP, OnZeta): their state is what
    `reset()` makes, made at construction too; the class head their config names (`head_kinds.text_head`) is built
    in `prepare`, kept out of per-image timings. (TDA's family base `tda_cache.TDACacheMethod` says the same itself:
    a family base derives its kind directly, tests/methods/test_scratch_variants.py.)"""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.reset()

    def prepare(self) -> None:
        _ = text_head(self)


class FloatTextHead(OnlineStateAndHead):
    """`OnlineStateAndHead` whose computation reads the class head in float32 (`text()`: ECALP, OnZeta, their
    `.float()` after the half model)."""

    def text(self) -> torch.Tensor:
        """(C, D) float32 class head (`head_kinds.text_head`)."""
        return text_head(self).float()
