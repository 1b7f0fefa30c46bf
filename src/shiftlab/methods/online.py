"""Online training-free methods that adapt along the test stream: TDA and DMN-ZS.

Both keep a memory of earlier test samples' image features, keyed by their
pseudo-labels, and read it out for every new sample. They are not episodic: the
engine feeds them one sample at a time in stream order (see docs/ONLINE.md), and
checkpoints their `state_dict()` with the records so `--resume` continues the same
stream with the same state.

- TDA (Karmanov et al., CVPR 2024, "Efficient Test-Time Adaptation of
  Vision-Language Models"): a positive cache (per class, the lowest-entropy test
  features) and a negative cache (features of moderately uncertain samples, with
  a mask of the classes they found plausible), read out with the affinity
  function exp(-beta (1 - affinity)) and added to / subtracted from the zero-shot
  logits.
- DMN-ZS (Zhang et al., CVPR 2024, "Dual Memory Networks"), zero-shot variant:
  the dynamic memory only (no training data, so no static memory and no learned
  projections): per class, up to `memory_size` test features; the class's text
  feature and its memorised features, weighted by exp(-beta (1 - similarity)) to
  the test feature, give an adaptive class prototype; its prediction is mixed with
  the zero-shot prediction.

Everything runs without gradients. Tie-breaking is deterministic everywhere:
stable sorts (ties keep the lower view or the older entry first), argmax returns
the lowest class index.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..context import SampleContext
from .base import Method, MethodConfig, MethodOutput, register_method
from .prompt_tuning import entropy, marginal_entropy

_STATE_VERSION = 1


def _select_views(view_logits: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices of the max(1, int(N * ratio)) lowest-entropy views; ties keep the lower view first."""
    k = max(1, int(view_logits.shape[0] * ratio))
    return torch.argsort(entropy(view_logits), stable=True)[:k]


def _text_head(method: Method) -> torch.Tensor:
    head = method.config.text_head
    if head == "ensemble":
        return method.heads.ensemble
    if head == "zeroshot":
        return method.heads.zeroshot
    raise ValueError(f"{method.name}: text_head must be 'ensemble' or 'zeroshot', got {head!r}")


def _first_views(ctx: SampleContext, n_views: int | None) -> torch.Tensor:
    feats = ctx.image_features
    return feats if n_views is None else feats[:n_views]


def _check_state(name: str, state: dict, num_classes: int) -> None:
    if state.get("version") != _STATE_VERSION:
        raise ValueError(f"{name}: unsupported state version {state.get('version')!r}")
    if state.get("num_classes") != num_classes:
        raise ValueError(f"{name}: state was saved for {state.get('num_classes')} classes, this run has {num_classes}")


# ---------------------------------------------------------------------------------------------
# TDA
# ---------------------------------------------------------------------------------------------

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
class TDAConfig(MethodConfig):
    """TDA's ImageNet-R hyperparameters, from the authors' `configs/imagenet_r.yaml` in
    github.com/kdiAAA/TDA (values read from verbatim copies of that file: positive
    shot_capacity 3, alpha 1.0, beta 8.0; negative shot_capacity 2, alpha 0.117, beta 1.0,
    entropy_threshold 0.2-0.5, mask_threshold 0.03-1.0). The view selection (10% lowest
    entropy, mean of their features and logits) and the entropy normalisation are those of
    `get_clip_logits` / `get_entropy` in the repository's `utils.py`; the classifier is
    `clip_classifier` over the 80 CLIP ImageNet templates (`datasets/imagenet_r.py`).
    """
    pos_capacity: int = 3              # positive cache: entries per class
    pos_alpha: float = 1.0
    pos_beta: float = 8.0
    neg_capacity: int = 2              # negative cache: entries per class
    neg_alpha: float = 0.117
    neg_beta: float = 1.0
    neg_entropy_lower: float = 0.2     # a sample enters the negative cache iff lower < H_norm < upper
    neg_entropy_upper: float = 0.5
    neg_mask_lower: float = 0.03       # negative pseudo-labels: classes with lower < p < upper
    neg_mask_upper: float = 1.0
    view_ratio: float = 0.1            # share of views (lowest entropy) averaged; at least one
    n_views: int | None = None         # use the first n views (None: all; the authors use 64)
    text_head: str = "ensemble"        # "ensemble": 80 templates (the authors'); "zeroshot": one template
    entropy_norm: str = "log2"         # H_norm = H (nats) / log2(C) as the authors' code; "ln": / ln(C)


@dataclass
class TDASample:
    """What TDA derives from one sample before touching the caches."""
    feature: torch.Tensor       # (D,) mean feature of the selected views (not renormalised)
    logits: torch.Tensor        # (C,) mean zero-shot logits of the selected views
    probs: torch.Tensor         # (C,) mean probability of the selected views
    loss: float                 # entropy (nats) of `probs`
    norm_entropy: float         # loss normalised as `entropy_norm` says
    pred: int                   # argmax of `logits` (lowest index on ties)


