"""The torch-free half of ROID and CMF (mariodoebler/test-time-adaptation's `methods/roid.py` and `methods/cmf.py`,
8b2ed63): the config fields they share. Their torch half is `roid_training.py`.

Both read the same `cfg.ROID` options and the same ImageNet yaml (`cfgs/imagenet_others/roid.yaml`, `cmf.yaml`:
SGD, lr 0.00025, one step per batch of 64); sources are `classification/` files of that commit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...params import param
from .norm_config import TOP_LAYER_RULES
from .sgd_nesterov_config import SGDNesterovConfig


@dataclass
class RoidConfig(SGDNesterovConfig):
    """ROID's fields (conf.py:262-270 `_C.ROID`, the yaml's `OPTIM`: its SGD in `sgd_nesterov_config.py`); CMF's
    config adds its filter's."""
    method: ClassVar[str] = "roid"      # the name its messages give
    lr: float = param(0.00025, gt=0)                        # OPTIM.LR 0.00025 (roid.yaml, cmf.yaml)
    # every BatchNorm, LayerNorm and GroupNorm adapts (roid.py:138-152)
    skip_top_layers: str = param("none", choices=TOP_LAYER_RULES)
    # diversity and certainty weighting of the loss, the less diverse half masked out (ROID.USE_WEIGHTING True,
    # conf.py:265; roid.py:51-66)
    use_weighting: bool = True
    # the outputs multiplied by the batch's smoothed mean prediction (ROID.USE_PRIOR_CORRECTION True, conf.py:266;
    # roid.py:101-106)
    use_prior_correction: bool = True
    # the consistency loss: the symmetric cross-entropy between the outputs on one random augmentation of the kept
    # images (`common/tta_transforms`, reflect padding, no blur, no noise) and their outputs, weighted and divided as
    # the main loss (ROID.USE_CONSISTENCY True, conf.py:267; roid.py:33, 79-81)
    use_consistency: bool = True
    # the seed of the augmentations' draws: update k draws from `ema_teacher.update_generator(augment_seed, k)`
    # (their global generator, which they never seed per update)
    augment_seed: int = param(0, ge=0)
    # weight ensembling with the source: after each step param = m * param + (1 - m) * source (ROID.MOMENTUM_SRC
    # 0.99, conf.py:268; roid.py:93-98)
    momentum_src: float = param(0.99, ge=0, le=1)
    # the running mean prediction the diversity weight compares with (ROID.MOMENTUM_PROBS 0.9, conf.py:269)
    momentum_probs: float = param(0.9, ge=0, le=1)
    # the weights' temperature: exp(diversity x certainty / T) (ROID.TEMPERATURE 1/3, conf.py:270)
    temperature: float = param(1 / 3, gt=0)
    # what the weighted loss sum is divided by: None, the batch's own size; their code divides by TEST.BATCH_SIZE
    # (roid.py:30, 76), which differs on the stream's last, shorter batch: set it to the run's batch size
    loss_batch_size: int | None = param(None, ge=1)
    # their outputs are the adapting forward's (before the update, roid.py:46-47, 108)
    predict_after_update: bool = False
