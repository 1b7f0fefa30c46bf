"""The reference methods (training-free): CLIP zero-shot, the 80-template prompt ensemble, the view ensemble.

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.cards import C_TPT_TABLE, R_TPT_TABLE, TPT_README
from ..catalogue.declarations import (
    EPISODIC,
    FROZEN_FEATURES,
    Capabilities,
    MethodSpec,
    ViewMethodConfig,
)

# the papers these reference methods cite (`shiftlab methods --bibtex`)
CLIP_BIBTEX = r"""@inproceedings{radford2021clip,
  title = {Learning Transferable Visual Models From Natural Language Supervision},
  author = {Radford, Alec and Kim, Jong Wook and Hallacy, Chris and Ramesh, Aditya and Goh, Gabriel and Agarwal,
      Sandhini and Sastry, Girish and Askell, Amanda and Mishkin, Pamela and Clark, Jack and Krueger, Gretchen
      and Sutskever, Ilya},
  booktitle = {Proceedings of the 38th International Conference on Machine Learning (ICML)},
  pages = {8748--8763},
  year = {2021}
}"""
R_TPT_BIBTEX = r"""@inproceedings{sheng2025rtpt,
  title = {R-TPT: Improving Adversarial Robustness of Vision-Language Models through Test-Time Prompt Tuning},
  author = {Sheng, Lijun and Liang, Jian and Wang, Zilei and He, Ran},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year = {2025}
}"""


@dataclass
class ViewEnsembleConfig(ViewMethodConfig):
    average: str = param("probs", choices=("probs", "logits"))  # mean of softmax over views, or of logits


class ZeroShotSpec(MethodSpec):
    name = "zeroshot"
    bibtex = CLIP_BIBTEX   # its paper, as `shiftlab methods --bibtex` prints it
    impl = "shiftlab.methods.zeroshot.method:ZeroShot"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full",),
                        "the image tower and the zero-shot head on view 0 (nothing adapts)",
                        impl="shiftlab.methods.zeroshot.adaptive:zeroshot_logits")
    summary = "CLIP zero-shot, 'a photo of a {name}.', view 0"
    label = "CLIP zero-shot"
    aliases = ("clip", "clip zero-shot", "zs")
    protocols = {}     # no code of its own: `paper` runs it as `leaderboard`
    published = (
        dict(dataset="imagenet-r", backbone="RN50", protocol="leaderboard", metric="top1", value=56.1,
             source=R_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=56.15, source=TPT_README),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=56.0, source=C_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="ece20", value=2.07, source=C_TPT_TABLE),
    )
    fidelity = "golden"


class PromptEnsembleSpec(MethodSpec):
    name = "prompt_ensemble"
    bibtex = CLIP_BIBTEX   # its paper, as `shiftlab methods --bibtex` prints it
    impl = "shiftlab.methods.zeroshot.method:PromptEnsemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full",),
                        "the image tower and the 80-template head on view 0 (nothing adapts)",
                        impl="shiftlab.methods.zeroshot.adaptive:prompt_ensemble_logits")
    summary = "CLIP's 80-template prompt ensemble, view 0"
    text_head = "ensemble"
    label = "Prompt ensemble (80 templates)"
    aliases = ("ensemble80",)
    protocols = {}     # as `leaderboard`
    published = (
        # the README's "Ensembled prompt" row
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=60.72, source=TPT_README),
    )
    fidelity = "head golden (TDA's text features)"


class ViewEnsembleSpec(MethodSpec):
    name = "view_ensemble"
    # CLIP, and the R-TPT paper, whose table holds this 'Ensemble' row (its text as tpt/spec.py's rtpt: one key)
    bibtex = CLIP_BIBTEX + "\n" + R_TPT_BIBTEX
    impl = "shiftlab.methods.zeroshot.method:ViewEnsemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "eot"),
                        "the view-averaged zero-shot prediction, its random crops drawn afresh (eot)",
                        impl="shiftlab.methods.zeroshot.adaptive:view_ensemble_logits")
    config_class = ViewEnsembleConfig
    summary = "zero-shot over all views, equal-weight average of probabilities (or logits)"
    label = "Ensemble (64 views)"
    aliases = ("ensemble",)
    protocols = {}     # as `leaderboard`
    published = (
        # the R-TPT table's "Ensemble" row (its 60.72 beside it is the prompt ensemble's, a method of its own)
        dict(dataset="imagenet-r", backbone="RN50", protocol="leaderboard", metric="top1", value=51.3,
             source=R_TPT_TABLE),
    )
    # the R-TPT paper's Ensemble ships no code (TomSheng21/R-TPT's rtpt.py has no such mode): the view logits are
    # checked against TPT's CLIP, their mean against a float64 computation (tests/methods/test_mta.py)
    fidelity = "golden view logits (TPT's CLIP); the R-TPT paper's Ensemble row ships no code of its own"
