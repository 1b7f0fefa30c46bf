"""TTL's loop written out (Razaimam45/TTL-Test-Time-Low-Rank-Adaptation at cc754df: ttl.py, deyo.py,
clip/custom_clip.py), for `shiftlab bench`.

Per image, as their `test_time_adapt_eval` (ttl.py:300-350) runs it:

1. `model.LoRA_reset()`: every A back to the run's draw, every B to 0; `optimizer.load_state_dict(optim_state)`:
   AdamW's state back to empty;
2. per step, DeYO's `forward_and_adapt_sar` (deyo.py:93-188): the whole model forward `model(images)`
   (custom_clip.py:665-694), i.e. the text tower over the C prompts without gradient, then the image tower
   over every view with gradient; each view's entropy; the views with H <= ln 1000; their mean of
   H * exp(e0 - H) (the weight without gradient); zero_grad, backward, AdamW step (skipped when no view
   qualifies);
3. `model(image)` without gradient: view 0 through the adapted tower, the text tower again.

Their image tower is Hugging Face's CLIP vision model under peft: separate q, k and v projections, LoRA
on q and v (peft's `lora.Linear`: W x + b + s B(A x), its dropout inactive in eval mode), eager attention.
Here that is a plain deep copy of the run's image tower (its own weights) whose last `lora_layers`
attention layers are replaced by exactly that: the packed projection split into q, k and v, the LoRA
layers written out, attention as a softmax of q k^T / sqrt(d). A ResNet tower's attention pool (their code
has no ResNet path; the library adapts it) gets the same, written out from open_clip's `AttentionPool2d`.

A is drawn as the library documents it (`TTLConfig.init_seed`: layer by layer, query then value, from a CPU
generator), since the authors' draw comes from an RNG stream nothing else reproduces: both sides must start
from the same A to be comparable.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .core import BaselineMethod, BaselineUnsupported, tokenize

__all__ = ["TTLBaseline"]


class LoRAProjection(nn.Module):
    """peft's `lora.Linear` in eval mode: a frozen nn.Linear plus s * lora_B(lora_A(x))."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rank: int, scaling: float):
        super().__init__()
        out_features, in_features = weight.shape
        self.base = nn.Linear(in_features, out_features, bias=bias is not None, device=weight.device)
        with torch.no_grad():
            self.base.weight.copy_(weight)
            if bias is not None:
                self.base.bias.copy_(bias)
        self.base.requires_grad_(False)
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=weight.device)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=weight.device)
        self.scaling = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


def frozen_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=bias is not None, device=weight.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer.requires_grad_(False)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Hugging Face CLIPAttention's eager path: (N, L, D) projections -> (N, L, D) before the output projection."""
    n, length, d = q.shape
    head_dim = d // heads
    q, k, v = (t.reshape(n, -1, heads, head_dim).transpose(1, 2) for t in (q * head_dim ** -0.5, k, v))
    weights = q @ k.transpose(-1, -2)
    if mask is not None:
        weights = weights + mask
    out = weights.softmax(dim=-1) @ v
    return out.transpose(1, 2).reshape(n, length, d)


class LoRASelfAttention(nn.Module):
    """An open_clip block's nn.MultiheadAttention as Hugging Face's CLIPAttention with peft's LoRA on q and v."""

    def __init__(self, attn: nn.MultiheadAttention, rank: int, scaling: float):
        super().__init__()
        w_q, w_k, w_v = attn.in_proj_weight.detach().chunk(3)
        b_q, b_k, b_v = attn.in_proj_bias.detach().chunk(3)
        self.q_proj = LoRAProjection(w_q, b_q, rank, scaling)
        self.k_proj = frozen_linear(w_k, b_k)
        self.v_proj = LoRAProjection(w_v, b_v, rank, scaling)
        self.out_proj = frozen_linear(attn.out_proj.weight.detach(), attn.out_proj.bias.detach())
        self.heads, self.batch_first = attn.num_heads, attn.batch_first

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                need_weights: bool = False, attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        x = query if self.batch_first else query.transpose(0, 1)
        out = self.out_proj(eager_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.heads, attn_mask))
        return (out if self.batch_first else out.transpose(0, 1)), None


class LoRAAttentionPool(nn.Module):
    """open_clip's `AttentionPool2d` written out, with peft's LoRA on its q and v projections."""

    def __init__(self, pool: nn.Module, rank: int, scaling: float):
        super().__init__()
        self.positional_embedding = pool.positional_embedding
        self.q_proj = LoRAProjection(pool.q_proj.weight.detach(), pool.q_proj.bias.detach(), rank, scaling)
        self.k_proj = frozen_linear(pool.k_proj.weight.detach(), pool.k_proj.bias.detach())
        self.v_proj = LoRAProjection(pool.v_proj.weight.detach(), pool.v_proj.bias.detach(), rank, scaling)
        self.c_proj = frozen_linear(pool.c_proj.weight.detach(), pool.c_proj.bias.detach())
        self.heads = pool.num_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2).transpose(1, 2)                                    # (N, HW, C)
        x = torch.cat([x.mean(dim=1, keepdim=True), x], dim=1)              # the mean token first
        x = x + self.positional_embedding.to(x.dtype)
        out = self.c_proj(eager_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.heads))
        return out[:, 0]


