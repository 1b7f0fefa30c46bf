"""Phase timing of the engine step: where a batch's seconds go.

`Runner.step` (shiftlab.engine.step) reports every phase to a `PhaseTimer`:

- `decode_views`: decoding and view generation done in-process (`Runner.load`; in a run the
  DataLoader workers do this, outside the step),
- `attack`: perturbing the batch (attacked settings only),
- `encode`: the image tower over the views of a recipe,
- `store_read`: reading a sample's view features from the run's feature store (`--features`),
- `predict:<method>`: the method's whole prediction for the batch,
- `text:<method>`: of which, with `text=True`, the method's text tower (prompt tuning: the
  `prompt.features` forward calls and the backward passes through them).

The text tower is timed per instance, never by patching torch: each prompt's `features` is
wrapped (an attribute of that instance) so that its input and output pass through identity
autograd nodes that note when the gradient enters and leaves the text tower. This also times
backward passes through a graph built once in `prepare()` and reused per image, provided the
wrapper was installed before `prepare()` (the Evaluator does that when given a text timer).
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch


class PhaseTimer:
    """Seconds per phase name. `now` is the clock (the benchmark's synchronises CUDA)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter, text: bool = False):
        self.now = now
        self.text = text                      # time the text tower separately (wraps prompt.features)
        self.seconds: dict[str, float] = defaultdict(float)
        self.current_method: str | None = None

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = self.now()
        try:
            yield
        finally:
            self.add(name, self.now() - t0)

    def take(self) -> dict[str, float]:
        """The accumulated seconds, and start again from zero."""
        out = dict(self.seconds)
        self.seconds.clear()
        return out


class _Mark(torch.autograd.Function):
    """Identity whose backward calls `callback` when the gradient passes."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, callback: Callable[[], None]) -> torch.Tensor:
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        ctx.callback()
        return grad, None


@contextlib.contextmanager
def text_tower_timer(method: Any, now: Callable[[], float],
                     sink: Callable[[float], None] | None = None) -> Iterator[list[float]]:
    """Seconds in a prompt-tuning method's text tower: its `prompt.features` calls and the backward
    passes through them. Yields a one-element list that accumulates the seconds (each addition is
    also passed to `sink`); a method without a `prompt` yields [0.0]. Only the method's own prompt
    instance is touched, and restored on exit."""
    box = [0.0]
    prompt = getattr(method, "prompt", None)
    if prompt is None or not hasattr(prompt, "features"):
        yield box
        return
    features = prompt.features
    entered: list[float] = []

    def add(seconds: float) -> None:
        box[0] += seconds
        if sink is not None:
            sink(seconds)

    def grad_in() -> None:
        entered.append(now())

    def grad_out() -> None:
        if entered:
            add(now() - entered.pop())

    def timed(ctx: torch.Tensor | None = None, *args, **kwargs):
        t0 = now()
        if ctx is not None and torch.is_grad_enabled() and ctx.requires_grad:
            out = _Mark.apply(features(_Mark.apply(ctx, grad_out), *args, **kwargs), grad_in)
        else:
            out = features(ctx, *args, **kwargs)
        add(now() - t0)
        return out

    prompt.features = timed
    try:
        yield box
    finally:
        del prompt.features
