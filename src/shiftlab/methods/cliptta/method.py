"""CLIPTTA (Lafon et al., NeurIPS 2025): CLIP's contrastive loss at test time, between a batch's images and the
captions of their pseudo-labels, on the image tower's normalisation parameters; and its OOD-aware variant.

Per batch (view 0 of each image), `steps` optimiser steps on
    tta_weight x contrastive(batch [+ memory]) - mean_entropy_weight x H(mean prediction) [+ ood_weight x Otsu loss],
then the batch is predicted with the adapted tower. Authors' code: github.com/MarcLafon/cliptta
(`ttavlm/methods/cliptta_otsu.py`, `abstract_model.py`, `memory/ccm.py`), cited below at f4221f4. What it is and
every choice that differs from it: src/shiftlab/methods/cliptta/README.md.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..common.confidence import entropy
from ..common.norm_adaptation import make_optimizer, mean_prediction_entropy
from ..common.ood_scores import OwnOODScoreMethod, ood_scores
from .spec import CLIPTTAOODSpec, CLIPTTASpec


def contrastive_loss(features: torch.Tensor, head: torch.Tensor, scale: float, targets: str) -> torch.Tensor:
    """features (B, D) unit, head (C, D) -> () CLIPTTA's loss (compute_loss_tta, cliptta_otsu.py:143-181): each
    image against the captions of the batch's pseudo-labels, logits (B, B) = scale x f_i . t_{pred_j}; "soft": the
    mean entropy of each image's softmax over them, "hard": cross-entropy against the identity. With the text
    tower frozen their two directions are the same matrix, so their average is either one. An empty batch
    (every image judged OOD) gives 0 (their mean over no image is NaN, which reaches no parameter)."""
    if features.shape[0] == 0:
        return features.new_zeros(())
    captions = head[(features @ head.T).argmax(-1)]
    logits = scale * features @ captions.T
    if targets == "soft":
        return entropy(logits).mean(0)
    return nn.functional.cross_entropy(logits, torch.eye(len(logits), device=logits.device), reduction="none").mean(0)


def otsu_loss(scores: torch.Tensor, alpha: torch.Tensor, gamma: float, kind: str) -> torch.Tensor:
    """(B,) scores, (1,) threshold -> () the Otsu separation loss (get_otsu_loss, otsu_loss: abstract_model.py:
    553-573): soft ID weights w = sigmoid((s - alpha) / gamma), the ID and OOD means and shares of the scores."""
    w = torch.sigmoid((scores - alpha) / gamma)
    p_in, p_out = w.mean(), (1 - w).mean()
    mu_in = torch.dot(w, scores) / w.sum()
    mu_out = torch.dot(1 - w, scores) / (1 - w).sum()
    if kind == "max_inter_var":
        return -p_in * p_out * (mu_in - mu_out).pow(2)
    if kind == "min_intra_var":
        return -p_out * mu_out.pow(2) - p_in * mu_in.pow(2)
    return -(mu_in - mu_out).pow(2)                         # "avg_contrastive"


def otsu_threshold(scores: torch.Tensor) -> float:
    """Otsu's threshold of the scores (scikit-image's `threshold_otsu`, as their init_otsu and filter_id)."""
    try:
        from skimage.filters import threshold_otsu
    except ImportError:
        raise ImportError("cliptta's OOD-aware variant needs scikit-image (pip install 'shiftlab[ood]')") from None
    return float(threshold_otsu(scores.detach().float().cpu().numpy()))


class ConfidentMemory:
    """Their class-wise confident memory (CCM, memory/ccm.py): per pseudo-label, the `num_shots` images of highest
    confidence seen so far (pixels, on the CPU); a sample draws `max(1, sample_size // C)` of each class (all of
    a class that holds no more), at random with the method's own generator."""

    def __init__(self, n_classes: int, num_shots: int, sample_size: int, seed: int):
        self.n_classes, self.num_shots = n_classes, num_shots
        self.sample_size = min(sample_size, num_shots * n_classes)     # ccm.py:27-29
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        self.images: dict[int, torch.Tensor] = {}
        self.confidences: dict[int, torch.Tensor] = {}
        self.generator = torch.Generator().manual_seed(self.seed)

    def __len__(self) -> int:
        return sum(len(v) for v in self.confidences.values())

    def update(self, images: torch.Tensor, labels: torch.Tensor, confidences: torch.Tensor) -> None:
        """ccm.py:52-68: append each class's images, keep its num_shots most confident (topk order)."""
        images, labels, confidences = images.detach().cpu(), labels.cpu(), confidences.detach().cpu()
        for k in labels.unique().tolist():
            mine = labels == k
            imgs = torch.cat([self.images[k], images[mine]]) if k in self.images else images[mine]
            conf = torch.cat([self.confidences[k], confidences[mine]]) if k in self.confidences else confidences[mine]
            if len(conf) > self.num_shots:
                top = conf.topk(self.num_shots).indices
                imgs, conf = imgs[top], conf[top]
            self.images[k], self.confidences[k] = imgs, conf

    def sample(self) -> torch.Tensor:
        """(M, 3, S, S) images, class by class (ccm.py:77-96)."""
        per_class = max(1, int(self.sample_size / self.n_classes))
        drawn = []
        for k in sorted(self.images):
            imgs = self.images[k]
            if len(imgs) > per_class:
                imgs = imgs[torch.randperm(len(imgs), generator=self.generator)[:per_class]]
            drawn.append(imgs)
        return torch.cat(drawn)

    def state(self) -> dict[str, Any]:
        """Plain tensors: the classes held, how many images each, their images and confidences concatenated."""
        classes = sorted(self.images)
        return {"classes": torch.tensor(classes, dtype=torch.int64),
                "counts": torch.tensor([len(self.confidences[k]) for k in classes], dtype=torch.int64),
                "images": torch.cat([self.images[k] for k in classes]) if classes else torch.zeros(0),
                "confidences": torch.cat([self.confidences[k] for k in classes]) if classes else torch.zeros(0),
                "generator": self.generator.get_state()}

    def load(self, state: dict[str, Any]) -> None:
        classes, counts = state["classes"].tolist(), state["counts"].tolist()
        images, confidences = state["images"].float(), state["confidences"].float()
        starts = [sum(counts[:i]) for i in range(len(counts))]
        self.images = {k: images[a:a + n] for k, a, n in zip(classes, starts, counts)}
        self.confidences = {k: confidences[a:a + n] for k, a, n in zip(classes, starts, counts)}
        self.generator.set_state(state["generator"])


