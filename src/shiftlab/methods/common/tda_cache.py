"""TDA's caches (Karmanov et al., CVPR 2024, "Efficient Test-Time Adaptation of Vision-Language Models"), the
machinery its family shares (TDA: methods/tda/; BoostAdapter: methods/boostadapter/). Its torch-free half, TDA's
config: tda_cache_config.py.

A positive cache (per class, the lowest-entropy test features) and a negative cache
(features of moderately uncertain samples, with a mask of the classes they found
plausible), read out with the affinity function exp(-beta (1 - affinity)) and added to /
subtracted from the zero-shot logits. Online: see docs/ONLINE.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..base import MethodOutput
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import OnlineMethod
from .confidence import marginal_entropy, select_confident
from .online_common import view_features


@dataclass
class CacheEntry:
    """One cached test sample: its feature (D,), its entropy (the ranking key, lower is more
    confident) and, in the negative cache, its mean probability over the selected views (C,)."""
    feature: torch.Tensor
    loss: float
    probs: torch.Tensor | None = None


Cache = dict[int, list[CacheEntry]]


def update_cache(cache: Cache, label: int, entry: CacheEntry, capacity: int) -> bool:
    """TDA's cache rule for the class `label`; returns whether `entry` was stored.

    A class holds at most `capacity` entries, kept sorted by loss (ascending). A new entry
    joins while there is room; once the class is full it replaces the last (highest-loss)
    entry only if its loss is strictly lower. Sorting is stable: an entry whose loss ties
    an older one goes after it, so on a full class an equal loss never evicts anything.
    """
    if capacity < 1:
        return False
    items = cache.setdefault(label, [])
    if len(items) < capacity:
        items.append(entry)
    elif entry.loss < items[-1].loss:
        items[-1] = entry
    else:
        return False
    items.sort(key=lambda e: e.loss)
    return True


def cache_logits(feature: torch.Tensor, cache: Cache, alpha: float, beta: float, num_classes: int,
                 mask_range: tuple[float, float] | None = None) -> torch.Tensor:
    """alpha * A @ V for one feature (D,) -> (C,), with A = exp(-beta (1 - feature . keys)).

    Keys are the cached features, class by class (ascending), each class in its cache
    order. Values: the one-hot pseudo-label (positive cache), or with `mask_range`
    (lower, upper) the mask lower < probs < upper of the entry's probabilities (negative cache).
    """
    entries = [(label, e) for label in sorted(cache) for e in cache[label]]
    if not entries:
        return feature.new_zeros(num_classes)
    keys_t = torch.stack([e.feature for _, e in entries]).to(feature)
    if mask_range is None:
        labels = torch.tensor([label for label, _ in entries], device=feature.device)
        values_t = torch.nn.functional.one_hot(labels, num_classes).to(feature)
    else:
        probs = torch.stack([e.probs for _, e in entries]).to(feature)
        values_t = ((probs > mask_range[0]) & (probs < mask_range[1])).to(feature)
    affinity = keys_t @ feature
    # beta * a - beta is bit-identical to the authors' -(beta - beta * a)
    return alpha * ((beta * affinity - beta).exp() @ values_t)


@dataclass
class TDASample:
    """What TDA derives from one sample before touching the caches."""
    feature: torch.Tensor       # (D,) mean feature of the selected views (not renormalised)
    logits: torch.Tensor        # (C,) mean zero-shot logits of the selected views
    probs: torch.Tensor         # (C,) mean probability of the selected views
    loss: float                 # entropy (nats) of `probs`
    norm_entropy: float         # loss normalised as `entropy_norm` says
    pred: int                   # argmax of `logits` (lowest index on ties)


class TDACacheMethod(OnlineMethod):
    """TDA's training-free dynamic adapter with positive and negative caches (online): TDA as it is, the base of
    the methods that build on its caches (BoostAdapter).

    Per sample: zero-shot logits of every view with the 80-template head; the 10%
    lowest-entropy views give the sample's feature (mean of their features), logits (mean
    of their logits), probabilities (mean of their softmax), entropy and pseudo-label.
    The positive cache is updated with (feature, entropy) under the pseudo-label; if the
    normalised entropy lies in (0.2, 0.5) the negative cache is too (with the mean
    probabilities). Then, with the updated caches, logits + positive cache logits -
    negative cache logits are the output (softmax gives the probabilities).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.reset()

    def prepare(self) -> None:
        _ = text_head(self)

    def reset(self) -> None:
        self.pos_cache: Cache = {}
        self.neg_cache: Cache = {}
        self.seen = 0

    # -- the algorithm -------------------------------------------------------------------------
    def summarize_sample(self, features: torch.Tensor) -> TDASample:
        """Normalised view features (N, D) -> the sample's feature, logits, entropy and pseudo-label."""
        features = features.float()
        scale = self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale
        view_logits = scale * features @ text_head(self).T
        kept = select_confident(view_logits, self.config.view_ratio)
        sel = view_logits[kept]
        probs = sel.softmax(-1).mean(0)
        logits = sel.mean(0)
        loss = float(marginal_entropy(sel))
        norm = math.log2(len(self.classnames)) if self.config.entropy_norm == "log2" else math.log(len(self.classnames))
        return TDASample(features[kept].mean(0), logits, probs, loss, loss / norm, int(logits.argmax()))

    def update(self, s: TDASample) -> None:
        cfg = self.config
        update_cache(self.pos_cache, s.pred, CacheEntry(s.feature, s.loss), cfg.pos_capacity)
        if cfg.neg_entropy_lower < s.norm_entropy < cfg.neg_entropy_upper:
            update_cache(self.neg_cache, s.pred, CacheEntry(s.feature, s.loss, s.probs), cfg.neg_capacity)
        self.seen += 1

    def readout(self, s: TDASample, pos_cache: Cache | None = None) -> torch.Tensor:
        """logits + the positive cache's logits - the negative cache's; `pos_cache` replaces the positive
        cache for this read-out only (BoostAdapter's boosted copy)."""
        cfg = self.config
        n = len(self.classnames)
        pos_cache = self.pos_cache if pos_cache is None else pos_cache
        out = s.logits.clone()
        if pos_cache:
            out += cache_logits(s.feature, pos_cache, cfg.pos_alpha, cfg.pos_beta, n)
        if self.neg_cache:
            out -= cache_logits(s.feature, self.neg_cache, cfg.neg_alpha, cfg.neg_beta, n,
                                (cfg.neg_mask_lower, cfg.neg_mask_upper))
        return out

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            s = self.summarize_sample(view_features(ctx, self.config.views.n_views))
            self.update(s)
            logits = self.readout(s)
        return MethodOutput(logits, extras={
            "norm_entropy": s.norm_entropy,
            "pos_entries": sum(len(v) for v in self.pos_cache.values()),
            "neg_entries": sum(len(v) for v in self.neg_cache.values())})

    # -- online state --------------------------------------------------------------------------
    @staticmethod
    def _cache_state(cache: Cache, with_probs: bool) -> dict[str, Any]:
        entries = [(label, e) for label in sorted(cache) for e in cache[label]]
        state: dict[str, Any] = {
            "labels": [label for label, _ in entries],
            "losses": [e.loss for _, e in entries],
            "features": (torch.stack([e.feature for _, e in entries]).detach().cpu() if entries
                         else torch.zeros(0)),
        }
        if with_probs:
            state["probs"] = (torch.stack([e.probs for _, e in entries]).detach().cpu() if entries
                              else torch.zeros(0))
        return state

    def _load_cache(self, state: dict[str, Any], with_probs: bool) -> Cache:
        cache: Cache = {}
        dev = self.model.device
        for i, (label, loss) in enumerate(zip(state["labels"], state["losses"])):
            probs = state["probs"][i].to(dev, torch.float32) if with_probs else None
            cache.setdefault(int(label), []).append(
                CacheEntry(state["features"][i].to(dev, torch.float32), float(loss), probs))
        return cache

    def save_state(self) -> dict[str, Any]:
        return {"seen": self.seen,
                "positive": self._cache_state(self.pos_cache, False),
                "negative": self._cache_state(self.neg_cache, True)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.pos_cache = self._load_cache(state["positive"], False)
        self.neg_cache = self._load_cache(state["negative"], True)
        self.seen = int(state["seen"])
