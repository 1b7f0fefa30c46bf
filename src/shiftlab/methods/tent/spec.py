"""TENT (Wang, Shelhamer, Liu, Olshausen & Darrell, ICLR 2021, "Tent: Fully Test-Time Adaptation by Entropy
Minimization"), on CLIP as CLIPTTA's toolkit runs it.

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.declarations import ONLINE, OWN_TOWER, Capabilities, MethodSpec
from ..common.norm_config import NormTTAConfig

CLIPTTA = "MarcLafon/cliptta@f4221f4f2b3bfbd220f8836411bbd3774758933d"
TENT = "DequanWang/tent@e9e926a668d85244c66a6d5c006efbd2b82e83e8"


@dataclass
class TentConfig(NormTTAConfig):
    """CLIPTTA's TENT (`ttavlm/methods/tent.py`) with its scripts' settings
    (`ttavlm/scripts/closed_set/imagenet/tent.sh`); the shared fields in `common/norm_config.py`."""
    steps: int = param(10, ge=1)                     # --steps 10 (tent.sh:10)
    # weight of the batch's mean-prediction entropy, subtracted from the loss (their beta_reg: --beta_reg 0.0 in
    # tent.sh:9, 0.1 in configuration.py:186); TENT's own loss has none
    mean_entropy_weight: float = param(0.0, ge=0)
    # the batch's logits after the last update (CLIPTTA's tent.py:59-62); False: those of the last step's forward,
    # before its update, as DequanWang/tent's forward_and_adapt returns them (tent.py:48-58)
    predict_after_update: bool = True


class TentSpec(MethodSpec):
    name = "tent"
    bibtex = r"""@inproceedings{wang2021tent,
  title = {Tent: Fully Test-Time Adaptation by Entropy Minimization},
  author = {Wang, Dequan and Shelhamer, Evan and Liu, Shaoteng and Olshausen, Bruno and Darrell, Trevor},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2021}
}"""
    impl = "shiftlab.methods.tent.method:Tent"
    # the image tower's normalisation layers adapt on whole batches, the state carried from batch to batch
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)
    adaptive = Adaptive(("state",),
                        "its batch attacked jointly through the image tower with the norm parameters it holds"
                        " when the batch arrives (batch statistics, state); the batch then adapts as a clean one"
                        " would",
                        impl="shiftlab.methods.common.adaptive_norm:norm_state_logits")
    config_class = TentConfig
    summary = "TENT: the image tower's norm affine parameters, Adam steps on the batch's mean entropy (continual)"
    label = "TENT"
    family = "classic"     # one of the classic batch TTA methods on CLIP (facts.FAMILIES)
    # DequanWang/tent cfgs/tent.yaml (its only released setting, CIFAR-10-C): Adam lr 1e-3 (betas 0.9/0.999,
    # PyTorch's eps 1e-8, conf.py:_C.OPTIM), 1 step per batch of 200 (`--batch-size 200` here), continual, the
    # outputs of the forward before the update (tent.py:48-58); the CLIP recipe's (the defaults): CLIPTTA's,
    # batches of 128 (configuration.py:86)
    protocols = {"paper": {"steps": 1, "adam_eps": 1e-8, "predict_after_update": False}}
    # neither repository's README gives a CLIP number (CLIPTTA's tables are in its paper only)
    published = ()
    fidelity = ("golden (CLIPTTA's Tent on the tiny ViT: 3 batches of 8, continual, and episodic; every batch's "
                "logits and norm parameters)")
    # a small config for the registry-wide tests: one step
    test_config = {"steps": 1}
