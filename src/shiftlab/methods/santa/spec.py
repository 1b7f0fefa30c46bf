"""SANTA: source anchoring and target alignment for continual test-time adaptation (Chakrabarty, Sreenivas & Biswas,
TMLR 2023), as mariodoebler/test-time-adaptation's `methods/santa.py` computes it, source-free, on CLIP.

Their code does not run on CLIP: `split_up_model` refuses CLIP's architecture names (ValueError, models/model.py:453-
515) after `get_source_loader` asked for the source data (santa.py:26-36, 56). shiftlab runs their computation with
CLIP's split (features: the image tower's unit features; classifier: the class head at the logit scale) and the
contrastive term to source prototypes off (README.md). Its spec: config, capabilities and facts, without torch (the
code: method.py). Sources are cited as `file:line` of mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`:
`conf.py`, `methods/santa.py`, `methods/base.py`, `utils/losses.py`, `cfgs/imagenet_others/santa.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, TOP_LAYER_RULES
from ..common.sgd_nesterov_config import SGDNesterovConfig


@dataclass
class SANTAConfig(SGDNesterovConfig):
    """mariodoebler's SANTA (`methods/santa.py`) with its ImageNet config (`cfgs/imagenet_others/santa.yaml`),
    source-free; the shared fields in `common/sgd_nesterov_config.py`."""
    lr: float = param(0.01, gt=0)                           # OPTIM.LR 0.01 (santa.yaml)
    # the self-training term's weight (SANTA.LAMBDA_CE_TRG 1.0, conf.py:191; santa.py:197-198)
    lambda_ce_trg: float = param(1.0, ge=0)
    # the contrastive loss to the source class prototypes (SANTA.LAMBDA_CONT 1.0, conf.py:192; santa.py:111-197):
    # needs source data, refused in one line
    source_contrastive: bool = False
    # the augmentation's narrower ranges and noise (get_tta_transforms(img_size): soft False, std 0.005)
    soft_augmentations: bool = False
    gaussian_std: float = param(0.005, ge=0)
    # the seed of the augmentation's draws (their global torch generator; here one generator per update, seeded
    # from this and the update's index: common/ema_teacher.update_generator)
    augment_seed: int = param(0, ge=0)
    # every BatchNorm, LayerNorm and GroupNorm adapts (configure_model, santa.py:218-237)
    skip_top_layers: str = param("none", choices=TOP_LAYER_RULES)


class SANTASpec(MethodSpec):
    capabilities = NORM_TTA
    test_config = {"lr": 0.01}
