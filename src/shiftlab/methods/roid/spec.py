"""ROID (Marsden, Döbler & Yang, WACV 2024, "Universal Test-time Adaptation through Weight Ensembling, Diversity
Weighting, and Prior Correction"), on CLIP as mariodoebler/test-time-adaptation runs it.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/roid.py`, `methods/base.py`,
`utils/losses.py`, `utils/misc.py`, `cfgs/imagenet_others/roid.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA
from ..common.roid_config import RoidConfig


@dataclass
class ROIDConfig(RoidConfig):
    """mariodoebler's ROID (`methods/roid.py`) with its ImageNet config (`cfgs/imagenet_others/roid.yaml`); the
    shared fields in `common/roid_config.py` and `common/norm_config.py`."""


class ROIDSpec(MethodSpec):
    # the image tower's normalisation layers adapt on whole batches, the state carried from batch to batch
    capabilities = NORM_TTA
    test_config = {"lr": 0.01}
