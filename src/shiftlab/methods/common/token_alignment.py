"""Episodic tuning of prompts inside the image tower with a token-statistics alignment loss: the machinery TAPT
(methods/tapt/) and PromptAlign (methods/promptalign/) share. Both follow TPT's `test_time_tuning` loop over one
image's N views (view 0 the image), with deep visual prompts in the ViT (deep_visual_prompts.py):

1. the views' logits (N, C) and every block's input tokens (the method's `forward`);
2. on the first step, the int(N * selection_ratio) lowest-entropy views for the entropy and the
   int(N * align_ratio) for the statistics; their later steps read the latter for both (TAPT's adv_v.py:983-984,
   PromptAlign's prompt_align.py:751);
3. loss = marginal entropy of the selected views + align_weight / (to - from) * the method's `alignment` of the
   selected views' per-token statistics (`TokenStatistics`) over the blocks range(from, to - 1) to its stored
   ones (`align_loss` per target);
4. an AdamW step on every prompt tensor; after `steps` steps, view 0's logits with the tuned prompts.

Their config fields (TAPTConfig, PromptAlignConfig): lr, steps, weight_decay, n_ctx, selection_ratio, align_ratio,
entropy_loss, align, align_layer_from, align_layer_to, align_weight, prompts (a checkpoint path or None).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..base import Method, MethodOutput
from ..context import SampleContext
from .confidence import entropy, lowest, marginal_entropy_as_tpt
from .deep_visual_prompts import load_statistics, view_statistics

# torch.cuda.amp.GradScaler(init_scale=1000) (TAPT's adv_v.py:867, PromptAlign's prompt_align.py:640): the loss
# scale of a step under fp16 only
LOSS_SCALE = 1000.0

# the prompts a method tunes: one tensor (TAPT's (layers, n_ctx, width)) or a NamedTuple of them (MaPLePrompts)
Prompts = torch.Tensor | tuple[torch.Tensor, ...]


class TokenStatistics(NamedTuple):
    means: torch.Tensor    # (blocks, L, width): per block input, token and channel
    vars: torch.Tensor


def align_loss(out: TokenStatistics, target: TokenStatistics, layers: range, kind: str = "l1") -> torch.Tensor:
    """Sum over `layers` of 0.5 d(mean) + 0.5 d(var), d the mean absolute (l1) or squared (l2) difference
    (TAPT's `onestage_align_loss`, adv_v.py:1065-1096; PromptAlign's `distr_align_loss`, the l1 case)."""
    distance = F.l1_loss if kind == "l1" else F.mse_loss
    total = out.means.new_zeros(())
    for layer in layers:
        total = total + 0.5 * distance(out.means[layer], target.means[layer].to(out.means)) \
            + 0.5 * distance(out.vars[layer], target.vars[layer].to(out.vars))
    return total


def file_digests(config: Any, fields: Sequence[str]) -> dict[str, str]:
    """`{field}_sha256`: the SHA-256 of the file each of `fields` names, for the fields that name one."""
    return {f"{f}_sha256": hashlib.sha256(Path(getattr(config, f)).read_bytes()).hexdigest()
            for f in fields if getattr(config, f) is not None}


def prompt_tensors(prompts: Prompts) -> list[torch.Tensor]:
    return [prompts] if isinstance(prompts, torch.Tensor) else list(prompts)


def like_prompts(prompts: Prompts, tensors: Sequence[torch.Tensor]) -> Prompts:
    """`tensors` in the form of `prompts` (one tensor, or the same NamedTuple)."""
    return tensors[0] if isinstance(prompts, torch.Tensor) else type(prompts)(*tensors)


class TokenAlignmentTuning(Method):
    """The loop above; a method gives `initial` (its Prompts), `forward(views, prompts) -> (logits (N, C), block
    inputs)` and `alignment(out, layers)` (its stored statistics against the views'); its spec
    (token_alignment_spec.TokenAlignmentSpec) names the statistics files `load_targets` reads."""
    initial: Prompts

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.blocks = len(self.model.clip.visual.transformer.resblocks)
        if cfg.align and not cfg.align_layer_from < cfg.align_layer_to - 1 <= self.blocks:
            raise ValueError(f"{self.name}: align_layer_from={cfg.align_layer_from} and "
                             f"align_layer_to={cfg.align_layer_to} must give blocks range(from, to - 1) inside the "
                             f"tower's {self.blocks}")

    def load_targets(self) -> dict[str, TokenStatistics]:
        """The stored statistics of each target ({} without alignment), checked against the tower (blocks, 1 +
        patches + n_ctx tokens, width)."""
        cfg = self.config
        if not cfg.align:   # with it, the spec's config_problem has refused a config without the files
            return {}
        visual = self.model.clip.visual
        tokens, width = visual.positional_embedding.shape[0] + cfg.n_ctx, visual.conv1.out_channels

        def load(field: str) -> torch.Tensor:
            return load_statistics(getattr(cfg, field), self.blocks, tokens, width).to(self.model.device)
        return {target: TokenStatistics(load(means), load(variances))
                for target, (means, variances) in self.spec.statistics_files.items()}

    def loaded_weights(self) -> dict[str, Any]:
        return file_digests(self.config, [*(f for pair in self.spec.statistics_files.values() for f in pair),
                                          "prompts"])

    def forward(self, views: torch.Tensor, prompts: Prompts) -> tuple[torch.Tensor, list[torch.Tensor]]:
        raise NotImplementedError

    def alignment(self, out: TokenStatistics, layers: range) -> torch.Tensor:
        """The views' statistics `out` against the stored ones over `layers` (a scalar)."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, block_inputs: list[torch.Tensor], entropy_views: torch.Tensor,
             align_views: torch.Tensor) -> torch.Tensor:
        """The step's loss (module docstring, 3) from all views' logits and block inputs."""
        cfg = self.config
        loss = logits.new_zeros(())
        if cfg.entropy_loss:
            loss = marginal_entropy_as_tpt(logits[entropy_views])
        if cfg.align:
            means, variances = view_statistics(block_inputs, align_views)
            aligned = self.alignment(TokenStatistics(means.float(), variances.float()),
                                     range(cfg.align_layer_from, cfg.align_layer_to - 1))
            loss = loss + cfg.align_weight / (cfg.align_layer_to - cfg.align_layer_from) * aligned
        return loss

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(entropy views, alignment views) of the first step: the lowest-entropy views, lowest first."""
        scores = entropy(logits.detach())
        return lowest(scores, self.config.selection_ratio), lowest(scores, self.config.align_ratio)

    def step_loss(self, views: torch.Tensor, prompts: Prompts, chosen: tuple[torch.Tensor, torch.Tensor] | None
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """A step's loss on the views with `prompts`, and the views the first step chose (`chosen`: None on it)."""
        logits, inputs = self.forward(views, prompts)
        if chosen is None:
            chosen = self.select(logits)
            entropy_views, align_views = chosen
        else:      # their later steps index the outputs with the alignment views
            entropy_views = align_views = chosen[1]
        return self.loss(logits, inputs, entropy_views, align_views), chosen

    def tune(self, views: torch.Tensor) -> tuple[Prompts, list[float]]:
        """The prompts after `steps` AdamW steps from the initial ones on one image's views, and each step's loss."""
        cfg = self.config
        tensors = [t.clone().requires_grad_(True) for t in prompt_tensors(self.initial)]
        prompts = like_prompts(self.initial, tensors)
        optimizer = torch.optim.AdamW(tensors, lr=cfg.lr, weight_decay=cfg.weight_decay)
        scaled = self.precision.loss_scaling
        chosen = None
        losses = []
        for _ in range(cfg.steps):
            with torch.enable_grad():
                loss, chosen = self.step_loss(views, prompts, chosen)
                losses.append(float(loss.detach()))
                optimizer.zero_grad(set_to_none=True)
                (loss * LOSS_SCALE if scaled else loss).backward()
            if scaled:
                grads = [t.grad for t in tensors if t.grad is not None]
                for g in grads:
                    g.div_(LOSS_SCALE)
                if not all(bool(torch.isfinite(g).all()) for g in grads):
                    continue       # GradScaler skips the step on overflow
            optimizer.step()
        return like_prompts(self.initial, [t.detach() for t in tensors]), losses

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        if ctx.views is None:
            raise ValueError(f"{self.name} runs its prompts inside the image tower and needs the views' pixels, "
                             "not stored features")
        views = ctx.views.float()
        prompts, losses = self.tune(views)
        with torch.no_grad():
            logits, _ = self.forward(views[:1], prompts)
        return MethodOutput(logits[0], extras={"loss": losses[0]} if losses else {})
