"""PromptAlign: test-time tuning of MaPLe's multi-modal prompts with the alignment of the test image's token
statistics to ImageNet's, as `test_time_adapt_eval` and `test_time_tuning` compute it
(github.com/jameelhassan/PromptAlign@9290564, trainers/prompt_align.py:648-812).

Per image (episodic: every image starts from the loaded MaPLe prompts), its N views (view 0 the image), the loop of
methods/common/token_alignment.py:

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

from typing import Any

import torch
import torch.nn.functional as F

from ..common.deep_visual_prompts import prompted_forward
from ..common.maple_prompts import MaPLePrompts, MaPLeText, initial_maple_prompts, load_maple_checkpoint
from ..common.token_alignment import TokenAlignmentTuning, TokenStatistics
from ..common.token_alignment import align_loss as statistics_align_loss
from ..kinds import EpisodicMethod
from .spec import PromptAlignSpec


def align_loss(means: torch.Tensor, variances: torch.Tensor, target_means: torch.Tensor, target_vars: torch.Tensor,
               layers: range) -> torch.Tensor:
    """Sum over `layers` of 0.5 L1(mean) + 0.5 L1(var), each the mean absolute difference ((layers, L, width)):
    `distr_align_loss`'s arguments (prompt_align.py:797-810)."""
    return statistics_align_loss(TokenStatistics(means, variances), TokenStatistics(target_means, target_vars), layers)


class PromptAlign(TokenAlignmentTuning, EpisodicMethod):
    """Tune MaPLe's prompts per image on its confident views (entropy + token-statistics alignment)."""
    spec = PromptAlignSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        clip = self.model.clip
        self.text = MaPLeText(clip, self.classnames, cfg.n_ctx, cfg.ctx_init, cfg.seed)
        text_width, width = self.text.init_ctx.shape[-1], clip.visual.conv1.out_channels
        if cfg.prompts is None:
            initial = initial_maple_prompts(self.text.init_ctx, cfg.depth, width, cfg.seed)
        else:
            initial = load_maple_checkpoint(cfg.prompts, cfg.depth, cfg.n_ctx, text_width, width, self.trust_checkpoint)
        self.initial = initial.to(self.model.device)
        self.targets: TokenStatistics | None = self.load_targets().get("imagenet")

    def forward(self, views: torch.Tensor, prompts: MaPLePrompts) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Normalised views (N, 3, S, S) -> (N, C) logits and the image blocks' inputs, with `prompts`."""
        with self.precision.autocast():
            text = self.text.features(prompts.ctx, prompts.deep_text)
            out = prompted_forward(self.model.clip.visual, views.to(self.model.input_dtype), prompts.visual())
        image = F.normalize(out.features.float(), dim=-1)
        return self.model.logit_scale * image @ F.normalize(text.float(), dim=-1).T, out.block_inputs

    def alignment(self, out: TokenStatistics, layers: range) -> torch.Tensor:
        """A against ImageNet's statistics (module docstring, 3)."""
        return align_loss(*out, *self.targets, layers)
