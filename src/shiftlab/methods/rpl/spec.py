"""RPL: robust pseudo-labelling (Rusak, Schneider, Pachitariu, Eck, Gehler, Bringmann, Brendel & Bethge, TMLR 2022,
"If your data distribution shifts, use self-learning"), on CLIP as mariodoebler/test-time-adaptation runs it.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/rpl.py`, `methods/base.py`,
`utils/losses.py`, `cfgs/imagenet_others/rpl.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, OPTIMIZERS, TOP_LAYER_RULES, NormTTAConfig


@dataclass
class RPLConfig(NormTTAConfig):
    """mariodoebler's RPL (`methods/rpl.py`) with its ImageNet config (`cfgs/imagenet_others/rpl.yaml`); the shared
    fields in `common/norm_config.py`."""
    optimizer: str = param("sgd", choices=OPTIMIZERS)       # OPTIM.METHOD SGD (rpl.yaml)
    lr: float = param(0.0005, gt=0)                         # OPTIM.LR 0.0005 (rpl.yaml)
    momentum: float = param(0.9, ge=0, lt=1)                # OPTIM.MOMENTUM 0.9 (conf.py:134)
    nesterov: bool = True                                   # OPTIM.NESTEROV True (conf.py:140, base.py:182-189)
    # their Adam / AdamW take torch's eps (base.py:170-179)
    adam_eps: float = param(1e-8, gt=0)
    # the generalised cross-entropy's q: (1 - p_y ** q) / q (RPL.Q 0.8, conf.py:260; losses.py:44-55)
    q: float = param(0.8, gt=0, le=1)
    # every BatchNorm, LayerNorm and GroupNorm adapts (rpl.py:44-58)
    skip_top_layers: str = param("none", choices=TOP_LAYER_RULES)
    # the batch's logits after the update; False (theirs): those of the forward that adapted (rpl.py:22-27, 41)
    predict_after_update: bool = False


class RPLSpec(MethodSpec):
    capabilities = NORM_TTA
    test_config = {"lr": 0.01}
