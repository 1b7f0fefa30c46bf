"""Threat models for robust accuracy (the R-TPT paper's): a registry and L-inf PGD.

An attack turns each sample's clean 8-bit base view (view 0, `model.image_size`
square) into an adversarial 8-bit image and regenerates ALL views from it with the
same per-sample seed as the clean run; every method then scores those views::

    attacker = build_attack({"name": "pgd", "eps": 1/255}, evaluator)
    adv_views, info = attacker.perturb(ids, views_list, labels, view_generator)

PGD itself is torchattacks.PGD's update, written on torch (`pgd`; untargeted cross-entropy on the true label, random
start, step alpha, projection on the eps-ball and [0, 1]) against zero-shot CLIP
with the INITIAL prompt, with normalisation inside the attacked model. The result
is quantised to 8 bits (rounding, or the authors' truncation) and clipped to the
eps-ball in 8-bit units, so `linf_255 <= floor(eps * 255)` always holds.
See docs/ROBUSTNESS.md.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from PIL import Image

from .base import QUANTIZE_MODES, Attack, attack_seed, quantize, register_attack

if TYPE_CHECKING:
    from ..engine.step import Evaluator
    from ..views.generator import ViewGenerator


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


def pgd(classifier: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, eps: float, alpha: float,
        steps: int, random_start: bool = True) -> torch.Tensor:
    """Untargeted L-inf PGD on `classifier` (images in [0, 1]) -> float images in [0, 1].

    The update of torchattacks.PGD (3.5), the attack R-TPT's code runs, op for op: a uniform start
    in the eps-ball clamped to [0, 1], then `steps` times x + alpha * sign(grad of the cross-entropy
    on the true label), projected on the eps-ball and [0, 1]. Written on torch so that the library
    does not depend on torchattacks (whose requests~=2.25 pin drags 2020 versions into every
    install); tests/test_attacks.py checks it against torchattacks where that is installed. The
    random start draws from the global RNG of the images' device: seed it (and fork it) around the
    call for reproducible results.
    """
    was_training = classifier.training
    classifier.eval()
    images = images.clone().detach()
    labels = labels.clone().detach()
    adv = images.clone().detach()
    if random_start:
        adv = torch.clamp(adv + torch.empty_like(adv).uniform_(-eps, eps), min=0, max=1).detach()
    try:
        with torch.enable_grad():
            for _ in range(steps):
                adv.requires_grad = True
                cost = nn.functional.cross_entropy(classifier(adv), labels)
                grad = torch.autograd.grad(cost, adv, retain_graph=False, create_graph=False)[0]
                adv = adv.detach() + alpha * grad.sign()
                delta = torch.clamp(adv - images, min=-eps, max=eps)
                adv = torch.clamp(images + delta, min=0, max=1).detach()
    finally:
        classifier.train(was_training)
    return adv


@register_attack("pgd")
class PGDAttack(Attack):
    """L-inf PGD on the base view against zero-shot CLIP with the initial prompt (R-TPT's threat model).

    eps, alpha: in [0, 1] pixel units (alpha defaults to eps / 4); `steps` PGD iterations;
    `random_start`: uniform start in the eps-ball, seeded per sample from (run seed, sample id);
    `quantize`: "round" or "truncate" (the authors' code); `clip_to_ball`: clip the 8-bit result
    to the eps-ball (False: the authors' code, which does not); `seed`: the run seed (default:
    the view generator's seed, which is the run's `--seed`).
    Each sample is attacked on its own, so its adversarial image does not depend on the batch.
    """

    def __init__(self, evaluator: Evaluator, eps: float = 1 / 255, alpha: float | None = None, steps: int = 7,
                 random_start: bool = True, quantize: str = "round", seed: int | None = None,
                 clip_to_ball: bool = True):
        eps = float(eps)
        if not (eps >= 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a finite number >= 0, got {eps}")
        if int(steps) != steps or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps}")
        if quantize not in QUANTIZE_MODES:
            raise ValueError(f"quantize must be one of {QUANTIZE_MODES}, got {quantize!r}")
        self.eps = eps
        self.alpha = eps / 4 if alpha is None else float(alpha)
        self.steps = int(steps)
        self.random_start = bool(random_start)
        self.quantize = quantize
        self.clip_to_ball = bool(clip_to_ball)
        self.seed = seed
        self.model = evaluator.model
        self.classifier = ZeroShotClassifier(self.model, evaluator.heads.zeroshot, self.model.logit_scale)

    def attack_image(self, clean_u8: torch.Tensor, label: int, sample_id: int, run_seed: int) -> torch.Tensor:
        """One clean uint8 image (3, S, S) -> its quantised adversarial uint8 image (3, S, S)."""
        device = self.model.device
        x = clean_u8.to(device).float().div(255).unsqueeze(0)
        y = torch.tensor([int(label)], device=device)
        cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(attack_seed(run_seed, sample_id))
            x_adv = pgd(self.classifier, x, y, eps=self.eps, alpha=self.alpha, steps=self.steps,
                        random_start=self.random_start)
        return quantize(x_adv[0], clean_u8, self.eps, self.quantize, self.clip_to_ball)

    @torch.no_grad()
    def _zeroshot_preds(self, images_u8: torch.Tensor) -> list[int]:
        x = images_u8.to(self.model.device).float().div(255)
        return self.classifier(x).argmax(dim=-1).tolist()

    def perturb(self, ids: Sequence[int], views_list: Sequence[torch.Tensor], labels: Sequence[int],
                view_generator: ViewGenerator) -> tuple[list[torch.Tensor], dict[int, dict[str, Any]]]:
        run_seed = self.seed if self.seed is not None else getattr(view_generator, "seed", 0)
        adv_views: list[torch.Tensor] = []
        info: dict[int, dict[str, Any]] = {}
        for sid, views, label in zip(ids, views_list, labels):
            clean = views[0]
            adv = self.attack_image(clean, label, sid, run_seed)
            pred_clean, pred_adv = self._zeroshot_preds(torch.stack([clean, adv]))
            adv_pil = Image.fromarray(adv.permute(1, 2, 0).numpy(), "RGB")
            new_views = view_generator(adv_pil, sid)
            if new_views.shape != views.shape:
                raise RuntimeError(f"sample {sid}: adversarial views {tuple(new_views.shape)} "
                                   f"!= clean views {tuple(views.shape)}")
            adv_views.append(new_views)
            info[int(sid)] = {"name": self.name, "eps": self.eps, "steps": self.steps,
                              "flipped": bool(pred_clean != pred_adv),
                              "linf_255": int((adv.to(torch.int16) - clean.to(torch.int16)).abs().max())}
        return adv_views, info
