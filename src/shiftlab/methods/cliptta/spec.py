"""CLIPTTA (Lafon, Ramzi, Rambour, Audebert & Thome, NeurIPS 2025, "CLIPTTA: Robust Contrastive Vision-Language
Test-Time Adaptation") and its OOD-aware variant.

Sources are cited as
`file:line` of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, SCORES, NormTTAConfig

# the batch's contrastive targets: "soft", each image's own softmax over the batch's pseudo-captions (its entropy,
# --use_softmax_entropy, in every script); "hard", the identity (CLIP's pre-training loss, the class's default)
TARGETS = ("soft", "hard")
# the Otsu losses of the OOD-aware variant (abstract_model.py:563-573)
OOD_LOSSES = ("max_inter_var", "min_intra_var", "avg_contrastive")


@dataclass
class CLIPTTAConfig(NormTTAConfig):
    """CLIPTTA's class (`methods/cliptta_otsu.py`, `--adaptation cliptta`) with its scripts' settings
    (`scripts/closed_set/cifar100/cliptta.sh`; the shared fields in `common/norm_config.py`)."""
    steps: int = param(10, ge=1)                            # --steps 10 (every cliptta.sh)
    lr: float = param(1e-4, gt=0)                           # --lr 1e-4 (closed_set/*/cliptta.sh)
    targets: str = param("soft", choices=TARGETS)           # --use_softmax_entropy (every cliptta.sh)
    tta_weight: float = param(1.0, ge=0)                    # --beta_tta 1.0 (cliptta.sh; configuration.py:185)
    # weight of the batch's mean-prediction entropy, subtracted (--beta_reg 1.0 in cliptta.sh; 0.1 configuration.py:186)
    mean_entropy_weight: float = param(1.0, ge=0)
    # the class-wise confident memory (CCM, memory/ccm.py): the num_shots most confident images per pseudo-label,
    # of which sample_size are re-encoded and added to the loss at every step (--use_memory, --num_shots 16,
    # --sample_size 128 in closed_set/cifar100/cliptta.sh; 64 in the ImageNet scripts)
    memory: bool = True
    num_shots: int = param(16, ge=1)
    sample_size: int = param(128, ge=1)
    # the confidence the memory ranks by (--id_score_type max_prob, cliptta.sh)
    memory_score: str = param("max_prob", choices=SCORES)
    # OOD-aware (their open-set scripts: --use_ood_loss --detect_ood --update_alpha): an Otsu threshold alpha on the
    # OOD score, initialised on each batch, learnt with the loss `ood_loss`; only images above it adapt
    ood_aware: bool = False
    ood_loss: str = param("avg_contrastive", choices=OOD_LOSSES)     # --loss_ood_type avg_contrastive (open_set)
    ood_weight: float = param(1.0, ge=0)                    # --beta_ood 1.0 (open_set/*/cliptta.sh)
    gamma: float = param(0.005, gt=0)                       # the soft threshold's temperature (configuration.py:250)
    # the OOD score recorded (and thresholded): --score_type, max_prob by default (configuration.py:145-147)
    score: str = param("max_prob", choices=SCORES)
    ood_logit_scale: float = param(1.0, gt=0)               # the score's logit scale (configuration.py:175)
    # the seed of the memory's random draws when a class holds more than sample_size / C images (their
    # torch.randperm on the global generator, memory/ccm.py:87; here a generator of the method's own, in its state)
    memory_seed: int = param(0, ge=0)


@dataclass
class CLIPTTAOODConfig(CLIPTTAConfig):
    """The OOD-aware variant as the open-set scripts run it (`scripts/open_set/cifar100/cliptta.sh`)."""
    ood_aware: bool = True
    score: str = param("max_log_prob", choices=SCORES)     # --score_type max_log_prob (open_set/*/cliptta.sh)


# their figures assume CLIP's logit scale 100 (configuration.py:174) whatever the model
_PAPER = {"logit_scale": 100.0}


class CLIPTTASpec(MethodSpec):
    # the image tower's normalisation layers adapt on whole batches, the state (and the memory) carried along
    capabilities = NORM_TTA
    # their get_scores (abstract_model.py:517-538) of the adapted tower's cosines at --ood_logit_scale 1, `score`
    # (max_prob by default), the score their open-set evaluation reports AUROC/FPR95 with
    own_ood_score = "CLIPTTA's score (`score`: max_prob at logit scale 1; ttavlm/methods/abstract_model.py get_scores)"
    # the registry-wide tests: one step, a one-image memory sampled whole
    test_config = {"steps": 1, "num_shots": 1, "sample_size": 1}


class CLIPTTAOODSpec(CLIPTTASpec):
    """CLIPTTA's OOD-aware variant (OCE in the paper): its own OOD score, thresholded by Otsu on each batch, the
    threshold learnt with an ID/OOD separation loss, and only the images above it adapting."""
    name = "cliptta_ood"
    own_ood_score = ("CLIPTTA's OOD-aware score (`score`: max_log_prob at logit scale 1, thresholded by Otsu; "
                     "ttavlm/methods/abstract_model.py get_scores)")
    test_config = {"steps": 1, "num_shots": 1, "sample_size": 1}
