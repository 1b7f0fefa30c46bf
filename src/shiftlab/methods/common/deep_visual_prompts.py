"""Deep visual prompts inside a CLIP ViT (VPT-deep as MaPLe, IVLP and TAPT insert them) and the per-layer token
statistics that TAPT and PromptAlign align.

The image tower is open_clip's plain `VisionTransformer` (class-token pooling, `ln_post` before the pool: the
one `tower_tokens.tower_kind` accepts), run block by block here so that prompts go in between:

- `prompts[0]` (n_ctx, width) is appended after the patch tokens once the positional embedding is added, before
  `ln_pre` (the "shallow" prompt: their `VisionTransformer.forward`, clip/model.py);
- `prompts[i]`, i >= 1, *replaces* the last n_ctx tokens at the input of block i (their
  `ResidualAttentionBlock_IVLP.forward`); blocks past len(prompts) carry the previous block's outputs on.

Every block's input (after the replacement) is kept: `(N, L, width)` with L = 1 + patches + n_ctx, what their
blocks store as `visual_feat` and what the statistics are computed over. Prompts are plain tensors (not module
parameters), so a caller can tune them with an optimizer or differentiate through their update.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn

from .torch_files import read_torch_file

PROMPT_INIT_STD = 0.02   # nn.init.normal_(ctx_vectors, std=0.02): TAPT's and MaPLe's clip/model.py


class PromptedTower(NamedTuple):
    features: torch.Tensor          # (N, D) the tower's output (projected class token, not normalised)
    block_inputs: list[torch.Tensor]  # one (N, L, width) per block: its input after the prompt replacement


def prompt_layers(visual: nn.Module, depth: int) -> int:
    """How many prompt tensors a depth gives on this tower: min(depth, blocks) (their `prompts_needed > i`)."""
    return min(int(depth), len(visual.transformer.resblocks))


def initial_prompts(visual: nn.Module, depth: int, n_ctx: int, seed: int) -> torch.Tensor:
    """(layers, n_ctx, width) N(0, 0.02) prompts from a CPU generator seeded by `seed` (float32)."""
    width = visual.conv1.out_channels
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(prompt_layers(visual, depth), n_ctx, width, generator=gen) * PROMPT_INIT_STD


def prompted_forward(visual: nn.Module, x: torch.Tensor, prompts: torch.Tensor) -> PromptedTower:
    """Normalised images (N, 3, S, S) through the ViT with `prompts` (P, n_ctx, width), P >= 1."""
    from ...models.tower_tokens import tower_kind
    if tower_kind(visual) != "vit":
        raise ValueError("deep visual prompts go inside a ViT's token sequence; this tower is a ResNet")
    n_ctx = prompts.shape[1]
    x = visual.conv1(x)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    cls = visual.class_embedding.to(x.dtype) + torch.zeros(x.shape[0], 1, x.shape[-1], dtype=x.dtype,
                                                              device=x.device)
    x = torch.cat([cls, x], dim=1) + visual.positional_embedding.to(x.dtype)
    x = torch.cat([x, prompts[0].to(x.dtype).expand(x.shape[0], -1, -1)], dim=1)
    x = visual.ln_pre(x)
    block_inputs = []
    for i, block in enumerate(visual.transformer.resblocks):
        if 1 <= i < prompts.shape[0]:
            x = torch.cat([x[:, :-n_ctx], prompts[i].to(x.dtype).expand(x.shape[0], -1, -1)], dim=1)
        block_inputs.append(x)
        x = block(x)
    x = visual.ln_post(x[:, 0])
    return PromptedTower(x @ visual.proj, block_inputs)


def view_statistics(block_inputs: list[torch.Tensor], index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer token means and (biased) variances over the views `index`: -> two (layers, L, width) tensors
    (TAPT's `out_visual_mean`/`out_visual_var`, adv_v.py:1000-1001)."""
    feats = torch.stack([b[index] for b in block_inputs])          # (layers, k, L, width)
    mean = feats.mean(dim=1)
    return mean, ((feats - mean.unsqueeze(1)) ** 2).mean(dim=1)


def dataset_statistics(batches: Iterable[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The statistics files' values from the block inputs of a data set, batch by batch: per layer, token and
    channel, the mean over images (their running mean, `save_and_compute_means`, adv_v.py:1174-1224) and the
    unbiased variance around it (`save_and_compute_var`, :1227-1271) -> two (layers, L, width) tensors. The
    batches are read twice (two passes, as theirs), so pass a re-iterable (a list, or a loader)."""
    total, mean = 0, None
    for inputs in batches:
        feats = torch.stack(inputs, dim=1).float()                  # (n, layers, L, width)
        n = feats.shape[0]
        batch_mean = feats.mean(dim=0)
        mean = batch_mean if mean is None else mean * (total / (total + n)) + batch_mean * (n / (total + n))
        total += n
    if mean is None or total < 2:
        raise ValueError("token statistics need at least two images")
    squares = None
    for inputs in batches:
        diff = (torch.stack(inputs, dim=1).float() - mean).pow(2).sum(dim=0)
        squares = diff if squares is None else squares + diff
    return mean, squares / (total - 1)


def read_prompt_file(path: Path, trust_checkpoint: bool) -> object:
    """A prompt checkpoint's contents as `models.checkpoints.read_pickle` reads a checkpoint (weights-only unless
    trusted); its refusal as a one-line ValueError."""
    from ...models.checkpoints import ModelLoadError, read_pickle
    try:
        return read_pickle(path, trust_checkpoint)
    except ModelLoadError as exc:
        raise ValueError(str(exc)) from None


def load_statistics(path: str | Path, layers: int, tokens: int, width: int) -> torch.Tensor:
    """One statistics file in TAPT's published format (a `torch.save`d float tensor (layers, L, width), e.g.
    `V_means_vitb16_train_adv.pt`, (12, 199, 768) for ViT-B/16 with 2 prompt tokens), checked against the tower."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"token statistics file {path} does not exist")
    value = read_torch_file(path, "token statistics file")
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != (layers, tokens, width):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"token statistics file {path} holds {shape}, this tower needs ({layers}, {tokens}, {width})"
                         " (blocks, 1 + patches + prompt tokens, width)")
    return value.float()


def load_vpt_checkpoint(path: str | Path, layers: int, n_ctx: int, width: int,
                        trust_checkpoint: bool = False) -> torch.Tensor:
    """Trained VPT prompts in the dassl checkpoint format their `load_model` reads (`{"state_dict": ...}` with
    `image_encoder.VPT` and `image_encoder.transformer.resblocks.{i}.VPT_shallow`, MMoP's AdvVPT) -> (layers,
    n_ctx, width). A file holding Python objects beyond tensors is refused unless `trust_checkpoint`
    (models.checkpoints.read_pickle)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt checkpoint {path} does not exist")
    state = read_prompt_file(path, trust_checkpoint)
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    keys = ["image_encoder.VPT"] + [f"image_encoder.transformer.resblocks.{i}.VPT_shallow" for i in range(1, layers)]
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"prompt checkpoint {path} has no {missing[0]} (a dassl VPT checkpoint with {layers} prompt "
                         "layers is expected)")
    prompts = torch.stack([state[k].float() for k in keys])
    if tuple(prompts.shape[1:]) != (n_ctx, width):
        raise ValueError(f"prompt checkpoint {path} holds prompts of {tuple(prompts.shape[1:])}, "
                         f"this tower needs ({n_ctx}, {width})")
    return prompts
