"""TransCLIP, zero-shot (Zanella, Gérin & Ben Ayed, NeurIPS 2024; MaxZanella/transduction-for-vlms
`TransCLIP_solver`): transductive over the whole test set.

Fitted once on the view-0 features of every test image (the engine's test-set pass), then read per image:
- y_hat = softmax(100 x features @ class head), the zero-shot predictions; z starts there.
- a Gaussian per class, unit-norm means mu (initialised from each class's 8 most confident images, weighted by
  their z) and one diagonal variance shared by the classes (initialised to 1/d);
- a k-NN graph W (each image's 3 most similar others, weighted by the cosine);
- `iterations` block updates: z (5 fixed-point steps of z ∝ y_hat^lambda x exp((log-likelihood +
  (50 / 2k) (W^T z + W z)) / 50)), then mu (z-weighted means, normalised), then the variance (z-weighted squared
  deviations); a last z update ends it. The prediction is the image's z.

An image that was not in the fitted set (an attacked copy, or a library call) gets one z update against the
fitted Gaussians and the z of its k most similar test images (nothing points to it, so W^T contributes nothing).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..context import SampleContext
from ..kinds import TestSetMethod
from .spec import TransCLIPConfig, TransCLIPSpec

_Z_TEMPERATURE = 50.0       # TransCLIP_utils.py update_z's literal 50 (1/50 inside the exponential)
# unit-norm features of one image encoded in two batches under fp16 autocast differ by up to ~1e-3 per entry
SAME_IMAGE_ATOL = 2e-3


@dataclass
class TransCLIPFit:
    z: torch.Tensor          # (N, K) the test set's assignments
    mu: torch.Tensor         # (K, d) unit-norm class means
    std: torch.Tensor        # (d,) the shared diagonal variance
    features: torch.Tensor   # (N, d) the fitted features
    sample_ids: list         # the sample id of each row (None where a context had none)


def gmm_log_likelihood(x: torch.Tensor, mu: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """-0.5 sum_d (x - mu_k)^2 / std_d: (N, d), (K, d), (d,) -> (N, K) (their `Gaussian.forward(no_exp=True)`)."""
    return -0.5 * torch.einsum("nkd,d->nk", (x[:, None, :] - mu[None]) ** 2, 1 / std)


def knn_graph(features: torch.Tensor, k: int) -> torch.Tensor:
    """Dense (N, N) W: row i holds the cosines to its k most similar samples after the most similar (itself),
    zeros elsewhere (their `build_affinity_matrix`, which drops the top-1 as the sample itself)."""
    affinity = features @ features.T
    k = min(k, features.shape[0] - 1)
    index = affinity.topk(k + 1, dim=-1).indices[:, 1:]
    return torch.zeros_like(affinity).scatter_(1, index, affinity.gather(1, index))


def update_z(loglik: torch.Tensor, y_hat: torch.Tensor, z: torch.Tensor, w: torch.Tensor, lambda_value: float,
             n_neighbors: int, steps: int) -> torch.Tensor:
    for _ in range(steps):
        inter = loglik + (_Z_TEMPERATURE / (n_neighbors * 2)) * (w.T @ z + w @ z)
        inter = inter - inter.max(dim=1, keepdim=True).values
        inter = y_hat ** lambda_value * torch.exp(inter / _Z_TEMPERATURE)
        z = inter / inter.sum(dim=1, keepdim=True)
    return z


def init_mu(z: torch.Tensor, features: torch.Tensor, n_confident: int) -> torch.Tensor:
    """Per class, the z-weighted sum of its n_confident highest-z samples' features, normalised: (K, d)."""
    top = z.topk(min(n_confident, z.shape[0]), dim=0).indices
    mask = torch.zeros_like(z).scatter_(0, top, 1.0)
    return F.normalize((mask * z).T @ features, dim=-1)


