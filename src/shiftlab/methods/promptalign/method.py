"""PromptAlign: test-time tuning of MaPLe's multi-modal prompts with the alignment of the test image's token
statistics to ImageNet's, as `test_time_adapt_eval` and `test_time_tuning` compute it
(github.com/jameelhassan/PromptAlign@9290564, trainers/prompt_align.py:648-812).

Per image (episodic: every image starts from the loaded MaPLe prompts), its N views (view 0 the image):

1. the class prompts through the text tower with the text context and deep text prompts, the views through the ViT
   with their projections as deep visual prompts (methods/common/maple_prompts.py, deep_visual_prompts.py):
   logits (N, C) and every block's input tokens;
2. on the first step, the int(N * selection_ratio) lowest-entropy views for the entropy and the
   int(N * align_ratio) for the statistics (their later steps read the latter for both);
3. loss = marginal entropy of the selected views + align_weight / (to - from) * A, A the sum over blocks l in
   range(from, to - 1) of 0.5 |mean_l - m_l|_1 + 0.5 |var_l - v_l|_1 (means over elements), mean_l / var_l the
   selected views' per-token mean and biased variance at block l's input, (m, v) ImageNet's stored statistics
   (`distr_align_loss`, prompt_align.py:797-810);
4. an AdamW step on every prompt tensor (context, deep text prompts, projections); after `steps` steps, view 0's
   logits with the tuned prompts.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..common.confidence import entropy, lowest, marginal_entropy_as_tpt
from ..common.deep_visual_prompts import load_statistics, prompted_forward, view_statistics
from ..common.maple_prompts import MaPLePrompts, MaPLeText, initial_maple_prompts, load_maple_checkpoint
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import PromptAlignSpec

LOSS_SCALE = 1000.0   # torch.cuda.amp.GradScaler(init_scale=1000) (prompt_align.py:640), under fp16 only
FILES = ("means", "vars", "prompts")


def align_loss(means: torch.Tensor, variances: torch.Tensor, target_means: torch.Tensor, target_vars: torch.Tensor,
               layers: range) -> torch.Tensor:
    """Sum over `layers` of 0.5 L1(mean) + 0.5 L1(var), each the mean absolute difference ((layers, L, width))."""
    total = means.new_zeros(())
    for layer in layers:
        total = total + 0.5 * F.l1_loss(means[layer], target_means[layer].to(means)) \
            + 0.5 * F.l1_loss(variances[layer], target_vars[layer].to(variances))
    return total


class PromptAlign(EpisodicMethod):
    """Tune MaPLe's prompts per image on its confident views (entropy + token-statistics alignment)."""
    spec = PromptAlignSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        clip = self.model.clip
        visual = clip.visual
        self.blocks = len(visual.transformer.resblocks)
        width = visual.conv1.out_channels
        if cfg.align and not cfg.align_layer_from < cfg.align_layer_to - 1 <= self.blocks:
            raise ValueError(f"promptalign: align_layer_from={cfg.align_layer_from} and "
                             f"align_layer_to={cfg.align_layer_to} must give blocks range(from, to - 1) inside the "
                             f"tower's {self.blocks}")
        self.text = MaPLeText(clip, self.classnames, cfg.n_ctx, cfg.ctx_init, cfg.seed)
        text_width = self.text.init_ctx.shape[-1]
        if cfg.prompts is None:
            initial = initial_maple_prompts(self.text.init_ctx, cfg.depth, width, cfg.seed)
        else:
            initial = load_maple_checkpoint(cfg.prompts, cfg.depth, cfg.n_ctx, text_width, width)
        self.initial = initial.to(self.model.device)
        self.targets: tuple[torch.Tensor, torch.Tensor] | None = None
        if cfg.align:
            missing = [f for f in ("means", "vars") if getattr(cfg, f) is None]
            if missing:
                raise ValueError(f"promptalign aligns token statistics: set {' and '.join(missing)} (their "
                                 "ImgNetpre_vis_{means,vars}.pt files), or align=False")
            tokens = visual.positional_embedding.shape[0] + cfg.n_ctx
            means, variances = (load_statistics(getattr(cfg, f), self.blocks, tokens, width).to(self.model.device)
                                for f in ("means", "vars"))
            self.targets = (means, variances)

    def loaded_weights(self) -> dict[str, Any]:
        files = [f for f in FILES if getattr(self.config, f) is not None]
        return {f"{f}_sha256": hashlib.sha256(Path(getattr(self.config, f)).read_bytes()).hexdigest() for f in files}

    def forward(self, views: torch.Tensor, prompts: MaPLePrompts) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Normalised views (N, 3, S, S) -> (N, C) logits and the image blocks' inputs, with `prompts`."""
        with self.precision.autocast():
            text = self.text.features(prompts.ctx, prompts.deep_text)
            out = prompted_forward(self.model.clip.visual, views.to(self.model.input_dtype), prompts.visual())
        image = F.normalize(out.features.float(), dim=-1)
        return self.model.logit_scale * image @ F.normalize(text.float(), dim=-1).T, out.block_inputs

    def loss(self, logits: torch.Tensor, block_inputs: list[torch.Tensor], entropy_views: torch.Tensor,
             align_views: torch.Tensor) -> torch.Tensor:
        """The step's loss (module docstring, 3) from all views' logits and block inputs."""
        cfg = self.config
        loss = logits.new_zeros(())
        if cfg.entropy_loss:
            loss = marginal_entropy_as_tpt(logits[entropy_views])
        if cfg.align:
            means, variances = view_statistics(block_inputs, align_views)
            layers = range(cfg.align_layer_from, cfg.align_layer_to - 1)
            aligned = align_loss(means.float(), variances.float(), *self.targets, layers)
            loss = loss + cfg.align_weight / (cfg.align_layer_to - cfg.align_layer_from) * aligned
        return loss

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(entropy views, alignment views) of the first step: the lowest-entropy views, lowest first."""
        scores = entropy(logits.detach())
        return lowest(scores, self.config.selection_ratio), lowest(scores, self.config.align_ratio)

    def tune(self, views: torch.Tensor) -> tuple[MaPLePrompts, list[float]]:
        """The prompts after `steps` AdamW steps from the initial ones on one image's views, and each step's loss."""
        cfg = self.config
        prompts = MaPLePrompts(*(t.clone().requires_grad_(True) for t in self.initial))
        optimizer = torch.optim.AdamW(list(prompts), lr=cfg.lr, weight_decay=cfg.weight_decay)
        scaled = self.precision.loss_scaling
        chosen = None
        losses = []
        for _ in range(cfg.steps):
            with torch.enable_grad():
                logits, inputs = self.forward(views, prompts)
                if chosen is None:
                    chosen = self.select(logits)
                    entropy_views, align_views = chosen
                else:      # their later steps index the outputs with the alignment views (prompt_align.py:751)
                    entropy_views = align_views = chosen[1]
                loss = self.loss(logits, inputs, entropy_views, align_views)
                losses.append(float(loss.detach()))
                optimizer.zero_grad(set_to_none=True)
                (loss * LOSS_SCALE if scaled else loss).backward()
            if scaled:
                grads = [t.grad for t in prompts if t.grad is not None]
                for g in grads:
                    g.div_(LOSS_SCALE)
                if not all(bool(torch.isfinite(g).all()) for g in grads):
                    continue       # GradScaler skips the step on overflow
            optimizer.step()
        return MaPLePrompts(*(t.detach() for t in prompts)), losses

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        if ctx.views is None:
            raise ValueError("promptalign runs its prompts inside the image tower and needs the views' pixels, "
                             "not stored features")
        views = ctx.views.float()
        prompts, losses = self.tune(views)
        with torch.no_grad():
            logits, _ = self.forward(views[:1], prompts)
        return MethodOutput(logits[0], extras={"loss": losses[0]} if losses else {})
