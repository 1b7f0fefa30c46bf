"""RLCF (Zhao et al., ICLR 2024): test-time prompt tuning with a CLIP reward."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, OWN_TOWER, Capabilities
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec

BASELINES = ("view", "batch", "none")


@dataclass
class RLCFConfig(PromptTuningConfig):
    # inherited from TPT's config and equal to theirs: 64 views (scripts/rlcf-prompt.sh:21 batch_size=64, no AugMix
    # on ImageNet-R: tpt_cls_rl.py:150), selection_ratio 0.1 (:22), n_ctx 4 (params.py:39), ctx_init "a photo of a"
    # (:15), loss_scale 1000 (GradScaler(init_scale=1000), tpt_cls_rl.py:127), AdamW (tpt_cls_rl.py:120)
    steps: int = param(3, ge=0)                  # scripts/rlcf-prompt.sh:16,38 (tta_steps=3)
    lr: float = param(7e-3, ge=0)                # scripts/rlcf-prompt.sh:17,39
    weight_decay: float = param(5e-4, ge=0)      # scripts/rlcf-prompt.sh:18 (params.py:30)
    sample_k: int = param(3, ge=1)               # top-K classes per view: scripts/rlcf-prompt.sh:29 (params.py:52: 5)
    reward_model: str = "ViT-L-14"               # scripts/rlcf-prompt.sh:25,40 (reward_arch=ViT-L/14)
    reward_pretrained: str | None = "openai"     # their clip.load of OpenAI's weights (clip_reward.py:93)
    reward_seed: int = param(0, ge=0)            # random reward weights only (reward_pretrained "none")
    clipscore_weight: float = param(2.5, gt=0)   # CLIPScore's w (clip_reward.py:77)
    # the reward baseline: "view" subtracts the mean of each view's K scores (--reward_process 1 --process_batch 0,
    # scripts/rlcf-prompt.sh:27-28), "batch" the mean over all selected views' scores (--process_batch 1),
    # "none" keeps the raw scores (--reward_process 0); clip_reward.py:153-165
    reward_baseline: str = param("view", choices=BASELINES)
    reward_std: bool = False                     # also divide by std + 1e-5 (--reward_amplify, rlcf-prompt.sh:26: 0)


class RLCFSpec(PromptTuningSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES, OWN_TOWER), state=EPISODIC)
    # no number in their repository (README.md, assets/, no logs)
    published: tuple = ()
    offline_config = {"reward_model": "shiftlab-tiny", "reward_pretrained": "none", "reward_seed": 1}
    random_weights_config = {"reward_pretrained": "none"}
