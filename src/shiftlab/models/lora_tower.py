"""Low-rank adapters (LoRA) on the query and value projections of an image tower's attention.

`LoRATower(model, n_layers, rank, alpha)` is a private copy of `model.clip.visual` whose module
tree is new but whose weights are the shared model's own tensors (no copy, never written): only
the copy's attention layers are swapped for adapted ones, so the shared model and every other
method keep seeing the frozen tower. Each adapted projection computes, as peft's `lora.Linear`
without dropout (A: (rank, in), B: (out, rank)):

    W x + b + (alpha / rank) * B (A x)

Towers with attention to adapt:
- open_clip's VisionTransformer (ViT-B/16's design): the query and value rows of the last
  `n_layers` blocks' packed `in_proj` (as Hugging Face's separate `q_proj`, `v_proj`);
- open_clip's ModifiedResNet (RN50's design): its one attention layer, the attention pool's
  `q_proj` and `v_proj` (read through their merged weight W + s B A).
Anything else has none (`attention_layers` returns []).
"""
from __future__ import annotations

import copy
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F


class LowRank(nn.Module):
    """The update s * B A of one projection: x -> s * B (A x)."""

    def __init__(self, in_features: int, out_features: int, rank: int, scaling: float, device: torch.device):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(rank, in_features, device=device))
        self.B = nn.Parameter(torch.zeros(out_features, rank, device=device))
        self.scaling = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.A), self.B) * self.scaling

    def delta(self) -> torch.Tensor:
        return (self.B @ self.A) * self.scaling


class LoRAAttention(nn.Module):
    """Self-attention of an open_clip block (a frozen nn.MultiheadAttention, read only) with
    LoRA on its query and value projections; called as the block calls nn.MultiheadAttention."""

    def __init__(self, base: nn.MultiheadAttention, rank: int, scaling: float):
        super().__init__()
        d = base.embed_dim
        device = base.in_proj_weight.device
        self.base = base
        self.q = LowRank(d, d, rank, scaling, device)
        self.v = LowRank(d, d, rank, scaling, device)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                need_weights: bool = False, attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError("LoRAAttention adapts self-attention only")
        base = self.base
        x = query if base.batch_first else query.transpose(0, 1)           # (N, L, D)
        q, k, v = F.linear(x, base.in_proj_weight, base.in_proj_bias).chunk(3, dim=-1)
        q = q + self.q(x)
        v = v + self.v(x)
        n, length, d = x.shape
        heads = base.num_heads
        q, k, v = (t.reshape(n, length, heads, d // heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        out = F.linear(out.transpose(1, 2).reshape(n, length, d), base.out_proj.weight, base.out_proj.bias)
        return (out if base.batch_first else out.transpose(0, 1)), None


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus LoRA, for callers that read `.weight` and `.bias` (the attention pool)."""

    def __init__(self, base: nn.Linear, rank: int, scaling: float):
        super().__init__()
        self.base = base
        self.lora = LowRank(base.in_features, base.out_features, rank, scaling, base.weight.device)

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight + self.lora.delta()

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora(x)


def _standard_block_attention(block: nn.Module) -> bool:
    attn = getattr(block, "attn", None)
    return (isinstance(attn, nn.MultiheadAttention) and attn._qkv_same_embed_dim and attn.bias_k is None
            and attn.in_proj_bias is not None and not attn.add_zero_attn and not hasattr(block, "ln_1_kv"))


def attention_layers(visual: nn.Module) -> list[str]:
    """Names of `visual`'s attention layers LoRATower can adapt, input side first ([] if none)."""
    from open_clip.modified_resnet import ModifiedResNet
    from open_clip.transformer import VisionTransformer
    if isinstance(visual, VisionTransformer):
        blocks = getattr(visual.transformer, "resblocks", None)
        if blocks is not None and len(blocks) and all(_standard_block_attention(b) for b in blocks):
            return [f"transformer.resblocks.{i}.attn" for i in range(len(blocks))]
        return []
    if isinstance(visual, ModifiedResNet):
        pool = getattr(visual, "attnpool", None)
        if pool is not None and all(isinstance(getattr(pool, p, None), nn.Linear) for p in ("q_proj", "v_proj")):
            return ["attnpool"]
    return []


def shared_copy(module: nn.Module) -> nn.Module:
    """A copy of `module`'s module tree that holds the very same parameter and buffer tensors."""
    memo = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    return copy.deepcopy(module, memo)


class LoRATower(nn.Module):
    """The image tower of `clip` with LoRA on the query and value projections of its last
    `n_layers` attention layers (all of them where it has fewer). Raises ValueError if it has none."""

    def __init__(self, clip: nn.Module, n_layers: int, rank: int, alpha: float):
        super().__init__()
        layers = attention_layers(clip.visual)
        if not layers:
            raise ValueError(f"its image tower ({type(clip.visual).__name__}) has no attention layer to adapt "
                             "(open_clip's VisionTransformer blocks or ModifiedResNet attention pool)")
        self.layer_names = layers[-n_layers:]
        visual = shared_copy(clip.visual)
        scaling = alpha / rank
        self.adapters: list[LowRank] = []
        for name in self.layer_names:
            parent_name, _, attr = name.rpartition(".")
            parent = visual.get_submodule(parent_name) if parent_name else visual
            if attr == "attnpool":
                pool = getattr(parent, attr)
                pool.q_proj = LoRALinear(pool.q_proj, rank, scaling)
                pool.v_proj = LoRALinear(pool.v_proj, rank, scaling)
                self.adapters += [pool.q_proj.lora, pool.v_proj.lora]
            else:
                adapted = LoRAAttention(getattr(parent, attr), rank, scaling)
                setattr(parent, attr, adapted)
                self.adapters += [adapted.q, adapted.v]
        self.visual = visual

    def lora_parameters(self) -> list[nn.Parameter]:
        """A and B of every adapted projection: layer by layer, query before value."""
        return [p for a in self.adapters for p in (a.A, a.B)]

    def lora_state(self) -> dict[str, torch.Tensor]:
        """{"<layer>.q.A": ..., "<layer>.q.B": ..., "<layer>.v.A": ...} (copies)."""
        out = {}
        for i, name in enumerate(self.layer_names):
            for which, adapter in zip("qv", self.adapters[2 * i:2 * i + 2]):
                out[f"{name}.{which}.A"] = adapter.A.detach().clone()
                out[f"{name}.{which}.B"] = adapter.B.detach().clone()
        return out

    @torch.no_grad()
    def load_lora_state(self, state: dict[str, torch.Tensor]) -> None:
        for i, name in enumerate(self.layer_names):
            for which, adapter in zip("qv", self.adapters[2 * i:2 * i + 2]):
                adapter.A.copy_(state[f"{name}.{which}.A"])
                adapter.B.copy_(state[f"{name}.{which}.B"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual(x)
