"""What the AutoAttack attacks share on torch: one sample's float attack in its seeded RNG, the 8-bit
conversion for either norm, and the projections on the budget (see `budgets.py` for the config).

An attack writes `run(x, y, seed) -> x_adv`: x (1, 3, S, S) in [0, 1], y (1,) the true label; x_adv within the
budget and [0, 1]. Its randomness comes from the global RNG, seeded per sample with `attack_seed(run
seed, sample id)` and forked, so a sample's image depends on nothing else.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from .budgets import BUDGET_FIELDS, BudgetConfig
from .pixels import ImageAttack, attack_seed, quantize

if TYPE_CHECKING:
    from ..models import ClipModel
    from .adaptive import AttackTarget

_NOISE_SALT = 0x0015E   # keeps the noise check's stream apart from the attack's
Model = Callable[[torch.Tensor], torch.Tensor]   # images (B, 3, S, S) in [0, 1] -> logits (B, C)


def flat_norm(x: torch.Tensor, norm: str) -> torch.Tensor:
    """(B, ...) -> (B, 1, 1, 1): each sample's L-inf or L2 norm, shaped to divide x."""
    flat = x.reshape(x.shape[0], -1)
    n = flat.abs().max(dim=1)[0] if norm == "Linf" else (flat ** 2).sum(dim=1).sqrt()
    return n.view(-1, *([1] * (x.dim() - 1)))


def unit(x: torch.Tensor, norm: str) -> torch.Tensor:
    """x scaled to norm 1 per sample (1e-12 keeps a zero direction zero)."""
    return x / (flat_norm(x, norm) + 1e-12)


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """x_adv moved onto the eps-ball around x (L-inf: clip; L2: shrink the difference), then onto [0, 1]."""
    if norm == "Linf":
        return torch.clamp(torch.min(torch.max(x_adv, x - eps), x + eps), 0.0, 1.0)
    d = x_adv - x
    radius = torch.min(eps * torch.ones_like(x), flat_norm(d, "L2"))
    return torch.clamp(x + unit(d, "L2") * radius, 0.0, 1.0)


