"""HisTPT as TTABC's `ttabc/model_selection/histpt.py` (stored at 009fc22) computes it.

State along the stream: the CoOp context (never reset between samples), the SGD momentum buffer, and three memory
banks of the class text features (C, D) the prompt gave after each sample:

- short-term bank: the last `memory_size` feature sets (newest first) and each one's entropy; the first sample
  fills every slot with its own;
- hard-sample bank: `memory_size` entries, newest first; per sample the mean of the `hard_topk` short-term entries
  with the highest entropy is pushed (the first sample copies the short-term bank);
- global bank: an EMA, ema x m + (1 - m) x (short-term mean + hard mean) / 2 (the first sample: its features).

Per sample, each of `steps` steps: the pseudo-label of view 0 is the three banks' softmax predictions (each bank's
mean features normalised; the current prompt's while the banks are empty) weighted by a softmax over their negated
entropies; the loss is the soft cross-entropy of the tuned logits (view 0, or the `selection_ratio` lowest-entropy
views with `tune_on_views`) to it; one SGD step (momentum, weight decay). After the steps the banks take the tuned
features and the mean entropy of the last step's logits; the output is view 0 with the tuned prompt.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...models.text import ContextPrompt
from ...views.recipe import ViewRecipe
from ..base import MethodOutput
from ..common.confidence import entropy, select_confident
from ..common.online_common import view_features
from ..context import SampleContext
from ..kinds import OnlineMethod
from .spec import HisTPTSpec


class MemoryBanks:
    """The three banks of HisTPT's `HistoricalMemory`: `local` (L, C, D) and `entropies` (L,), `hard` (L, C, D),
    `ema` (C, D); all None until the first update."""

    def __init__(self, size: int, hard_topk: int, momentum: float):
        self.size, self.hard_topk, self.momentum = size, hard_topk, momentum
        self.local: torch.Tensor | None = None
        self.entropies: torch.Tensor | None = None
        self.hard: torch.Tensor | None = None
        self.ema: torch.Tensor | None = None
        self.last_hard: torch.Tensor | None = None    # the short-term entries the last update averaged

    def prompts(self) -> list[torch.Tensor] | None:
        """The global, short-term and hard banks' class features (3 x (C, D), normalised), or None while empty."""
        if self.local is None:
            return None
        return [F.normalize(t, dim=-1) for t in (self.ema, self.local.mean(0), self.hard.mean(0))]

    def update(self, features: torch.Tensor, entropy_value: torch.Tensor) -> None:
        """Push one sample's tuned class features (C, D) and its entropy (scalar)."""
        if self.local is None:
            self.local = features.unsqueeze(0).repeat(self.size, 1, 1)
            self.entropies = entropy_value.reshape(1).expand(self.size).clone()
            self.hard = self.local.clone()
            self.ema = features.clone()
            return
        self.local = torch.cat([features.unsqueeze(0), self.local[:-1]])
        self.entropies = torch.cat([entropy_value.reshape(1), self.entropies[:-1]])
        hardest = self.entropies.topk(self.hard_topk).indices
        self.last_hard = hardest
        self.hard = torch.cat([self.local[hardest].mean(0, keepdim=True), self.hard[:-1]])
        fresh = 0.5 * (self.local.mean(0) + self.hard.mean(0))
        self.ema = self.ema * self.momentum + fresh * (1 - self.momentum)

    def state(self) -> dict[str, Any]:
        if self.local is None:
            return {}
        return {key: getattr(self, key).detach().cpu().clone() for key in ("local", "entropies", "hard", "ema")}

    def load(self, state: dict[str, Any], device: torch.device) -> None:
        for key in ("local", "entropies", "hard", "ema"):
            setattr(self, key, state[key].to(device, torch.float32).clone() if state else None)


