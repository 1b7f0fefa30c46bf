"""SoTTA (Gong, Kim, Lee, Chottananurak & Lee, NeurIPS 2023, "SoTTA: Robust Test-Time Adaptation on Noisy Data
Streams"), on CLIP as CLIPTTA's toolkit runs it.

Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.norm_config import SCORES, NormTTAConfig, ReturnedScoreSpec

# what the adaptation step's loss covers: "all", the mean entropy of every image in the memory; "first", the
# entropy of the memory's first image alone (their `_forward_and_adapt` hands the memory to get_features as a list
# of one-image views and keeps `logits[0]`, sotta.py:37-39)
MEMORY_LOSSES = ("all", "first")


@dataclass
class SoTTAConfig(NormTTAConfig):
    """CLIPTTA's SoTTA (`methods/sotta.py`, built by `methods/__init__.py:243-247`); no script of theirs runs it,
    so its settings are their argparse defaults (the shared fields in `common/norm_config.py`)."""
    capacity: int = param(64, ge=1)                          # --capacity 64 (configuration.py:263), HUS's size
    # an image enters the memory when its max_prob (at ood_logit_scale) is at least this (--high_threshold 0.5,
    # configuration.py:274; memory/hus.py:78). At their ood_logit_scale 1 a CLIP's cosines give a max_prob near
    # 1 / C, so with their defaults no image ever enters and SoTTA never adapts (README.md)
    confidence_threshold: float = param(0.5, ge=0, le=1)
    # SAM's two-step update (--use_sam, off by default: configuration.py:176; abstract_model.py:662-679) at SAM's
    # default radius (rho 0.05, optimizers/sam.py:21; their setup_optimizer passes none)
    sam: bool = False
    rho: float = param(0.05, ge=0)
    memory_loss: str = param("all", choices=MEMORY_LOSSES)
    # the seed of the memory's replacements (their Python `random.choice` / `randrange` on the global generator,
    # memory/hus.py:106-120; here a generator of the method's own, in its state)
    memory_seed: int = param(0, ge=0)
    # the OOD score recorded with each image after the batch: --score_type, max_prob (configuration.py:145-147)
    # at --ood_logit_scale 1.0 (configuration.py:175), of the adapted tower's cosines (sotta.py:83-87); the
    # memory's admission score is max_prob at the same scale whatever `score` (sotta.py:61)
    score: str = param("max_prob", choices=SCORES)
    ood_logit_scale: float = param(1.0, gt=0)


class SoTTASpec(ReturnedScoreSpec):
    # the registry-wide tests: their defaults but a memory of 4 admitting every image, so that it fills and evicts
    test_config = {"steps": 1, "ood_logit_scale": 100.0, "confidence_threshold": 0.0, "capacity": 4}
