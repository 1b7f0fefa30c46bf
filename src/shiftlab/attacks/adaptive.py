"""Attacks through the adaptation (`--attack-target adaptive`): a method's own prediction as the attacked function.

The interface every attack's adaptive path takes: an `AttackTarget`, a differentiable callable pixels in [0, 1]
(B, 3, S, S) -> logits (B, C), with `eot_iter` (how many calls a gradient averages: the expectation over the
method's random views, Athalye et al. 2018). `method_target(method, ...)` makes one from a registered method: its
spec's `adaptive.impl` (methods/adaptive_modes.py) is the method's prediction as a function of its views in
[0, 1], and the views are drawn here: view 0 is the attacked image itself and views 1..N-1 random resized crops
(+ flip) of it, drawn afresh on every call from a generator seeded by (run seed, sample), as the view generator
would crop the attacked image but differentiably (torch crops and a bilinear resize with antialiasing instead of
PIL's). The attack never sees the view seed the scoring uses: it attacks the expectation over views.
"""
from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from ..views.recipe import ViewRecipe

_EOT_SALT = 0xE07_D4A3   # the EOT draws' stream, apart from the random start's and the view generator's


class AttackTarget:
    """A differentiable callable pixels [0, 1] (B, 3, S, S) -> logits (B, C); each call may draw fresh randomness,
    and a gradient averages `eot_iter` calls (1: the function is deterministic, or one draw per step)."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], eot_iter: int = 1):
        self.forward = forward
        self.eot_iter = int(eot_iter)

    # an attack written for a classifier module puts it in eval mode and back (torchattacks' habit): nothing to do
    training = False

    def eval(self) -> AttackTarget:
        return self

    def train(self, mode: bool = True) -> AttackTarget:
        return self

    def __call__(self, x01: torch.Tensor) -> torch.Tensor:
        return self.forward(x01)


def prediction_function(method: Any) -> Callable:
    """The method's differentiable prediction `fn(method, views01 (B, N, 3, S, S)) -> (B, C)` (its spec's
    adaptive.impl); a one-line ValueError where it has none."""
    declared = method.spec.adaptive   # methods/adaptive_modes.py
    if declared is None or not declared.impl:
        raise ValueError(f"{method.name}: no differentiable prediction to attack adaptively "
                         f"({'no mode declared' if declared is None else declared.label + ', not implemented'})")
    module, _, name = declared.impl.partition(":")
    return getattr(importlib.import_module(module), name)


def crop_box(gen: torch.Generator, size: int, scale: tuple[float, float], ratio: tuple[float, float]) -> tuple:
    """torchvision RandomResizedCrop.get_params's rule (10 tries, then the centre crop of the clamped ratio) drawn
    from `gen`, on a square image of side `size` -> (top, left, height, width)."""
    area = size * size
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * float(torch.empty(1).uniform_(scale[0], scale[1], generator=gen))
        aspect = math.exp(float(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=gen)))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= size and 0 < h <= size:
            top = int(torch.randint(0, size - h + 1, (1,), generator=gen))
            left = int(torch.randint(0, size - w + 1, (1,), generator=gen))
            return top, left, h, w
    aspect = min(max(1.0, ratio[0]), ratio[1])
    w, h = (size, int(round(size / aspect))) if aspect > 1 else (int(round(size * aspect)), size)
    return (size - h) // 2, (size - w) // 2, h, w


def draw_views(x01: torch.Tensor, n_views: int, recipe: ViewRecipe, gen: torch.Generator) -> torch.Tensor:
    """(B, 3, S, S) -> (B, n_views, 3, S, S): view 0 the image, the others random resized crops (+ flip) of it."""
    if n_views <= 1:
        return x01.unsqueeze(1)
    size = x01.shape[-1]
    mode = "bicubic" if recipe.interpolation == "bicubic" else "bilinear"
    out = []
    for img in x01:
        views = [img]
        for _ in range(n_views - 1):
            top, left, h, w = crop_box(gen, size, recipe.scale, recipe.ratio)
            view = F.interpolate(img[None, :, top:top + h, left:left + w], size=(size, size), mode=mode,
                                 align_corners=False, antialias=True)[0]
            if recipe.flip and float(torch.rand(1, generator=gen)) < 0.5:
                view = view.flip(-1)
            views.append(view.clamp(0, 1))
        out.append(torch.stack(views))
    return torch.stack(out)


def eot_seed(run_seed: int, sample_ids: Sequence[int]) -> int:
    """The seed of the EOT draws of the samples attacked together; depends only on (run seed, sample ids)."""
    return int(np.random.SeedSequence([int(run_seed), *map(int, sample_ids), _EOT_SALT])
               .generate_state(1, dtype=np.uint64)[0] >> 1)


def method_target(method: Any, sample_ids: Sequence[int], run_seed: int, eot: int = 1) -> AttackTarget:
    """The method's prediction, as it stands now (an online method's state included), as an AttackTarget over the
    attacked base views of `sample_ids`; with random views (a recipe of more than one view), `eot` draws per
    gradient."""
    fn = prediction_function(method)
    recipe = method.view_recipe
    n_views = recipe.n_views if method.spec.needs_views else 1
    gen = torch.Generator().manual_seed(eot_seed(run_seed, sample_ids))

    # a prediction whose randomness is drawn per sample (TTC's random start) is told the samples' ids
    per_sample = {"sample_ids": list(sample_ids)} if "sample_ids" in inspect.signature(fn).parameters else {}

    def forward(x01: torch.Tensor) -> torch.Tensor:
        return fn(method, draw_views(x01, n_views, recipe, gen), **per_sample)
    return AttackTarget(forward, eot_iter=eot if n_views > 1 else 1)
