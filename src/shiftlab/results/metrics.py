"""Classification metrics over per-sample predictions.

All accuracies and calibration errors are returned in percent, as papers print them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def top1(correct: Sequence[bool]) -> float:
    """Top-1 accuracy in percent (nan for an empty set)."""
    c = np.asarray(correct, dtype=bool)
    return float(100.0 * c.mean()) if c.size else math.nan


def topk_from_lists(labels: Sequence[int], topk_preds: Sequence[Sequence[int]], k: int = 5) -> float:
    """Top-k accuracy in percent given each sample's ranked prediction list."""
    if not labels:
        return math.nan
    hits = [int(y) in list(p)[:k] for y, p in zip(labels, topk_preds)]
    return float(100.0 * np.mean(hits))


def ece(confidences: Sequence[float], correct: Sequence[bool], n_bins: int = 15) -> float:
    """Expected calibration error in percent with equal-width confidence bins.

    Bins are (0, 1/n], (1/n, 2/n], ..., as in Guo et al. 2017 and the C-TPT code;
    ECE = sum_b |B_b|/n * |acc(B_b) - conf(B_b)|.
    """
    conf = np.asarray(confidences, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    if conf.size == 0:
        return math.nan
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (conf > lo) & (conf <= hi)
        if lo == 0.0:
            in_bin |= conf == 0.0
        if in_bin.any():
            total += in_bin.mean() * abs(corr[in_bin].mean() - conf[in_bin].mean())
    return float(100.0 * total)


def reliability_bins(confidences: Sequence[float], correct: Sequence[bool],
                     n_bins: int = 15) -> list[tuple[float, float, int, float, float]]:
    """Per-bin (lower edge, upper edge, count, accuracy, mean confidence) for reliability diagrams."""
    conf = np.asarray(confidences, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (conf > lo) & (conf <= hi)
        if lo == 0.0:
            in_bin |= conf == 0.0
        n = int(in_bin.sum())
        rows.append((float(lo), float(hi), n,
                     float(corr[in_bin].mean()) if n else math.nan,
                     float(conf[in_bin].mean()) if n else math.nan))
    return rows


def nll(true_class_probs: Sequence[float], floor: float = 1e-12) -> float:
    """Mean negative log-likelihood of the true class (nats)."""
    p = np.asarray(true_class_probs, dtype=np.float64)
    if p.size == 0:
        return math.nan
    return float(-np.log(np.clip(p, floor, 1.0)).mean())


def brier(probs: np.ndarray, labels: Sequence[int]) -> float:
    """Multi-class Brier score: mean over samples of sum_c (p_c - [c == label])^2, in [0, 2]
    (Brier 1950; lower is better). `probs` (n, C) are each sample's probability vector."""
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if p.ndim != 2 or p.shape[0] != y.shape[0]:
        raise ValueError(f"brier needs probs (n, C) and n labels, got {p.shape} and {y.shape}")
    if not p.shape[0]:
        return math.nan
    rows = np.arange(p.shape[0])
    return float(((p ** 2).sum(1) - 2 * p[rows, y] + 1).mean())
