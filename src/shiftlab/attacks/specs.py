"""What an attack is without its torch code: its spec, found by scanning the attack folders.

Every attack lives in a folder `shiftlab/attacks/<name>/` (CONTRIBUTING.md): `spec.py` holds its config
dataclass (fields declared with `shiftlab.params.param` beside their cited defaults) and an `AttackSpec`
subclass (name, `impl` = "shiftlab.attacks.<name>.attack:Class", summary, label and details formats),
importing no torch; `attack.py` holds the `Attack` subclass naming it (`spec = PGDSpec`). The CLI's
`--attack`/`--set attack.FIELD=V` checks and the labels in summaries and reports read the specs
(`shiftlab.attacks.catalogue`); the attack's class is imported when a run builds it.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..registry import scan_folders
from .base import ATTACKS, SPECS, Attack, AttackConfig, declaration_problem, impl_of

__all__ = ["SPECS", "AttackSpec", "register_attack", "register_spec", "spec", "spec_names", "specs"]


class AttackSpec:
    """An attack's declaration: subclass it in `attacks/<name>/spec.py`. The formats are over config fields:
    `label_format = "eps={eps:/255}"` ('pgd eps=4/255'), `details_format = "steps={steps}"` (summary.md's
    note after the label); the fields they name are what every attacked record carries."""
    name: ClassVar[str] = ""
    impl: ClassVar[str] = ""                 # "package.module:Class", imported when a run builds the attack
    config_class: ClassVar[type] = AttackConfig
    summary: ClassVar[str] = ""
    label_format: ClassVar[str] = ""
    details_format: ClassVar[str] = ""
    # whether it attacks through a method's adaptation (`--attack-target adaptive`): its class then writes
    # `attack_through(target, ...)` against an `attacks.adaptive.AttackTarget`
    adaptive: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        problem = declaration_problem(cls.name, cls) if cls.name else None
        if problem:
            raise ValueError(f"attack {cls.name!r}: {problem}")


_PACKAGE = __name__.rpartition(".")[0]     # shiftlab.attacks


@functools.cache
def _scanned() -> bool:
    """Import every folder's spec.py once and register its spec."""
    for module in scan_folders(_PACKAGE, "spec"):
        found = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, AttackSpec)
                 and v.__module__ == module.__name__ and v.name]
        if not found:
            raise ValueError(f"{module.__name__} defines no AttackSpec subclass with a name")
        for cls in found:
            register_spec(cls)
    return True


def register_spec(cls: type[AttackSpec], replace: bool = False) -> type[AttackSpec]:
    """Register an attack's spec (discovery does this for every folder; `register_attack` for a script's class)."""
    if not cls.impl or ":" not in cls.impl:
        raise ValueError(f"{cls.__qualname__}.impl must be 'package.module:Class', got {cls.impl!r}")
    return SPECS.register(cls.name, cls, replace=replace)


def spec_from_class(name: str, cls: type) -> type[AttackSpec]:
    """A spec for an attack class registered without a folder, from the attributes it declares."""
    body = {k: getattr(cls, k) for k in ("config_class", "summary", "label_format", "details_format")}
    return type(f"{cls.__name__}Spec", (AttackSpec,),
                {**body, "name": name, "impl": f"{cls.__module__}:{cls.__qualname__}", "__module__": cls.__module__})


def spec_names() -> list[str]:
    """The registered attack names, sorted (without "none")."""
    _scanned()
    return SPECS.names()


def spec(name: str) -> type[AttackSpec]:
    """The spec registered as `name`; an unknown name is a one-line UnknownNameError."""
    _scanned()
    return SPECS.get(name)


def specs() -> Mapping[str, type[AttackSpec]]:
    _scanned()
    return dict(SPECS.items())


def defaults(name: str) -> dict[str, Any]:
    """A registered attack's config defaults (before `Attack.resolve`)."""
    return dataclasses.asdict(spec(name).config_class())


def register_attack(name: str) -> Callable[[type[Attack]], type[Attack]]:
    """Class decorator: make an `Attack` subclass available as `--attack NAME` (and `--set attack.FIELD=V`).

    Refused: a taken name, "none", a config that is not an `AttackConfig` dataclass, a `name` field, a
    label or details string naming a field the config lacks."""
    def register(cls: type[Attack]) -> type[Attack]:
        if name in ATTACKS and ATTACKS.get(name) is not cls:
            raise ValueError(f"attack {name!r} is already registered (as {ATTACKS.get(name).__name__})")
        if name in spec_names() and name not in ATTACKS and spec(name).impl != impl_of(cls):
            raise ValueError(f"attack {name!r} is already registered (as {spec(name).impl})")
        if not (isinstance(cls, type) and issubclass(cls, Attack)):
            raise ValueError(f"attack {name!r}: must be a subclass of shiftlab.attacks.Attack")
        problem = declaration_problem(name, cls)
        if problem:
            raise ValueError(f"attack {name!r}: {problem}")
        register_spec(cls.__dict__.get("spec") or spec_from_class(name, cls), replace=True)
        return ATTACKS.register(name, cls, replace=True)
    return register
