"""Every output token of a CLIP image tower, projected into the joint space: what a method that attends over
the image's positions reads (CALIP), where the tower itself returns only the pooled feature.

- A ViT (open_clip `VisionTransformer` as CLIP builds it: class-token pooling, `ln_post` before the pool, no
  attention pool): every token through `ln_post` and `proj` (token 0 is the class token, the usual feature).
- A ResNet (`ModifiedResNet`): its attention pool run with every position as a query (the mean token first,
  the usual feature, then the H x W grid in row-major order), through the pool's own output projection.

Both are what CALIP's authors' `clip/model.py` returns (github.com/ZiyuGuo99/CALIP@83e21b6, lines 63-89 and
217-233); token 0 equals the tower's own pooled output (tests/methods/test_calip.py checks it).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def tower_kind(visual: nn.Module) -> str:
    """"vit" or "resnet" for the two CLIP image towers tokens can be read from; a one-line ValueError for any
    other (naming what it is and why)."""
    from open_clip.modified_resnet import ModifiedResNet
    from open_clip.transformer import VisionTransformer
    if isinstance(visual, ModifiedResNet):
        return "resnet"
    if isinstance(visual, VisionTransformer):
        plain = (visual.attn_pool is None and not visual.final_ln_after_pool
                 and visual.pool_type == "tok" and visual.proj is not None)
        if not plain:
            raise ValueError("its ViT pools in a way CLIP's does not (attention pool, layer norm after the pool, "
                             f"pool type {visual.pool_type!r} or no projection): its tokens have no joint-space "
                             "reading")
        return "vit"
    raise ValueError(f"its image tower ({type(visual).__name__}) is neither CLIP's ViT nor its ResNet: "
                     "no spatial tokens to read")


def attention_pool_tokens(pool: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """open_clip's `AttentionPool2d` over a (N, C, H, W) map with every position as a query, not only the mean
    token: (N, 1 + H W, D), token 0 the pool's usual output."""
    x = x.flatten(2).permute(2, 0, 1)                                  # (HW, N, C)
    x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0)            # (1 + HW, N, C)
    x = x + pool.positional_embedding[:, None, :].to(x.dtype)
    out, _ = F.multi_head_attention_forward(
        query=x, key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=pool.num_heads,
        q_proj_weight=pool.q_proj.weight, k_proj_weight=pool.k_proj.weight, v_proj_weight=pool.v_proj.weight,
        in_proj_weight=None, in_proj_bias=torch.cat([pool.q_proj.bias, pool.k_proj.bias, pool.v_proj.bias]),
        bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0, out_proj_weight=pool.c_proj.weight,
        out_proj_bias=pool.c_proj.bias, use_separate_proj_weight=True, training=False, need_weights=False)
    return out.permute(1, 0, 2)


def image_tokens(visual: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Normalised images (N, 3, S, S) -> (N, 1 + P, D) projected tokens, not normalised: token 0 the tower's
    pooled feature, then its P spatial tokens (module docstring)."""
    if tower_kind(visual) == "resnet":
        x = visual.stem(x)
        x = visual.layer4(visual.layer3(visual.layer2(visual.layer1(x))))
        return attention_pool_tokens(visual.attnpool, x)
    x = visual.transformer(visual._embeds(x))                          # (N, 1 + P, width)
    return visual.ln_post(x) @ visual.proj
