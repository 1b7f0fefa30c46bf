"""UniEnt (Gao, Zhang & Liu, CVPR 2024, "Unified Entropy Optimization for Open-Set Test-Time Adaptation"), on
CLIP as CLIPTTA's toolkit runs it.

Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.norm_config import SCORES, NormTTAConfig, ReturnedScoreSpec


@dataclass
class UniEntConfig(NormTTAConfig):
    """CLIPTTA's UniEnt (`methods/unient.py`, built by `methods/__init__.py:147-157`) with its open-set scripts'
    settings (`scripts/open_set/imagenet/unient.sh`); the shared fields in `common/norm_config.py`."""
    steps: int = param(10, ge=1)                     # --steps 10 (unient.sh:8)
    lr: float = param(1e-4, gt=0)                    # --lr 1e-4 (unient.sh:10)
    tta_weight: float = param(1.0, ge=0)             # --beta_tta 1.0 (unient.sh:11; configuration.py:185)
    # weight of the batch's mean-prediction entropy, subtracted (--beta_reg 1.0, unient.sh:12; 0.1 configuration.py:186)
    mean_entropy_weight: float = param(1.0, ge=0)
    # UniEnt's second term: the GMM's OOD-weighted entropy, maximised (--use_ood_loss, configuration.py:200; none
    # of their UniEnt scripts passes it, so off) with weight --beta_ood (0.1, configuration.py:187)
    ood_loss: bool = False
    ood_weight: float = param(0.1, ge=0)
    # the OOD score recorded with each image after the batch: --score_type, max_prob (configuration.py:145-147)
    # at --ood_logit_scale 1.0 (configuration.py:175), of the adapted tower's cosines (unient.py:147-151)
    score: str = param("max_prob", choices=SCORES)
    ood_logit_scale: float = param(1.0, gt=0)
    # the seed of the mixture's k-means start (their GaussianMixture draws from numpy's global generator, seeded
    # once by --seeds, 42 in unient.sh:9, and drawn from by everything before; here a generator of the method's
    # own, carried in its state from batch to batch and never reset by `episodic`, as numpy's is not)
    mixture_seed: int = param(0, ge=0)


class UniEntSpec(ReturnedScoreSpec):
    # the registry-wide tests: one step
    test_config = {"steps": 1}
