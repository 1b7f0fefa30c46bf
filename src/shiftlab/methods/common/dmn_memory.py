"""DMN's dynamic memory (Zhang et al., CVPR 2024, "Dual Memory Networks"), the machinery its family shares
(DMN-ZS: methods/dmn_zs/; COSMIC's CLIP memory: methods/cosmic/): per class up to a fixed number of test
features, ranked by entropy, and DMN's similarity-weighted read-out of them.
"""
from __future__ import annotations

from typing import Any

import torch


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
