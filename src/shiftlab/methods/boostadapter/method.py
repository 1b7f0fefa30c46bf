"""BoostAdapter (Zhang et al., NeurIPS 2024, "BoostAdapter: Improving Vision-Language Test-Time
Adaptation via Regional Bootstrapping"; code: github.com/taolinzhang/BoostAdapter).

TDA's positive and negative caches of historical test samples (shiftlab.methods.common.tda_cache), plus, for
the sample at hand only, "boosting" entries: its most confident augmented views (the regional
bootstraps are the sample's own RandomResizedCrop + flip views, the ones every method reads),
each with its own pseudo-label and entropy. They join a copy of the positive cache whose classes
hold `delta` more entries; the read-out uses that copy, and the copy is dropped afterwards, so the
online state is TDA's two caches. Online: see docs/ONLINE.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..base import MethodOutput
from ..common.confidence import entropy, marginal_entropy, select_confident
from ..common.online_common import view_features
from ..common.tda_cache import Cache, CacheEntry, TDACacheMethod, TDASample, update_cache
from ..context import SampleContext
from ..head_kinds import text_head
from .spec import BoostAdapterSpec


@dataclass
class BoostSample:
    """A sample's TDA summary plus its boosting entries (k of them, lowest entropy first)."""
    sample: TDASample
    boost_views: torch.Tensor      # (k,) their view indices
    boost_features: torch.Tensor   # (k, D) normalised view features
    boost_labels: list[int]        # argmax of each view's logits
    boost_losses: list[float]      # entropy (nats) of each view's prediction


def fifo_update(cache: Cache, label: int, entry: CacheEntry, capacity: int) -> bool:
    """The negative cache's rule in BoostAdapter's code: `entry` joins the class `label` at the end;
    beyond `capacity` entries the oldest leaves (entries stay in arrival order). Returns True (stored)
    unless `capacity` < 1."""
    if capacity < 1:
        return False
    items = cache.setdefault(label, [])
    items.append(entry)
    if len(items) > capacity:
        del items[0]
    return True


def boosted_cache(cache: Cache, features: torch.Tensor, labels: list[int], losses: list[float],
                  capacity: int) -> Cache:
    """A copy of `cache` with the k boosting entries (features (k, D), labels, losses) added one by
    one under TDA's rule at `capacity` entries per class. `cache` itself is unchanged (only the
    classes touched get new lists; entries are shared)."""
    out = dict(cache)
    for label in set(labels):
        out[label] = list(cache.get(label, []))
    for feature, label, loss in zip(features, labels, losses):
        update_cache(out, label, CacheEntry(feature, loss), capacity)
    return out


class BoostAdapter(TDACacheMethod):
    """BoostAdapter: TDA's caches plus the sample's own confident views as boosting entries (online).

    Per sample: zero-shot logits of every view; the sample's feature, logits, entropy and pseudo-label
    as TDA's (`sample_view="confident"`) or from view 0 (`"original"`); the positive and negative
    caches updated as TDA's. The k = int(N * view_ratio) lowest-entropy views, each with its own
    argmax and entropy, are added to a copy of the positive cache holding pos_capacity + delta entries
    per class; output = logits + that boosted cache's logits - the negative cache's logits.
    """
    spec = BoostAdapterSpec

    def reset(self) -> None:
        super().reset()
        self.last_boosted: Cache = {}

    def summarize_boost(self, features: torch.Tensor) -> BoostSample:
        """Normalised view features (N, D) -> the sample's TDA summary and its boosting entries."""
        cfg = self.config
        features = features.float()
        scale = self.model.logit_scale if cfg.logit_scale is None else cfg.logit_scale
        view_logits = scale * features @ text_head(self).T
        kept = select_confident(view_logits, cfg.view_ratio)
        n = len(self.classnames)
        norm = math.log2(n) if cfg.entropy_norm == "log2" else math.log(n)
        if cfg.sample_view == "original":
            logits = view_logits[0]
            loss = float(entropy(logits))
            s = TDASample(features[0], logits, logits.softmax(-1), loss, loss / norm, int(logits.argmax()))
        else:
            sel = view_logits[kept]
            loss = float(marginal_entropy(sel))
            s = TDASample(features[kept].mean(0), sel.mean(0), sel.softmax(-1).mean(0), loss, loss / norm,
                          int(sel.mean(0).argmax()))
        boost = kept[:int(features.shape[0] * cfg.view_ratio)]
        b_logits = view_logits[boost]
        return BoostSample(s, boost, features[boost], b_logits.argmax(-1).tolist(), entropy(b_logits).tolist())

    def update(self, s: TDASample) -> None:
        """TDA's cache updates, with the negative cache's rule as `neg_rule` says."""
        cfg = self.config
        update_cache(self.pos_cache, s.pred, CacheEntry(s.feature, s.loss), cfg.pos_capacity)
        if cfg.neg_entropy_lower < s.norm_entropy < cfg.neg_entropy_upper:
            rule = fifo_update if cfg.neg_rule == "fifo" else update_cache
            rule(self.neg_cache, s.pred, CacheEntry(s.feature, s.loss, s.probs), cfg.neg_capacity)
        self.seen += 1

    def boosted(self, b: BoostSample) -> Cache:
        """The positive cache with the sample's boosting entries (pos_capacity + delta per class)."""
        return boosted_cache(self.pos_cache, b.boost_features, b.boost_labels, b.boost_losses,
                             self.config.pos_capacity + int(self.config.delta))

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            b = self.summarize_boost(view_features(ctx, self.config.views.n_views))
            self.update(b.sample)
            pos = self.boosted(b)
            # the read-out's cache, for inspection (not online state): a copy, since `pos` shares the classes no
            # boosting entry touched with the positive cache, which the next sample's update changes in place
            self.last_boosted = {label: list(entries) for label, entries in pos.items()}
            logits = self.readout(b.sample, pos)
        return MethodOutput(logits, extras={
            "norm_entropy": b.sample.norm_entropy,
            "pos_entries": sum(len(v) for v in self.pos_cache.values()),
            "neg_entries": sum(len(v) for v in self.neg_cache.values()),
            "boost_entries": sum(len(v) for v in pos.values())})