def fused_pseudo_label(logits_by_bank: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Three banks' logits (..., C) in the order global, short-term, hard -> their softmax probabilities weighted by
    a softmax over the negated entropies (..., C), and the weights (..., 3)."""
    probs = [z.softmax(-1) for z in logits_by_bank]
    weights = torch.stack([-entropy(z) for z in logits_by_bank], -1).softmax(-1)
    fused = weights[..., 0:1] * probs[0] + weights[..., 1:2] * probs[1] + weights[..., 2:3] * probs[2]
    return fused, weights


class HisTPT(OnlineMethod):
    """HisTPT: an online CoOp prompt tuned on pseudo-labels fused from three memory banks of its past features."""
    spec = HisTPTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        if cfg.hard_topk > cfg.memory_size:
            raise ValueError(f"{self.name}.hard_topk: {cfg.hard_topk} exceeds memory_size {cfg.memory_size} "
                             "(the hard entries are chosen among the short-term bank's)")
        if not cfg.ctx_init.strip():
            raise ValueError(f"{self.name}.ctx_init: empty; the context is initialised from its words' embeddings "
                             "(the authors': 'a photo of a')")
        self.prompt = ContextPrompt(self.model, self.classnames, ctx_init=cfg.ctx_init, share_prefix=cfg.share_prefix)
        self.prompt.ctx.requires_grad_(False)
        # their original setting tunes on view 0 alone: then only view 0 is encoded (`view_recipe`)
        self.needs_views = cfg.tune_on_views
        self.last: dict[str, Any] = {}
        self.reset()

    @property
    def view_recipe(self) -> ViewRecipe:
        return self.config.views if self.config.tune_on_views else ViewRecipe(n_views=1)

    def reset(self) -> None:
        cfg = self.config
        self.ctx = self.prompt.init_ctx.clone()
        self.momentum_buffer: torch.Tensor | None = None
        self.banks = MemoryBanks(cfg.memory_size, cfg.hard_topk, cfg.ema_momentum)
        self.seen = 0

    def _logits(self, features: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():
            logits = self.model.logit_scale * features.to(text.dtype) @ text.T
        return logits.float()

    def _sgd_step(self, grad: torch.Tensor) -> None:
        """torch.optim.SGD's update (momentum, no dampening, coupled weight decay) on the carried context."""
        cfg = self.config
        grad = grad + cfg.weight_decay * self.ctx if cfg.weight_decay else grad
        if cfg.momentum:
            if self.momentum_buffer is None:
                self.momentum_buffer = grad.clone()
            else:
                self.momentum_buffer = self.momentum_buffer * cfg.momentum + grad
            grad = self.momentum_buffer
        self.ctx = self.ctx - cfg.lr * grad

    def step(self, features: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """One sample's views (V, D) -> its logits (C,) and extras; tunes the prompt and updates the banks."""
        cfg = self.config
        tuned_on = features if cfg.tune_on_views else features[:1]
        scale = cfg.loss_scale if self.precision.loss_scaling else 1.0
        steps = []
        for _ in range(cfg.steps):
            ctx = self.ctx.clone().requires_grad_(True)
            with torch.enable_grad():
                with self.precision.autocast():
                    text = self.prompt.features(ctx)
                logits = self._logits(tuned_on, text)                                  # (V, C)
                banks = self.banks.prompts() or [text.detach()] * 3
                with torch.no_grad():
                    target, weights = fused_pseudo_label([self._logits(features[:1], b) for b in banks])
                selected = (select_confident(logits.detach().unsqueeze(0), cfg.selection_ratio)[0]
                            if cfg.tune_on_views else torch.arange(1))
                chosen = logits[selected]
                loss = torch.sum(-target * chosen.log_softmax(-1), -1).mean()
                (grad,) = torch.autograd.grad(loss * scale, ctx)
            grad = grad / scale
            steps.append({"loss": loss.detach(), "target": target[0], "weights": weights[0], "selected": selected,
                          "grad": grad})
            # GradScaler skips the step (and the momentum update) when a gradient overflows
            if bool(torch.isfinite(grad).all()):
                self._sgd_step(grad)
        sample_entropy = entropy(chosen.detach()).mean()
        with self.precision.autocast():
            tuned = self.prompt.features(self.ctx)
        self.banks.update(tuned.float(), sample_entropy)
        out = self._logits(features[:1], tuned)[0]
        self.seen += 1
        self.last = {"steps": steps, "entropy": sample_entropy}
        return out, {"loss": float(steps[0]["loss"]), "entropy": float(sample_entropy)}

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        logits, extras = self.step(view_features(ctx, self.config.views.n_views))
        return MethodOutput(logits, extras=extras)

    # -- online state --------------------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        return {"seen": self.seen,
                "ctx": self.ctx.detach().cpu().clone(),
                "momentum_buffer": None if self.momentum_buffer is None else self.momentum_buffer.cpu().clone(),
                "banks": self.banks.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        if tuple(state["ctx"].shape) != tuple(self.ctx.shape):
            raise ValueError(f"{self.name}: state holds a context of shape {tuple(state['ctx'].shape)}, this config "
                             f"{tuple(self.ctx.shape)} (context tokens, width)")
        banks = state["banks"]
        if banks and banks["local"].shape[0] != self.config.memory_size:
            raise ValueError(f"{self.name}: state holds banks of {banks['local'].shape[0]} entries, this config "
                             f"memory_size {self.config.memory_size}")
        device = self.model.device
        self.ctx = state["ctx"].to(device, torch.float32).clone()
        buf = state["momentum_buffer"]
        self.momentum_buffer = None if buf is None else buf.to(device, torch.float32).clone()
        self.banks.load(banks, device)
        self.seen = int(state["seen"])
