"""MEMO (Zhang, Levine & Finn, NeurIPS 2022, "MEMO: Test Time Robustness via Adaptation and Augmentation"), on CLIP as
mariodoebler/test-time-adaptation runs it.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/memo.py`, `methods/base.py`,
`cfgs/imagenet_others/memo.yaml`, `datasets/data_loading.py`, `augmentations/transforms_augmix.py`) and of
zhangmarvin/memo (the method's own code, which theirs builds on)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ...views.recipe import ViewRecipe
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, MethodSpec, ViewMethodConfig
from ..common.norm_config import OPTIMIZERS, TEXT_HEADS

# the statistics the tower's BatchNorm layers normalise with (common/norm_statistics.py)
STATISTICS = ("alpha", "batch", "source")


@dataclass
class MEMOConfig(ViewMethodConfig):
    """mariodoebler's MEMO (`methods/memo.py`) with its ImageNet config (`cfgs/imagenet_others/memo.yaml`)."""
    # the original and TEST.N_AUGMENTATIONS 64 (memo.yaml) AugMix views (data_loading.py:53-56,
    # transforms_augmix.py:24-64: RandomResizedCrop + flip, AugMix severity 1, width 3); the loss reads the 64
    # augmented views, the prediction the original (memo.py:22-29)
    # (`--protocol paper`; the leaderboard protocol's default: its 64 views, shared with every view method)
    views: ViewRecipe = ViewRecipe()
    steps: int = param(1, ge=1)                             # OPTIM.STEPS 1 (memo.yaml)
    optimizer: str = param("sgd", choices=OPTIMIZERS)       # OPTIM.METHOD SGD (memo.yaml)
    lr: float = param(0.00025, gt=0)                        # OPTIM.LR 0.00025 (memo.yaml)
    momentum: float = param(0.9, ge=0, lt=1)                # OPTIM.MOMENTUM 0.9 (conf.py:134)
    nesterov: bool = True                                   # OPTIM.NESTEROV True (conf.py:140)
    weight_decay: float = param(0.0, ge=0)                  # OPTIM.WD 0.0 (memo.yaml)
    adam_beta: float = param(0.9, ge=0, lt=1)               # OPTIM.BETA 0.9 (memo.yaml), Adam / AdamW only
    # the BatchNorm layers normalise with (1 - alpha) x source + alpha x the batch's statistics (AlphaBatchNorm,
    # memo.py:59-60; BN.ALPHA 0.1, conf.py:116)
    statistics: str = param("alpha", choices=STATISTICS)
    alpha: float = param(0.1, ge=0, le=1)
    # None: the model's own logit scale (ZeroShotCLIP's logit_scale.exp(), models/model.py:370)
    logit_scale: float | None = param(None, gt=0)
    # CLIP.PROMPT_MODE custom with ["a photo of a {}."] (conf.py:283-284)
    text_head: str = param("zeroshot", choices=TEXT_HEADS)


class MEMOSpec(MethodSpec):
    # each image alone (MODEL.EPISODIC True, memo.yaml): every weight and bias of its own tower adapts on the
    # image's augmented views, then predicts the original; reset before the next image
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC)
    # the loss reads the augmented views (at least one beside the original)
    min_views = 2
    min_views_why = "the marginal entropy is over the augmented views, view 0 is predicted"
    test_config = {"views": ViewRecipe(n_views=3, augmix=True)}
