"""Panda on zero-shot CLIP, as its authors' code runs it (github.com/ruxideng/Panda at 9f02da2: `CLIP.forward` with
`style: Panda`, `src/methods/CLIP.py:28-47`, on `batch_hedge_v6_images`, `src/methods/shuffle.py`). For every batch
of B test images (view 0 of each, CLIP-normalised):

1. the negatives: M = ceil(B / 10) mosaics. Each takes a random base image of the batch and replaces its top-left
   (H // p) p x (W // p) p region, patch position by patch position, with the patch at that position of another
   image of the batch, drawn uniformly among the images other than the base (`negative_views`);
2. the offset: the mean of the negatives' unit features through the frozen image tower, (D,), not renormalised;
3. each image's logits: s f_i . w_c - beta s n . w_c, the zero-shot logits minus beta times the offset's (s: their
   literal 100). The same per-class shift for the whole batch.

Nothing is learnt and nothing crosses batches. Their draws come from torch's global stream; here from a generator
seeded by (seed, the batch's sample ids), drawn with the same calls in the same order, so a generator seeded s
draws what theirs draws after `torch.manual_seed(s)`. README.md lists what differs.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..base import MethodOutput
from ..context import SampleContext, batch_pixels
from ..head_kinds import text_head
from ..kinds import BatchMethod
from .spec import PandaSpec

_SEED_SALT = 0x9A4DA   # the mosaics' stream, apart from the views' and the attacks'


def batch_seed(seed: int, sample_ids: Sequence[int]) -> int:
    """The seed of the mosaics of the batch of `sample_ids` (in stream order) in a run seeded `seed`."""
    return int(np.random.SeedSequence([int(seed), *map(int, sample_ids), _SEED_SALT])
               .generate_state(1, dtype=np.uint64)[0] >> 1)


def negative_count(batch: int) -> int:
    """M = ceil(B / 10) negatives per batch of B (shuffle.py:25)."""
    return math.ceil(batch / 10)


def mosaic_draws(batch: int, cells: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The draws of their `batch_hedge_v6_images` for a batch of `batch` images cut into `cells` patches: for each
    of the M = ceil(B / 10) mosaics a base index b ~ U{0..B-1}, then for each patch position an image index ~
    U{0..B-1}, the draws equal to b redrawn together until none is (shuffle.py:27-37). -> (bases (M,), sources
    (M, cells)), int64 on the CPU. Needs two images or more (theirs never leaves its redraw loop with one)."""
    if batch < 2:
        raise ValueError(f"a mosaic takes its patches from images other than its base: a batch of {batch} has none")
    bases, sources = [], []
    for _ in range(negative_count(batch)):
        base = int(torch.randint(0, batch, (1,), generator=generator).item())
        source = torch.randint(0, batch, (cells,), generator=generator)
        clash = source == base
        while clash.any():
            source[clash] = torch.randint(0, batch, (int(clash.sum().item()),), generator=generator)
            clash = source == base
        bases.append(base)
        sources.append(source)
    return torch.tensor(bases, dtype=torch.int64), torch.stack(sources)


def negative_views(images: torch.Tensor, patch_size: int, generator: torch.Generator) -> torch.Tensor:
    """(B, C, H, W) -> (M, C, H, W) mosaics, M = ceil(B / 10), as their `batch_hedge_v6_images`: mosaic m is the
    base image `bases[m]` with its top-left (H // p) p x (W // p) p region made, position by position, of the
    patches of images `sources[m]` at the same positions (`mosaic_draws`, on `generator`: a CPU generator, the same
    on every device). An image smaller than one patch: the images themselves (theirs returns the batch). One image:
    no other to draw from (theirs never returns): (0, C, H, W). Differentiable in `images` (gathers)."""
    b, c, h, w = images.shape
    p = patch_size
    rows, cols = h // p, w // p
    if rows == 0 or cols == 0:
        return images
    if b < 2:
        return images[:0]
    height, width = rows * p, cols * p
    patches = (images[:, :, :height, :width].unfold(2, p, p).unfold(3, p, p)
               .permute(0, 2, 3, 1, 4, 5).reshape(b, rows * cols, c, p, p))
    positions = torch.arange(rows * cols, device=images.device)
    bases, sources = mosaic_draws(b, rows * cols, generator)
    mosaics = []
    for base, source in zip(bases.tolist(), sources.to(images.device)):
        region = (patches[source, positions].reshape(rows, cols, c, p, p)
                  .permute(2, 0, 3, 1, 4).reshape(c, height, width))
        mosaic = images[base].clone()
        mosaic[:, :height, :width] = region
        mosaics.append(mosaic)
    return torch.stack(mosaics)


