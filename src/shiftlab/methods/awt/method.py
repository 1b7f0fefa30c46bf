"""AWT (Zhu et al., NeurIPS 2024; MCG-NJU/AWT `AWT_zero_shot/evaluate.py`), training-free.

Per class, P = 1 + M prompts: "<template>." and "<template>. <description i>" for its first M LLM descriptions,
one text feature each. Per image, the N views' logits (N, P, C) against them. Weights: views by
softmax(-H(mean over prompts of the view's logits) / 0.5); per class, its prompts by softmax(-H / 0.5), where H is
the entropy of view 0's prompt-mean logits with the class's entry replaced by that prompt's. Then per class an
entropic optimal transport (Sinkhorn, eps 0.1) between the view weights and the prompt weights on the cost
1 - cosine, and the output is each class's transport-weighted sum of its logits.
"""
from __future__ import annotations

from typing import Any

import torch

from ...models.text import encode_texts, load_descriptions
from ...options import say_set
from ..base import MethodOutput
from ..common.confidence import entropy
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import AWTConfig, AWTSpec


def entropy_weights(logits: torch.Tensor, image_t: float, text_t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, P, C) logits -> view weights (N,) and per-class prompt weights (C, P) (their `get_entropy_weight`)."""
    image_weights = (-entropy(logits.mean(1)) / image_t).softmax(-1)
    n_prompts, n_cls = logits.shape[1:]
    anchor = logits[0].mean(0).expand(n_prompts, n_cls, n_cls).clone()         # (P, C, C)
    idx = torch.arange(n_cls, device=logits.device)
    anchor[:, idx, idx] = logits[0]                  # class c's entry replaced by prompt p's logit for class c
    text_weights = (-entropy(anchor).T / text_t).softmax(-1)                   # (C, P)
    return image_weights, text_weights


def sinkhorn(kernel: torch.Tensor, u: torch.Tensor, v: torch.Tensor, iterations: int, tol: float) -> torch.Tensor:
    """Their `Sinkhorn`: kernel (C, N, P), marginals u (N,) and v (C, P) -> the plans (C, N, P). It stops when the
    mean change of the row scalings drops below tol (the first check compares against ones)."""
    r = torch.ones_like(u)
    c = torch.ones_like(v)
    for _ in range(iterations):
        r0 = r
        r = u / (kernel @ c.unsqueeze(-1)).squeeze(-1)
        c = v / (kernel.transpose(1, 2) @ r.unsqueeze(-1)).squeeze(-1)
        if float((r - r0).abs().mean()) < tol:
            break
    return r.unsqueeze(-1) * c.unsqueeze(-2) * kernel


def awt_logits(image_features: torch.Tensor, text_features: torch.Tensor, scale: float, cfg: AWTConfig) -> torch.Tensor:
    """(N, D) view features, (C, P, D) prompt features -> (C,) AWT's logits."""
    n_cls, n_prompts, dim = text_features.shape
    logits = scale * image_features.float() @ text_features.reshape(-1, dim).float().T
    logits = logits.view(-1, n_cls, n_prompts).transpose(1, 2)                  # (N, P, C)
    image_w, text_w = entropy_weights(logits, cfg.image_temperature, cfg.text_temperature)
    sim = (logits / scale).permute(2, 0, 1)                                     # (C, N, P) cosines
    plan = sinkhorn(torch.exp(-(1.0 - sim) / cfg.ot_eps), image_w, text_w, cfg.sinkhorn_iterations, cfg.sinkhorn_tol)
    return (plan.permute(1, 2, 0) * logits).sum((0, 1))


class AWT(EpisodicMethod):
    """AWT: entropy-weighted views x descriptions, per-class optimal transport."""
    spec = AWTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        if cfg.description_file and not cfg.n_descriptions:
            raise ValueError(f"{self.name}.description_file is set but {self.name}.n_descriptions is 0: the file would "
                             f"not be read; set {say_set(self.name, 'n_descriptions', 50)} (their evaluate.sh's, "
                             "the paper protocol's) or leave out description_file")

    def prepare(self) -> None:
        _ = self.prompt_features

    @property
    def prompt_features(self) -> torch.Tensor:
        """(C, 1 + M, D) normalised features of each class's prompts, computed once per run."""
        cfg = self.config
        key = ("awt_prompts", cfg.template, cfg.description_file, cfg.n_descriptions, self.precision.key)
        shared = self.heads.shared
        if key not in shared:
            names = [c.replace("_", " ") for c in self.classnames]
            if cfg.n_descriptions:   # with a description_file: the spec's config_problem refused a config without
                described = load_descriptions(cfg.description_file, self.classnames, f"{self.name}.description_file")
                short = [n for n, d in zip(names, described) if len(d) < cfg.n_descriptions]
                if short:
                    raise ValueError(f"{self.name}.description_file: {len(short)} classes have fewer than "
                                     f"n_descriptions={cfg.n_descriptions} descriptions (first: {short[0]!r})")
            else:
                described = [[] for _ in names]
            prompts = [[cfg.template.format(n) + "."] + [cfg.template.format(n) + ". " + d
                                                          for d in desc[:cfg.n_descriptions]]
                       for n, desc in zip(names, described)]
            flat = encode_texts(self.heads.model, [p for ps in prompts for p in ps])
            shared[key] = flat.view(len(names), 1 + cfg.n_descriptions, -1)
        return shared[key]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        logits = awt_logits(ctx.image_features, self.prompt_features, self.model.logit_scale, self.config)
        return MethodOutput(logits)
