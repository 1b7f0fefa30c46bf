"""MTA: MeanShift for Test-time Augmentation (Zanella & Ben Ayed, CVPR 2024), training-free.

The prediction is the mode of the views' image features, found by a mean shift in
which every view is weighted by a kernel density (per-view bandwidth) and by an
"inlierness" score y. y is a distribution over the views that favours views near the
mode and views whose zero-shot predictions agree with the other inliers:

    y = softmax((density + lambda_q * A @ y) / lambda_y),   A = P P^T, P = softmax(view logits / T)

Alternating y updates and mode updates, exactly as the authors' `solve_mta`
(see src/shiftlab/methods/mta/README.md, *Golden fixture*): the outer loop always runs `outer_iterations`
times (no convergence test), y carries over, each inner loop stops early once the
L2 change is below `tol`, and the density is recomputed at every mode step.

Everything is written for a leading batch dimension, so `predict_batch` solves many
samples at once; each sample keeps its own early-stopping state, so the batch
result equals solving the samples one at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base import MethodOutput
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import MTASpec

# A bandwidth of 0 (every neighbour a duplicate view) would make the density 0/0. The
# floor is far below any real neighbour distance (cdist's own rounding is ~1e-4).
_MIN_BANDWIDTH = 1e-6


@dataclass
class MTASolution:
    """One sample's (or, with a leading batch dimension, several samples') MTA result."""
    logits: torch.Tensor        # (..., C)
    inlierness: torch.Tensor    # (..., N) final y, sums to 1
    mode: torch.Tensor          # (..., D) unit norm
    bandwidth: torch.Tensor     # (..., N)
    outer_iterations: int


def view_bandwidths(features: torch.Tensor, neighbour_ratio: float) -> torch.Tensor:
    """Per-view bandwidth sqrt(0.5 * mean squared distance to its k nearest other views): (..., N, D) -> (..., N).

    Column 0 of each sorted distance row is dropped as the view itself, as the authors
    do, even though cdist's matrix-product path leaves self-distances slightly above 0.
    """
    n = features.shape[-2]
    k = int(neighbour_ratio * (n - 1))
    if k < 1:
        raise ValueError(f"mta: need at least one neighbour; int({neighbour_ratio} * ({n} - 1)) = {k}")
    distances = torch.cdist(features, features).sort(dim=-1).values
    nearest = distances[..., 1:k + 1]
    return torch.sqrt(0.5 * (nearest ** 2).mean(-1))


def kernel_density(features: torch.Tensor, mode: torch.Tensor, bandwidth: torch.Tensor) -> torch.Tensor:
    """Gaussian kernel of each view around the mode with the view's own bandwidth: -> (..., N)."""
    sq_dist = ((features - mode.unsqueeze(-2)) ** 2).sum(-1)
    return torch.exp(-sq_dist / (2 * bandwidth ** 2))


def prediction_affinity(view_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """A = P P^T with P the views' softmax predictions: (..., N, C) -> (..., N, N)."""
    probs = (view_logits / temperature).softmax(-1)
    return probs @ probs.transpose(-1, -2)


def inlierness_step(density: torch.Tensor, affinity: torch.Tensor, inlierness: torch.Tensor,
                    lambda_y: float, lambda_q: float) -> torch.Tensor:
    """y <- softmax((density + lambda_q * A @ y) / lambda_y) over the views."""
    agreement = (affinity @ inlierness.unsqueeze(-1)).squeeze(-1)
    return ((density + lambda_q * agreement) / lambda_y).softmax(-1)


def mode_step(features: torch.Tensor, mode: torch.Tensor, bandwidth: torch.Tensor,
              inlierness: torch.Tensor) -> torch.Tensor:
    """One mean-shift step: the (density x inlierness)-weighted mean of the views, renormalised.

    If every weight underflows to 0 the mode stays put, rather than becoming 0/0.
    """
    weights = kernel_density(features, mode, bandwidth) * inlierness
    total = weights.sum(-1, keepdim=True)
    shifted = (weights.unsqueeze(-1) * features).sum(-2) / total
    shifted = shifted / shifted.norm(dim=-1, keepdim=True)
    return torch.where(total > 0, shifted, mode)


def _until_still(step, value: torch.Tensor, iterations: int, tol: float) -> torch.Tensor:
    """Apply `step` up to `iterations` times; a sample stops after the step that moved it less than tol."""
    active = torch.ones(value.shape[:-1], dtype=torch.bool, device=value.device)
    for _ in range(iterations):
        new = step(value)
        moved = (new - value).norm(dim=-1)
        value = torch.where(active.unsqueeze(-1), new, value)
        active = active & (moved >= tol)
        if not bool(active.any()):
            break
    return value


class MTA(EpisodicMethod):
    """MTA: the inlierness-weighted mean-shift mode of the view features, scored against the
    zero-shot class features. Reuses the shared view features and zero-shot view logits."""
    spec = MTASpec


    def solve(self, image_features: torch.Tensor, view_logits: torch.Tensor,
              text_features: torch.Tensor) -> MTASolution:
        """(..., N, D) normalised view features, (..., N, C) zero-shot view logits, (C, D) class features."""
        cfg = self.config
        feats = image_features.float()
        bandwidth = view_bandwidths(feats, cfg.neighbour_ratio)
        kernel_bandwidth = bandwidth.clamp_min(_MIN_BANDWIDTH)
        affinity = prediction_affinity(view_logits.float(), cfg.temperature)
        n = feats.shape[-2]
        y = torch.full(feats.shape[:-1], 1.0 / n, dtype=feats.dtype, device=feats.device)
        mode = feats[..., 0, :]
        for _ in range(cfg.outer_iterations):
            density = kernel_density(feats, mode, kernel_bandwidth)   # fixed during the y loop
            y = _until_still(lambda y_: inlierness_step(density, affinity, y_, cfg.lambda_y, cfg.lambda_q),  # noqa: B023
                             y, cfg.inner_iterations, cfg.tol)
            mode = _until_still(lambda m: mode_step(feats, m, kernel_bandwidth, y),  # noqa: B023 (called at once)
                                mode, cfg.inner_iterations, cfg.tol)
        logits = self.model.logit_scale * mode @ text_features.float().T
        return MTASolution(logits, y, mode, bandwidth, cfg.outer_iterations)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self._outputs(self.solve(ctx.image_features, ctx.zeroshot_view_logits, self.heads.zeroshot))[0]

    # No batched predict_batch: solving several samples as one tensor moves the inlierness by ~1e-5
    # (rounding, and per-sample early stops), and a sample's result must not depend on its batch.
    # MTA costs far less than encoding the views, so the base class's per-sample loop is kept.

    @staticmethod
    def _outputs(solution: MTASolution) -> list[MethodOutput]:
        y = solution.inlierness.reshape(-1, solution.inlierness.shape[-1])
        logits = solution.logits.reshape(-1, solution.logits.shape[-1])
        entropy = -(y * y.clamp_min(1e-30).log()).sum(-1)
        return [MethodOutput(logits[i], extras={"inlierness_entropy": float(entropy[i])})
                for i in range(logits.shape[0])]
