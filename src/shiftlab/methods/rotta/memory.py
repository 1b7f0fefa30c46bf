"""RoTTA's category-balanced memory with timeliness and uncertainty (CSTU), as CLIPTTA's toolkit has it
(github.com/MarcLafon/cliptta at f4221f4, `ttavlm/memory/cstu.py`, the same rule as BIT-DA/RoTTA's
`core/utils/memory.py`). Deterministic: no random draw."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Item:
    image: torch.Tensor        # (3, S, S) normalised pixels
    uncertainty: float         # the teacher's prediction entropy when it entered
    age: int = 0               # images added since it entered (its own addition included)


class CategoryBalancedMemory:
    """Up to `capacity` images filed under their pseudo-labels. A new image (score = `heuristic(0, u)`) enters when
    its class holds under capacity / C images and the memory has room; otherwise it must displace the image of
    highest heuristic score (old and uncertain) from the largest classes (its own class when that one is full),
    and only when that score is above its own (cstu.py:58-103). Every addition, admitted or not, ages each
    stored image by one (cstu.py:63, 121-125)."""

    def __init__(self, num_classes: int, capacity: int, lambda_t: float, lambda_u: float):
        self.num_classes, self.capacity, self.lambda_t, self.lambda_u = num_classes, capacity, lambda_t, lambda_u
        self.per_class = capacity / num_classes
        self.reset()

    def reset(self) -> None:
        self.items: list[list[Item]] = [[] for _ in range(self.num_classes)]

    def __len__(self) -> int:
        return sum(len(c) for c in self.items)

    def heuristic(self, age: int, uncertainty: float) -> float:
        """cstu.py:118-119: lambda_t sigmoid(age / capacity) + lambda_u uncertainty / log C."""
        return (self.lambda_t * 1 / (1 + math.exp(-age / self.capacity))
                + self.lambda_u * uncertainty / math.log(self.num_classes))

    def _make_room(self, classes: list[int], score: float) -> bool:
        best: tuple[float, int, int] | None = None
        for cls in classes:
            for index, item in enumerate(self.items[cls]):
                s = self.heuristic(item.age, item.uncertainty)
                if best is None or s >= best[0]:          # the last of equal scores, as theirs
                    best = (s, cls, index)
        if best is None:
            return True
        if best[0] > score:
            self.items[best[1]].pop(best[2])
            return True
        return False

    def add(self, image: torch.Tensor, cls: int, uncertainty: float) -> bool:
        """File one image under `cls`; whether it entered. Ages every stored image (the new one included)."""
        score = self.heuristic(0, uncertainty)
        if len(self.items[cls]) < self.per_class:
            if len(self) < self.capacity:
                admitted = True
            else:
                sizes = [len(c) for c in self.items]
                admitted = self._make_room([c for c, n in enumerate(sizes) if n == max(sizes)], score)
        else:
            admitted = self._make_room([cls], score)
        if admitted:
            self.items[cls].append(Item(image, uncertainty))
        for per_class in self.items:
            for item in per_class:
                item.age += 1
        return admitted

    def contents(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(N, 3, S, S) the stored images class by class, and (N,) their ages / capacity (cstu.py:127-138)."""
        flat = [item for per_class in self.items for item in per_class]
        if not flat:
            return None
        return (torch.stack([item.image for item in flat]),
                torch.tensor([item.age / self.capacity for item in flat], dtype=torch.float32))

    def state(self) -> dict[str, Any]:
        flat = [(c, item) for c, per_class in enumerate(self.items) for item in per_class]
        return {"images": torch.stack([item.image for _, item in flat]) if flat else torch.zeros(0),
                "classes": torch.tensor([c for c, _ in flat], dtype=torch.long),
                "uncertainties": torch.tensor([item.uncertainty for _, item in flat], dtype=torch.float64),
                "ages": torch.tensor([item.age for _, item in flat], dtype=torch.long)}

    def load(self, state: dict[str, Any]) -> None:
        self.reset()
        for image, cls, uncertainty, age in zip(state["images"], state["classes"].tolist(),
                                                state["uncertainties"].tolist(), state["ages"].tolist()):
            self.items[cls].append(Item(image, uncertainty, age))
