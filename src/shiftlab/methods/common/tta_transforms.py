"""The random augmentation of CoTTA, RMT, SANTA, ROID and CMF (mariodoebler/test-time-adaptation's
`augmentations/transforms_cotta.get_tta_transforms`, from qinenergy/cotta's `get_tta_transforms`): on a batch of
images in [0, 1], one random draw for the whole batch per call (their torchvision transforms see the batch as one
image), in this order:

clip to [0, 1]; colour jitter in a random order (brightness, contrast, saturation, hue, gamma); edge padding by half
the image size; a random affine map (rotation, translation, scale; bilinear, zeros outside); Gaussian blur (kernel
5); centre crop back to the image size; horizontal flip with probability 1/2; Gaussian noise; clip to [0, 1].
ROID and CMF call it with `padding_mode="reflect", cotta_augs=False` (roid.py:33, cmf.py:59): reflect padding, and
neither the blur (nor its sigma's draw) nor the noise (transforms_cotta.py:150-160).

Every random number comes from an explicit `torch.Generator`, drawn in the order and with the calls their code
makes on torch's global generator, so a generator seeded s draws what their code draws after
`torch.manual_seed(s)` (the golden drivers seed it so). The pixel operations are torchvision's functional ones,
as theirs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torchvision.transforms.functional as TF
from torchvision.transforms import InterpolationMode


@dataclass(frozen=True)
class TTATransformRanges:
    """The ranges `get_tta_transforms(img_size, gaussian_std, soft)` draws from (transforms_cotta.py:121-150)."""
    brightness: tuple[float, float]
    contrast: tuple[float, float]
    saturation: tuple[float, float]
    hue: tuple[float, float]
    gamma: tuple[float, float]
    degrees: tuple[float, float]
    scale: tuple[float, float]
    blur_sigma: tuple[float, float]
    translate: float = 1 / 16
    blur_kernel: int = 5
    flip_p: float = 0.5


STRONG = TTATransformRanges(brightness=(0.6, 1.4), contrast=(0.7, 1.3), saturation=(0.5, 1.5), hue=(-0.06, 0.06),
                            gamma=(0.7, 1.3), degrees=(-15.0, 15.0), scale=(0.9, 1.1), blur_sigma=(0.001, 0.5))
SOFT = TTATransformRanges(brightness=(0.8, 1.2), contrast=(0.85, 1.15), saturation=(0.75, 1.25), hue=(-0.03, 0.03),
                          gamma=(0.85, 1.15), degrees=(-8.0, 8.0), scale=(0.95, 1.05), blur_sigma=(0.001, 0.25))


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return float(torch.empty(1).uniform_(low, high, generator=generator).item())


def color_jitter(images: torch.Tensor, ranges: TTATransformRanges, generator: torch.Generator) -> torch.Tensor:
    """Their ColorJitterPro.forward: the five adjustments in a random order (randperm(5)), each factor drawn when
    its turn comes; gamma on the images clamped to [1e-8, 1]."""
    for fn_id in torch.randperm(5, generator=generator).tolist():
        if fn_id == 0:
            images = TF.adjust_brightness(images, _uniform(*ranges.brightness, generator))
        elif fn_id == 1:
            images = TF.adjust_contrast(images, _uniform(*ranges.contrast, generator))
        elif fn_id == 2:
            images = TF.adjust_saturation(images, _uniform(*ranges.saturation, generator))
        elif fn_id == 3:
            images = TF.adjust_hue(images, _uniform(*ranges.hue, generator))
        else:
            images = TF.adjust_gamma(images.clamp(1e-8, 1.0), _uniform(*ranges.gamma, generator))
    return images


def random_affine(images: torch.Tensor, ranges: TTATransformRanges, generator: torch.Generator) -> torch.Tensor:
    """torchvision's RandomAffine(degrees, translate=(t, t), scale, shear=None, bilinear, fill 0) with its draws:
    angle, then the x and y shifts (rounded, up to t x the width / height), then the scale."""
    height, width = images.shape[-2:]
    angle = _uniform(*ranges.degrees, generator)
    max_dx, max_dy = float(ranges.translate * width), float(ranges.translate * height)
    tx = int(round(_uniform(-max_dx, max_dx, generator)))
    ty = int(round(_uniform(-max_dy, max_dy, generator)))
    scale = _uniform(*ranges.scale, generator)
    return TF.affine(images, angle, [tx, ty], scale, [0.0, 0.0], interpolation=InterpolationMode.BILINEAR,
                     fill=[0.0] * images.shape[-3])


PADDING_MODES = ("edge", "reflect")


def tta_transform(images: torch.Tensor, generator: torch.Generator, *, soft: bool = False,
                  gaussian_std: float = 0.005, padding_mode: str = "edge", cotta_augs: bool = True) -> torch.Tensor:
    """(B, 3, S, S) in [0, 1] -> (B, 3, S, S) in [0, 1]: one draw of the pipeline (the module's docstring) for the
    whole batch. `soft` takes their narrower ranges; `gaussian_std` the noise's standard deviation; `padding_mode`
    their Pad's ("edge" or "reflect"); `cotta_augs` False leaves out the blur and the noise, as theirs."""
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode: {padding_mode!r} is not one of {', '.join(PADDING_MODES)}")
    ranges = SOFT if soft else STRONG
    size = images.shape[-1]
    out = images.clamp(0.0, 1.0)
    out = color_jitter(out, ranges, generator)
    out = TF.pad(out, [size // 2], padding_mode=padding_mode)
    out = random_affine(out, ranges, generator)
    if cotta_augs:
        sigma = _uniform(*ranges.blur_sigma, generator)
        out = TF.gaussian_blur(out, [ranges.blur_kernel, ranges.blur_kernel], [sigma, sigma])
    out = TF.center_crop(out, [size, size])
    if torch.rand(1, generator=generator) < ranges.flip_p:
        out = TF.hflip(out)
    if cotta_augs:
        noise = torch.randn(out.size(), generator=generator) * gaussian_std + 0.0
        out = out + noise.to(out.device)
    return out.clamp(0.0, 1.0)


def augment_normalized(model: Any, pixels: torch.Tensor, generator: torch.Generator, **options: Any) -> torch.Tensor:
    """(B, 3, S, S) normalised by `model` (a ClipModel: its `mean`, `std` and `normalize`) -> one draw of
    `tta_transform(images, generator, **options)` on the batch's images in [0, 1], normalised again."""
    mean = model.mean.to(pixels.device, pixels.dtype)
    std = model.std.to(pixels.device, pixels.dtype)
    return model.normalize(tta_transform(pixels * std + mean, generator, **options))
