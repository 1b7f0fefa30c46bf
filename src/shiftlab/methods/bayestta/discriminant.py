"""BayesTTA's Gaussian discriminant analysis on unit image features, as its authors' code computes it
(github.com/cuishuang99/BayesTTA at 9c98176, `dis_cttta_runner_cd.py`): pure functions, shapes documented.

B images, K classes, D feature dimensions. The state: class means `mu` (K, D) started at the class text features,
soft counts `ct` (K,) started at 1, and covariance sums: one shared (D, D) with an image count (`shared`), or one
per class (K, D, D) with soft counts.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

# their _covariance_homogeneity_test: 10 principal components, 1e-6 x I added to each covariance, level 0.05
TEST_COMPONENTS, TEST_RIDGE, TEST_LEVEL = 10, 1e-6, 0.05


class BoxM(NamedTuple):
    """Box's M test of equal class covariances (their `_covariance_homogeneity_test`): `reject` True means one
    covariance per class; `f_stat`, `f_critical`, `d1`, `d2` as they print them (None where the test stops early)."""
    reject: bool
    f_stat: float | None = None
    f_critical: float | None = None
    d1: int | None = None
    d2: float | None = None


def f_quantile(q: float, d1: float, d2: float) -> float:
    """The F distribution's q-quantile (scipy.stats.f.ppf, as theirs)."""
    try:
        from scipy.stats import f
    except ImportError:
        raise ValueError("bayestta's covariance test needs scipy's F distribution: pip install scipy "
                         "(or bayestta.covariance 'shared' or 'class')") from None
    return float(f.ppf(q, d1, d2))


def principal_components(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, D) -> (B, n): the centred rows on their n leading principal directions (sklearn's PCA.fit_transform up to
    each component's sign, which no determinant below depends on)."""
    centred = x - x.mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    return centred @ vh[:n].T


def covariance_test(x: torch.Tensor, probs: torch.Tensor, level: float = TEST_LEVEL) -> BoxM:
    """Box's M test on one batch: unit features (B, D), class probabilities (B, K). Classes weigh images by their
    probabilities; the degrees of freedom are checked before the projection (theirs projects first, and stops on a
    batch of fewer than 10 images)."""
    n_images, k = probs.shape
    counts = probs.sum(0).cpu()
    total_dof = float((counts - 1).sum())
    if total_dof <= k - 1:
        return BoxM(False)
    if min(x.shape) < TEST_COMPONENTS:
        raise ValueError(f"bayestta's covariance test projects the first batch on {TEST_COMPONENTS} principal "
                         f"components and needs {TEST_COMPONENTS} or more images, got {n_images}")
    low = principal_components(x.detach().float().cpu(), TEST_COMPONENTS)
    p = probs.detach().float().cpu()
    d, eps = TEST_COMPONENTS, 1e-8
    weight = p.sum(0) + eps                                                  # (K,)
    means = (p.T @ low) / weight[:, None]                                    # (K, d)
    diff = low[None] - means[:, None]                                        # (K, B, d)
    covs = (torch.einsum("bk,kbd,kbe->kde", p, diff, diff) + TEST_RIDGE * torch.eye(d)) / weight[:, None, None]
    pooled = (((counts - 1) / (total_dof + eps))[:, None, None] * covs).sum(0)
    sign_pooled, logdet_pooled = torch.linalg.slogdet(pooled)
    signs, logdets = torch.linalg.slogdet(covs)
    if sign_pooled <= 0 or (signs <= 0).any():
        return BoxM(False)
    m = float(((counts - 1) * (logdet_pooled - logdets)).sum())
    if k < 2:
        return BoxM(False)
    small = sum(1 / (float(c) - 1 + eps) for c in counts if c >= d + 1)
    a1 = 1 - (2 * d ** 2 + 3 * d - 1) / (6 * (d + 1) * (k - 1)) * (small - 1 / total_dof)
    denominator = total_dof - k
    if denominator <= 0:
        return BoxM(False)
    a2 = d * (d + 1) * (k - 1) * (k + 1) / (6 * denominator)
    d1 = d * (d + 1) * (k - 1) // 2
    d2 = (d1 + 2) / (a2 + 1e-8)
    corrected = m * a1
    f_stat = corrected / (d1 * (1 - a1 + corrected / (d2 + eps)))
    if not math.isfinite(f_stat):
        return BoxM(False)
    critical = f_quantile(1 - level, d1, d2)
    return BoxM(f_stat > critical, f_stat, critical, d1, d2)


def weighted_scatter(x: torch.Tensor, probs: torch.Tensor, mu: torch.Tensor, per_class: bool) -> torch.Tensor:
    """sum over images b and classes k of probs[b, k] (x_b - mu_k)(x_b - mu_k)^T: (D, D), or per class (K, D, D).
    Formed from the (B, K, D) differences in the input's precision, as theirs: the discriminant's inverse amplifies
    a covariance's last bits (its smallest kept eigenvalues sit just above pinv's cut-off), so a float64 or expanded
    form moves the logits by ~1% on the golden tiny CLIP."""
    diff = x.unsqueeze(1) - mu.unsqueeze(0)
    return torch.einsum("bk,bkd,bke->kde" if per_class else "bk,bkd,bke->de", probs, diff, diff)


def regularised(covariance: torch.Tensor, epsilon: float, sigma: float) -> torch.Tensor:
    """(1 - epsilon) covariance + epsilon sigma^2 I, for (D, D) or (K, D, D)."""
    eye = torch.eye(covariance.shape[-1], device=covariance.device, dtype=covariance.dtype)
    return covariance * (1 - epsilon) + epsilon * eye * sigma ** 2


def log_determinant(s: torch.Tensor) -> torch.Tensor:
    """log det of symmetric positive matrices (..., D, D): twice the log of Cholesky's diagonal, as theirs; the
    signed log-determinant's magnitude where Cholesky fails."""
    chol, info = torch.linalg.cholesky_ex(s)
    via_cholesky = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    return torch.where(info == 0, via_cholesky, torch.linalg.slogdet(s).logabsdet)


def discriminant(x: torch.Tensor, mu: torch.Tensor, covariance: torch.Tensor) -> torch.Tensor:
    """(B, K) Gaussian log-densities up to a constant: -1/2 (x - mu_k)^T pinv(S_k) (x - mu_k) - 1/2 log det S_k
    - log K, with one regularised covariance S (D, D) for all classes or one per class (K, D, D). pinv as theirs
    (torch.linalg.pinv's default cut-off drops directions below ~D x 1.2e-7 of the largest); one shared covariance is
    inverted once (theirs inverts K copies: the same bits, K times the work and memory)."""
    k = mu.shape[0]
    inverse = torch.linalg.pinv(covariance)
    diff = x.unsqueeze(1) - mu.unsqueeze(0)                                      # (B, K, D)
    if covariance.dim() == 2:
        quad = -0.5 * torch.einsum("bkd,de,bke->bk", diff, inverse, diff)
        logdet = (-0.5 * log_determinant(covariance)).expand(k)
    else:
        quad = -0.5 * torch.einsum("bkd,kde,bke->bk", diff, inverse, diff)
        logdet = -0.5 * log_determinant(covariance)
    return quad + logdet[None] + torch.log(torch.tensor(1.0 / k, device=x.device, dtype=x.dtype))
