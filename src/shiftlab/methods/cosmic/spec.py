"""COSMIC (Huang et al., CVPR 2025): Clique-Oriented Semantic Multi-space Integration, training-free and online."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...params import param
from ...views.recipe import ViewRecipe
from ..catalogue.declarations import FROZEN_ENCODER, FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec, ViewMethodConfig
from .dino_checkpoint import dino_identity

# hf618/COSMIC@34fde07: scripts/cosmic_ood.sh (the natural-shift run), cosmic_main.py, utils/utils_cosmic.py,
# utils/DualMems.py, configs_l/imagenet_r.yaml
DINO_MODELS = {"l": "vit_large_patch14_reg4_dinov2.lvd142m", "b": "vit_base_patch14_reg4_dinov2.lvd142m",
               "s": "vit_small_patch14_reg4_dinov2.lvd142m"}   # clip/dinoV2.py load_dinov2(size): dinov2_vit?14_reg


@dataclass
class COSMICConfig(ViewMethodConfig):
    views: ViewRecipe = ViewRecipe(n_views=8)          # cosmic_ood.sh: -b 8 (7 views + the original)
    view_ratio: float = param(0.1, gt=0, le=1)         # cosmic_ood.sh: --selection_p 0.1 (at least one view)
    clip_shots: int = param(16, ge=1)                  # cosmic_ood.sh: --CLIP_Cache_shot 16 (DMN memory per class)
    dino_shots: int = param(16, ge=1)                  # cosmic_ood.sh: --DINO_Cache_shot 16
    memory_beta: float = param(5.5, ge=0)              # cosmic_ood.sh: --beta 5.5 (the memory's attention)
    cache_alpha: float = param(1.0, gt=0)              # configs_l/imagenet_r.yaml positive.alpha
    cache_beta: float = param(8.0, ge=0)               # configs_l/imagenet_r.yaml positive.beta
    clique_ratio: float = param(0.2, gt=0, le=1)       # cosmic_ood.sh: --r 0.2 (share of cliques read)
    target_degree: float = param(5.0, gt=0)            # cosmic_ood.sh: --target_avg_degree 5.0 (CLIP graph: x 0.8)
    clip_degree_factor: float = param(0.8, gt=0)       # cosmic_main.py:425 control_v1 = target_avg_degree * 0.8
    second_order: bool = True                          # cosmic_ood.sh: --is_SOG (edges with >= 2 common neighbours)
    graph_interval: int = param(100, ge=1)             # cosmic_ood.sh: --mac_step 100 (rebuild after warm-up)
    # the weights of the two clique scores in p_zs + w_clip * clip cliques + w_dino * dino cliques; the authors
    # search both on the test labels over [0, 0.001, ..., 1000] (cosmic_main.py:626-690); ours: fixed, 1 each
    clip_clique_weight: float = param(1.0, ge=0)
    dino_clique_weight: float = param(1.0, ge=0)
    # the CLIP class head: "ensemble" (CLIP's 80 templates), "zeroshot" (one template), or the authors' "tip_cupl"
    # (cosmic_ood.sh: --text_prompt tip_cupl: 7 Tip-Adapter templates + CuPL descriptions, read from cupl_file,
    # which is not shipped: as DMN-ZS)
    text_head: str = param("ensemble", choices=("ensemble", "zeroshot", "tip_cupl"))
    cupl_file: str | None = None
    templates: tuple[str, ...] | None = None
    # DINOv2 (cosmic_ood.sh: --DINOv2 --DINO_size l: ViT-L/14 with 4 registers) as timm builds it; None: the
    # CLIP-only variant (their flags without --DINOv2 --use_dino_clique)
    dino_model: str | None = DINO_MODELS["l"]
    # Meta's checkpoint file, where the authors read it (clip/dinoV2.py: ./pretrained/, relative to the working
    # directory), or "none": random weights of dino_seed (tests, demo, bench)
    dino_pretrained: str = "pretrained/dinov2_vitl14_reg4_pretrain.pth"
    dino_seed: int = param(0, ge=0)


class COSMICSpec(MethodSpec):
    # the CLIP view features, and view 0 through DINOv2: a frozen encoding the engine computes once per sample and a
    # feature store holds beside the CLIP features (`COSMIC.frozen_encoder`; none with dino_model=None)
    capabilities = Capabilities(reads=(FROZEN_FEATURES, FROZEN_ENCODER), state=ONLINE)
    # their README and repository hold no result table or image: nothing published to cite
    published: tuple = ()
    offline_config = {"dino_pretrained": "none", "dino_model": "vit_small_patch14_reg4_dinov2"}
    random_weights_config = {"dino_pretrained": "none"}
    test_config = {"clip_shots": 2, "dino_shots": 2, "dino_model": None}

    @classmethod
    def frozen_encoder_identity(cls, config: Any) -> dict[str, Any] | None:
        """DINOv2's (`dino_identity`: the model, the checkpoint's SHA-256 or the random seed); None for the
        CLIP-only variant (dino_model=None)."""
        return None if config.dino_model is None else dino_identity(config)
