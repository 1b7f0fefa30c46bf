"""What a model expects of its input: open_clip's preprocess config (size, mean/std, resize mode,
interpolation), OpenAI's by default. Data shared by the view generator and the models."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
OPENAI_PREPROCESS = {"mean": OPENAI_MEAN, "std": OPENAI_STD, "interpolation": "bicubic", "resize_mode": "shortest"}


@dataclass(frozen=True)
class Preprocess:
    """What a model expects of its input (open_clip's preprocess config, OpenAI's by default).

    `resize_mode`/`interpolation` say how the original view is made: "shortest" resizes the
    shorter side to `image_size` and centre-crops, "squash" resizes to a square, "longest"
    resizes the longer side and pads with `fill_color`.
    """
    image_size: int
    mean: tuple[float, float, float] = OPENAI_MEAN
    std: tuple[float, float, float] = OPENAI_STD
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"
    fill_color: int = 0

    @classmethod
    def from_open_clip(cls, cfg: dict[str, Any], image_size: int) -> Preprocess:
        def triple(v, default):
            v = default if v is None else v
            return tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else (v,) * 3))
        interpolation = cfg.get("interpolation") or "bicubic"
        return cls(int(image_size), triple(cfg.get("mean"), OPENAI_MEAN), triple(cfg.get("std"), OPENAI_STD),
                   "bilinear" if interpolation == "bilinear" else "bicubic",   # open_clip: "random" -> bicubic
                   cfg.get("resize_mode") or "shortest", int(cfg.get("fill_color") or 0))
