"""DynaPrompt (Xiao et al., ICLR 2025, "DynaPrompt: Dynamic Test-Time Prompt Tuning"): online prompt tuning"""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec, ViewMethodConfig

TIES = ("stable", "topk")


INTERSECTIONS = ("rank", "prompts")


@dataclass
class DynaPromptConfig(ViewMethodConfig):
    """DynaPrompt's ImageNet-R run (run_dynap.sh -> scripts/test_dynap.sh -> dynap_classification.py). Views:
    the shared 64 (scripts/test_dynap.sh:12 bs=64: the original + 63 crops; AugMix only on the fine-grained
    sets, dynap_classification.py:252-253, `dataset_values`)."""
    n_prompts: int = param(12, ge=2)          # run_dynap.sh:6 num_p=12 (with one prompt their selection is undefined)
    lr: float = param(5e-3, ge=0)             # run_dynap.sh:8 lr=0.005
    weight_decay: float = param(0.01, ge=0)   # dynap_classification.py:226 AdamW(trainable_param, args.lr): its default
    steps: int = param(1, ge=1)               # dynap_classification.py:472 --tta_steps default 1 (no script sets it)
    selection_ratio: float = param(0.1, gt=0, le=1)   # run_dynap.sh:7 selection_p=0.1 (int(64 * 0.1) = 6 views)
    ctx_init: str = "a photo of a"            # scripts/test_dynap.sh:13 ctx_init=a_photo_of_a (n_ctx 4 = its words)
    loss_scale: float = param(1000.0, gt=0)   # dynap_classification.py:230 GradScaler(init_scale=1000), fp16 only
    # dynap_classification.py:396: the reset of the least recently used prompt, off when the log name holds 'noapp'
    refresh: bool = True
    # the order of equal statistics (identical prompts: every fresh one): "stable" keeps the lower prompt index
    # first; "topk": torch.topk's order, as the authors' code (dynap_classification.py:119, 123), device-dependent
    ties: str = param("stable", choices=TIES)
    # "rank": the authors' ent_order[alllist] (dynap_classification.py:130); "prompts": the intersection itself
    intersection: str = param("rank", choices=INTERSECTIONS)
    # the shared "[SOT] context" prefix is run once per context (exact up to float rounding; text.ContextPrompt)
    share_prefix: bool = True


class DynaPromptSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    min_views = 2
    min_views_why = "its probability-difference statistic compares view 0 with the other views (one view: NaN)"
    # --protocol paper (ImageNet-R): TPT's fp16 autocast with GradScaler(init_scale=1000)
    # (dynap_classification.py:102, 230, 419) and torch.topk's order of equal statistics (:119, 123)
    text_head = "prompt"      # its prompts over the text tower (methods.head_kinds)
    # no refresh: from the fourth sample on every chosen prompt was tuned before, so each output depends on the
    # stream (a refreshed prompt alone is the initial context); the refresh across a state round trip is its own
    # test's
    test_config = {"n_prompts": 3, "refresh": False}
