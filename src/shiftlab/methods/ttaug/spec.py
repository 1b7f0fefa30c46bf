"""Test-time augmentation (TTAug): the prediction averaged over augmented views of the image, on CLIP as
mariodoebler/test-time-adaptation runs it.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/ttaug.py`, `methods/bn.py`,
`datasets/data_loading.py`, `augmentations/transforms_augmix.py`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ...views.recipe import ViewRecipe
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, MethodSpec, ViewMethodConfig
from ..common.norm_config import TEXT_HEADS

# the statistics the tower's BatchNorm layers normalise the views with (common/norm_statistics.py; "ema" carries
# state, which this per-image method has none of)
STATISTICS = ("alpha", "batch", "source")


@dataclass
class TTAugConfig(ViewMethodConfig):
    """mariodoebler's TTAug (`methods/ttaug.py`); it has no yaml: conf.py's defaults."""
    # the original and TEST.N_AUGMENTATIONS 32 (conf.py:322) AugMix views (AugMixAugmenter(..., use_augmix=True),
    # data_loading.py:53-56; transforms_augmix.py:63-64: RandomResizedCrop + flip, AugMix severity 1, width 3)
    # (`--protocol paper`; the leaderboard protocol's default: its 64 views, shared with every view method)
    views: ViewRecipe = ViewRecipe()
    # the views normalised by AlphaBatchNorm (ttaug.py:33, bn.py:29-79): (1 - alpha) x source + alpha x the views'
    # statistics; "source": the trained statistics; "batch": the views' own
    statistics: str = param("alpha", choices=STATISTICS)
    alpha: float = param(0.1, ge=0, le=1)                   # BN.ALPHA 0.1 (conf.py:116)
    # None: the model's own logit scale (ZeroShotCLIP's logit_scale.exp(), models/model.py:370)
    logit_scale: float | None = param(None, gt=0)
    # CLIP.PROMPT_MODE custom with ["a photo of a {}."] (conf.py:283-284)
    text_head: str = param("zeroshot", choices=TEXT_HEADS)


class TTAugSpec(MethodSpec):
    # each image alone: its views through the tower whose BatchNorm layers mix in the views' statistics
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC)
    test_config = {"views": ViewRecipe(n_views=4, augmix=True)}
