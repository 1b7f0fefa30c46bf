"""WATT (Osowiechi, Noori, Hakim, Yazdanpanah, Bahri, Cheraghalikhani, Dastani, Beizaee, Ben Ayed & Desrosiers,
NeurIPS 2024, "WATT: Weight Average Test-Time Adaptation of CLIP").

Sources are cited as
`file:line` of github.com/Mehrdad-Noori/WATT at 40e3fae; CLIPTTA's toolkit's version in README.md."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, MethodSpec
from ..common.norm_config import NormTTAConfig

# templates.yaml: the eight templates of the paper
TEMPLATES = ("a photo of a {}", "itap of a {}", "a bad photo of the {}.", "a origami {}.", "a photo of the large {}.",
             "a {} in a video game.", "art of the {}.", "a photo of the small {}.")
# WATT-S: each template continues from the previous one's weights; WATT-P: each starts from the average (adapt/watt.py)
AVERAGING = ("sequential", "parallel")


@dataclass
class WATTConfig(NormTTAConfig):
    """WATT-S as their README runs it (`bash/watt_s/CIFAR/cifar100c.sh`, README.md "Step 4"); the shared fields in
    `common/norm_config.py`."""
    lr: float = param(1e-3, gt=0)                # LR=1e-3 (watt_s/*.sh; main.py:31's default 1e-4 for watt_p)
    adam_eps: float = param(1e-8, gt=0)          # optim.Adam(params, lr, betas=(0.9, 0.999)) (adapt/watt.py:55)
    # reset() before every batch (main.py:94; adapt/watt.py:72): the method is declared episodic (False refused)
    episodic: bool = True
    averaging: str = param("sequential", choices=AVERAGING)     # WATT_TYPE=sequential (watt_s/*.sh)
    steps_per_template: int = param(2, ge=1)     # WATT_L=2 (l: adapt/watt.py:22)
    repetitions: int = param(5, ge=1)            # WATT_M=5 (m: watt_s/*.sh; 50 in watt_p/*.sh)
    templates: tuple[str, ...] = TEMPLATES       # templates.yaml
    temperature: float = param(0.01, gt=0)       # softmax(similarity / 0.01) (adapt/watt.py:145)
    # the class head predicted with: the templates' average (ref_eval False, what main.py passes), or
    # "a photo of a {}" alone (their REFERENCE_TEMPLATE, ref_eval True)
    reference_head: bool = False


class WATTSpec(MethodSpec):
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC, batches=True)
    # one template: the registry-wide tests run one step per batch (the averaging: tests/methods/test_watt.py)
    test_config = {"steps_per_template": 1, "repetitions": 1, "templates": ("a photo of a {}",)}
