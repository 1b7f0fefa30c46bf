"""TTC (Xing, Zhao & Sebe, CVPR 2025, "CLIP is Strong Enough to Fight Back: Test-time Counterattacks towards
Zero-shot Adversarial Robustness of CLIP"), training-free.

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..specs import EPISODIC, OWN_TOWER, Capabilities, MethodConfig, MethodSpec

SOURCE = "Sxing2/CLIP-Test-time-Counterattacks"
COMMIT = "793fbff69cd7b63881e761e9a73a38e76b3ce5bf"
# get_text_prompts_val's default template (code/utils.py:264), the one their validate uses
THEIR_TEMPLATE = "This is a photo of a {}."


@dataclass
class TTCConfig(MethodConfig):
    """The counterattack of `tau_thres_weighted_counterattacks` (code/test_time_counterattack.py:68-159@793fbff),
    with the values of their run command (README.md "Run", TTC.sh:14-18, equal to the argparse defaults of
    test_time_counterattack.py:53-57). eps and step size are in [0, 1] pixel units (their flags are in 1/255,
    divided at lines 353-354)."""
    eps: float = param(4 / 255, ge=0, le=1)        # --ttc_eps 4: TTC.sh:15, test_time_counterattack.py:55
    step_size: float = param(1 / 255, ge=0, le=1)  # --ttc_stepsize 1: test_time_counterattack.py:57 (TTC.sh omits it)
    steps: int = param(2, ge=0, le=100)            # --ttc_numsteps 2: TTC.sh:18, test_time_counterattack.py:56
    # the tau-threshold test: a random start that moves the embedding by less than tau_thres of its norm marks
    # the image "falsely stable" (adversarial) and the counterattack steps are weighted in; else the random start
    tau_thres: float = param(0.2, ge=0)            # --tau_thres 0.2: TTC.sh:17, test_time_counterattack.py:53
    beta: float = param(2.0, ge=0)                 # --beta 2: TTC.sh:16, test_time_counterattack.py:54
    # the random start's seed: drawn per sample from (seed, sample id); their code draws from the global stream
    # after torch.manual_seed(--seed) (TTC.sh:14 --seed 1, test_time_counterattack.py:334-341)
    seed: int = param(1, ge=0)
    # None: the run's zero-shot head ("a photo of a {}."); their code: THEIR_TEMPLATE (`--protocol paper`)
    template: str | None = None


class TTCSpec(MethodSpec):
    name = "ttc"
    # its paper (the authors' BibTeX, README.md "Reference"; entry type in lower case)
    bibtex = r"""@inproceedings{Xing_2025_CVPR,
  author = {Xing, Songlong and Zhao, Zhengyu and Sebe, Nicu},
  title = {CLIP is Strong Enough to Fight Back: Test-time Counterattacks towards Zero-shot Adversarial Robustness
      of CLIP},
  booktitle = {Proceedings of the Computer Vision and Pattern Recognition Conference (CVPR)},
  month = {June},
  year = {2025},
  pages = {15172-15182}
}"""
    impl = "shiftlab.methods.ttc.method:TTC"
    # it perturbs view 0's pixels and runs the frozen tower on them (with gradient): no stored feature serves it
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC)
    adaptive = Adaptive(("bpda",),
                        "the counterattacked image through the image tower and the head; bpda: the counterattack"
                        " (its sign steps and tau test) as the identity on the backward pass, from the random start"
                        " the scoring draws (seed, sample id), so deterministic to the attacker",
                        impl="shiftlab.methods.ttc.adaptive:ttc_logits")
    config_class = TTCConfig
    summary = "TTC: counterattack view 0 (PGD away from its own embedding), weighted by a tau-threshold test"
    label = "TTC"
    # their validate: "This is a photo of a {}." (utils.py:264), fp16 autocast on CUDA (test_time_counterattack.py:210)
    protocols = {"paper": {"template": THEIR_TEMPLATE, "precision": "fp16"}}
    # their README has no table and their figures (figures/teaser.png, figures/fig2b.png) no numbers; the poster
    # (poster_CVPR_XING.png) is missing from the snapshot read
    published = ()
    fidelity = ("golden (their validate on the tiny ViT: the counterattack of clean and PGD-attacked images, "
                "both tau branches, and the four logits)")
    test_config = {"steps": 1}
