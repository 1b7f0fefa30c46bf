"""BayesTTA on CLIP, as its authors' code runs it (github.com/cuishuang99/BayesTTA at 9c98176, `adaptation_step` and
`test_time_adaptation_em` of `dis_cttta_runner_cd.py`). For every batch of test images (view 0):

1. unit features x (B, D) through the adapted image tower; zero-shot logits 100 x . t_k and their softmax P;
2. on the first batch only, Box's M test on x weighted by P picks one shared covariance or one per class
   (discriminant.covariance_test; `covariance` can make the choice without it);
3. the class Gaussians take the batch: soft counts ct += sum_b P, means mu = (ct mu + P^T x) / ct_new, covariance
   sums += the P-weighted scatter of x about the previous means; each regularised towards sigma^2 I;
4. prediction: the zero-shot logits + alpha x the Gaussian discriminant (log-density under the new Gaussians);
5. one Adam step of the norm parameters on the cross-entropy of the zero-shot logits against the prediction's
   softmax, then each parameter := beta x its previous value + (1 - beta) x the stepped one (their EMA).

The Gaussians, the parameters, Adam's moments and the test's verdict carry from batch to batch. README.md lists what
differs from the authors' code.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common.norm_adaptation import NormTTAMethod
from . import discriminant as gda
from .spec import BayesTTASpec


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -sum_k softmax(target_logits) log_softmax(logits) (their compute_loss)."""
    return -(F.softmax(target_logits.detach(), dim=1) * F.log_softmax(logits, dim=1)).sum(1).mean()


class BayesTTA(NormTTAMethod):
    """BayesTTA: zero-shot + Gaussian discriminant logits, norm parameters stepped towards them with an EMA."""
    spec = BayesTTASpec

    @property
    def batch_statistics(self) -> bool:       # type: ignore[override]
        return self.config.batch_statistics

    def adapts_layer_named(self, name: str) -> bool:
        # their get_ln_bn_params: parameters named with "bn" (ResNet) or "ln" (ViT), so no downsample BatchNorm
        return "bn" in name.lower() or "ln" in name.lower()

    def reset_extra(self) -> None:
        k, d = len(self.classnames), self.head.shape[1]
        self.mu = self.head.detach().clone()
        self.ct = torch.ones(k, device=self.head.device)
        self.shared: bool | None = {"shared": True, "class": False}.get(self.config.covariance)
        self.scatter = None
        self.scatter_count = None
        self.dims = d

    def extra_state(self) -> dict[str, Any]:
        return {"mu": self.mu, "ct": self.ct, "shared": self.shared, "scatter": self.scatter,
                "scatter_count": self.scatter_count}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.mu, self.ct, self.shared = state["mu"], state["ct"], state["shared"]
        self.scatter, self.scatter_count = state["scatter"], state["scatter_count"]

    def gaussians(self, x: torch.Tensor, probs: torch.Tensor, shared: bool) -> tuple[torch.Tensor, ...]:
        """The state after the batch (mu, ct, scatter, scatter count) and the regularised covariance(s)."""
        cfg = self.config
        ct = self.ct + probs.sum(0)
        mu = (self.ct[:, None] * self.mu + probs.T @ x) / (ct[:, None] + 1e-8)
        scatter = gda.weighted_scatter(x, probs, self.mu, per_class=not shared)
        if self.scatter is not None:
            scatter = self.scatter + scatter
        if shared:
            count = (self.scatter_count if self.scatter_count is not None else 0.0) + x.shape[0]
            covariance = gda.regularised(scatter / count, cfg.epsilon, cfg.sigma)
        else:
            count = (self.scatter_count if self.scatter_count is not None else 0.0) + probs.sum(0)
            covariance = gda.regularised(scatter / (count[:, None, None] + 1e-8), cfg.epsilon, cfg.sigma)
        return mu, ct, scatter, torch.as_tensor(count), covariance

    def predict_features(self, x: torch.Tensor, commit: bool) -> torch.Tensor:
        """(B, D) unit features -> (B, C) their adapted logits; `commit` writes the updated Gaussians to the state."""
        zero_shot = self.scale * x @ self.head.T
        probs = zero_shot.softmax(1)
        shared = self.shared
        if shared is None:
            shared = not gda.covariance_test(x, probs).reject
        mu, ct, scatter, count, covariance = self.gaussians(x, probs, shared)
        if commit:
            self.mu, self.ct, self.shared = mu.detach(), ct.detach(), shared
            self.scatter, self.scatter_count = scatter.detach(), count.detach()
        return zero_shot + self.config.alpha * gda.discriminant(x, mu, covariance)

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        features = self.encode(pixels)
        with torch.no_grad():
            logits = self.predict_features(features.detach(), commit=True)
        loss = soft_cross_entropy(self.scale * features @ self.head.T, logits)
        before = [p.detach().clone() for p in self.tower.adapted_parameters()]
        self.step(loss)
        beta = self.config.model_ema_beta
        with torch.no_grad():
            for p, old in zip(self.tower.adapted_parameters(), before):
                p.copy_(beta * old + (1 - beta) * p)
        extras = {"loss": float(loss.detach()), "shared_covariance": bool(self.shared)}
        return logits, [dict(extras) for _ in range(pixels.shape[0])]


def bayes_state_logits(method: BayesTTA, views01: torch.Tensor) -> torch.Tensor:
    """(B, N, 3, S, S) in [0, 1] -> (B, C): the adapted logits of view 0 under the state the method holds, the
    batch's own update of the Gaussians included, differentiable in the pixels; nothing is written."""
    with torch.enable_grad():
        x = method.encode(method.model.normalize(views01[:, 0]))
        return method.predict_features(x, commit=False)
