"""EATA's clean source images for its Fisher (main.py:142-172 of mr-eggplant/EATA): which images, in which batches,
as the pixels the adapted tower reads.

EATA draws `--fisher_size` 2000 images of ImageNet's validation set at random (`random.seed(2020)` then
`set_dataset_size`: `random.shuffle` of the indices, the first 2000; main.py:105, selectedRotateImageFolder.py:132-138)
and reads them in batches of `--batch_size` 64, the last one smaller (its loader keeps it). Here the subset is
`random.Random(fisher_seed).shuffle` of the folder's sorted samples, its first `fisher_images`, cut in that order
into batches of `fisher_batch_size`: the same images on every start and in every process, so a resumed run
recomputes the same Fisher. Each image is its view 0 (the model's own resize and centre crop, as every run reads
view 0), normalised: EATA's transform resizes to 256 and crops 224 for an ImageNet ResNet.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ...datasets.base import DatasetError
from ...datasets.build import build_dataset
from ...datasets.imageio import ImageDecodeError
from ...options import say_set
from ...views.generator import base_view, to_uint8_tensor


class FisherSource:
    """The chosen source images of a config (`fisher_source`, `fisher_dataset`, `fisher_images`, `fisher_seed`):
    `paths` (relative to the dataset's root, in batch order), `digest` (SHA-256 of each one's path and content
    digest: what run.json records), `batches(model, size)` (normalised pixels (b, 3, S, S) per batch)."""

    def __init__(self, config: Any):
        folder = Path(config.fisher_source).expanduser()
        if not folder.is_dir():
            what = "is not a directory" if folder.exists() else "does not exist"
            raise ValueError(f"eata.fisher_source {what}: {folder} (a folder of clean source images for EATA's "
                             f"Fisher; {say_set('eata', 'fisher_source', 'FOLDER')})")
        try:
            self.dataset = build_dataset(config.fisher_dataset, folder)
        except DatasetError as exc:
            raise ValueError(f"eata.fisher_source {folder} as {config.fisher_dataset}: {exc}") from None
        if len(self.dataset) == 0:
            raise ValueError(f"eata.fisher_source {folder} holds no image")
        order = list(range(len(self.dataset)))
        random.Random(config.fisher_seed).shuffle(order)
        self.ids = order[:config.fisher_images]
        self.paths = [self.dataset.samples[i][0] for i in self.ids]
        self.digest = hashlib.sha256("".join(f"{p}\t{self.dataset.content_digest(i)}\n" for p, i in
                                             zip(self.paths, self.ids)).encode()).hexdigest()

    def batches(self, model: Any, size: int) -> Iterator[torch.Tensor]:
        """The chosen images in batches of `size` (the last one smaller), each (b, 3, S, S) normalised pixels."""
        for start in range(0, len(self.ids), size):
            views = []
            for i in self.ids[start:start + size]:
                try:
                    image = self.dataset.image(i)
                except (ImageDecodeError, OSError) as exc:
                    raise ValueError(f"eata.fisher_source: {self.dataset.source(i)} cannot be read: {exc}") from None
                views.append(to_uint8_tensor(base_view(image, model.image_size, model.preprocess)))
            yield model.normalize(torch.stack(views).float().div(255))
