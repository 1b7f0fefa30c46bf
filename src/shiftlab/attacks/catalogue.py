"""The attack catalogue: every attack's fields (type, default, range) and how it labels a run, read from
the attacks' specs (`shiftlab.attacks.specs`: every `attacks/<name>/spec.py`, found by scanning), so that
the CLI's `--attack`/`--set attack.FIELD=V` checks and the labels in summaries and reports import no
torch. An attack registered by a script (`register_attack`) has a spec too, so it is listed, checked and
labelled as well. An attack none knows (a run made with an attack registered by a script) is labelled
with its name and its config fields.

One entry per attack: name, summary, defaults, accepts (in words), fields ({field:
params.FieldSpec.to_json()}), label and details (the spec's format strings).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import params
from . import specs
from .base import NO_ATTACK, fill_template

# what an attacked record or a summary's attack entry holds beyond the config (not part of a label)
MEASURED = ("flipped", "linf_255", "success_rate", "n", "noise_flipped", "noise_success_rate", "broken_by")


def names() -> list[str]:
    """The registered attack names, sorted (without "none")."""
    return specs.spec_names()


def field_specs(name: str) -> dict[str, params.FieldSpec]:
    """A registered attack's config fields -> what each accepts (`params.FieldSpec`)."""
    return params.field_specs(specs.spec(name).config_class)


def check_fields(name: str, fields: Mapping[str, Any]) -> None:
    """Build the attack's config (its spec's dataclass, no torch) from `fields`, each already in its range,
    so that what the config checks across fields (`__post_init__`) is refused before torch: a ValueError."""
    specs.spec(name).config_class(**fields)


def defaults(name: str) -> dict[str, Any]:
    """A registered attack's config defaults (before `Attack.resolve`)."""
    return specs.defaults(name)


def _formats(name: str) -> tuple[str, str] | None:
    """(label_format, details_format) of a known attack, else None."""
    if name not in names():
        return None
    spec = specs.spec(name)
    return spec.label_format, spec.details_format


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


def entry(name: str) -> dict[str, Any]:
    """One attack's entry, read from its spec."""
    spec = specs.spec(name)
    fields = params.field_specs(spec.config_class)
    return {
        "name": name, "summary": spec.summary, "defaults": defaults(name),
        "accepts": {k: params.describe(s.hint, s.range) for k, s in fields.items()},
        "fields": {k: s.to_json() for k, s in fields.items()},
        "label": spec.label_format, "details": spec.details_format,
    }
