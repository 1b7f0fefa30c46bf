"""BCA (CVPR 2025, "Bayesian Test-Time Adaptation for Vision-Language Models") as TTABC runs it
(walawalagoose/TTABC `ttabc/model_selection/bca.py`; the authors' repository, buerzlh/Bayesian-Test-Time-Adaptation-
for-Vision-Language-Models, could not be fetched here): training-free, online; class centres (the likelihood) and
a cluster-to-class matrix (the prior) updated from confident samples.

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..specs import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class BCAConfig(ViewMethodConfig):
    """TTABC's "bca" entry (ttabc/configs/algorithms.py@999b436: tpt True, batch_size 64 = the views)."""
    selection_ratio: float = param(0.1, gt=0, le=1)     # "bca" selection_p 0.1 (int(64 x 0.1) = 6 views)
    center_threshold: float = param(0.05, ge=0, le=1)   # "bca" threshold1: a class centre moves above it
    center_count: int = param(20000, ge=0)              # "bca" init_count1: each centre's initial weight
    prior_threshold: float = param(0.65, ge=0, le=1)    # "bca" threshold2: a class's prior row moves above it
    prior_count: int = param(1, ge=0)                   # "bca" init_count2: each prior row's initial weight


class BCASpec(MethodSpec):
    name = "bca"
    bibtex = r"""@inproceedings{zhou2025bca,
  title = {Bayesian Test-Time Adaptation for Vision-Language Models},
  author = {Zhou, Lihua and Ye, Mao and Li, Shuaifeng and Li, Nianxin and Zhu, Xiatian and Deng, Lei and Liu, Hongbin
      and Lei, Zhen},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year = {2025}
}"""
    impl = "shiftlab.methods.bca.method:BCA"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    adaptive = Adaptive(("bpda", "eot", "state"),
                        "attacked against the centres and prior it holds when the sample arrives (state); bpda: the"
                        " confident-view selection; random crops drawn afresh (eot); not written")
    config_class = BCAConfig
    summary = ("BCA: training-free; the confident views' mean feature against running class centres, times a "
               "running cluster-to-class prior, both updated from confident samples")
    label = "BCA"
    # TTABC's bca.py: the features under torch.amp.autocast('cuda')
    protocols = {"paper": {"precision": "fp16"}}
    published = ()      # TTABC's README points to an external spreadsheet; its repository holds no numbers
    fidelity = "golden (TTABC's bca.py as the code index stores it at 65eae15: 24-sample stream, 16 views)"
    # thresholds every sample passes on the tiny CLIP, and a light centre weight, so that the state moves
    test_config = {"center_threshold": 0.0, "prior_threshold": 0.0, "center_count": 2}
