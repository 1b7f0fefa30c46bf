"""BCA as TTABC's `ttabc/model_selection/bca.py` (stored at 65eae15) computes it.

State along the stream: class centres mu (C, D), from the class text features, each with a weight (`center_count`
to start), and a cluster-to-class matrix P (C, C), the identity to start, each row with a weight (`prior_count`).
Per sample: the view logits against the centres, `tem` x features @ mu^T with `tem` the logit scale; the
`selection_ratio` lowest-entropy views; their mean logits' softmax (the posterior over centres) times P is the
output distribution z. With z's top class k and probability p: above `center_threshold` the centre k becomes the
weighted mean of itself and the selected views' mean feature, renormalised; above `prior_threshold` row k of P
becomes the weighted mean of itself and z. The prediction is log(z + 1e-12), computed before the updates.
"""
from __future__ import annotations

from typing import Any

import torch

from ..base import MethodOutput
from ..common.confidence import select_confident
from ..common.online_common import view_features
from ..context import SampleContext
from ..kinds import OnlineMethod
from .spec import BCASpec


class BCA(OnlineMethod):
    """BCA: running class centres (likelihood) and cluster-to-class prior, updated from confident samples."""
    spec = BCASpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.reset()

    def reset(self) -> None:
        cfg, c = self.config, len(self.classnames)
        device = self.model.device
        self.centers = self.heads.zeroshot.float().clone()                        # (C, D)
        self.center_counts = torch.full((c,), cfg.center_count, dtype=torch.int64, device=device)
        self.prior = torch.eye(c, device=device)                                  # (C, C) cluster -> class
        self.prior_counts = torch.full((c,), cfg.prior_count, dtype=torch.int64, device=device)
        self.seen = 0

    def posterior(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views (N, D) -> the class distribution z (C,), the selected views' mean feature (D,) and their indices."""
        logits = self.model.logit_scale * features.float() @ self.centers.T       # (N, C)
        if features.shape[0] > 1:
            selected = select_confident(logits, self.config.selection_ratio)
            feature, logits = features[selected].float().mean(0), logits[selected].mean(0)
        else:
            selected, feature, logits = torch.zeros(1, dtype=torch.long), features[0].float(), logits[0]
        return logits.softmax(-1) @ self.prior, feature, selected

    def step(self, features: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = self.config
        z, feature, selected = self.posterior(features)
        top, k = z.max(-1)
        k = int(k)
        if float(top) > cfg.center_threshold:
            n = int(self.center_counts[k])
            center = (n * self.centers[k] + feature) / (n + 1)
            self.centers[k] = center / center.norm()
            self.center_counts[k] = n + 1
        if float(top) > cfg.prior_threshold:
            n = int(self.prior_counts[k])
            self.prior[k] = (n * self.prior[k] + z) / (n + 1)
            self.prior_counts[k] = n + 1
        self.seen += 1
        self.last = {"z": z, "selected": selected, "feature": feature}
        return torch.log(z + 1e-12), {"top": float(top)}

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            logits, extras = self.step(view_features(ctx, self.config.views.n_views))
        return MethodOutput(logits, extras=extras)

    # -- online state --------------------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        return {"seen": self.seen,
                **{key: getattr(self, key).detach().cpu().clone()
                   for key in ("centers", "center_counts", "prior", "prior_counts")}}

    def load_state(self, state: dict[str, Any]) -> None:
        if tuple(state["centers"].shape) != tuple(self.centers.shape):
            raise ValueError(f"{self.name}: state holds centres of shape {tuple(state['centers'].shape)}, this "
                             f"model {tuple(self.centers.shape)} (classes, feature width)")
        for key in ("centers", "center_counts", "prior", "prior_counts"):
            setattr(self, key, state[key].to(self.model.device, getattr(self, key).dtype).clone())
        self.seen = int(state["seen"])
