"""A-TPT (Ahamed et al., ICLR 2026): TPT plus an angular-diversity term on the class text features."""
from __future__ import annotations

from dataclasses import dataclass

from ...datasets.suites import SUITES
from ...params import param
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec

IMAGENET_SETS = SUITES["natural-shift"].datasets
FINE_GRAINED = SUITES["cross-dataset"].datasets
OBJECTIVES = ("maximize", "minimize")


@dataclass
class ATPTConfig(PromptTuningConfig):
    # scripts/test_tpt_atpt_ds.sh:10 (lambda_term=10, the natural-shift sets); scripts/test_tpt_atpt_fg.sh:10 sets 80
    lambda_angular: float = param(10.0, ge=0)
    # scripts/test_tpt_atpt_{ds,fg}.sh:11 (tau_term=0.99999), atpt_classification.py:585; clip/custom_clip.py:321
    # hard-codes the same value for tpt_classification.py
    tau: float = param(0.99999, gt=0, le=1)
    # "maximize": loss - lambda x the mean minimum angle between class features, as tpt_classification.py:255
    # (run by scripts/test_tpt_atpt_ds.sh, ImageNet-R) and the paper; "minimize": loss + lambda x that mean, as
    # atpt_classification.py:256-269 (run by scripts/test_tpt_atpt_fg.sh): the two files differ in sign
    objective: str = param("maximize", choices=OBJECTIVES)


class ATPTSpec(PromptTuningSpec):
    """A-TPT: TPT's spec, with the angular term's fields (`ATPTConfig`)."""
