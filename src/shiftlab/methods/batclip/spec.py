"""BATCLIP (Maharana, Zhang, Karlinsky, Feris & Guo, ICCV 2025, "BATCLIP: Bimodal Online Test-Time Adaptation for
CLIP"), as its authors' code runs it.

Sources are cited as `file:line` of sarthaxxxxx/BATCLIP at ba2e338 (under `classification/`: `methods/ours.py`,
`utils/losses.py`, `models/model.py`, `methods/base.py`, `conf.py`, `cfgs/imagenet_c/ours.yaml`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, OPTIMIZERS, NormTTAConfig
from ..head_kinds import register_head

register_head("batclip_text", lambda cls, fields: (
    repr(fields.get("template", "a photo of a {}.")) + " through the text tower with the LayerNorms it adapts, "
    "recomputed for every batch"))


@dataclass
class BatclipConfig(NormTTAConfig):
    """cfgs/imagenet_c/ours.yaml over conf.py's defaults; the shared fields in `common/norm_config.py`."""
    steps: int = param(1, ge=1)                            # OPTIM.STEPS: 1 (ours.yaml:30)
    optimizer: str = param("adamw", choices=OPTIMIZERS)    # OPTIM.METHOD: AdamW (ours.yaml:29), base.py:168-172
    lr: float = param(5e-4, gt=0)                          # OPTIM.LR: 5e-4 (ours.yaml:28)
    weight_decay: float = param(0.01, ge=0)                # OPTIM.WD: 0.01 (ours.yaml:32)
    # torch's default: their setup_optimizer passes none (base.py:168-172)
    adam_eps: float = param(1e-8, gt=0)
    # CLIP.PROMPT_MODE custom, PROMPT_TEMPLATE ["a photo of a {}."] (ours.yaml:38-39): one template, whose features
    # the adapted text tower gives afresh for every batch (model.py:372-376)
    template: str = "a photo of a {}."
    # GradScaler(init_scale=1000) (ours.py:13): the loss scale of a step under fp16 (a CUDA run's default), halved
    # after a step whose gradients overflow (then skipped), doubled after 2000 finite ones; unused in fp32
    loss_scale: float = param(1000.0, gt=0)
    text_head: str = param("batclip_text", choices=("batclip_text",))


class BatclipSpec(MethodSpec):
    # the norms of both towers adapt on whole batches, carried from batch to batch (MODEL.EPISODIC False,
    # ours.yaml:26; their reset_each_shift resets per corruption, a run of its own here)
    capabilities = NORM_TTA
    # a small config for the registry-wide tests: a step that visibly moves the tiny models
    test_config = {"lr": 0.01}
