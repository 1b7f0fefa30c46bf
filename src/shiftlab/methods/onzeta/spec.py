"""OnZeta (Qian & Hu, ECCV 2024, "Online Zero-Shot Classification with CLIP")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodConfig, MethodSpec

# Tip-Adapter's 7 ImageNet templates in OnZeta's order (main_online.py:204-212, `imagenet_7_templates`)
ONZETA_TEMPLATES = ("itap of a {}.", "a origami {}.", "a bad photo of the {}.", "a photo of the large {}.",
                    "a {} in a video game.", "art of the {}.", "a photo of the small {}.")


OUTPUTS = ("onzeta", "onlab")


TEXT_HEADS = ("ensemble", "zeroshot")


@dataclass
class OnZetaConfig(MethodConfig):
    """OnZeta's defaults, from `main_online.py` in github.com/idstcv/OnZeta (commit befef06): the
    argparse defaults tau_t 0.01 (line 24), tau_i 0.04 (25), cw 0.5 (26), cr 20 (27), alpha 1 (28),
    beta 0.8 (29); the update rule of lines 258-273; the text head `zeroshot_classifier` over
    `imagenet_7_templates` (241, 204-212). The code covers ImageNet only (no per-dataset values).
    Their model is `clip.load` on CUDA, i.e. half precision (218-219), then `.float()` on the image
    features and the head (238, 242): `precision="fp16-pure"` under `--protocol paper`.
    """
    tau_t: float = param(0.01, gt=0)        # temperature of the text prediction
    tau_i: float = param(0.04, gt=0)        # temperature of the vision-proxy prediction
    cw: float = param(0.5, ge=0)            # proxy step size, cw / sqrt(t) at the t-th sample
    cr: float = param(20.0, ge=0)           # dual (rho) step size, cr / sqrt(t)
    alpha: float = param(1.0, gt=0)         # the class-marginal target is alpha / C per class
    beta: float = param(0.8, ge=0, le=1)          # final weight of the proxy prediction in the mix
    # n of the weight's ramp beta * sqrt(t / n): the authors know the test set's size in advance
    # (line 261); None (an online stream does not know its length): the weight is beta from the start
    stream_length: int | None = param(None, ge=1)
    # "onzeta": the mix (their acc_onzeta); "onlab": the text label alone (acc_onlab)
    output: str = param("onzeta", choices=OUTPUTS)
    # "ensemble": `head_templates` averaged (theirs); "zeroshot": "a photo of a {}."
    text_head: str = param("ensemble", choices=TEXT_HEADS)
    head_templates: tuple[str, ...] = ONZETA_TEMPLATES


class OnZetaSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    supports_pure_fp16 = True
    # the proxy's weight ramps over the tests' 24-sample stream
    test_config = {"stream_length": 24}
