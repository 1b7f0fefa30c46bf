"""Threat models for robust accuracy: the attack registry (`--attack NAME`, `--set attack.FIELD=V`).

An attack is one module (`pgd_linf.py`): a config dataclass and an `Attack` subclass registered with
`@register_attack`. Importing this package loads no torch (the CLI's checks and the labels in
summaries read `shiftlab.attacks.catalogue`); the attacks themselves load on first use, with
`list_attacks()`, `build_attack(...)` or one of their names.
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import ATTACKS, NO_ATTACK, Attack, AttackConfig, register_attack

if TYPE_CHECKING:
    import torch

    from ..models import ClipModel
    from .pgd_linf import PGDAttack, PGDConfig, pgd
    from .pixels import QUANTIZE_MODES, ImageAttack, ZeroShotClassifier, attack_seed, eps_255, quantize

# public name -> the module that defines it (loaded on first use: these import torch)
_EXPORTS = {"PGDAttack": "pgd_linf", "PGDConfig": "pgd_linf", "pgd": "pgd_linf", "QUANTIZE_MODES": "pixels",
            "ImageAttack": "pixels", "ZeroShotClassifier": "pixels", "attack_seed": "pixels", "eps_255": "pixels",
            "quantize": "pixels"}
__all__ = ["NO_ATTACK", "QUANTIZE_MODES", "Attack", "AttackConfig", "ImageAttack", "PGDAttack", "PGDConfig",
           "ZeroShotClassifier", "attack_config", "attack_seed", "build_attack", "eps_255", "get_attack_class",
           "list_attacks", "load", "pgd", "quantize", "register_attack"]


def load() -> None:
    """Register the attacks shiftlab ships (imports torch); a new attack module is imported here."""
    from . import pgd_linf  # noqa: F401


def list_attacks() -> list[str]:
    """Registered attack names (`none` is always accepted too and means: no attack)."""
    load()
    return ATTACKS.names()


def get_attack_class(name: str) -> type[Attack]:
    """The class registered as `name`; an unknown name is a one-line UnknownNameError (a ValueError)."""
    load()
    return ATTACKS.get(name)


def attack_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`{"name": "pgd", "eps": ...}` (any subset of the attack's fields) -> the effective config a run
    records, `{"name", every field}` (`{"name": "none"}` for no attack). Each value is checked against its
    field's declared range: a one-line ValueError, a TypeError for an unknown field."""
    fields = dict(spec)
    name = fields.pop("name", NO_ATTACK)
    if name in (None, NO_ATTACK):
        if fields:
            raise ValueError(f"attack fields {sorted(fields)} given without an attack (name {NO_ATTACK!r})")
        return {"name": NO_ATTACK}
    cls = get_attack_class(name)
    return {"name": cls.name, **dataclasses.asdict(cls.make_config(**fields))}


def build_attack(spec: Mapping[str, Any], model: ClipModel, zeroshot_head: torch.Tensor) -> Attack | None:
    """`{"name": "pgd", "eps": ..., ...}` + the model and its zero-shot class head (C, D) -> an Attack
    (None for name "none"). The config is checked as `attack_config` checks it."""
    fields = dict(spec)
    name = fields.pop("name", NO_ATTACK)
    if name in (None, NO_ATTACK):
        return None
    cls = get_attack_class(name)
    return cls(cls.make_config(**fields), model, zeroshot_head)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
