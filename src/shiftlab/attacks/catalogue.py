"""The attack catalogue: every attack's fields (type, default, range) and how it labels a run, as data
(shiftlab/data/attacks.json), so that the CLI's `--attack`/`--set attack.FIELD=V` checks and the labels
in summaries and reports import no torch.

The file is generated from the attack registry with the method catalogue (`python -m shiftlab.catalogue
--write`); tests/test_catalogue.py fails while it is out of date. Where attack code is already imported
(library use, tests, a script that registers its own attack and then calls `shiftlab.cli.main`), every
answer comes from the registry itself, so an attack registered at run time is listed, checked and
labelled too. An attack neither knows (a run made with an attack registered by a script) is labelled
with its name and its config fields.

One entry per attack: name, summary, defaults, accepts (in words), fields ({field:
params.FieldSpec.to_json()}), label and details (the class's format strings, `shiftlab.attacks.base`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import params
from .base import NO_ATTACK, fill_template

PATH = Path(__file__).resolve().parents[1] / "data" / "attacks.json"
# what an attacked record or a summary's attack entry holds beyond the config (not part of a label)
MEASURED = ("flipped", "linf_255", "success_rate", "n")


def _registry_loaded() -> bool:
    """Whether attack code is imported (then the registry, not the file, answers)."""
    base = sys.modules.get("shiftlab.attacks.base")
    return base is not None and len(base.ATTACKS) > 0


@functools.cache
def _committed() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in json.loads(PATH.read_text(encoding="utf-8"))["attacks"]}


def names() -> list[str]:
    """The registered attack names, sorted (without "none")."""
    if _registry_loaded():
        from . import list_attacks
        return list_attacks()
    return sorted(_committed())


def field_specs(name: str) -> dict[str, params.FieldSpec]:
    """A registered attack's config fields -> what each accepts (`params.FieldSpec`)."""
    if _registry_loaded():
        from . import get_attack_class
        return params.field_specs(get_attack_class(name).config_class)
    return {k: params.FieldSpec.from_json(v) for k, v in _committed()[name]["fields"].items()}


def defaults(name: str) -> dict[str, Any]:
    """A registered attack's config defaults (before `Attack.resolve`)."""
    if _registry_loaded():
        from . import get_attack_class
        return dataclasses.asdict(get_attack_class(name).config_class())
    return dict(_committed()[name]["defaults"])


def _formats(name: str) -> tuple[str, str] | None:
    """(label_format, details_format) of a known attack, else None."""
    if name not in names():
        return None
    if _registry_loaded():
        from . import get_attack_class
        cls = get_attack_class(name)
        return cls.label_format, cls.details_format
    entry = _committed()[name]
    return entry["label"], entry["details"]


def label(attack: Mapping[str, Any] | None) -> str:
    """'pgd eps=4/255' for an attack config, a summary's attack entry or a record's `attack` field; ''
    for none. An attack this process does not know: its name and every config field ('noise magnitude=0.1')."""
    attack = attack or {}
    name = attack.get("name")
    if not name or name == NO_ATTACK:
        return ""
    formats = _formats(str(name))
    if formats is None:
        rest = " ".join(f"{k}={v}" for k, v in attack.items() if k != "name" and k not in MEASURED)
        return f"{name} {rest}".rstrip()
    return f"{name} {fill_template(formats[0], attack)}".rstrip()


def details(attack: Mapping[str, Any] | None) -> str:
    """What summary.md adds after the label ('steps=7'); '' when none or unknown."""
    formats = _formats(str((attack or {}).get("name")))
    return fill_template(formats[1], attack or {}) if formats else ""


# -- building it from the registry (imports the attacks, hence torch) ------------------------------------

def entry(name: str) -> dict[str, Any]:
    """One attack's entry, built from its registered class."""
    from . import get_attack_class
    cls = get_attack_class(name)
    specs = params.field_specs(cls.config_class)
    return {
        "name": name, "summary": cls.summary,
        "defaults": dataclasses.asdict(cls.config_class()),
        "accepts": {k: params.describe(s.hint, s.range) for k, s in specs.items()},
        "fields": {k: _field_json(name, k, s) for k, s in specs.items()},
        "label": cls.label_format, "details": cls.details_format,
    }


def _field_json(name: str, field: str, spec: params.FieldSpec) -> dict[str, Any]:
    data = spec.to_json()
    if params.FieldSpec.from_json(data) != spec:
        raise ValueError(f"{name}.{field}: the catalogue cannot write the annotation {spec.hint!r} (use bool, int, "
                         "float, str, X | None, tuple[...] or Literal[...])")
    return data


def render_file() -> str:
    """The catalogue file's text, from the registry."""
    from . import list_attacks
    entries = json.loads(json.dumps([entry(n) for n in list_attacks()]))
    return json.dumps({"generated_by": "python -m shiftlab.catalogue --write (from the attack registry; do not "
                                       "edit by hand)", "attacks": entries}, indent=2, allow_nan=False) + "\n"
