"""BATCLIP on CLIP, as its authors' code runs it (sarthaxxxxx/BATCLIP at ba2e338, `classification/methods/ours.py`
on `ZeroShotCLIP.forward` of `models/model.py` and the losses of `utils/losses.py`). For every batch of test images,
`steps` times (1 in their configs):

1. view 0 of each image through the adapted image tower: raw features v (B, D); the class prompts ("a photo of a
   {}.") through the adapted text tower: unit text features t (C, D), recomputed with the current parameters (their
   text encoder is not frozen, so ZeroShotCLIP.forward encodes the prompts afresh); logits = scale x cos(v, t);
2. pseudo-labels y = argmax of the logits; for each predicted class k (sorted) the mean m_k of the raw features of
   its images; loss = mean entropy - mean_k <m_k, t_k> (`I2TLoss`) - sum_{k != j} (1 - cos(m_k, m_j))
   (`InterMeanLoss`);
3. one optimiser step (AdamW) of the affine parameters of every normalisation layer of both towers
   (`common/bimodal_norm_tower.BimodalNormTower`; BatchNorm on the batch's statistics, their configure_model).

The prediction is the logits of the last step's forward, before its update (their forward_and_adapt returns those).
The parameters and AdamW's moments carry from batch to batch. README.md lists what differs.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common.bimodal_norm_tower import BimodalNormTower
from ..common.confidence import entropy
from ..common.norm_adaptation import NormTTAMethod
from .spec import BatclipSpec


def class_means(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, D) features, (B,) labels -> (K, D) the mean feature of each label present, labels in increasing order."""
    _, index = torch.unique(labels, sorted=True, return_inverse=True)
    members = F.one_hot(index).to(features.dtype)                        # (B, K)
    return members.T @ features / members.sum(dim=0)[:, None]


def image_to_text_alignment(logits: torch.Tensor, features: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """Their I2TLoss: the mean over the predicted classes k of <mean raw image feature of k, unit text feature of k>
    (logits (B, C), features (B, D), text (C, D))."""
    labels = logits.argmax(dim=1)
    present = torch.unique(labels, sorted=True)
    return (class_means(features, labels) * text[present].to(features.dtype)).sum(dim=1).mean()


def inter_class_dispersion(logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Their InterMeanLoss: sum over ordered pairs of distinct predicted classes of 1 - cosine of their mean
    features (0 for a batch predicting one class)."""
    means = class_means(features, logits.argmax(dim=1))
    means = means / means.norm(dim=1, keepdim=True)
    off_diagonal = ~torch.eye(means.shape[0], dtype=torch.bool, device=means.device)
    return (1 - means @ means.T)[off_diagonal].sum()


def loss_scale_after(scale: float, good_steps: int, finite: bool, growth_interval: int = 2000
                     ) -> tuple[float, int]:
    """torch's GradScaler.update (growth 2, backoff 0.5): the next (scale, consecutive finite steps) after a step
    whose unscaled gradients were `finite` (else the step was skipped)."""
    if not finite:
        return scale * 0.5, 0
    good_steps += 1
    return (scale * 2.0, 0) if good_steps == growth_interval else (scale, good_steps)


def batclip_loss(logits: torch.Tensor, features: torch.Tensor, text: torch.Tensor
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one step (ours.py:27-31) and its three terms: mean entropy - I2T - inter-class dispersion."""
    terms = {"entropy": entropy(logits).mean(0), "i2t": image_to_text_alignment(logits, features, text),
             "inter_mean": inter_class_dispersion(logits, features)}
    loss = terms["entropy"] - terms["i2t"] - terms["inter_mean"]
    return loss, {k: float(v.detach()) for k, v in terms.items()}


class Batclip(NormTTAMethod):
    """BATCLIP: entropy, image-to-text alignment and class-mean dispersion, through both towers' norm parameters."""
    spec = BatclipSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        names = [c.replace("_", " ") for c in self.classnames]
        self.tokens = self.tower.tokens([self.config.template.format(name) for name in names])

    def make_tower(self) -> BimodalNormTower:
        return BimodalNormTower(self.model.clip, self.adapted_layer_kinds())

    def reset_extra(self) -> None:
        self._head: torch.Tensor | None = None
        # their GradScaler(init_scale=1000) (ours.py:13), acting where the run's precision scales losses (fp16)
        self.loss_scale, self.good_steps = float(self.config.loss_scale), 0

    def extra_state(self) -> dict[str, Any]:
        return {"loss_scale": self.loss_scale, "good_steps": self.good_steps}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._head = None
        self.loss_scale, self.good_steps = float(state["loss_scale"]), int(state["good_steps"])

    @property
    def head(self) -> torch.Tensor:
        """(C, D) unit class features through the text tower as it stands (recomputed after every step)."""
        if self._head is None:
            with torch.no_grad(), self.precision.autocast():
                self._head = F.normalize(self.tower.text_features(self.tokens).float(), dim=-1)
        return self._head

    def step(self, loss: torch.Tensor) -> None:
        """One AdamW step; under fp16, as their GradScaler: the loss scaled, the gradients unscaled, the step
        skipped where one is not finite."""
        self._head = None
        if not self.precision.loss_scaling:
            super().step(loss)
            return
        (loss * self.loss_scale).backward()
        grads = [p.grad for p in self.tower.adapted_parameters() if p.grad is not None]
        for grad in grads:
            grad.mul_(1.0 / self.loss_scale)
        finite = all(bool(torch.isfinite(grad).all()) for grad in grads)
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_scale, self.good_steps = loss_scale_after(self.loss_scale, self.good_steps, finite)

    def features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, D) raw image features through the adapted image tower and (C, D) unit text features through the
        adapted text tower, gradients kept."""
        if self.model.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        with self.precision.autocast():
            image, text = self.tower(pixels), self.tower.text_features(self.tokens)
        return image.float(), F.normalize(text.float(), dim=-1)

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        terms = []
        for _ in range(self.config.steps):
            image, text = self.features(pixels)
            logits = self.scale * F.normalize(image, dim=-1) @ text.T
            loss, parts = batclip_loss(logits, image, text)
            terms.append({"loss": float(loss.detach()), **parts})
            self.step(loss)
        extras = {**terms[0], "last_loss": terms[-1]["loss"]}
        return logits.detach(), [dict(extras) for _ in range(pixels.shape[0])]
