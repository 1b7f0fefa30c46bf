"""TTC (Xing, Zhao & Sebe, CVPR 2025, "CLIP is Strong Enough to Fight Back: Test-time Counterattacks towards
Zero-shot Adversarial Robustness of CLIP"), training-free."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, MethodConfig, MethodSpec


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
    # None: the run's zero-shot head ("a photo of a {}."); their code's template: `--protocol paper` (its card)
    template: str | None = None


class TTCSpec(MethodSpec):
    # it perturbs view 0's pixels and runs the frozen tower on them (with gradient): no stored feature serves it
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC)
    test_config = {"steps": 1}
