"""DPE (Zhang et al., NeurIPS 2024, "Dual Prototype Evolving for Test-Time Generalization of VLMs")."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class DPEConfig(ViewMethodConfig):
    """DPE's ImageNet-R settings (`configs/imagenet_r.yaml` and `main_dpe.py` of zhangce01/DPE-CLIP;
    other datasets: methods/dpe/card.toml under `--protocol paper`)."""
    pos_capacity: int = param(3, ge=1)              # configs/imagenet_r.yaml:6 positive.shot_capacity
    pos_alpha: float = param(3.0, ge=0)             # configs/imagenet_r.yaml:7 (cache logits weight)
    pos_beta: float = param(8.0, ge=0)              # configs/imagenet_r.yaml:8 (affinity sharpness)
    lr_text: float = param(0.0006, ge=0)            # configs/imagenet_r.yaml:11 learning_rate.text
    lr_image: float = param(0.0006, ge=0)           # configs/imagenet_r.yaml:12 learning_rate.image
    align: float = param(0.0, ge=0)                 # configs/imagenet_r.yaml:13 learning_rate.align (InfoNCE weight)
    # main_dpe.py:231 `steps = 1`; each step is a fresh AdamW (main_dpe.py:247)
    steps: int = param(1, ge=1)
    adam_eps: float = param(1e-3, gt=0)             # main_dpe.py:249-250 'eps': 1e-3
    weight_decay: float = param(0.1, ge=0)          # main_dpe.py:249-250 'weight_decay': 1e-1
    temperature: float = param(0.01, gt=0)          # main_dpe.py:37 InfoNCE(temperature=0.01)
    evolve_threshold: float = param(0.1, ge=0)      # main_dpe.py:288: the head evolves iff H_norm(final) < 0.1
    # utils.py:150 int(N * 0.1) lowest-entropy views; at least one here
    view_ratio: float = param(0.1, gt=0, le=1)
    # main_dpe.py:270: "base" reads view 0 (every set but ImageNet-A); "confident": the views selected
    # again with the adapted head (their 'A')
    readout: str = param("base", choices=("base", "confident"))
    # "ensemble": `templates` (None: CLIP's 80); "tip_cupl" (the authors', utils.py:88-89): `templates`
    # (None: CLIP's 80, their ImageNet-R list) + CuPL descriptions from cupl_file; "zeroshot": one template
    text_head: str = param("ensemble", choices=("ensemble", "zeroshot", "tip_cupl"))
    cupl_file: str | None = None
    templates: tuple[str, ...] | None = None
    entropy_norm: str = param("log2", choices=("log2", "ln"))         # utils.py:47 H / log2(C); "ln": / ln(C)
    # None: the model's; the authors' literal 100 (utils.py:146) under paper
    logit_scale: float | None = param(None, gt=0)


class DPESpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    supports_pure_fp16 = True   # the authors' half model (`clip.load` on CUDA) under --protocol paper
    cupl_templates = "clip80"   # its tip_cupl head pools CLIP's 80 templates (utils.py:88-89), not Tip-Adapter's 7
    # the cache fills on a short stream
    test_config = {"pos_capacity": 2}
