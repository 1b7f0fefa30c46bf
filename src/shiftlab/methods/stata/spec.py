"""StatA (Zanella, Fuchs, De Vleeschouwer & Ben Ayed, CVPR 2025, "Realistic Test-Time Adaptation of
Vision-Language Models")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodConfig, MethodSpec


@dataclass
class StatAConfig(MethodConfig):
    """StatA's defaults: `main.py`'s argparse (alpha line 35, lambda_laplacian 36, soft_beta 37) and `get_hp`
    (lambda_y_hat 1, n_neighbors 3: lines 42-50); `StatA_solver`'s max_iter 10 and `update_z`'s 5 inner steps
    (`solvers/StatA.py:165, 67`); the zero-shot logits `100 * features @ prototypes` (StatA.py:9) over the
    dataset's 'standard' prompts, "a photo of a {}." on ImageNet (`datasets/imagenet.py:188`, `utils.py:74`).
    Their model is `clip.load` on CUDA (half precision) and the solver casts to float32 (StatA.py:167-169).
    """
    alpha: float = param(1.0, gt=0)              # anchor weight: beta_k = n_k / (alpha + n_k)
    lambda_laplacian: float = param(1.0, ge=0)   # weight of the kNN Laplacian term
    lambda_y_hat: float = param(1.0, ge=0)       # power of the zero-shot prior
    n_neighbors: int = param(3, ge=1)            # kNN graph over the batch (fewer in a smaller batch)
    soft_beta: bool = False                      # n_k = sum of z (soft) instead of the count of argmax (hard)
    max_iter: int = param(10, ge=0)              # outer iterations (updates of the class models)
    z_steps: int = param(5, ge=1)                # update_z's inner iterations
    text_head: str = param("zeroshot", choices=("zeroshot", "ensemble"))
    templates: tuple[str, ...] | None = None
    # None: the model's exp(logit_scale); the authors' code multiplies by the literal 100 (StatA.py:9)
    logit_scale: float | None = param(None, gt=0)


class StatASpec(MethodSpec):
    # one feature per image (their pre_load_features), nothing carried from batch to batch, whole batches
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC, batches=True)
    supports_pure_fp16 = True
