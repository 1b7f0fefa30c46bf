"""The papers' natural-shift and cross-dataset tables, as data (shiftlab/data/published_suites.json).

Each row cites the source its numbers were read from. A row is shown beside a suite run only
when the run is comparable, by the rule of shiftlab.results.published: the same backbone,
weights identified as OpenAI's (`shiftlab.results.published.is_openai_weights`: by the SHA-256 in OpenAI's
official download URL, or read content-verified from open_clip's official Hugging Face repository
for the backbone), and the `paper` protocol, since every number
here was produced by its authors' own recipe. Random weights, weights of unknown origin (no
checksum recorded) and other protocols get no published rows.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..methods.catalogue import listing as catalogue
from .published import RN50_MODELS, is_openai_weights

# backbone as the papers name it -> (open_clip model names, open_clip model holding the OpenAI file)
BACKBONES: dict[str, tuple[tuple[str, ...], str]] = {
    "RN50": (RN50_MODELS, "RN50-quickgelu"),
    "ViT-B/16": (("ViT-B-16", "ViT-B-16-quickgelu"), "ViT-B-16-quickgelu"),
}
PUBLISHED_PROTOCOL = "paper"


@functools.cache
def _data() -> dict:
    return json.loads(resources.files("shiftlab").joinpath("data", "published_suites.json").read_text("utf-8"))


@functools.cache
def openai_sha256(backbone: str) -> str | None:
    """SHA-256 of OpenAI's checkpoint for a backbone, read from its official URL in open_clip's table."""
    import open_clip
    url = (open_clip.get_pretrained_cfg(BACKBONES[backbone][1], "openai") or {}).get("url", "")
    found = re.search(r"/([0-9a-f]{64})/", url)
    return found.group(1) if found else None


def sources() -> dict[str, str]:
    """Source id -> full citation."""
    return dict(_data()["sources"])


def backbone_of(model: str | None) -> str | None:
    return next((b for b, (models, _) in BACKBONES.items() if str(model or "") in models), None)


def suite_rows(suite: str, model: str | None, *, weights_sha256: str | None, protocol: str | None,
               weights_source: str | None = None) -> list[dict]:
    """Published rows of a suite table comparable with a run, else [].

    Each row: suite, backbone, method (canonical name or None), label, source_id, source (full
    citation), values {dataset: top-1 %}, average, ood_average, note. Returns copies."""
    backbone = backbone_of(model)
    if backbone is None or protocol != PUBLISHED_PROTOCOL:
        return []
    if not is_openai_weights(BACKBONES[backbone][1], weights_sha256, weights_source):
        return []
    return table_rows(suite, backbone)


def table_rows(suite: str, backbone: str) -> list[dict]:
    """Every published row of a suite and backbone, whatever the run (for docs and tests)."""
    data = _data()
    return [{"average": None, "ood_average": None, "note": "", **row, "values": dict(row["values"]),
             "source_id": row["source"], "source": data["sources"][row["source"]]}
            for row in data["rows"] if row["suite"] == suite and row["backbone"] == backbone]


def run_identity(summary: Mapping[str, Any]) -> dict[str, Any]:
    """model, pretrained, weights_sha256, weights_source and protocol of a run from its summary.json, wherever the
    run recorded them (its config, or the run identity); no protocol recorded = the only protocol that
    existed before protocols were recorded (`UNRECORDED_PROTOCOL`)."""
    config = summary.get("config", summary) or {}
    shared = {**(summary.get("identity") or {}).get("shared", {}), **(config.get("identity") or {}).get("shared", {})}
    model = next((m for m in (config.get("model"), config.get("model_resolved")) if backbone_of(m)),
                 config.get("model"))
    return {"model": model, "pretrained": config.get("pretrained"),
            "weights_sha256": shared.get("checkpoint_sha256", config.get("checkpoint_sha256")),
            "weights_source": shared.get("weights_source", config.get("weights_source")),
            "protocol": shared.get("protocol") or config.get("protocol") or catalogue.unrecorded_protocol()}
