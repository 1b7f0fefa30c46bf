"""Deterministic test-time views (TPT's ImageNet protocol).

View 0 is the original: Resize(shorter side -> size, bicubic) + CenterCrop(size).
Views 1..N-1 are RandomResizedCrop(size) (scale 0.08-1, ratio 3/4-4/3, bilinear) +
RandomHorizontalFlip of the ORIGINAL image, optionally followed by TPT's AugMix.

Randomness comes from a generator seeded by (run seed, sample id) alone, so a
sample's views are identical whatever the order, batch size, worker count or
number of processes. Views are uint8 (N, 3, S, S); normalisation happens on the
device inside the model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF


@dataclass(frozen=True)
class ViewConfig:
    n_views: int = 64
    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    augmix: bool = False          # C-TPT's --I_augmix for ImageNet variants
    augmix_severity: int = 1


def sample_seed(run_seed: int, sample_id: int) -> int:
    """A 63-bit seed that depends only on (run seed, sample id)."""
    return int(np.random.SeedSequence([int(run_seed), int(sample_id)]).generate_state(2, dtype=np.uint64)[0] >> 1)


def to_uint8_tensor(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(img.convert("RGB"), dtype=np.uint8, copy=True)).permute(2, 0, 1).contiguous()


def base_view(img: Image.Image, size: int) -> Image.Image:
    img = TF.resize(img, size, interpolation=InterpolationMode.BICUBIC)
    return TF.center_crop(img, size)


def random_resized_crop_params(width: int, height: int, scale, ratio, gen: torch.Generator):
    """torchvision's RandomResizedCrop.get_params, drawing from `gen` instead of the global RNG."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=gen).item()
        aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=gen).item())
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=gen).item())
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=gen).item())
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


# TPT's AugMix operations (PIL); magnitudes follow its augmix_ops at severity `level`.
def _int_level(level, maxval, rng):
    return int(level * maxval / 10)


def _float_level(level, maxval, rng):
    return float(level) * maxval / 10.0


def _op_autocontrast(img, level, rng):
    return ImageOps.autocontrast(img)


def _op_equalize(img, level, rng):
    return ImageOps.equalize(img)


def _op_posterize(img, level, rng):
    return ImageOps.posterize(img, 4 - _int_level(rng.integers(1, level + 1), 4, rng))


def _op_rotate(img, level, rng):
    deg = _int_level(rng.integers(1, level + 1), 30, rng)
    return img.rotate(-deg if rng.uniform() > 0.5 else deg, resample=Image.BILINEAR)


def _op_solarize(img, level, rng):
    return ImageOps.solarize(img, 256 - _int_level(rng.integers(1, level + 1), 256, rng))


def _affine(img, level, rng, kind):
    size = img.size
    if kind in ("shear_x", "shear_y"):
        v = _float_level(rng.uniform(0.1, level), 0.3, rng)
    else:
        v = _int_level(rng.integers(1, level + 1), size[0] / 3, rng)
    v = -v if rng.uniform() > 0.5 else v
    data = {"shear_x": (1, v, 0, 0, 1, 0), "shear_y": (1, 0, 0, v, 1, 0),
            "translate_x": (1, 0, v, 0, 1, 0), "translate_y": (1, 0, 0, 0, 1, v)}[kind]
    return img.transform(size, Image.AFFINE, data, resample=Image.BILINEAR)


AUGMIX_OPS = [_op_autocontrast, _op_equalize, _op_posterize, _op_rotate, _op_solarize,
              lambda i, lv, r: _affine(i, lv, r, "shear_x"), lambda i, lv, r: _affine(i, lv, r, "shear_y"),
              lambda i, lv, r: _affine(i, lv, r, "translate_x"), lambda i, lv, r: _affine(i, lv, r, "translate_y")]


def augmix(img: Image.Image, rng: np.random.Generator, severity: int = 1, width: int = 3) -> Image.Image:
    """TPT's AugMix: Dirichlet-weighted mix of `width` op chains, then a Beta(1,1) skip connection.

    TPT mixes the normalised tensors; normalisation is affine and the weights sum to
    one, so mixing in [0, 1] space and rounding to 8 bits differs by at most half a grey level.
    """
    w = rng.dirichlet([1.0] * width)
    m = rng.beta(1.0, 1.0)
    base = np.asarray(img, dtype=np.float32)
    mix = np.zeros_like(base)
    for i in range(width):
        aug = img.copy()
        for _ in range(int(rng.integers(1, 4))):
            aug = AUGMIX_OPS[int(rng.integers(len(AUGMIX_OPS)))](aug, severity, rng)
        mix += w[i] * np.asarray(aug, dtype=np.float32)
    out = m * base + (1 - m) * mix
    return Image.fromarray(np.clip(np.rint(out), 0, 255).astype(np.uint8))


class ViewGenerator:
    """Image -> uint8 views (N, 3, S, S), seeded per sample."""

    def __init__(self, config: ViewConfig = ViewConfig(), seed: int = 0):
        self.config = config
        self.seed = int(seed)

    def __call__(self, img: Image.Image, sample_id: int) -> torch.Tensor:
        cfg = self.config
        img = img.convert("RGB")
        views = [to_uint8_tensor(base_view(img, cfg.size))]
        if cfg.n_views > 1:
            seed = sample_seed(self.seed, sample_id)
            gen = torch.Generator().manual_seed(seed)
            rng = np.random.default_rng(seed)
            for _ in range(cfg.n_views - 1):
                i, j, h, w = random_resized_crop_params(img.width, img.height, cfg.scale, cfg.ratio, gen)
                view = TF.resized_crop(img, i, j, h, w, [cfg.size, cfg.size],
                                       interpolation=InterpolationMode.BILINEAR)
                if torch.rand(1, generator=gen).item() < 0.5:
                    view = TF.hflip(view)
                if cfg.augmix:
                    view = augmix(view, rng, cfg.augmix_severity)
                views.append(to_uint8_tensor(view))
        return torch.stack(views)
