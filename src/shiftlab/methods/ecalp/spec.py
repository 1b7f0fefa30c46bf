"""ECALP (Li et al., ICLR 2025, "Efficient and Context-Aware Label Propagation for Zero-/Few-Shot"""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodConfig, MethodSpec


@dataclass
class ECALPConfig(MethodConfig):
    """ECALP's zero-shot defaults, from github.com/Yushu-Li/ECALP (commit 96ddf0b): `main.py`'s
    argparse k_text 3 (line 108), k_image 8 (109), gamma 10.0 (111), alpha 1.0 (112), num_iterations
    3 (113), used for every dataset; `utils/iterative_label_propagation.py`: the carried pseudo-label
    (each test node's top score / 5, line 396) and the output softmax(10000 * scores) (399).
    Their code reads pre-extracted features, one per image (DMN's extraction, README): here view 0's.
    """
    k_text: int = param(3, ge=1)             # text neighbours of each test node
    k_image: int = param(8, ge=1)            # image neighbours of each test node
    gamma: float = param(10.0, gt=0)         # edge weight = similarity ** gamma
    alpha: float = param(1.0, ge=0, le=1)          # Y_t = alpha W Y + (1 - alpha) Y_0
    iterations: int = param(3, ge=1)         # propagation steps per sample
    carry_divisor: float = param(5.0, gt=0)  # a test node's carried label: its top score / carry_divisor, at its class
    logit_scale: float = param(10000.0, gt=0)
    # "ensemble": CLIP's 80 templates; "zeroshot": "a photo of a {}."
    text_head: str = param("ensemble", choices=("ensemble", "zeroshot"))
    # equal similarities in a neighbour list: "stable" keeps the lower node first; "topk" leaves the
    # order to torch.topk as the authors' code does (it matters: the sample and its duplicate always tie)
    ties: str = param("stable", choices=("stable", "topk"))


class ECALPSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    # neighbours exist on a short stream
    test_config = {"k_image": 3}
