"""SCAP's two prompts over open_clip's towers, as their `ClipTestTimeTuning` (clip/my_clip_CSTP.py,
zhoujiahuan1991/CVPR2025-SCAP@5057c96) computes them, as pure functions of the frozen towers' own modules:

- the image prompt (L, 2h, W): in each of the blocks `layers`, h key tokens and h value tokens inserted after the
  class token into that block's attention (prefix tuning: the queries, and so the sequence, stay as they are;
  my_clip_CSTP.py:556-589), the tokens not layer-normed;
- the text prompt (C, p, W): the token embeddings of each class's first template at positions 1..p (the words
  before "CLS"), learnt per class, mixed with the fixed ensemble feature of the other templates before
  normalising (my_clip_CSTP.py:277-293, 677-687).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.head_cache import cached_head
from ...models.text import _eot_positions, _tower_length, run_text_tower, tokenize


def prompted_block(block: nn.Module, x: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
    """One open_clip ResidualAttentionBlock (batch first) on (B, N, W) tokens with `prompt` (2h, W): its first h
    rows are extra keys, its last h extra values, placed after the class token -> (B, N, W)."""
    q = block.ln_1(x)
    half = prompt.shape[0] // 2
    keys = prompt[:half].to(q.dtype).expand(q.shape[0], -1, -1)
    values = prompt[half:].to(q.dtype).expand(q.shape[0], -1, -1)
    k = torch.cat([q[:, :1], keys, q[:, 1:]], dim=1)
    v = torch.cat([q[:, :1], values, q[:, 1:]], dim=1)
    x = x + block.ls_1(block.attn(q, k, v, need_weights=False)[0])
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def prompted_image_features(visual: nn.Module, pixels: torch.Tensor, prompt: torch.Tensor,
                            layers: Sequence[int]) -> torch.Tensor:
    """Normalised images (B, 3, S, S) through open_clip's ViT with the image prompt (len(layers), 2h, W) in the
    blocks `layers` -> (B, D) features, not normalised (class token, ln_post, proj: CLIP's pooling)."""
    x = visual._embeds(pixels)
    for i, block in enumerate(visual.transformer.resblocks):
        x = prompted_block(block, x, prompt[layers.index(i)]) if i in layers else block(x)
    pooled, _ = visual._pool(x)
    return pooled @ visual.proj


def check_tower(visual: nn.Module, layers: Sequence[int]) -> str | None:
    """Why the ViT cannot take the prompt in `layers` (a block it lacks, sequence-first attention), else None."""
    blocks = visual.transformer.resblocks
    bad = [i for i in layers if not 0 <= i < len(blocks)]
    if bad or len(set(layers)) != len(layers):
        return f"scap.prompt_layers {tuple(layers)} must name distinct blocks of its ViT, 0..{len(blocks) - 1}"
    if not all(getattr(blocks[i].attn, "batch_first", False) for i in layers):
        return "its ViT's attention is not batch-first (open_clip's is)"
    return None


class TemplateText:
    """The text side: the first template's token embeddings split around the learnt context (positions 1..p, p the
    number of words before "CLS", as their `len(template.split(' ')) - 1`), and the other templates' unnormalised
    features averaged (`ensemble`, (C, D))."""

    def __init__(self, clip: nn.Module, classnames: Sequence[str], templates: Sequence[str], device: torch.device):
        self.clip = clip
        first = templates[0]
        self.n_ctx = len(first.split(" ")) - 1
        tokens = tokenize([first.replace("CLS", c) for c in classnames], clip.context_length).to(device)
        self.eot = _eot_positions(tokens)
        length = _tower_length(clip, self.eot)
        with torch.no_grad():
            emb = clip.token_embedding(tokens[:, :length]).float()
        self.prefix = emb[:, :1]
        self.init = emb[:, 1:1 + self.n_ctx].clone()
        self.suffix = emb[:, 1 + self.n_ctx:]
        others = [t.replace("CLS", c) for t in templates[1:] for c in classnames]

        def build() -> torch.Tensor:
            return self._encode(others, device).view(len(templates) - 1, len(classnames), -1).mean(dim=0)
        # 77 x C prompts (minutes on a CPU for 200 classes): kept in the class-head cache, under a key of its own
        # (the mean of UNnormalised features, not a normalised head of the same prompts)
        self.ensemble = cached_head(clip, device, ["\x00scap-unnormalised-mean", *others], build) if others else None

    @torch.no_grad()
    def _encode(self, texts: list[str], device: torch.device, chunk: int = 1000) -> torch.Tensor:
        """Unnormalised features (len(texts), D), `chunk` texts per pass."""
        tokens = tokenize(texts, self.clip.context_length).to(device)
        out = []
        for start in range(0, len(texts), chunk):
            tok = tokens[start:start + chunk]
            eot = _eot_positions(tok)
            length = _tower_length(self.clip, eot)
            out.append(run_text_tower(self.clip, self.clip.token_embedding(tok[:, :length]), eot).float())
        return torch.cat(out)

    def features(self, ctx: torch.Tensor, ensemble_rate: float) -> torch.Tensor:
        """Per-class context (C, p, W) -> normalised class features (C, D): (1 - r) learnt + r ensemble."""
        emb = torch.cat([self.prefix, ctx.to(self.prefix.dtype), self.suffix], dim=1)
        feats = run_text_tower(self.clip, emb, self.eot).float()
        if self.ensemble is not None:
            feats = (1 - ensemble_rate) * feats + ensemble_rate * self.ensemble
        return F.normalize(feats, dim=-1)
