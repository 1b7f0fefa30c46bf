"""What an attack is, without torch: its config dataclass, how it describes itself, the registry.

An attack is one module: a config dataclass whose fields are declared with `shiftlab.params.param`
(default, range, a comment citing the source) and an `Attack` subclass registered with
`@register_attack("name")` that names it as `config_class`. The class also says how a run that used
it is written for people, as two format strings over its config fields:

    label_format = "eps={eps:/255}"     # 'pgd eps=4/255': the setting's label in summaries and reports
    details_format = "steps={steps}"    # summary.md adds these after the label: 'pgd eps=4/255 steps=7'

`{field:/255}` writes a value in 1/255 units (4/255, else 0.01). The fields those strings name are the
config fields every attacked record carries (`record_fields`), so a report can label a setting from
its records alone. Being data, they go into the attack catalogue (`shiftlab.attacks.catalogue`),
which the CLI's checks and the labels in summaries and reports read without importing torch.

This module imports no torch, numpy or PIL: the catalogue and the CLI import it.
"""
from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..params import check_config
from ..registry import Registry

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from ..models import ClipModel
    from ..views.generator import ViewGenerator

__all__ = ["ATTACKS", "NO_ATTACK", "QUANTIZE_MODES", "Attack", "AttackConfig", "declaration_problem", "fill_template",
           "format_255",
           "template_fields"]

NO_ATTACK = "none"   # the `--attack` value of a clean run; no registered attack may take it
QUANTIZE_MODES = ("round", "truncate")   # the 8-bit conversion of an adversarial image (pixels.quantize)
class _ClassRegistry(Registry["type[Attack]"]):
    """The imported attack classes; removing one removes its spec too (tests register temporary attacks)."""

    def pop(self, name: str, default: Any = None) -> Any:
        SPECS.pop(name)
        return super().pop(name, default)


ATTACKS: Registry[type[Attack]] = _ClassRegistry("attack", also_known=(NO_ATTACK,))
# every attack's spec (shiftlab.attacks.specs: the folders' and those `register_attack` makes)
SPECS: Registry[Any] = Registry("attack", also_known=(NO_ATTACK,))


@dataclasses.dataclass
class AttackConfig:
    """Base of every attack's config: a dataclass of `param` fields (no field named `name`)."""


def format_255(value: object) -> str:
    """A value in [0, 1] pixel units as papers quote budgets: 4/255 -> '4/255', 0.01 -> '0.01'; '' if not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return ""
    k = value * 255
    return f"{round(k)}/255" if abs(k - round(k)) < 1e-3 else f"{value:.4g}"


class _Formatter(string.Formatter):
    """str.format plus the `/255` spec; a missing or unformattable field makes the whole text ''."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "/255":
            text = format_255(value)
            if not text:
                raise ValueError(f"{value!r} is not a number")
            return text
        return super().format_field(value, format_spec)


