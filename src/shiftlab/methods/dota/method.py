"""DOTA (Han et al., NeurIPS 2025, "DOTA: Distributional Test-Time Adaptation of Vision-Language Models").

An online Gaussian estimate of each class's test feature distribution (mean per class,
covariance per class, soft counts), updated with every sample's zero-shot probabilities as
soft labels; a linear discriminant with the classes' mean covariance as shared covariance
is added to the zero-shot logits with a weight that grows with the counts. Online: see
docs/ONLINE.md. Authors' code: github.com/skylineeeeen/DOTA (`dota.py`, `utils.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..base import MethodOutput
from ..common.confidence import select_confident
from ..common.online_common import OnlineStateAndHead, view_features
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import OnlineMethod
from .spec import DOTASpec


@dataclass
class DOTASample:
    """What DOTA derives from one sample's views."""
    features: torch.Tensor      # (k, D) normalised features of the kept views
    probs: torch.Tensor         # (k, C) their zero-shot softmax (the soft labels of the update)
    logits: torch.Tensor        # (C,) mean zero-shot logits of the kept views


def gaussian_scores(x: torch.Tensor, means: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """Linear discriminant x^T P mu_c - mu_c^T P mu_c / 2: x (D,), means (C, D), precision (D, D) -> (C,)."""
    w = precision @ means.T                    # (D, C), column c is P mu_c (DOTA.predict)
    return x @ w - 0.5 * (means.T * w).sum(0)


def discriminant(means: torch.Tensor, system: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, b) with W = system^-1 means^T (D, C) and b_c = mu_c^T W_c / 2, so that the scores of a
    feature x are x @ W - b (gaussian_scores with P = system^-1). A Cholesky solve: `system` is
    symmetric positive definite, and this costs a third of forming the inverse and multiplying."""
    w = torch.cholesky_solve(means.T, torch.linalg.cholesky(system))
    return w, 0.5 * (means.T * w).sum(0)


def update_estimates(means: torch.Tensor, counts: torch.Tensor, scatter: torch.Tensor | None,
                     x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One soft-labelled update of every class (DOTA.fit): x (k, D) features, y (k, C) soft labels.

    means (C, D) and counts (C,) -> their new values (returned); `scatter` (C, D, D), the per-class
    covariances times their counts, gains sum_b y_bc (x_b - mu_c)(x_b - mu_c)^T in place, with the
    means before the update (the authors' covariance update multiplied through by the new count).
    """
    weight = y.sum(0)                                                   # (C,)
    new_counts = counts + weight
    new_means = (y.T @ x + counts[:, None] * means) / new_counts[:, None]
    if scatter is not None:
        diff = x[None] - means[:, None]                                 # (C, k, D)
        scatter.baddbmm_((y.T[:, :, None] * diff).transpose(1, 2), diff)
    return new_means, new_counts


def shared_covariance(scatter: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean over classes of the per-class covariances scatter_c / counts_c: (C, D, D), (C,) -> (D, D)."""
    n = counts.shape[0]
    return ((1.0 / (counts * n)) @ scatter.reshape(n, -1)).reshape(scatter.shape[1:])


def shrunk(cov: torch.Tensor, epsilon: float) -> torch.Tensor:
    """(1 - epsilon) cov + epsilon I, the matrix DOTA.update inverts."""
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    return (1 - epsilon) * cov + epsilon * eye


class DOTA(OnlineStateAndHead, OnlineMethod):
    """DOTA: online per-class Gaussian estimates of the test features (training-free).

    Per sample: zero-shot logits of every view with the text head; the 10% lowest-entropy views
    are kept. Output = their mean logits + w * scores, with scores the Gaussian discriminant of
    their mean feature under the current estimates and w = min(rho * mean(counts) / k, eta).
    Then every class's mean, covariance and count are updated with the kept views' features,
    each weighted by its softmax probability for the class, and the shared precision matrix is
    recomputed. As in the authors' code, a sample is predicted BEFORE it updates the estimates.
    """
    spec = DOTASpec

    def reset(self) -> None:
        cfg = self.config
        n, dim, dev = len(self.classnames), self._feature_dim(), self.model.device
        self.means = torch.full((n, dim), cfg.mu_init, device=dev)
        self.counts = torch.full((n,), cfg.count_init, device=dev)
        self.scatter: torch.Tensor | None = None        # (C, D, D), allocated at the first update
        self.covariance = torch.eye(dim, device=dev) * cfg.sigma
        self.seen = 0
        self._refresh()

    def _system(self) -> torch.Tensor:
        """The matrix whose inverse is the shared precision: before any update the authors invert
        sigma * I without the epsilon shrinkage (pinverse, dota.py:39), afterwards (dota.py:65-67) with."""
        return self.covariance if self.seen == 0 else shrunk(self.covariance, self.config.epsilon)

    def _refresh(self) -> None:
        self._weights, self._bias = discriminant(self.means, self._system())

    def precision_matrix(self) -> torch.Tensor:
        """(D, D) the shared precision the scores use (the authors' `Lambda`); not on the per-sample path."""
        return torch.linalg.inv(self._system())

    def _feature_dim(self) -> int:
        dim = getattr(self.model.clip.visual, "output_dim", None)
        return int(dim) if isinstance(dim, int) else int(text_head(self).shape[-1])

    # -- the algorithm -------------------------------------------------------------------------
    def summarize_sample(self, features: torch.Tensor) -> DOTASample:
        """Normalised view features (N, D) -> the kept views' features and soft labels, and the mean logits."""
        features = features.float()
        scale = self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale
        view_logits = scale * features @ text_head(self).float().T
        kept = select_confident(view_logits, self.config.view_ratio)
        sel = view_logits[kept]
        return DOTASample(features[kept], sel.softmax(-1), sel.mean(0))

    def fusion_weight(self, k: int) -> float:
        return min(self.config.rho * float(self.counts.mean()) / k, self.config.eta)

    def readout(self, s: DOTASample) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(output logits, Gaussian scores, fusion weight) of a sample under the current estimates."""
        scores = s.features.mean(0) @ self._weights - self._bias
        w = self.fusion_weight(s.features.shape[0])
        return s.logits + w * scores, scores, w

    def update(self, s: DOTASample) -> None:
        cfg = self.config
        if cfg.update_covariance and self.scatter is None:
            n, dim = self.means.shape
            self.scatter = (torch.eye(dim, device=self.means.device) * cfg.sigma).repeat(n, 1, 1)
            self.scatter *= self.counts[:, None, None]
        self.means, self.counts = update_estimates(self.means, self.counts, self.scatter, s.features, s.probs)
        if self.scatter is not None:
            self.covariance = shared_covariance(self.scatter, self.counts)
        self.seen += 1
        self._refresh()

    def class_covariances(self) -> torch.Tensor:
        """(C, D, D) the per-class covariances (the authors' `Sigma`)."""
        if self.scatter is None:
            n, dim = self.means.shape
            return (torch.eye(dim, device=self.means.device) * self.config.sigma).repeat(n, 1, 1)
        return self.scatter / self.counts[:, None, None]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            s = self.summarize_sample(view_features(ctx, self.config.views.n_views))
            logits, _, w = self.readout(s)
            self.update(s)
        return MethodOutput(logits, extras={"fusion_weight": w, "mean_count": float(self.counts.mean())})

    # -- online state --------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        # before the first update the per-class covariances are sigma * I (not stored: C x D x D floats)
        scatter = self.scatter.detach().cpu().clone() if self.scatter is not None else torch.zeros(0)
        return {"seen": self.seen,
                "means": self.means.detach().cpu().clone(), "counts": self.counts.detach().cpu().clone(),
                "scatter": scatter, "covariance": self.covariance.detach().cpu().clone()}

    def load_state(self, state: dict[str, Any]) -> None:
        dev = self.model.device
        if tuple(state["means"].shape) != tuple(self.means.shape):
            raise ValueError(f"dota: state means have shape {tuple(state['means'].shape)}, this run "
                             f"{tuple(self.means.shape)}")
        self.means = state["means"].to(dev, torch.float32)
        self.counts = state["counts"].to(dev, torch.float32)
        self.scatter = state["scatter"].to(dev, torch.float32) if state["scatter"].numel() else None
        self.covariance = state["covariance"].to(dev, torch.float32)
        self.seen = int(state["seen"])
        self._refresh()          # deterministic: the same factor and solve as the run that saved the state
