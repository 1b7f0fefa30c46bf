"""TIPPLE (Lu, Bai, Li, Xiao & Wang, TIP 2025, "Task-to-Instance Prompt Learning for Vision-Language Models at
Test Time"): a task-level prompt learned over the whole unlabelled test set (stage I), then TPT from it per image
(stage II). The first method of the transductive track that reads the whole test set (docs/PROTOCOLS.md)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ...views.recipe import ViewRecipe
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec


def weak_recipe(epochs: int) -> ViewRecipe:
    """Stage I's weak views, one per epoch after the original (view 0): RandomResizedCrop(224, scale 0.5-1,
    bicubic) + flip (data/datautils.py:223-225, 238)."""
    return ViewRecipe(n_views=1 + epochs, scale=(0.5, 1.0), interpolation="bicubic")


def strong_recipe(epochs: int) -> ViewRecipe:
    """Stage I's strong views: the weak crop, then AugMix with all 9 ImageNet-safe ops at severity 4 or, with
    probability 1/2, Cutout(1 hole, 56 px at 224) instead (data/datautils.py:228, 239-262)."""
    return ViewRecipe(n_views=1 + epochs, scale=(0.5, 1.0), interpolation="bicubic", augmix=True,
                      augmix_severity=4, cutout=56 / 224, cutout_p=0.5)


@dataclass
class TIPPLEConfig(PromptTuningConfig):
    """Stage II is TPT's config (one AdamW step from the task prompt on the 10% most confident of 64 views);
    the task_* fields are stage I's."""
    lr: float = param(1e-3, ge=0)              # stage II: scripts/test.sh:17 s2_lr=0.001 (main.py:424 says 5e-3)
    task_epochs: int = param(3, ge=1)          # scripts/test.sh:14 s1_epoch=3 (main.py:418 says 1)
    task_batch_size: int = param(256, ge=1)    # scripts/test.sh:11 s1_bs=256
    task_lr: float = param(1e-3, gt=0)         # scripts/test.sh:13 s1_lr=0.001; AdamW (main.py:87)
    task_lr_decay: float = param(10.0, ge=1)   # after epoch e the lr becomes task_lr / 10**(e + 1) (main.py:150)
    task_threshold: float = param(0.7, ge=0, lt=1)   # scripts/test.sh:15 s1_thred: weak views above it pseudo-label
    # scripts/test.sh:16-17 s1_div_loss_weight: "0.1 for OOD datasets and 0.2 for Non-OOD datasets"
    task_diversity: float = param(0.2, ge=0)
    # the stage-I batches' order: shuffled per epoch from the run seed (True, their DataLoader(shuffle=True),
    # main.py:137-140), or in sample-id order (False)
    task_shuffle: bool = True


class TIPPLESpec(PromptTuningSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC, reads_ahead="test_set")
    # the registry-wide tests: one epoch over the tiny set in batches of 4 (stage II: one step, as the default)
    test_config = {"task_epochs": 1, "task_batch_size": 4}
