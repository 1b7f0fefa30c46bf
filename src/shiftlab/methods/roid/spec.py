"""ROID (Marsden, Döbler & Yang, WACV 2024, "Universal Test-time Adaptation through Weight Ensembling, Diversity
Weighting, and Prior Correction"), on CLIP as mariodoebler/test-time-adaptation runs it.

Its spec: config, capabilities and facts, without torch (the code: method.py). Sources are cited as `file:line` of
mariodoebler/test-time-adaptation at 8b2ed63 (`classification/`: `conf.py`, `methods/roid.py`, `methods/base.py`,
`utils/losses.py`, `utils/misc.py`, `cfgs/imagenet_others/roid.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..adaptive_modes import Adaptive
from ..common.roid_config import RoidConfig
from ..specs import ONLINE, OWN_TOWER, Capabilities, MethodSpec

TTA = "mariodoebler/test-time-adaptation@8b2ed63255d906b6b0afaefc6ae630b9ec4bdaa1"


@dataclass
class ROIDConfig(RoidConfig):
    """mariodoebler's ROID (`methods/roid.py`) with its ImageNet config (`cfgs/imagenet_others/roid.yaml`); the
    shared fields in `common/roid_config.py` and `common/norm_config.py`."""


class ROIDSpec(MethodSpec):
    name = "roid"
    bibtex = r"""@inproceedings{marsden2024universal,
  title = {Universal Test-time Adaptation through Weight Ensembling, Diversity Weighting, and Prior Correction},
  author = {Marsden, Robert A. and D{\"o}bler, Mario and Yang, Bin},
  booktitle = {IEEE/CVF Winter Conference on Applications of Computer Vision (WACV)},
  year = {2024}
}"""
    impl = "shiftlab.methods.roid.method:ROID"
    # the image tower's normalisation layers adapt on whole batches, the state carried from batch to batch
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)
    adaptive = Adaptive(("state",),
                        "its batch attacked jointly through the image tower with the norm parameters it holds when"
                        " the batch arrives (batch statistics, state) and the batch's prior correction; the batch"
                        " then adapts as a clean one would",
                        impl="shiftlab.methods.common.roid_training:roid_state_logits")
    config_class = ROIDConfig
    family = "classic"     # one of the classic batch TTA methods on CLIP (facts.FAMILIES)
    summary = ("ROID: certainty- and diversity-weighted soft likelihood ratio through the image tower's norm "
               "parameters, ensembled with the source weights, outputs prior-corrected (continual)")
    label = "ROID"
    # their code is the CLIP recipe and the method's own (the authors' repository)
    protocols = {"paper": {}}
    # no CLIP number in their README or tutorial_clip.md; benchmark.md's ImageNet-trained rows are in README.md
    published = ()
    fidelity = ("golden (mariodoebler's ROID on ZeroShotCLIP over the golden tiny ViT and tiny ResNet: 3 batches of 8, "
                "continual; logits, norm parameters, SGD's momentum and the running mean prediction after every "
                "batch; without the consistency loss, which shiftlab does not offer yet)")
    test_config = {"lr": 0.01}
