"""Tiny synthetic datasets on disk for the tests (import as ``from _synthetic import ...``).

``make_imagenet_r`` and ``random_image`` are the package's own (``shiftlab.synthetic``, also used by
``shiftlab demo``); ``make_image_folder`` writes a generic ``<root>/<folder>/img_<k>.<ext>`` tree
(imagefolder, or ImageNet-V2's ``0``..``999`` folders). Images are deterministic for a given seed.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from shiftlab.synthetic import RENDITIONS, make_imagenet_r, random_image

__all__ = ["RENDITIONS", "make_imagenet_r", "make_image_folder", "random_image"]


def make_image_folder(root: str | Path, folders: Sequence[str], per_class: int = 1,
                      size: tuple[int, int] = (40, 30), seed: int = 0, image_format: str = "png") -> Path:
    """Write ``root/<folder>/img_<k>.<image_format>`` for each folder; return ``root``."""
    root = Path(root)
    for index, name in enumerate(folders):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            buf = io.BytesIO()
            image = random_image(size, seed * 1_000_003 + index * 1000 + k)
            image.save(buf, format="JPEG" if image_format in ("jpg", "jpeg") else image_format.upper(), quality=90)
            (folder / f"img_{k}.{image_format}").write_bytes(buf.getvalue())
    return root
