"""Threat models: the attack registry, `build_attack`, per-sample attack seeds and 8-bit quantisation."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..registry import Registry

if TYPE_CHECKING:
    from ..engine.step import Evaluator
    from ..views.generator import ViewGenerator


QUANTIZE_MODES = ("round", "truncate")
_ATTACKS: Registry[type[Attack]] = Registry("attack", also_known=("none",))
_ATTACK_SALT = 0x5EED_A77C  # keeps the random-start stream apart from the view generator's stream


def register_attack(name: str) -> Callable[[type[Attack]], type[Attack]]:
    """Class decorator: make an `Attack` subclass available as `--attack NAME`."""
    return _ATTACKS.register(name)


def list_attacks() -> list[str]:
    """Registered attack names (`none` is always accepted too and means: no attack)."""
    return _ATTACKS.names()


def build_attack(attack_cfg: dict[str, Any], evaluator: Evaluator) -> Attack | None:
    """`{"name": "pgd", "eps": ..., ...}` + the run's Evaluator -> an Attack (None for name "none")."""
    cfg = dict(attack_cfg)
    name = cfg.pop("name", "none")
    if name in (None, "none"):
        return None
    cls = _ATTACKS.get(name)  # UnknownNameError (a ValueError) naming the known attacks
    try:
        return cls(evaluator, **cfg)
    except TypeError as exc:
        raise TypeError(f"attack {name!r}: {exc}") from None


def attack_seed(run_seed: int, sample_id: int) -> int:
    """A 63-bit seed for a sample's attack randomness; depends only on (run seed, sample id)."""
    state = np.random.SeedSequence([int(run_seed), int(sample_id), _ATTACK_SALT]).generate_state(2, dtype=np.uint64)
    return int(state[0] >> 1)


def eps_255(eps: float) -> int:
    """The eps-ball radius in 8-bit units: the largest integer step that stays within eps."""
    return int(math.floor(eps * 255 + 1e-6))


def quantize(x_adv: torch.Tensor, clean_u8: torch.Tensor, eps: float, mode: str = "round",
             clip_to_ball: bool = True) -> torch.Tensor:
    """An adversarial image in [0, 1] -> uint8, within `eps_255(eps)` grey levels of `clean_u8`.

    `round`: nearest grey level (the honest default). `truncate`: floor(x * 255), what
    the authors' code does (a float -> uint8 cast). Either way the result is then clipped
    to clean_u8 +- eps_255(eps) (and to 0..255): rounding alone can leave the ball by one
    level when eps * 255 is not an integer (eps = 0.01 -> 2.55 levels; a pixel moved by
    2.55 rounds to 3), and float error can do the same at an integer radius.
    `clip_to_ball=False` skips that clip, as the authors' code does (their truncation of a
    pixel at clean - eps can land one grey level further when float32 rounds it below).
    """
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {QUANTIZE_MODES}, got {mode!r}")
    scaled = x_adv.detach().to("cpu", torch.float64) * 255 if mode == "round" else x_adv.detach().cpu() * 255
    q = torch.round(scaled) if mode == "round" else torch.floor(scaled)
    clean = clean_u8.to("cpu", torch.int16).reshape(q.shape)
    k = eps_255(eps)
    q = q.to(torch.int16)
    if clip_to_ball:
        q = torch.minimum(torch.maximum(q, clean - k), clean + k)
    return q.clamp_(0, 255).to(torch.uint8)


class Attack:
    """A threat model. `perturb` returns the adversarial views and one info dict per sample id."""

    name = "attack"

    def perturb(self, ids: Sequence[int], views_list: Sequence[torch.Tensor], labels: Sequence[int],
                view_generator: ViewGenerator) -> tuple[list[torch.Tensor], dict[int, dict[str, Any]]]:
        raise NotImplementedError
