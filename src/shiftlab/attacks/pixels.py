"""Attacks on a sample's 8-bit base view: `ImageAttack`, per-sample seeds, 8-bit quantisation, and the
attacked model (zero-shot CLIP with the initial prompt).

An `ImageAttack` turns each sample's clean 8-bit base view (view 0, `model.image_size` square) into
an adversarial 8-bit image (`attack_image`, the one thing a subclass writes) and regenerates ALL
views from it with the same per-sample seed as the clean run; every method then scores those views.
Each sample's record info is `{"name", <record_fields>, "flipped", "linf_255"}`: `flipped` whether the
zero-shot prediction changed, `linf_255` the largest change of a pixel in grey levels. See
docs/ROBUSTNESS.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

from .base import QUANTIZE_MODES, Attack, AttackConfig

if TYPE_CHECKING:
    from ..models import ClipModel
    from ..views.generator import ViewGenerator
    from .adaptive import AttackTarget

_ATTACK_SALT = 0x5EED_A77C  # keeps the random-start stream apart from the view generator's stream


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


class ZeroShotClassifier(nn.Module):
    """Images in [0, 1] -> zero-shot CLIP logits with fixed class features (the initial prompt)."""

    def __init__(self, model: nn.Module, class_features: torch.Tensor, logit_scale: float):
        super().__init__()
        self.model = model
        self.logit_scale = float(logit_scale)
        self.register_buffer("class_features", class_features.detach().float().clone(), persistent=False)

    def forward(self, x01: torch.Tensor) -> torch.Tensor:
        feats = self.model.encode_pixels(x01).float()
        return self.logit_scale * feats @ self.class_features.to(feats.device).T


class ImageAttack(Attack):
    """An attack on each sample's base view, one sample at a time (so its image does not depend on the batch).

    Subclasses write `attack_image(clean_u8, label, sample_id, run_seed) -> uint8 image`; seed any
    randomness with `attack_seed(run_seed, sample_id)`. The run seed is the config's `seed` field when
    the config has one that is not None, else the view generator's (the run's `--seed`).

    `classifier` is the model attacked: any differentiable callable, images (B, 3, S, S) in [0, 1] ->
    logits (B, C). By default zero-shot CLIP with the initial prompt (the transfer protocol); an attack
    through a method's adaptation passes its own (`target=`). `flipped` is always measured on zero-shot.
    """

    def __init__(self, config: AttackConfig, model: ClipModel, zeroshot_head: torch.Tensor,
                 target: Callable[[torch.Tensor], torch.Tensor] | None = None):
        super().__init__(config, model, zeroshot_head)
        self.zeroshot = ZeroShotClassifier(model, zeroshot_head, model.logit_scale)
        self.classifier: Callable[[torch.Tensor], torch.Tensor] = target if target is not None else self.zeroshot
        # what `attack_image` measured on a sample beyond the image (AutoAttack: which attack broke it),
        # by sample id; `perturb` adds it to the sample's record info
        self.notes: dict[int, dict[str, Any]] = {}

    def attack_image(self, clean_u8: torch.Tensor, label: int, sample_id: int, run_seed: int) -> torch.Tensor:
        """One clean uint8 image (3, S, S) -> its adversarial uint8 image (3, S, S)."""
        raise NotImplementedError

    @torch.no_grad()
    def _zeroshot_preds(self, images_u8: torch.Tensor) -> list[int]:
        x = images_u8.to(self.model.device).float().div(255)
        return self.zeroshot(x).argmax(dim=-1).tolist()

    def attack_through(self, target: AttackTarget, clean_u8: torch.Tensor, labels: Sequence[int],
                       sample_ids: Sequence[int], run_seed: int) -> torch.Tensor:
        """The attack on a method's own prediction (`--attack-target adaptive`): clean uint8 images (B, 3, S, S),
        attacked together through `target` -> uint8 (B, 3, S, S). Here: `attack_image` with `target` as the attacked
        classifier, for one image (each call of the target draws its random views afresh: one EOT draw per call); an
        attack that attacks a batch together or averages `target.eot_iter` draws (PGD) overrides it."""
        if clean_u8.shape[0] != 1:
            raise ValueError(f"{self.name} attacks one image at a time through a method, got a batch of "
                             f"{clean_u8.shape[0]} (a batch method's batch is attacked together by pgd)")
        saved, self.classifier = self.classifier, target
        try:
            return self.attack_image(clean_u8[0], int(labels[0]), int(sample_ids[0]), run_seed).unsqueeze(0)
        finally:
            self.classifier = saved

    def _run_seed(self, view_generator: ViewGenerator) -> int:
        seed = getattr(self.config, "seed", None)
        return seed if seed is not None else getattr(view_generator, "seed", 0)

    def _rebuilt(self, sid: int, clean_views: torch.Tensor, adv: torch.Tensor, view_generator: ViewGenerator,
                 described: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        """The views regenerated from the adversarial image (the clean run's view seed) and the sample's info."""
        clean = clean_views[0]
        pred_clean, pred_adv = self._zeroshot_preds(torch.stack([clean, adv]))
        adv_pil = Image.fromarray(adv.permute(1, 2, 0).numpy(), "RGB")
        new_views = view_generator(adv_pil, sid)
        if new_views.shape != clean_views.shape:
            raise RuntimeError(f"sample {sid}: adversarial views {tuple(new_views.shape)} "
                               f"!= clean views {tuple(clean_views.shape)}")
        return new_views, {**described, "flipped": bool(pred_clean != pred_adv),
                           "linf_255": int((adv.to(torch.int16) - clean.to(torch.int16)).abs().max()),
                           **self.notes.pop(int(sid), {})}

    def perturb(self, ids: Sequence[int], views_list: Sequence[torch.Tensor], labels: Sequence[int],
                view_generator: ViewGenerator) -> tuple[list[torch.Tensor], dict[int, dict[str, Any]]]:
        run_seed = self._run_seed(view_generator)
        described = {"name": self.name, **{f: getattr(self.config, f) for f in self.record_fields()}}
        adv_views: list[torch.Tensor] = []
        info: dict[int, dict[str, Any]] = {}
        for sid, views, label in zip(ids, views_list, labels):
            adv = self.attack_image(views[0], label, sid, run_seed)
            new_views, info[int(sid)] = self._rebuilt(sid, views, adv, view_generator, described)
            adv_views.append(new_views)
        return adv_views, info

    def perturb_adaptive(self, method: Any, ids: Sequence[int], views_list: Sequence[torch.Tensor],
                         labels: Sequence[int], view_generator: ViewGenerator, eot: int = 1,
                         together: bool = False) -> tuple[list[torch.Tensor], dict[int, dict[str, Any]]]:
        """`perturb` through `method`'s own prediction as it stands (`attacks.adaptive.method_target`): each sample
        alone, or all of them at once with `together` (a batch method's batch). Each sample's info adds
        `target` "adaptive", the method's `mode` and `eot` (the draws per gradient; 1 without random views)."""
        from .adaptive import method_target
        run_seed = self._run_seed(view_generator)
        units = [list(range(len(ids)))] if together else [[i] for i in range(len(ids))]
        adv_views: list[torch.Tensor] = [torch.empty(0)] * len(ids)
        info: dict[int, dict[str, Any]] = {}
        for unit in units:
            unit_ids = [int(ids[i]) for i in unit]
            target = method_target(method, unit_ids, run_seed, eot)
            described = {"name": self.name, **{f: getattr(self.config, f) for f in self.record_fields()},
                         "target": "adaptive", "mode": method.spec.adaptive.label, "eot": target.eot_iter}
            clean = torch.stack([views_list[i][0] for i in unit])
            adv = self.attack_through(target, clean, [labels[i] for i in unit], unit_ids, run_seed)
            for k, i in enumerate(unit):
                adv_views[i], info[unit_ids[k]] = self._rebuilt(unit_ids[k], views_list[i], adv[k], view_generator,
                                                                described)
        return adv_views, info
