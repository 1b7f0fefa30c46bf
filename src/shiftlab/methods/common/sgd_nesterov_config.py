"""The optimiser fields of the methods shiftlab runs as mariodoebler/test-time-adaptation runs them (CoTTA, RMT,
SANTA, ROID, CMF; `classification/` at 8b2ed63): `setup_optimizer` (methods/base.py:165-189) builds the optimiser
`cfg.OPTIM` names, and every ImageNet yaml of theirs these follow names SGD with momentum and Nesterov. Each
method's config subclasses `SGDNesterovConfig` and declares its own `lr` (its yaml's), citing it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from .norm_config import OPTIMIZERS, NormTTAConfig


@dataclass
class SGDNesterovConfig(NormTTAConfig):
    """`cfg.OPTIM` as their ImageNet yamls and conf.py set it (the fields every classic TTA method shares:
    `NormTTAConfig`)."""
    # OPTIM.METHOD SGD (cfgs/imagenet_others/cotta.yaml, rmt.yaml, santa.yaml, roid.yaml, cmf.yaml)
    optimizer: str = param("sgd", choices=OPTIMIZERS)
    momentum: float = param(0.9, ge=0, lt=1)                # OPTIM.MOMENTUM 0.9 (conf.py:134)
    adam_eps: float = param(1e-8, gt=0)                     # their Adam / AdamW take torch's eps (base.py:170-179)
    nesterov: bool = True                                   # OPTIM.NESTEROV True (conf.py:140, base.py:182-189)
