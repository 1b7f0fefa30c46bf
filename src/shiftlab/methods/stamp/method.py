"""STAMP on CLIP (Yu et al., ECCV 2024), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at f4221f4,
`ttavlm/methods/stamp.py`, `optimizers/sam.py`), for every batch of test images (view 0 of each, through the tower
of `common.norm_adaptation`), `steps` times:

1. the tower as it stands gives each image its probabilities at `logit_scale`; the images whose entropy is below
   entropy_margin x ln(C) (and, with `consistency_filtering`, whose prediction equals the source tower's) enter the
   memory under their predicted class; once it holds `memory_length` images, each entry first evicts the oldest
   image of a random class among the non-empty ones of largest running count (stamp.py:18-58, 103-123);
2. when the memory holds any image: every class's running count <- 0.9 count + 0.1 its size; loss = the mean of
   the memory's entropies at `loss_logit_scale`, each weighted by N exp(-H) / sum exp(-H) (the weights in the
   graph); one optimiser step, sharpness-aware (SAM's two passes) when `sam` (stamp.py:125-158).

Then the batch's logits through the adapted tower, and its own OOD score recorded with each image
(stamp.py:161-165). README.md lists what differs from the authors' code.
"""
from __future__ import annotations

import math
import random
from typing import Any

import torch
import torch.nn.functional as F

from ..common.confidence import entropy
from ..common.norm_adaptation import NormTower
from ..common.ood_scores import OwnOODScoreMethod
from ..common.sam import MemoryReplay
from .spec import STAMPSpec


class ClassBalancedMemory:
    """Their RBM (stamp.py:18-66): up to `capacity` images filed under their predicted class; a full memory makes
    room by dropping the oldest image of a random non-empty class of largest running count (float32, as theirs)."""

    def __init__(self, num_classes: int, capacity: int, seed: int):
        self.num_classes, self.capacity, self.seed = num_classes, capacity, seed
        self.rng = random.Random(seed)
        self.reset()

    def reset(self) -> None:
        self.images: list[list[torch.Tensor]] = [[] for _ in range(self.num_classes)]
        self.counts = torch.zeros(self.num_classes)
        self.rng.seed(self.seed)

    def __len__(self) -> int:
        return sum(len(c) for c in self.images)

    def add(self, images: torch.Tensor, classes: list[int]) -> None:
        for image, cls in zip(images, classes):
            if len(self) >= self.capacity:
                filled = [i for i in range(self.num_classes) if self.images[i]]
                top = max(float(self.counts[i]) for i in filled)
                self.images[self.rng.choice([i for i in filled if float(self.counts[i]) == top])].pop(0)
            self.images[cls].append(image)

    def replay(self) -> torch.Tensor:
        """(N, 3, S, S) the stored images class by class; each class's running count moves towards its size."""
        for cls, stored in enumerate(self.images):
            self.counts[cls] = 0.9 * self.counts[cls] + 0.1 * len(stored)
        return torch.stack([im for stored in self.images for im in stored])

    def state(self) -> dict[str, Any]:
        flat = [im for stored in self.images for im in stored]
        version, internal, _ = self.rng.getstate()
        return {"images": torch.stack(flat) if flat else torch.zeros(0),
                "classes": torch.tensor([c for c, stored in enumerate(self.images) for _ in stored],
                                        dtype=torch.long),
                "counts": self.counts.clone(), "rng": torch.tensor(internal, dtype=torch.long),
                "rng_version": version}

    def load(self, state: dict[str, Any]) -> None:
        self.images = [[] for _ in range(self.num_classes)]
        for image, cls in zip(state["images"], state["classes"].tolist()):
            self.images[cls].append(image)
        self.counts = state["counts"].clone()
        self.rng.setstate((state["rng_version"], tuple(state["rng"].tolist()), None))


def reliability_weighted_entropy(logits: torch.Tensor, capacity: int) -> torch.Tensor:
    """(N, C) logits -> () mean of H_i x capacity exp(-H_i) / sum_j exp(-H_j) (stamp.py:133-137; the weights keep
    their gradient, as theirs)."""
    h = entropy(logits)
    weights = 1 / torch.exp(h)
    return (h * (weights / weights.sum() * capacity)).mean()


class STAMP(MemoryReplay, OwnOODScoreMethod):
    """STAMP: entropy minimisation on a class-balanced memory of low-entropy test images."""
    spec = STAMPSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # their norm_model: a copy of the configured model, never stepped (stamp.py:89-90)
        self.source_tower = NormTower(self.model.clip) if self.config.consistency_filtering else None

    def reset_extra(self) -> None:
        if not hasattr(self, "memory"):
            self.memory = ClassBalancedMemory(len(self.classnames), self.config.memory_length,
                                              self.config.memory_seed)
        self.memory.reset()

    def extra_state(self) -> dict[str, Any]:
        return {"memory": self.memory.state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.memory.load(state["memory"])

    @torch.no_grad()
    def remember(self, pixels: torch.Tensor) -> torch.Tensor:
        """Files the batch's reliable images in the memory; (B,) which ones."""
        cosines = self.encode(pixels) @ self.head.T
        probs = (self.scale * cosines).softmax(-1)
        reliable = -(probs * probs.log()).sum(-1) < self.config.entropy_margin * math.log(len(self.classnames))
        if self.source_tower is not None:
            x = pixels.contiguous(memory_format=torch.channels_last) if self.model.channels_last else pixels
            with self.precision.autocast():
                source = F.normalize(self.source_tower(x).float(), dim=-1) @ self.head.T
            reliable &= cosines.argmax(-1) == source.argmax(-1)
        self.memory.add(pixels[reliable].clone(), probs.argmax(-1)[reliable].tolist())
        return reliable

    def memory_loss(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.config.loss_logit_scale * self.encode(images) @ self.head.T
        return reliability_weighted_entropy(logits, self.config.memory_length)

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        losses, reliable = [], None
        for _ in range(cfg.steps):
            reliable = self.remember(pixels)
            if len(self.memory):
                images = self.memory.replay()
                self.optimizer.zero_grad(set_to_none=True)
                losses.append(self.step_on_memory(images))
        logits, scores = self.scored_logits(pixels)
        return logits, self.scored_extras(scores, losses, {"reliable": [bool(r) for r in reliable]},
                                          memory=len(self.memory))
