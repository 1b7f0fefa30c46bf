"""OSTTA (Lee, Das, Choo & Choi, ICCV 2023, "Towards Open-Set Test-Time Adaptation Utilizing the Wisdom of Crowds
in Entropy Minimization"), on CLIP as CLIPTTA's toolkit runs it.

Its spec: config, capabilities and facts, without torch (the code: method.py). Sources are cited as `file:line`
of github.com/MarcLafon/cliptta at f4221f4 (`ttavlm/`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.declarations import ONLINE, OWN_TOWER, Capabilities, MethodSpec
from ..common.norm_config import SCORES, NormTTAConfig

CLIPTTA = "MarcLafon/cliptta@f4221f4f2b3bfbd220f8836411bbd3774758933d"


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


class OSTTASpec(MethodSpec):
    name = "ostta"
    bibtex = r"""@inproceedings{lee2023ostta,
  title = {Towards Open-Set Test-Time Adaptation Utilizing the Wisdom of Crowds in Entropy Minimization},
  author = {Lee, Jungsoo and Das, Debasmit and Choo, Jaegul and Choi, Sungha},
  booktitle = {Proceedings of the IEEE/CVF International Conference on Computer Vision (ICCV)},
  year = {2023}
}"""
    impl = "shiftlab.methods.ostta.method:OSTTA"
    # the image tower's normalisation layers adapt on whole batches, the state carried from batch to batch
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)
    adaptive = Adaptive(("state",),
                        "its batch attacked jointly through the image tower with the norm parameters it"
                        " holds when the batch arrives (batch statistics, state); the batch then adapts as a"
                        " clean one would",
                        impl="shiftlab.methods.common.adaptive_norm:norm_state_logits")
    config_class = OSTTAConfig
    summary = ("OSTTA: entropy minimisation on the images whose predicted class the adapted model is surer of "
               "than the source model (norm parameters, continual); records its own ood_score")
    label = "OSTTA"
    family = "classic"     # one of the classic batch TTA methods on CLIP (facts.FAMILIES)
    # their get_scores (abstract_model.py:517-538) of the adapted tower's cosines at --ood_logit_scale 1, `score`
    # (max_prob by default), returned with the batch's logits (ostta.py:66-70)
    own_ood_score = ("OSTTA's returned score (`score`: max_prob at logit scale 1; ttavlm/methods/abstract_model.py "
                     "get_scores)")
    # CLIPTTA's figures assume CLIP's logit scale 100 (configuration.py:174) whatever the model; batches of 128
    # (configuration.py:86), continual
    protocols = {"paper": {"logit_scale": 100.0}}
    # CLIPTTA's README has no table; OSTTA's own repository is not on CLIP
    published = ()
    fidelity = ("golden (CLIPTTA's OSTTA class on the tiny ViT: 3 continual batches of 8 with their defaults but "
                "3 steps, lr 3e-3, margin 0.01 and logit scale 10, and 3 episodic SGD batches at scale 100; every "
                "batch's logits, scores and norm parameters)")
    # the registry-wide tests: their defaults (one step)
    test_config = {"steps": 1}
