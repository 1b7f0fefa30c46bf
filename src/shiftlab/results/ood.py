"""Out-of-distribution detection metrics of an open-set run: AUROC, FPR95 and AUPR, in percent as papers print
them, with the in-distribution (ID) samples as the positive class and a higher score meaning "more ID", as in
CLIPTTA's `ttavlm/lib/ood_metrics.py` (MarcLafon/cliptta; `get_auroc`, `get_fpr`, `get_aupr_in`):

- AUROC: the area under the ROC curve of ID (positive) against OOD by the score; ties count one half
  (= scikit-learn's `roc_auc_score`, the Mann-Whitney statistic);
- FPR95: the share of OOD samples scored at least as ID-like as the threshold that keeps 95% of the ID samples,
  read off the ROC curve by linear interpolation at TPR = 0.95 (their `interp1d(tpr, fpr)(0.95)` over
  scikit-learn's `roc_curve` points; where the curve runs along TPR = 0.95 exactly, its highest FPR there);
- AUPR: average precision with ID as positive (AUPR-In; scikit-learn's `average_precision_score`:
  sum over thresholds of (R_n - R_{n-1}) P_n, no interpolation).

Implemented here in numpy (shiftlab does not depend on scikit-learn); tests/test_ood.py checks each against
scikit-learn on the same scores.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["roc_curve", "auroc", "fpr_at_tpr", "aupr_in", "ood_metrics", "score_open_set", "score_own"]


def _split(id_scores: Sequence[float], ood_scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    xin = np.asarray(id_scores, dtype=np.float64).ravel()
    xood = np.asarray(ood_scores, dtype=np.float64).ravel()
    return xin, xood


def roc_curve(id_scores: Sequence[float], ood_scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) at every distinct score taken as threshold (score >= t is called ID), from (0, 0) to (1, 1);
    points on a straight segment are kept (they change neither the area nor an interpolation)."""
    xin, xood = _split(id_scores, ood_scores)
    scores = np.concatenate([xin, xood])
    positive = np.concatenate([np.ones(len(xin)), np.zeros(len(xood))])
    order = np.argsort(-scores, kind="mergesort")
    scores, positive = scores[order], positive[order]
    last_of_tie = np.r_[np.nonzero(np.diff(scores))[0], len(scores) - 1]
    tp = np.cumsum(positive)[last_of_tie]
    fp = np.cumsum(1 - positive)[last_of_tie]
    tpr = np.r_[0.0, tp / len(xin)]
    fpr = np.r_[0.0, fp / len(xood)]
    return fpr, tpr


def auroc(id_scores: Sequence[float], ood_scores: Sequence[float]) -> float:
    """Area under the ROC curve, in percent (nan without ID or OOD samples)."""
    xin, xood = _split(id_scores, ood_scores)
    if not len(xin) or not len(xood):
        return math.nan
    fpr, tpr = roc_curve(xin, xood)
    return float(100.0 * np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def fpr_at_tpr(id_scores: Sequence[float], ood_scores: Sequence[float], tpr_level: float = 0.95) -> float:
    """The false-positive rate (OOD called ID) where the ROC curve reaches `tpr_level`, in percent: linear
    interpolation between the last curve point below the level and the next; where the curve runs along exactly
    that TPR, its last (highest) FPR there, as `np.interp` (to which their scipy `interp1d` call delegates) reads
    a curve with repeated TPRs."""
    xin, xood = _split(id_scores, ood_scores)
    if not len(xin) or not len(xood):
        return math.nan
    fpr, tpr = roc_curve(xin, xood)
    j = int(np.searchsorted(tpr, tpr_level, side="right")) - 1   # the last point with tpr <= level
    if tpr[j] == tpr_level or j == len(tpr) - 1:
        return float(100.0 * fpr[j])
    value = fpr[j] + (tpr_level - tpr[j]) * (fpr[j + 1] - fpr[j]) / (tpr[j + 1] - tpr[j])
    return float(100.0 * value)


def aupr_in(id_scores: Sequence[float], ood_scores: Sequence[float]) -> float:
    """Average precision with ID as the positive class, in percent."""
    xin, xood = _split(id_scores, ood_scores)
    if not len(xin) or not len(xood):
        return math.nan
    fpr, tpr = roc_curve(xin, xood)
    tp, fp = tpr * len(xin), fpr * len(xood)
    called = tp + fp
    precision = np.divide(tp, called, out=np.ones_like(tp), where=called > 0)
    return float(100.0 * np.sum(np.diff(tpr) * precision[1:]))


def ood_metrics(id_scores: Sequence[float], ood_scores: Sequence[float]) -> dict[str, Any]:
    """{"auroc", "fpr95", "aupr", "n_id", "n_ood"}: the three in percent; without ID or without OOD samples
    the three are None (JSON null, never a bare NaN, which is not JSON) and "undefined" says why."""
    if not len(id_scores) or not len(ood_scores):
        missing = "in-distribution" if not len(id_scores) else "OOD"
        return {"auroc": None, "fpr95": None, "aupr": None, "n_id": len(id_scores), "n_ood": len(ood_scores),
                "undefined": f"no {missing} samples scored: AUROC, FPR95 and AUPR need both"}
    return {"auroc": auroc(id_scores, ood_scores), "fpr95": fpr_at_tpr(id_scores, ood_scores),
            "aupr": aupr_in(id_scores, ood_scores), "n_id": len(id_scores), "n_ood": len(ood_scores)}


def score_open_set(recs: Sequence[Mapping[str, Any]], field: str = "ood_score") -> dict[str, Any] | None:
    """`ood_metrics` over one method's prediction records of an open-set run (each with `ood` and `field`: MCM's
    `ood_score`, or the method's `own_ood_score`), or None when they are not open-set records."""
    scored = [r for r in recs if isinstance(r.get("ood"), bool) and isinstance(r.get(field), (int, float))]
    if not scored:
        return None
    return ood_metrics([float(r[field]) for r in scored if not r["ood"]],
                       [float(r[field]) for r in scored if r["ood"]])


def score_own(recs: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any] | None:
    """The "own score" column of one method's open-set records: its `own_ood_score` (named `name`, the spec's
    declaration) when every open-set prediction carries one, else MCM's (`"score": "MCM"`): a method whose paper
    defines no score of its own is scored as the field scores it. None when they are not open-set records."""
    open_set = [r for r in recs if isinstance(r.get("ood"), bool)]
    if not open_set:
        return None
    if all(isinstance(r.get("own_ood_score"), (int, float)) for r in open_set):
        return {"score": name or "own", **score_open_set(open_set, "own_ood_score")}
    return {"score": "MCM", **score_open_set(open_set)}
