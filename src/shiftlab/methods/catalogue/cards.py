"""A method's card: the facts about it, kept as data beside its code (methods/<folder>/card.toml).

A folder's card.toml holds one table per registered name (`[tpt]`, `[ctpt]`; docs/METHOD_CARDS.md), read
with the standard library's tomllib when the folder's spec class is defined (`card_facts`), so listing the
methods, the protocols and the published numbers need no torch. The spec class then carries each fact as
a class attribute, and its `Method` class gets them from the spec:

- `protocols = {paper = {field = value, ...}}`: the config its authors' code runs on ImageNet-R, each value
  citing its source in a comment; `leaderboard` is the config's defaults and has no entry.
- `[[name.published]]` entries (dataset, backbone, protocol, metric, value, source): numbers read in a
  primary source (`check_published` says what each field may hold); none when none was.
- `fidelity`: in words, what was checked against the authors' code (the README's fidelity column).
- `bibtex`: its paper, as `shiftlab methods --bibtex` prints it; `summary`: its one line in the tables.
- optional: `dataset_values = {canonical dataset = {field = value, views = {...}}}` (what the authors' code
  sets per dataset, layered under `paper`; a large table is the card's `settings`, each dataset's entry
  citing its source: `settings_file`), `label` (the name the papers print; default: the registry name),
  `aliases` (other spellings of it in published tables: "clip", "zs"), `cupl_files` (dataset -> the CuPL
  file the method's code reads there), `family` (a key of `FAMILIES`: the group of methods it belongs to,
  which tests and tables select by it instead of a list of names), `cost` (its rows of docs/BENCHMARKS.md,
  tools/benchmark_rows.py).
- `adaptive = {modes, how, impl}`: how `--attack-target adaptive` attacks it (methods/adaptive_modes.py), the
  row of docs/ROBUSTNESS.md's table.
- `extends = "tpt"`: a variant is its base's table (same card) with its own keys replacing the base's.

TOML arrays are read back as tuples. A spec in a folder without a card declares its facts in its own body
(the older shape, tools/spec_facts_to_toml.py converts it). Either way they are read from the class's own
body (`declared`: a spec's, or the method class's, which holds its spec's), never inherited: BoostAdapter
subclasses TDA and must not show TDA's published numbers or run TDA's recipe.
"""
from __future__ import annotations

import functools
import json
import sys
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ..adaptive_modes import Adaptive

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


def declared(cls: type, fact: str) -> Any:
    """The value of `fact` in `cls`'s own body (a method class's: its spec's), or its default (`DEFAULTS`)."""
    return spec_of(cls).__dict__.get(fact, DEFAULTS[fact])


def spec_of(cls: type) -> type:
    """A spec class itself; a method class's spec (`Method.spec`), where its declarations live."""
    spec = getattr(cls, "spec", None)
    return spec if isinstance(spec, type) else cls


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


CARD = "card.toml"
# what a card's table may hold besides the facts (`DEFAULTS`): its paper, its line in the tables, its base, the
# folded per-dataset values, its rows of docs/BENCHMARKS.md
CARD_KEYS = ("bibtex", "summary", "adaptive", "extends", "settings", "cost")


@functools.cache
def _card_tables(path: Path) -> dict[str, Any]:
    """The tables of one card.toml (empty where the folder has none); a syntax error names the file."""
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _card_of_folder(folder: str) -> dict[str, Any]:
    return _card_tables(Path(str(resources.files("shiftlab").joinpath("methods", folder, CARD))))


def resolve(tables: Mapping[str, Any], name: str, where: str = CARD) -> dict[str, Any]:
    """Table `name` of a card with its `extends` chain resolved: the base's keys, each replaced whole by the
    variant's; an unknown base or a cycle is a one-line ValueError."""
    chain = [name]
    table = dict(tables[name])
    while "extends" in table:
        base = table.pop("extends")
        if base in chain:
            raise ValueError(f"{where}: [{name}] extends a cycle: {' -> '.join([*chain, base])}")
        if base not in tables:
            raise ValueError(f"{where}: [{chain[-1]}] extends {base!r}, which has no table in this card")
        chain.append(base)
        table = {**tables[base], **table}
    return table


