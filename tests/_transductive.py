"""Library-level tests of every registered method: a test-set method (`reads_ahead == "test_set"`, TIPPLE) refuses
`predict` until it has been shown a test set (docs/PROTOCOLS.md), so `shown_test_set` shows it one, as the
engine's pass would: a few images' contexts of its own recipe, or of each recipe it names (`test_set_views`)."""
from __future__ import annotations

import torch

from shiftlab.methods.context import ClassHeads, SampleContext


def shown_test_set(method, model, heads: ClassHeads | None = None, n_images: int = 4, seed: int = 0):
    """`method` after a test-set pass over `n_images` random images (nothing for any other method)."""
    if method.spec.reads_ahead != "test_set":
        return method
    heads = heads if heads is not None else method.heads
    gen = torch.Generator().manual_seed(seed)
    size = model.image_size

    def contexts(n_views: int) -> list[SampleContext]:
        return [SampleContext(model, heads, model.normalize(torch.rand(n_views, 3, size, size, generator=gen)))
                for _ in range(n_images)]
    named = method.test_set_views
    method.observe_test_set(contexts(method.view_recipe.n_views) if named is None
                            else {key: contexts(recipe.n_views) for key, recipe in named.items()})
    method.test_set_seed = seed
    method.finish_test_set()
    return method
