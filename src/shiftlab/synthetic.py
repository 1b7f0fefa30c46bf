"""Synthetic stand-ins for the demo and tests: an ImageNet-R-layout folder and a tiny random CLIP."""
from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from . import writes

if TYPE_CHECKING:
    from .models import ClipModel

RENDITIONS = ("art", "cartoon", "deviantart", "embroidery", "graffiti", "graphic", "misc", "origami", "painting",
              "sculpture", "sketch", "sticker", "tattoo", "toy", "videogame")


def tiny_clip(seed: int = 0, device: str | torch.device = "cpu") -> ClipModel:
    """A tiny random-weight CLIP (the golden fixtures' architecture), the same for the same `seed` in every
    process (`load_model(..., pretrained=None, seed=seed)`); accuracy is meaningless."""
    from .models import load_model
    from .models.architectures import TINY_CLIP_NAME
    return load_model(TINY_CLIP_NAME, None, device=device, seed=seed)


def tiny_vit(seed: int = 0, device: str | torch.device = "cpu") -> ClipModel:
    """A tiny random-weight ViT CLIP (`shiftlab-tiny-vit`), the same for the same `seed` in every process."""
    from .models import load_model
    from .models.architectures import TINY_VIT_NAME
    return load_model(TINY_VIT_NAME, None, device=device, seed=seed)


def random_image(size: tuple[int, int] = (40, 30), seed: int = 0) -> Image.Image:
    """A smooth random RGB image of `size` = (width, height)."""
    rng = np.random.default_rng(seed)
    width, height = size
    coarse = rng.integers(0, 256, size=(max(1, height // 8), max(1, width // 8), 3), dtype=np.uint8)
    return Image.fromarray(coarse, "RGB").resize((width, height), Image.BILINEAR)


def make_imagenet_r(root: str | Path, per_class: int = 1, size: tuple[int, int] = (40, 30), seed: int = 0,
                    classes: Iterable[str | int] | None = None, image_format: str = "jpg") -> Path:
    """Write a synthetic ImageNet-R under `root/imagenet-r` (all 200 class folders) and return that folder.

    `classes`: wnids or labels (0..199) that get `per_class` images named `<rendition>_<k>.<ext>`;
    the other folders stay empty. Sample k of label y uses seed `seed * 1_000_003 + y * 1000 + k`.
    """
    from .datasets.classes import imagenet_r_wnids
    wnids = imagenet_r_wnids()
    selected = set(range(len(wnids))) if classes is None else {
        c if isinstance(c, int) else wnids.index(c) for c in classes}
    dataset = Path(root) / "imagenet-r"
    for label, wnid in enumerate(wnids):
        folder = dataset / wnid
        writes.make_dirs(folder)
        if label not in selected:
            continue
        for k in range(per_class):
            img = random_image(size, seed * 1_000_003 + label * 1000 + k)
            rendition = RENDITIONS[(label + k) % len(RENDITIONS)]
            buf = io.BytesIO()
            img.save(buf, format="JPEG" if image_format in ("jpg", "jpeg") else image_format.upper(), quality=90)
            writes.write_file(folder / f"{rendition}_{k}.{image_format}", buf.getvalue())
    return dataset


def make_class_folders(root: str | Path, classes: Iterable[str], per_class: int = 4, size: tuple[int, int] = (64, 48),
                       seed: int = 0) -> Path:
    """Write `root/<class>/img_<k>.png` (lossless), `per_class` images per class name, and return `root`: an image
    folder whose class names are its folders'. Each class has a colour of its own (hue k / C) under a smooth
    random texture, so a class's images look alike; image k of class c uses seed `seed * 1_000_003 + c * 1000 + k`."""
    from colorsys import hsv_to_rgb
    names = list(classes)
    root = Path(root)
    for c, name in enumerate(names):
        tint = np.array(hsv_to_rgb(c / max(len(names), 1), 0.8, 0.9)) * 255
        for k in range(per_class):
            texture = np.asarray(random_image(size, seed * 1_000_003 + c * 1000 + k), dtype=np.float64)
            pixels = (0.6 * tint + 0.4 * texture).round().clip(0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(buf, format="PNG")
            writes.make_dirs(root / name)
            writes.write_file(root / name / f"img_{k}.png", buf.getvalue())
    return root