def debiased_logits(features: torch.Tensor, offset: torch.Tensor | None, head: torch.Tensor, scale: float,
                    beta: float) -> torch.Tensor:
    """(B, D) unit features, (D,) the negatives' mean feature (None: no negative), (C, D) head -> (B, C):
    s f . w - beta s n . w (CLIP.py:33, 46)."""
    logits = scale * features @ head.T
    if offset is None:
        return logits
    return logits - beta * (scale * (offset[None] @ head.T))


class Panda(BatchMethod):
    """Panda: zero-shot logits minus beta times those of the mean feature of patch mosaics of the batch."""
    spec = PandaSpec

    def prepare(self) -> None:
        _ = text_head(self)

    def reset(self) -> None:
        pass                        # nothing is carried from batch to batch

    @property
    def scale(self) -> float:
        return self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale

    def generator(self, sample_ids: Sequence[int]) -> torch.Generator:
        """The CPU generator of the mosaics of the batch of `sample_ids`."""
        return torch.Generator().manual_seed(batch_seed(self.config.seed, sample_ids))

    def batch_logits(self, features: torch.Tensor, pixels: torch.Tensor, sample_ids: Sequence[int],
                     encode: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, int]:
        """(B, D) unit features of the batch's images, (B, 3, S, S) their normalised pixels -> ((B, C) logits,
        the number of negatives M); `encode` takes normalised pixels to unit features."""
        negatives = negative_views(pixels, self.config.patch_size, self.generator(sample_ids))
        offset = encode(negatives).float().mean(0) if negatives.shape[0] else None
        return debiased_logits(features, offset, text_head(self).float(), self.scale, self.config.beta), \
            negatives.shape[0]

    @torch.no_grad()
    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        if not ctxs:
            return []
        pixels = batch_pixels(ctxs, self.model.device, f"{self.name} cuts the batch's images into patch mosaics and "
                              "needs their pixels, not stored features")
        features = torch.stack([c.base_feature.float() for c in ctxs])
        ids = [c.sample_id if c.sample_id is not None else i for i, c in enumerate(ctxs)]
        logits, negatives = self.batch_logits(features, pixels, ids,
                                              lambda x: self.model.encode_views(x, self.precision))
        zero_shot = self.scale * features @ text_head(self).float().T
        return [MethodOutput(row, extras={"batch": len(ctxs), "negatives": negatives,
                                          "zero_shot_pred": int(z.argmax())})
                for row, z in zip(logits, zero_shot)]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        """One image alone: a batch of one (no other image to make a negative of: its zero-shot logits)."""
        return self.adapt_batch([ctx])[0]


def panda_logits(method: Panda, views01: torch.Tensor, sample_ids: Sequence[int] | None = None) -> torch.Tensor:
    """The batch attacked jointly (`--attack-target adaptive`, mode full): (B, N, 3, S, S) in [0, 1] -> (B, C), view 0
    of each through the image tower, and the mosaics the scoring draws for these sample ids (its generator, so
    deterministic to the attacker) cut from the attacked pixels and encoded, all differentiated."""
    x = method.model.normalize(views01[:, 0])
    ids = list(range(x.shape[0])) if sample_ids is None else list(sample_ids)
    with torch.enable_grad():
        return method.batch_logits(method.model.encode_normalized(x).float(), x, ids,
                                   method.model.encode_normalized)[0]
