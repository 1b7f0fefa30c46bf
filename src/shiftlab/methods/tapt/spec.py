"""TAPT (Wang, Chen, Zhang, Chen & Ma, CVPR 2025, "TAPT: Test-Time Adversarial Prompt Tuning for Robust Inference
in Vision-Language Models"), its vision-prompt variant TAPT-V in the zero-shot setting."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, ViewMethodConfig
from ..common.token_alignment_spec import TokenAlignmentSpec

ALIGN_TYPES = ("l1", "l2")


@dataclass
class TAPTConfig(ViewMethodConfig):
    """`test_time_adv_tuning` (trainers/adv_v.py:968-1031@14d8d0e) with the values of CONFIG_FILE (`TAPT:` and
    `TRAINER.TAPTV:` sections) over train.py's `extend_cfg` defaults (train.py:135-170). The views: 64
    (`TAPT.BATCH_SIZE`, train.py:148), the image and 63 random resized crops + flips (`AdvAugMixAugmenter`,
    adv_v.py:374-384, augmix off)."""
    lr: float = param(5e-4, ge=0)                         # TAPT.LR 5e-4: CONFIG_FILE (train.py:138 says 4e-2)
    steps: int = param(1, ge=0)                           # TAPT.TTA_STEPS 1: CONFIG_FILE, train.py:142
    weight_decay: float = param(0.01, ge=0)               # torch.optim.AdamW's default (adv_v.py:862)
    n_ctx: int = param(2, ge=1, le=64)                    # TRAINER.TAPTV.N_CTX_VISION 2: CONFIG_FILE
    depth: int = param(9, ge=1, le=64)                    # TRAINER.TAPTV.PROMPT_DEPTH_VISION 9: CONFIG_FILE
    selection_ratio: float = param(0.1, gt=0, le=1)       # TAPT.TAPT_THRESHOLD 0.1: the entropy's views
    align_ratio: float = param(0.1, gt=0, le=1)           # TAPT.ALIGN_THRESHOLD 0.1: the statistics' views
    entropy_loss: bool = True                             # TAPT.TAPT_LOSS True
    align: bool = True                                    # TAPT.DISTR_ALIGN True (train.py's default: False)
    align_type: str = param("l1", choices=ALIGN_TYPES)    # AT.ALIGN_TYPE "l1"
    # the blocks whose inputs are aligned: range(from, to - 1), as onestage_align_loss loops (adv_v.py:1074)
    align_layer_from: int = param(0, ge=0, le=64)         # TAPT.ALIGN_LAYER_FROM 0
    align_layer_to: int = param(9, ge=1, le=65)           # TAPT.ALIGN_LAYER_TO 9
    align_weight: float = param(100.0, ge=0)              # TAPT.DISTR_LOSS_W 100, divided by (to - from)
    gamma: float = param(0.5, ge=0, le=1)                 # `gamma = 0.5 # 1 adv, 0 clea` (adv_v.py:974)
    # the four statistics files (TAPT.VIS_MEANS, VIS_VARS, VIS_MEANS_CLEAN, VIS_VARS_CLEAN; torch.save'd
    # (blocks, tokens, width) tensors, stats/vitb16/V_{means,vars}_vitb16_train_{adv,clean}.pt in their scripts)
    means_adv: str | None = None
    vars_adv: str | None = None
    means_clean: str | None = None
    vars_clean: str | None = None
    # trained VPT prompts (their --model-dir: a dassl checkpoint, MMoP's AdvVPT); None: the random initialisation
    prompts: str | None = None
    # False: their reset (CustomCLIP.reset, adv_v.py:181-186) restores the prompts captured when the model was
    # built, before load_model, so every sample is tuned from the random initialisation and loaded prompts are
    # discarded; True: tuning starts from the loaded prompts (README "Choices that differ")
    keep_loaded_prompts: bool = False
    # the random initialisation N(0, 0.02): drawn from a generator seeded by this (theirs: the global stream)
    seed: int = param(1, ge=0, le=2 ** 63 - 1)            # --seed 1: scripts/V/TAPT_V_0shots_b16.sh:9


class TAPTSpec(TokenAlignmentSpec):
    statistics_files = {"adv": ("means_adv", "vars_adv"), "clean": ("means_clean", "vars_clean")}
    statistics_file_names = "V_{means,vars}_..._{adv,clean}.pt"
    # the prompts live inside the image tower: it runs the tower on its views' pixels itself
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC)
    towers = ("vit",)
    towers_why = "its visual prompts are tokens inside the ViT's blocks (their VPT design; their scripts run ViT-B)"
    # its statistics files cannot be downloaded (the authors' are not published): the entropy alone
    offline_config = {"align": False}
