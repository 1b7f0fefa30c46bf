"""TCA: token condensation in a CLIP ViT, steered by a per-class reservoir of class tokens, plus cache logits.

As its authors' `runner.run_test_tca` computes it (Jo-wang/TCA@0f846d6, runner.py, utils.py, clip/model.py), per
image (view 0, batch size 1):

1. the ViT runs with its `condense_blocks` condensing tokens (condense.py), steered by the class-token cache when
   there is one; its feature f (normalised) gives the zero-shot logits s f T^T, their entropy and the prediction;
2. (f, entropy, the L class tokens) joins the predicted class's reservoir; past `reservoir_size` the entry with the
   largest entropy + mean cosine of its mean class token to the class's others leaves; the class keeps its
   entries sorted by entropy;
3. once every class holds >= 2 entries, the cache is each class's mean class tokens (L per class);
4. logits = zero-shot logits + lambd sum_e exp(-beta (1 - a_e)) onehot(class_e), a_e = sum_l w_l cos(t_l, t_e,l)
   over the blocks, w = softmax(linspace(0, 1, L) / scale) — the reservoir as updated by this image.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...models.tower_tokens import tower_kind
from ..base import MethodOutput
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import OnlineMethod
from .condense import condensed_forward
from .spec import TCASpec


@dataclass
class Entry:
    """One reservoir entry: the normalised feature (D,), the zero-shot entropy (a 0-d float32 tensor) and the
    class tokens of every block (L, width)."""
    feature: torch.Tensor
    entropy: torch.Tensor
    tokens: torch.Tensor


def add_to_reservoir(entries: list[Entry], entry: Entry, size: int) -> list[Entry]:
    """runner.update_reservoir_sim (div and token_sim on): `entry` added; past `size` the entry with the largest
    entropy + mean cosine of its mean class token to the others removed (first on ties); sorted by entropy."""
    entries = [*entries, entry]
    if len(entries) > size:
        means = F.normalize(torch.stack([e.tokens.mean(dim=0) for e in entries]), dim=1)
        sim = means @ means.T
        mean_sim = (sim.sum(dim=1) - sim.diagonal()) / (len(entries) - 1)
        score = torch.stack([e.entropy for e in entries]).double() + mean_sim.double()
        entries.pop(int(score.argmax()))
    return sorted(entries, key=lambda e: float(e.entropy))


def layer_weights(depth: int, scale: float) -> torch.Tensor:
    """(L,) float64: exp(linspace(0, 1, L) / scale), normalised (runner.compute_reservoir_logits)."""
    w = (torch.linspace(0, 1, depth, dtype=torch.float64) / scale).exp()
    return w / w.sum()


def reservoir_logits(tokens: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, num_classes: int,
                     weights: torch.Tensor, lambd: float, beta: float) -> torch.Tensor:
    """Class tokens (L, W) of this image, reservoir tokens (E, L, W) with their classes (E,) -> (C,) float32:
    lambd sum_e exp(-beta (1 - a_e)) onehot(label_e), a_e the layer-weighted cosine of the class tokens."""
    affinity = (F.cosine_similarity(tokens.unsqueeze(0), keys, dim=-1).double() * weights).sum(dim=1).float()
    onehot = F.one_hot(labels, num_classes).float()
    return lambd * ((-(beta - beta * affinity)).exp() @ onehot)


def condense_blocks(blocks: tuple[int, ...] | None, depth: int, model: str) -> tuple[int, ...]:
    """The condensing blocks of a `depth`-block ViT: `blocks`, checked, or None's L/4, L/2, 3L/4; else a one-line
    ValueError."""
    if blocks is None:
        blocks = tuple(dict.fromkeys(depth * k // 4 for k in (1, 2, 3)))
    if not blocks or any(not 0 <= b < depth for b in blocks) or len(set(blocks)) != len(blocks):
        raise ValueError(f"tca.condense_blocks: {tuple(blocks)!r} must name distinct blocks of {model}'s ViT, "
                         f"0..{depth - 1} (None: blocks L/4, L/2, 3L/4, their (3, 6, 9) on 12 blocks)")
    return tuple(blocks)


class TCA(OnlineMethod):
    """TCA: a condensed ViT pass per image, its class tokens cached per class, zero-shot + reservoir logits."""
    spec = TCASpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        visual = self.model.clip.visual
        try:
            tower_kind(visual)
        except ValueError as exc:
            raise ValueError(f"tca: {self.model.name}: {exc}") from None
        self.depth = len(visual.transformer.resblocks)
        self.condense_blocks = condense_blocks(self.config.condense_blocks, self.depth, self.model.name)
        # where the first centre of each token clustering comes from (n tokens -> an index); None: `seed`'s
        # generator for the sample. A comparison with the authors' unseeded draws injects theirs here.
        self.first_centers: Callable[[int], int] | None = None
        self.reset()

    def reset(self) -> None:
        self.reservoir: list[list[Entry]] = [[] for _ in self.classnames]
        self.cache: torch.Tensor | None = None
        self.seen = 0

    def prepare(self) -> None:
        _ = text_head(self)

    def _refresh_cache(self) -> None:
        # model.py update_cls_token, called only once every class holds >= 2 entries (runner.py:69)
        if self.config.cls_cache and all(len(entries) > 1 for entries in self.reservoir):
            self.cache = torch.stack([torch.stack([e.tokens for e in entries]).mean(dim=0)
                                      for entries in self.reservoir])

    def _draw(self) -> Callable[[int], int]:
        if self.first_centers is not None:
            return self.first_centers
        gen = torch.Generator().manual_seed((self.config.seed * 1_000_003 + self.seen) % 2 ** 63)
        return lambda n: int(torch.randint(n, (1,), generator=gen))

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        cfg = self.config
        if ctx.views is None:
            raise ValueError("tca condenses the image tower's tokens and needs view 0's pixels, not stored features")
        image = ctx.views[:1].to(self.model.input_dtype)
        if self.model.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), self.precision.autocast():
            feature, tokens = condensed_forward(self.model.clip.visual, image, self.condense_blocks, cfg.drop_rate,
                                                cfg.merge_centers, self.cache, self._draw())
        feature, tokens = F.normalize(feature.float(), dim=-1)[0], tokens.float()[0]
        scale = cfg.logit_scale if cfg.logit_scale is not None else self.model.logit_scale
        logits = scale * feature @ text_head(self).float().T
        entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum()
        label = int(logits.argmax())
        self.reservoir[label] = add_to_reservoir(self.reservoir[label], Entry(feature, entropy, tokens),
                                                 cfg.reservoir_size)
        self._refresh_cache()
        self.seen += 1
        keys = torch.stack([e.tokens for entries in self.reservoir for e in entries])
        labels = torch.tensor([c for c, entries in enumerate(self.reservoir) for _ in entries])
        extra = reservoir_logits(tokens, keys, labels, len(self.classnames), layer_weights(self.depth, cfg.scale),
                                 cfg.lambd, cfg.beta)
        return MethodOutput(logits + extra.to(logits.device))

    def save_state(self) -> dict[str, Any]:
        entries = [(c, e) for c, es in enumerate(self.reservoir) for e in es]
        stack = (lambda f: torch.stack([f(e).cpu() for _, e in entries])) if entries else (lambda f: torch.zeros(0))
        return {"seen": self.seen,
                "labels": [c for c, _ in entries], "features": stack(lambda e: e.feature),
                "entropies": stack(lambda e: e.entropy), "tokens": stack(lambda e: e.tokens)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.reset()
        device = self.model.device
        for i, c in enumerate(state["labels"]):
            self.reservoir[int(c)].append(Entry(state["features"][i].to(device), state["entropies"][i].to(device),
                                                state["tokens"][i].to(device)))
        self._refresh_cache()
        self.seen = int(state["seen"])
