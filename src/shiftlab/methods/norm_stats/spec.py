"""Test-time normalisation (Schneider et al., NeurIPS 2020, "Improving robustness against common corruptions by
covariate shift adaptation"; Nado et al. 2020), on CLIP as mariodoebler/test-time-adaptation runs it.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/norm.py`, `methods/bn.py`,
`cfgs/imagenet_others/norm_*.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodConfig, MethodSpec
from ..common.norm_config import NORM_TTA, TEXT_HEADS

# the statistics a BatchNorm layer normalises with (common/norm_statistics.py): the batch's own ("batch": their
# BNTest, norm.py:8-20, cfgs/*/norm_test.yaml), source and batch mixed ("alpha": BNAlpha, norm.py:23-32 on
# AlphaBatchNorm, cfgs/*/norm_alpha.yaml), running statistics updated by every batch ("ema": BNEMA, norm.py:35-43 on
# EMABatchNorm, cfgs/*/norm_ema.yaml)
STATISTICS = ("batch", "alpha", "ema")


@dataclass
class NormStatsConfig(MethodConfig):
    """mariodoebler's test-time normalisation (`methods/norm.py`): `norm_test`, the one `scripts/run_clip.sh`
    lists for CLIP, by default."""
    # MODEL.ADAPTATION bntest (cfgs/imagenet_others/norm_test.yaml)
    statistics: str = param("batch", choices=STATISTICS)
    # "alpha": (1 - alpha) x source + alpha x batch statistics (BN.ALPHA 0.1, conf.py:116)
    alpha: float = param(0.1, ge=0, le=1)
    # "ema": the running statistics' momentum (torch's BatchNorm2d default 0.1, which EMABatchNorm keeps, bn.py:92-95)
    momentum: float = param(0.1, gt=0, le=1)
    # None: the model's own logit scale (ZeroShotCLIP's logit_scale.exp(), models/model.py:370)
    logit_scale: float | None = param(None, gt=0)
    # CLIP.PROMPT_MODE custom with ["a photo of a {}."] (conf.py:283-284); run_clip.sh passes ensemble
    text_head: str = param("zeroshot", choices=TEXT_HEADS)


class NormStatsSpec(MethodSpec):
    # the image tower's BatchNorm layers normalise with the batch's statistics; "ema" carries running statistics
    # from batch to batch (the others carry nothing: their state is empty)
    capabilities = NORM_TTA
    test_config = {"statistics": "ema"}
