"""FAB-T (Croce & Hein, ICML 2020, "Minimally distorted adversarial examples with a fast adaptive boundary
attack"), AutoAttack's third attack: `fab_t` and `FABT` (`--attack fab_t`).

Written on torch from the paper and checked against the original (fra31/auto-attack `fab_pt.py`,
`fab_base.py` and `fab_projections.py`, run unmodified by tests/fixtures/golden/autoattack/driver.py). For
one target class t (the clean image's 2nd, 3rd, ... most likely) each step linearises the boundary
z_t = z_y at the current point, finds the smallest step (L-inf or L2) onto that hyperplane within [0, 1]
from the current point and from the clean image, and moves to a mix of the two, overshooting by `eta`,
the clean image's share at most `alpha_max`. A point that crosses the boundary is kept when it is the
closest adversarial found so far, then pulled back toward the clean image by `beta`. FAB minimises the
distortion, so the budget only decides at the end whether the closest point found counts.
"""
from __future__ import annotations

import math

import torch

from ..bounded import BoundedAttack, Model, attack_unbroken, flat_norm
from .spec import FABTSpec

L2_ACTIVE = 1e-8   # an L2 step leaves a pixel whose weight is below this alone (the original's threshold)


def _level(weight: torch.Tensor, cap: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, N) weights >= 0 and caps >= 0, (B,) targets >= 0 -> (B,) the smallest lam >= 0 with
    sum_i weight_i * min(lam, cap_i) = target; inf where even lam = max(cap) falls short."""
    caps, order = cap.sort(dim=1)
    w = weight.gather(1, order)
    tail = w.flip(1).cumsum(1).flip(1)                       # sum of the weights from k on
    above = torch.cat([tail[:, 1:], torch.zeros_like(tail[:, :1])], dim=1)   # ... after k
    reach = torch.cummax(torch.cumsum(w * caps, 1) + caps * above, dim=1)[0]   # the sum at lam = caps[k]
    k = (reach <= target[:, None]).sum(dim=1)                # lam lies after the first k breakpoints
    prev = (k - 1).clamp(min=0)[:, None]
    from_first = target / tail[:, 0].clamp(min=1e-30)
    later = caps.gather(1, prev)[:, 0] + (target - reach.gather(1, prev)[:, 0]) / above.gather(1, prev)[:, 0].clamp(
        min=1e-30)
    lam = torch.where(k == 0, from_first, later)
    return torch.where(k == cap.shape[1], torch.full_like(lam, math.inf), lam)


def box_step(point: torch.Tensor, w: torch.Tensor, b: torch.Tensor, norm: str) -> torch.Tensor:
    """(B, N) points in [0, 1], hyperplanes w . z = b (w (B, N), b (B,)) -> (B, N) the step d of least
    L-inf or L2 norm with w . (point + d) = b and point + d in [0, 1]; where no step in the box reaches the
    plane, the box's corner nearest it. Each pixel moves toward the plane as far as its room in the box
    allows: L-inf d_i = +-min(lam, room_i), L2 d_i = +-|w_i| min(lam, room_i / |w_i|), lam solved exactly."""
    gap = b - (w * point).sum(dim=1)
    toward = torch.sign(w) * torch.where(gap >= 0, 1.0, -1.0)[:, None]
    room = torch.where(toward > 0, 1.0 - point, point)
    if norm == "Linf":
        lam = _level(w.abs(), room, gap.abs())
        return toward * torch.minimum(lam[:, None], room)
    active = w.abs() >= L2_ACTIVE
    size = w.abs().clamp(min=L2_ACTIVE)
    lam = _level(w.square() * active, torch.where(active, room / size, torch.zeros_like(room)), gap.abs())
    return toward * size * torch.minimum(lam[:, None], room / size) * active


def _margin_grad(model: Model, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) z_target - z_y at x (>= 0: the target wins) and its gradient with respect to x."""
    x = x.detach().requires_grad_()
    rows = torch.arange(x.shape[0], device=x.device)
    with torch.enable_grad():
        logits = model(x)
        margin = logits[rows, target] - logits[rows, y]
        grad = torch.autograd.grad(margin.sum(), [x])[0].detach()
    return margin.detach(), grad


