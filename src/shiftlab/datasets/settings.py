"""Per-dataset method settings and prompt templates from the authors' code, kept as data.

``data/method_settings.json`` holds, for each method whose code sets something per dataset, the
values its repository uses (C-TPT's lambda, TDA's configs/*.yaml, DMN's searched weight, TPT's
AugMix on the fine-grained sets) and the prompt templates each method's code builds its classifier
from. Every entry names its source file in the authors' repository::

    method_settings("flowers", "ctpt")  -> {"lambda_atfd": 50.0}      (config fields of the method)
    view_settings("R", "ctpt")          -> {"augmix": True}           (run-wide view settings)
    templates("flowers102", "tda")      -> ["a photo of a {}, a type of flower."]
    templates("dtd")                    -> CoOp's per-dataset template, ["{} texture."]
    setting_source("R", "tda")          -> "github.com/kdiAAA/TDA configs/imagenet_r.yaml"
    cupl_file_name("pets")              -> "CuPL_prompts_oxfordpets.json"  (DMN's CuPL file for the set)

A method or dataset without an entry gets ``{}`` (its config's defaults); dataset names may be any
alias (``R``, ``imagenet_r``, ``flower102`` ...).
"""
from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from typing import Any

from .classes import load_templates
from .specs import DATASETS

__all__ = ["method_settings", "view_settings", "templates", "setting_source", "cupl_file_name", "TEMPLATE_SOURCES"]

_FILE = "method_settings.json"
# Methods that build their classifier the way another method's code does.
_TEMPLATES_OF = {"ctpt": "tpt", "rtpt": "tpt"}
_TEMPLATES_OF["boostadapter"] = "tda"   # its datasets/*.py template lists are TDA's, list for list

_TEMPLATES_OF["dota"] = "tda"     # DOTA's datasets/*.py hold TDA's templates (checked file by file, bc67d44)
TEMPLATE_SOURCES = ("coop", "tpt", "tda", "dmn_zs", "dpe")


@functools.cache
def _table() -> dict[str, Any]:
    return json.loads(resources.files("shiftlab").joinpath("data", _FILE).read_text(encoding="utf-8"))


def _entry(section: str, dataset: str, key: str) -> dict[str, Any] | None:
    return _table()[section].get(key, {}).get(DATASETS.canonical(dataset))


def method_settings(dataset: str, method: str) -> dict[str, Any]:
    """The config fields ``method``'s code sets for ``dataset`` (``{}`` when it sets none)."""
    entry = _entry("methods", dataset, method)
    return copy.deepcopy(entry["config"]) if entry else {}


def view_settings(dataset: str, method: str) -> dict[str, Any]:
    """Run-wide view settings ``method``'s code uses on ``dataset`` (e.g. ``{"augmix": True}``)."""
    entry = _entry("methods", dataset, method)
    return dict(entry.get("views", {})) if entry else {}


def setting_source(dataset: str, method: str) -> str | None:
    """Where ``method_settings(dataset, method)`` comes from (a file in the authors' repository)."""
    entry = _entry("methods", dataset, method)
    return entry["source"] if entry else None


def templates(dataset: str, method: str | None = None) -> list[str]:
    """The prompt templates (each with one ``{}``) ``method``'s code uses on ``dataset``.

    ``method=None`` or a method without its own table: CoOp's per-dataset template (CoOp's
    zero-shot CLIP; TPT's, C-TPT's and ZERO's zero-shot baselines use "a photo of a {}." on every set,
    as shiftlab's ``zeroshot`` does). ``tpt``/``ctpt``/``rtpt``: TPT's "a photo of a {}.".
    A dataset without any entry (``imagefolder``) gets ``["a photo of a {}."]``.
    """
    source = _TEMPLATES_OF.get(method, method)
    if source not in TEMPLATE_SOURCES:
        source = "coop"
    entry = _entry("templates", dataset, source) or _entry("templates", dataset, "coop")
    if entry is None:
        return ["a photo of a {}."]
    return load_templates() if entry["templates"] == "clip80" else list(entry["templates"])


def cupl_file_name(dataset: str, method: str = "dmn_zs") -> str | None:
    """The name of the CuPL description file (class name -> sentences) ``method``'s code reads on
    ``dataset`` (DMN's ``ID_to_gptprompts_path``; ``CuPL_prompts_imagenet.json`` on the ImageNet
    family); None for a dataset it names none for (``imagefolder``)."""
    entry = _entry("cupl_files", dataset, method)
    return entry["file"] if entry else None
