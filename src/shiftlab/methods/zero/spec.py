"""ZERO (Farina et al. 2025, "Frustratingly Easy Test-Time Adaptation of VLMs"), training-free.

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.declarations import (
    EPISODIC,
    FROZEN_FEATURES,
    Capabilities,
    MethodSpec,
    ViewMethodConfig,
)

VOTE_RULES = ("soft", "authors")


@dataclass
class ZeroConfig(ViewMethodConfig):
    keep_ratio: float = param(0.3, gt=0, le=1)   # share of views (lowest entropy) that vote; at least one
    # "soft": ties in votes go to the higher mean kept probability (shiftlab's choice: scores are
    # probabilities, top-5 is ordered). "authors": FarinaMatteo/zero's decision, their entropy
    # arithmetic and greedy tie-break included (`zero_vote_authors`).
    vote_rule: str = param("soft", choices=VOTE_RULES)


class ZeroSpec(MethodSpec):
    name = "zero"
    # its paper, as `shiftlab methods --bibtex` prints it (the authors' own BibTeX where their README has one)
    bibtex = r"""@inproceedings{farina2024zero,
  title = {Frustratingly Easy Test-Time Adaptation of Vision-Language Models},
  author = {Farina, Matteo and Franchi, Gianni and Iacca, Giovanni and Mancini, Massimiliano and Ricci, Elisa},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2024}
}"""
    impl = "shiftlab.methods.zero.method:Zero"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("bpda", "eot"),
                        "bpda: the zero-temperature vote of the confident views replaced by their mean"
                        " probability on the backward pass; random crops drawn afresh (eot)")
    config_class = ZeroConfig
    summary = "ZERO: majority vote (zero temperature) of the 30% lowest-entropy views; confidence = vote share"
    label = "ZERO"
    protocols = {"paper": {"precision": "fp16"}}   # FarinaMatteo/zero: the zero-shot forward under fp16 autocast
    # its ViT-B/16 tables are suite rows (data/published_suites.json); no RN50 number
    published = ()
    fidelity = "golden (`vote_rule=authors`; 64 and 8 views)"
