"""SAR on CLIP (Niu et al., ICLR 2023), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at f4221f4,
`ttavlm/methods/sar.py` with `--use_sam`, `optimizers/sam.py`), for every batch of test images (view 0 of each,
through the tower of `common.norm_adaptation`), `steps` times:

1. logits = scale x cosine; per-image entropy H; reliable images: H < entropy_margin x ln(C); the first loss,
   their mean, is back-propagated and SAM's first step moves every adapted parameter to w + rho g / ||g||;
2. at the perturbed weights, the entropies of the reliable images again, those still below the margin averaged
   (the second loss: its value updates the moving average ema <- 0.9 ema + 0.1 loss, unless it is NaN);
   its gradient, taken at w + e, updates w (SAM's second step: back to w, then the base optimiser's step);
3. model recovery: when ema < recovery_threshold, the parameters return to their initial values (the optimiser's
   moments survive, as in both authors' codes: `recover`).

Then the batch's logits through the adapted tower. README.md lists what differs from the authors' code.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..common.confidence import entropy
from ..common.norm_adaptation import NormTTAMethod
from ..common.sam import sam_perturb
from .spec import SARSpec


def mean_or_empty(values: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """values.mean(), or a zero joined to the graph of `anchor` when there are none (the authors' mean of nothing
    is NaN, whose backward gives every parameter a zero gradient: the same gradient)."""
    return values.mean(0) if values.numel() else anchor.sum() * 0


class SAR(NormTTAMethod):
    """SAR: SAM steps on the entropy of reliable images, with model recovery."""
    spec = SARSpec

    def reset_extra(self) -> None:
        self.ema: float | None = None
        self.recoveries = 0

    def extra_state(self) -> dict[str, Any]:
        return {"ema": self.ema, "recoveries": self.recoveries}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.ema = None if state["ema"] is None else float(state["ema"])
        self.recoveries = int(state["recoveries"])

    def recover(self) -> None:
        """The authors' `reset`: the initial parameters (and, in SAR's code, no moving average). Their reset also
        reloads the optimiser's initial state, but into SAM, whose `load_state_dict` leaves the base optimiser's
        state (Adam's moments, SGD's momentum) as it is: the moments survive a recovery, in both codes."""
        self.tower.load_norm_state(self._initial_norm)
        if self.config.recovery_resets_ema:
            self.ema = None

    def episodic_reset(self) -> None:
        self.recover()          # their episodic reset is the same `reset`

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        margin = cfg.entropy_margin * math.log(len(self.classnames))
        params = self.tower.adapted_parameters()
        first_logits = None
        recovered = False
        for _ in range(cfg.steps):
            self.optimizer.zero_grad(set_to_none=True)
            logits = self.logits(pixels)
            if first_logits is None:
                first_logits = logits.detach()
            entropies = entropy(logits)
            reliable = entropies.detach() < margin
            mean_or_empty(entropies[reliable], logits).backward()
            olds = sam_perturb(params, cfg.rho, cfg.adaptive)
            self.optimizer.zero_grad(set_to_none=True)
            second = self.logits(pixels)
            again = entropy(second)[reliable]
            kept = again[again.detach() < margin]
            if kept.numel():
                value = float(kept.detach().mean())
                self.ema = value if self.ema is None else cfg.ema_momentum * self.ema + (1 - cfg.ema_momentum) * value
            mean_or_empty(kept, second).backward()
            with torch.no_grad():
                for p, old in zip(params, olds):
                    p.copy_(old)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.ema is not None and self.ema < cfg.recovery_threshold:
                self.recover()
                self.recoveries += 1
                recovered = True
        if cfg.predict_after_update:
            with torch.no_grad():
                logits = self.logits(pixels)
        else:
            logits = first_logits
        extras = {"ema": self.ema, "recovered": recovered}
        return logits, [dict(extras) for _ in range(pixels.shape[0])]