def lora_tower(visual: nn.Module, n_layers: int, rank: int, alpha: float) -> tuple[nn.Module, list[nn.Module]]:
    """A deep copy of `visual` (its own weights, all frozen) with LoRA on the last `n_layers` attention layers
    (a ResNet's one attention pool); returns the tower and its LoRA projections (layer by layer, q then v)."""
    # here, not at the top: open_clip imports torchvision, which imports torch._dynamo (seconds at import)
    from open_clip.modified_resnet import ModifiedResNet
    from open_clip.transformer import VisionTransformer
    tower = copy.deepcopy(visual).requires_grad_(False)
    scaling = alpha / rank
    adapted: list[nn.Module] = []
    if isinstance(tower, VisionTransformer):
        blocks = tower.transformer.resblocks
        for block in list(blocks)[-n_layers:]:
            if not isinstance(block.attn, nn.MultiheadAttention) or block.attn.in_proj_bias is None:
                raise BaselineUnsupported("ttl: the baseline adapts packed-projection self-attention blocks only")
            block.attn = LoRASelfAttention(block.attn, rank, scaling)
            adapted.append(block.attn)
    elif isinstance(tower, ModifiedResNet):
        tower.attnpool = LoRAAttentionPool(tower.attnpool, rank, scaling)
        adapted.append(tower.attnpool)
    else:
        raise BaselineUnsupported(f"ttl: no baseline for a {type(visual).__name__} image tower")
    return tower, [proj for layer in adapted for proj in (layer.q_proj, layer.v_proj)]


def softmax_entropy(x: torch.Tensor) -> torch.Tensor:
    """DeYO's `softmax_entropy` (deyo.py:89-90)."""
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


class TTLBaseline(BaselineMethod):
    """TTL, one image at a time through a LoRA copy of the image tower (see the module docstring)."""
    name = "ttl"

    def setup(self) -> None:
        cfg = self.config
        names = [c.replace("_", " ") for c in self.classnames]
        # their prompt learner's tokenised prompts, ctx_init "a_photo_of_a" (scripts/test_ttl.sh:9)
        self.tokens = tokenize([f"a photo of a {n}." for n in names]).to(self.device)
        self.tower, self.projections = lora_tower(self.clip.visual, cfg.lora_layers, cfg.rank, cfg.alpha)
        fill = {"xavier": nn.init.xavier_normal_, "gaussian": nn.init.normal_,
                "kaiming": nn.init.kaiming_normal_}[cfg.init]
        gen = torch.Generator().manual_seed(cfg.init_seed)
        self.initial_a = []
        for proj in self.projections:
            a = torch.zeros(proj.lora_A.weight.shape)
            fill(a, generator=gen)
            self.initial_a.append(a.to(self.device))
        params = [p for proj in self.projections for p in (proj.lora_A.weight, proj.lora_B.weight)]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)    # ttl.py:218
        self.optim_state = copy.deepcopy(self.optimizer.state_dict())                           # ttl.py:221

    @torch.no_grad()
    def lora_reset(self) -> None:
        for proj, a in zip(self.projections, self.initial_a):
            proj.lora_A.weight.copy_(a)
            proj.lora_B.weight.zero_()

    def model_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Their `model(x)`: the C prompts' features without gradient, then the views' through the LoRA tower."""
        with self.timed("text_tower"), torch.no_grad():
            text_features = self.clip.encode_text(self.tokens)
            text_features = text_features / text_features.norm(dim=-1, keepdim=True)
        with self.timed("image_encode"):
            image_features = self.tower(x)
            image_features = image_features / image_features.norm(dim=-1, keepdim=True)
        return self.logit_scale * image_features @ text_features.t()

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        x = self.to_input(views_u8)
        with self.timed("method"):
            self.lora_reset()
            self.optimizer.load_state_dict(self.optim_state)
            scaler = (torch.amp.GradScaler("cuda", init_scale=cfg.loss_scale)
                      if self.policy(cfg.precision).loss_scaling else None)
        for _ in range(cfg.steps):
            with torch.enable_grad(), self.autocast(cfg.precision):
                outputs = self.model_forward(x)
                with self.timed("method"):
                    entropys = softmax_entropy(outputs)
                    entropys = entropys[torch.where(entropys <= cfg.max_entropy)]   # ln 1000
                    if len(entropys) == 0:
                        continue
                    coeff = 1 / torch.exp(entropys.clone().detach() - cfg.margin)
                    loss = entropys.mul(coeff).mean(0)
            with self.timed("method"):
                self.optimizer.zero_grad()
            with self.timed("image_encode"):          # the backward runs through the image tower
                (scaler.scale(loss) if scaler else loss).backward()
            with self.timed("method"):
                if scaler:
                    scaler.step(self.optimizer)
                    scaler.update()
                else:
                    self.optimizer.step()
        with torch.no_grad(), self.autocast(cfg.precision):
            out = self.model_forward(x[:1])[0]
        with self.timed("method"):
            return out.float()
