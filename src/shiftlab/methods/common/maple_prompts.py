"""MaPLe's multi-modal prompts (Khattak et al., CVPR 2023) over an open_clip CLIP: learnable text context and deep
text prompts, each projected by its own linear layer into the image tower's deep visual prompts, as PromptAlign's
`MultiModalPromptLearner` holds them (github.com/jameelhassan/PromptAlign@9290564, trainers/prompt_align.py:118-296)
and MaPLe's checkpoints store them.

The learnable tensors (`MaPLePrompts`), in a dassl checkpoint under `prompt_learner.`:

- `ctx` (n_ctx, text width): the text context after [SOS] ("a photo" of "a photo of a {name}." with 2 tokens);
- `proj` (text width -> vision width): ctx projected is the shallow visual prompt (their `shared_ctx`);
- `compound_prompts_text.{i}` (n_ctx, text width), i < depth - 1: replace the context tokens at the input of text
  block i + 1 (`ResidualAttentionBlock_MaPLe`, clip/model.py:305-334);
- `compound_prompt_projections.{i}` (text width -> vision width): project them into the visual prompts of block
  i + 1, which replace the last n_ctx tokens there (methods/common/deep_visual_prompts.py runs the image tower).

Prompts are plain tensors, so a caller can tune them with an optimizer or differentiate through their update.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ...models.text import tokenize
from .deep_visual_prompts import PROMPT_INIT_STD
from .torch_files import read_torch_file

CHECKPOINT_PREFIX = "prompt_learner."
MAX_WORD_INIT = 4       # `if ctx_init and (n_ctx) <= 4`: longer contexts start random (prompt_align.py:134)


class MaPLePrompts(NamedTuple):
    ctx: torch.Tensor            # (n_ctx, text width)
    proj_weight: torch.Tensor    # (vision width, text width)
    proj_bias: torch.Tensor      # (vision width,)
    deep_text: torch.Tensor      # (depth - 1, n_ctx, text width)
    deep_weight: torch.Tensor    # (depth - 1, vision width, text width)
    deep_bias: torch.Tensor      # (depth - 1, vision width)

    def visual(self) -> torch.Tensor:
        """The image tower's prompts (depth, n_ctx, vision width): the projected context, then each projected deep
        text prompt (their `MultiModalPromptLearner.forward`)."""
        shallow = F.linear(self.ctx, self.proj_weight, self.proj_bias)
        deep = torch.einsum("lnt,lvt->lnv", self.deep_text, self.deep_weight) + self.deep_bias[:, None]
        return torch.cat([shallow[None], deep])

    def to(self, device: torch.device | str) -> MaPLePrompts:
        return MaPLePrompts(*(t.to(device) for t in self))


def checkpoint_keys(depth: int) -> dict[str, list[str]]:
    """Per field of MaPLePrompts, its keys in a dassl checkpoint's state_dict (depth - 1 deep prompts)."""
    p, deep = CHECKPOINT_PREFIX, range(depth - 1)
    return {"ctx": [p + "ctx"], "proj_weight": [p + "proj.weight"], "proj_bias": [p + "proj.bias"],
            "deep_text": [f"{p}compound_prompts_text.{i}" for i in deep],
            "deep_weight": [f"{p}compound_prompt_projections.{i}.weight" for i in deep],
            "deep_bias": [f"{p}compound_prompt_projections.{i}.bias" for i in deep]}


