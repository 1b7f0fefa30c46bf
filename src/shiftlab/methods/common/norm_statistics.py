"""Test-time normalisation statistics: the image tower's BatchNorm layers normalising with statistics of the test
data instead of the source statistics they were trained with (mariodoebler/test-time-adaptation's
`classification/methods/norm.py` and `bn.py`, which `ttaug.py` and `memo.py` build on).

`StatsTower(clip, statistics, alpha, momentum)` is a private copy of the image tower whose BatchNorm layers (a CLIP
ResNet's; a ViT has none, and its LayerNorms always normalise each token with its own statistics) are wrapped by
`StatsBatchNorm`; every tensor of the copy IS the shared model's, never written (the "ema" running statistics are
the wrapper's own). The three kinds of statistics (STATISTICS):

- "batch": the batch's own mean and (biased) variance, as a BatchNorm layer in train mode normalises (their
  `BNTest`, norm.py:8-20: every BatchNorm2d put in train mode);
- "alpha": (1 - alpha) x the source running statistics + alpha x the batch's mean and unbiased variance (their
  `AlphaBatchNorm`, bn.py:29-79: a momentum-1 BatchNorm's running statistics of the batch, mixed);
- "ema": the running statistics updated with the batch (momentum, unbiased variance) by a first forward in train
  mode, then a second forward normalising with them (their `EMABatchNorm`, bn.py:82-96); the running statistics
  are the state carried from batch to batch;
- "source": the source running statistics, as trained (the frozen tower: nothing wrapped).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.lora_tower import shared_copy
from ..base import Method
from ..context import SampleContext
from .norm_adaptation import BatchStatisticsError, HeadAtScale, _check_batch_statistics

STATISTICS = ("batch", "alpha", "ema", "source")


class StatsBatchNorm(nn.Module):
    """A BatchNorm2d layer (shared, never written) normalising with test statistics (module docstring)."""

    def __init__(self, layer: nn.BatchNorm2d, statistics: str, alpha: float, momentum: float):
        super().__init__()
        self.layer = layer
        self.statistics = statistics
        self.alpha = alpha
        self.momentum = momentum
        self.updating = False          # "ema": the first of the two forwards, which updates the running statistics
        if statistics == "ema":
            self.register_buffer("running_mean", layer.running_mean.detach().clone())
            self.register_buffer("running_var", layer.running_var.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        if self.statistics == "batch" or (self.statistics == "ema" and self.updating):
            mean = self.running_mean if self.statistics == "ema" else None
            var = self.running_var if self.statistics == "ema" else None
            return F.batch_norm(x, mean, var, layer.weight, layer.bias, True, self.momentum, layer.eps)
        if self.statistics == "ema":
            return F.batch_norm(x, self.running_mean, self.running_var, layer.weight, layer.bias, False, 0.0,
                                layer.eps)
        # "alpha": the batch's mean and unbiased variance as their momentum-1 BatchNorm's running statistics hold
        # them (the same kernel, so the same rounding), mixed
        with torch.no_grad():
            batch_mean = torch.zeros_like(layer.running_mean)
            batch_var = torch.ones_like(layer.running_var)
            F.batch_norm(x, batch_mean, batch_var, None, None, True, 1.0, layer.eps)
        mean = (1 - self.alpha) * layer.running_mean + self.alpha * batch_mean
        var = (1 - self.alpha) * layer.running_var + self.alpha * batch_var
        return F.batch_norm(x, mean, var, layer.weight, layer.bias, False, 0.0, layer.eps)


def batch_norm_layers(visual: nn.Module) -> list[str]:
    """The names of `visual`'s BatchNorm2d layers, in module order."""
    return [name for name, m in visual.named_modules() if isinstance(m, nn.BatchNorm2d)]


class StatsTower(nn.Module):
    """The image tower of `clip` with its BatchNorm layers normalising with test statistics (`statistics`: one of
    STATISTICS); `layers` names them (none for a ViT: the tower is then the frozen one, computed alike)."""

    def __init__(self, clip: nn.Module, statistics: str = "batch", alpha: float = 0.1, momentum: float = 0.1):
        super().__init__()
        if statistics not in STATISTICS:
            raise ValueError(f"statistics must be one of {', '.join(STATISTICS)}, got {statistics!r}")
        self.statistics = statistics
        visual = shared_copy(clip.visual)
        self.layers = batch_norm_layers(visual) if statistics != "source" else []
        self.wrappers: list[StatsBatchNorm] = []
        for name in self.layers:
            parent_name, _, attr = name.rpartition(".")
            parent = visual.get_submodule(parent_name) if parent_name else visual
            wrapper = StatsBatchNorm(getattr(parent, attr), statistics, alpha, momentum)
            setattr(parent, attr, wrapper)
            # one value per channel (one image at 1x1 there) has no batch statistics: refused in one line
            wrapper.register_forward_pre_hook(_check_batch_statistics(name))
            self.wrappers.append(wrapper)
        self.visual = visual
        self._initial = self.stats_state()

    def stats_state(self) -> dict[str, Any]:
        """{layer: {"mean", "var"}}: the running statistics the tower carries ("ema"; empty otherwise), copied."""
        if self.statistics != "ema":
            return {}
        return {name: {"mean": w.running_mean.detach().clone(), "var": w.running_var.detach().clone()}
                for name, w in zip(self.layers, self.wrappers)}

    @torch.no_grad()
    def load_stats_state(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.stats_state()):
            raise ValueError(f"statistics state must hold exactly the layers {list(self.stats_state())}")
        for name, w in zip(self.layers, self.wrappers):
            if name in state:
                w.running_mean.copy_(state[name]["mean"])
                w.running_var.copy_(state[name]["var"])

    def reset(self) -> None:
        self.load_stats_state(self._initial)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.statistics == "ema" and self.wrappers:
            for w in self.wrappers:
                w.updating = True
            try:
                with torch.no_grad():       # the first forward only updates the running statistics
                    self.visual(x)
            finally:
                for w in self.wrappers:
                    w.updating = False
        return self.visual(x)


class StatsTowerMethod(HeadAtScale, Method):
    """A method on a `StatsTower` (`self.tower`, built by the subclass): its class head (`text_head`), its logit
    scale (`logit_scale`, else the model's) and the tower's logits, a batch too small for its statistics refused in
    one line (norm_stats, TTAug, MEMO)."""
    tower: StatsTower

    def tower_logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalised pixels, one batch through the tower (its statistics) -> (B, C) float logits."""
        if self.model.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        try:
            with self.precision.autocast():
                features = self.tower(pixels)
        except BatchStatisticsError as exc:
            raise ValueError(f"{self.name}: {self.model.name}: {exc}") from None
        return self.scale * F.normalize(features.float(), dim=-1) @ self.head.T

    def recipe_views(self, ctx: SampleContext, why: str) -> torch.Tensor:
        """(V, 3, S, S) the sample's views of the method's recipe on the model's device; a one-line ValueError
        "<name> <why>, not stored features" where the context holds features alone (a feature store's)."""
        if ctx.views is None:
            raise ValueError(f"{self.name} {why}, not stored features")
        return ctx.views[:self.view_recipe.n_views].to(self.model.device)
