"""DPE (Zhang et al., NeurIPS 2024, "Dual Prototype Evolving for Test-Time Generalization of VLMs").

Two prototypes per class evolve along the stream: the textual one (the class head, a running average
of the per-sample adapted heads of confident samples) and the visual one (the mean of a TDA-style
priority cache of confident test features). Each sample also gets residuals on both, optimised for
one AdamW step from zero on the entropy of its prediction plus a text-image alignment loss, and
then dropped. Online: see docs/ONLINE.md. Source: github.com/zhangce01/DPE-CLIP at fecae5a
(`main_dpe.py` `run_test_dpe`, `utils.py`, `configs/*.yaml`); line numbers below are of that commit.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..common.confidence import marginal_entropy, select_confident
from ..common.online_common import view_features
from ..context import SampleContext
from ..head_kinds import check_descriptions, text_head
from ..kinds import OnlineMethod
from .spec import DPESpec


def adamw_first_step(param: torch.Tensor, grad: torch.Tensor, lr: float, weight_decay: float, eps: float,
                     betas: tuple[float, float] = (0.9, 0.999)) -> torch.Tensor:
    """One step of a freshly created torch.optim.AdamW (state empty), as its single-tensor update orders
    the operations: decay, first moments, bias corrections. Any shape; returns the new parameter."""
    beta1, beta2 = betas
    p = param * (1 - lr * weight_decay)
    exp_avg = torch.zeros_like(grad).lerp_(grad, 1 - beta1)
    exp_avg_sq = torch.zeros_like(grad).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2)).add_(eps)
    return p.addcdiv(exp_avg, denom, value=-lr / (1 - beta1))


def prediction_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits) (C,) -> (), evaluated as the authors' `avg_entropy` (utils.py:55-60)
    on one row: z - logsumexp(z), not log_softmax. The value is the same; the gradient of the top class
    of a confident prediction is a small difference of large terms, and this order gives theirs."""
    logp = logits - logits.logsumexp(-1, keepdim=True)
    avg = logp.unsqueeze(0).logsumexp(0)
    avg = avg.clamp(min=torch.finfo(avg.dtype).min)
    return -(avg * avg.exp()).sum(-1)


def info_nce(query: torch.Tensor, positive: torch.Tensor, temperature: float) -> torch.Tensor:
    """InfoNCE with in-batch negatives (info-nce-pytorch's `info_nce` without negative keys): rows
    normalised, logits q_i . p_j / T, cross-entropy on the diagonal, mean. (K, D), (K, D) -> ()."""
    q, p = F.normalize(query, dim=-1), F.normalize(positive, dim=-1)
    return F.cross_entropy(q @ p.T / temperature, torch.arange(len(q), device=q.device))


def cache_readout(feature: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, alpha: float, beta: float,
                  num_classes: int) -> torch.Tensor:
    """alpha * exp(-beta (1 - feature . key_k)) added to class labels_k: (D,), (K, D), (K,) -> (C,)."""
    weights = alpha * (beta * (keys @ feature) - beta).exp()
    return feature.new_zeros(num_classes).index_add(0, labels, weights)


