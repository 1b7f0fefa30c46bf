"""DOTA (Han et al., NeurIPS 2025, "DOTA: Distributional Test-Time Adaptation of Vision-Language Models")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class DOTAConfig(ViewMethodConfig):
    """DOTA's ImageNet-R hyperparameters from the authors' `configs/vit/imagenet_r.yaml` (lines 3-6 at
    commit bc67d44 of github.com/skylineeeeen/DOTA; the repository has ViT-B/16 configs only). The view
    selection (10% lowest-entropy views, their per-view softmax as soft labels) is `get_clip_logits_aug`
    in `utils.py` (lines 103-114); the initial means, counts and covariances are `DOTA.__init__` and
    `main` in `dota.py` (lines 35-39, 158); the fusion weight `run_test_dota` (dota.py:105).
    """
    # shrinkage of the shared covariance towards I before inverting (imagenet_r.yaml:3)
    epsilon: float = param(0.0001, ge=0, le=1)
    sigma: float = param(0.002, gt=0)  # initial covariance sigma * I of every class (imagenet_r.yaml:4)
    eta: float = param(0.3, ge=0)  # the fusion weight's ceiling (imagenet_r.yaml:5)
    # fusion weight = min(rho * mean(counts) / k, eta), k kept views (imagenet_r.yaml:6)
    rho: float = param(0.0025, ge=0)
    # every initial class mean is this constant vector (dota.py:158, `tensor_matrix`)
    mu_init: float = param(0.001, ge=-1, le=1)   # a coordinate of a unit-norm feature
    count_init: float = param(1.0, gt=0)  # initial soft count of every class (dota.py:36)
    update_covariance: bool = True   # `streaming_update_Sigma` (dota.py:28, default True); False keeps sigma * I
    view_ratio: float = param(0.1, gt=0, le=1)  # share of views (lowest entropy) used; at least one (utils.py:107)
    # "ensemble": the dataset's templates, 80 on ImageNet-R (utils.py:44, clip_classifier)
    text_head: str = param("ensemble", choices=("ensemble", "zeroshot"))
    # the "ensemble" head's templates; None: CLIP's 80 (`--protocol paper` sets the dataset's, datasets/*.py)
    templates: tuple[str, ...] | None = None
    # None: the model's exp(logit_scale); the authors' code multiplies by the literal 100 (utils.py:103)
    logit_scale: float | None = param(None, gt=0)


class DOTASpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    supports_pure_fp16 = True   # the authors' half model (`clip.load` on CUDA), as TDA's
    # a fusion weight that matters on a short stream
    test_config = {"text_head": "zeroshot", "rho": 1.0}
