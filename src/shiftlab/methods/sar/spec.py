"""SAR (Niu, Wu, Zhang, Wen, Chen, Zhao & Tan, ICLR 2023, "Towards Stable Test-Time Adaptation in Dynamic Wild
World"), on CLIP as CLIPTTA's toolkit runs it."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, TOP_LAYER_RULES, NormTTAConfig


@dataclass
class SARConfig(NormTTAConfig):
    """CLIPTTA's SAR (`ttavlm/methods/sar.py`, built by `methods/__init__.py:169-174` with `--use_sam`, which its
    SAR needs: `abstract_model.py:662`); the shared fields in `common/norm_config.py`."""
    # reliable images: entropy < entropy_margin x ln(C) (--alpha_entropy 0.4, configuration.py:218, sar.py:30;
    # SAR's --sar_margin_e0 0.4 x ln 1000, main.py:107)
    entropy_margin: float = param(0.4, gt=0)
    rho: float = param(0.05, ge=0)                  # SAM's neighbourhood size (optimizers/sam.py:21; SAR's sam.py)
    adaptive: bool = False                          # ASAM's scaling (sam.py:22), off in both
    # model recovery: reset when the moving average of the second loss falls below this (the literal 0.2, sar.py:73;
    # SAR's sar.py:83; --reset_constant_em 0.2, configuration.py:222, is never read)
    recovery_threshold: float = param(0.2, ge=0)
    ema_momentum: float = param(0.9, ge=0, lt=1)    # 0.9 x ema + 0.1 x loss (sar.py:92; SAR's sar.py:15)
    # the recovery also forgets the moving average: SAR's reset (sar.py:57, ema = None); CLIPTTA's reset keeps it
    # (abstract_model.py:588-590), so once below the threshold it recovers after every later batch
    recovery_resets_ema: bool = False
    # the batch's logits after the update (CLIPTTA's sar.py:77-80); False: those of the first forward (SAR's)
    predict_after_update: bool = True
    # the norms of the top layers left frozen (norm_config.TOP_LAYER_RULES): "none", every norm adapts (CLIPTTA's
    # default, --skip_top_layers off: configuration.py:177, in none of their scripts); "top", SAR's choice (its
    # collect_params skips ResNet's layer4, ViT-B's blocks 9-11 and the final norm: sar.py:117-130) by CLIPTTA's
    # names for CLIP (abstract_model.py:610-616, ln_post the final norm); "sar_names", SAR's name tests read
    # literally on CLIP's tower (ln_post then adapts: SAR names the final norm `norm`, as timm does)
    skip_top_layers: str = param("none", choices=TOP_LAYER_RULES)


class SARSpec(MethodSpec):
    capabilities = NORM_TTA
    # one step; every image reliable (the tiny random CLIP's entropies are near ln C): the state moves
    test_config = {"steps": 1, "entropy_margin": 10.0}
