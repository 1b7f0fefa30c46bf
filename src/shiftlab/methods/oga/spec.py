"""OGA (Fuchs, Zanella & De Vleeschouwer, 2025, "Online Gaussian Adaptation of Vision-Language Models")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodConfig, MethodSpec

# OGA_core.py:5-8 sig_type: 'RidgeMoorePenrose' (the recommended one), 'Ridge', 'MoorePenrose'
ESTIMATORS = ("ridge-moore-penrose", "ridge", "moore-penrose")


@dataclass
class OGAConfig(MethodConfig):
    """OGA's defaults, from github.com/cfuchs2023/OGA at b91d449: `main.py`'s argparse (shot_capacity
    line 18, tau 31, sig_type 32, normalize_mu 33); the zero-shot logits `100 * features @ prototypes`
    and their entropy (`runner.py:138-146`); the 'standard' prompts, one template per dataset ("a photo
    of a {}." on ImageNet: `datasets/imagenet.py:188`), averaged and cast to float16
    (`utils.py:319, 377`). Their model is `clip.load` on CUDA (half precision): `--protocol paper`.
    """
    shot_capacity: int = param(8, ge=1)      # memory slots per class (main.py:18)
    tau: float = param(0.05, gt=0)           # temperature of the Gaussian log-likelihoods in the MAP (main.py:31)
    # the shared covariance's inverse (main.py:32, OGA_core.py:94-152): ridge (d (C^T C + tr I)^-1, empirical
    # Bayes) while n <= 4d samples are stored then the pseudo-inverse (the authors' recommendation), always
    # ridge, or always the pseudo-inverse
    estimator: str = param("ridge-moore-penrose", choices=ESTIMATORS)
    normalize_mu: bool = False               # renormalise the class means (main.py:33)
    # "zeroshot": "a photo of a {}." (their ImageNet template); "ensemble": `templates` averaged
    text_head: str = param("zeroshot", choices=("zeroshot", "ensemble"))
    templates: tuple[str, ...] | None = None
    # their prototypes are cast to float16 (utils.py:377) whatever the model's precision; False keeps float32
    half_prototypes: bool = True
    # None: the model's exp(logit_scale); the authors' code multiplies by the literal 100 (runner.py:138)
    logit_scale: float | None = param(None, gt=0)


class OGASpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    supports_pure_fp16 = True
    # classes fill up: slots replaced, the covariance estimated
    test_config = {"shot_capacity": 3}


class OGABatchSpec(OGASpec):
    """OGA as its benchmark runs by default: the memory takes a whole batch of `--batch-size` images in stream
    order, the class means and the covariance are re-estimated once, then the batch is predicted
    (runner.py:199-258 with main.py:17's batch_size 32). The state carries from batch to batch."""
    name = "oga_batch"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE, batches=True)
    # one image per batch in the registry-wide tests (its batches: tests/test_oga.py)
    test_config = {"shot_capacity": 3}
