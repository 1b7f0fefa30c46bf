"""The one scoring function of records: top-1, top-5, ECE (15 and 20 bins), NLL and n, shared by
summary.json and the report."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import metrics

if TYPE_CHECKING:
    pass


# -- scoring -------------------------------------------------------------------------------

def score(labels: Sequence[int], correct: Sequence[bool], top5: Sequence[Sequence[int]] | None,
          confidence: Sequence[float], true_prob: Sequence[float]) -> dict[str, Any]:
    """top1/top5/ece/ece20 (percent; 15 and 20 bins), nll (nats) and n of a set of predictions.

    A metric whose inputs are incomplete (top5 None, a NaN confidence or true-class probability,
    e.g. a record written by an older version) is NaN rather than computed on part of the set."""
    conf = np.asarray(confidence, dtype=np.float64)
    prob = np.asarray(true_prob, dtype=np.float64)
    n = len(correct)
    return {
        "top1": metrics.top1(correct),
        "top5": metrics.topk_from_lists(list(labels), top5, 5) if top5 is not None else math.nan,
        "ece": metrics.ece(conf, correct) if n and not np.isnan(conf).any() else math.nan,
        # 20 bins: C-TPT's ECE_Loss(20), the bin count of the published ECEs it is compared with
        "ece20": metrics.ece(conf, correct, n_bins=20) if n and not np.isnan(conf).any() else math.nan,
        "nll": metrics.nll(prob) if n and not np.isnan(prob).any() else math.nan,
        "n": n,
    }


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def score_records(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`score` over prediction records (dicts as read from records.jsonl)."""
    top5 = [r.get("top5") for r in recs]
    return score([r["label"] for r in recs],
                 [bool(r["correct"]) if "correct" in r else r["pred"] == r["label"] for r in recs],
                 None if any(not isinstance(t, list) for t in top5) else top5,
                 [_float(r.get("confidence")) for r in recs], [_float(r.get("true_prob")) for r in recs])
