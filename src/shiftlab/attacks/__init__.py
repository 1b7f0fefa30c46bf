"""Threat models for robust accuracy: the attack registry (`--attack NAME`, `--set attack.FIELD=V`).

An attack is a folder (`pgd/`): `spec.py`, its config dataclass and `AttackSpec` (no torch), and
`attack.py`, the `Attack` subclass naming that spec; the folders are found by scanning
(`shiftlab.attacks.specs`). A script registers an attack class of its own with `@register_attack`.
Importing this package loads no torch (the CLI's checks and the labels in summaries read
`shiftlab.attacks.catalogue`); an attack's class loads when it is built (`get_attack_class`,
`build_attack`) or named (`PGDAttack`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..lazy import lazy_names
from . import specs
from .base import ATTACKS, NO_ATTACK, Attack, AttackConfig
from .specs import register_attack

if TYPE_CHECKING:
    import torch

    from ..models import ClipModel
    from .pgd.attack import PGDAttack, pgd_linf
    from .pgd.spec import PGDConfig
    from .pixels import QUANTIZE_MODES, ImageAttack, ZeroShotClassifier, attack_seed, eps_255, quantize

# public name -> the module that defines it (loaded on first use: these import torch)
_EXPORTS = {"PGDAttack": "pgd.attack", "PGDConfig": "pgd.spec", "pgd_linf": "pgd.attack", "QUANTIZE_MODES": "base",
            "ImageAttack": "pixels", "ZeroShotClassifier": "pixels", "attack_seed": "pixels", "eps_255": "pixels",
            "quantize": "pixels"}
__all__ = ["NO_ATTACK", "QUANTIZE_MODES", "Attack", "AttackConfig", "ImageAttack", "PGDAttack", "PGDConfig",
           "ZeroShotClassifier", "attack_config", "attack_seed", "build_attack", "eps_255", "get_attack_class",
           "list_attacks", "load", "pgd_linf", "quantize", "register_attack", "split_budgets"]


def load() -> None:
    """Import every attack's class (imports torch)."""
    for name in list_attacks():
        get_attack_class(name)


def list_attacks() -> list[str]:
    """Registered attack names (`none` is always accepted too and means: no attack)."""
    return specs.spec_names()


def get_attack_class(name: str) -> type[Attack]:
    """The class registered as `name`, imported from its spec's `impl` on first use; an unknown name is a
    one-line UnknownNameError (a ValueError)."""
    return ATTACKS.implementation(specs.spec(name))


def split_budgets(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An attack spec whose `eps` is a list (one pass over several budgets) -> one spec per budget, each
    list-valued field taken at that budget's index (a recorded config holds lists for the fields that
    differ: eps, and what follows from it); a spec with one eps -> [itself]."""
    eps = spec.get("eps")
    if not isinstance(eps, list):
        return [dict(spec)]
    if not eps or len(set(eps)) != len(eps):
        raise ValueError(f"attack eps list must hold distinct budgets, got {eps}")
    for k, v in spec.items():
        if isinstance(v, list) and len(v) != len(eps):
            raise ValueError(f"attack field {k} has {len(v)} values for {len(eps)} budgets")
    return [{k: (v[i] if isinstance(v, list) else v) for k, v in spec.items()} for i in range(len(eps))]


def attack_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`{"name": "pgd", "eps": ...}` (any subset of the attack's fields) -> the effective config a run
    records, `{"name", every field}` (`{"name": "none"}` for no attack). Each value is checked against its
    field's declared range: a one-line ValueError, a TypeError for an unknown field. With a list of budgets
    (`"eps": [1/255, 4/255]`) each budget's config is checked, and the fields that differ between them are
    recorded as lists (`split_budgets` reads them back)."""
    if isinstance(spec.get("eps"), list):
        configs = [attack_config(one) for one in split_budgets(spec)]
        return {k: ([c[k] for c in configs] if any(c[k] != configs[0][k] for c in configs) else v)
                for k, v in configs[0].items()}
    fields = dict(spec)
    name = fields.pop("name", NO_ATTACK)
    if name in (None, NO_ATTACK):
        if fields:
            raise ValueError(f"attack fields {sorted(fields)} given without an attack (name {NO_ATTACK!r})")
        return {"name": NO_ATTACK}
    cls = get_attack_class(name)
    return {"name": cls.name, **dataclasses.asdict(cls.make_config(**fields))}


def build_attack(spec: Mapping[str, Any], model: ClipModel, zeroshot_head: torch.Tensor,
                 target: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Attack | None:
    """`{"name": "pgd", "eps": ..., ...}` + the model and its zero-shot class head (C, D) -> an Attack
    (None for name "none"). The config is checked as `attack_config` checks it. `target`: the model
    attacked, a differentiable callable (images in [0, 1] -> logits); None: zero-shot CLIP with the
    initial prompt (the transfer protocol)."""
    fields = dict(spec)
    name = fields.pop("name", NO_ATTACK)
    if name in (None, NO_ATTACK):
        return None
    cls = get_attack_class(name)
    if target is None:
        return cls(cls.make_config(**fields), model, zeroshot_head)
    return cls(cls.make_config(**fields), model, zeroshot_head, target=target)


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
