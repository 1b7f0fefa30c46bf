"""L-inf PGD, the R-TPT paper's threat model: `PGDAttack` (`--attack pgd`; its config and spec: spec.py).

PGD itself is torchattacks.PGD's update, written on torch (`pgd`; untargeted cross-entropy on the true
label, random start, step alpha, projection on the eps-ball and [0, 1]) against zero-shot CLIP with
the INITIAL prompt, with normalisation inside the attacked model. The result is quantised to 8 bits
(rounding, or the authors' truncation) and clipped to the eps-ball in 8-bit units, so
`linf_255 <= floor(eps * 255)` always holds. See docs/ROBUSTNESS.md.

    attacker = build_attack({"name": "pgd", "eps": 4 / 255}, model, heads.zeroshot)
    adv_views, info = attacker.perturb(ids, views_list, labels, view_generator)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

from ..adaptive import AttackTarget
from ..pixels import ImageAttack, attack_seed, quantize
from .spec import PGDConfig, PGDSpec


def pgd_linf(classifier: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, labels: torch.Tensor, *,
             eps: float, alpha: float, steps: int, random_start: bool = True) -> torch.Tensor:
    """Untargeted L-inf PGD on `classifier` (images in [0, 1]) -> float images in [0, 1].

    The update of torchattacks.PGD (3.5), the attack R-TPT's code runs, op for op: a uniform start
    in the eps-ball clamped to [0, 1], then `steps` times x + alpha * sign(grad of the cross-entropy
    on the true label), projected on the eps-ball and [0, 1]. Written on torch so that the library
    does not depend on torchattacks (whose requests~=2.25 pin drags 2020 versions into every
    install); tests/test_attacks.py checks it against torchattacks where that is installed. The
    random start draws from the global RNG of the images' device: seed it (and fork it) around the
    call for reproducible results. `classifier` is any differentiable callable (images -> logits); an
    `nn.Module` is put in eval mode for the attack, as torchattacks does.
    """
    module = classifier if isinstance(classifier, nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
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
        if module is not None:
            module.train(was_training)
    return adv


def pgd_through(target: AttackTarget, images: torch.Tensor, labels: torch.Tensor, start: torch.Tensor | None, *,
                eps: float, alpha: float, steps: int) -> torch.Tensor:
    """`pgd_linf`'s update against an `AttackTarget` (a method's own prediction, `--attack-target adaptive`): the
    same start, step, sign and projections; each step's gradient is the mean of `target.eot_iter` calls' (EOT over
    the target's random views). `start`: the random start's noise (None: none)."""
    images = images.clone().detach()
    adv = images.clone().detach()
    if start is not None:
        adv = torch.clamp(adv + start, min=0, max=1).detach()
    with torch.enable_grad():
        for _ in range(steps):
            adv.requires_grad = True
            grad = torch.zeros_like(adv)
            for _ in range(target.eot_iter):
                cost = nn.functional.cross_entropy(target(adv), labels)
                grad += torch.autograd.grad(cost, adv)[0]
            adv = adv.detach() + alpha * grad.sign()
            delta = torch.clamp(adv - images, min=-eps, max=eps)
            adv = torch.clamp(images + delta, min=0, max=1).detach()
    return adv


class PGDAttack(ImageAttack):
    """L-inf PGD on the base view against zero-shot CLIP with the initial prompt (R-TPT's threat model).

    `random_start`: uniform start in the eps-ball, seeded per sample from (run seed, sample id);
    `quantize`: "round" or "truncate" (the authors' code); `clip_to_ball`: clip the 8-bit result
    to the eps-ball (False: the authors' code, which does not); `seed`: the run seed (default:
    the view generator's seed, which is the run's `--seed`).
    """

    spec = PGDSpec

    @classmethod
    def resolve(cls, config: PGDConfig) -> PGDConfig:
        return dataclasses.replace(config, alpha=config.eps / 4) if config.alpha is None else config

    def attack_image(self, clean_u8: torch.Tensor, label: int, sample_id: int, run_seed: int) -> torch.Tensor:
        cfg = self.config
        device = self.model.device
        x = clean_u8.to(device).float().div(255).unsqueeze(0)
        y = torch.tensor([int(label)], device=device)
        cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(attack_seed(run_seed, sample_id))
            x_adv = pgd_linf(self.classifier, x, y, eps=cfg.eps, alpha=cfg.alpha, steps=cfg.steps,
                        random_start=cfg.random_start)
        return quantize(x_adv[0], clean_u8, cfg.eps, cfg.quantize, cfg.clip_to_ball)

    def attack_through(self, target: AttackTarget, clean_u8: torch.Tensor, labels: Sequence[int],
                       sample_ids: Sequence[int], run_seed: int) -> torch.Tensor:
        """PGD on `target` (B images attacked together, (B, 3, S, S) uint8 -> uint8); each image's random start is
        the one `attack_image` draws for it, so transfer and adaptive start from the same point."""
        cfg = self.config
        device = self.model.device
        x = clean_u8.to(device).float().div(255)
        y = torch.tensor([int(v) for v in labels], device=device)
        start = None
        if cfg.random_start:
            cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
                if device.type == "cuda" else []
            noise = []
            for sid in sample_ids:
                with torch.random.fork_rng(devices=cuda):
                    torch.manual_seed(attack_seed(run_seed, sid))
                    noise.append(torch.empty_like(x[:1]).uniform_(-cfg.eps, cfg.eps))
            start = torch.cat(noise)
        x_adv = pgd_through(target, x, y, start, eps=cfg.eps, alpha=cfg.alpha, steps=cfg.steps)
        return torch.stack([quantize(a, c, cfg.eps, cfg.quantize, cfg.clip_to_ball) for a, c in zip(x_adv, clean_u8)])
