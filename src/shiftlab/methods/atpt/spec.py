"""A-TPT (Ahamed et al., ICLR 2026): TPT plus an angular-diversity term on the class text features.

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...datasets.suites import SUITES
from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec

REPO = "github.com/MB-Shihab-Aaqil-Ahamed/A-TPT"
README_VIT = (f"{REPO} README.md@d76ecf6, 'Comparison on Natural Distribution Shift Datasets', CLIP ViT-B/16 table "
              "(ImageNet-R column, A-TPT row)")
README_RN50 = (f"{REPO} README.md@d76ecf6, 'Comparison on Natural Distribution Shift Datasets', CLIP RN50 table "
               "(ImageNet-R column, A-TPT row)")
IMAGENET_SETS = SUITES["natural-shift"].datasets
FINE_GRAINED = SUITES["cross-dataset"].datasets
OBJECTIVES = ("maximize", "minimize")


@dataclass
class ATPTConfig(PromptTuningConfig):
    # scripts/test_tpt_atpt_ds.sh:10 (lambda_term=10, the natural-shift sets); scripts/test_tpt_atpt_fg.sh:10 sets 80
    lambda_angular: float = param(10.0, ge=0)
    # scripts/test_tpt_atpt_{ds,fg}.sh:11 (tau_term=0.99999), atpt_classification.py:585; clip/custom_clip.py:321
    # hard-codes the same value for tpt_classification.py
    tau: float = param(0.99999, gt=0, le=1)
    # "maximize": loss - lambda x the mean minimum angle between class features, as tpt_classification.py:255
    # (run by scripts/test_tpt_atpt_ds.sh, ImageNet-R) and the paper; "minimize": loss + lambda x that mean, as
    # atpt_classification.py:256-269 (run by scripts/test_tpt_atpt_fg.sh): the two files differ in sign
    objective: str = param("maximize", choices=OBJECTIVES)


class ATPTSpec(PromptTuningSpec):
    name = "atpt"
    # its paper, as `shiftlab methods --bibtex` prints it (the authors' BibTeX, their README)
    bibtex = r"""@inproceedings{ahamed2026atpt,
  title = {A-TPT: Angular Diversity Calibration Properties for Test-Time Prompt Tuning of Vision-Language Models},
  author = {Shihab Aaqil Ahamed and Udaya Sampath K. Perera Miriya Thanthrige and Ranga Rodrigo
      and Muhammad Haris Khan},
  booktitle = {The Fourteenth International Conference on Learning Representations},
  year = {2026},
  url = {https://openreview.net/forum?id=VhlSBZebEw}
}"""
    impl = "shiftlab.methods.atpt.method:ATPT"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "bpda", "eot"),
                        "the image tower, every AdamW step of the prompt (create_graph through the text"
                        " tower) and the readout with the angular-diversity term in the loss; bpda: the"
                        " confident-view selection (its indices constant on the backward pass); random crops"
                        " drawn afresh (eot)",
                        impl="shiftlab.methods.common.prompt_tuning_adaptive:prompt_tuning_logits")
    config_class = ATPTConfig
    summary = "A-TPT: TPT loss - lambda x mean angle from each class feature to its nearest other class (calibration)"
    label = "A-TPT"
    # TPT's fp16 autocast + GradScaler(init_scale=1000) (atpt_classification.py:221, :351); the ds script passes
    # --I_augmix (AugMix on the natural-shift sets), lambda 10
    protocols = {"paper": {"precision": "fp16", "views": {"augmix": True}, "lambda_angular": 10.0}}
    dataset_values = {
        # scripts/test_tpt_atpt_ds.sh (tpt_classification.py, --lambda_term 10 --I_augmix) for V2, A, R, K
        **{name: {"lambda_angular": 10.0, "objective": "maximize", "views": {"augmix": True}}
           for name in IMAGENET_SETS if name != "imagenet"},
        # scripts/test_tpt_atpt_fg.sh (atpt_classification.py, --lambda_term 80, no --I_augmix: AugMix for
        # len(set_id) > 1); its README lists ImageNet ('I') with the fine-grained sets
        "imagenet": {"lambda_angular": 80.0, "objective": "minimize", "views": {"augmix": False}},
        **{name: {"lambda_angular": 80.0, "objective": "minimize", "views": {"augmix": True}} for name in FINE_GRAINED},
    }
    published = (
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=55.78, source=README_RN50),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="ece20", value=3.96, source=README_RN50),
        dict(dataset="imagenet-r", backbone="ViT-B/16", protocol="paper", metric="top1", value=74.87,
             source=README_VIT),
        dict(dataset="imagenet-r", backbone="ViT-B/16", protocol="paper", metric="ece20", value=1.39,
             source=README_VIT),
    )
    fidelity = "golden (tpt_classification.py λ 10 and atpt_classification.py λ 80; 2 steps)"
