"""Square (Andriushchenko et al., ECCV 2020), AutoAttack's gradient-free part: `square_linf` and `Square`
(`--attack square`).

Written on torch from the paper and checked against the original (fra31/auto-attack `square.py`, the
L-inf margin version AutoAttack runs, with `resc_schedule=False`; tests/attacks/test_autoattack.py): a
start of vertical stripes at +-eps, then per query one square of side s (shrinking on the original's
schedule of p) moved to the other corner of the budget, kept if the margin loss falls or the sample
is misclassified. It reads only logits, so a defence that masks gradients does not stop it.
"""
from __future__ import annotations

import math

import torch

from ..bounded import BoundedAttack, Model
from .spec import SquareSpec

# the original's schedule: p_init divided by 2, 4, ... 512 once the query count passes these
_SCHEDULE = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)


def square_share(p_init: float, query: int) -> float:
    """The share of the image the query's square covers."""
    halvings = sum(query > q for q in _SCHEDULE)
    return p_init / 2 ** halvings


def _margin(model: Model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B,): the true class's logit minus the largest other one (< 0: misclassified)."""
    logits = model(x)
    rows = torch.arange(x.shape[0], device=x.device)
    true = logits[rows, y].clone()
    logits[rows, y] = -float("inf")
    return true - logits.max(dim=-1)[0]


def _random_sign(shape: list[int], device: torch.device) -> torch.Tensor:
    return torch.sign(2 * torch.rand(shape).to(device) - 1)


def square_run(model: Model, x: torch.Tensor, y: torch.Tensor, *, eps: float, queries: int, p_init: float
               ) -> torch.Tensor:
    """One Square run from the global RNG -> the best images (lowest margin, or first misclassified)."""
    with torch.no_grad():
        c, h, w = x.shape[1:]
        n_features = c * h * w
        best = torch.clamp(x + eps * _random_sign([x.shape[0], c, 1, w], x.device), 0.0, 1.0)
        margin = _margin(model, best, y)
        loss = margin.clone()
        if (margin < 0.0).all():
            return best
        for query in range(queries):
            idx = (margin > 0.0).nonzero().flatten()
            s = min(max(int(round(math.sqrt(square_share(p_init, query) * n_features / c))), 1), min(h, w))
            top = (0 + (h - s) * torch.rand([1]).to(x.device)).long()
            left = (0 + (w - s) * torch.rand([1]).to(x.device)).long()
            step = torch.zeros([c, h, w], device=x.device)
            step[:, top:top + s, left:left + s] = 2.0 * eps * _random_sign([c, 1, 1], x.device)
            x0 = x[idx]
            new = torch.clamp(torch.min(torch.max(best[idx] + step, x0 - eps), x0 + eps), 0.0, 1.0)
            new_margin = _margin(model, new, y[idx])
            lower = new_margin < loss[idx]
            loss[idx] = torch.where(lower, new_margin, loss[idx])
            keep = lower | (new_margin <= 0.0)
            margin[idx] = torch.where(keep, new_margin, margin[idx])
            best[idx] = torch.where(keep.view(-1, 1, 1, 1), new, best[idx])
            if (margin <= 0.0).all():
                break
        return best


def square_linf(model: Model, x: torch.Tensor, y: torch.Tensor, *, eps: float, queries: int = 5000,
                p_init: float = 0.8, every: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Square on the samples `model` classifies correctly (`every`: on all) -> (images, (B,) bool: broken);
    a sample not broken (or misclassified already, without `every`) keeps its clean image, as in the original."""
    x = x.detach().clone().float()
    with torch.no_grad():
        todo = (model(x).argmax(dim=1) == y) | every
    adv, broken = x.clone(), torch.zeros_like(todo)
    idx = todo.nonzero().flatten()
    if idx.numel():
        out = square_run(model, x[idx], y[idx], eps=eps, queries=queries, p_init=p_init)
        with torch.no_grad():
            hit = model(out).argmax(dim=1) != y[idx]
        adv[idx[hit]], broken[idx[hit]] = out[hit], True
    return adv, broken


class Square(BoundedAttack):
    """Square, L-inf, margin loss, one restart (AutoAttack's fourth attack)."""

    spec = SquareSpec

    def run(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
        c = self.config
        return square_linf(self.classifier, x, y, eps=c.eps, queries=c.queries, p_init=c.p_init,
                           every=c.attack_misclassified)[0]
