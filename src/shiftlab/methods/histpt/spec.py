"""HisTPT (Zhang et al., NeurIPS 2024, "Historical Test-time Prompt Tuning for Vision Foundation Models") as TTABC
runs it (walawalagoose/TTABC `ttabc/model_selection/histpt.py`; the authors' own repository targets segmentation):
online prompt tuning whose pseudo-labels come from three memory banks of past class text features."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class HisTPTConfig(ViewMethodConfig):
    """TTABC's "histpt" entry (ttabc/configs/algorithms.py@999b436) over its main.py and load_model.py defaults."""
    steps: int = param(1, ge=1)                  # main.py --tta_steps default 1 (the entry sets none)
    lr: float = param(5e-3, ge=0)                # main.py --lr default 5e-3
    # load_model.py@810f708 _build_optimizer for "optimizer": "SGD": momentum getattr default 0.9, weight decay 1e-4
    momentum: float = param(0.9, ge=0, lt=1)
    weight_decay: float = param(1e-4, ge=0)
    # algorithms.py "histpt" "tpt": False ("false is original HisTPT setting"): tune on view 0 alone; True: every
    # view, the `selection_ratio` lowest-entropy ones in the loss (their TPT mode)
    tune_on_views: bool = False
    selection_ratio: float = param(0.1, gt=0, le=1)    # algorithms.py "histpt" selection_p 0.1 (tune_on_views only)
    memory_size: int = param(32, ge=1)           # algorithms.py "histpt" memory_size 32 (L = H = 32)
    hard_topk: int = param(16, ge=1)             # algorithms.py "histpt" hard_topk 16 (at most memory_size)
    ema_momentum: float = param(0.99, ge=0, le=1)   # algorithms.py "histpt" ema_momentum 0.99
    ctx_init: str = "a photo of a"               # algorithms.py "histpt" ctx_init a_photo_of_a, n_ctx 4
    loss_scale: float = param(1000.0, gt=0)      # base_method.py GradScaler(init_scale=1000), fp16 only
    # the shared "[SOT] context" prefix run once per context (exact up to float rounding; text.ContextPrompt)
    share_prefix: bool = True


class HisTPTSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    text_head = "prompt"
    # a short memory so that the banks fill and evict on the registry-wide tests' streams
    test_config = {"memory_size": 3, "hard_topk": 2}
