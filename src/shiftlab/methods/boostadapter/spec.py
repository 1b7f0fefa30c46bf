"""BoostAdapter (Zhang et al., NeurIPS 2024, "BoostAdapter: Improving Vision-Language Test-Time"""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec
from ..common.tda_cache_config import TDAConfig


@dataclass
class BoostAdapterConfig(TDAConfig):
    """BoostAdapter's ImageNet-R settings. Cache values from the authors' `configs/imagenet_r.yaml`
    (line numbers below), the read-out from `runner.py` (`run_test_tda`, mode "boostadapter", lines
    128-160) and `utils.py` (`get_clip_logits`, `select_confident_samples`); the classifier is
    `clip_classifier` (utils.py:54-71) over `datasets/imagenet_r.py`'s template list (CLIP's 80; the
    other sets' lists equal TDA's, methods/tda/card.toml). Their model is `clip.load` on
    CUDA, half precision, with the literal logit scale 100 (utils.py:84): the `paper` protocol's
    `precision="fp16-pure"`, `logit_scale=100`. Their views: the original (Resize 224 bicubic +
    CenterCrop) and 63 RandomResizedCrop(224) + flip, no AugMix (utils.py:122 `augmix=False`), which
    are the shared views.
    """
    pos_capacity: int = param(3, ge=0)              # configs/imagenet_r.yaml:3 (positive shot_capacity)
    pos_alpha: float = param(1.0, ge=0)             # configs/imagenet_r.yaml:4
    pos_beta: float = param(8.0, ge=0)              # configs/imagenet_r.yaml:5
    neg_capacity: int = param(2, ge=0)              # configs/imagenet_r.yaml:8
    neg_alpha: float = param(0.117, ge=0)           # configs/imagenet_r.yaml:9
    neg_beta: float = param(1.0, ge=0)              # configs/imagenet_r.yaml:10
    neg_entropy_lower: float = param(0.2, ge=0)     # configs/imagenet_r.yaml:12
    neg_entropy_upper: float = param(0.5, ge=0)     # configs/imagenet_r.yaml:13
    neg_mask_lower: float = param(0.03, ge=0, le=1)       # configs/imagenet_r.yaml:15
    neg_mask_upper: float = param(1.0, ge=0, le=1)        # configs/imagenet_r.yaml:16
    # configs/imagenet_r.yaml:17: extra entries per class of the boosted positive cache (runner.py:147,
    # shot_capacity + cfg['delta'])
    delta: int = param(3, ge=0)
    # share of the views kept, for the sample's summary and as boosting views (utils.py:96, runner.py:140:
    # 0.1); the boosting views number int(N * view_ratio), with no minimum (none with fewer than 10 views)
    view_ratio: float = param(0.1, gt=0, le=1)
    # what the historical caches store and the read-out starts from: "confident", the mean of the
    # confident views (utils.py:95-103, the ImageNet variants); "original", view 0 alone (utils.py:88-93
    # with infer_ori_image, which runner.py:120 sets for the fine-grained sets)
    sample_view: str = param("confident", choices=("confident", "original"))
    # how a full class of the negative cache takes a new entry: "fifo", the oldest leaves (runner.py:150
    # passes True as include_prob_map and leaves fifo=True, runner.py:57-59); "tda", the highest-entropy
    # entry leaves if the new one is lower (TDA's rule, which the positive cache keeps, runner.py:134)
    neg_rule: str = param("fifo", choices=("fifo", "tda"))


class BoostAdapterSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    supports_pure_fp16 = True   # as TDA's: --set boostadapter.precision=fp16-pure, the authors' half model (CUDA)
    # TDA's, and 2 boosting views of 8
    test_config = {"pos_capacity": 2, "neg_entropy_lower": 0.0, "neg_entropy_upper": 1.0, "view_ratio": 0.25,
                   "delta": 1}
