"""The torch-free half of the classic batch TTA methods on CLIP (TENT, EATA, SAR, ...): the config fields
and the capabilities (`NORM_TTA`) they share. Their torch half is `norm_adaptation.py` (docs/PROTOCOLS.md,
"Classic TTA on CLIP").

The defaults here are CLIPTTA's toolkit's (github.com/MarcLafon/cliptta, `ttavlm/configuration.py` and
`ttavlm/methods/abstract_model.py` at f4221f4), the CLIP version of these methods that issue #32 follows:
Adam, lr 1e-3, no weight decay, eps 1e-6 (abstract_model.py:665), one step per batch, continual (their
`--episodic` is off by default, configuration.py:210), logits at CLIP's scale 100 (configuration.py:174).
A method's spec subclasses `NormTTAConfig` and re-declares a field where its own code differs, citing it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...params import param
from ..catalogue.declarations import ONLINE, OWN_TOWER, Capabilities, MethodConfig, MethodSpec

# the OOD scores CLIPTTA's get_scores computes from one view (abstract_model.py:517-538): CLIPTTA's OOD variant,
# UniEnt and OSTTA record one as their own (`common/ood_scores.py`)
SCORES = ("max_prob", "max_log_prob", "max_logit", "logsumexp", "entropy")

# the optimisers their `setup_optimizer` builds (abstract_model.py:660-685)
OPTIMIZERS = ("sgd", "adam", "adamw")
# the class heads these methods read: "a photo of a {}." or CLIP's 80-template ensemble
TEXT_HEADS = ("zeroshot", "ensemble")
# which normalisation layers of the image tower are left out of the adaptation (`norm_adaptation.skips_top_layer`):
# "none", every one (CLIPTTA's default: --skip_top_layers off, configuration.py:177); "top", the top layers SAR
# leaves frozen on its backbones, by CLIPTTA's names (abstract_model.py:610-616: ResNet layer4, ViT blocks 9-11 and
# the final norm ln_post); "sar_names", SAR's own name tests (mr-eggplant/SAR sar.py:117-130) read literally, which
# on CLIP's towers keep ln_post (SAR's final norm is timm's `norm`)
TOP_LAYER_RULES = ("none", "top", "sar_names")
# what they read and carry: the image tower's normalisation layers adapt on whole batches, the state carried
# from batch to batch (a spec's `capabilities`)
NORM_TTA = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)


@dataclass
class NormTTAConfig(MethodConfig):
    """Fields every classic TTA method on CLIP shares (the adapted parameters are always the image tower's
    normalisation affine parameters: `norm_adaptation.NormTower`)."""
    steps: int = param(1, ge=1)                             # --steps default 1 (configuration.py:139)
    optimizer: str = param("adam", choices=OPTIMIZERS)      # --optimizer_type adam (configuration.py:141)
    lr: float = param(1e-3, gt=0)                           # --lr 1e-3 (configuration.py:140)
    momentum: float = param(0.9, ge=0, lt=1)                # --momentum 0.9 (configuration.py:142), SGD only
    weight_decay: float = param(0.0, ge=0)                  # --weight_decay 0.0 (configuration.py:143)
    adam_eps: float = param(1e-6, gt=0)                     # Adam(..., eps=1e-6) (abstract_model.py:665, 670)
    # reset the adapted parameters and the optimiser before every batch (their --episodic, off by default:
    # configuration.py:210, abstract_model.py:205); off: continual, the state carried from batch to batch
    episodic: bool = False
    # None: the model's own logit scale (100 for OpenAI CLIP); their code multiplies by --logit_scale 100
    # (configuration.py:174, tent.py:46) whatever the model
    logit_scale: float | None = param(None, gt=0)
    text_head: str = param("zeroshot", choices=TEXT_HEADS)  # their default template "A photo of a {}." on ImageNet


class ReturnedScoreSpec(MethodSpec):
    """The spec of a classic TTA method of CLIPTTA's toolkit that returns its `get_scores` (abstract_model.py:517-538)
    of the adapted tower's cosines with the batch's logits (OSTTA, SoTTA, STAMP, UniEnt, AdaContrast, RoTTA): its
    config's `score` (max_prob by default) at `ood_logit_scale` (1), recorded as its own OOD score, named after
    its label unless it declares `own_ood_score`."""
    capabilities = NORM_TTA

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name and "own_ood_score" not in cls.__dict__:
            cls.own_ood_score = (f"{cls.label or cls.name}'s returned score (`score`: max_prob at logit scale 1; "
                                 "ttavlm/methods/abstract_model.py get_scores)")
