"""DeYO (Lee, Jung, Lee, Park, Shin, Hwang & Yoon, ICLR 2024, "Entropy is not Enough for Test-Time Adaptation: From
the Perspective of Disentangled Factors"), on CLIP as mariodoebler/test-time-adaptation runs it.

Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/deyo.py`,
`cfgs/imagenet_others/deyo.yaml`) and of Jhyun17/DeYO at 3d7d289 (`config.py`, `main.py`, `methods/deyo.py`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, TOP_LAYER_RULES, NormTTAConfig

# how an image is disrupted to measure its pseudo-label's probability drop (PLPD): its patches shuffled, its pixels
# shuffled, or a square occluded by the image's mean colour (--aug_type, config.py:47; DEYO.AUG_TYPE, conf.py:240)
AUGMENTATIONS = ("patch", "pixel", "occ")


@dataclass
class DeYOConfig(NormTTAConfig):
    """mariodoebler's DeYO (`methods/deyo.py`) with its ImageNet configs (`cfgs/imagenet_others/deyo.yaml`, the
    ones `scripts/run_clip.sh` runs on CLIP); the shared fields in `common/norm_config.py`."""
    optimizer: str = param("sgd", choices=("sgd", "adam", "adamw"))    # OPTIM.METHOD SGD (deyo.yaml)
    lr: float = param(0.00025, gt=0)                        # OPTIM.LR 0.00025 (deyo.yaml)
    momentum: float = param(0.9, ge=0, lt=1)                # OPTIM.MOMENTUM 0.9 (conf.py:134)
    # Nesterov momentum: OPTIM.NESTEROV True (conf.py:140, base.py:setup_optimizer); DeYO's main.py:588 plain SGD
    nesterov: bool = True
    # images kept: entropy < entropy_margin x ln C (DEYO.MARGIN 0.5, conf.py:239, deyo.py:27; --deyo_margin 0.5,
    # config.py:52, times ln C in main.py:270)
    entropy_margin: float = param(0.5, gt=0)
    # the entropy weight's margin Ent_0: exp(-(H - weight_margin x ln C)) (EATA.MARGIN_E0 0.4, conf.py:225, deyo.py:
    # 28; --deyo_margin_e0 0.4, config.py:54, main.py:271)
    weight_margin: float = param(0.4, ge=0)
    # images kept: PLPD > plpd_threshold (DEYO.PLPD 0.2, conf.py:238; --plpd_threshold 0.2, config.py:55, and the
    # "wild" settings of exp_deyo.sh; its "mild" ResNet-50-BN run uses 0.3)
    plpd_threshold: float = param(0.2, ge=-1, lt=1)
    augmentation: str = param("patch", choices=AUGMENTATIONS)  # DEYO.AUG_TYPE "patch" (conf.py:240)
    # patches per row and column of the "patch" shuffle (DEYO.PATCH_LEN 4, conf.py:244; --patch_len 4, config.py:39)
    patch_len: int = param(4, ge=1)
    # the "occ" square, as fractions of the image side: their pixels 112, 56, 56 on 224 images (DEYO.OCCLUSION_SIZE,
    # ROW_START, COLUMN_START, conf.py:241-243), which this reproduces at 224 and scales on other sizes
    occlusion_size: float = param(0.5, gt=0, le=1)
    occlusion_row: float = param(0.25, ge=0, lt=1)
    occlusion_column: float = param(0.25, ge=0, lt=1)
    # the two filters and the two sample weights (DeYO's --filter_ent, --filter_plpd, --reweight_ent, --reweight_plpd,
    # config.py:59-62, its ablations; DEYO.REWEIGHT_ENT / REWEIGHT_PLPD True, conf.py:236-237)
    filter_entropy: bool = True
    filter_plpd: bool = True
    reweight_entropy: bool = True
    reweight_plpd: bool = True
    # the norms of the top layers left frozen (norm_config.TOP_LAYER_RULES): "sar_names", both codes' collect_params
    # (deyo.py:121-150; DeYO's deyo.py:196-207, SAR's name tests): a ResNet's layer4, ViT blocks 9-11, ln_post
    # adapted; "none": every normalisation layer adapts
    skip_top_layers: str = param("sar_names", choices=TOP_LAYER_RULES)
    # the batch's logits after the update; False (both codes): those of the forward that adapted
    predict_after_update: bool = False
    # the seed of the shuffles' generator, the method's own and part of its state (their torch.rand / randperm draw
    # from the global generator, deyo.py:64 and :70)
    shuffle_seed: int = param(0, ge=0)

    def __post_init__(self) -> None:
        """The square inside the image, checked once the fields are numbers in their own ranges (the config check
        refuses any other value in its own words)."""
        def number(value: object) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        for start in ("occlusion_row", "occlusion_column"):
            if number(getattr(self, start)) and number(self.occlusion_size) and 0 <= getattr(self, start) < 1 \
                    and 0 < self.occlusion_size <= 1 and getattr(self, start) + self.occlusion_size > 1:
                raise ValueError(f"deyo.{start} + deyo.occlusion_size: {getattr(self, start)} + {self.occlusion_size} "
                                 "puts the occluded square outside the image; their sum must be <= 1")


class DeYOSpec(MethodSpec):
    # the image tower's normalisation layers adapt on whole batches; the state (parameters, momentum, the shuffles'
    # generator) carried from batch to batch
    capabilities = NORM_TTA
    # one step; the tiny random CLIP's entropies are near ln C and its PLPDs near 0: both filters opened so that the
    # state moves
    test_config = {"steps": 1, "entropy_margin": 10.0, "plpd_threshold": -1.0}
