"""Both CLIP towers with their normalisation layers' affine parameters as trainable copies (BATCLIP's bimodal
adaptation: sarthaxxxxx/BATCLIP `methods/ours.py`, whose `collect_params` walks the whole open_clip model).

`BimodalNormTower` offers `NormTTAMethod` what `NormTower` does (`parameter_names`, `adapted_parameters`,
`norm_state` / `load_norm_state`, `forward` = the image tower) and `text_features(tokens)`, the class features
through the text tower with its adapted LayerNorms. Every other tensor is the shared model's, never written.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ...models.text import run_text_tower, tokenize
from .norm_adaptation import NORM_LAYERS, NormTower, norm_layers


def text_copy(clip: nn.Module) -> nn.Module:
    """A copy of `clip`'s module tree without its image tower (None there), holding the very same tensors."""
    memo = {id(t): t for t in [*clip.parameters(), *clip.buffers()]}
    memo[id(clip.visual)] = None
    return copy.deepcopy(clip, memo)


class BimodalNormTower(nn.Module):
    """The image tower's norms as `NormTower` adapts them (BatchNorm on the batch's statistics) plus the text
    tower's (its LayerNorms and ln_final). Parameter names are open_clip's CLIP names (`visual.` + the image tower's,
    then the text tower's), in module order as their `collect_params` lists them."""

    def __init__(self, clip: nn.Module, kinds: tuple[type, ...] = NORM_LAYERS):
        super().__init__()
        self.image = NormTower(clip, kinds=kinds)
        text = text_copy(clip)
        names: list[str] = []
        for name, module in norm_layers(text, kinds):
            for which in ("weight", "bias"):
                tensor = module._parameters.get(which)
                if tensor is not None:
                    setattr(module, which, nn.Parameter(tensor.detach().clone(), requires_grad=True))
                    names.append(f"{name}.{which}")
        if not names:
            raise ValueError("its text tower has no LayerNorm to adapt")
        self.text = text
        self._text_params = [text.get_parameter(n) for n in names]
        self.parameter_names = [f"visual.{n}" for n in self.image.parameter_names] + names

    def adapted_parameters(self) -> list[nn.Parameter]:
        return self.image.adapted_parameters() + list(self._text_params)

    def norm_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in zip(self.parameter_names, self.adapted_parameters())}

    @torch.no_grad()
    def load_norm_state(self, state: dict[str, torch.Tensor]) -> None:
        if sorted(state) != sorted(self.parameter_names):
            raise ValueError(f"norm state must hold exactly the parameters {self.parameter_names}")
        for name, p in zip(self.parameter_names, self.adapted_parameters()):
            p.copy_(state[name])

    def tokens(self, prompts: list[str]) -> torch.Tensor:
        """(P, L) the prompts' tokens, cut after the longest end-of-text token where the tower is causal (exact:
        no position after a prompt's end reaches its feature)."""
        tokens = tokenize(prompts, self.text.context_length)
        if self.text.attn_mask is not None:
            tokens = tokens[:, :int(tokens.argmax(dim=-1).max()) + 1]
        return tokens

    def text_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """(P, L) tokens -> (P, D) unnormalised features through the adapted text tower, gradients kept."""
        tokens = tokens.to(self.text.token_embedding.weight.device)
        return run_text_tower(self.text, self.text.token_embedding(tokens), tokens.argmax(dim=-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.image(x)
