"""Entropies and confident-view selection: the one selection rule every method uses.

TPT's filter (kept by C-TPT, R-TPT, TDA, DMN-ZS and ZERO): the int(N * ratio) views whose
prediction entropy is lowest, lowest first. The authors call `torch.argsort`, whose order on
exactly equal entropies is unspecified (CPU and CUDA differ); here ties keep the lower view
index first (a stable sort), so a selection is the same on every device. With distinct
entropies, which is what real views give, the two orders are identical (checked against the
authors' selections in the golden tests).
"""
from __future__ import annotations

import math

import torch


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-row entropy (nats) of softmax(logits) over the last dimension."""
    logp = logits.log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def marginal_entropy(selected_logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the average probability over views (TPT's `avg_entropy`): (..., k, C) -> (...)."""
    logp = selected_logits.log_softmax(-1)
    avg = torch.logsumexp(logp, dim=-2) - math.log(logp.shape[-2])
    avg = avg.clamp(min=torch.finfo(avg.dtype).min)
    return -(avg * avg.exp()).sum(-1)


def marginal_entropy_as_tpt(selected_logits: torch.Tensor) -> torch.Tensor:
    """`marginal_entropy` evaluated in the order of TPT's `avg_entropy` (z - logsumexp(z), not log_softmax):
    the same value, but the gradient of a confident view's top class is a small difference of large terms,
    and where a method's update reads the sign of tiny gradient entries (a first AdamW step), this order
    gives the authors' signs."""
    logp = selected_logits - selected_logits.logsumexp(-1, keepdim=True)
    avg = torch.logsumexp(logp, dim=-2) - math.log(logp.shape[-2])
    avg = avg.clamp(min=torch.finfo(avg.dtype).min)
    return -(avg * avg.exp()).sum(-1)


def mean_entropy(selected_logits: torch.Tensor) -> torch.Tensor:
    """Mean of per-view entropies (R-TPT's loss): (..., k, C) -> (...)."""
    return entropy(selected_logits).mean(-1)


def n_selected(n_views: int, ratio: float) -> int:
    """int(n_views * ratio) as the authors truncate it, but at least one view."""
    return max(1, int(n_views * ratio))


def lowest(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices of the n_selected(N, ratio) lowest scores along the last dim, lowest first,
    ties in index order: (..., N) -> (..., k)."""
    k = n_selected(scores.shape[-1], ratio)
    return torch.argsort(scores, dim=-1, stable=True)[..., :k]


def select_confident(view_logits: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices of the lowest-entropy views, lowest first: (..., N, C) logits -> (..., k)."""
    return lowest(entropy(view_logits), ratio)
