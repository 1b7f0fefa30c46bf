"""STAMP (Yu, Sheng, He & Liang, ECCV 2024, "STAMP: Outlier-Aware Test-Time Adaptation with Stable Memory
Replay"), on CLIP as CLIPTTA's toolkit runs it.

Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.norm_config import SCORES, NormTTAConfig, ReturnedScoreSpec


@dataclass
class STAMPConfig(NormTTAConfig):
    """CLIPTTA's STAMP (`methods/stamp.py`, built by `methods/__init__.py:210-216`); no script of theirs runs it,
    so its settings are their argparse defaults (the shared fields in `common/norm_config.py`)."""
    memory_length: int = param(128, ge=1)                    # --memory_length 128 (configuration.py:260)
    # an image enters the memory when its entropy at logit_scale is below entropy_margin x ln(C)
    # (--alpha_stamp 0.45, configuration.py:259; stamp.py:83, 118)
    entropy_margin: float = param(0.45, gt=0)
    # and, when on, its prediction through the adapted tower equals the source tower's (--use_consistency_filtering,
    # off by default: configuration.py:258; stamp.py:89-101)
    consistency_filtering: bool = False
    # SAM's two-step update (--use_sam, off by default: configuration.py:176) at SAM's default radius (sam.py:21)
    sam: bool = False
    rho: float = param(0.05, ge=0)
    # the logit scale of the loss's entropies: their _forward_and_adapt weighs the memory's entropies of the raw
    # cosines (stamp.py:130-137), scale 1, where the admission entropy is at logit_scale (stamp.py:115)
    loss_logit_scale: float = param(1.0, gt=0)
    # the seed of the memory's evictions (their Python `random.choice` on the global generator, stamp.py:41; here a
    # generator of the method's own, in its state)
    memory_seed: int = param(0, ge=0)
    # the OOD score recorded with each image after the batch: --score_type, max_prob (configuration.py:145-147)
    # at --ood_logit_scale 1.0 (configuration.py:175), of the adapted tower's cosines (stamp.py:161-165)
    score: str = param("max_prob", choices=SCORES)
    ood_logit_scale: float = param(1.0, gt=0)


class STAMPSpec(ReturnedScoreSpec):
    # the registry-wide tests: their defaults but a small memory admitting every image (the tiny model's entropies
    # are near ln C)
    test_config = {"steps": 1, "memory_length": 4, "entropy_margin": 1.0}
