"""AdaContrast on CLIP (Chen et al., CVPR 2022), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at
f4221f4, `ttavlm/methods/adacontrast.py` with `transforms/moco_transforms.py`), for every batch of test images
(view 0 of each, through the tower of `common.norm_adaptation`), `steps` times (adacontrast.py:59-127):

1. the neighbour bank: the batch's features through the tower as it stands and their softmax probabilities;
2. three augmentations of the batch (`common.moco_augment`: weak w, strong q and k, drawn from a generator seeded by
   `seed`, the batch's index and the step); w's and q's features through the tower, k's through the key encoder;
3. each image's pseudo-label: the argmax of the mean probability of the `n_neighbors` bank entries nearest to its
   weak feature (`distance`), that mean its refined probability;
4. the queue (`queue_size` keys with their pseudo-labels, a ring) takes the batch's keys;
5. loss = `beta_cls` CE(q's logits, pseudo-labels) + `beta_ins` InfoNCE(q against its key and the queue as it was
   before step 4, at `temperature`, the queue's entries of the same pseudo-label (after step 4) left out)
   + `beta_div` (-H(mean refined probability) - H(mean of q's probabilities)), one optimiser step; with
   `key_momentum`, the key encoder follows the tower (weight 1 - `m`).

Then the batch's logits through the adapted tower, and its own OOD score recorded with each image. README.md lists
what differs from the authors' code.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common.moco_augment import adacontrast_views
from ..common.norm_ema_teacher import NormEMATeacher
from ..common.ood_scores import OwnOODScoreMethod
from .spec import AdaContrastSpec


def refined_pseudo_labels(features: torch.Tensor, bank_features: torch.Tensor, bank_probs: torch.Tensor, k: int,
                          distance: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, D) features, (N, D) and (N, C) the bank -> (B,) labels and (B, C) the mean probability of each
    feature's k nearest bank entries (adacontrast.py:156-188); ties of distance keep the lower index."""
    if distance == "euclidean":
        distances = torch.cdist(features.float(), bank_features.float())
    else:
        distances = 1 - features @ bank_features.T
    nearest = distances.sort(stable=True).indices[:, :k]
    probs = bank_probs[nearest].mean(1)
    return probs.argmax(1), probs


def mean_probability_entropy(probs: torch.Tensor) -> torch.Tensor:
    """() the entropy of the batch's mean probability, eps 1e-8 inside the log (adacontrast.py:108-111)."""
    mean = probs.mean(0)
    return -(mean * torch.log(mean + 1e-8)).sum()


def instance_loss(queries: torch.Tensor, keys: torch.Tensor, queue: torch.Tensor, same_label: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    """MoCo's InfoNCE (adacontrast.py:86-102): (B, D) queries, (B, D) their keys, (D, K) the queue, (B, K) True
    where a queue entry shares the query's pseudo-label (left out of the negatives)."""
    positive = (queries * keys).sum(-1, keepdim=True)
    logits = torch.cat([positive, queries.float() @ queue.float()], dim=1) / temperature
    logits = logits.masked_fill(torch.cat([torch.zeros_like(same_label[:, :1]), same_label], dim=1), float("-inf"))
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


class AdaContrast(OwnOODScoreMethod):
    """AdaContrast: pseudo-labels refined by nearest neighbours, a contrastive key queue and a diversity term."""
    spec = AdaContrastSpec

    def reset_extra(self) -> None:
        cfg = self.config
        if not hasattr(self, "keys"):
            self.keys = NormEMATeacher(self.model.clip, self.tower, getattr(cfg, "skip_top_layers", "none"))
        self.keys.load(self.tower.norm_state())
        g = torch.Generator().manual_seed(cfg.seed)
        dim = self.head.shape[1]
        queue = torch.randn(dim, cfg.queue_size, generator=g)
        if cfg.queue_init == "unit":
            queue = F.normalize(queue, dim=0)
        self.queue = queue.to(self.model.device)
        self.queue_labels = torch.randint(0, len(self.classnames), (cfg.queue_size,), generator=g).to(self.model.device)
        self.queue_pointer = 0
        self.batches = 0          # batches adapted on since the initial state: the augmentations' seed

    def episodic_reset(self) -> None:
        self.reset_tower()      # their reset: the parameters and the optimiser; the queue and key encoder run on

    def extra_state(self) -> dict[str, Any]:
        return {"keys": self.keys.state(), "queue": self.queue, "queue_labels": self.queue_labels,
                "queue_pointer": self.queue_pointer, "batches": self.batches}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.keys.load(state["keys"])
        self.queue = state["queue"].to(self.model.device)
        self.queue_labels = state["queue_labels"].to(self.model.device)
        self.queue_pointer = int(state["queue_pointer"])
        self.batches = int(state["batches"])

    def augment(self, pixels: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) -> the weak, query and key views."""
        return adacontrast_views(pixels, g, self.config.aug_type, self.config.renormalize)

    def key_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, D) unit features through the key encoder, without gradients."""
        if self.model.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        with torch.no_grad(), self.precision.autocast():
            return F.normalize(self.keys.tower(pixels).float(), dim=-1)

    def enqueue(self, keys: torch.Tensor, labels: torch.Tensor) -> None:
        """The ring queue takes the batch's keys and pseudo-labels (adacontrast.py:131-141)."""
        where = torch.arange(self.queue_pointer, self.queue_pointer + len(keys), device=keys.device) % len(
            self.queue_labels)
        self.queue[:, where] = keys.float().T
        self.queue_labels[where] = labels
        self.queue_pointer = (self.queue_pointer + len(keys)) % len(self.queue_labels)

    def adapt_once(self, pixels: torch.Tensor, step: int) -> float:
        cfg = self.config
        s = cfg.loss_logit_scale
        with torch.no_grad():
            bank_features = self.encode(pixels)
            bank_probs = (s * bank_features @ self.head.T).softmax(-1)
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.batches * 1009 + step)
        weak, query, key = self.augment(pixels, g)
        with torch.no_grad():
            weak_features = self.encode(weak)
        query_features = self.encode(query)
        query_logits = s * query_features @ self.head.T
        keys = self.key_features(key)
        queue = self.queue.clone()
        with torch.no_grad():
            labels, refined = refined_pseudo_labels(weak_features, bank_features, bank_probs, cfg.n_neighbors,
                                                    cfg.distance)
        self.enqueue(keys, labels)
        same_label = labels[:, None] == self.queue_labels[None, :]
        loss_ins = instance_loss(query_features, keys, queue, same_label, cfg.temperature)
        loss_cls = F.cross_entropy(query_logits, labels)
        loss_div = -mean_probability_entropy(refined) - mean_probability_entropy(query_logits.softmax(-1))
        loss = cfg.beta_cls * loss_cls + cfg.beta_ins * loss_ins + cfg.beta_div * loss_div
        self.step(loss)
        if cfg.key_momentum:
            self.keys.follow(self.tower, 1 - cfg.m)
        return float(loss.detach())

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        losses = [self.adapt_once(pixels, step) for step in range(self.config.steps)]
        self.batches += 1
        logits, scores = self.scored_logits(pixels)
        return logits, self.scored_extras(scores, losses)
