"""Deterministic test-time views (TPT's ImageNet protocol).

View 0 is the original, made as the model's open_clip preprocess config says (OpenAI's:
Resize(shorter side -> size, bicubic) + CenterCrop(size); SigLIP's: squash to size, ...).
Views 1..N-1 are RandomResizedCrop(size) (by default scale 0.08-1, ratio 3/4-4/3, bilinear) +
RandomHorizontalFlip of the ORIGINAL image, optionally followed by TPT's AugMix or Cutout; a method's
`ViewRecipe` (shiftlab.views.recipe) says which (its config's `views` field).

Randomness comes from a generator seeded by (run seed, sample id) alone (and a `stream` number where one
run draws several independent sets of views of a sample: TIPPLE's weak and strong views), so a
sample's views are identical whatever the order, batch size, worker count or
number of processes. Views are uint8 (N, 3, S, S); normalisation happens on the
device inside the model.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image, ImageOps

from .recipe import ViewRecipe

if TYPE_CHECKING:
    from .preprocess import Preprocess


@dataclass(frozen=True)
class ViewConfig(ViewRecipe):
    """A recipe at an image size: what `ViewGenerator` draws. `size` None: the model's input size
    (ViewGenerator's `preprocess`)."""
    size: int | None = None

    @property
    def recipe(self) -> ViewRecipe:
        return ViewRecipe(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ViewRecipe)})

    @classmethod
    def from_recipe(cls, recipe: ViewRecipe, size: int | None = None) -> ViewConfig:
        return cls(**recipe.to_dict(), size=size)


def sample_seed(run_seed: int, sample_id: int, stream: int = 0) -> int:
    """A 63-bit seed that depends only on (run seed, sample id) and, where not 0, the stream number: each
    stream's views are drawn independently of the others'."""
    entropy = [int(run_seed), int(sample_id)] + ([int(stream)] if stream else [])
    return int(np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint64)[0] >> 1)


def cutout(view: Image.Image, side: int, rng: np.random.Generator) -> Image.Image:
    """Cutout as TIPPLE's `Cutout(1, length)` draws it (data/datautils.py:181-218@fe1747e): a centre pixel
    (y, x) uniform over the image, the square [y - side//2, y + side//2) x [x - side//2, x + side//2)
    clipped at the border, set to 0 (black, before normalisation)."""
    pixels = np.array(view, dtype=np.uint8, copy=True)
    h, w = pixels.shape[:2]
    y, x = int(rng.integers(h)), int(rng.integers(w))
    half = side // 2
    pixels[max(y - half, 0):min(y + half, h), max(x - half, 0):min(x + half, w)] = 0
    return Image.fromarray(pixels)


def to_uint8_tensor(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(img.convert("RGB"), dtype=np.uint8, copy=True)).permute(2, 0, 1).contiguous()


def base_view(img: Image.Image, size: int, preprocess: Preprocess | None = None) -> Image.Image:
    """The original view: OpenAI's resize + centre crop, or the model's own resize mode and interpolation
    (open_clip's eval transform, minus tensor conversion and normalisation)."""
    # here, not at the top: torchvision imports torch._dynamo (seconds at import)
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF
    if preprocess is None or (preprocess.resize_mode, preprocess.interpolation) == ("shortest", "bicubic"):
        img = TF.resize(img, size, interpolation=InterpolationMode.BICUBIC)
        return TF.center_crop(img, size)
    from open_clip.transform import image_transform
    geometry = image_transform(size, is_train=False, resize_mode=preprocess.resize_mode,
                               interpolation=preprocess.interpolation, fill_color=preprocess.fill_color).transforms
    for step in geometry[:-3]:     # the last three: convert mode, to tensor, normalise
        img = step(img)
    return img


def random_resized_crop_params(width: int, height: int, scale: Sequence[float], ratio: Sequence[float],
                               gen: torch.Generator) -> tuple[int, int, int, int]:
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


