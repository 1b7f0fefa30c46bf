"""When a run is comparable with published numbers, and the numbers it is compared with.

The numbers are declared by each method in its own module (`Method.published`, shiftlab.methods.catalogue.cards),
and read here through the method catalogue (shiftlab.methods.catalogue.listing: the registry, or its generated
copy, so the report imports no torch). This module keeps the rule: only CLIP RN50 with OpenAI's weights on ImageNet-R,
each number beside runs of the protocol it was published with. They mean nothing for another backbone,
other weights, another dataset or another protocol, which is why the only way to get them is
`published_rows(dataset, model, weights_sha256=..., protocol=...)` (or `published_for_run(summary)`),
which returns {} for anything not comparable.

A row per method, with columns:
- ``seed_leaderboard``: its top-1 published under `leaderboard` (the R-TPT paper's table, the project's
  seed leaderboard).
- ``paper``: its first top-1 published under `paper` (the method's own paper or README).
- ``paper_ece`` / ``paper_ece_top1``: ECE (20 equal-width bins, C-TPT's `ECE_Loss(20)`) and the top-1 the
  same source prints beside it (only TPT, C-TPT and CLIP zero-shot have them); compare them with a run's `ece20`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..methods.catalogue import listing as catalogue

_COLUMNS = ("seed_leaderboard", "paper", "paper_ece", "paper_ece_top1")
# The protocol each column was published with: the seed table ran every method on the same
# views (`leaderboard`); each paper ran its own recipe (`paper`).
_LEADERBOARD, _PAPER = catalogue.protocols()
PROTOCOL_COLUMNS: dict[str, tuple[str, ...]] = {
    _LEADERBOARD: ("seed_leaderboard",),
    _PAPER: ("paper", "paper_ece", "paper_ece_top1"),
}
DATASET, BACKBONE = "imagenet-r", "RN50"     # the only published rows a run is compared with
RN50_MODELS = ("RN50", "RN50-quickgelu")     # the open_clip models of that backbone


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def _row(facts: dict[str, Any]) -> dict[str, Any] | None:
    """A method's columns from its published entries for (ImageNet-R, RN50); None without any."""
    entries = [e for e in facts["published"] if (e["dataset"], e["backbone"]) == (DATASET, BACKBONE)]
    if not entries:
        return None

    def first(protocol: str, metric: str, source: str | None = None) -> Any:
        return next((e["value"] for e in entries if (e["protocol"], e["metric"]) == (protocol, metric)
                     and source in (None, e["source"])), None)

    ece_source = next((e["source"] for e in entries if (e["protocol"], e["metric"]) == (_PAPER, "ece20")), None)
    return {"label": facts["label"], "seed_leaderboard": first(_LEADERBOARD, "top1"),
            "paper": first(_PAPER, "top1"), "paper_ece": first(_PAPER, "ece20"),
            "paper_ece_top1": first(_PAPER, "top1", ece_source) if ece_source else None}


def published_table() -> dict[str, dict]:
    """{method: row} of every method that publishes a number for CLIP RN50 on ImageNet-R (copies)."""
    rows = {name: _row(facts) for name, facts in catalogue.published().items()}
    # a number of a method that reads other test images is said to be one: "TIPPLE (transductive)"
    return {name: {**row, "label": row["label"] + (f" ({catalogue.published_note(name)})"
                                                   if catalogue.published_note(name) else "")}
            for name, row in rows.items() if row is not None}



def canonical_method(name: str) -> str | None:
    """The registry name a method name means (case and punctuation aside: "C-TPT" is ctpt), or one of the
    spellings a method declares as its `aliases` ("clip", "zs"); None for none."""
    spellings = {_normalise(alias): method for method, facts in catalogue.published().items()
                 for alias in (method, *facts["aliases"])}
    return spellings.get(_normalise(name))


def _is_imagenet_r(dataset: str | None) -> bool:
    return _normalise(dataset or "") == _normalise(DATASET)


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
    rows = published_table()
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
    (or the config). A run that recorded no protocol ran before protocols existed (`UNRECORDED_PROTOCOL`)."""
    config = summary_or_config.get("config", summary_or_config)
    shared = {**summary_or_config.get("identity", {}).get("shared", {}),
              **config.get("identity", {}).get("shared", {})}
    sha = shared.get("checkpoint_sha256", config.get("checkpoint_sha256"))
    source = shared.get("weights_source", config.get("weights_source"))
    protocol = shared.get("protocol") or config.get("protocol") or catalogue.unrecorded_protocol()
    model = next((m for m in (config.get("model"), config.get("model_resolved")) if str(m) in RN50_MODELS),
                 config.get("model"))
    return published_rows(config.get("dataset"), model, config.get("pretrained"),
                          weights_sha256=sha, protocol=protocol if protocol in PROTOCOL_COLUMNS else None,
                          weights_source=source)

