"""Episodic test-time prompt tuning: the machinery its family shares (TPT, C-TPT, O-TPT and R-TPT: methods/tpt/;
TIPPLE's stage II: methods/tipple/; RLCF's student: methods/rlcf/). Its torch-free half, the config and the
spec the family shares: prompt_tuning_config.py.

One recipe (TPT, Shu et al. 2022): learnable context vectors start from the
embeddings of "a photo of a" for every image; the image tower is frozen, so the
views are encoded once and only the text tower runs per step; the most confident
views (lowest entropy) give an unsupervised loss; AdamW takes `steps` steps.

Several images are tuned together as one batch: each has its own context rows and,
because AdamW is elementwise, its own optimizer state, so results equal tuning the
images one at a time.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ...models.text import ContextPrompt
from ..base import Method, MethodOutput, in_groups
from ..context import SampleContext
from .confidence import marginal_entropy, select_confident
from .torch_files import read_torch_file


def read_ctx_checkpoint(path: str, field: str, width: int) -> torch.Tensor:
    """The learnt context (n_ctx, width) of a CoOp checkpoint (`{"state_dict": {"prompt_learner.ctx": ...}}` or the
    state dict itself: its first key ending in "ctx"), read weights-only; a file that is missing, is no torch file,
    holds no such tensor or one of another width is a one-line ValueError naming `field` (the setting) and the path."""
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise ValueError(f"{field}: {path}: no such file")
    state = read_torch_file(path, f"{field}:")
    state = state.get("state_dict", state) if isinstance(state, dict) else None
    ctx = next((v for k, v in state.items() if str(k).endswith("ctx")), None) if isinstance(state, dict) else None
    if not isinstance(ctx, torch.Tensor):
        raise ValueError(f"{field}: {path} holds no context tensor (a key ending in 'ctx', as CoOp's "
                         "prompt_learner.ctx)")
    if ctx.dim() == 3 and ctx.shape[0] == 1:
        ctx = ctx[0]
    if ctx.dim() != 2 or ctx.shape[1] != width:
        raise ValueError(f"{field}: {path} holds a context of shape {tuple(ctx.shape)}; the model's text tower takes "
                         f"(n_ctx, {width})")
    return ctx


class PromptTuning(Method):
    """TPT's recipe: the marginal entropy of the confident views, predict view 0; a variant overrides `loss`,
    `readout` or `on_selection` (its spec: a `PromptTuningSpec`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        init: str | torch.Tensor | None = cfg.ctx_init
        if cfg.ctx_checkpoint:
            init = read_ctx_checkpoint(cfg.ctx_checkpoint, f"{self.name}.ctx_checkpoint",
                                       self.model.clip.token_embedding.weight.shape[1])
        self.prompt = ContextPrompt(self.model, self.classnames, n_ctx=cfg.n_ctx, ctx_init=init,
                                    share_prefix=cfg.share_prefix)
        self.prompt.ctx.requires_grad_(False)

    def prepare(self) -> None:
        super().prepare()
        if self.config.steps > 0:
            self._initial_text_graph()

    def _initial_text_graph(self) -> tuple[torch.nn.Parameter, torch.Tensor]:
        """Class features at the initial context (C, D) with their autograd graph, computed once per run.

        The first tuning step of every image starts from the same context, so its text forward is
        the same computation each time; TPT, C-TPT and R-TPT of one run share it too (same prompt,
        same precision). Each image then costs one backward through this retained graph."""
        cfg = self.config
        key = ("initial_prompt_graph", cfg.n_ctx, cfg.ctx_init, cfg.ctx_checkpoint, self.prompt.share_prefix,
               self.precision.key)
        shared = self.heads.shared
        if key not in shared:
            ctx0 = torch.nn.Parameter(self.prompt.init_ctx.clone())
            with torch.enable_grad(), self.precision.autocast():
                shared[key] = (ctx0, self.prompt.features(ctx0))
        return shared[key]

    # -- variant hooks ------------------------------------------------------------
    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Per-sample losses (B,) and per-sample extras {name: (B,) tensor}: TPT's marginal entropy of the
        selected views."""
        return marginal_entropy(selected_logits), {}

    def on_selection(self, selected: torch.Tensor) -> None:
        """The views the first step selected (B, k), once per tuning, before the first loss (RLCF encodes
        them with its reward model here)."""

    def select(self, view_logits: torch.Tensor) -> torch.Tensor:
        """The views the loss reads, chosen once at the first step: (B, N, C) logits -> (B, k) view indices; TPT's
        lowest-entropy `selection_ratio` of them (DiffTPT filters by cosine similarity to view 0 first)."""
        return select_confident(view_logits, self.config.selection_ratio)

    def tuning_features(self, ctxs: Sequence[SampleContext]) -> torch.Tensor:
        """The (B, N, D) frozen view features a group of samples is tuned and read out on, view 0 first: the
        contexts' own views (DiffTPT appends its diffusion views)."""
        return torch.stack([c.image_features for c in ctxs])

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Tuned class features (B, C, D) -> logits (B, C) and extras."""
        scale = self.model.logit_scale
        return scale * torch.einsum("bd,bcd->bc", image_features[:, 0], text_features), {}

    # -- the tuning loop ----------------------------------------------------------
    def tune(self, image_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(B, N, D) frozen view features -> tuned context (B, n_ctx, W) and per-sample extras."""
        cfg = self.config
        b = image_features.shape[0]
        ctx = torch.nn.Parameter(self.prompt.init_ctx.unsqueeze(0).repeat(b, 1, 1))
        optimizer = torch.optim.AdamW([ctx], lr=cfg.lr, weight_decay=cfg.weight_decay)
        scale = self.model.logit_scale
        scaled = self.precision.loss_scaling
        selected = None
        extras: dict[str, torch.Tensor] = {}
        for step in range(cfg.steps):
            if step == 0:
                # every image's first step starts from the same context: reuse the run's shared forward
                ctx0, text0 = self._initial_text_graph()
                text = text0.detach().unsqueeze(0).repeat(b, 1, 1).requires_grad_(True)   # (B, C, D)
            else:
                with self.precision.autocast():
                    text = self.prompt.features(ctx)                                   # (B, C, D)
            with self.precision.autocast():
                logits = scale * torch.einsum("bnd,bcd->bnc", image_features.to(text.dtype), text)
            logits = logits.float()
            if selected is None:  # the authors select once, at the first step, and keep the views
                selected = self.select(logits.detach())   # (B, k)
                self.on_selection(selected)
            chosen = torch.gather(logits, 1, selected.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
            losses, step_extras = self.loss(chosen, text.float())
            extras.setdefault("loss", losses.detach())
            for key, val in step_extras.items():
                extras.setdefault(key, val.detach())
            optimizer.zero_grad(set_to_none=True)
            before = ctx.detach().clone()
            total = losses.sum() * (cfg.loss_scale if scaled else 1.0)
            if step == 0:
                (grad_text,) = torch.autograd.grad(total, text)
                # one backward through the shared graph per image (the cotangents differ)
                ctx.grad = torch.stack([torch.autograd.grad(text0, ctx0, g, retain_graph=True)[0]
                                        for g in grad_text]).to(ctx.dtype)
            else:
                total.backward()
            if scaled:
                ctx.grad.div_(cfg.loss_scale)
            finite = torch.isfinite(ctx.grad).flatten(1).all(-1)
            optimizer.step()
            if scaled and not bool(finite.all()):
                # GradScaler skips the step on overflow; do so per image
                with torch.no_grad():
                    ctx[~finite] = before[~finite]
        if selected is not None:  # steps=0: no tuning, nothing selected (zero-shot with the prompt)
            extras["selected"] = selected
        return ctx.detach(), extras

    def auto_batch_size(self, n: int) -> int:
        """Images tuned together: 1 on CPU (keeps peak memory low); on CUDA as many as half the free
        memory holds, from the text tower's activation footprint per image."""
        if self.config.batch_size:
            return self.config.batch_size
        if self.model.device.type != "cuda":
            return 1
        clip = self.prompt.clip
        width = clip.token_embedding.weight.shape[1]
        layers = len(clip.transformer.resblocks)
        bytes_per = 2 if self.precision.amp_dtype is not None else 4
        # ~20 saved activations of `width` per token and layer (attention, MLP at 4x width, norms)
        per_image = self.prompt.n_classes * self.prompt.length * width * layers * 20 * bytes_per
        free, _ = torch.cuda.mem_get_info(self.model.device)
        return int(max(1, min(n, (free // 2) // max(per_image, 1))))

    def predict_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        return in_groups(ctxs, self.auto_batch_size(len(ctxs)), self._predict_group)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self._predict_group([ctx])[0]

    def _predict_group(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        feats = self.tuning_features(ctxs)                                         # (B, N, D)
        with torch.enable_grad():
            tuned, extras = self.tune(feats)
        with torch.no_grad(), self.precision.autocast():
            text = self.prompt.features(tuned).float()
        logits, read_extras = self.readout(feats, text)
        extras.update(read_extras)
        outputs = []
        for i in range(len(ctxs)):
            ex = {k: _scalar(v[i]) for k, v in extras.items() if k != "selected"}
            if "selected" in extras:
                ex["selected"] = extras["selected"][i].tolist()
            outputs.append(MethodOutput(logits[i].float(), extras=ex))
        return outputs


class PenalisedPromptTuning(PromptTuning):
    """TPT's marginal entropy of the selected views + a signed weight x a penalty of the class text features, in
    the same forward pass (C-TPT, O-TPT, N-TPT, A-TPT); the loss's extras hold both terms, the readout's the penalty
    of the tuned features (`<penalty_name>_after`)."""
    penalty_name = ""

    def penalty(self, text_features: torch.Tensor) -> torch.Tensor:
        """(B, C, D) class features -> (B,) the penalty."""
        raise NotImplementedError

    def penalty_weight(self) -> float:
        """The penalty's signed weight in the loss."""
        raise NotImplementedError

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        entropy_loss = marginal_entropy(selected_logits)
        penalty = self.penalty(text_features)
        return (entropy_loss + self.penalty_weight() * penalty,
                {"entropy_loss": entropy_loss, self.penalty_name: penalty})

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logits, _ = super().readout(image_features, text_features)
        return logits, {f"{self.penalty_name}_after": self.penalty(text_features)}


def _scalar(value: torch.Tensor):
    return float(value) if value.numel() == 1 else value.tolist()
