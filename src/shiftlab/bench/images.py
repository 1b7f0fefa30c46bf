"""What the bench measures on: synthetic JPEG files decoded like a dataset's, and class names."""
from __future__ import annotations

import hashlib
import io
import shutil
import tempfile
from pathlib import Path

from PIL import Image

from .. import writes
from ..datasets.imageio import decode_image


def bench_classnames(n: int) -> list[str]:
    """The first `n` ImageNet-R class names (n <= 200), else the first `n` ImageNet-1k names."""
    from ..datasets.classes import classnames_for_wnids, imagenet_classnames, imagenet_r_wnids
    if n <= 200:
        return classnames_for_wnids(imagenet_r_wnids())[:n]
    return imagenet_classnames()[:n]


class SyntheticImages:
    """`n` JPEG files of `random_image(size, seed)` in a temporary folder, decoded like dataset files."""

    def __init__(self, n: int, size: tuple[int, int] = (320, 256), seed: int = 0):
        from ..synthetic import random_image
        self.root = Path(tempfile.mkdtemp(prefix="shiftlab-bench-"))
        self.paths = []
        for i in range(n):
            path = self.root / f"img_{i:05d}.jpg"
            buffer = io.BytesIO()
            random_image(tuple(size), seed=seed * 1_000_003 + i).save(buffer, format="JPEG", quality=90)
            writes.write_file(path, buffer.getvalue())
            self.paths.append(path)
        self.samples = [(p.name, 0) for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    def path(self, i: int) -> Path:
        return self.paths[i]

    def image(self, i: int) -> Image.Image:
        return decode_image(self.paths[i])

    def label(self, i: int) -> int:
        return 0

    # what a feature store records of a sample (shiftlab.engine.features): where it came from, its content
    def source(self, i: int) -> str:
        return str(self.paths[i])

    def read_bytes(self, i: int) -> bytes:
        return self.paths[i].read_bytes()

    def content_digest(self, i: int) -> str:
        """SHA-256 of the JPEG's bytes, as a dataset's (datasets.base.FolderDataset.content_digest)."""
        return hashlib.sha256(self.read_bytes(i)).hexdigest()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
