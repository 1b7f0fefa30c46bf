"""OnZeta (Qian & Hu, ECCV 2024, "Online Zero-Shot Classification with CLIP").

Two pieces of state learned along the stream from each test image's single feature:
a per-class dual variable `rho` that pushes the text prediction towards a uniform class
marginal (online label learning), and a vision proxy per class, started at the text head
and moved by one online gradient step of a cross-entropy towards the text label (online
proxy learning). The output mixes the proxy's and the text's predictions. Online: see
docs/ONLINE.md.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..common.online_common import FloatTextHead
from ..context import SampleContext
from ..kinds import OnlineMethod
from .spec import OnZetaSpec


def text_label(x: torch.Tensor, text: torch.Tensor, rho: torch.Tensor, tau_t: float) -> torch.Tensor:
    """OnZeta's text label: softmax(text @ x / tau_t) reweighted by exp(rho), renormalised.
    x (D,), text (C, D), rho (C,) -> (C,)."""
    t = F.softmax(text @ x / tau_t, dim=0) * torch.exp(rho)
    return t / t.sum()


def dual_step(rho: torch.Tensor, t: torch.Tensor, step: float, alpha: float) -> torch.Tensor:
    """Projected dual ascent on the class-marginal constraint: max(0, rho - step (t - alpha / C))."""
    return (rho - step * (t - alpha / rho.shape[0])).clamp_min(0)


def proxy_step(w: torch.Tensor, x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, step: float,
               tau_i: float) -> torch.Tensor:
    """One gradient step of the proxies w (C, D) on CE(softmax(w x / tau_i), t), rows renormalised."""
    return F.normalize(w - (step / tau_i) * torch.outer(v - t, x), dim=1)


class OnZeta(FloatTextHead, OnlineMethod):
    """OnZeta: online label learning (a dual variable per class) and online proxy learning (a vision
    proxy per class) on view 0's feature; output beta_t p_proxy + (1 - beta_t) p_text (training-free)."""
    spec = OnZetaSpec

    def reset(self) -> None:
        self.proxy: torch.Tensor | None = None   # (C, D); None: still the text head
        self.rho: torch.Tensor | None = None     # (C,); None: zeros
        self.seen = 0

    def weight(self, t: int) -> float:
        """The proxy's weight at the t-th sample (1-based)."""
        n = self.config.stream_length
        return self.config.beta if n is None else self.config.beta * math.sqrt(min(t / n, 1.0))

    def step(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One sample's feature (D,) -> (proxy prediction, text label), both (C,); updates the state."""
        cfg = self.config
        text = self.text()
        w = text.clone() if self.proxy is None else self.proxy
        rho = text.new_zeros(text.shape[0]) if self.rho is None else self.rho
        t_index = self.seen + 1
        t = text_label(x, text, rho, cfg.tau_t)
        v = F.softmax(w @ x / cfg.tau_i, dim=0)
        self.rho = dual_step(rho, t, cfg.cr / math.sqrt(t_index), cfg.alpha)
        self.proxy = proxy_step(w, x, v, t, cfg.cw / math.sqrt(t_index), cfg.tau_i)
        self.seen = t_index
        return v, t

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            beta = self.weight(self.seen + 1)
            v, t = self.step(ctx.base_feature.float())
            probs = t if self.config.output == "onlab" else beta * v + (1 - beta) * t
        # the scores are probabilities: their log is the logits (a class at exactly 0 stays finite)
        logits = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
        return MethodOutput(logits, probs=probs, extras={"beta": beta, "rho_max": float(self.rho.max())})

    # -- online state --------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        def cpu(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().cpu()
        return {"seen": self.seen,
                "proxy": cpu(self.proxy), "rho": cpu(self.rho)}

    def load_state(self, state: dict[str, Any]) -> None:
        dev = self.model.device
        self.proxy = None if state["proxy"] is None else state["proxy"].to(dev, torch.float32)
        self.rho = None if state["rho"] is None else state["rho"].to(dev, torch.float32)
        self.seen = int(state["seen"])