class CLIPTTA(OwnOODScoreMethod):
    """CLIPTTA and its OOD-aware variant (`cliptta_ood`); the config says which (spec.py)."""
    spec = CLIPTTASpec

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        optimizer = make_optimizer(self.config, params)
        # their Otsu threshold, a parameter of its own learnt in the same optimiser (abstract_model.py:114, 164-165)
        self.alpha = nn.Parameter(torch.tensor([0.5], device=self.model.device), requires_grad=self.config.ood_aware)
        if self.config.ood_aware:
            optimizer.add_param_group({"params": self.alpha})
        return optimizer

    def reset_extra(self) -> None:
        cfg = self.config
        if not hasattr(self, "memory"):
            self.memory = ConfidentMemory(len(self.classnames), cfg.num_shots, cfg.sample_size, cfg.memory_seed)
        self.memory.reset()
        with torch.no_grad():
            self.alpha.fill_(0.5)
        self.losses: list[float] = []

    def extra_state(self) -> dict[str, Any]:
        return {"alpha": self.alpha.detach().clone(),
                **({"memory": self.memory.state()} if self.config.memory else {})}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.alpha.copy_(state["alpha"])
        if self.config.memory:
            self.memory.load(state["memory"])

    def scores(self, cosines: torch.Tensor, kind: str | None = None) -> torch.Tensor:
        return ood_scores(cosines, kind or self.config.score, self.config.ood_logit_scale)

    def loss(self, pixels: torch.Tensor, step: int) -> torch.Tensor:
        """One step's loss (_forward_and_adapt, cliptta_otsu.py:67-124)."""
        cfg, head, scale = self.config, self.head, self.scale
        features = self.encode(pixels)
        cosines = features @ head.T
        reg = mean_prediction_entropy(scale * cosines) if cfg.mean_entropy_weight != 0 else features.new_zeros(())
        ood = features.new_zeros(())
        if cfg.ood_aware:
            scores = self.scores(cosines)
            ood = otsu_loss(scores, self.alpha, cfg.gamma, cfg.ood_loss)
            kept = scores > self.alpha                      # filter_id: the images above the threshold adapt
            pixels, features = pixels[kept], features[kept]
        tta = contrastive_loss(features, head, scale, cfg.targets)
        if cfg.memory:
            if step == 0:       # the memory takes the batch's (ID) images once, before its first draw
                with torch.no_grad():
                    cos = features @ head.T
                    self.memory.update(pixels, cos.argmax(-1), self.scores(cos, cfg.memory_score))
            drawn = self.memory.sample() if len(self.memory) else None
            if drawn is not None:
                mem_features = self.encode(drawn.to(pixels.device))
                tta = tta + contrastive_loss(mem_features, head, scale, cfg.targets)
                reg = reg + mean_prediction_entropy(scale * mem_features @ head.T)
        return cfg.tta_weight * tta - cfg.mean_entropy_weight * reg + cfg.ood_weight * ood

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        if cfg.ood_aware:       # init_otsu (abstract_model.py:491-502): the threshold from the batch's scores
            with torch.no_grad():
                threshold = otsu_threshold(self.scores(self.encode(pixels) @ self.head.T))
                self.alpha.fill_(threshold)
        self.losses = []
        for step in range(cfg.steps):
            loss = self.loss(pixels, step)
            self.losses.append(float(loss.detach()))
            self.step(loss)
        with torch.no_grad():
            cosines = self.encode(pixels) @ self.head.T
            scores = self.scores(cosines)
        extras = [{"ood_score": float(s), "memory": len(self.memory)} for s in scores]
        if cfg.ood_aware:
            for extra, s in zip(extras, scores):
                extra["judged_id"] = bool(s > self.alpha)
        return self.scale * cosines, extras


class CLIPTTAOOD(CLIPTTA):
    """CLIPTTA's OOD-aware variant (`ood_aware=True` and the open-set scripts' score by default)."""
    spec = CLIPTTAOODSpec
