"""StatA (Zanella, Fuchs, De Vleeschouwer & Ben Ayed, CVPR 2025, "Realistic Test-Time Adaptation of
Vision-Language Models").

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
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
    name = "stata"
    # its paper, as `shiftlab methods --bibtex` prints it (the CVPR version of the authors' README's arXiv entry)
    bibtex = r"""@inproceedings{zanella2025stata,
  title = {Realistic Test-Time Adaptation of Vision-Language Models},
  author = {Zanella, Maxime and Fuchs, Cl{\'e}ment and De Vleeschouwer, Christophe and Ben Ayed, Ismail},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  pages = {25103--25112},
  year = {2025}
}"""
    impl = "shiftlab.methods.stata.method:StatA"
    # one feature per image (their pre_load_features), nothing carried from batch to batch, whole batches
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC, batches=True)
    adaptive = Adaptive(("full", "bpda"),
                        "its batch attacked jointly through the Gaussian class models; bpda: the kNN graph's"
                        " neighbour choice")
    config_class = StatAConfig
    supports_pure_fp16 = True
    summary = "StatA: per batch, Gaussian class models anchored to zero-shot, with a kNN Laplacian (training-free)"
    label = "StatA"
    # MaxZanella/StatA main.py: `clip.load`'s half model on CUDA, features cast to float32 by the solver, the literal
    # 100 (StatA.py:9); batches of 64 (main.py:27, `--batch-size 64` here)
    protocols = {"paper": {"precision": "fp16-pure", "logit_scale": 100.0}}
    # its README's tables average 11 datasets (no ImageNet-R): README.md here quotes them
    published = ()
    fidelity = ("golden (24-sample stream in 3 batches of 8 with main.py's defaults and one batch of 24 with "
                "soft beta and alpha 3; every outer iteration's z and beta, means and covariances)")
