"""LAME (Boudiaf, Mueller, Ben Ayed & Bertinetto, CVPR 2022, "Parameter-free Online Test-time Adaptation").

A batch method (the episodic-batch protocol, docs/PROTOCOLS.md), output only: the zero-shot probabilities of
a batch's images are adjusted together by minimising a Laplacian-regularised energy over the batch (a kNN,
RBF or linear affinity of their frozen view-0 features); nothing is trained and nothing crosses batches.
Authors' code: github.com/fiveai/LAME (`src/adaptation/lame.py`, d2e5f63); its CLIP port in CLIPTTA
(github.com/MarcLafon/cliptta `ttavlm/methods/lame.py`, f4221f4), whose choices are the defaults. What
differs: README.md in this folder.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..base import MethodOutput
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import BatchMethod
from .spec import LAMEConfig, LAMESpec

UNARY_EPS = 1e-10       # -log(p + 1e-10) (CLIPTTA lame.py:36, fiveai lame.py:107)
LOG_CLIP = 1e-20        # Y.clip(1e-20) inside the energy's log
STOP_RTOL = 1e-8        # stop once |E - E_prev| <= 1e-8 |E_prev|, from the third iteration on


def pairwise_distances(features: torch.Tensor) -> torch.Tensor:
    """(N, D) -> (N, N) Euclidean distances, as the authors' kernels compute them (a broadcast difference)."""
    return torch.norm(features.unsqueeze(0) - features.unsqueeze(1), dim=-1, p=2)


def affinity(features: torch.Tensor, kind: str, knn: int) -> torch.Tensor:
    """(N, D) unit features -> (N, N) kernel. `knn`: 1 for each row's `knn` nearest others (the first of the
    min(knn + 1, N) nearest, the row itself, left out); `rbf`: exp(-d^2 / (2 sigma^2)) with sigma the mean over
    rows of the distance to the min(knn, N)-th nearest (the row itself counted); `linear`: X X^T."""
    if kind == "linear":
        return features @ features.T
    dist = pairwise_distances(features)
    n = features.shape[0]
    if kind == "knn":
        nearest = dist.topk(min(knn + 1, n), -1, largest=False).indices[:, 1:]
        return torch.zeros(n, n, dtype=features.dtype, device=features.device).scatter_(-1, nearest, 1.0)
    if kind == "rbf":
        sigma = dist.topk(min(knn, n), -1, largest=False).values[:, -1].mean()
        if not sigma > 0:           # one image (or identical ones): theirs divides 0 by 0; no pairwise term here
            return torch.zeros(n, n, dtype=features.dtype, device=features.device)
        return torch.exp(-dist ** 2 / (2 * sigma ** 2))
    raise ValueError(f"lame.affinity must be one of knn, rbf, linear, got {kind!r}")


def energy(y: torch.Tensor, unary: torch.Tensor, pairwise: torch.Tensor, bound_lambda: float) -> float:
    """The objective the iterations watch: sum(unary Y - lambda pairwise Y + Y log Y). `pairwise` already holds
    lambda K Y, so lambda enters twice, as in both authors' `entropy_energy` (the same for their lambda = 1)."""
    return (unary * y - bound_lambda * pairwise * y + y * torch.log(y.clip(LOG_CLIP))).sum().item()


def laplacian_optimization(unary: torch.Tensor, kernel: torch.Tensor, bound_lambda: float = 1.0,
                           max_steps: int = 100) -> tuple[torch.Tensor, int]:
    """unary (N, K) = -log p, kernel (N, N) -> (Y (N, K) rows on the simplex, iterations run). Y starts at p;
    each step Y = softmax(-unary + lambda K Y), until the energy's relative change is <= 1e-8 (from the third
    step on) or `max_steps`."""
    y = (-unary).softmax(-1)
    previous = float("inf")
    for step in range(max_steps):
        pairwise = bound_lambda * kernel.matmul(y)
        y = (-unary + pairwise).softmax(-1)
        e = energy(y, unary, pairwise, bound_lambda)
        if step > 1 and abs(e - previous) <= STOP_RTOL * abs(previous):
            return y, step + 1
        previous = e
    return y, max_steps


def adjust(features: torch.Tensor, probs: torch.Tensor, cfg: LAMEConfig) -> tuple[torch.Tensor, int]:
    """One batch: unit features (N, D), zero-shot probabilities (N, K) -> (Y (N, K), iterations)."""
    unary = -torch.log(probs + UNARY_EPS)
    kernel = affinity(features, cfg.affinity, cfg.knn)
    if cfg.force_symmetry:
        kernel = 0.5 * (kernel + kernel.T)
    return laplacian_optimization(unary, kernel, cfg.bound_lambda, cfg.max_steps)


class LAME(BatchMethod):
    """LAME: Laplacian adjustment of each batch's zero-shot probabilities (training-free; the episodic-batch
    protocol, `--batch-size B`: CLIPTTA's 128, the paper's 16)."""
    spec = LAMESpec

    def prepare(self) -> None:
        _ = text_head(self)

    def reset(self) -> None:
        pass                        # nothing is carried from batch to batch

    def zero_shot(self, features: torch.Tensor) -> torch.Tensor:
        """(N, D) unit features -> (N, K) the unary's probabilities: softmax(scale x cosine)."""
        scale = self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale
        return (scale * features @ text_head(self).float().T).softmax(-1)

    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        features = torch.stack([c.base_feature.float() for c in ctxs])
        with torch.no_grad():
            probs = self.zero_shot(features)
            y, iterations = adjust(features, probs, self.config)
        # its own OOD score reads Y itself, before any output scale (Lame.forward_and_adapt: get_scores(Y))
        ood = (self.config.ood_logit_scale * y).softmax(-1).max(-1).values
        if self.config.output_scale is not None:
            y = (self.config.output_scale * y).softmax(-1)
        extras = {"batch": len(ctxs), "iterations": iterations}
        return [MethodOutput(row.clamp_min(torch.finfo(row.dtype).tiny).log(), probs=row,
                             extras={**extras, "zero_shot_pred": int(p.argmax())}, ood_score=float(score))
                for p, row, score in zip(probs, y, ood)]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self.adapt_batch([ctx])[0]
