"""CMF (Lee & Chang, ICLR 2024, "Continual Momentum Filtering on Parameter Space for Online Test-time Adaptation"), on
CLIP as mariodoebler/test-time-adaptation runs it: ROID's loss and weighting, the source ensembling replaced by a
Kalman-style filter over the weights.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/cmf.py`, `methods/base.py`,
`utils/misc.py`, `cfgs/imagenet_others/cmf.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA
from ..common.roid_config import RoidConfig


@dataclass
class CMFConfig(RoidConfig):
    """mariodoebler's CMF (`methods/cmf.py`) with its ImageNet config (`cfgs/imagenet_others/cmf.yaml`); ROID's
    fields (cmf.py reads `cfg.ROID`, cmf.py:50-56) in `common/roid_config.py`. CMF has no source ensembling:
    `momentum_src` is not read."""
    method: ClassVar[str] = "cmf"
    # the hidden weights' pull back to the source in the predict step: h <- alpha h + (1 - alpha) source
    # (CMF.ALPHA 0.99, conf.py:275; cmf.py:97-103)
    alpha: float = param(0.99, ge=0, le=1)
    # the adapted weights' ensembling with the hidden ones: p <- gamma p + (1 - gamma) h (CMF.GAMMA 0.99,
    # conf.py:276; cmf.py:121-127)
    gamma: float = param(0.99, ge=0, le=1)
    # the process noise per 38,400 adapted parameters: q = Q x (adapted parameters / 38400) (CMF.Q 0.005,
    # conf.py:277; cmf.py:47, 83); the filter's gain clamps to [0.89, 1) (cmf.py:106-113). The scaled q must stay
    # below 1 (its complement is the gain's numerator): refused when the method is built on its tower
    q: float = param(0.005, ge=0)


class CMFSpec(MethodSpec):
    # the image tower's normalisation layers adapt on whole batches, the state carried from batch to batch
    capabilities = NORM_TTA
    test_config = {"lr": 0.01}
