"""Straightforward transcriptions of each method's per-image procedure, for `shiftlab bench`.

This is the yardstick the library's speed is measured against, so it deliberately does
NOT use the library's shortcuts (shared view features, the truncated text tower, cached
class heads, batched tuning, a LoRA tower over shared weights) nor any of its method code. It
follows the authors' repositories (TPT/C-TPT/R-TPT: their `test_time_adapt_eval`; MTA: `solve_mta`;
zero-shot and the view ensemble: the TPT code base's model forward; TTL: its `test_time_adapt_eval`
with DeYO's step; RLCF: `tpt_cls_rl.py`), one image at a time:

- zeroshot: per image, encode view 0 and run the full 77-token text tower over the C prompts;
- prompt_ensemble: per image, encode view 0; once, 80 templates x C prompts (CLIP's notebook);
- view_ensemble: per image, encode all views and run the full text tower over the C prompts;
- tpt, ctpt: per tuning step, encode all views + the full text tower forward and backward;
  then, for the prediction, encode view 0 + the full text tower with the tuned context;
- rtpt: as tpt, but the prediction encodes all views again (the reliability weights need them);
- mta: per image, encode all views; once, the C prompts' text features (MTA's code precomputes them);
- ttl (`ttl.py`): per step, the text tower over the C prompts (no gradient) and every view through a LoRA
  copy of the image tower, forward and backward; then view 0 and the text tower again;
- rlcf (`rlcf.py`): TPT's student, except that later steps re-encode the selected views only, plus the
  reward model's image tower over the selected views once per image.

The learnable context of the TPT family is inserted into the full 77-token prompt
embeddings (TPT's `PromptLearner`), the text transformer runs over all 77 positions
(TPT's `TextEncoder`), and a fresh AdamW takes the step. Precision follows
the run: float32 on the CPU; on CUDA, with `precision="auto"`, fp16 autocast (and for the
tuning step a GradScaler(init_scale=1000)), as the authors run it.

Each baseline reads only hyper-parameters from the library method's config, so both
sides run the same method; `predict(views_u8)` returns what the library method's
`MethodOutput.logits` means for that method.
"""
from __future__ import annotations

from collections.abc import Sequence

from ...methods.base import MethodConfig
from ...models import ClipModel
from .core import (
    BaselineMethod,
    BaselineUnsupported,
    CTPTBaseline,
    MTABaseline,
    PromptEnsembleBaseline,
    RTPTBaseline,
    TPTBaseline,
    ViewEnsembleBaseline,
    ZeroShotBaseline,
    avg_entropy,
    encode_prompt_embeddings,
    pointwise_entropy,
    select_confident_samples,
)
from .rlcf import RLCFBaseline
from .ttl import TTLBaseline

__all__ = ["BASELINES", "BaselineMethod", "BaselineUnsupported", "avg_entropy", "create_baseline",
           "encode_prompt_embeddings", "pointwise_entropy", "select_confident_samples"]

BASELINES: dict[str, type[BaselineMethod]] = {
    cls.name: cls for cls in (ZeroShotBaseline, PromptEnsembleBaseline, ViewEnsembleBaseline, TPTBaseline,
                              CTPTBaseline, RTPTBaseline, MTABaseline, TTLBaseline, RLCFBaseline)}


def create_baseline(name: str, model: ClipModel, classnames: Sequence[str], config: MethodConfig | None = None,
                    precision: str = "auto") -> BaselineMethod:
    """The baseline of a registered method (hyper-parameters from `config`, the run's `precision`);
    KeyError if it has none."""
    return BASELINES[name](model, classnames, config, precision)
