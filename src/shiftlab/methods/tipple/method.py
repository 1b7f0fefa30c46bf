"""TIPPLE: a task-level prompt learned over the whole unlabelled test set, then TPT from it per image.

Stage I (the engine's test-set pass, then `end_test_set`): every test image's weak and strong views
(spec.weak_recipe / spec.strong_recipe, one of each per epoch) are encoded once by the frozen image tower;
the context of "a photo of a" is then trained for `task_epochs` epochs over shuffled batches of
`task_batch_size` images: the weak views' confident predictions (max probability > `task_threshold`, else
the single most confident) are pseudo-labels for the strong views (cross-entropy), plus a diversity term
(minus the entropy of the batch's mean prediction) that keeps the prompt from collapsing onto few classes.
Only the text tower runs per step, as in TPT. Stage II (the stream): TPT's episodic tuning (common/prompt_tuning.py),
starting from the task prompt instead of "a photo of a".
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ...views.recipe import ViewRecipe
from ..common.prompt_tuning import PromptTuning
from ..context import SampleContext
from ..kinds import TestSetMethod
from .spec import TIPPLESpec, strong_recipe, weak_recipe

WEAK, STRONG = "weak", "strong"


def confident_pseudo_labels(weak_logits: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) weak-view logits -> (indices of the views whose max probability exceeds `threshold`, or the one
    most confident view when none does (the first of equals); their argmax classes). main.py:32-48@fe1747e."""
    conf, pred = weak_logits.detach().softmax(-1).max(-1)
    idx = (conf > threshold).nonzero().flatten()
    if idx.numel() == 0:
        idx = conf.argmax().view(1)
    return idx, pred[idx]


def negative_entropy_of_mean(logits: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(B, C) -> sum_c p_c log(p_c + eps) of the batch's mean probability p: main.py:66-70's `div`, which
    the loss adds, so minimising it spreads the batch's predictions over the classes."""
    mean = logits.softmax(-1).mean(0)
    return (mean * torch.log(mean + eps)).sum()


def task_loss(weak_logits: torch.Tensor, strong_logits: torch.Tensor, threshold: float,
              diversity: float) -> tuple[torch.Tensor, dict[str, Any]]:
    """Stage I's loss of one batch (main.py:208-223): cross-entropy of the strong views' logits on the
    confident weak views' pseudo-labels + diversity x (B / selected) x the mean of both views' `div`.
    (B, C) each -> a scalar and what it was made of."""
    idx, labels = confident_pseudo_labels(weak_logits, threshold)
    ce = F.cross_entropy(strong_logits[idx], labels)
    div = (negative_entropy_of_mean(weak_logits) + negative_entropy_of_mean(strong_logits)) / 2
    loss = ce + diversity * (weak_logits.shape[0] / idx.numel()) * div
    return loss, {"selected": idx, "cross_entropy": ce.detach(), "diversity": div.detach()}


def task_batches(n: int, batch_size: int, epochs: int, seed: int, shuffle: bool = True) -> list[list[torch.Tensor]]:
    """Per epoch, the test set's positions 0..n-1 in batches of `batch_size` (the last one shorter): a fresh
    permutation per epoch from a generator seeded by `seed` (a DataLoader with shuffle=True draws one
    permutation per epoch), or in order."""
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen) if shuffle else torch.arange(n)
        out.append(list(order.split(batch_size)))
    return out


