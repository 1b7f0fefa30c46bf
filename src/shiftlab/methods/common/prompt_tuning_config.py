"""Episodic test-time prompt tuning, the torch-free half of what its family shares (TPT, C-TPT, O-TPT and R-TPT,
TIPPLE, RLCF): TPT's config, the spec every prompt tuner subclasses, and the dataset groups TPT's code treats
differently (its one-letter set ids I/A/V/R/K, the rest fine-grained). The torch half: prompt_tuning.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...datasets.suites import SUITES
from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodSpec, ViewMethodConfig

IMAGENET_SETS = SUITES["natural-shift"].datasets     # TPT's one-letter set ids I/A/V/R/K


FINE_GRAINED = SUITES["cross-dataset"].datasets


@dataclass
class PromptTuningConfig(ViewMethodConfig):
    steps: int = param(1, ge=0)          # 0: no tuning (the initial prompt's zero-shot)
    lr: float = param(5e-3, ge=0)        # 0: the tuning loop runs and leaves the prompt as it was (a sanity check)
    weight_decay: float = param(0.01, ge=0)   # torch.optim.AdamW's default, which the authors kept
    selection_ratio: float = param(0.1, gt=0, le=1)   # int(64 * 0.1) = 6 views
    n_ctx: int = param(4, ge=1)
    ctx_init: str | None = "a photo of a"   # None: random init (CoOp); see also ctx_checkpoint
    ctx_checkpoint: str | None = None    # a CoOp checkpoint holding a `ctx` tensor
    loss_scale: float = param(1000.0, gt=0)   # GradScaler(init_scale=1000) of the authors' code
    batch_size: int = param(0, ge=0)    # images tuned together; 0: auto (1 on CPU, from free memory on CUDA)
    # the shared "[SOT] context" prefix is run once, not once per class (exact up to float rounding,
    # ~2.5x less text-tower work on ImageNet-R); False: each class's whole prompt, as the authors' code
    share_prefix: bool = True


class PromptTuningSpec(MethodSpec):
    """What the prompt tuners share (TPT, C-TPT, R-TPT, RLCF): TPT's config, a tuned prompt as class head, and
    what they read (episodic, on the frozen view features; RLCF and TIPPLE declare their own)."""
    config_class = PromptTuningConfig
    text_head = "prompt"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
