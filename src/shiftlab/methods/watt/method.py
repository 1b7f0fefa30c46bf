"""WATT (Osowiechi, Noori et al., NeurIPS 2024): per batch, for each of `repetitions` rounds, the image tower's
normalisation parameters are adapted under each text template in turn (`steps_per_template` steps of CLIPArTT's
loss with that template's class features as the captions of the pseudo-labels), and the round's weights (one set
per template) are averaged; the batch is then predicted by the averaged tower against the templates' mean class
head. WATT-S (`averaging="sequential"`) runs the templates one after the other from the round's start; WATT-P
(`"parallel"`) starts each template from the last average.

Authors' code: github.com/Mehrdad-Noori/WATT (`adapt/watt.py`, `main.py`), cited below at 40e3fae. What it is and
every choice that differs from it: src/shiftlab/methods/watt/README.md.
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.clipartt_pseudo_labels import clipartt_loss, soft_targets
from ..common.norm_adaptation import NormTTAMethod, cloned, refuse_continual
from .spec import WATTSpec


def average(weights: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of several weight sets, summed in order then divided (weight_average, adapt/watt.py:218-234)."""
    return {name: sum(w[name] for w in weights) / len(weights) for name in weights[0]}


class WATT(NormTTAMethod):
    """WATT on the shared norm-adaptation machinery (common/norm_adaptation.py)."""
    spec = WATTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        refuse_continual(self)

    @property
    def head(self) -> torch.Tensor:
        """(C, D) the prediction's class head: the templates' mean (their evaluate, ref_eval False)."""
        templates = ["a photo of a {}"] if self.config.reference_head else list(self.config.templates)
        return self.heads.templated(templates)

    def template_heads(self) -> list[torch.Tensor]:
        """One (C, D) class head per template, not averaged (extract_text_embeddings(..., average=False))."""
        return [self.heads.templated([t]) for t in self.config.templates]

    def restart(self) -> None:
        """Their load_model_and_optimizer(model_state, optimizer_state): the initial parameters, a fresh optimiser."""
        self.tower.load_norm_state(self._initial_norm)
        self.optimizer.load_state_dict(cloned(self._initial_optimizer))

    def adapt_under(self, pixels: torch.Tensor, head: torch.Tensor) -> None:
        """`steps_per_template` steps under one template's class head (adapt/watt.py:136-150)."""
        cfg, scale = self.config, self.model.logit_scale
        for _ in range(cfg.steps_per_template):
            features = self.encode(pixels)
            captions = head[(features.detach() @ head.T).argmax(-1)]
            targets = soft_targets(features, captions, cfg.temperature, "both")
            loss = clipartt_loss(features, captions, targets, scale, transposed=True)
            self.losses.append(float(loss.detach()))
            self.step(loss)

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        self.losses: list[float] = []
        heads = self.template_heads()
        averaged: dict[str, torch.Tensor] | None = None
        for _ in range(cfg.repetitions):                     # perform_adaptation (adapt/watt.py:118-160)
            if cfg.averaging == "sequential":
                self.restart() if averaged is None else self.tower.load_norm_state(averaged)
            weights = []
            for head in heads:
                if cfg.averaging == "parallel":      # the optimiser's state carries on from the last template
                    self.restart() if averaged is None else self.tower.load_norm_state(averaged)
                self.adapt_under(pixels, head)
                weights.append(self.tower.norm_state())
            averaged = average(weights)
        self.tower.load_norm_state(averaged)
        with torch.no_grad():
            cosines = self.encode(pixels) @ self.head.T
        return self.scale * cosines, [{"loss": self.losses[-1]} for _ in range(len(pixels))]