def _tuples(value: Any) -> Any:
    """TOML's arrays as the tuples the facts are (published entries, aliases, templates)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def card_facts(module: str, name: str) -> dict[str, Any]:
    """The facts the card beside spec module `module` holds for method `name`, {} where its folder has no card;
    a card without a table for `name`, or with a key that is no fact, is a one-line ValueError."""
    file = getattr(sys.modules.get(module), "__file__", None)
    if not file:
        return {}
    path = Path(file).with_name(CARD)
    tables = _card_tables(path)
    if not tables:
        return {}
    if name not in tables:
        raise ValueError(f"{path}: no [{name}] table for the spec named {name!r}")
    table = resolve(tables, name, str(path))
    unknown = sorted(set(table) - set(DEFAULTS) - set(CARD_KEYS))
    if unknown:
        raise ValueError(f"{path}: [{name}] holds {', '.join(unknown)}, none of the facts "
                         f"({', '.join([*DEFAULTS, *CARD_KEYS])})")
    table.pop("cost", None)
    settings = table.pop("settings", None)
    out = {k: _tuples(v) for k, v in table.items()}
    for fact in ("protocols", "dataset_values"):   # config overrides: "None" is None, as `--set field=None`
        if fact in out:
            out[fact] = {k: {f: None if v == "None" else v for f, v in fields.items()}
                         for k, fields in out[fact].items()}
    if "adaptive" in out:   # how `--attack-target adaptive` attacks it: {modes, how, impl}
        try:
            out["adaptive"] = Adaptive(**out["adaptive"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: [{name}.adaptive] {exc}") from None
    if settings is not None:
        out.setdefault("dataset_values", settings_values(settings, settings.get("templates_of")))
        if "cupl_files" in settings:
            out.setdefault("cupl_files", {d: e["file"] for d, e in settings["cupl_files"].items()})
    return out


def _settings_data(method: str) -> dict[str, Any]:
    """The `settings` table of methods/<method>/card.toml's [method] (read without importing the folder); in a
    folder of the older shape, its settings.json."""
    table = _card_of_folder(method).get(method, {})
    if "settings" in table:
        return table["settings"]
    return _settings_json(method)


@functools.cache
def _settings_json(method: str) -> dict[str, Any]:
    path = resources.files("shiftlab").joinpath("methods", method, "settings.json")
    return json.loads(path.read_text(encoding="utf-8"))


def settings_values(data: Mapping[str, Any], templates_of: str | None = None) -> dict[str, dict[str, Any]]:
    """`dataset_values` from a card's `settings`: per dataset its `config` fields, its `views` and its prompt
    `templates` (those of `templates_of`'s card where the method's code uses another method's lists; "clip80",
    CLIP's 80, is every such config's default, so it sets nothing)."""
    out: dict[str, dict[str, Any]] = {}
    for dataset, entry in data["datasets"].items():
        out[dataset] = {**entry.get("config", {}), **({"views": dict(entry["views"])} if "views" in entry else {})}
    templates = (_settings_data(templates_of) if templates_of else data).get("templates", {})
    for dataset, entry in templates.items():
        values = out.setdefault(dataset, {})
        if entry["templates"] != "clip80":
            values["templates"] = tuple(entry["templates"])
    return out


def settings_file(method: str, templates_of: str | None = None) -> dict[str, dict[str, Any]]:
    """`dataset_values` from methods/<method>/card.toml's `settings` (`settings_values`)."""
    return settings_values(_settings_data(method), templates_of)


def cupl_file_names(method: str) -> dict[str, str]:
    """Dataset -> the name of the CuPL file the method's code reads there (methods/<method>/card.toml's settings)."""
    return {dataset: entry["file"] for dataset, entry in _settings_data(method).get("cupl_files", {}).items()}


def setting_source(method: str, dataset: str) -> str | None:
    """Where the values of methods/<method>/card.toml's settings for a canonical dataset come from."""
    entry = _settings_data(method)["datasets"].get(dataset)
    return entry["source"] if entry else None
