"""What a method answers: per sample, its scores (`MethodOutput`, what the engine records); per image, a readable
prediction (`Prediction`); and what an image may be (`load_image`).

Every method's `predict_context` returns a `MethodOutput` (`Method.predict` turns it into a tensor, the engine
into a record); `Method.predict_image` and the one call `shiftlab.predict` (methods/single_image.py) return a
`Prediction`: class index and name, probabilities (the method's own, e.g. ZERO's votes), logits and top-k.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..datasets.imageio import decode_image


@dataclass
class MethodOutput:
    """`logits` (C,) are the method's scores; `probs` overrides softmax(logits) when the
    method's scores are not logits (votes, cache mixtures). `extras` holds JSON scalars."""
    logits: torch.Tensor
    probs: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    # the method's own OOD score of the sample where its spec declares one (`own_ood_score`; higher: more
    # in-distribution); recorded on open-set runs beside MCM's, which every prediction gets
    ood_score: float | None = None

    def probabilities(self) -> torch.Tensor:
        return self.probs if self.probs is not None else self.logits.float().softmax(-1)


@dataclass
class Prediction:
    """A method's answer on one image. `probs` and `logits` are (C,) float32 on the CPU."""
    index: int
    name: str
    probs: torch.Tensor
    logits: torch.Tensor
    classnames: Sequence[str]

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The k most probable classes as (name, probability), most probable first."""
        k = min(int(k), len(self.classnames))
        values, indices = self.probs.topk(k)
        return [(self.classnames[i], float(v)) for v, i in zip(values.tolist(), indices.tolist())]

    @property
    def confidence(self) -> float:
        return float(self.probs[self.index])

    def __repr__(self) -> str:
        return f"Prediction({self.name!r}, index={self.index}, p={self.confidence:.3f})"


def load_image(image: Any) -> Image.Image:
    """A path, a PIL image, an (H, W, 3) / (H, W) uint8 array or a (3, H, W) uint8 tensor -> RGB PIL image.

    Paths are decoded as a run decodes them (EXIF orientation, size limits; an undecodable file
    raises shiftlab.datasets.imageio.ImageDecodeError). Anything else is a one-line ValueError."""
    if isinstance(image, (str, os.PathLike)):
        return decode_image(image)
    if isinstance(image, Image.Image):
        _check_size(image.width, image.height)
        return image.convert("RGB")
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] not in (1, 3):
            raise ValueError(f"image tensor must be uint8 (3, H, W), got {image.dtype} {tuple(image.shape)}")
        image = image.expand(3, -1, -1).permute(1, 2, 0).cpu().numpy()
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
            raise ValueError(f"image array must be uint8 (H, W), (H, W, 3) or (H, W, 4), got {image.dtype} "
                             f"{image.shape}")
        _check_size(image.shape[1], image.shape[0])
        return Image.fromarray(np.ascontiguousarray(image)).convert("RGB")
    raise ValueError(f"image must be a path, a PIL image, a uint8 array or a uint8 tensor, got {type(image).__name__}")


def _check_size(width: int, height: int) -> None:
    """An image without pixels cannot be resized into views (torchvision divides by its size)."""
    if width < 1 or height < 1:
        raise ValueError(f"image has no pixels ({width} x {height}); give an image at least 1 x 1")


def make_prediction(logits: torch.Tensor, probs: torch.Tensor, classnames: Sequence[str]) -> Prediction:
    """The method's (C,) scores -> a `Prediction` (argmax of the probabilities, lowest index on ties)."""
    probs = probs.detach().float().cpu()
    index = int(probs.argmax())
    return Prediction(index, classnames[index], probs, logits.detach().float().cpu(), list(classnames))
