"""CoTTA: continual test-time domain adaptation (Wang, Fink, Van Gool & Dai, CVPR 2022), on CLIP as
mariodoebler/test-time-adaptation runs it.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/cotta.py`, `methods/base.py`,
`utils/misc.py`, `augmentations/transforms_cotta.py`, `cfgs/imagenet_others/cotta.yaml`) and of the method's own
repository, qinenergy/cotta at c212a20 (`imagenet/cotta.py`, `imagenet/imagenetc.py`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, TOP_LAYER_RULES
from ..common.sgd_nesterov_config import SGDNesterovConfig

# the consistency losses of cotta.py:131-138: "symmetric" (ImageNet: half each way), "teacher_ce" (CIFAR)
LOSSES = ("symmetric", "teacher_ce")


@dataclass
class CoTTAConfig(SGDNesterovConfig):
    """mariodoebler's CoTTA (`methods/cotta.py`) with its ImageNet config (`cfgs/imagenet_others/cotta.yaml`); the
    shared fields in `common/sgd_nesterov_config.py`."""
    lr: float = param(0.01, gt=0)                           # OPTIM.LR 0.01 (cotta.yaml)
    # the teacher's EMA momentum (M_TEACHER.MOMENTUM, conf.py:149; cotta.py:21, 82-88)
    teacher_momentum: float = param(0.999, ge=0, le=1)
    # each entry of each adapted weight restored to the source's with this probability after every step
    # (COTTA.RST 0.001, cotta.yaml; conf.py:167 says 0.01; cotta.py:92-98)
    restore_probability: float = param(0.001, ge=0, le=1)
    # the augmentation-averaged teacher prediction is used when the anchor's mean max probability is below this
    # (COTTA.AP 0.1, cotta.yaml; conf.py:170 says 0.92; cotta.py:47-58)
    confidence_threshold: float = param(0.1, ge=0, le=1)
    n_augmentations: int = param(32, ge=1)                  # TEST.N_AUGMENTATIONS 32 (conf.py:322; cotta.py:24)
    loss: str = param("symmetric", choices=LOSSES)          # ImageNet's, not CIFAR's (cotta.py:40, 131-138)
    # the augmentations' narrower ranges and noise (get_tta_transforms(img_size): soft False, std 0.005,
    # transforms_cotta.py:117)
    soft_augmentations: bool = False
    gaussian_std: float = param(0.005, ge=0)
    # the seed of the augmentations' and the restore's draws (their global torch generator; here one generator
    # per update, seeded from this and the update's index: common/ema_teacher.update_generator)
    augment_seed: int = param(0, ge=0)
    # every module's weight and bias of the image tower adapts (configure_model + collect_params, cotta.py:110-129)
    skip_top_layers: str = param("none", choices=TOP_LAYER_RULES)


class CoTTASpec(MethodSpec):
    # every weight and bias of the image tower adapts on whole batches, with its teacher carried from batch to batch
    capabilities = NORM_TTA
    test_config = {"n_augmentations": 2, "confidence_threshold": 1.0, "restore_probability": 0.05,
                   "teacher_momentum": 0.9}
