"""DeYO on CLIP (Lee et al., ICLR 2024), as mariodoebler/test-time-adaptation runs it (`classification/methods/
deyo.py` at 8b2ed63, built from Jhyun17/DeYO's `methods/deyo.py`), for every batch of test images (view 0 of each,
through the tower of `common.norm_adaptation`), `steps` times:

1. logits = scale x cosine, per-image entropy H; kept: H < entropy_margin x ln C;
2. the kept images disrupted (`augmentation`: their patches or pixels shuffled, or a square occluded) and
   predicted again without gradients; PLPD = the probability of each image's pseudo-label (its argmax before)
   before minus after; kept: PLPD > plpd_threshold;
3. loss = mean over the images kept by both of H x (exp(-(H - weight_margin x ln C)) + exp(PLPD)), the weights
   detached; one optimiser step (none when no image is kept).

The batch's outputs are the logits of step 1 (of the last step). The shuffles draw from a generator of the method's
own (`shuffle_seed`), part of its state, so that runs are deterministic and a resume exact. README.md lists what
differs from the authors' code.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torchvision.transforms.functional as TF

from ..common.confidence import entropy
from ..common.norm_adaptation import NormTTAMethod
from .spec import DeYOSpec


def shuffle_patches(pixels: torch.Tensor, patch_len: int, generator: torch.Generator) -> torch.Tensor:
    """(B, 3, S, S) -> (B, 3, S, S): each image cut into a patch_len x patch_len grid, its patches put in a random
    order of its own (deyo.py:59-67): resized to the largest multiple of patch_len first and back after (bilinear,
    antialiased: torchvision's Resize, a no-op where S is a multiple). The order: argsort of
    `torch.rand(B, patch_len ** 2, generator=generator)`, on the CPU as theirs."""
    b, c, s, _ = pixels.shape
    n = patch_len
    side = s // n * n
    h = side // n
    x = TF.resize(pixels, [side, side])
    x = x.reshape(b, c, n, h, n, h).permute(0, 2, 4, 1, 3, 5).reshape(b, n * n, c, h, h)
    order = torch.argsort(torch.rand(b, n * n, generator=generator), dim=-1).to(pixels.device)
    x = x[torch.arange(b, device=pixels.device)[:, None], order]
    x = x.reshape(b, n, n, c, h, h).permute(0, 3, 1, 4, 2, 5).reshape(b, c, side, side)
    return TF.resize(x, [s, s])


def shuffle_pixels(pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(B, 3, S, S) -> (B, 3, S, S): the pixels of every image moved by the same random permutation (deyo.py:68-71:
    one `torch.randperm(S * S)` for the batch)."""
    b, c, s, _ = pixels.shape
    order = torch.randperm(s * s, generator=generator).to(pixels.device)
    return pixels.reshape(b, c, s * s)[:, :, order].reshape(b, c, s, s)


def occlude(pixels: torch.Tensor, size: float, row: float, column: float) -> torch.Tensor:
    """(B, 3, S, S) -> a copy with the square of side round(size x S) at (round(row x S), round(column x S)) filled
    with each image's mean colour (deyo.py:54-58; their pixels 112 at (56, 56) are these fractions of 224).
    The mean commutes with CLIP's per-channel normalisation, so normalised pixels give theirs normalised."""
    s = pixels.shape[-1]
    n, r, c = round(size * s), round(row * s), round(column * s)
    out = pixels.clone()
    out[:, :, r:r + n, c:c + n] = pixels.mean(dim=(2, 3))[:, :, None, None]
    return out


def plpd(logits: torch.Tensor, disrupted: torch.Tensor) -> torch.Tensor:
    """(K, C) logits and (K, C) logits of the disrupted images -> (K,) the probability of each image's pseudo-label
    (argmax of `logits`) minus its probability after the disruption (deyo.py:76-82)."""
    probs, after = logits.softmax(-1), disrupted.softmax(-1)
    label = probs.argmax(-1, keepdim=True)
    return (probs.gather(1, label) - after.gather(1, label)).reshape(-1)


def sample_weights(entropies: torch.Tensor, plpds: torch.Tensor, weight_margin: float, use_entropy: bool,
                   use_plpd: bool) -> torch.Tensor:
    """(K,) -> (K,) DeYO's weights (deyo.py:92-96): use_entropy x exp(-(H - weight_margin)) + use_plpd x exp(PLPD)."""
    return float(use_entropy) * torch.exp(-(entropies - weight_margin)) + float(use_plpd) * torch.exp(plpds)


class DeYO(NormTTAMethod):
    """DeYO: entropy minimisation on the images whose prediction depends on the object's shape (PLPD)."""
    spec = DeYOSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        size, n = self.model.image_size, self.config.patch_len
        if self.config.augmentation == "patch" and n > size:
            raise ValueError(f"deyo.patch_len: {n} patches per side of the model's {size} px images leave a patch "
                             f"no pixel; must be <= {size}")

    def reset_extra(self) -> None:
        self.generator = torch.Generator().manual_seed(self.config.shuffle_seed)

    def extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def episodic_reset(self) -> None:
        """The parameters and the optimiser only: their shuffles' global generator runs on across resets."""
        self.reset_tower()

    def disrupt(self, pixels: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if cfg.augmentation == "patch":
            return shuffle_patches(pixels, cfg.patch_len, self.generator)
        if cfg.augmentation == "pixel":
            return shuffle_pixels(pixels, self.generator)
        return occlude(pixels, cfg.occlusion_size, cfg.occlusion_row, cfg.occlusion_column)

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        log_c = math.log(len(self.classnames))
        n = pixels.shape[0]
        logits = None
        for _ in range(cfg.steps):
            logits = self.logits(pixels)
            entropies = entropy(logits)
            # their unfiltered branch keeps H <= ln 1000, every image of up to 1000 classes (DeYO's deyo.py:105)
            kept = entropies.detach() < cfg.entropy_margin * log_c if cfg.filter_entropy else \
                torch.ones(n, dtype=torch.bool, device=logits.device)
            plpds = torch.full((n,), float("nan"))
            selected = torch.zeros(n, dtype=torch.bool)
            if kept.any():
                with torch.no_grad():
                    disrupted = self.logits(self.disrupt(pixels[kept].detach()))
                drop = plpd(logits.detach()[kept], disrupted)
                plpds[kept.cpu()] = drop.float().cpu()
                passed = drop > cfg.plpd_threshold if cfg.filter_plpd else torch.ones_like(drop, dtype=torch.bool)
                selected[kept.cpu()] = passed.cpu()
                if passed.any():
                    h = entropies[kept][passed]
                    loss = h
                    if cfg.reweight_entropy or cfg.reweight_plpd:
                        loss = h * sample_weights(h.detach(), drop[passed], cfg.weight_margin * log_c,
                                                  cfg.reweight_entropy, cfg.reweight_plpd)
                    self.step(loss.mean(0))
            self.optimizer.zero_grad(set_to_none=True)
        if cfg.predict_after_update:
            with torch.no_grad():
                logits = self.logits(pixels)
        extras = [{"plpd": None if math.isnan(p) else p, "selected": bool(s)}
                  for p, s in zip(plpds.tolist(), selected.tolist())]
        return logits.detach(), extras
