"""TCA's token condensation inside an open_clip ViT (batch-first blocks), as its authors' `clip/model.py`
(`ResidualAttentionBlock_Ours`, `Transformer_drop`, `VisionTransformer`; Jo-wang/TCA@0f846d6) and `clip/utils.py`
(`k_center_greedy`, `coreset_averaging`) compute it. Pure functions of the tower's own modules and weights."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

# clip/utils.py coreset_averaging: a token at distance 0 from its centre gets weight 1 (not 1 / 1e-8)
_AT_CENTRE = 1e-8


def coreset_merge(tokens: torch.Tensor, n_centers: int, first: int) -> torch.Tensor:
    """(M, C) tokens -> (n_centers, C): greedy k-centre selection starting at token `first` (each next centre the
    token farthest from the chosen ones), every token assigned to its nearest centre, each cluster averaged with
    weights 1 / distance to its centre (normalised); an empty cluster stays a zero token (as theirs does)."""
    chosen = [first]
    nearest = (tokens - tokens[first]).norm(dim=1)
    for _ in range(n_centers - 1):
        chosen.append(int(nearest.argmax()))
        nearest = torch.minimum(nearest, (tokens - tokens[chosen[-1]]).norm(dim=1))
    centers = tokens[chosen]
    assigned = torch.cdist(tokens.float(), centers.float()).argmin(dim=1)
    merged = tokens.new_zeros(n_centers, tokens.shape[1])
    for i in range(n_centers):
        members = tokens[assigned == i]
        if members.shape[0] == 0:
            continue
        distance = (members - centers[i]).norm(dim=1)
        distance[distance == 0] = _AT_CENTRE
        weights = 1 / distance
        weights[distance == _AT_CENTRE] = 1.0
        merged[i] = (members * (weights / weights.sum()).unsqueeze(-1)).sum(dim=0)
    return merged


def condensing_block(block: nn.Module, x: torch.Tensor, drop_rate: float, n_centers: int,
                     cached: torch.Tensor | None, draw_first: Callable[[int], int]) -> torch.Tensor:
    """One condensing block on (B, N, C) tokens (token 0 the class token) -> (B, N', C).

    The attention runs as the block's own, with the cached class token closest (cosine) to each image's class
    token prepended as an extra key/value where `cached` (K, C) is given (its output row and column dropped, not
    renormalised). The patch tokens ranked by the class token's attention (mean over heads): the top
    `left - 2 (N - left)` kept, the next `2 (N - left)` merged into `n_centers` tokens (`coreset_merge`, its first
    centre `draw_first(count)`), the rest fused into one token weighted by their attention; then the block's MLP."""
    batch, n_tokens, _ = x.shape
    seq = x
    if cached is not None:
        pick = F.cosine_similarity(cached.unsqueeze(1), x[:, 0].unsqueeze(0), dim=-1).argmax(dim=0)   # (B,)
        seq = torch.cat([cached[pick].unsqueeze(1).to(x.dtype), x], dim=1)
    h = block.ln_1(seq)
    out, weights = block.attn(h, h, h, need_weights=True, average_attn_weights=False)    # weights (B, H, L, L)
    if cached is not None:
        out, weights = out[:, 1:], weights[:, :, 1:, 1:]
    x = x + block.ls_1(out)
    cls_attn = weights[:, :, 0, 1:].mean(dim=1)                                           # (B, N - 1)
    left = math.ceil((1 - drop_rate) * (n_tokens - 1))
    kept = left - 2 * (n_tokens - left)
    if kept < 1:
        raise ValueError(f"tca: a condensing block on {n_tokens} tokens with drop_rate {drop_rate} keeps {kept} "
                         "tokens; lower drop_rate")
    order = cls_attn.topk(left, dim=1).indices                                           # (B, left)
    rows = []
    for b in range(batch):
        patches = x[b, 1:]
        rest = torch.ones(n_tokens - 1, dtype=torch.bool, device=x.device)
        rest[order[b]] = False
        rest_idx = rest.nonzero().squeeze(1)                                             # ascending
        fused = (patches[rest_idx] * cls_attn[b, rest_idx].unsqueeze(-1)).sum(dim=0, keepdim=True)
        cluster = patches[order[b, kept:]]
        merged = coreset_merge(cluster, n_centers, draw_first(cluster.shape[0]))
        rows.append(torch.cat([x[b, :1], patches[order[b, :kept]], merged.to(x.dtype), fused]))
    x = torch.stack(rows)
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def condensed_forward(visual: nn.Module, images: torch.Tensor, condense_blocks: Sequence[int], drop_rate: float,
                      n_centers: int, cache: torch.Tensor | None,
                      draw_first: Callable[[int], int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised images (B, 3, S, S) through a CLIP ViT whose `condense_blocks` condense -> (features (B, D)
    unnormalised, class tokens (B, L, width): block i's output class token). `cache` (K, L, width): per class the
    mean class token of each block's output; block i reads its input's, entry i - 1 (their `cache[:, i-1, :]`)."""
    x = visual._embeds(images)
    cls_tokens = []
    for i, block in enumerate(visual.transformer.resblocks):
        if i in condense_blocks:
            x = condensing_block(block, x, drop_rate, n_centers, None if cache is None else cache[:, i - 1],
                                 draw_first)
        else:
            x = block(x)
        cls_tokens.append(x[:, 0])
    return visual.ln_post(x[:, 0]) @ visual.proj, torch.stack(cls_tokens, dim=1)
