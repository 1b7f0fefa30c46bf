"""AutoAttack (Croce & Hein, ICML 2020), the ensemble: `ensemble` and `AutoAttack` (`--attack autoattack`).

As the original's `run_standard_evaluation` (fra31/auto-attack autoattack.py): the parts run in turn, each
only on the samples every earlier part failed on, each re-seeded with the same seed; a sample is broken
by the first part whose image the model misclassifies, and keeps that image (the worst case); a sample
no part breaks keeps its clean image. Unlike the original (floats throughout), `AutoAttack` judges each
part's image as it will be stored, in 8 bits: a break that rounding undoes (FAB-T's closest points often
lie under half a grey level from the clean image) leaves the sample to the next part. Each record names
the part that broke its sample (`broken_by`, None when robust), so a report can say which attack did the work.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..apgd_ce.attack import apgd
from ..bounded import BoundedAttack, Model, to_uint8
from ..fab_t.attack import fab_t
from ..fab_t.spec import FABTConfig
from ..square.attack import square_linf
from .spec import AutoAttackConfig, AutoAttackSpec

Part = Callable[[Model, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def ensemble(model: Model, x: torch.Tensor, y: torch.Tensor, parts: Sequence[tuple[str, Part]], seed: int,
             every: bool = False, judge: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, list[str | None]]:
    """Run `parts` (name, attack(model, x, y) -> (images, broken)) in turn on the samples still robust,
    seeding the global RNG with `seed` before each -> (worst-case images, per sample the part that broke
    it or None). A sample the model misclassifies clean is not attacked (None, its clean image) unless
    `every`: then the first part attacks it too (and, misclassified, it counts as broken by that part).
    `judge(images, clean)`: the images whose prediction decides a break (default: the part's own; shiftlab
    passes their 8-bit versions, so a break that rounding undoes leaves the sample to the next part)."""
    x = x.detach().clone().float()
    with torch.no_grad():
        robust = (model(x).argmax(dim=1) == y) | every
    adv = x.clone()
    broken_by: list[str | None] = [None] * x.shape[0]
    for name, part in parts:
        idx = robust.nonzero().flatten()
        if idx.numel() == 0:
            break
        torch.manual_seed(seed)
        out, _ = part(model, x[idx], y[idx])
        with torch.no_grad():
            fooled = model(out if judge is None else judge(out, x[idx])).argmax(dim=1) != y[idx]
        for j in idx[fooled].tolist():
            broken_by[j] = name
        adv[idx[fooled]] = out[fooled]
        robust[idx[fooled]] = False
    return adv, broken_by


class AutoAttack(BoundedAttack):
    """The ensemble of `parts` (default APGD-CE, APGD-T, FAB-T, Square) at one budget; per sample `broken_by`.
    FAB-T takes the ensemble's `steps` and `targets` (both the standard version's for APGD-T and FAB-T) and
    its own defaults otherwise (`fab_t/spec.py`)."""

    spec = AutoAttackSpec

    def needs_classes(self, config: AutoAttackConfig) -> int:
        return 4 if "apgd_t" in config.parts.split(",") else 2

    def parts(self) -> list[tuple[str, Part]]:
        c = self.config
        every = c.attack_misclassified
        fab = FABTConfig()
        table: dict[str, Part] = {
            "apgd_ce": lambda m, x, y: apgd(m, x, y, eps=c.budget, norm=c.norm, steps=c.steps, rho=c.rho, loss="ce",
                                            every=every),
            "apgd_t": lambda m, x, y: apgd(m, x, y, eps=c.budget, norm=c.norm, steps=c.steps, rho=c.rho,
                                           loss="dlr-targeted", n_targets=c.targets, every=every),
            "fab_t": lambda m, x, y: fab_t(m, x, y, eps=c.budget, norm=c.norm, steps=c.steps, restarts=fab.restarts,
                                          n_targets=c.targets, alpha_max=fab.alpha_max, eta=fab.eta, beta=fab.beta,
                                          every=every),
            "square": lambda m, x, y: square_linf(m, x, y, eps=c.eps, queries=c.queries, p_init=c.p_init,
                                                  every=every),
        }
        return [(name.strip(), table[name.strip()]) for name in c.parts.split(",")]

    def in_8_bits(self, images: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
        """Float images -> what they become once stored (`to_uint8`), back in [0, 1] on their device: FAB-T's
        closest points lie just past the boundary, often under half a grey level from the clean image."""
        clean_u8 = (clean * 255).round().to(torch.uint8)
        return torch.stack([to_uint8(a, c, self.config) for a, c in zip(images, clean_u8)]).to(images.device
                                                                                               ).float() / 255

    def run(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
        adv, broken_by = ensemble(self.classifier, x, y, self.parts(), seed, every=self.config.attack_misclassified,
                                  judge=self.in_8_bits)
        self._last_broken_by = broken_by[0]
        return adv

    def attack_image(self, clean_u8: torch.Tensor, label: int, sample_id: int, run_seed: int) -> torch.Tensor:
        adv = super().attack_image(clean_u8, label, sample_id, run_seed)
        self.notes.setdefault(int(sample_id), {})["broken_by"] = self._last_broken_by
        return adv
