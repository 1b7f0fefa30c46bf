"""What a method declares about itself, beside its code, and how the readers get it.

A method's spec declares, as class attributes of its `MethodSpec` subclass (methods/<name>/spec.py,
CONTRIBUTING.md), and its `Method` class gets them from the spec:

- `protocols = {"paper": {field: value, ...}}`: the config its authors' code runs on ImageNet-R, each value
  citing its source in a comment; `leaderboard` is the config's defaults and has no entry.
- `published = (dict(dataset=..., backbone=..., protocol=..., metric=..., value=..., source=...), ...)`:
  numbers read in a primary source (`check_published` says what each field may hold); `()` when none was.
- `fidelity`: in words, what was checked against the authors' code (the README's fidelity column).
- optional: `dataset_values = {canonical dataset: {field: value, "views": {...}}}` (what the authors' code
  sets per dataset, layered under `paper`; a large table lives in methods/<method>/settings.json, read by
  `settings_file`), `label` (the name the papers print; default: the registry name), `aliases` (other
  spellings of it in published tables: "clip", "zs"), `cupl_files` (dataset -> the CuPL file the method's
  code reads there), `family` (a key of `FAMILIES`: the group of methods it belongs to, which tests and tables
  select by it instead of a list of names).

They are read from the class's own body (`declared`: a spec's, or the method class's, which holds its spec's),
never inherited: BoostAdapter subclasses TDA and must not show TDA's published numbers or run TDA's recipe.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

# fact -> its value where a method declares none
DEFAULTS: dict[str, Any] = {"protocols": {}, "published": (), "fidelity": "", "dataset_values": {},
                            "label": "", "aliases": (), "cupl_files": {}, "family": ""}
REQUIRED = ("protocols", "published", "fidelity")   # declared by every method, even when empty
# the groups a method may declare itself part of (its `family` fact), in words
CLASSIC = "classic"
FAMILIES = {CLASSIC: "the classic batch test-time adaptation methods as the CLIP toolkits run them (CLIPTTA's "
                     "ttavlm, mariodoebler/test-time-adaptation): TENT, EATA, SAR, DeYO, LAME, CLIPArTT, WATT, "
                     "CLIPTTA (issue #32)"}
PUBLISHED_FIELDS = ("dataset", "backbone", "protocol", "metric", "value", "source")
METRICS = {"top1": "top-1 accuracy %", "ece20": "expected calibration error %, 20 equal-width bins"}
BACKBONES = ("RN50", "ViT-B/16")     # as the papers name them (results.published_suites.BACKBONES)

# tables that several methods' published numbers were read in
R_TPT_TABLE = ("R-TPT paper (Sheng et al., CVPR 2025), its CLIP RN50 ImageNet-R table (the project's seed "
               "leaderboard), as the project's protocol notes give it")
TPT_README = ("github.com/azshue/TPT README.md@63ecbac, 'Main Results / Out-of-Distribution Generalization' "
              "table (CLIP RN50)")
C_TPT_TABLE = ("C-TPT paper (Yoon et al., ICLR 2024), CLIP RN50 ImageNet-R top-1 and ECE (20 bins), as the "
               "project's protocol notes give them")


def declared(cls: type, fact: str) -> Any:
    """The value of `fact` in `cls`'s own body, or its default (`DEFAULTS`)."""
    return cls.__dict__.get(fact, DEFAULTS[fact])


def family(cls: type) -> str:
    """The family a method declares (a key of `FAMILIES`), or "" when none; an unknown one is a ValueError."""
    value = declared(cls, "family")
    if value and value not in FAMILIES:
        raise ValueError(f"{cls.name}: family {value!r} is none of {', '.join(FAMILIES)}")
    return value


def label(cls: type) -> str:
    """The name the papers print for a method (its registry name where it declares none)."""
    return declared(cls, "label") or cls.name


def check_published(entry: Mapping[str, Any], protocols: tuple[str, ...]) -> str | None:
    """What is wrong with one `published` entry, or None. Datasets are checked by the caller (it knows them)."""
    if set(entry) != set(PUBLISHED_FIELDS):
        return f"fields {sorted(entry)}, expected {list(PUBLISHED_FIELDS)}"
    if entry["backbone"] not in BACKBONES:
        return f"backbone {entry['backbone']!r} is none of {', '.join(BACKBONES)}"
    if entry["protocol"] not in protocols:
        return f"protocol {entry['protocol']!r} is none of {', '.join(protocols)}"
    if entry["metric"] not in METRICS:
        return f"metric {entry['metric']!r} is none of {', '.join(METRICS)}"
    if isinstance(entry["value"], bool) or not isinstance(entry["value"], (int, float)):
        return f"value {entry['value']!r} is not a number"
    if not isinstance(entry["source"], str) or len(entry["source"]) < 10:
        return f"source {entry['source']!r} does not say where the number was read"
    return None


@functools.cache
def _settings_data(method: str) -> dict[str, Any]:
    # the method folder's settings.json, read without importing the folder (its spec may be importing)
    path = resources.files("shiftlab").joinpath("methods", method, "settings.json")
    return json.loads(path.read_text(encoding="utf-8"))


def settings_file(method: str, templates_of: str | None = None) -> dict[str, dict[str, Any]]:
    """`dataset_values` from methods/<method>/settings.json: per dataset its `config` fields, its `views`
    and its prompt `templates` (those of `templates_of`'s file where the method's code uses another
    method's lists; "clip80", CLIP's 80, is every such config's default, so it sets nothing)."""
    data = _settings_data(method)
    out: dict[str, dict[str, Any]] = {}
    for dataset, entry in data["datasets"].items():
        out[dataset] = {**entry.get("config", {}), **({"views": dict(entry["views"])} if "views" in entry else {})}
    for dataset, entry in _settings_data(templates_of or method).get("templates", {}).items():
        values = out.setdefault(dataset, {})
        if entry["templates"] != "clip80":
            values["templates"] = tuple(entry["templates"])
    return out


def cupl_file_names(method: str) -> dict[str, str]:
    """Dataset -> the name of the CuPL file the method's code reads there (methods/<method>/settings.json)."""
    return {dataset: entry["file"] for dataset, entry in _settings_data(method).get("cupl_files", {}).items()}


def setting_source(method: str, dataset: str) -> str | None:
    """Where methods/<method>/settings.json's values for a canonical dataset come from."""
    entry = _settings_data(method)["datasets"].get(dataset)
    return entry["source"] if entry else None
