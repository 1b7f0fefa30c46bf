"""OSTTA (Lee, Das, Choo & Choi, ICCV 2023, "Towards Open-Set Test-Time Adaptation Utilizing the Wisdom of Crowds
in Entropy Minimization"), on CLIP as CLIPTTA's toolkit runs it.

Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.norm_config import SCORES, NormTTAConfig, ReturnedScoreSpec


@dataclass
class OSTTAConfig(NormTTAConfig):
    """CLIPTTA's OSTTA (`methods/ostta.py`, built by `methods/__init__.py:175-179`); no script of theirs runs it,
    so its settings are their argparse defaults (the shared fields in `common/norm_config.py`)."""
    # an image adapts when the adapted model's probability of the source model's prediction exceeds the source's
    # by at least this (--margin_ostta 0.4, configuration.py:271; the class's own default 0.05, ostta.py:21)
    margin: float = param(0.4, ge=-1, le=1)
    tta_weight: float = param(1.0, ge=0)             # --beta_tta 1.0 (configuration.py:185)
    # weight of the batch's mean-prediction entropy, subtracted (--beta_reg 0.1, configuration.py:186)
    mean_entropy_weight: float = param(0.1, ge=0)
    # the OOD score recorded with each image after the batch: --score_type, max_prob (configuration.py:145-147)
    # at --ood_logit_scale 1.0 (configuration.py:175), of the adapted tower's cosines (ostta.py:66-70)
    score: str = param("max_prob", choices=SCORES)
    ood_logit_scale: float = param(1.0, gt=0)


class OSTTASpec(ReturnedScoreSpec):
    # the registry-wide tests: their defaults (one step)
    test_config = {"steps": 1}
