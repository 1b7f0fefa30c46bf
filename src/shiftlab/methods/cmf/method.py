"""CMF on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/cmf.py`, 8b2ed63): ROID's
step (`common/roid_training.py`), then after every optimiser step the filter over the adapted parameters
(cmf.py:89-127), with h the hidden parameters, s the source's, p the adapted ones:

1. predict: h <- alpha h + (1 - alpha) s; the variance v <- alpha^2 v + q;
2. update: gain beta = (1 - q) / (v + 1 - q), at least 0.89, 1 from 0.9999; v <- beta v; h <- beta h + (1 - beta) p;
3. fuse: p <- gamma p + (1 - gamma) h.

q = Q x (the adapted parameters' count / 38400), the count as their `num_trainable_params`: the image tower's
normalisation parameters and the text tower's final LayerNorm (their ZeroShotCLIP keeps it trainable; its text
features are computed once, so it never changes a logit). README.md lists what differs from the authors' code.
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.roid_training import RoidTTAMethod, ema_merge
from .spec import CMFSpec

PARAMETERS_PER_Q = 38400        # cmf.py:47: param_size_ratio = num_trainable_params / 38400


def filter_gain(variance: float, q: float) -> float:
    """The update step's gain (cmf.py:106-110): (1 - q) / (variance + 1 - q), raised to 0.89, 1.0 from 0.9999."""
    r = 1 - q
    beta = r / (variance + r)
    beta = beta if beta > 0.89 else 0.89
    return beta if beta < 0.9999 else 1.0


class CMF(RoidTTAMethod):
    """CMF: ROID's weighted self-training, the weights fused with a filtered hidden copy pulled to the source."""
    spec = CMFSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        counted = sum(p.numel() for p in self.tower.adapted_parameters())
        text_norm = getattr(self.model.clip, "ln_final", None)
        if text_norm is not None:
            counted += sum(p.numel() for p in text_norm.parameters())
        self.q = self.config.q * counted / PARAMETERS_PER_Q
        if self.q >= 1:
            raise ValueError(f"cmf.q: {self.config.q} scaled by {counted} adapted parameters / {PARAMETERS_PER_Q} is "
                             f"{self.q:.3g}; the filter needs it below 1: use q < {PARAMETERS_PER_Q / counted:.3g}")

    def reset_extra(self) -> None:
        super().reset_extra()
        self.hidden = [p.detach().clone() for p in self.tower.adapted_parameters()]
        self.variance = 0.0

    def episodic_reset(self) -> None:
        """Their `reset` restores the models (the hidden one too) and the mean prediction, not the filter's
        variance (cmf.py:175-180) nor their global generator (here the count of updates)."""
        variance = self.variance
        super().episodic_reset()
        self.variance = variance

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "hidden": dict(zip(self.tower.parameter_names, self.hidden)),
                "variance": self.variance}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        device = self.model.device
        self.hidden = [state["hidden"][n].to(device) for n in self.tower.parameter_names]
        self.variance = float(state["variance"])

    @torch.no_grad()
    def after_step(self) -> None:
        cfg = self.config
        params = self.tower.adapted_parameters()
        source = [self._initial_norm[n].to(p.device) for n, p in zip(self.tower.parameter_names, params)]
        ema_merge(self.hidden, source, cfg.alpha)                       # predict
        self.variance = cfg.alpha ** 2 * self.variance + self.q
        beta = filter_gain(self.variance, self.q)                       # update
        self.variance = beta * self.variance
        ema_merge(self.hidden, params, beta)
        ema_merge(params, self.hidden, cfg.gamma)                       # fuse
