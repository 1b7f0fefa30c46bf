"""SoTTA on CLIP (Gong et al., NeurIPS 2023), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at
f4221f4, `ttavlm/methods/sotta.py` with `memory/hus.py` and `optimizers/sam.py`), for every batch of test images
(view 0 of each, through the tower of `common.norm_adaptation`):

1. the tower as it stands predicts each image's class c and its max_prob at `ood_logit_scale`; one image after the
   other enters the class-balanced memory when that score is at least `confidence_threshold`, replacing, once the
   memory holds `capacity` images, a random image of a largest class (of c itself when c is one) (sotta.py:57-68,
   hus.py:72-120);
2. `steps` times, when the memory holds any image: loss = the entropy at `logit_scale` of the memory's images
   (`memory_loss`), one optimiser step, sharpness-aware (SAM's two passes) when `sam` (sotta.py:70-80).

Then the batch's logits through the adapted tower, and its own OOD score recorded with each image (sotta.py:83-87).
README.md lists what differs from the authors' code.
"""
from __future__ import annotations

import random
from typing import Any

import torch

from ..common.confidence import entropy
from ..common.ood_scores import OwnOODScoreMethod, ood_scores
from ..common.sam import MemoryReplay
from .spec import SoTTASpec


class BalancedMemory:
    """HUS (hus.py): up to `capacity` images, each filed under its predicted class, admitted when confident and
    making room by evicting a random image of a largest class. `rng` makes the draws their global `random` makes."""

    def __init__(self, num_classes: int, capacity: int, threshold: float, seed: int):
        self.num_classes, self.capacity, self.threshold, self.seed = num_classes, capacity, threshold, seed
        self.rng = random.Random(seed)
        self.reset()

    def reset(self) -> None:
        self.images: list[list[torch.Tensor]] = [[] for _ in range(self.num_classes)]
        self.confidences: list[list[float]] = [[] for _ in range(self.num_classes)]
        self.rng.seed(self.seed)

    def __len__(self) -> int:
        return sum(len(c) for c in self.images)

    def _evict(self, cls: int) -> None:
        sizes = [len(c) for c in self.images]
        largest = [i for i, n in enumerate(sizes) if n == max(sizes)]
        victim = cls if cls in largest else self.rng.choice(largest)
        index = self.rng.randrange(0, len(self.images[victim]))
        self.images[victim].pop(index)
        self.confidences[victim].pop(index)

    def add(self, image: torch.Tensor, cls: int, confidence: float) -> bool:
        """File one (3, S, S) image under `cls`; whether it was admitted."""
        if confidence < self.threshold:
            return False
        if len(self) >= self.capacity:
            self._evict(cls)
        self.images[cls].append(image)
        self.confidences[cls].append(confidence)
        return True

    def contents(self) -> torch.Tensor | None:
        """(N, 3, S, S) the stored images, class by class in insertion order (their get_memory), or None."""
        flat = [im for per_class in self.images for im in per_class]
        return torch.stack(flat) if flat else None

    def state(self) -> dict[str, Any]:
        classes = [c for c, per_class in enumerate(self.images) for _ in per_class]
        version, internal, gauss = self.rng.getstate()
        return {"images": self.contents() if classes else torch.zeros(0),
                "classes": torch.tensor(classes, dtype=torch.long),
                "confidences": torch.tensor([x for per_class in self.confidences for x in per_class],
                                            dtype=torch.float64),
                "rng": torch.tensor(internal, dtype=torch.long), "rng_version": version}

    def load(self, state: dict[str, Any]) -> None:
        self.images = [[] for _ in range(self.num_classes)]
        self.confidences = [[] for _ in range(self.num_classes)]
        for image, cls, confidence in zip(state["images"], state["classes"].tolist(), state["confidences"].tolist()):
            self.images[cls].append(image)
            self.confidences[cls].append(confidence)
        self.rng.setstate((state["rng_version"], tuple(state["rng"].tolist()), None))


class SoTTA(MemoryReplay, OwnOODScoreMethod):
    """SoTTA: entropy minimisation on a class-balanced memory of confident test images."""
    spec = SoTTASpec

    def reset_extra(self) -> None:
        cfg = self.config
        if not hasattr(self, "memory"):
            self.memory = BalancedMemory(len(self.classnames), cfg.capacity, cfg.confidence_threshold,
                                         cfg.memory_seed)
        self.memory.reset()

    def extra_state(self) -> dict[str, Any]:
        return {"memory": self.memory.state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.memory.load(state["memory"])

    def memory_loss(self, images: torch.Tensor) -> torch.Tensor:
        """() the entropy of the memory's images at the logit scale: their mean, or the first one's alone."""
        if self.config.memory_loss == "first":
            images = images[:1]
        return entropy(self.logits(images)).mean(0)

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        with torch.no_grad():
            cosines = self.encode(pixels) @ self.head.T
        confidence = ood_scores(cosines, "max_prob", cfg.ood_logit_scale)
        admitted = [self.memory.add(image.detach().clone(), int(c), float(s))
                    for image, c, s in zip(pixels, cosines.argmax(-1).tolist(), confidence)]
        losses = []
        for _ in range(cfg.steps):
            images = self.memory.contents()
            if images is not None:
                losses.append(self.step_on_memory(images))
        logits, scores = self.scored_logits(pixels)
        return logits, self.scored_extras(scores, losses, {"admitted": admitted}, memory=len(self.memory))
