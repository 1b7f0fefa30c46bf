"""Published numbers to reproduce, as data (source: the table in PROTOCOL.md).

Every number here is CLIP RN50 (OpenAI weights) on ImageNet-R, in percent.
They mean nothing for another backbone or dataset, which is why the only way to
get them is `published_rows(dataset, model)`, which returns {} for anything else.

Columns:
- ``seed_leaderboard``: the R-TPT paper's table (the project's seed leaderboard).
- ``paper``: the method's own paper or README.
- ``paper_ece`` / ``paper_ece_top1``: ECE and the top-1 printed beside it in the
  C-TPT paper (only TPT, C-TPT and CLIP zero-shot have them).

The PROTOCOL table has one "Ensemble" row whose two columns are two different
methods: 51.3 is the 64-view ensemble, 60.72 the 80-template prompt ensemble.
They are split here so neither is compared with the wrong method.
"""
from __future__ import annotations

import re

_COLUMNS = ("seed_leaderboard", "paper", "paper_ece", "paper_ece_top1")

# canonical method name -> row; a None column means "not published".
PUBLISHED_RN50_IMAGENET_R: dict[str, dict] = {
    "tpt": {"label": "TPT", "seed_leaderboard": 58.9, "paper": 59.11,
            "paper_ece": 9.18, "paper_ece_top1": 58.9},
    "mta": {"label": "MTA", "seed_leaderboard": 58.4, "paper": None},
    "ctpt": {"label": "C-TPT", "seed_leaderboard": 57.7, "paper": 58.0,
             "paper_ece": 4.57, "paper_ece_top1": 58.0},
    "rtpt": {"label": "R-TPT", "seed_leaderboard": 57.6, "paper": None},
    "zeroshot": {"label": "CLIP zero-shot", "seed_leaderboard": 56.1, "paper": 56.15,
                 "paper_ece": 2.07, "paper_ece_top1": 56.0},
    "view_ensemble": {"label": "Ensemble (64 views)", "seed_leaderboard": 51.3, "paper": None},
    "prompt_ensemble": {"label": "Prompt ensemble (80 templates)", "seed_leaderboard": None,
                        "paper": 60.72},
    "tda": {"label": "TDA", "seed_leaderboard": None, "paper": 62.58},
    "dmn_zs": {"label": "DMN-ZS", "seed_leaderboard": None, "paper": 61.44},
}
for _row in PUBLISHED_RN50_IMAGENET_R.values():
    for _col in _COLUMNS:
        _row.setdefault(_col, None)

# Spellings a run may use for a method (after lower-casing and dropping
# everything but letters and digits) -> canonical name above.
_ALIASES = {
    "tpt": "tpt", "mta": "mta", "rtpt": "rtpt", "tda": "tda",
    "ctpt": "ctpt", "ctpt20": "ctpt",  # lambda=20 is C-TPT's ImageNet setting
    "zeroshot": "zeroshot", "clip": "zeroshot", "clipzeroshot": "zeroshot", "zs": "zeroshot",
    "ensemble": "view_ensemble", "viewensemble": "view_ensemble",
    "promptensemble": "prompt_ensemble", "ensemble80": "prompt_ensemble",
    "dmn": "dmn_zs", "dmnzs": "dmn_zs",
}

RN50_MODELS = ("RN50", "RN50-quickgelu")


def canonical_method(name: str) -> str | None:
    """Canonical key in the published table for a run's method name, or None."""
    return _ALIASES.get(re.sub(r"[^a-z0-9]", "", str(name).lower()))


def _is_imagenet_r(dataset: str | None) -> bool:
    return re.sub(r"[^a-z0-9]", "", str(dataset or "").lower()) == "imagenetr"


def _is_openai_weights(pretrained: str | None) -> bool:
    # A local file may well be the OpenAI checkpoint; only a known other tag
    # (e.g. "yfcc15m") rules the published numbers out.
    if pretrained is None:
        return True
    p = str(pretrained)
    return p.lower() == "openai" or "/" in p or "\\" in p or p.endswith((".pt", ".pth", ".bin", ".safetensors"))


def published_rows(dataset: str | None, model: str | None, pretrained: str | None = None) -> dict[str, dict]:
    """Published rows {canonical method: row} for this dataset and model, else {}.

    Only ImageNet-R with RN50 ("RN50" or "RN50-quickgelu") has published numbers.
    Pass `pretrained` to also exclude non-OpenAI weights. Returns copies.
    """
    if not _is_imagenet_r(dataset) or str(model or "") not in RN50_MODELS:
        return {}
    if not _is_openai_weights(pretrained):
        return {}
    return {k: dict(v) for k, v in PUBLISHED_RN50_IMAGENET_R.items()}


def published_for(method: str, dataset: str | None, model: str | None,
                  pretrained: str | None = None) -> dict | None:
    """The published row for one of our method names, or None."""
    key = canonical_method(method)
    return published_rows(dataset, model, pretrained).get(key) if key else None
