"""CLIP-OT on CLIP, as its authors' code runs it (github.com/shambhavicodes/CLIPOT at 81b8a4e: the adaptation loop of
`main.py`, `ClipOTLoss` / `distributed_sinkhorn` / `ClipOTMethod` of `clipot.py`, `Adapter` / `LinearProbeHead` of
`modeling/models.py`). For every batch of test images:

1. for each template t = 0 .. steps-1: the batch's view 0 through the adapted image tower, unit features f (B, D);
   the soft labels Q (B, C) = Sinkhorn codes of f against template t's unit text features (temperature, epsilon,
   3 iterations; the codes keep their gradient, as theirs do); loss = cross-entropy of the tower's logits against
   Q; one AdamW step of the LayerNorm affine parameters;
2. the batch's logits through the tower as the last step left it, against the mean over templates of the
   unnormalised text features (normalised): the prediction.

The logits of step 1 read the adapter's head, which their loop leaves at template 0's features for the first batch
and sets to the templates' mean after it (main.py:130-131): `averaged_head` is that state. The tower's parameters,
AdamW's moments and `averaged_head` carry from batch to batch (main.py never resets). README.md lists what differs.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.text import encode_texts
from ..common.norm_adaptation import NormTTAMethod
from .spec import ClipOTSpec


def sinkhorn_codes(similarities: torch.Tensor, epsilon: float, iterations: int, stable: bool = True) -> torch.Tensor:
    """(B, C) similarities -> (B, C) soft codes, each row summing to 1, as their `distributed_sinkhorn`: columns of
    exp(s / epsilon) normalised per image, then `iterations` rounds of rescaling the classes to equal mass 1/C and
    the images to 1/B (1e-8 beside each sum). `stable` subtracts each image's largest similarity first, which the
    first normalisation cancels exactly; theirs overflows to NaN where s / epsilon passes float32's exp range."""
    if stable:
        similarities = similarities - similarities.max(dim=1, keepdim=True).values.detach()
    q = torch.exp(similarities / epsilon).t()
    q = q / q.sum(dim=0, keepdim=True)
    classes, images = q.shape
    r = torch.full((classes,), 1.0 / classes, device=q.device, dtype=q.dtype)
    c = torch.full((images,), 1.0 / images, device=q.device, dtype=q.dtype)
    for _ in range(iterations):
        q = q * (r / (q.sum(dim=1) + 1e-8)).unsqueeze(1)
        q = q * (c / (q.sum(dim=0) + 1e-8)).unsqueeze(0)
    return (q / q.sum(dim=0, keepdim=True)).t()


def soft_cross_entropy(codes: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -sum_c codes * log_softmax(logits) (their ClipOTLoss.forward)."""
    return -(codes * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


class ClipOT(NormTTAMethod):
    """CLIP-OT: one AdamW step per template on Sinkhorn codes, through the image tower's LayerNorms."""
    spec = ClipOTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        names = [c.replace("_", " ") for c in self.classnames]
        templates = list(self.config.templates)
        # (C, T, D) each template's unnormalised text features (their get_text_prototypes)
        flat = encode_texts(self.model, [t.format(name) for name in names for t in templates], normalize=False)
        self.template_features = flat.view(len(names), len(templates), -1)
        if self.config.steps > len(templates):
            raise ValueError(f"{self.name}.steps: {self.config.steps} steps need as many templates, "
                             f"{len(templates)} given")

    def adapted_layer_kinds(self) -> tuple[type, ...]:
        return (nn.LayerNorm,)

    @property
    def head(self) -> torch.Tensor:
        """(C, D) the prediction head: the templates' mean features, normalised."""
        return F.normalize(self.template_features.mean(dim=1), dim=-1)

    def adaptation_head(self) -> torch.Tensor:
        return self.head if self.averaged_head else F.normalize(self.template_features[:, 0], dim=-1)

    def reset_extra(self) -> None:
        self.averaged_head = False

    def extra_state(self) -> dict[str, Any]:
        return {"averaged_head": self.averaged_head}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.averaged_head = bool(state["averaged_head"])

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        losses = []
        for t in range(cfg.steps):
            features = self.encode(pixels)
            logits = self.scale * features @ self.adaptation_head().T
            targets = F.normalize(self.template_features[:, t], dim=-1)
            codes = sinkhorn_codes(features @ targets.T / cfg.temperature, cfg.epsilon, cfg.sinkhorn_iterations,
                                   cfg.stable_sinkhorn)
            loss = soft_cross_entropy(codes, logits)
            losses.append(float(loss.detach()))
            self.step(loss)
        self.averaged_head = True
        with torch.no_grad():
            logits = self.logits(pixels)
        extras = {"loss": losses[0], "last_loss": losses[-1]}
        return logits.detach(), [dict(extras) for _ in range(pixels.shape[0])]
