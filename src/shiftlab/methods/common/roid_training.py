"""What ROID and CMF share (mariodoebler/test-time-adaptation at 8b2ed63: `classification/methods/roid.py`,
`methods/cmf.py`, `utils/losses.py`, `utils/misc.py`): the image tower's normalisation parameters adapted on each
batch, every step

1. the batch's logits through the adapted tower (view 0 of each image);
2. with `use_weighting`, each image's weight from its diversity (1 - cosine between its prediction and a running mean
   prediction) and its certainty (minus its entropy), both min-max normalised over the batch, exp(div x cert / T),
   the images less diverse than the batch's mean masked out; the running mean prediction then updated;
3. the loss: the weighted soft likelihood ratio of the kept images, summed and divided by the batch size; with
   `use_consistency`, plus the symmetric cross-entropy between the kept images' outputs on one random augmentation
   of them (`common/tta_transforms` with reflect padding, no blur, no noise; update k's draws from
   `ema_teacher.update_generator(augment_seed, k)`) and their outputs, weighted and divided alike (roid.py:79-81;
   gradients through both); one optimiser step (SGD with Nesterov momentum);
4. the method's merge of the weights (`after_step`: ROID's ensembling with the source, CMF's filter);

and at the end, with `use_prior_correction`, the outputs multiplied by the batch's smoothed mean prediction.

`RoidTTAMethod` is the `NormTTAMethod` both subclass; `after_step` is where they differ.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .ema_teacher import update_generator
from .norm_adaptation import NormTTAMethod


def soft_likelihood_ratio(logits: torch.Tensor, clip: float = 0.99, eps: float = 1e-5) -> torch.Tensor:
    """(B, C) -> (B,) -sum_c p_c log(p_c / (1 - p_c) + eps), p clamped to [0, clip] (losses.py:31-40)."""
    probs = logits.softmax(1).clamp(min=0.0, max=clip)
    return -(probs * torch.log(probs / (torch.ones_like(probs) - probs) + eps)).sum(1)


def symmetric_cross_entropy(logits: torch.Tensor, reference: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """(B, C), (B, C) -> (B,) -(1 - alpha) sum softmax(reference) log_softmax(logits) - alpha sum softmax(logits)
    log_softmax(reference) (losses.py:13-19, `x` = logits, `x_ema` = reference); no gradient is stopped."""
    return (-(1 - alpha) * (reference.softmax(1) * logits.log_softmax(1)).sum(1)
            - alpha * (logits.softmax(1) * reference.log_softmax(1)).sum(1))


def min_max(x: torch.Tensor) -> torch.Tensor:
    """(B,) -> (x - min) / (max - min); all zeros where every value is equal (their code divides 0 by 0: NaN)."""
    spread = x.max() - x.min()
    return (x - x.min()) / spread if spread > 0 else torch.zeros_like(x)


def roid_weights(logits: torch.Tensor, class_probs: torch.Tensor, temperature: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) logits, (C,) running mean prediction -> (weights (B,), mask (B,) bool: the images left out) as
    roid.py:51-63: diversity = 1 - cos(mean prediction, p), certainty = -entropy, each min-max normalised, weight =
    exp(diversity x certainty / T), the images whose diversity is below the batch's mean masked (weight 0)."""
    probs = logits.softmax(1)
    diversity = min_max(1 - F.cosine_similarity(class_probs.unsqueeze(0), probs, dim=1))
    mask = diversity < diversity.mean()
    certainty = min_max((probs * logits.log_softmax(1)).sum(1))    # minus the entropy (losses.py:5-10)
    weights = torch.exp(diversity * certainty / temperature)
    weights[mask] = 0.0
    return weights, mask


def prior_corrected(logits: torch.Tensor) -> torch.Tensor:
    """(B, C) -> the logits multiplied by the batch's smoothed mean prediction (roid.py:101-106): prior = mean
    softmax, smooth = max(1/B, 1/C) / max(prior), (prior + smooth) / (1 + smooth C)."""
    n, c = logits.shape
    prior = logits.softmax(1).mean(0)
    smooth = max(1 / n, 1 / c) / torch.max(prior)
    return logits * ((prior + smooth) / (1 + smooth * c))


