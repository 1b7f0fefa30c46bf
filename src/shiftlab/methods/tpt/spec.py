"""Episodic test-time prompt tuning: TPT, C-TPT, O-TPT and R-TPT (RLCF's student too: methods/rlcf/)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec

SELF_MASKS = ("index", "threshold")


@dataclass
class CTPTConfig(PromptTuningConfig):
    lambda_atfd: float = param(20.0, ge=0)   # 20 for the ImageNet variants, 50 for fine-grained sets (authors' scripts)


@dataclass
class OTPTConfig(PromptTuningConfig):
    # ashshaksharifdeen/O-TPT@a09933f scripts/test_tpt_otpt_ds.sh:11 (lambda_term=2, the natural-shift sets);
    # scripts/test_tpt_otpt_fg.sh:11 sets 18 for the fine-grained sets (dataset_values)
    lambda_ortho: float = param(2.0, ge=0)


@dataclass
class RTPTConfig(PromptTuningConfig):
    k_neighbours: int = param(20, ge=1)
    temperature: float = param(0.01, gt=0)
    self_mask: str = param("index", choices=SELF_MASKS)   # "threshold" reproduces the authors' sim >= 1.0 rule


class TPTSpec(PromptTuningSpec):
    """TPT: the prompt tuners' shared spec as it stands (`PromptTuningSpec`), under its own name."""


class CTPTSpec(PromptTuningSpec):
    name = "ctpt"


class OTPTSpec(PromptTuningSpec):
    name = "otpt"


class RTPTSpec(PromptTuningSpec):
    name = "rtpt"
    min_views = 2
    min_views_why = "its reliability weights rank each view's neighbours (one view has none: NaN weights)"
