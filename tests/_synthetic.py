"""Tiny synthetic datasets on disk, shared by the test modules (import as ``from _synthetic import ...``).

- ``make_imagenet_r(root)`` -> ``root/imagenet-r`` with all 200 ImageNet-R wnid folders (the
  dataset builder requires every class folder) and ``per_class`` small random images in each of
  the selected ``classes`` (default: all), named ``<rendition>_<k>.jpg`` like the real set.
  ``build_dataset("imagenet-r", root)`` then works on it; empty folders show up in ``.warnings``.
- ``make_image_folder(root, folders)`` -> generic ``<root>/<folder>/img_<k>.png`` (imagefolder,
  or ImageNet-V2's ``0``..``999`` folders).

Images are deterministic for a given seed (each file uses its own derived seed), so tests can rely
on pixel content. 200 images of 40x30 take well under a second.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from PIL import Image

from shiftlab.datasets.classes import imagenet_r_wnids

__all__ = ["RENDITIONS", "make_imagenet_r", "make_image_folder", "random_image"]

# The rendition types ImageNet-R file names start with.
RENDITIONS = ("art", "cartoon", "deviantart", "embroidery", "graffiti", "graphic", "misc", "origami", "painting",
              "sculpture", "sketch", "sticker", "tattoo", "toy", "videogame")


def random_image(size: tuple[int, int] = (40, 30), seed: int = 0) -> Image.Image:
    """A smooth-ish random RGB image of ``size`` = (width, height)."""
    rng = np.random.default_rng(seed)
    width, height = size
    # A low-resolution random grid upsampled: gives JPEG-friendly content with real structure.
    coarse = rng.integers(0, 256, size=(max(1, height // 8), max(1, width // 8), 3), dtype=np.uint8)
    return Image.fromarray(coarse, "RGB").resize((width, height), Image.BILINEAR)


def _save(image: Image.Image, path: Path, fmt: str) -> None:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG" if fmt in ("jpg", "jpeg") else fmt.upper(), quality=90)
    path.write_bytes(buffer.getvalue())


def make_imagenet_r(root: str | Path, per_class: int = 1, size: tuple[int, int] = (40, 30), seed: int = 0,
                    classes: Iterable[str | int] | None = None, image_format: str = "jpg") -> Path:
    """Write a synthetic ImageNet-R under ``root/imagenet-r`` and return that folder.

    ``classes``: wnids or labels (0..199) that get images; all 200 folders are created regardless.
    ``image_format``: ``"jpg"`` or ``"png"``. Sample k of label y has seed ``seed * 1_000_003 + y * 1000 + k``.
    """
    wnids = imagenet_r_wnids()
    if classes is None:
        selected = set(range(len(wnids)))
    else:
        selected = {c if isinstance(c, int) else wnids.index(c) for c in classes}
    dataset = Path(root) / "imagenet-r"
    for label, wnid in enumerate(wnids):
        folder = dataset / wnid
        folder.mkdir(parents=True, exist_ok=True)
        if label not in selected:
            continue
        for k in range(per_class):
            rendition = RENDITIONS[(label + k) % len(RENDITIONS)]
            image = random_image(size, seed * 1_000_003 + label * 1000 + k)
            _save(image, folder / f"{rendition}_{k}.{image_format}", image_format)
    return dataset


def make_image_folder(root: str | Path, folders: Sequence[str], per_class: int = 1,
                      size: tuple[int, int] = (40, 30), seed: int = 0, image_format: str = "png") -> Path:
    """Write ``root/<folder>/img_<k>.<image_format>`` for each folder; return ``root``."""
    root = Path(root)
    for index, name in enumerate(folders):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            _save(random_image(size, seed * 1_000_003 + index * 1000 + k), folder / f"img_{k}.{image_format}",
                  image_format)
    return root
