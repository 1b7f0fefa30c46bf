"""Episodic test-time prompt tuning: TPT, C-TPT, O-TPT and R-TPT (RLCF's student too: methods/rlcf/).

One shared recipe (TPT, Shu et al. 2022; methods/common/prompt_tuning.py): learnable context vectors start from the
embeddings of "a photo of a" for every image; the image tower is frozen, so the
views are encoded once and only the text tower runs per step; the most confident
views (lowest entropy) give an unsupervised loss; AdamW takes `steps` steps.

The variants differ in the loss and the readout:
- TPT: entropy of the mean probability of the selected views; predict view 0.
- C-TPT (Yoon et al. 2024): TPT's loss - lambda * ATFD (text feature dispersion).
- O-TPT (Sharifdeen et al. 2025): TPT's loss + lambda * an orthogonality penalty on the
  class features (how far each row of their Gram matrix is from unit length).
- R-TPT (Sheng et al. 2025): mean of the selected views' entropies; predict a
  reliability-weighted average of all views' tuned logits.
"""
from __future__ import annotations

import torch

from ..common.confidence import mean_entropy
from ..common.prompt_tuning import PenalisedPromptTuning, PromptTuning
from ..kinds import EpisodicMethod
from .spec import (
    CTPTSpec,
    OTPTSpec,
    RTPTSpec,
    TPTSpec,
)


def text_dispersion(text_features: torch.Tensor) -> torch.Tensor:
    """ATFD: mean L2 distance of normalised class features to their mean: (..., C, D) -> (...)."""
    centre = text_features.mean(dim=-2, keepdim=True)
    return (text_features - centre).norm(dim=-1).mean(-1)


def orthogonality_penalty(text_features: torch.Tensor) -> torch.Tensor:
    """O-TPT's penalty: mean over classes of | ||row c of T T^T|| - 1 |, (..., C, D) normalised -> (...).

    The authors (otpt_classification.py:236-286) reflect each row w_c of W = T T^T with the Householder
    matrix that maps it onto its c-th axis, H_c w_c = ||w_c|| e_c (H_c = I - 2 v v^T, v along
    w_c - ||w_c|| e_c), and take the mean of ||H_c w_c - e_c||. That equals | ||w_c|| - 1 | for every T,
    so its value and its gradient are this closed form's; the closed form needs C x C memory where the
    authors' reflections need C x C x C (ImageNet's 1000 classes: 4 GB in float32)."""
    gram = text_features @ text_features.transpose(-1, -2)              # (..., C, C)
    return (gram.norm(dim=-1) - 1).abs().mean(-1)


def reliability_weights(image_features: torch.Tensor, k: int = 20, temperature: float = 0.01,
                        self_mask: str = "index", sim: torch.Tensor | None = None) -> torch.Tensor:
    """R-TPT's view weights: softmax(mean of each view's top-k neighbour similarities / T).

    `self_mask="index"` removes the diagonal by position (the evident intent);
    `"threshold"` reproduces the authors' rule, which drops every entry >= 1.0 and so
    keeps a view as its own neighbour whenever rounding leaves its self-similarity below 1.
    """
    sim = image_features @ image_features.transpose(-1, -2) if sim is None else sim.clone()
    n = sim.shape[-1]
    if self_mask == "index":
        eye = torch.eye(n, dtype=torch.bool, device=sim.device)
        sim = sim.masked_fill(eye, float("-inf"))
    elif self_mask == "threshold":
        sim = sim.masked_fill(sim >= 1.0, float("-inf"))
    else:
        raise ValueError(f"self_mask must be 'index' or 'threshold', got {self_mask!r}")
    score = sim.topk(min(k, n - 1), dim=-1).values.mean(-1)
    return (score / temperature).softmax(-1)


class TPT(PromptTuning, EpisodicMethod):
    """TPT: marginal entropy of the confident views, one AdamW step, predict view 0: the shared recipe as it is."""
    spec = TPTSpec


class CTPT(PenalisedPromptTuning, EpisodicMethod):
    """C-TPT: TPT's loss - lambda * ATFD of the class features in the same forward pass."""
    spec = CTPTSpec

    penalty_name = "atfd"

    def penalty(self, text_features: torch.Tensor) -> torch.Tensor:
        return text_dispersion(text_features)

    def penalty_weight(self) -> float:
        return -self.config.lambda_atfd


class OTPT(PenalisedPromptTuning, EpisodicMethod):
    """O-TPT: TPT's loss + lambda * the orthogonality penalty of the class features in the same forward pass."""
    spec = OTPTSpec

    penalty_name = "orthogonality"

    def penalty(self, text_features: torch.Tensor) -> torch.Tensor:
        return orthogonality_penalty(text_features)

    def penalty_weight(self) -> float:
        return self.config.lambda_ortho


class RTPT(PromptTuning, EpisodicMethod):
    """R-TPT: mean per-view entropy of the confident views; reliability-weighted ensemble of all views."""
    spec = RTPTSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return mean_entropy(selected_logits), {}

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        cfg = self.config
        scale = self.model.logit_scale
        view_logits = scale * torch.einsum("bnd,bcd->bnc", image_features, text_features)
        weights = reliability_weights(image_features, cfg.k_neighbours, cfg.temperature, cfg.self_mask)
        logits = torch.einsum("bn,bnc->bc", weights, view_logits)
        w_entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1)
        return logits, {"weight_entropy": w_entropy}