def fit_transclip(features: torch.Tensor, head: torch.Tensor, cfg: TransCLIPConfig) -> TransCLIPFit:
    """TransCLIP's zero-shot solver: (N, d) unit-norm features, (K, d) class head -> the fit."""
    feats = features.float()
    n, d = feats.shape
    y_hat = (cfg.logit_scale * feats @ head.float().T).softmax(-1)
    z = y_hat.clone()
    mu = init_mu(z, feats, cfg.n_confident)
    std = torch.full((d,), 1.0 / d, dtype=feats.dtype)
    w = knn_graph(feats, cfg.n_neighbors)
    for it in range(cfg.iterations + 1):
        z = update_z(gmm_log_likelihood(feats, mu, std), y_hat, z, w, cfg.lambda_value, cfg.n_neighbors,
                     cfg.z_iterations)
        if it == cfg.iterations:
            break
        mu = F.normalize((z / n).T @ feats / (z.sum(0) / n)[:, None], dim=-1)
        std = torch.einsum("nk,nkd->d", z / n, (feats[:, None, :] - mu[None]) ** 2) / (z.sum() / n)
    return TransCLIPFit(z, mu, std, feats, [None] * n)


class TransCLIP(TestSetMethod):
    """TransCLIP-ZS: fitted on the test set's view-0 features (`observe_test_set`, `end_test_set`), read per
    image (its row of z)."""
    spec = TransCLIPSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._seen: list[torch.Tensor] = []
        self._ids: list = []
        self.fit: TransCLIPFit | None = None

    def observe_test_set(self, ctxs: Sequence[SampleContext]) -> None:
        self._seen.extend(c.base_feature.float() for c in ctxs)
        self._ids.extend(c.sample_id for c in ctxs)

    def end_test_set(self) -> None:
        if not self._seen:
            raise ValueError(f"{self.name}: the test set is empty: there is nothing to fit")
        self.fit = fit_transclip(torch.stack(self._seen), self.heads.zeroshot, self.config)
        self.fit.sample_ids = self._ids
        self._seen, self._ids = [], []

    def fitted_row(self, ctx: SampleContext, x: torch.Tensor) -> int | None:
        """The fitted row of this image: the same sample id with the same feature up to the rounding of encoding
        it in another batch (fp16: |diff| <= SAME_IMAGE_ATOL), or, without an id, an exactly equal feature; None for
        an image the fit has not seen (an attacked copy moves its feature by more)."""
        fit = self.fit
        if ctx.sample_id is not None and ctx.sample_id in fit.sample_ids:
            row = fit.sample_ids.index(ctx.sample_id)
            return row if float((fit.features[row] - x).abs().max()) <= SAME_IMAGE_ATOL else None
        rows = (fit.features == x).all(-1).nonzero().flatten()
        return int(rows[0]) if len(rows) else None

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        fit = self.fit
        if fit is None:
            raise ValueError(f"{self.name}: no test set fitted yet: show it the test set first (observe_test_set, "
                             "then finish_test_set)")
        x = ctx.base_feature.float()
        row = self.fitted_row(ctx, x)
        if row is not None:
            z, fitted = fit.z[row], True
        else:
            cfg = self.config
            y_hat = (cfg.logit_scale * x @ self.heads.zeroshot.float().T).softmax(-1)
            sims = fit.features @ x
            k = min(cfg.n_neighbors, len(sims))
            top = sims.topk(k)
            pull = (top.values[:, None] * fit.z[top.indices]).sum(0)
            inter = gmm_log_likelihood(x[None], fit.mu, fit.std)[0] + _Z_TEMPERATURE / (cfg.n_neighbors * 2) * pull
            inter = y_hat ** cfg.lambda_value * torch.exp((inter - inter.max()) / _Z_TEMPERATURE)
            z, fitted = inter / inter.sum(), False
        logits = z.clamp_min(torch.finfo(z.dtype).tiny).log()
        return MethodOutput(logits, probs=z, extras={"in_fitted_set": fitted})