# -- AugMix as TPT's `augmix_ops.py` draws it (ImageNet-variant ops: no colour/contrast/brightness/sharpness)
#
# Each op draws its level from uniform(0.1, severity) and scales it to the op's range: an int
# `int(level * maxval / 10)` or a float `level * maxval / 10`. Operations whose direction is
# random flip the sign with probability 1/2. An op's parameters are drawn (`draw`) apart from
# applying them (`apply`), so the distribution of the draws is testable on its own.

def _level(severity: float, rng: np.random.Generator) -> float:
    return float(rng.uniform(0.1, severity))


def _int_parameter(level: float, maxval: float) -> int:
    return int(level * maxval / 10)


def _float_parameter(level: float, maxval: float) -> float:
    return float(level) * maxval / 10.0


def _signed(value, rng: np.random.Generator):
    return -value if rng.uniform() > 0.5 else value


@dataclass(frozen=True)
class AugOp:
    """One AugMix operation: `draw(severity, size, rng)` -> its parameter (None if it has none);
    `apply(img, parameter)` -> the transformed image."""
    name: str
    draw: Callable[[float, int, np.random.Generator], float | int | None]
    apply: Callable[[Image.Image, Any], Image.Image]


def _affine(data: tuple) -> Callable[[Image.Image, float], Image.Image]:
    def apply(img: Image.Image, v: float) -> Image.Image:
        coeffs = tuple(v if c == "v" else c for c in data)
        return img.transform(img.size, Image.AFFINE, coeffs, resample=Image.BILINEAR)
    return apply


AUGMIX_OPS: tuple[AugOp, ...] = (
    AugOp("autocontrast", lambda s, size, rng: None, lambda img, _: ImageOps.autocontrast(img)),
    AugOp("equalize", lambda s, size, rng: None, lambda img, _: ImageOps.equalize(img)),
    AugOp("posterize", lambda s, size, rng: 4 - _int_parameter(_level(s, rng), 4),
          lambda img, bits: ImageOps.posterize(img, bits)),
    AugOp("rotate", lambda s, size, rng: _signed(_int_parameter(_level(s, rng), 30), rng),
          lambda img, deg: img.rotate(deg, resample=Image.BILINEAR)),
    AugOp("solarize", lambda s, size, rng: 256 - _int_parameter(_level(s, rng), 256),
          lambda img, threshold: ImageOps.solarize(img, threshold)),
    AugOp("shear_x", lambda s, size, rng: _signed(_float_parameter(_level(s, rng), 0.3), rng),
          _affine((1, "v", 0, 0, 1, 0))),
    AugOp("shear_y", lambda s, size, rng: _signed(_float_parameter(_level(s, rng), 0.3), rng),
          _affine((1, 0, 0, "v", 1, 0))),
    AugOp("translate_x", lambda s, size, rng: _signed(_int_parameter(_level(s, rng), size / 3), rng),
          _affine((1, 0, "v", 0, 1, 0))),
    AugOp("translate_y", lambda s, size, rng: _signed(_int_parameter(_level(s, rng), size / 3), rng),
          _affine((1, 0, 0, 0, 1, "v"))),
)


@dataclass(frozen=True)
class AugMixPlan:
    """Every random choice of one AugMix draw: chain weights (Dirichlet), the skip weight
    (Beta(1, 1)) and per chain its ops with their parameters."""
    weights: tuple[float, ...]
    skip: float
    chains: tuple[tuple[tuple[str, Any], ...], ...]


_OPS_BY_NAME = {op.name: op for op in AUGMIX_OPS}


def draw_augmix(rng: np.random.Generator, size: int, severity: float = 1, width: int = 3) -> AugMixPlan:
    """TPT's AugMix draws for an image of `size` pixels: `width` chains of 1-3 ops chosen uniformly."""
    weights = rng.dirichlet([1.0] * width).astype(np.float32)
    skip = np.float32(rng.beta(1.0, 1.0))
    chains = []
    for _ in range(width):
        chain = []
        for _ in range(int(rng.integers(1, 4))):
            op = AUGMIX_OPS[int(rng.integers(len(AUGMIX_OPS)))]
            chain.append((op.name, op.draw(severity, size, rng)))
        chains.append(tuple(chain))
    return AugMixPlan(tuple(float(w) for w in weights), float(skip), tuple(chains))


