"""Test-time normalisation on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/norm.py`
on `bn.py`, 8b2ed63): every batch of test images (view 0 of each) through the image tower whose BatchNorm layers
normalise with test statistics (`common.norm_statistics.StatsTower`: the batch's own, source and batch mixed, or
running statistics every batch updates), unit features against the class head, logits = scale x cosine. Nothing is
learnt; with "ema" the running statistics carry from batch to batch. A ViT has no BatchNorm: its logits are the
zero-shot ones. README.md lists what differs from the authors' code."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..base import MethodOutput
from ..common.norm_statistics import StatsTower, StatsTowerMethod
from ..context import SampleContext, batch_pixels
from ..kinds import BatchMethod
from .spec import NormStatsSpec


class NormStats(StatsTowerMethod, BatchMethod):
    """Test-time normalisation: BatchNorm with the test batch's statistics."""
    spec = NormStatsSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.tower = StatsTower(self.model.clip, cfg.statistics, cfg.alpha, cfg.momentum)
        self.seen = 0           # images normalised since the initial state

    def reset(self) -> None:
        self.tower.reset()
        self.seen = 0

    def save_state(self) -> dict[str, Any]:
        return {"seen": self.seen,
                "stats": self.tower.stats_state()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.tower.load_stats_state(state["stats"])
        self.seen = int(state["seen"])

    @torch.no_grad()
    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        if not ctxs:
            return []
        pixels = batch_pixels(ctxs, self.model.device, f"{self.name} normalises the image tower with the batch's "
                              "statistics and needs the images' pixels, not stored features")
        logits = self.tower_logits(pixels)
        self.seen += len(ctxs)
        return [MethodOutput(row.float()) for row in logits]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        """One image alone: a batch of one."""
        return self.adapt_batch([ctx])[0]
