"""Published numbers to reproduce, as data (source: the table in PROTOCOL.md).

Every number here is CLIP RN50 (OpenAI weights) on ImageNet-R, in percent.
They mean nothing for another backbone, other weights, another dataset or another
protocol, which is why the only way to get them is `published_rows(dataset, model,
weights_sha256=..., protocol=...)` (or `published_for_run(summary)`), which returns {}
for anything not comparable.

Columns:
- ``seed_leaderboard``: the R-TPT paper's table (the project's seed leaderboard).
- ``paper``: the method's own paper or README.
- ``paper_ece`` / ``paper_ece_top1``: ECE (20 equal-width bins, C-TPT's `ECE_Loss(20)`)
  and the top-1 printed beside it in the C-TPT paper (only TPT, C-TPT and CLIP zero-shot
  have them); compare them with a run's `ece20`.

The PROTOCOL table has one "Ensemble" row whose two columns are two different
methods: 51.3 is the 64-view ensemble, 60.72 the 80-template prompt ensemble.
They are split here so neither is compared with the wrong method.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

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


# Weights the published numbers were obtained with, by SHA-256 of the checkpoint file. OpenAI's
# RN50.pt: the checksum is part of its official download URL (openaipublic.azureedge.net/clip/
# models/<sha256>/RN50.pt, also in open_clip's pretrained table). Another file holding the same
# weights is comparable too: add its SHA-256 here once verified, or load it from the official
# open_clip hub repository (see `is_openai_weights`).
OPENAI_RN50_SHA256 = "afeb0e10f9e5a86da6080e35cf09123aca3b358a0c3e3b6c78a7b63bc04b6762"
REFERENCE_WEIGHTS: dict[str, str] = {OPENAI_RN50_SHA256: "OpenAI CLIP RN50 (RN50.pt)"}


def is_openai_weights(model: str, weights_sha256: str | None, weights_source: str | None = None) -> bool:
    """Whether a checkpoint holds OpenAI's weights for open_clip model `model` (the one rule for
    every published table): its SHA-256 is the digest in OpenAI's official URL, or it was read,
    content-verified, from the Hugging Face repository that
    open_clip names for `model`'s `openai` tag (`weights_source` "hf-hub:ORG/REPO", which
    `shiftlab.models.checkpoints.weights_source` gives only to a cached blob whose SHA-256 is its name).
    A file of unknown digest from anywhere else is not."""
    import open_clip
    cfg = open_clip.get_pretrained_cfg(model, "openai") or {}
    sha = str(weights_sha256 or "").lower()
    if sha and f"/{sha}/" in cfg.get("url", ""):
        return True
    hub = (cfg.get("hf_hub") or "").strip("/")
    return bool(sha and hub and weights_source == f"hf-hub:{hub}")


# The protocol each column was published with: the seed table ran every method on the same
# views (`leaderboard`); each paper ran its own recipe (`paper`). C-TPT's ECEs (and the top-1
# printed beside them) come from C-TPT's paper, with 20 equal-width bins.
PROTOCOL_COLUMNS: dict[str, tuple[str, ...]] = {
    "leaderboard": ("seed_leaderboard",),
    "paper": ("paper", "paper_ece", "paper_ece_top1"),
}
PUBLISHED_ECE_BINS = 20


def published_rows(dataset: str | None, model: str | None, pretrained: str | None = None, *,
                   weights_sha256: str | None = None, protocol: str | None = None,
                   weights_source: str | None = None) -> dict[str, dict]:
    """Published rows {canonical method: row} a run can be compared with, else {}.

    Only ImageNet-R with an RN50 architecture ("RN50" or "RN50-quickgelu") whose checkpoint holds
    OpenAI's weights (`is_openai_weights`) has published numbers: random weights, other weights
    and weights of unknown origin get none. With `protocol`, only the columns published with
    that protocol keep their values (the others are None). `pretrained` is not evidence either
    way (a tag or a path says nothing about the bytes); it is accepted for old callers. Copies.
    """
    if not _is_imagenet_r(dataset) or str(model or "") not in RN50_MODELS:
        return {}
    if (str(weights_sha256 or "").lower() not in REFERENCE_WEIGHTS
            and not is_openai_weights(str(model), weights_sha256, weights_source)):
        return {}
    rows = {k: dict(v) for k, v in PUBLISHED_RN50_IMAGENET_R.items()}
    if protocol is not None:
        if protocol not in PROTOCOL_COLUMNS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOL_COLUMNS)}, got {protocol!r}")
        for row in rows.values():
            for other, columns in PROTOCOL_COLUMNS.items():
                if other != protocol:
                    row.update(dict.fromkeys(columns))
    return rows


def published_for(method: str, dataset: str | None, model: str | None, pretrained: str | None = None, *,
                  weights_sha256: str | None = None, protocol: str | None = None,
                  weights_source: str | None = None) -> dict | None:
    """The published row for one of our method names, or None."""
    key = canonical_method(method)
    rows = published_rows(dataset, model, pretrained, weights_sha256=weights_sha256, protocol=protocol,
                          weights_source=weights_source)
    return rows.get(key) if key else None


def published_for_run(summary_or_config: Mapping[str, Any]) -> dict[str, dict]:
    """The published rows comparable with a run, from its summary.json (or its `config`): dataset
    and model from the config, the checkpoint's SHA-256, its source and the protocol from the run's identity
    (or the config). A run that recorded no protocol ran before protocols existed: `leaderboard`."""
    config = summary_or_config.get("config", summary_or_config)
    shared = {**summary_or_config.get("identity", {}).get("shared", {}),
              **config.get("identity", {}).get("shared", {})}
    sha = shared.get("checkpoint_sha256", config.get("checkpoint_sha256"))
    source = shared.get("weights_source", config.get("weights_source"))
    protocol = shared.get("protocol") or config.get("protocol") or "leaderboard"
    model = next((m for m in (config.get("model"), config.get("model_resolved")) if str(m) in RN50_MODELS),
                 config.get("model"))
    return published_rows(config.get("dataset"), model, config.get("pretrained"),
                          weights_sha256=sha, protocol=protocol if protocol in PROTOCOL_COLUMNS else None,
                          weights_source=source)

