"""CLIPArTT (Hakim, Osowiechi, Noori, Cheraghalikhani, Bahri, Pedersoli, Ben Ayed & Desrosiers, WACV 2025,
"CLIPArTT: Adaptation of CLIP to New Domains at Test Time").

Sources are cited as
`file:line` of github.com/dosowiechi/CLIPArTT at 6f439ba; CLIPTTA's toolkit's version
(github.com/MarcLafon/cliptta, `ttavlm/methods/clipartt.py` at f4221f4) where it differs, in README.md."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, MethodSpec
from ..common.norm_config import NormTTAConfig

# their target_method 1..4 (models/tent.py:96-111): the softmax of the mean of the image-image and caption-caption
# similarities, of the image one alone, of the caption one alone (each halved), or the identity
TARGETS = ("both", "image", "text", "identity")


@dataclass
class CLIPArTTConfig(NormTTAConfig):
    """CLIPArTT's defaults (`adapt.py`, `configuration.py`, `models/tent.py`); the shared fields in
    `common/norm_config.py`."""
    steps: int = param(10, ge=1)                 # --niter 10 (configuration.py:44)
    lr: float = param(1e-3, gt=0)                # setup_optimizer: Adam lr 1e-3 (adapt.py:41-44)
    adam_eps: float = param(1e-8, gt=0)          # PyTorch's default (adapt.py:41: no eps given)
    # tent.Tent(..., episodic=True) (adapt.py:32): reset before every batch; the method is declared episodic, so
    # False (continual, as CLIPTTA's toolkit runs it) is refused
    episodic: bool = True
    top_k: int = param(3, ge=1)                  # --K 3 (configuration.py:35): classes named in a caption
    temperature: float = param(0.01, gt=0)       # softmax(similarity / 0.01) (models/tent.py:98)
    targets: str = param("both", choices=TARGETS)    # --target-method 1 (configuration.py:37)
    # their loss is cross_entropy(logits.t(), targets.t()) (models/tent.py:112): image i's target over the captions
    # is column i of the row-softmaxed similarity; False: row i (CLIPTTA's toolkit, clipartt.py:70)
    transposed_targets: bool = True
    # the gradient also flows through the targets (they depend on the image features: models/tent.py:97); True:
    # targets.detach() as CLIPTTA's toolkit (clipartt.py:70)
    detach_targets: bool = False
    # the captions and the class head: "a photo of a {c}" (adapt.py:81) and "a photo of a X or Y or Z"
    # (models/tent.py:58-64, getprompt)
    template: str = "a photo of a {}"


class CLIPArTTSpec(MethodSpec):
    # the image tower's normalisation layers adapt on whole batches, reset before every batch
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC, batches=True)
    test_config = {"steps": 1, "top_k": 2}