def load_maple_checkpoint(path: str | Path, depth: int, n_ctx: int, text_width: int, vision_width: int) -> MaPLePrompts:
    """Trained MaPLe prompts from a dassl checkpoint (`{"state_dict": ..., "epoch": ...}`, MaPLe's published
    `MultiModalPromptLearner/model.pth.tar-2`), the first depth - 1 deep prompts of it: a deeper checkpoint's others
    are not read (their `load_state_dict(strict=False)` ignores keys the learner lacks: PromptAlign's depth 3 reads
    2 of MaPLe's 8). float32."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"MaPLe checkpoint {path} does not exist (MaPLe's MultiModalPromptLearner/model.pth.tar-N)")
    state = read_torch_file(path, "MaPLe checkpoint", weights_only=False)
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    if not isinstance(state, dict):
        raise ValueError(f"MaPLe checkpoint {path} holds no state_dict")
    fields = {}
    for field, keys in checkpoint_keys(depth).items():
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"MaPLe checkpoint {path} has no {missing[0]} (a dassl MaPLe checkpoint with prompt depth "
                             f">= {depth} is expected)")
        fields[field] = (torch.stack([state[k].float() for k in keys]) if keys else None) \
            if field.startswith("deep") else state[keys[0]].float()
    want = maple_prompt_shapes(depth, n_ctx, text_width, vision_width)
    # depth 1, no deep prompts: empty stacks of the right trailing shape
    prompts = MaPLePrompts(**{f: torch.zeros(want[f]) if v is None else v for f, v in fields.items()})
    for field, shape in want.items():
        got = tuple(getattr(prompts, field).shape)
        if got != shape:
            raise ValueError(f"MaPLe checkpoint {path}: {field} is {got}, this model needs {shape} (n_ctx {n_ctx}, "
                             f"text width {text_width}, vision width {vision_width})")
    return prompts


def maple_prompt_shapes(depth: int, n_ctx: int, text_width: int, vision_width: int) -> dict[str, tuple]:
    d = depth - 1
    return {"ctx": (n_ctx, text_width), "proj_weight": (vision_width, text_width), "proj_bias": (vision_width,),
            "deep_text": (d, n_ctx, text_width), "deep_weight": (d, vision_width, text_width),
            "deep_bias": (d, vision_width)}


def initial_maple_prompts(ctx: torch.Tensor, depth: int, vision_width: int, seed: int) -> MaPLePrompts:
    """Their untrained learner: `ctx` as given (the words' embeddings or N(0, 0.02)), the deep text prompts
    N(0, 0.02), the projections nn.Linear's default initialisation (U(-1/sqrt(in), 1/sqrt(in)) for weight and
    bias), drawn from a CPU generator seeded by `seed` (theirs: the global stream)."""
    n_ctx, text_width = ctx.shape
    gen = torch.Generator().manual_seed(int(seed))
    bound = 1 / math.sqrt(text_width)

    def uniform(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen) * 2 - 1) * bound
    proj_weight, proj_bias = uniform(vision_width, text_width), uniform(vision_width)
    deep_text = torch.randn(depth - 1, n_ctx, text_width, generator=gen) * PROMPT_INIT_STD
    deep_weight, deep_bias = uniform(depth - 1, vision_width, text_width), uniform(depth - 1, vision_width)
    return MaPLePrompts(ctx.detach().float().cpu(), proj_weight, proj_bias, deep_text, deep_weight, deep_bias)


class MaPLeText:
    """The class prompts "[SOS] ctx <rest of ctx_init> {name}." through open_clip's text tower with MaPLe's deep text
    prompts (their `TextEncoder`, prompt_align.py:92-115), over the positions up to the longest end-of-text token
    (the tower is causal: exact)."""

    def __init__(self, clip: torch.nn.Module, classnames: Sequence[str], n_ctx: int, ctx_init: str | None,
                 seed: int = 1):
        if clip.attn_mask is None:
            raise ValueError("MaPLe's text prompts need CLIP's causal text tower")
        self.clip, self.n_ctx = clip, n_ctx
        device = clip.token_embedding.weight.device
        from_words = bool(ctx_init) and n_ctx <= MAX_WORD_INIT
        prefix = ctx_init.replace("_", " ") if from_words else " ".join(["X"] * n_ctx)
        names = [c.replace("_", " ") for c in classnames]
        tokens = tokenize([f"{prefix} {name}." for name in names], clip.context_length).to(device)
        self.eot = tokens.argmax(dim=-1)
        self.length = int(self.eot.max()) + 1
        with torch.no_grad():
            embedding = clip.token_embedding(tokens[:, :self.length]).float()
            words = clip.token_embedding(tokenize([prefix], clip.context_length).to(device)).float()
        width = embedding.shape[-1]
        if from_words:
            self.init_ctx = words[0, 1:1 + n_ctx].clone()
        else:
            gen = torch.Generator().manual_seed(int(seed))
            self.init_ctx = (torch.randn(n_ctx, width, generator=gen) * PROMPT_INIT_STD).to(device)
        self.prefix = embedding[:, :1].clone()
        self.suffix = embedding[:, 1 + n_ctx:].clone()

    def features(self, ctx: torch.Tensor, deep_text: torch.Tensor) -> torch.Tensor:
        """ctx (n_ctx, W), deep_text (depth - 1, n_ctx, W) -> unnormalised class features (C, D)."""
        clip, c = self.clip, self.prefix.shape[0]
        cast = clip.transformer.get_cast_dtype()
        x = torch.cat([self.prefix, ctx.to(self.prefix.dtype).expand(c, -1, -1), self.suffix], dim=1)
        x = x.to(cast) + clip.positional_embedding[:self.length].to(cast)
        mask = clip.attn_mask[:self.length, :self.length]
        for i, block in enumerate(clip.transformer.resblocks):
            if 1 <= i <= deep_text.shape[0]:      # block i reads deep prompt i - 1 (their `counter`)
                x = torch.cat([x[:, :1], deep_text[i - 1].to(x.dtype).expand(c, -1, -1), x[:, 1 + self.n_ctx:]], 1)
            x = block(x, attn_mask=mask)
        x = clip.ln_final(x)[torch.arange(c, device=x.device), self.eot]
        proj = clip.text_projection
        return proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
