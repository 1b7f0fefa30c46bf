"""DMN-ZS (Zhang et al., CVPR 2024, "Dual Memory Networks"), zero-shot variant.

The dynamic memory only (no training data, so no static memory and no learned projections):
per class, up to `memory_size` test features; the class's text feature and its memorised
features, weighted by exp(-beta (1 - similarity)) to the test feature, give an adaptive class
prototype whose prediction is mixed with the zero-shot prediction. Online: see docs/ONLINE.md.
"""
from __future__ import annotations

from typing import Any

import torch

from ..base import Method, MethodOutput
from ..common.confidence import lowest
from ..common.online_common import STATE_VERSION, check_state, first_views
from ..context import SampleContext
from ..heads import check_descriptions, text_head
from .spec import DMNZeroShotSpec


class DynamicMemory:
    """DMN's dynamic memory: per class up to `capacity` (feature, entropy) slots.

    Dense tensors (C, capacity, D) and (C, capacity) with a fill count per class, so
    the readout is one batched computation; empty slots hold zeros and add nothing.
    """

    def __init__(self, num_classes: int, capacity: int):
        if capacity < 1:
            raise ValueError(f"memory capacity must be at least 1, got {capacity}")
        self.num_classes, self.capacity = num_classes, capacity
        self.features: torch.Tensor | None = None         # (C, M, D), allocated on first insert
        self.entropies = torch.zeros(num_classes, capacity)
        self.counts = [0] * num_classes

    def _allocate(self, like: torch.Tensor) -> None:
        if self.features is None:
            self.features = like.new_zeros(self.num_classes, self.capacity, like.shape[-1])
            self.entropies = self.entropies.to(like.device)

    def __len__(self) -> int:
        return sum(self.counts)

    def update(self, label: int, feature: torch.Tensor, entropy_value: float) -> int | None:
        """Store (feature, entropy) under `label`; returns the slot used, or None.

        While the class has room the entry takes the next slot. When it is full, the entry
        replaces the slot with the highest entropy (the last such slot on ties) if its own
        entropy is strictly lower; otherwise it is dropped.
        """
        self._allocate(feature)
        n = self.counts[label]
        if n < self.capacity:
            slot = n
            self.counts[label] = n + 1
        else:
            ent = self.entropies[label]
            worst = float(ent.max())
            if not entropy_value < worst:
                return None
            slot = int(torch.nonzero(ent == worst).max())
        self.features[label, slot] = feature
        self.entropies[label, slot] = entropy_value
        return slot

    def state_dict(self) -> dict[str, Any]:
        labels, slots = [], []
        for c, n in enumerate(self.counts):
            labels += [c] * n
            slots += list(range(n))
        if labels:
            feats = self.features[labels, slots].detach().cpu()
            ents = self.entropies[labels, slots].detach().cpu()
        else:
            feats, ents = torch.zeros(0), torch.zeros(0)
        return {"capacity": self.capacity, "labels": labels, "features": feats, "entropies": ents}

    @classmethod
    def from_state(cls, state: dict[str, Any], num_classes: int, capacity: int,
                   device: torch.device) -> DynamicMemory:
        if state["capacity"] != capacity:
            raise ValueError(f"dmn_zs: state has memory_size {state['capacity']}, config says {capacity}")
        mem = cls(num_classes, capacity)
        for i, label in enumerate(state["labels"]):
            feat = state["features"][i].to(device, torch.float32)
            mem._allocate(feat)
            slot = mem.counts[label]
            mem.features[label, slot] = feat
            mem.entropies[label, slot] = state["entropies"][i].to(device, torch.float32)
            mem.counts[label] = slot + 1
        return mem


def memory_logits(feature: torch.Tensor, memory: DynamicMemory, text_features: torch.Tensor, beta: float,
                  logit_scale: float) -> torch.Tensor:
    """DMN's similarity-weighted readout of the dynamic memory for one feature (D,) -> logits (C,).

    Per class the values are its memorised features followed by its text feature; each is
    weighted by exp(-beta (1 - cos(feature, value))), the weighted sum is normalised into an
    adaptive class prototype, and the logit is logit_scale x cos(prototype, feature).
    """
    values = text_features.unsqueeze(1)                       # (C, 1, D)
    if memory.features is not None:
        values = torch.cat([memory.features.to(feature), values], dim=1)   # (C, M + 1, D)
    weights = (beta * (values @ feature) - beta).exp()        # (C, M + 1); empty slots: value 0
    prototypes = torch.nn.functional.normalize((weights.unsqueeze(-1) * values).sum(1), dim=-1)
    return logit_scale * prototypes @ feature


class DMNZeroShot(Method):
    """DMN-ZS: zero-shot Dual Memory Network (dynamic memory only), online.

    Per sample: softmax of every view's zero-shot logits (the `text_head`: 80 templates, or the
    authors' `tip_cupl`); the 10%
    lowest-entropy views' mean probability gives the pseudo-label and the entropy; the
    original view's feature is written into the pseudo-label's memory (replacing the
    highest-entropy slot of a full class when more confident). Then, with the updated
    memory, p = (p_zs + w * p_dyn) / (1 + w), with p_zs the original view's zero-shot
    probability and p_dyn the softmax of the memory readout; logits = log p.
    """
    spec = DMNZeroShotSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_descriptions(self.name, self.config, self.classnames)   # a missing CuPL file: before any sample
        self.reset()

    def prepare(self) -> None:
        _ = text_head(self)

    def reset(self) -> None:
        self.memory = DynamicMemory(len(self.classnames), self.config.memory_size)
        self.seen = 0

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        cfg = self.config
        with torch.no_grad():
            features = first_views(ctx, cfg.views.n_views).float()
            text = text_head(self)
            scale = self.model.logit_scale
            view_probs = (scale * features @ text.T).softmax(-1)
            # the authors' entropies: +1e-6 inside the log for views, +1e-8 for the mean
            view_entropy = -(view_probs * (view_probs + 1e-6).log()).sum(-1)
            kept = lowest(view_entropy, cfg.view_ratio)
            mean_prob = view_probs[kept].mean(0)
            label = int(mean_prob.argmax())
            h = float(-(mean_prob * (mean_prob + 1e-8).log()).sum())
            slot = self.memory.update(label, features[0], h)
            self.seen += 1
            p_dyn = memory_logits(features[0], self.memory, text, cfg.beta, scale).softmax(-1)
            probs = (view_probs[0] + cfg.dynamic_weight * p_dyn) / (1 + cfg.dynamic_weight)
            logits = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
        return MethodOutput(logits, probs=probs, extras={
            "pseudo_label": label, "stored": slot is not None, "memory_entries": len(self.memory)})

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "num_classes": len(self.classnames), "seen": self.seen,
                "memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(self.name, state, len(self.classnames))
        self.memory = DynamicMemory.from_state(state["memory"], len(self.classnames), self.config.memory_size,
                                               self.model.device)
        self.seen = int(state["seen"])
