"""CALIP: parameter-free attention between the image tower's spatial tokens and the class features.

As its authors' code computes it (github.com/ZiyuGuo99/CALIP@83e21b6, run_imagenet.py:68-92), per image:

1. every token of the image tower, projected and L2-normalised (`shiftlab.models.tower_tokens`): token 0 the
   global feature g (D), then the P spatial tokens F (P, D);
2. the attention A = scale x F T^T (P, C) against the normalised class features T (C, D), softmaxed over the
   positions (A_p) and over the classes (A_c);
3. the class features attended by the image, A_p^T F (C, D), read against g: l1 = s (A_p^T F) g;
   the positions attended by the class features, A_c T (P, D), pooled by mean + max over the positions into
   v (D) and read against the classes: l2 = s T v;
4. logits = s T g + beta_text l1 + beta_visual l2 (s: the logit scale, their literal 100).

It reads view 0's pixels and runs the frozen tower itself (once per image, batched across a batch's images):
the spatial tokens are not in the pooled features a run encodes or a feature store keeps.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ...models.tower_tokens import image_tokens, tower_kind
from ..base import MethodOutput
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import EpisodicMethod
from .spec import CALIPSpec


def calip_attention_logits(global_feats: torch.Tensor, spatial: torch.Tensor, text: torch.Tensor,
                           attention_scale: float, logit_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, D) global features, (N, P, D) spatial tokens (both normalised), (C, D) class features ->
    (l1, l2), each (N, C): the class features attended by each image's tokens against its global feature,
    and its tokens attended by the class features (mean + max over positions) against the class features."""
    attention = attention_scale * spatial @ text.T                       # (N, P, C)
    over_positions = attention.softmax(dim=1)
    over_classes = attention.softmax(dim=2)
    text_attended = over_positions.transpose(1, 2) @ spatial             # (N, C, D)
    l1 = logit_scale * (text_attended @ global_feats.unsqueeze(-1)).squeeze(-1)
    visual_attended = over_classes @ text                                # (N, P, D)
    pooled = visual_attended.mean(dim=1) + visual_attended.max(dim=1).values
    l2 = logit_scale * pooled @ text.T
    return l1, l2


class CALIP(EpisodicMethod):
    """CALIP: zero-shot logits plus two parameter-free attention readings of view 0's spatial tokens."""
    spec = CALIPSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        try:
            tower_kind(self.model.clip.visual)
        except ValueError as exc:
            raise ValueError(f"calip: {self.model.name}: {exc}") from None

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised images (N, 3, S, S) -> (N, 1 + P, D) normalised float32 tokens of the frozen tower."""
        if self.model.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), self.precision.autocast():
            tokens = image_tokens(self.model.clip.visual, images.to(self.model.input_dtype))
        return F.normalize(tokens.float(), dim=-1)

    def scores(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, 1 + P, D) normalised tokens -> (logits, l1, l2), each (N, C)."""
        cfg = self.config
        text = text_head(self).float()
        scale = cfg.logit_scale if cfg.logit_scale is not None else self.model.logit_scale
        global_feats, spatial = tokens[:, 0], tokens[:, 1:]
        l1, l2 = calip_attention_logits(global_feats, spatial, text, cfg.attention_scale, scale)
        logits = scale * global_feats @ text.T + cfg.beta_text * l1 + cfg.beta_visual * l2
        return logits, l1, l2

    def predict_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        for ctx in ctxs:
            if ctx.views is None:
                raise ValueError("calip reads the image tower's spatial tokens and needs view 0's pixels, "
                                 "not stored features")
        # one tower pass for the batch's images (equal sizes: the run's preprocessing)
        logits, _, _ = self.scores(self.tokens(torch.stack([ctx.views[0] for ctx in ctxs])))
        return [MethodOutput(row) for row in logits]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self.predict_batch([ctx])[0]
