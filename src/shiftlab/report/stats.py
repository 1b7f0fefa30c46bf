"""Report-only statistics: per-series metrics, paired tests, renditions, confusions.

The metric definitions themselves live in shiftlab.results.metrics; this module only
slices the records and adds the statistics a reader needs to judge a gap
between two methods (McNemar test, paired bootstrap interval).
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from shiftlab.report.load import Series
from shiftlab.results import metrics
from shiftlab.results.ood import ood_metrics
from shiftlab.results.scoring import score

RENDITIONS = ("art", "cartoon", "deviantart", "embroidery", "graffiti", "graphic", "misc",
              "origami", "painting", "sculpture", "sketch", "sticker", "tattoo", "toy", "videogame")


def rendition_of(path: str) -> str:
    """ImageNet-R rendition from a file name ('n01443537/art_3.jpg' -> 'art'); unknown -> 'other'."""
    base = os.path.basename(str(path).replace("\\", "/"))
    prefix = base.split("_", 1)[0].lower() if "_" in base else ""
    return prefix if prefix in RENDITIONS else "other"


def series_metrics(s: Series) -> dict:
    """top1/top5/ece (percent), nll (nats), brier (NaN without probability vectors), n, errors,
    seconds_per_image for one series
    (the scores are shiftlab.results.scoring.score, as in summary.json)."""
    seconds = s.run.seconds_per_image(s.method)
    if seconds is None and s.n and not np.isnan(s.seconds).all():
        seconds = float(np.nanmean(s.seconds))
    return {
        **score(s.labels.tolist(), s.correct, s.top5, s.confidence, s.true_prob),
        # from the stored probability vectors (--save-probs) only: records alone cannot give it
        "brier": metrics.brier(s.probs, s.labels) if s.probs is not None else math.nan,
        "errors": s.errors,
        "seconds_per_image": math.nan if seconds is None else seconds,
        # an open-set run: detection of its OOD samples by the method's OOD score (shiftlab.results.ood)
        **(ood_metrics(s.id_scores, s.ood_scores) if s.ood_scores is not None else {}),
    }


# ---------------------------------------------------------------- paired tests

def mcnemar(a_only: int, b_only: int) -> tuple[float, str]:
    """Two-sided McNemar p-value from the discordant counts, and the test used.

    With fewer than 25 discordant samples the chi-square approximation is poor,
    so the exact binomial test (discordant split vs. 1/2) is used instead.
    """
    n = a_only + b_only
    if n == 0:
        return 1.0, "none (no discordant samples)"
    if n < 25:
        k = min(a_only, b_only)
        # Bin(n, 1/2) is symmetric, so two-sided p = 2 * P(X <= k), capped at 1.
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
        return min(1.0, 2.0 * tail), "exact binomial"
    stat = (abs(a_only - b_only) - 1.0) ** 2 / n
    # Survival function of chi-square with 1 dof: P(chi2 > x) = erfc(sqrt(x / 2)).
    return math.erfc(math.sqrt(stat / 2.0)), "chi-square (cc)"


def paired_bootstrap_ci(a_correct: ArrayLike, b_correct: ArrayLike, n_resamples: int = 2000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of acc(A) - acc(B) in points, resampling samples jointly.

    Each sample contributes d = correct_A - correct_B in {-1, 0, +1}, so the mean
    over a resample depends only on how many of each it drew: drawing those
    counts from a multinomial is exactly the same distribution as resampling
    indices, but costs O(n_resamples) instead of O(n_resamples * n) memory.
    """
    a = np.asarray(a_correct, dtype=bool)
    b = np.asarray(b_correct, dtype=bool)
    n = a.size
    if n == 0:
        return math.nan, math.nan
    probs = np.array([(a & ~b).sum(), (a == b).sum(), (~a & b).sum()], dtype=np.float64) / n
    counts = np.random.default_rng(seed).multinomial(n, probs, size=n_resamples)
    diffs = 100.0 * (counts[:, 0] - counts[:, 2]) / n
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(diffs, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


@dataclass
class PairedResult:
    a: str
    b: str
    setting: str
    n: int
    acc_a: float
    acc_b: float
    a_only: int   # samples A gets right and B wrong ("A fixes")
    b_only: int
    p_value: float
    test: str
    ci_low: float
    ci_high: float
    p_holm: float | None = None   # Holm-adjusted over the comparisons of one (dataset, setting); None: alone

    @property
    def p_adjusted(self) -> float:
        return self.p_value if self.p_holm is None else self.p_holm

    @property
    def diff(self) -> float:
        return self.acc_a - self.acc_b

    @property
    def verdict(self) -> str:
        """A plain reading: a winner only when the test and the interval both say so."""
        if self.n == 0:
            return "no shared samples"
        if self.p_adjusted < 0.05 and (self.ci_low > 0 or self.ci_high < 0):
            return f"{self.a if self.diff > 0 else self.b} better"
        return "no clear difference"

    def as_row(self) -> dict:
        return {"a": self.a, "b": self.b, "setting": self.setting, "n": self.n,
                "acc_a": self.acc_a, "acc_b": self.acc_b, "diff": self.diff,
                "ci_low": self.ci_low, "ci_high": self.ci_high, "a_only": self.a_only,
                "b_only": self.b_only, "p_value": self.p_value, "p_holm": self.p_adjusted, "test": self.test,
                "verdict": self.verdict}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values (family-wise error rate): the i-th smallest becomes
    max over j <= i of min(1, (m - j + 1) p_(j)), in the input's order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def paired_compare(a: Series, b: Series, n_resamples: int = 2000, seed: int = 0) -> PairedResult:
    """Compare two series on the samples both predicted (matched by id within one setting)."""
    _, ia, ib = np.intersect1d(a.ids, b.ids, assume_unique=True, return_indices=True)
    ca, cb = a.correct[ia], b.correct[ib]
    a_only, b_only = int((ca & ~cb).sum()), int((~ca & cb).sum())
    p, test = mcnemar(a_only, b_only)
    lo, hi = paired_bootstrap_ci(ca, cb, n_resamples, seed)
    return PairedResult(a.key, b.key, a.setting_label, int(ia.size), metrics.top1(ca), metrics.top1(cb),
                        a_only, b_only, p, test, lo, hi)


# ------------------------------------------------------- per class, rendition

def per_class_accuracy(s: Series, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(sample count, accuracy in percent; nan where a class has no sample) per class index."""
    counts = np.bincount(s.labels, minlength=n_classes)
    hits = np.bincount(s.labels, weights=s.correct.astype(np.float64), minlength=n_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts, np.where(counts > 0, 100.0 * hits / np.maximum(counts, 1), np.nan)


def top_confusions(s: Series, k: int = 20) -> list[tuple[int, int, int]]:
    """The k most frequent (true, predicted) pairs among the errors, most frequent first."""
    wrong = ~s.correct
    if not wrong.any():
        return []
    pairs, counts = np.unique(np.stack([s.labels[wrong], s.preds[wrong]], axis=1), axis=0,
                              return_counts=True)
    order = np.lexsort((pairs[:, 1], pairs[:, 0], -counts))[:k]  # ties: by class index, stable
    return [(int(pairs[i, 0]), int(pairs[i, 1]), int(counts[i])) for i in order]


def rendition_accuracy(s: Series, ids: np.ndarray | None = None) -> dict[str, tuple[int, float]]:
    """{rendition: (n, accuracy %)} over the series' samples (or over the given ids only)."""
    keep = np.ones(s.n, dtype=bool) if ids is None else np.isin(s.ids, ids)
    names = np.array([rendition_of(p) for p in s.paths]) if s.n else np.array([], dtype=str)
    out = {}
    for r in (*RENDITIONS, "other"):
        sel = keep & (names == r)
        if sel.any():
            out[r] = (int(sel.sum()), metrics.top1(s.correct[sel]))
    return out


def known_rendition_share(s: Series) -> float:
    """Share of file names with a known rendition prefix (does ImageNet-R's naming apply?)."""
    return float(np.mean([rendition_of(p) != "other" for p in s.paths])) if s.n else 0.0