def fab_run(model: Model, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor, *, norm: str, steps: int,
            alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9, start: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One FAB run toward `target` from `start` (default: the clean image) -> (the closest adversarial
    point found per sample, else the clean image; (B,) its distance from x, inf when none)."""
    b = x.shape[0]
    flat = x.reshape(b, -1)
    x1 = (x if start is None else start).clone()
    best, dist = x.clone(), torch.full((b,), math.inf, device=x.device)
    for _ in range(steps):
        margin, grad = _margin_grad(model, x1, y, target)
        with torch.no_grad():
            w = grad.reshape(b, -1)
            plane = (w * x1.reshape(b, -1)).sum(dim=1) - margin
            d = box_step(torch.cat([x1.reshape(b, -1), flat]), torch.cat([w, w]), torch.cat([plane, plane]), norm)
            d = d.reshape(2 * b, *x.shape[1:])
            size = flat_norm(d, norm).clamp(min=1e-8)
            alpha = (size[:b] / (size[:b] + size[b:])).clamp(0.0, alpha_max)
            x1 = ((x1 + eta * d[:b]) * (1 - alpha) + (x + eta * d[b:]) * alpha).clamp(0.0, 1.0)
            adv = model(x1).argmax(dim=1) != y
            if adv.any():
                far = flat_norm(x1 - x, norm).flatten()
                closer = adv & (far < dist)
                best[closer], dist[closer] = x1[closer], far[closer]
                x1[adv] = x[adv] + (x1[adv] - x[adv]) * beta
    return best, dist


def random_start(x: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """A restart's start (from the global RNG): half the budget along a random direction (uniform for
    L-inf, Gaussian for L2, as the original), clipped to [0, 1]."""
    noise = 2 * torch.rand(x.shape, device=x.device) - 1 if norm == "Linf" else torch.randn(x.shape, device=x.device)
    return (x + 0.5 * eps * noise / flat_norm(noise, norm)).clamp(0.0, 1.0)


def fab_t(model: Model, x: torch.Tensor, y: torch.Tensor, *, eps: float, norm: str = "Linf", steps: int = 100,
          restarts: int = 1, n_targets: int = 9, alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9,
          every: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """FAB-T on the samples `model` classifies correctly -> (images, (B,) bool: broken). For each of the
    `n_targets` classes ranked 2nd, 3rd, ... on the clean image (at most C - 1), `restarts` runs (the first
    from the clean image, the others from a random start) on the samples still unbroken; a sample is broken
    when the closest adversarial point found lies within `eps`. A sample not broken (or misclassified
    already, without `every`) keeps its clean image, as in the original."""
    def attempt(xs: torch.Tensor, ys: torch.Tensor, clean_logits: torch.Tensor, rank: int, restart: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        target = clean_logits.sort(dim=1)[1][:, -rank]
        start = random_start(xs, eps, norm) if restart > 0 else None
        out, _ = fab_run(model, xs, ys, target, norm=norm, steps=steps, alpha_max=alpha_max, eta=eta, beta=beta,
                         start=start)
        with torch.no_grad():
            hit = (model(out).argmax(dim=1) != ys) & (flat_norm(out - xs, norm).flatten() <= eps)
        return out, hit

    return attack_unbroken(model, x, y, restarts=restarts, n_targets=n_targets, every=every, attempt=attempt)


class FABT(BoundedAttack):
    """AutoAttack's targeted FAB: `steps` iterations toward each of `targets` classes, `restarts` each."""

    spec = FABTSpec

    def run(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
        c = self.config
        return fab_t(self.classifier, x, y, eps=c.budget, norm=c.norm, steps=c.steps, restarts=c.restarts,
                     n_targets=c.targets, alpha_max=c.alpha_max, eta=c.eta, beta=c.beta,
                     every=c.attack_misclassified)[0]
