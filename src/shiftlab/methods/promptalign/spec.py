"""PromptAlign (Samadh, Gani, Hussein, Khattak, Naseer, Khan & Khan, NeurIPS 2023, "Align Your Prompts: Test-Time
Prompting with Distribution Alignment for Zero-Shot Generalization")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, OWN_TOWER, Capabilities, ViewMethodConfig
from ..common.token_alignment_spec import TokenAlignmentSpec


@dataclass
class PromptAlignConfig(ViewMethodConfig):
    """`test_time_tuning` (trainers/prompt_align.py:736-782@9290564) with the values of CONFIG_FILE
    (configs/trainers/PromptAlign/DG_PAlign_vit_b16_c2_ep5_batch4_2ctx_cross_datasets.yaml, the domain-generalisation
    runs: ImageNet-R among them) over train.py's `extend_cfg` defaults (train.py:101-123). The views: 64
    (`TPT.BATCH_SIZE`, train.py:114), the image and 63 random resized crops + flips (`AugMixAugmenter` with an empty
    augmentation list, prompt_align.py:484-521)."""
    lr: float = param(4e-2, ge=0)                         # TPT.LR 4e-2: CONFIG_FILE, train.py:104 (fine-grained: 5e-4)
    steps: int = param(1, ge=0)                           # TPT.TTA_STEPS 1
    weight_decay: float = param(0.01, ge=0)               # torch.optim.AdamW's default (prompt_align.py:636)
    n_ctx: int = param(2, ge=1, le=64)                    # TRAINER.PROMPTALIGN.N_CTX 2
    ctx_init: str = "a photo of a"                        # TRAINER.PROMPTALIGN.CTX_INIT (the text "a photo of a {}.")
    depth: int = param(3, ge=1, le=64)                    # TRAINER.PROMPTALIGN.PROMPT_DEPTH 3 (train.py's default: 9)
    selection_ratio: float = param(0.1, gt=0, le=1)       # TPT.TPT_THRESHOLD 0.1: the entropy's views
    align_ratio: float = param(0.1, gt=0, le=1)           # TPT.ALIGN_THRESHOLD 0.1: the statistics' views
    entropy_loss: bool = True                             # TPT.TPT_LOSS True
    align: bool = True                                    # TPT.DISTR_ALIGN True (train.py's default: False)
    # the blocks whose inputs are aligned: range(from, to - 1), as distr_align_loss loops (prompt_align.py:805)
    align_layer_from: int = param(0, ge=0, le=64)         # TPT.ALIGN_LAYER_FROM 0
    align_layer_to: int = param(3, ge=1, le=65)           # TPT.ALIGN_LAYER_TO 3
    align_weight: float = param(100.0, ge=0)              # TPT.DISTR_LOSS_W 100, divided by (to - from)
    # the statistics files (TPT.VIS_MEANS, TPT.VIS_VARS: ImgNetpre_vis_{means,vars}.pt, torch.save'd (blocks, tokens,
    # width) tensors of ImageNet's token statistics with MaPLe's prompts, docs/run.md)
    means: str | None = None
    vars: str | None = None
    # MaPLe's trained prompts (their --model-dir/MultiModalPromptLearner/model.pth.tar-2, a dassl checkpoint);
    # None: the prompt learner as their code builds it untrained (load_model skipped), README
    prompts: str | None = None
    # the untrained learner's random draws (deep text prompts, projections): a generator seeded by this
    seed: int = param(1, ge=0, le=2 ** 63 - 1)            # --seed 1: scripts/prompt_align/palign_dg.sh's $2


class PromptAlignSpec(TokenAlignmentSpec):
    statistics_files = {"imagenet": ("means", "vars")}
    statistics_file_names = "ImgNetpre_vis_{means,vars}.pt"
    # the visual prompts live inside the image tower: it runs the tower on its views' pixels itself
    capabilities = Capabilities(reads=(OWN_TOWER,), state=EPISODIC)
    towers = ("vit",)
    towers_why = "MaPLe's visual prompts are tokens inside the ViT's blocks (their scripts run ViT-B/16)"
    # its statistics files cannot be downloaded here (the authors' are on Google Drive): the entropy alone
    offline_config = {"align": False}
