"""APGD (Croce & Hein, ICML 2020): `apgd`, the step-size-adaptive PGD of AutoAttack, and `APGDCE`
(`--attack apgd_ce`, its cross-entropy version; the targeted DLR version is `apgd_t`).

Written on torch from the paper and checked against the original code (fra31/auto-attack
`autopgd_base.py`, run unmodified by tests/fixtures/golden/autoattack/driver.py): the same random start,
momentum 0.75, step 2 eps halved at checkpoints where the loss oscillated or stalled, the restart from
the best point, the same checkpoint schedule (0.22, 0.06 and 0.03 of the iterations). A sample counts as
broken the first iteration its prediction is wrong; the result is that iterate, or the clean image when
the attack never broke it (the original returns the clean image too).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..bounded import BoundedAttack, Model, attack_unbroken, project, unit
from .spec import APGDCESpec

LOSSES = ("ce", "dlr-targeted")


def targeted_dlr(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, C) -> (B,): the targeted difference-of-logits ratio, -(z_y - z_t) / (z_1 - (z_3 + z_4) / 2),
    z_k the k-th largest logit (needs C >= 4); rising as the target overtakes the true class."""
    z = logits.sort(dim=1)[0]
    rows = torch.arange(logits.shape[0], device=logits.device)
    return -(logits[rows, y] - logits[rows, target]) / (z[:, -1] - 0.5 * (z[:, -3] + z[:, -4]) + 1e-12)


def _loss(model: Model, x: torch.Tensor, y: torch.Tensor, loss: str, target: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-sample loss, logits, gradient of the summed loss with respect to x)."""
    x = x.detach().requires_grad_()
    with torch.enable_grad():
        logits = model(x)
        per = F.cross_entropy(logits, y, reduction="none") if loss == "ce" else targeted_dlr(logits, y, target)
        grad = torch.autograd.grad(per.sum(), [x])[0].detach()
    return per.detach(), logits.detach(), grad


def _stalled(history: torch.Tensor, i: int, k: int, rho: float) -> torch.Tensor:
    """(B,) bool: the loss rose in at most rho * k of the last k steps (history[i - k] is read as the
    original reads it, wrapping to the last row of a zero history at the first checkpoint)."""
    rises = torch.zeros_like(history[0])
    for j in range(k):
        rises += (history[i - j] > history[i - j - 1]).float()
    return rises <= k * rho


def apgd_run(model: Model, x: torch.Tensor, y: torch.Tensor, *, eps: float, norm: str, steps: int, rho: float,
             loss: str = "ce", target: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One APGD run from a random start -> (the first iterate that broke each sample, else the start;
    (B,) bool: broken; the highest-loss iterate; its loss). The random start draws from the global RNG
    (uniform for L-inf, Gaussian for L2, as the original)."""
    b = x.shape[0]
    shape = (b, *([1] * (x.dim() - 1)))
    noise = 2 * torch.rand(x.shape, device=x.device) - 1 if norm == "Linf" else torch.randn(x.shape, device=x.device)
    x_adv = (x + eps * torch.ones_like(x) * unit(noise, norm)).clamp(0.0, 1.0)
    x_best, x_broken = x_adv.clone(), x_adv.clone()
    loss_now, logits, grad = _loss(model, x_adv, y, loss, target)
    robust = logits.argmax(dim=1) == y
    loss_best, grad_best = loss_now.clone(), grad.clone()
    history = torch.zeros(steps, b, device=x.device)
    step = 2.0 * eps * torch.ones(shape, device=x.device)
    x_prev = x_adv.clone()
    k, since_check = max(int(0.22 * steps), 1), 0
    k_min, k_decr = max(int(0.06 * steps), 1), max(int(0.03 * steps), 1)
    best_at_check, halved_at_check = loss_best.clone(), torch.ones_like(loss_best)
    for i in range(steps):
        with torch.no_grad():
            momentum = x_adv - x_prev
            x_prev = x_adv.clone()
            a = 0.75 if i > 0 else 1.0
            direction = torch.sign(grad) if norm == "Linf" else unit(grad, "L2")
            z = project(x_adv + step * direction, x, eps, norm)
            x_adv = project(x_adv + (z - x_adv) * a + momentum * (1 - a), x, eps, norm)
        loss_now, logits, grad = _loss(model, x_adv, y, loss, target)
        wrong = logits.argmax(dim=1) != y
        robust = robust & ~wrong
        x_broken[wrong] = x_adv[wrong]
        history[i] = loss_now
        better = loss_now > loss_best
        x_best[better], grad_best[better], loss_best[better] = x_adv[better], grad[better], loss_now[better]
        since_check += 1
        if since_check == k:
            halve = _stalled(history, i, k, rho).float()
            halve = torch.max(halve, (1.0 - halved_at_check) * (best_at_check >= loss_best).float())
            halved_at_check, best_at_check = halve.clone(), loss_best.clone()
            back = halve > 0
            step[back] /= 2.0
            x_adv[back], grad[back] = x_best[back], grad_best[back]
            k, since_check = max(k - k_decr, k_min), 0
    return x_broken, ~robust, x_best, loss_best


def apgd(model: Model, x: torch.Tensor, y: torch.Tensor, *, eps: float, norm: str = "Linf", steps: int = 100,
         restarts: int = 1, rho: float = 0.75, loss: str = "ce", n_targets: int = 9, every: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """APGD on the samples `model` classifies correctly -> (images, (B,) bool: broken). A sample already
    misclassified, or never broken, keeps its clean image. `loss="ce"`: `restarts` runs on cross-entropy;
    `"dlr-targeted"`: for each of the `n_targets` classes ranked 2nd, 3rd, ... on the clean image (at most
    C - 1), `restarts` runs on the targeted DLR loss, each on the samples still unbroken. `every`: attack the
    misclassified samples too (each gets its last iterate, which only climbs the true class's loss)."""
    def attempt(xs: torch.Tensor, ys: torch.Tensor, clean_logits: torch.Tensor, rank: int | None, restart: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        target = None
        if rank is not None:
            with torch.no_grad():
                target = model(xs).sort(dim=1)[1][:, -rank]
        out, hit, _, _ = apgd_run(model, xs, ys, eps=eps, norm=norm, steps=steps, rho=rho, loss=loss, target=target)
        return out, hit

    return attack_unbroken(model, x, y, restarts=restarts, n_targets=None if loss == "ce" else n_targets, every=every,
                           attempt=attempt)


class APGDCE(BoundedAttack):
    """APGD on the cross-entropy (AutoAttack's first attack): `steps` iterations, `restarts` random starts."""

    spec = APGDCESpec

    def run(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
        c = self.config
        adv, _ = apgd(self.classifier, x, y, eps=c.budget, norm=c.norm, steps=c.steps, restarts=c.restarts,
                      rho=c.rho, loss="ce", every=c.attack_misclassified)
        return adv
