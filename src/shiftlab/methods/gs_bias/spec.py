"""GS-Bias (Huang et al., ICML 2025, "GS-Bias: Global-Spatial Bias Learner for Single-Image Test-Time Adaptation
of Vision-Language Models").

Sources are cited as `file:line` of github.com/hzhxmu/GS-Bias at 0b62401 (run_gsbias.py `GSBias`, utils.py,
configs/imagenet_r.yaml, scripts/GSBias_Domain.sh)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, OWN_TOWER, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class GSBiasConfig(ViewMethodConfig):
    """GS-Bias as scripts/GSBias_Domain.sh runs `run_gsbias.GSBias` with configs/imagenet_r.yaml (the defaults)."""
    # imagenet_r.yaml:2 `alpha`: the global bias's step size (plain gradient descent, run_gsbias.py:90)
    alpha: float = param(50.0, ge=0)
    # imagenet_r.yaml:3 `beta`: the spatial bias's step size (run_gsbias.py:92)
    beta: float = param(1.0, ge=0)
    # imagenet_r.yaml:4 `K`: the patch tokens of view 0 whose logits the spatial loss reads (of ViT-B/16's 196)
    top_k: int = param(16, ge=1)
    # imagenet_r.yaml:5 `T`: at most this many steps
    steps: int = param(5, ge=1)
    # GSBias_Domain.sh `--selection_p 0.1`: the confident share of the views the global loss reads
    selection_p: float = param(0.1, gt=0, le=1)
    # run_gsbias.py:56-57 `r_g = r_s = 0.9`: each step's bias is 0.9 x the tuned bias + 0.1 x the previous step's
    momentum: float = param(0.9, ge=0, le=1)
    # run_gsbias.py:78-81: tuning stops once the global loss moved more than 25% from its first value
    stop_change: float = param(25.0, ge=0)
    # "zeroshot": "a photo of a {}." (the leaderboard's); "ensemble": CLIP's 80 templates (their
    # utils.clip_classifier over the dataset's templates; the paper protocol)
    text_head: str = param("zeroshot", choices=("zeroshot", "ensemble"))
    # None: the model's exp(logit_scale); run_gsbias.py:64, 67, 101 multiply by the literal 100
    logit_scale: float | None = param(None, gt=0)


class GSBiasSpec(MethodSpec):
    # the views' frozen features (the global bias) and view 0's patch tokens, which the frozen pooled features do
    # not hold: it runs the tower on view 0's pixels itself (the spatial bias)
    capabilities = Capabilities(reads=(FROZEN_FEATURES, OWN_TOWER), state=EPISODIC)
    # clip/model.py: a ViT's patch tokens through ln_post and proj; for RN50 their code reads layer3's unprojected
    # 1024-channel map against the 1024-d class head, which no other CLIP ResNet's widths allow
    towers = ("vit",)
    towers_why = "its spatial bias reads a ViT's patch tokens in the joint space (their RN50 path: an unprojected map)"
    # the tiny ViT has 16 patch tokens
    test_config = {"top_k": 4}
