"""DMN-ZS (Zhang et al., CVPR 2024, "Dual Memory Networks"), zero-shot variant.

The dynamic memory only (no training data, so no static memory and no learned projections):
per class, up to `memory_size` test features; the class's text feature and its memorised
features, weighted by exp(-beta (1 - similarity)) to the test feature, give an adaptive class
prototype whose prediction is mixed with the zero-shot prediction. Online: see docs/ONLINE.md. The
memory, which COSMIC reads too: methods/common/dmn_memory.py.
"""
from __future__ import annotations

from typing import Any

import torch

from ..base import MethodOutput
from ..common.confidence import lowest
from ..common.dmn_memory import DynamicMemory, memory_logits
from ..common.online_common import view_features
from ..context import SampleContext
from ..head_kinds import check_descriptions, text_head
from ..kinds import OnlineMethod
from .spec import DMNZeroShotSpec


class DMNZeroShot(OnlineMethod):
    """DMN-ZS: zero-shot Dual Memory Network (dynamic memory only), online.

    Per sample: softmax of every view's zero-shot logits (the `text_head`: 80 templates, or the
    authors' `tip_cupl`); the 10%
    lowest-entropy views' mean probability gives the pseudo-label and the entropy; the
    original view's feature is written into the pseudo-label's memory (replacing the
    highest-entropy slot of a full class when more confident). Then, with the updated
    memory, p = (p_zs + w * p_dyn) / (1 + w), with p_zs the original view's zero-shot
    probability and p_dyn the softmax of the memory readout; logits = log p.
    """
    spec = DMNZeroShotSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_descriptions(self.name, self.config, self.classnames)   # a missing CuPL file: before any sample
        self.reset()

    def prepare(self) -> None:
        _ = text_head(self)

    def reset(self) -> None:
        self.memory = DynamicMemory(len(self.classnames), self.config.memory_size)
        self.seen = 0

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        cfg = self.config
        with torch.no_grad():
            features = view_features(ctx, cfg.views.n_views).float()
            text = text_head(self)
            scale = self.model.logit_scale
            view_probs = (scale * features @ text.T).softmax(-1)
            # the authors' entropies: +1e-6 inside the log for views, +1e-8 for the mean
            view_entropy = -(view_probs * (view_probs + 1e-6).log()).sum(-1)
            kept = lowest(view_entropy, cfg.view_ratio)
            mean_prob = view_probs[kept].mean(0)
            label = int(mean_prob.argmax())
            h = float(-(mean_prob * (mean_prob + 1e-8).log()).sum())
            slot = self.memory.update(label, features[0], h)
            self.seen += 1
            p_dyn = memory_logits(features[0], self.memory, text, cfg.beta, scale).softmax(-1)
            probs = (view_probs[0] + cfg.dynamic_weight * p_dyn) / (1 + cfg.dynamic_weight)
            logits = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
        return MethodOutput(logits, probs=probs, extras={
            "pseudo_label": label, "stored": slot is not None, "memory_entries": len(self.memory)})

    def save_state(self) -> dict[str, Any]:
        return {"seen": self.seen,
                "memory": self.memory.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.memory = DynamicMemory.from_state(state["memory"], len(self.classnames), self.config.memory_size,
                                               self.model.device)
        self.seen = int(state["seen"])
