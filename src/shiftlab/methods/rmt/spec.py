"""RMT: robust mean teacher for continual and gradual test-time adaptation (Döbler, Marsden & Yang, CVPR 2023), as
mariodoebler/test-time-adaptation's `methods/rmt.py` runs it, source-free, on CLIP.

Their code does not run on CLIP: `split_up_model` refuses CLIP's architecture names (ValueError, models/model.py:453-
515) after `get_source_loader` asked for the source (ImageNet training) data (rmt.py:27-36, 62). shiftlab runs their
computation with the split CLIP has (features: the image tower's unit features; classifier: the class head at the
logit scale) and the parts that need source data off (README.md). Its spec: config, capabilities and facts, without
torch (the code: method.py). Sources are cited as `file:line` of mariodoebler/test-time-adaptation at 8b2ed63
(`classification/`: `conf.py`, `methods/rmt.py`, `methods/base.py`, `utils/losses.py`,
`cfgs/imagenet_others/rmt.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, TOP_LAYER_RULES
from ..common.sgd_nesterov_config import SGDNesterovConfig


@dataclass
class RMTConfig(SGDNesterovConfig):
    """mariodoebler's RMT (`methods/rmt.py`) with its ImageNet config (`cfgs/imagenet_others/rmt.yaml`), source-free;
    the shared fields in `common/sgd_nesterov_config.py`."""
    lr: float = param(0.01, gt=0)                           # OPTIM.LR 0.01 (rmt.yaml)
    # the teacher's EMA momentum (M_TEACHER.MOMENTUM, conf.py:149; rmt.py:302-308)
    teacher_momentum: float = param(0.999, ge=0, le=1)
    # the self-training term's weight (RMT.LAMBDA_CE_TRG 1.0, conf.py:184; rmt.py:258-260)
    lambda_ce_trg: float = param(1.0, ge=0)
    # the parts that need source data, which a run does not have: their defaults (on) are refused in one line
    # cross-entropy on labelled source batches (RMT.LAMBDA_CE_SRC 1.0, conf.py:183; rmt.py:268-282)
    source_replay: bool = False
    # the contrastive loss to the source class prototypes (RMT.LAMBDA_CONT 1.0, conf.py:185; rmt.py:179-263)
    source_contrastive: bool = False
    # the mean-teacher warm-up on 50,000 source images (RMT.NUM_SAMPLES_WARM_UP, conf.py:186; rmt.py:112-170)
    source_warmup: bool = False
    # the augmentation's narrower ranges and noise (get_tta_transforms(img_size): soft False, std 0.005)
    soft_augmentations: bool = False
    gaussian_std: float = param(0.005, ge=0)
    # the seed of the augmentation's draws (their global torch generator; here one generator per update, seeded
    # from this and the update's index: common/ema_teacher.update_generator)
    augment_seed: int = param(0, ge=0)
    # every module's weight and bias of the image tower adapts (configure_model + collect_params, rmt.py:323-341)
    skip_top_layers: str = param("none", choices=TOP_LAYER_RULES)


class RMTSpec(MethodSpec):
    capabilities = NORM_TTA
    test_config = {"teacher_momentum": 0.9}
