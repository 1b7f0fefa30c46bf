"""CLIPArTT (Hakim, Osowiechi et al., WACV 2025): per batch, each image's top-K classes make one caption ("a photo
of a X or Y or Z"); the soft targets are the softmax of the mean of the batch's image-image and caption-caption
similarities; `steps` Adam steps on the cross-entropy between the image-caption logits and these targets adapt
the image tower's normalisation parameters; the batch is then predicted with the adapted tower.

Authors' code: github.com/dosowiechi/CLIPArTT (`adapt.py`, `models/tent.py`), cited below at 6f439ba. What it is
and every choice that differs from it: src/shiftlab/methods/clipartt/README.md.
"""
from __future__ import annotations

from typing import Any

import torch

from ...models.text import encode_texts
from ..common.clipartt_pseudo_labels import captions, clipartt_loss, soft_targets
from ..common.norm_adaptation import NormTTAMethod, refuse_continual
from .spec import CLIPArTTSpec


class CLIPArTT(NormTTAMethod):
    """CLIPArTT on the shared norm-adaptation machinery (common/norm_adaptation.py)."""
    spec = CLIPArTTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        refuse_continual(self)
        if self.config.top_k > len(self.classnames):
            raise ValueError(f"clipartt.top_k: {self.config.top_k} classes per caption but the run has "
                             f"{len(self.classnames)} classes")

    @property
    def head(self) -> torch.Tensor:
        """(C, D) the class head: their "a photo of a {c}" (adapt.py:81), or the 80-template ensemble."""
        if self.config.text_head == "ensemble":
            return self.heads.ensemble
        return self.heads.templated([self.config.template])

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        self.losses: list[float] = []
        model_scale = self.model.logit_scale          # their loss's logit_scale.exp() (clip/model.py:367)
        for _ in range(cfg.steps):
            features = self.encode(pixels)
            top = (features.detach() @ self.head.T).topk(cfg.top_k, dim=-1).indices
            with torch.no_grad():
                texts = encode_texts(self.model, captions(top, list(self.classnames), cfg.template))
            targets = soft_targets(features, texts, cfg.temperature, cfg.targets)
            if cfg.detach_targets:
                targets = targets.detach()
            loss = clipartt_loss(features, texts, targets, model_scale, cfg.transposed_targets)
            self.losses.append(float(loss.detach()))
            self.step(loss)
        with torch.no_grad():
            cosines = self.encode(pixels) @ self.head.T
        return self.scale * cosines, [{"loss": self.losses[-1]} for _ in range(len(pixels))]
