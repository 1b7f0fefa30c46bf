"""AdaContrast's three augmentations of a batch (weak "plain", strong "moco-v2" / "moco-v1"), as CLIPTTA's toolkit
applies them (github.com/MarcLafon/cliptta at f4221f4, `ttavlm/transforms/moco_transforms.py:54-121`, from
DianCh/AdaContrast's `moco/loader.py`), with every random draw from an explicit `torch.Generator`.

Theirs are torchvision transforms called on the whole (B, 3, S, S) batch of CLIP-normalised pixels, so each random
decision (crop box, jitter factors, grayscale, blur, flip) is drawn once and applied to every image of the batch;
so here. The pixel operations are torchvision's own functions on tensors (their transforms' `forward`), the blur
PIL's, as theirs. Every pipeline ends with ImageNet's normalisation on top of CLIP's (theirs: `normalize` is their
Compose's last step; `renormalize=False` leaves it out)."""
from __future__ import annotations

import math

import torch
import torchvision.transforms.functional as TF
from PIL import ImageFilter

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _uniform(g: torch.Generator, low: float, high: float) -> float:
    return float(torch.empty(1).uniform_(low, high, generator=g))


def _chance(g: torch.Generator, p: float) -> bool:
    return float(torch.rand(1, generator=g)) < p


def resized_crop_box(g: torch.Generator, height: int, width: int, scale: tuple[float, float] = (0.2, 1.0),
                     ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, h, w) of RandomResizedCrop's box: up to 10 draws of an area fraction in `scale` and a log-uniform
    aspect in `ratio`, else the largest centred box of an aspect within `ratio` (torchvision's rule)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * _uniform(g, *scale)
        aspect = math.exp(_uniform(g, *log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=g))
            left = int(torch.randint(0, width - w + 1, (1,), generator=g))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def color_jitter(x: torch.Tensor, g: torch.Generator, strength: float, hue: float) -> torch.Tensor:
    """ColorJitter(strength, strength, strength, hue): brightness, contrast, saturation factors in
    [1 - strength, 1 + strength] and a hue shift in [-hue, hue], applied in a random order."""
    factors = [_uniform(g, 1 - strength, 1 + strength) for _ in range(3)] + [_uniform(g, -hue, hue)]
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    for i in torch.randperm(4, generator=g).tolist():
        x = ops[i](x, factors[i])
    return x


def pil_gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Their GaussianBlur (moco_transforms.py:31-49): each image through ToPILImage (x x 255 as bytes), PIL's
    GaussianBlur of radius sigma, ToTensor (so the result is in [0, 1])."""
    out = []
    for image in x.detach().cpu():
        blurred = TF.to_pil_image(image).filter(ImageFilter.GaussianBlur(radius=sigma))
        out.append(TF.to_tensor(blurred))
    return torch.stack(out).to(x.device)


def weak_view(x: torch.Tensor, g: torch.Generator, renormalize: bool = True) -> torch.Tensor:
    """"plain" (moco_transforms.py:85-93): resize to 8/7 of the size (their 256 for 224), a random crop back to
    the size, a horizontal flip with probability 0.5."""
    size = x.shape[-1]
    big = round(size * 256 / 224)
    x = TF.resize(x, [big, big], antialias=False)
    top = int(torch.randint(0, big - size + 1, (1,), generator=g))
    left = int(torch.randint(0, big - size + 1, (1,), generator=g))
    x = TF.crop(x, top, left, size, size)
    if _chance(g, 0.5):
        x = TF.hflip(x)
    return TF.normalize(x, IMAGENET_MEAN, IMAGENET_STD) if renormalize else x


def strong_view(x: torch.Tensor, g: torch.Generator, aug_type: str = "moco-v2",
                renormalize: bool = True) -> torch.Tensor:
    """"moco-v2" (moco_transforms.py:57-70): a resized crop of 20-100% of the area, colour jitter (0.4, hue 0.1)
    with probability 0.8, grayscale with 0.2, PIL's Gaussian blur (sigma in [0.1, 2]) with 0.5, a horizontal flip
    with 0.5. "moco-v1" (:72-81): the crop, grayscale with 0.2, jitter (0.4, hue 0.4) always, the flip."""
    size = x.shape[-1]
    top, left, h, w = resized_crop_box(g, x.shape[-2], x.shape[-1])
    x = TF.resized_crop(x, top, left, h, w, [size, size], antialias=False)
    if aug_type == "moco-v2":
        if _chance(g, 0.8):
            x = color_jitter(x, g, 0.4, 0.1)
        if _chance(g, 0.2):
            x = TF.rgb_to_grayscale(x, num_output_channels=3)
        if _chance(g, 0.5):
            x = pil_gaussian_blur(x, _uniform(g, 0.1, 2.0))
    else:
        if _chance(g, 0.2):
            x = TF.rgb_to_grayscale(x, num_output_channels=3)
        x = color_jitter(x, g, 0.4, 0.4)
    if _chance(g, 0.5):
        x = TF.hflip(x)
    return TF.normalize(x, IMAGENET_MEAN, IMAGENET_STD) if renormalize else x


def adacontrast_views(x: torch.Tensor, g: torch.Generator, aug_type: str = "moco-v2",
                      renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, 3, S, S) -> the weak, query and key views (their wqk_transforms, moco_transforms.py:116-121), drawn in
    that order from `g`."""
    return (weak_view(x, g, renormalize), strong_view(x, g, aug_type, renormalize),
            strong_view(x, g, aug_type, renormalize))