@torch.no_grad()
def ema_merge(params: list[torch.Tensor], others: list[torch.Tensor], momentum: float) -> None:
    """Each p <- momentum x p + (1 - momentum) x other, in place (misc.py:7-13: nothing when momentum >= 1)."""
    if momentum < 1.0:
        for p, other in zip(params, others):
            p.copy_(momentum * p + (1 - momentum) * other)


class RoidTTAMethod(NormTTAMethod):
    """The base of ROID and CMF: the loss, the weighting, the prior correction and the running mean prediction;
    a subclass writes `after_step` (the merge of the weights after each optimiser step)."""

    def reset_extra(self) -> None:
        n = len(self.classnames)
        self.class_probs = torch.full((n,), 1 / n, device=self.model.device)   # 1 / C * ones (roid.py:32, 121)
        self.updates = 0

    def episodic_reset(self) -> None:
        """Their `reset` restores the models, the optimiser and the mean prediction; their global generator runs on,
        as the count of updates (the seed of each update's augmentation) does here."""
        updates = self.updates
        self.reset()
        self.updates = updates

    def extra_state(self) -> dict[str, Any]:
        return {"class_probs": self.class_probs, "updates": self.updates}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.class_probs = state["class_probs"].to(self.model.device)
        self.updates = int(state["updates"])

    def after_step(self) -> None:
        """The merge of the weights after each optimiser step."""
        raise NotImplementedError

    def augment(self, pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(B, 3, S, S) normalised -> one random augmentation of the batch (their `tta_transform` on the images in
        [0, 1]: `get_tta_transforms(img_size, padding_mode="reflect", cotta_augs=False)`), normalised."""
        from .tta_transforms import augment_normalized  # torchvision, only where the consistency loss runs
        return augment_normalized(self.model, pixels, generator, padding_mode="reflect", cotta_augs=False)

    def loss(self, logits: torch.Tensor, pixels: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C) logits of the (B, 3, S, S) `pixels` -> (the step's loss, each image's weight (B,), ones without
        weighting). `pixels` are read only with `use_consistency`."""
        cfg = self.config
        losses = soft_likelihood_ratio(logits)
        weights = torch.ones_like(losses)
        kept = torch.ones_like(losses, dtype=torch.bool)
        if cfg.use_weighting:
            with torch.no_grad():
                weights, mask = roid_weights(logits, self.class_probs, cfg.temperature)
                kept = ~mask
                m = cfg.momentum_probs
                self.class_probs = m * self.class_probs + (1 - m) * logits.softmax(1).mean(0)
            losses = (losses * weights)[kept]
        divisor = cfg.loss_batch_size or logits.shape[0]
        loss = losses.sum() / divisor
        if cfg.use_consistency:
            if pixels is None:
                raise ValueError(f"{cfg.method}.use_consistency needs the batch's pixels")
            generator = update_generator(cfg.augment_seed, self.updates)
            augmented = self.logits(self.augment(pixels[kept], generator))
            loss = loss + (symmetric_cross_entropy(augmented, logits[kept]) * weights[kept]).sum() / divisor
        return loss, weights

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        losses = []
        logits = weights = None
        for _ in range(cfg.steps):
            logits = self.logits(pixels)
            loss, weights = self.loss(logits, pixels)
            losses.append(float(loss.detach()))
            self.step(loss)
            self.after_step()
            self.updates += 1
        with torch.no_grad():
            if cfg.predict_after_update or logits is None:
                logits = self.logits(pixels)
            logits = logits.detach()
            if cfg.use_prior_correction:
                logits = prior_corrected(logits)
        return logits, [{"loss": losses[0], "last_loss": losses[-1], "weight": float(w)} for w in weights]


def roid_state_logits(method: RoidTTAMethod, views01: torch.Tensor) -> torch.Tensor:
    """(B, N, 3, S, S) in [0, 1] -> (B, C): view 0 through the tower with the norm parameters the method holds,
    prior-corrected when it corrects (the prediction without the step), differentiable in the pixels."""
    with torch.enable_grad():
        logits = method.logits(method.model.normalize(views01[:, 0]))
        return prior_corrected(logits) if method.config.use_prior_correction else logits
