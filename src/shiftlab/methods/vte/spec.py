"""VTE, the vision-text-space ensemble (Döbler et al. 2024, "A Lost Opportunity for Vision-Language Models"),
training-free."""
from __future__ import annotations

from dataclasses import dataclass

from ...datasets.suites import SUITES
from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodSpec, ViewMethodConfig

# conf.py:459 `generalization_dataset_names`: AugMix on the fine-grained sets' views, not on the ImageNet variants
# (datasets/data_loading.py:44-48)
FINE_GRAINED = SUITES["cross-dataset"].datasets
IMAGENET_SETS = SUITES["natural-shift"].datasets


@dataclass
class VTEConfig(ViewMethodConfig):
    # conf.py:292 (_C.TPT.SELECTION_P, which methods/vte.py:18 reads): int(64 * 0.1) = 6 views
    selection_ratio: float = param(0.1, gt=0, le=1)
    # cfgs/imagenet_others/vte.yaml:15 (CLIP.PROMPT_MODE ensemble: datasets/prompts.py's 80 imagenet_templates)
    text_head: str = param("ensemble", choices=("ensemble", "zeroshot"))


class VTESpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    # cfgs/imagenet_others/vte.yaml: 64 views (TEST.N_AUGMENTATIONS), the ensemble head; conf.py:286
    # CLIP.PRECISION fp16: open_clip's weights in half precision (models/model.py get_model)
    supports_pure_fp16 = True   # --set vte.precision=fp16-pure: their half model (on CUDA)
    test_config = {"text_head": "zeroshot"}