class TIPPLE(PromptTuning, TestSetMethod):
    """TPT's stage II from a task prompt that `end_test_set` learns over the test set (stage I)."""
    spec = TIPPLESpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._weak: list[torch.Tensor] = []      # per test image: (epochs, D) weak-view features
        self._strong: list[torch.Tensor] = []
        self._graph: tuple[torch.nn.Parameter, torch.Tensor] | None = None
        # stage I, per step: epoch, lr, loss, the selected weak views (positions in the batch), images
        self.task_log: list[dict[str, Any]] = []

    # -- stage I ------------------------------------------------------------------------------------------
    @property
    def test_set_views(self) -> dict[str, ViewRecipe]:
        """The views the test-set pass draws for stage I: per image, the original then one weak (strong) view
        per epoch, each recipe from its own seed stream (their DataLoader draws fresh views every epoch)."""
        epochs = self.config.task_epochs
        return {WEAK: weak_recipe(epochs), STRONG: strong_recipe(epochs)}

    def observe_test_set(self, views: Mapping[str, Sequence[SampleContext]]) -> None:  # type: ignore[override]
        """One group of test images: their weak and strong contexts (`test_set_views`), whose view features
        after the original are kept (the image tower is frozen: stage I never encodes again)."""
        for weak, strong in zip(views[WEAK], views[STRONG], strict=True):
            self._weak.append(weak.image_features[1:].float())
            self._strong.append(strong.image_features[1:].float())

    def end_test_set(self) -> None:
        """Stage I over every observed image; the task prompt becomes stage II's starting context."""
        if not self._weak:
            raise ValueError(f"{self.name}: the test set is empty: stage I has no image to learn the task prompt from")
        weak, strong = torch.stack(self._weak), torch.stack(self._strong)       # (N, epochs, D)
        self._weak, self._strong = [], []
        cfg = self.config
        batches = task_batches(len(weak), cfg.task_batch_size, cfg.task_epochs, self.test_set_seed, cfg.task_shuffle)
        task = self.learn_task_prompt(weak, strong, batches)
        with torch.no_grad():
            self.prompt.init_ctx.copy_(task)
            self.prompt.ctx.copy_(task)
        self._graph = None

    def learn_task_prompt(self, weak: torch.Tensor, strong: torch.Tensor,
                          batches: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
        """Stage I (main.py:142-154, 186-251): AdamW on the context from its initial value, epoch e over
        `batches[e]` (positions into the (N, epochs, D) weak/strong features, epoch e reading view e) at lr
        task_lr / task_lr_decay**e. Returns the task context (n_ctx, W); `task_log` says each step."""
        cfg = self.config
        ctx = torch.nn.Parameter(self.prompt.init_ctx.clone())
        optimizer = torch.optim.AdamW([ctx], lr=cfg.task_lr, weight_decay=cfg.weight_decay)
        scale = self.model.logit_scale
        scaled = self.precision.loss_scaling
        loss_scale = cfg.loss_scale
        self.task_log = []
        with torch.enable_grad():
            for epoch, epoch_batches in enumerate(batches):
                lr = cfg.task_lr / cfg.task_lr_decay ** epoch
                for group in optimizer.param_groups:
                    group["lr"] = lr
                for idx in epoch_batches:
                    with self.precision.autocast():
                        text = self.prompt.features(ctx)                                    # (C, D)
                        feats = torch.cat([weak[idx, epoch], strong[idx, epoch]]).to(text.dtype)
                        logits = (scale * feats @ text.t()).float()
                    weak_logits, strong_logits = logits.split(len(idx))
                    loss, parts = task_loss(weak_logits, strong_logits, cfg.task_threshold, cfg.task_diversity)
                    optimizer.zero_grad(set_to_none=True)
                    (loss * (loss_scale if scaled else 1.0)).backward()
                    if scaled:
                        ctx.grad.div_(loss_scale)
                    finite = bool(torch.isfinite(ctx.grad).all())
                    if finite or not scaled:
                        optimizer.step()
                    else:   # GradScaler skips the step on overflow and halves its scale
                        loss_scale /= 2
                    self.task_log.append({"epoch": epoch, "lr": lr, "loss": float(loss.detach()),
                                          "selected": parts["selected"].tolist(), "images": len(idx)})
        return ctx.detach()

    # -- stage II: TPT from the task prompt ---------------------------------------------------------------
    def prepare(self) -> None:
        _ = self.heads.zeroshot   # the initial text graph waits for the task prompt (`_initial_text_graph`)

    def _initial_text_graph(self) -> tuple[torch.nn.Parameter, torch.Tensor]:
        """The class features at the task prompt with their graph, once per run (its own: not the prompt
        tuners' shared one at "a photo of a")."""
        if self._graph is None:
            ctx0 = torch.nn.Parameter(self.prompt.init_ctx.clone())
            with torch.enable_grad(), self.precision.autocast():
                self._graph = (ctx0, self.prompt.features(ctx0))
        return self._graph
