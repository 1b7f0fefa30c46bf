"""Panda (Deng, Bao, Wei & He, AAAI 2026, "Panda: Test-Time Adaptation with Negative Data Augmentation") on
zero-shot CLIP, as its authors' code runs it.

Sources are cited as `file:line` of ruxideng/Panda at 9f02da2 (`src/methods/CLIP.py`, `src/methods/shuffle.py`,
`src/main.py`). What differs from the authors' code: README.md."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, OWN_TOWER, Capabilities, MethodConfig, MethodSpec


@dataclass
class PandaConfig(MethodConfig):
    """Their `CLIP` class with `style: Panda` (CLIP.py:22-25: `cfg.get(...)` defaults; their repository ships no
    config file, so these are the run's values)."""
    # the weight of the negatives' mean feature subtracted (cfg.get("beta", 0.6), CLIP.py:24)
    beta: float = param(0.6, ge=0)
    # the side of the square patches the mosaics are cut into (cfg.get("patch_size", 32), CLIP.py:25)
    patch_size: int = param(32, ge=1)
    # the literal 100.0 of their logits (CLIP.py:33, 46); None: the model's exp(logit_scale) (100 for OpenAI CLIP)
    logit_scale: float | None = param(100.0, gt=0)
    # their seed (main.py --seed 0, setup_seed); each batch's mosaics draw from a generator seeded by it and the
    # batch's sample ids (method.batch_seed), where theirs draw from torch's global stream
    seed: int = param(0, ge=0)
    # "a photo of a {}." averaged per class (CLIP.py:17-19 with utils.encode_text)
    text_head: str = param("zeroshot", choices=("zeroshot", "ensemble"))
    templates: tuple[str, ...] | None = None


class PandaSpec(MethodSpec):
    # the batch's view-0 features (frozen) and its pixels, cut into the mosaics the frozen tower encodes; nothing is
    # learnt and nothing crosses batches
    capabilities = Capabilities(reads=(FROZEN_FEATURES, OWN_TOWER), state=EPISODIC, batches=True)
    # the golden 64 px images hold 2 x 2 patches of 32: 16 px patches make 4 x 4 mosaics
    test_config = {"patch_size": 16}
