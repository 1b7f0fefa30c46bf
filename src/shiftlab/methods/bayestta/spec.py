"""BayesTTA (Cui et al., 2025, "BayesTTA: Continual-Temporal Test-Time Adaptation for Vision-Language Models via
Gaussian Discriminant Analysis"), as its authors' code runs it.

Its spec: config, capabilities and facts, without torch (the code: method.py, discriminant.py). Sources are cited as
`file:line` of cuishuang99/BayesTTA at 9c98176 (`dis_cttta_runner_cd.py`, the cross-domain runner: one dataset, the
state from its first batch; `dis_cttta_runner.py`, the temporal one, carries it across a dataset's domains)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import ONLINE, OWN_TOWER, Capabilities, MethodSpec
from ..common.norm_config import OPTIMIZERS, NormTTAConfig

# "test": Box's M test on the first batch picks one shared covariance or one per class (their default:
# _covariance_homogeneity_test, dis_cttta_runner_cd.py:225-236); "shared", "class": that choice made without it
COVARIANCES = ("test", "shared", "class")


@dataclass
class BayesTTAConfig(NormTTAConfig):
    """Their argparse defaults (`get_arguments`, dis_cttta_runner_cd.py:30-58); per-dataset XML files
    (configs/{rn50,vitb16}/<dataset>.xml) override alpha, the learning rate and the EMA decay."""
    alpha: float = param(1.0, ge=0)                        # --alpha 1.0: the discriminant's weight in the logits
    model_ema_beta: float = param(0.99, ge=0, le=1)        # --model-ema-beta 0.99: EMA of the adapted parameters
    lr: float = param(1e-3, gt=0)                          # --learning-rate 1e-3
    optimizer: str = param("adam", choices=OPTIMIZERS)     # torch.optim.Adam(params, lr) (main)
    adam_eps: float = param(1e-8, gt=0)                    # Adam's default eps
    epsilon: float = param(1e-4, ge=0, le=1)               # --epsilon 1e-4: covariance shrinkage towards sigma^2 I
    sigma: float = param(0.1, gt=0)                        # --sigma 0.1: the prior covariance's scale
    covariance: str = param("test", choices=COVARIANCES)
    # their logits are 100 x cosine whatever the model (dis_cttta_runner_cd.py:259, 343)
    logit_scale: float | None = param(100.0, gt=0)
    # BatchNorm on its running statistics (their model.eval()); True: the batch's statistics, as TENT
    batch_statistics: bool = False


class BayesTTASpec(MethodSpec):
    # class Gaussians updated from every batch, and the image tower's LayerNorms (ViT) or BatchNorms named `bn`
    # (ResNet) stepped and averaged: the state carried from batch to batch
    capabilities = Capabilities(reads=(OWN_TOWER,), state=ONLINE, batches=True)
    # the registry-wide tests' batches are small: the shared covariance without the first batch's test
    test_config = {"covariance": "shared", "lr": 0.01}