def apply_augmix(img: Image.Image, plan: AugMixPlan) -> Image.Image:
    """skip * image + (1 - skip) * sum_i weight_i * chain_i(image), rounded to 8 bits.

    TPT mixes the normalised tensors; normalisation is affine and the weights sum to one, so
    mixing in [0, 255] and rounding differs from it by at most half a grey level."""
    base = np.asarray(img, dtype=np.float32)
    mix = np.zeros_like(base)
    for weight, chain in zip(plan.weights, plan.chains):
        aug = img.copy()
        for name, parameter in chain:
            aug = _OPS_BY_NAME[name].apply(aug, parameter)
        mix += weight * np.asarray(aug, dtype=np.float32)
    out = plan.skip * base + (1 - plan.skip) * mix
    return Image.fromarray(np.clip(np.rint(out), 0, 255).astype(np.uint8))


def augmix(img: Image.Image, rng: np.random.Generator, severity: float = 1, width: int = 3) -> Image.Image:
    """TPT's AugMix of one (already cropped) view, drawing from `rng`."""
    return apply_augmix(img, draw_augmix(rng, img.size[0], severity, width))


# Bump when a change here alters the views drawn for a (recipe, seed, sample): stored features
# (shiftlab.rundir.feature_store) keyed by the old value are then never read.
VIEW_GENERATOR_VERSION = 1


class ViewGenerator:
    """Image -> uint8 views (N, 3, S, S), seeded per sample.

    `preprocess` is the model's (`model.preprocess`): S defaults to its input size and the
    original view follows its resize mode and interpolation. Without it, `config.size` is
    required and view 0 is OpenAI's resize + centre crop.
    """

    def __init__(self, config: ViewConfig = ViewConfig(), seed: int = 0, preprocess: Preprocess | None = None,
                 stream: int = 0):
        size = config.size if config.size is not None else getattr(preprocess, "image_size", None)
        if size is None:
            raise ValueError("ViewConfig.size is None and no model preprocess was given: pass "
                             "ViewGenerator(config, seed, preprocess=model.preprocess) or a size")
        if int(size) < 1:
            raise ValueError(f"views: size must be >= 1, got {size}")
        self.config = dataclasses.replace(config, size=int(size))
        self.seed = int(seed)
        self.stream = int(stream)   # 0: the run's views; another number: an independent set of them
        self.preprocess = preprocess

    def __call__(self, img: Image.Image, sample_id: int) -> torch.Tensor:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as TF
        cfg = self.config
        img = img.convert("RGB")
        views = [to_uint8_tensor(base_view(img, cfg.size, self.preprocess))]
        if cfg.n_views > 1:
            seed = sample_seed(self.seed, sample_id, self.stream)
            gen = torch.Generator().manual_seed(seed)
            rng = np.random.default_rng(seed)
            resample = InterpolationMode.BICUBIC if cfg.interpolation == "bicubic" else InterpolationMode.BILINEAR
            side = int(round(cfg.cutout * cfg.size))
            for _ in range(cfg.n_views - 1):
                i, j, h, w = random_resized_crop_params(img.width, img.height, cfg.scale, cfg.ratio, gen)
                view = TF.resized_crop(img, i, j, h, w, [cfg.size, cfg.size], interpolation=resample)
                if cfg.flip and torch.rand(1, generator=gen).item() < 0.5:
                    view = TF.hflip(view)
                # no draw without Cutout, so the recipes without it draw the views they always drew
                if side and rng.uniform() < cfg.cutout_p:
                    view = cutout(view, side, rng)
                elif cfg.augmix:
                    view = augmix(view, rng, cfg.augmix_severity, cfg.augmix_width)
                views.append(to_uint8_tensor(view))
        return torch.stack(views)