class PrototypeCache:
    """DPE's (and TDA's) positive cache as tensors: per class up to S (feature, loss) entries sorted by
    loss, `features` (C, S, D) on the model's device, `losses` (C, S) float64 (+inf when empty) and
    `counts` (C,) on the CPU. The rule is `tda.update_cache`'s: join while there is room, else replace
    the last entry iff strictly lower; stable order (an equal loss goes after the older entries)."""

    def __init__(self, num_classes: int, capacity: int):
        self.capacity = capacity
        self.features: torch.Tensor | None = None
        self.losses = torch.full((num_classes, capacity), math.inf, dtype=torch.float64)
        self.counts = torch.zeros(num_classes, dtype=torch.int64)

    def add(self, label: int, feature: torch.Tensor, loss: float) -> bool:
        if self.features is None:
            self.features = feature.new_zeros(len(self.counts), self.capacity, feature.shape[-1])
        n = int(self.counts[label])
        if n < self.capacity:
            slot = n
            self.counts[label] += 1
        elif loss < float(self.losses[label, -1]):
            slot = self.capacity - 1
        else:
            return False
        self.losses[label, slot] = loss
        self.features[label, slot] = feature
        order = torch.sort(self.losses[label], stable=True).indices
        self.losses[label] = self.losses[label, order]
        self.features[label] = self.features[label, order.to(self.features.device)]
        return True

    def prototypes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K,) labels of the non-empty classes, ascending, and their (K, D) mean features."""
        labels = torch.nonzero(self.counts > 0).flatten()
        dev = self.features.device
        counts = self.counts[labels].to(dev, self.features.dtype)
        return labels.to(dev), self.features[labels.to(dev)].sum(1) / counts[:, None]

    def entries(self) -> tuple[list[int], list[float], torch.Tensor]:
        """Labels, losses and (E, D) features class by class (ascending), each class in cache order."""
        mask = torch.arange(self.capacity)[None, :] < self.counts[:, None]
        labels = torch.nonzero(mask)[:, 0]
        feats = self.features[mask.to(self.features.device)] if self.features is not None else torch.zeros(0)
        return labels.tolist(), self.losses[mask].tolist(), feats


class DPE(OnlineMethod):
    """DPE: evolving textual and visual class prototypes with per-sample residuals (online).

    Per sample: the 10% lowest-entropy views under the normalised evolved head W give the sample's
    feature f (their mean), logits z and pseudo-label; (f, normalised entropy) enters the cache under
    the pseudo-label; the visual prototypes are the cached classes' mean features. Residuals on W and
    on the prototypes (zero-initialised) take `steps` fresh AdamW steps on
    H(softmax(z + cache(f))) + align * InfoNCE(prototypes, their classes' text features). The output
    is the adapted head's logits of view 0 plus the adapted prototypes' cache logits. When its
    normalised entropy is below 0.1, W becomes the running average of itself and the adapted head.
    """
    spec = DPESpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        check_descriptions(self.name, cfg, self.classnames)
        self.last_residuals: tuple[torch.Tensor, torch.Tensor] | None = None
        self.reset()

    def prepare(self) -> None:
        _ = self.class_head()

    def reset(self) -> None:
        self.memory = PrototypeCache(len(self.classnames), self.config.pos_capacity)   # the visual prototypes
        self.text_global: torch.Tensor | None = None    # (C, D) evolved head, None: the initial one
        self.evolutions = 0                             # their num_avg
        self.seen = 0

    def class_head(self) -> torch.Tensor:
        """The initial (C, D) head; DPE's `templates` default to CLIP's 80 in every head."""
        return text_head(self)

    # -- the algorithm -------------------------------------------------------------------------
    @property
    def scale(self) -> float:
        return self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale

    def _norm(self, h: torch.Tensor) -> float:
        c = len(self.classnames)
        return float(h / (math.log2(c) if self.config.entropy_norm == "log2" else math.log(c)))

    def confident(self, features: torch.Tensor, head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (N, D) and a normalised head (C, D) -> the selected views' logits (k, C) and features (k, D)."""
        view_logits = self.scale * features @ head.T
        kept = select_confident(view_logits, self.config.view_ratio)
        return view_logits[kept], features[kept]

    def objective(self, sel_feats: torch.Tensor, feature: torch.Tensor, r_text: torch.Tensor,
                  keys: torch.Tensor, labels: torch.Tensor, r_keys: torch.Tensor) -> torch.Tensor:
        """The per-sample loss of the residuals (main_dpe.py:232-241): entropy of the adapted prediction
        (selected views' mean logits + cache logits) + align * InfoNCE(adapted prototypes, their text)."""
        cfg = self.config
        head = F.normalize(self.text_global + r_text, dim=-1)
        protos = F.normalize(keys + r_keys, dim=-1)
        logits = (self.scale * sel_feats @ head.T).mean(0)
        logits = logits + cache_readout(feature, protos, labels, cfg.pos_alpha, cfg.pos_beta, len(self.classnames))
        loss = prediction_entropy(logits)
        if cfg.align:
            loss = loss + cfg.align * info_nce(protos, head[labels], cfg.temperature)
        return loss

    def step(self, features: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """One sample's views (N, D) -> its final logits (C,) and extras; updates the cache and head."""
        cfg = self.config
        n_cls = len(self.classnames)
        if self.text_global is None:
            self.text_global = self.class_head().float().clone()
        head0 = F.normalize(self.text_global, dim=-1)
        sel_logits, sel_feats = self.confident(features, head0)
        feature = sel_feats.mean(0)
        pred = int(sel_logits.mean(0).argmax())
        h_cache = self._norm(marginal_entropy(sel_logits))
        self.memory.add(pred, feature, h_cache)
        labels, keys = self.memory.prototypes()
        r_text, r_keys = torch.zeros_like(self.text_global), torch.zeros_like(keys)
        with torch.enable_grad():
            for _ in range(cfg.steps):
                r_text.requires_grad_(True)
                r_keys.requires_grad_(True)
                loss = self.objective(sel_feats, feature, r_text, keys, labels, r_keys)
                g_text, g_keys = torch.autograd.grad(loss, (r_text, r_keys))
                r_text = adamw_first_step(r_text.detach(), g_text, cfg.lr_text, cfg.weight_decay, cfg.adam_eps)
                r_keys = adamw_first_step(r_keys.detach(), g_keys, cfg.lr_image, cfg.weight_decay, cfg.adam_eps)
        self.last_residuals = (r_text, r_keys)
        head = F.normalize(self.text_global + r_text, dim=-1)
        protos = F.normalize(keys + r_keys, dim=-1)
        if cfg.readout == "confident":
            sel, sel_out = self.confident(features, head)
            logits, f_out = sel.mean(0), sel_out.mean(0)
        else:
            f_out = features[0]
            logits = (self.scale * f_out) @ head.T
        logits = logits + cache_readout(f_out, protos, labels, cfg.pos_alpha, cfg.pos_beta, n_cls)
        h_final = self._norm(marginal_entropy(logits.unsqueeze(0)))
        evolved = h_final < cfg.evolve_threshold
        if evolved:     # main_dpe.py:292-293: a running average whose first step weighs the start by 1/2
            self.evolutions += 1
            k = self.evolutions
            self.text_global = self.text_global * (k / (k + 1)) + head * (1 / (k + 1))
        self.seen += 1
        return logits, {"norm_entropy": h_cache, "final_entropy": h_final, "evolved": bool(evolved),
                        "evolutions": self.evolutions, "cache_entries": int(self.memory.counts.sum())}

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            features = view_features(ctx, self.config.views.n_views).float()
            logits, extras = self.step(features)
        return MethodOutput(logits, extras=extras)

    # -- online state --------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        labels, losses, feats = self.memory.entries()
        return {"seen": self.seen,
                "evolutions": self.evolutions,
                "text_global": self.text_global.detach().cpu().clone() if self.text_global is not None
                else torch.zeros(0),
                "positive": {"labels": labels, "losses": losses,
                             "features": feats.detach().cpu().clone() if labels else torch.zeros(0)}}

    def load_state(self, state: dict[str, Any]) -> None:
        dev = self.model.device
        self.reset()
        pos = state["positive"]
        for i, (label, loss) in enumerate(zip(pos["labels"], pos["losses"])):
            # entries arrive in cache order, so appending keeps it (equal losses stay in their order)
            self.memory.add(int(label), pos["features"][i].to(dev, torch.float32), float(loss))
        text = state["text_global"]
        self.text_global = text.to(dev, torch.float32).clone() if text.numel() else None
        self.evolutions, self.seen = int(state["evolutions"]), int(state["seen"])