@register_method("tda")
class TDA(Method):
    """TDA: training-free dynamic adapter with positive and negative caches (online).

    Per sample: zero-shot logits of every view with the 80-template head; the 10%
    lowest-entropy views give the sample's feature (mean of their features), logits (mean
    of their logits), probabilities (mean of their softmax), entropy and pseudo-label.
    The positive cache is updated with (feature, entropy) under the pseudo-label; if the
    normalised entropy lies in (0.2, 0.5) the negative cache is too (with the mean
    probabilities). Then, with the updated caches, logits + positive cache logits -
    negative cache logits are the output (softmax gives the probabilities).
    """
    config_class = TDAConfig
    episodic = False
    summary = "TDA: online positive/negative feature caches over confident views (training-free)"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.config
        if cfg.entropy_norm not in ("log2", "ln"):
            raise ValueError(f"tda: entropy_norm must be 'log2' or 'ln', got {cfg.entropy_norm!r}")
        if not 0 < cfg.view_ratio <= 1:
            raise ValueError(f"tda: view_ratio must be in (0, 1], got {cfg.view_ratio}")
        self.reset()

    def prepare(self) -> None:
        _ = _text_head(self)

    def reset(self) -> None:
        self.pos_cache: Cache = {}
        self.neg_cache: Cache = {}
        self.seen = 0

    # -- the algorithm -------------------------------------------------------------------------
    def summarize_sample(self, features: torch.Tensor) -> TDASample:
        """Normalised view features (N, D) -> the sample's feature, logits, entropy and pseudo-label."""
        features = features.float()
        view_logits = self.model.logit_scale * features @ _text_head(self).T
        kept = _select_views(view_logits, self.config.view_ratio)
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

    def readout(self, s: TDASample) -> torch.Tensor:
        cfg = self.config
        n = len(self.classnames)
        out = s.logits.clone()
        if self.pos_cache:
            out += cache_logits(s.feature, self.pos_cache, cfg.pos_alpha, cfg.pos_beta, n)
        if self.neg_cache:
            out -= cache_logits(s.feature, self.neg_cache, cfg.neg_alpha, cfg.neg_beta, n,
                                (cfg.neg_mask_lower, cfg.neg_mask_upper))
        return out

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            s = self.summarize_sample(_first_views(ctx, self.config.n_views))
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

    def state_dict(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, "num_classes": len(self.classnames), "seen": self.seen,
                "positive": self._cache_state(self.pos_cache, False),
                "negative": self._cache_state(self.neg_cache, True)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state(self.name, state, len(self.classnames))
        self.pos_cache = self._load_cache(state["positive"], False)
        self.neg_cache = self._load_cache(state["negative"], True)
        self.seen = int(state["seen"])


# ---------------------------------------------------------------------------------------------
# DMN-ZS
# ---------------------------------------------------------------------------------------------

class DynamicMemory:
    """DMN's dynamic memory: per class up to `capacity` (feature, entropy) slots.

    Dense tensors (C, capacity, D) and (C, capacity) with a fill count per class, so
    the readout is one batched computation; empty slots hold zeros and add nothing.
    """

    def __init__(self, num_classes: int, capacity: int):
        if capacity < 1:
            raise ValueError(f"memory capacity must be at least 1, got {capacity}")
        self.num_classes, self.capacity = num_classes, capacity
        self.features: torch.Tensor | None = None         # (C, M, D), allocated on first insert
        self.entropies = torch.zeros(num_classes, capacity)
        self.counts = [0] * num_classes

    def _allocate(self, like: torch.Tensor) -> None:
        if self.features is None:
            self.features = like.new_zeros(self.num_classes, self.capacity, like.shape[-1])
            self.entropies = self.entropies.to(like.device)

    def __len__(self) -> int:
        return sum(self.counts)

    def update(self, label: int, feature: torch.Tensor, entropy_value: float) -> int | None:
        """Store (feature, entropy) under `label`; returns the slot used, or None.

        While the class has room the entry takes the next slot. When it is full, the entry
        replaces the slot with the highest entropy (the last such slot on ties) if its own
        entropy is strictly lower; otherwise it is dropped.
        """
        self._allocate(feature)
        n = self.counts[label]
        if n < self.capacity:
            slot = n
            self.counts[label] = n + 1
        else:
            ent = self.entropies[label]
            worst = float(ent.max())
            if not entropy_value < worst:
                return None
            slot = int(torch.nonzero(ent == worst).max())
        self.features[label, slot] = feature
        self.entropies[label, slot] = entropy_value
        return slot

    def state_dict(self) -> dict[str, Any]:
        labels, slots = [], []
        for c, n in enumerate(self.counts):
            labels += [c] * n
            slots += list(range(n))
        if labels:
            feats = self.features[labels, slots].detach().cpu()
            ents = self.entropies[labels, slots].detach().cpu()
        else:
            feats, ents = torch.zeros(0), torch.zeros(0)
        return {"capacity": self.capacity, "labels": labels, "features": feats, "entropies": ents}

    @classmethod
    def from_state(cls, state: dict[str, Any], num_classes: int, capacity: int,
                   device: torch.device) -> "DynamicMemory":
        if state["capacity"] != capacity:
            raise ValueError(f"dmn_zs: state has memory_size {state['capacity']}, config says {capacity}")
        mem = cls(num_classes, capacity)
        for i, label in enumerate(state["labels"]):
            feat = state["features"][i].to(device, torch.float32)
            mem._allocate(feat)
            slot = mem.counts[label]
            mem.features[label, slot] = feat
            mem.entropies[label, slot] = state["entropies"][i].to(device, torch.float32)
            mem.counts[label] = slot + 1
        return mem


def memory_logits(feature: torch.Tensor, memory: DynamicMemory, text_features: torch.Tensor, beta: float,
                  logit_scale: float) -> torch.Tensor:
    """DMN's similarity-weighted readout of the dynamic memory for one feature (D,) -> logits (C,).

    Per class the values are its memorised features followed by its text feature; each is
    weighted by exp(-beta (1 - cos(feature, value))), the weighted sum is normalised into an
    adaptive class prototype, and the logit is logit_scale x cos(prototype, feature).
    """
    values = text_features.unsqueeze(1)                       # (C, 1, D)
    if memory.features is not None:
        values = torch.cat([memory.features.to(feature), values], dim=1)   # (C, M + 1, D)
    weights = (beta * (values @ feature) - beta).exp()        # (C, M + 1); empty slots: value 0
    prototypes = torch.nn.functional.normalize((weights.unsqueeze(-1) * values).sum(1), dim=-1)
    return logit_scale * prototypes @ feature


@dataclass
class DMNConfig(MethodConfig):
    """DMN-ZS's ImageNet-R settings, from github.com/YBZh/DMN: `scripts/run.sh` (zero-shot
    block for A/V/R/K: `-b 32` views, `--selection_p 0.1`, `--memory_size 50`, `--beta 5.5`,
    `--text_prompt tip_cupl`) and `dmn_main.py` (`DualMem.update_memory_bank`,
    `get_image_pred` with `similarity_weighted`, `select_confident_samples`). The final
    prediction there is p_zs + w * p_dynamic with w grid-searched per dataset ON THE TEST
    LABELS; the only logged ImageNet-R value is w = 0.3 (`camera_ready_dmn_tf_shift_0.txt`,
    ViT-B/16), used here as a fixed default (ours: no label peeking).
    """
    memory_size: int = 50              # memory slots per class
    beta: float = 5.5                  # sharpening of exp(-beta (1 - similarity))
    view_ratio: float = 0.1            # share of views (lowest entropy) giving the pseudo-label
    n_views: int | None = 32           # use the first n views (the authors' 32: original + 31)
    dynamic_weight: float = 0.3        # w in p_zs + w * p_dynamic (authors: searched on test labels)
    text_head: str = "ensemble"        # authors: 7 Tip-Adapter templates + CuPL prompts (not shipped)


@register_method("dmn_zs")
class DMNZeroShot(Method):
    """DMN-ZS: zero-shot Dual Memory Network (dynamic memory only), online.

    Per sample: softmax of every view's zero-shot logits (80-template head); the 10%
    lowest-entropy views' mean probability gives the pseudo-label and the entropy; the
    original view's feature is written into the pseudo-label's memory (replacing the
    highest-entropy slot of a full class when more confident). Then, with the updated
    memory, p = (p_zs + w * p_dyn) / (1 + w), with p_zs the original view's zero-shot
    probability and p_dyn the softmax of the memory readout; logits = log p.
    """
    config_class = DMNConfig
    episodic = False
    summary = "DMN-ZS: online per-class memory of test features, attention readout (training-free)"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.config
        if not 0 < cfg.view_ratio <= 1:
            raise ValueError(f"dmn_zs: view_ratio must be in (0, 1], got {cfg.view_ratio}")
        if cfg.dynamic_weight < 0:
            raise ValueError(f"dmn_zs: dynamic_weight must be >= 0, got {cfg.dynamic_weight}")
        self.reset()

    def prepare(self) -> None:
        _ = _text_head(self)

    def reset(self) -> None:
        self.memory = DynamicMemory(len(self.classnames), self.config.memory_size)
        self.seen = 0

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        cfg = self.config
        with torch.no_grad():
            features = _first_views(ctx, cfg.n_views).float()
            text = _text_head(self)
            scale = self.model.logit_scale
            view_probs = (scale * features @ text.T).softmax(-1)
            # the authors' entropies: +1e-6 inside the log for views, +1e-8 for the mean
            view_entropy = -(view_probs * (view_probs + 1e-6).log()).sum(-1)
            k = max(1, int(features.shape[0] * cfg.view_ratio))
            kept = torch.argsort(view_entropy, stable=True)[:k]
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

    def state_dict(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, "num_classes": len(self.classnames), "seen": self.seen,
                "memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state(self.name, state, len(self.classnames))
        self.memory = DynamicMemory.from_state(state["memory"], len(self.classnames), self.config.memory_size,
                                               self.model.device)
        self.seen = int(state["seen"])
