"""RoTTA (Yuan, Xie & Li, CVPR 2023, "Robust Test-Time Adaptation in Dynamic Scenarios"), on CLIP as CLIPTTA's
toolkit runs it.

Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`); RoTTA's own code (BIT-DA/RoTTA at 67e34c9) as
`BIT-DA core/...`."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.norm_config import SCORES, NormTTAConfig, ReturnedScoreSpec

# the student's soft target: "logits", the teacher's cosine logits themselves (CLIPTTA hands them to
# F.cross_entropy as class probabilities, rotta.py:92); "softmax", their softmax (BIT-DA core/adapter/rotta.py:60
# with base_adapter.softmax_entropy)
TEACHER_TARGETS = ("logits", "softmax")
# when the memory trains the student: "batch", after a whole batch has entered, when the images counted since the
# last update are a multiple of update_frequency (and the count restarts, rotta.py:65-67); "instance", after the
# image that makes the count a multiple (BIT-DA core/adapter/rotta.py:38-39)
UPDATE_SCHEDULES = ("batch", "instance")
# which tower predicts the batch: "student" (CLIPTTA, rotta.py:70-73) or "teacher" (BIT-DA returns the EMA
# model's output of the batch before the memory's updates, core/adapter/rotta.py:41)
OUTPUTS = ("student", "teacher")


@dataclass
class RoTTAConfig(NormTTAConfig):
    """CLIPTTA's RoTTA (`methods/rotta.py`, built by `methods/__init__.py:232-241`); no script of theirs runs it,
    so its settings are their argparse defaults (the shared fields in `common/norm_config.py`)."""
    capacity: int = param(64, ge=1)                        # --capacity 64 (configuration.py:263)
    update_frequency: int = param(64, ge=1)                # --update_frequency 64 (configuration.py:264)
    nu: float = param(0.001, ge=0, le=1)                   # --nu 0.001 (configuration.py:265), the EMA's weight
    lambda_t: float = param(1.0, ge=0)                     # --lambda_t 1.0 (configuration.py:266)
    lambda_u: float = param(1.0, ge=0)                     # --lambda_u 1.0 (configuration.py:267)
    # the scale of the cosines the teacher's pseudo-labels, entropies and the student's loss read: their
    # get_logits returns the cosines unscaled and rotta.py never multiplies by --logit_scale (rotta.py:55-59, 87-92)
    loss_logit_scale: float = param(1.0, gt=0)
    teacher_target: str = param("logits", choices=TEACHER_TARGETS)
    update_schedule: str = param("batch", choices=UPDATE_SCHEDULES)
    output: str = param("student", choices=OUTPUTS)
    # the recorded OOD score: --score_type max_prob (configuration.py:145-147) at --ood_logit_scale 1.0
    # (configuration.py:175) of the output's cosines (rotta.py:72-73)
    score: str = param("max_prob", choices=SCORES)
    ood_logit_scale: float = param(1.0, gt=0)


class RoTTASpec(ReturnedScoreSpec):
    # the registry-wide tests: a memory of 4 trained after every batch of the tests' streams
    test_config = {"capacity": 4, "update_frequency": 2, "nu": 0.1}