def attack_unbroken(model: Model, x: torch.Tensor, y: torch.Tensor, *, restarts: int, n_targets: int | None,
                    every: bool, attempt: Callable[..., tuple[torch.Tensor, torch.Tensor]]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAttack's schedule of runs (APGD, FAB-T) -> (images, (B,) bool: broken). For each target rank (None alone
    with `n_targets` None: untargeted; else the classes ranked 2nd, 3rd, ... on the clean image, at most `n_targets`
    and C - 1), `restarts` runs, each `attempt(x, y, clean_logits, rank, restart) -> (images, (n,) bool: broken)` on
    the samples still unbroken (those `model` classifies correctly, or all with `every`), in float32; a sample a run
    breaks takes its image, one never broken keeps its clean image."""
    x = x.detach().clone().float()
    with torch.no_grad():
        clean_logits = model(x)
    todo = (clean_logits.argmax(dim=1) == y) | every
    adv, broken = x.clone(), torch.zeros_like(todo)
    ranks = [None] if n_targets is None else list(range(2, min(n_targets, clean_logits.shape[1] - 1) + 2))
    for rank in ranks:
        for restart in range(restarts):
            idx = todo.nonzero().flatten()
            if idx.numel() == 0:
                return adv, broken
            out, hit = attempt(x[idx], y[idx], clean_logits[idx], rank, restart)
            adv[idx[hit]], broken[idx[hit]], todo[idx[hit]] = out[hit], True, False
    return adv, broken


def to_uint8(x_adv: torch.Tensor, clean_u8: torch.Tensor, config: BudgetConfig) -> torch.Tensor:
    """A float result (3, S, S) -> uint8 within the budget. L-inf: `quantize` (round or truncate, then the
    8-bit eps-ball). L2: each pixel's change rounded toward zero, so no pixel moves further than the float
    attack moved it and the L2 norm cannot grow past the budget."""
    if config.norm == "Linf":
        return quantize(x_adv, clean_u8, config.eps, config.quantize, clip_to_ball=True)
    clean = clean_u8.to("cpu", torch.float64)
    change = torch.trunc(x_adv.detach().to("cpu", torch.float64) * 255 - clean)
    return (clean + change).clamp_(0, 255).to(torch.uint8)


class BoundedAttack(ImageAttack):
    """An AutoAttack-style attack on one sample: `run(x, y)` in a forked RNG seeded per sample, then
    `to_uint8`. Subclasses write `run`; `self.classifier` is the model attacked (any callable)."""

    config: BudgetConfig
    min_classes: int = 2    # fewer classes than this: refused when built (APGD-T's DLR reads the 4th logit)

    def __init__(self, config: BudgetConfig, model: ClipModel, zeroshot_head: torch.Tensor,
                 target: Callable[[torch.Tensor], torch.Tensor] | None = None):
        n_classes = int(zeroshot_head.shape[0])
        if n_classes < self.needs_classes(config):
            raise ValueError(f"attack {self.name}: needs at least {self.needs_classes(config)} classes "
                             f"(its targeted DLR loss reads the 4th largest logit), the run has {n_classes}")
        super().__init__(config, model, zeroshot_head, target=target)

    def needs_classes(self, config: BudgetConfig) -> int:
        return self.min_classes

    @classmethod
    def record_fields(cls) -> list[str]:
        """The label's and details' fields, then the norm and the radius in force (what sanity checks group by)."""
        return list(dict.fromkeys([*super().record_fields(), *BUDGET_FIELDS]))

    def run(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
        """x (1, 3, S, S) in [0, 1], y (1,) -> x_adv in the budget; the global RNG is already seeded with
        `seed` (an ensemble seeds it again before each part, as AutoAttack does)."""
        raise NotImplementedError

    def attack_image(self, clean_u8: torch.Tensor, label: int, sample_id: int, run_seed: int) -> torch.Tensor:
        device = self.model.device
        x = clean_u8.to(device).float().div(255).unsqueeze(0)
        y = torch.tensor([int(label)], device=device)
        cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        seed = attack_seed(run_seed, sample_id)
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            x_adv = self.run(x, y, seed)
        self.notes.setdefault(int(sample_id), {})["noise_flipped"] = self._noise_flips(x, clean_u8, seed)
        return to_uint8(x_adv[0], clean_u8, self.config)

    def attack_through(self, target: AttackTarget, clean_u8: torch.Tensor, labels: Sequence[int],
                       sample_ids: Sequence[int], run_seed: int) -> torch.Tensor:
        """`run` on `target` (`--attack-target adaptive`): one image as `attack_image` attacks it; a batch method's
        batch (B > 1) in one `run`, the RNG seeded by its first sample (each sample's noise check by its own)."""
        if clean_u8.shape[0] == 1:
            return super().attack_through(target, clean_u8, labels, sample_ids, run_seed)
        device = self.model.device
        x = clean_u8.to(device).float().div(255)
        y = torch.tensor([int(v) for v in labels], device=device)
        cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        seed = attack_seed(run_seed, int(sample_ids[0]))
        saved, self.classifier = self.classifier, target
        try:
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(seed)
                x_adv = self.run(x, y, seed)
        finally:
            self.classifier = saved
        for i, sid in enumerate(sample_ids):
            self.notes.setdefault(int(sid), {})["noise_flipped"] = self._noise_flips(
                x[i:i + 1], clean_u8[i], attack_seed(run_seed, int(sid)))
        return torch.stack([to_uint8(a, c, self.config) for a, c in zip(x_adv, clean_u8)])

    @torch.no_grad()
    def _noise_flips(self, x: torch.Tensor, clean_u8: torch.Tensor, seed: int) -> bool:
        """Whether uniform noise of the same budget changes zero-shot's prediction (the sanity check that
        an attack beats noise): uniform in the L-inf ball, or a uniformly drawn direction at the L2 radius,
        converted to 8 bits as the attack's image is; seeded apart from the attack."""
        gen = torch.Generator().manual_seed((seed + _NOISE_SALT) % 2 ** 63)
        c = self.config
        if c.norm == "Linf":
            noisy = x.cpu() + (2 * torch.rand(x.shape, generator=gen) - 1) * c.budget
        else:
            noisy = x.cpu() + c.budget * unit(torch.randn(x.shape, generator=gen), "L2")
        noisy_u8 = to_uint8(noisy.clamp(0, 1)[0], clean_u8, c)
        pair = torch.stack([clean_u8.cpu(), noisy_u8]).to(self.model.device).float().div(255)
        clean_pred, noisy_pred = self.zeroshot(pair).argmax(dim=-1).tolist()
        return bool(clean_pred != noisy_pred)
