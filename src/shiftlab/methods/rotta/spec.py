"""RoTTA (Yuan, Xie & Li, CVPR 2023, "Robust Test-Time Adaptation in Dynamic Scenarios"), on CLIP as CLIPTTA's
toolkit runs it.

Its spec: config, capabilities and facts, without torch (the code: method.py). Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`); RoTTA's own code (BIT-DA/RoTTA at 67e34c9) as
`BIT-DA core/...`."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..common.norm_config import SCORES, NormTTAConfig
from ..specs import ONLINE, OWN_TOWER, Capabilities, MethodSpec

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


class RoTTASpec(MethodSpec):
    name = "rotta"
    bibtex = r"""@inproceedings{yuan2023rotta,
  title = {Robust Test-Time Adaptation in Dynamic Scenarios},
  author = {Yuan, Longhui and Xie, Binhui and Li, Shuang},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year = {2023}
}"""
    impl = "shiftlab.methods.rotta.method:RoTTA"
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)
    adaptive = Adaptive(("state",),
                        "its batch attacked jointly through the image tower with the norm parameters it"
                        " holds when the batch arrives (batch statistics, state); the batch then enters the"
                        " memory and adapts as a clean one would",
                        impl="shiftlab.methods.common.adaptive_norm:norm_state_logits")
    config_class = RoTTAConfig
    summary = ("RoTTA: a category-balanced memory (timeliness and uncertainty) trains the norm parameters "
               "against an EMA teacher, time-reweighted (continual); records its own ood_score")
    label = "RoTTA"
    family = "classic"     # one of the classic batch TTA methods on CLIP (facts.FAMILIES)
    own_ood_score = ("RoTTA's returned score (`score`: max_prob at logit scale 1; ttavlm/methods/abstract_model.py "
                     "get_scores)")
    # RoTTA's own code (BIT-DA/RoTTA): the teacher's softmax as target, updates counted per image, the teacher
    # predicting, at CLIP's logit scale (its classifiers' logits); batches of 64 (BIT-DA core/configs/defaults.py:72)
    protocols = {"paper": {"teacher_target": "softmax", "update_schedule": "instance", "output": "teacher",
                           "loss_logit_scale": 100.0, "logit_scale": 100.0}}
    # CLIPTTA's README has no table; RoTTA's README reports CIFAR-C with its own ResNets, not CLIP
    published = ()
    fidelity = ("golden (CLIPTTA's RoTTA class on the tiny ViT: 3 continual batches of 8, a memory of 6, "
                "update frequency 8 with 1 step and 12 with 2 steps; every batch's logits, scores, student and "
                "teacher norm parameters and the memory's images)")
    # the registry-wide tests: a memory of 4 trained after every batch of the tests' streams
    test_config = {"capacity": 4, "update_frequency": 2, "nu": 0.1}
