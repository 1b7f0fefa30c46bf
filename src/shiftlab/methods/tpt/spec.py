"""Episodic test-time prompt tuning: TPT, C-TPT, O-TPT and R-TPT (RLCF's student too: methods/rlcf/).

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.cards import C_TPT_TABLE, R_TPT_TABLE, TPT_README
from ..catalogue.declarations import (
    EPISODIC,
    FROZEN_FEATURES,
    Capabilities,
)
from ..common.prompt_tuning_config import FINE_GRAINED, IMAGENET_SETS, PromptTuningConfig, PromptTuningSpec

SELF_MASKS = ("index", "threshold")


@dataclass
class CTPTConfig(PromptTuningConfig):
    lambda_atfd: float = param(20.0, ge=0)   # 20 for the ImageNet variants, 50 for fine-grained sets (authors' scripts)


@dataclass
class OTPTConfig(PromptTuningConfig):
    # ashshaksharifdeen/O-TPT@a09933f scripts/test_tpt_otpt_ds.sh:11 (lambda_term=2, the natural-shift sets);
    # scripts/test_tpt_otpt_fg.sh:11 sets 18 for the fine-grained sets (dataset_values)
    lambda_ortho: float = param(2.0, ge=0)


@dataclass
class RTPTConfig(PromptTuningConfig):
    k_neighbours: int = param(20, ge=1)
    temperature: float = param(0.01, gt=0)
    self_mask: str = param("index", choices=SELF_MASKS)   # "threshold" reproduces the authors' sim >= 1.0 rule


class TPTSpec(PromptTuningSpec):
    name = "tpt"
    # its paper, as `shiftlab methods --bibtex` prints it (the authors' own BibTeX where their README has one)
    bibtex = r"""@inproceedings{shu2022tpt,
  title = {Test-Time Prompt Tuning for Zero-Shot Generalization in Vision-Language Models},
  author = {Shu, Manli and Nie, Weili and Huang, De-An and Yu, Zhiding and Goldstein, Tom and Anandkumar, Anima
      and Xiao, Chaowei},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2022}
}"""
    impl = "shiftlab.methods.tpt.method:TPT"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "bpda", "eot"),
                        "the image tower, every AdamW step of the prompt (create_graph through the text tower)"
                        " and the readout; bpda: the confident-view selection (its indices constant on the"
                        " backward pass); random crops drawn afresh (eot)",
                        impl="shiftlab.methods.common.prompt_tuning_adaptive:prompt_tuning_logits")
    summary = "TPT: tune 4 context tokens on the 10% most confident views (marginal entropy), predict view 0"
    label = "TPT"
    # azshue/TPT tpt_classification.py: fp16 autocast + GradScaler(init_scale=1000); AugMix only for the
    # fine-grained sets (len(set_id) > 1), so not for ImageNet-R
    protocols = {"paper": {"precision": "fp16"}}
    # tpt_classification.py AugMixAugmenter(..., augmix=len(set_id)>1): none for I/A/V/R/K, AugMix on the others
    dataset_values = {**{name: {"views": {"augmix": False}} for name in IMAGENET_SETS},
                        **{name: {"views": {"augmix": True}} for name in FINE_GRAINED}}
    published = (
        dict(dataset="imagenet-r", backbone="RN50", protocol="leaderboard", metric="top1", value=58.9,
             source=R_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=59.11, source=TPT_README),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=58.9, source=C_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="ece20", value=9.18, source=C_TPT_TABLE),
    )
    fidelity = "golden"


class CTPTSpec(PromptTuningSpec):
    name = "ctpt"
    # its paper, as `shiftlab methods --bibtex` prints it (the authors' own BibTeX where their README has one)
    bibtex = r"""@inproceedings{yoon2024ctpt,
  title = {C-TPT: Calibrated Test-Time Prompt Tuning for Vision-Language Models via Text Feature Dispersion},
  author = {Yoon, Hee Suk and Yoon, Eunseop and Tee, Joshua Tian Jin and Hasegawa-Johnson, Mark and Li, Yingzhen
      and Yoo, Chang D.},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year = {2024}
}"""
    impl = "shiftlab.methods.tpt.method:CTPT"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "bpda", "eot"),
                        "the image tower, every AdamW step of the prompt (create_graph through the text tower)"
                        " and the readout; bpda: the confident-view selection (its indices constant on the"
                        " backward pass); random crops drawn afresh (eot)",
                        impl="shiftlab.methods.common.prompt_tuning_adaptive:prompt_tuning_logits")
    config_class = CTPTConfig
    summary = "C-TPT: TPT loss - lambda x text feature dispersion (better calibration)"
    label = "C-TPT"
    aliases = ("ctpt20",)     # lambda 20, its ImageNet setting
    # hee-suk-yoon/C-TPT's distribution-shift script passes --I_augmix (AugMix on for ImageNet-R), lambda 20;
    # precision as TPT's code, which it runs
    protocols = {"paper": {"precision": "fp16", "views": {"augmix": True}, "lambda_atfd": 20.0}}
    dataset_values = {
        # scripts/test_tpt_ctpt_ds.sh (--lambda_term 20 --I_augmix)
        **{name: {"lambda_atfd": 20.0, "views": {"augmix": True}} for name in IMAGENET_SETS},
        # scripts/test_tpt_ctpt_fg.sh (--lambda_term 50; AugMix from augmix=len(set_id)>1 in tpt_classification.py)
        **{name: {"lambda_atfd": 50.0, "views": {"augmix": True}} for name in FINE_GRAINED},
    }
    published = (
        dict(dataset="imagenet-r", backbone="RN50", protocol="leaderboard", metric="top1", value=57.7,
             source=R_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=58.0, source=C_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="ece20", value=4.57, source=C_TPT_TABLE),
    )
    fidelity = "golden (λ 20, 50)"


OTPT_README = ("github.com/ashshaksharifdeen/O-TPT README.md@a09933f, 'Comparison of calibration performance with "
               "CLIP-ViTB/16 backbone on Natural distribution shift datasets' table (I-R column)")


class OTPTSpec(PromptTuningSpec):
    name = "otpt"
    # its paper, as `shiftlab methods --bibtex` prints it (the authors' BibTeX, their README)
    bibtex = r"""@inproceedings{sharifdeen2025otpt,
  title = {O-TPT: Orthogonality Constraints for Calibrating Test-time Prompt Tuning in Vision-Language Models},
  author = {Sharifdeen, Ashshak and Munir, Muhammad Akhtar and Baliah, Sanoojan and Khan, Salman
      and Khan, Muhammad Haris},
  booktitle = {Proceedings of the Computer Vision and Pattern Recognition Conference (CVPR)},
  pages = {19942--19951},
  year = {2025}
}"""
    impl = "shiftlab.methods.tpt.method:OTPT"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "bpda", "eot"),
                        "the image tower, every AdamW step of the prompt (create_graph through the text tower)"
                        " and the readout; bpda: the confident-view selection (its indices constant on the"
                        " backward pass); random crops drawn afresh (eot)",
                        impl="shiftlab.methods.common.prompt_tuning_adaptive:prompt_tuning_logits")
    config_class = OTPTConfig
    summary = "O-TPT: TPT loss + lambda x orthogonality penalty on the class text features (better calibration)"
    label = "O-TPT"
    # otpt_classification.py: TPT's fp16 autocast + GradScaler(init_scale=1000) (:182, :372), one AdamW step
    # (--tta_steps 1, lr 5e-3, :674, :666); scripts/test_tpt_otpt_ds.sh passes --I_augmix (AugMix on every
    # natural-shift set, :413) and lambda 2
    protocols = {"paper": {"precision": "fp16", "views": {"augmix": True}, "lambda_ortho": 2.0}}
    dataset_values = {
        # scripts/test_tpt_otpt_ds.sh (--lambda_term 2 --I_augmix) for I-A, I-V2, I-R, I-S
        **{name: {"lambda_ortho": 2.0, "views": {"augmix": True}} for name in IMAGENET_SETS if name != "imagenet"},
        # scripts/test_tpt_otpt_fg.sh (--lambda_term 18, no --I_augmix: AugMix for len(set_id) > 1, :416); its
        # README lists ImageNet ('I') with the fine-grained sets
        "imagenet": {"lambda_ortho": 18.0, "views": {"augmix": False}},
        **{name: {"lambda_ortho": 18.0, "views": {"augmix": True}} for name in FINE_GRAINED},
    }
    published = (
        dict(dataset="imagenet-r", backbone="ViT-B/16", protocol="paper", metric="top1", value=72.55,
             source=OTPT_README),
        dict(dataset="imagenet-r", backbone="ViT-B/16", protocol="paper", metric="ece20", value=1.46,
             source=OTPT_README),
    )
    fidelity = "golden (λ 2, 18; 2 steps)"


class RTPTSpec(PromptTuningSpec):
    name = "rtpt"
    # its paper, as `shiftlab methods --bibtex` prints it (the authors' own BibTeX where their README has one)
    bibtex = r"""@inproceedings{sheng2025rtpt,
  title = {R-TPT: Improving Adversarial Robustness of Vision-Language Models through Test-Time Prompt Tuning},
  author = {Sheng, Lijun and Liang, Jian and Wang, Zilei and He, Ran},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year = {2025}
}"""
    impl = "shiftlab.methods.tpt.method:RTPT"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "bpda", "eot"),
                        "the image tower, every AdamW step of the prompt (create_graph through the text tower)"
                        " and the reliability-weighted readout; bpda: the confident-view selection (its indices"
                        " constant on the backward pass); random crops drawn afresh (eot)",
                        impl="shiftlab.methods.common.prompt_tuning_adaptive:prompt_tuning_logits")
    config_class = RTPTConfig
    summary = "R-TPT: pointwise entropy, then reliability-weighted average of all views' tuned logits"
    label = "R-TPT"
    protocols = {"paper": {"precision": "fp32"}}   # rtpt.py: no autocast, no GradScaler: float32 throughout
    published = (
        dict(dataset="imagenet-r", backbone="RN50", protocol="leaderboard", metric="top1", value=57.6,
             source=R_TPT_TABLE),
    )
    fidelity = "golden; its attack pipeline too (PGD, 8-bit conversion, rebuilt views)"
    min_views = 2
    min_views_why = "its reliability weights rank each view's neighbours (one view has none: NaN weights)"
