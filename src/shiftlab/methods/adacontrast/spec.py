"""AdaContrast (Chen, Wang, Darrell & Ebrahimi, CVPR 2022, "Contrastive Test-Time Adaptation"), on CLIP as
CLIPTTA's toolkit runs it.

Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`); AdaContrast's own code (DianCh/AdaContrast at c3c8b88) as
`DianCh ...`."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.norm_config import SCORES, NormTTAConfig, ReturnedScoreSpec

# the strong augmentations their --aug_type offers (configuration.py:278; common/moco_augment.strong_view)
AUG_TYPES = ("moco-v2", "moco-v1")
# the neighbours' distance (adacontrast.py:190-207): euclidean (CLIPTTA's, its default argument) or 1 - cosine
# (DianCh configs/learn/target.yaml dist_type)
DISTANCES = ("euclidean", "cosine")
# the queue's initial features: "randn", standard normal entries (adacontrast.py:44); "unit", each column then
# normalised (DianCh moco/builder.py:50)
QUEUE_INITS = ("randn", "unit")


@dataclass
class AdaContrastConfig(NormTTAConfig):
    """CLIPTTA's AdaContrast (`methods/adacontrast.py`, built by `methods/__init__.py:249-258`); no script of theirs
    runs it, so its settings are their argparse defaults (the shared fields in `common/norm_config.py`)."""
    queue_size: int = param(16384, ge=1)                   # --queue_size 16384 (configuration.py:277)
    aug_type: str = param("moco-v2", choices=AUG_TYPES)    # --aug_type moco-v2 (configuration.py:278)
    beta_cls: float = param(1.0, ge=0)                     # --beta_tta 1.0 (configuration.py:185): pseudo-label CE
    beta_ins: float = param(0.1, ge=0)                     # --beta_ins 0.1 (configuration.py:279): instance loss
    beta_div: float = param(0.1, ge=0)                     # --beta_reg 0.1 (configuration.py:186): diversity
    n_neighbors: int = param(3, ge=1)                      # --n_neighbors 3 (configuration.py:280)
    temperature: float = param(0.07, gt=0)                 # --T_moco 0.07 (configuration.py:282)
    # the key encoder's momentum: --m 0.999 (configuration.py:281), applied only with key_momentum: their
    # `_momentum_update_key_encoder` is never called (adacontrast.py:143-152), so their keys come from the
    # initial tower
    m: float = param(0.999, ge=0, le=1)
    key_momentum: bool = False
    distance: str = param("euclidean", choices=DISTANCES)
    queue_init: str = param("randn", choices=QUEUE_INITS)
    # the scale of the cosines the losses, pseudo-labels and neighbour probabilities read: their get_logits returns
    # the cosines unscaled and adacontrast.py never multiplies by --logit_scale (adacontrast.py:59-81)
    loss_logit_scale: float = param(1.0, gt=0)
    # ImageNet's normalisation applied on top of CLIP's as each augmentation's last step (moco_transforms.py:53-56)
    renormalize: bool = True
    # the seed of the queue's initial draw and of each batch's augmentations (theirs: torch's global generator)
    seed: int = param(0, ge=0)
    # the recorded OOD score: --score_type max_prob (configuration.py:145-147) at --ood_logit_scale 1.0
    # (configuration.py:175) of the adapted tower's cosines (adacontrast.py:121-125)
    score: str = param("max_prob", choices=SCORES)
    ood_logit_scale: float = param(1.0, gt=0)


class AdaContrastSpec(ReturnedScoreSpec):
    # the registry-wide tests: a small queue
    test_config = {"queue_size": 16}