def template_fields(template: str) -> list[str]:
    """The field names a format string reads, in order: 'eps={eps:/255} n={n}' -> ['eps', 'n']."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def fill_template(template: str, values: Mapping[str, Any]) -> str:
    """`template` formatted with `values`; '' when a field it names is missing, None or not formattable."""
    if any(values.get(f) is None for f in template_fields(template)):
        return ""
    try:
        return _Formatter().vformat(template, (), dict(values))
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
        return ""


class Attack:
    """A threat model: built from its config, the model and the model's zero-shot class head.

    `perturb(ids, views_list, labels, view_generator)` returns each sample's adversarial views and one
    info dict per sample id, which becomes the `attack` field of that sample's records:
    `{"name", <record_fields>, ...what the attack measured per sample}`. Most attacks subclass
    `shiftlab.attacks.pixels.ImageAttack`, which does that loop and asks for one image at a time.
    """

    spec: ClassVar[type | None] = None            # its AttackSpec (attacks/<name>/spec.py), whose attributes it takes
    name: ClassVar[str] = "attack"               # set by register_attack
    config_class: ClassVar[type] = AttackConfig
    summary: ClassVar[str] = ""                  # one line for people (the attack catalogue lists it)
    label_format: ClassVar[str] = ""             # over config fields, after the name: "eps={eps:/255}"
    details_format: ClassVar[str] = ""           # summary.md's note, after the label: "steps={steps}"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            if spec.impl != impl_of(cls):
                raise TypeError(f"{cls.__qualname__} names spec {spec.__qualname__}, whose impl is {spec.impl!r}")
            for attr in ("name", "config_class", "summary", "label_format", "details_format"):
                setattr(cls, attr, getattr(spec, attr))

    def __init__(self, config: AttackConfig, model: ClipModel, zeroshot_head: torch.Tensor):
        self.config = config
        self.model = model
        self.zeroshot_head = zeroshot_head

    # -- the config: one check of every value --------------------------------------------------

    @classmethod
    def make_config(cls, **fields: Any) -> AttackConfig:
        """The attack's config from its defaults overridden field by field, each value checked against its
        declared range (one-line ValueError naming field, value and range; an unknown field is a TypeError),
        then `resolve`d."""
        known = [f.name for f in dataclasses.fields(cls.config_class) if f.init]
        # a field the config derives from others (init=False, e.g. an AutoAttack budget's `norm`) is what a
        # recorded config holds, and is derived again here, so it is dropped rather than refused
        derived = {f.name for f in dataclasses.fields(cls.config_class) if not f.init}
        fields = {k: v for k, v in fields.items() if k not in derived}
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise TypeError(f"{cls.name}: unknown config field(s) {unknown}; known: {known}")
        return cls.resolve(check_config(cls.name, cls.config_class(**fields)))

    @classmethod
    def resolve(cls, config: AttackConfig) -> AttackConfig:
        """Fill the fields whose default depends on others (PGD: alpha None -> eps / 4): what a run records."""
        return config

    def describe(self) -> dict[str, Any]:
        """The effective config a run records (run.json, summary.json): {"name", every field}."""
        return {"name": self.name, **dataclasses.asdict(self.config)}

    # -- how it is written for people ------------------------------------------------------------

    @classmethod
    def record_fields(cls) -> list[str]:
        """The config fields each attacked record carries: those the label and details name."""
        return list(dict.fromkeys(template_fields(cls.label_format) + template_fields(cls.details_format)))

    @classmethod
    def label(cls, config: Mapping[str, Any]) -> str:
        """'pgd eps=4/255' for a config dict (a run's, a summary's or a record's `attack` entry)."""
        return f"{cls.name} {fill_template(cls.label_format, config)}".rstrip()

    @classmethod
    def details(cls, config: Mapping[str, Any]) -> str:
        """What summary.md adds after the label ('steps=7'); '' when the attack says nothing more."""
        return fill_template(cls.details_format, config)

    # -- the work ----------------------------------------------------------------------------------

    def perturb(self, ids: Sequence[int], views_list: Sequence[torch.Tensor], labels: Sequence[int],
                view_generator: ViewGenerator) -> tuple[list[torch.Tensor], dict[int, dict[str, Any]]]:
        raise NotImplementedError


def impl_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def declaration_problem(name: str, cls: type) -> str | None:
    """What is wrong with an attack's declaration (a spec's or an attack class's), or None."""
    if name == NO_ATTACK:
        return f"{NO_ATTACK!r} means no attack"
    config = cls.config_class
    if not (dataclasses.is_dataclass(config) and issubclass(config, AttackConfig)):
        return "config_class must be a dataclass subclassing AttackConfig"
    fields = {f.name for f in dataclasses.fields(config)}
    if "name" in fields:
        return "a config field may not be called 'name' (the attack's name is recorded under it)"
    missing = [f for f in template_fields(cls.label_format) + template_fields(cls.details_format) if f not in fields]
    if missing:
        return f"label_format/details_format name field(s) {missing} that {config.__name__} does not have"
    return None
