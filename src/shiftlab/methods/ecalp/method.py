"""ECALP (Li et al., ICLR 2025, "Efficient and Context-Aware Label Propagation for Zero-/Few-Shot
Training-Free Adaptation of Vision-Language Model"), zero-shot mode.

A kNN graph over the class text features and every test feature seen so far; labels start at
one-hot on the text nodes and flow to the test nodes in a few propagation steps over the
symmetrically normalised graph. The graph is grown incrementally as the authors' code grows it
on a stream (`main.py` feeds the features seen so far plus the current one again, and
`utils/iterative_label_propagation.py` keeps each node's neighbour lists between calls): the
state grows with the stream. Online: see docs/ONLINE.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..common.online_common import FloatTextHead
from ..context import SampleContext
from ..kinds import OnlineMethod
from .spec import ECALPSpec


def feature_weights(text: torch.Tensor) -> torch.Tensor:
    """Per-dimension weights (D,): the text features' variance over classes, L2-normalised."""
    return F.normalize(text.var(dim=0), dim=0)


def reweighted_similarity(q: torch.Tensor, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(Nq, Nx) cosine similarity of the reweighted q rows (q * weights) to the plain x rows."""
    return F.normalize(q * weights, dim=1) @ F.normalize(x, dim=1).T


def top(scores: torch.Tensor, k: int, stable: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest per row, largest first; ties in column order (a stable sort), or with
    stable=False in `torch.topk`'s order (the authors' call: unspecified, CPU and CUDA differ)."""
    if not stable:
        return scores.topk(k, dim=1, largest=True)
    values, index = torch.sort(scores, dim=1, descending=True, stable=True)
    return values[:, :k], index[:, :k]


class Rows:
    """A growing (n, D) matrix with amortised O(D) appends (capacity doubles): `view()` is rows[:n]."""

    def __init__(self, like: torch.Tensor, rows: torch.Tensor | None = None):
        self.buf = like.new_empty(max(16, 0 if rows is None else 2 * rows.shape[0]), like.shape[-1])
        self.n = 0
        if rows is not None:
            self.buf[:rows.shape[0]] = rows
            self.n = rows.shape[0]

    def put(self, i: int, row: torch.Tensor) -> None:
        """Set row i (i <= n; i == n appends)."""
        if i >= self.buf.shape[0]:
            grown = self.buf.new_empty(2 * self.buf.shape[0], self.buf.shape[1])
            grown[:self.n] = self.buf[:self.n]
            self.buf = grown
        self.buf[i] = row
        self.n = max(self.n, i + 1)

    def view(self) -> torch.Tensor:
        return self.buf[:self.n]


@dataclass
class Graph:
    """The stream's graph after a sample: `features` (m, D) of the m samples seen; for each of the
    N = m + 1 image nodes (the samples, then the last sample again, as the authors' code feeds it)
    its kept image neighbours `knn_sim`/`knn_idx` (N, w), its text neighbours `text_sim`/`text_idx`
    (N, k_text) and its carried label `carry_val`/`carry_idx` (N,)."""
    features: torch.Tensor
    knn_sim: torch.Tensor
    knn_idx: torch.Tensor
    text_sim: torch.Tensor
    text_idx: torch.Tensor
    carry_val: torch.Tensor
    carry_idx: torch.Tensor


def image_neighbours(graph: Graph | None, weighted: torch.Tensor, new: torch.Tensor, k_image: int,
                     stable: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The image kNN lists after adding a sample. `weighted` (N, D): every node (the samples seen, then
    the new one twice) reweighted and normalised (`normalize(f * w)`); `new` (2, D): the two new nodes,
    normalised. Similarity of node n to a new node j: weighted[n] . new[j] (the authors' edge_reweighting
    weights the side that is not the new node). Returns the kept lists (N, w) and the first k of each
    (N, k) as (sim, idx) pairs.

    First sample: every node's k best over all nodes. Later: the old lists lose their last row (the
    previous duplicate), entries that pointed at index N-2 (which now is the new sample) drop to -1,
    and each old node may take the two new nodes; old nodes keep k + 1 or k + 2 candidates so that
    invalidated entries can be replaced. Only the new nodes' lists are computed over all nodes."""
    n = weighted.shape[0]
    k = min(k_image, n)
    if graph is None:
        sim, idx = top(weighted @ new.T, k, stable)
        return sim, idx, sim, idx
    cross = (weighted @ new.T).T                                          # (2, N): new node <- every node
    new_sim, new_idx = top(cross, k, stable)
    old_sim = graph.knn_sim.masked_fill(graph.knn_idx == n - 2, -1.0)[:-1]
    old_idx = graph.knn_idx[:-1]
    rows = n - 2
    ext_sim = torch.cat([old_sim, cross[:, :rows].T], dim=1)
    ext_idx = torch.cat([old_idx, torch.full((rows, 1), n - 2, dtype=old_idx.dtype, device=old_idx.device),
                         torch.full((rows, 1), n - 1, dtype=old_idx.dtype, device=old_idx.device)], dim=1)
    width = k + 1 if rows == k + 1 else (k + 2 if rows > k else k)
    kept_sim, order = top(ext_sim, width, stable)
    kept_idx = ext_idx.gather(1, order)
    used_sim, used_idx = kept_sim[:, :k], kept_idx[:, :k]
    more_sim, more_idx = top(cross, width, stable) if rows > k else (new_sim, new_idx)
    return (torch.cat([kept_sim, more_sim]), torch.cat([kept_idx, more_idx]),
            torch.cat([used_sim, new_sim]), torch.cat([used_idx, new_idx]))


def normalised_edges(idx: torch.Tensor, sim: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges of D^-1/2 (W + W^T) D^-1/2 from the image nodes' neighbour lists idx/sim (N, K) over the
    node set [C text nodes, N image nodes]: (2, E) indices and (E,) weights; zero weights dropped."""
    n, width = idx.shape
    src = (torch.arange(n, device=idx.device) + num_classes).repeat_interleave(width)
    dst, val = idx.flatten(), sim.flatten()
    keep = val != 0
    src, dst, val = src[keep], dst[keep], val[keep]
    src, dst, val = torch.cat([dst, src]), torch.cat([src, dst]), torch.cat([val, val])
    degree = torch.zeros(num_classes + n, dtype=val.dtype, device=val.device).index_add_(0, src, val)
    inv_sqrt = 1 / (degree.sqrt() + 1e-6)
    return torch.stack([src, dst]), inv_sqrt[src] * (val * inv_sqrt[dst])


def propagate(edges: torch.Tensor, weights: torch.Tensor, carried: torch.Tensor, num_classes: int,
              alpha: float, iterations: int) -> torch.Tensor:
    """Label propagation from one-hot text nodes: Y <- alpha W_img Y_all + (1 - alpha) Y_0, `iterations`
    times, with Y_0 = carried (N, C) the image nodes' start. Returns the image nodes' scores (N, C)."""
    n = carried.shape[0]
    rows = edges[0] >= num_classes
    # check_invariants: opting in explicitly (an O(nnz) bounds check) is what keeps torch from warning,
    # mid-progress-bar, that the checks are implicitly off
    w_img = torch.sparse_coo_tensor(torch.stack([edges[0, rows] - num_classes, edges[1, rows]]), weights[rows],
                                    (n, num_classes + n), check_invariants=True).coalesce()
    eye = torch.eye(num_classes, dtype=carried.dtype, device=carried.device)
    y = carried
    for _ in range(iterations):
        y = alpha * torch.sparse.mm(w_img, torch.cat([eye, y])) + (1 - alpha) * carried
    return y


class ECALP(FloatTextHead, OnlineMethod):
    """ECALP: label propagation over a growing kNN graph of text and test features (training-free)."""
    spec = ECALPSpec

    def reset(self) -> None:
        self.graph: Graph | None = None
        self._seen: Rows | None = None          # the samples' features (graph.features is its view)
        self._nodes: Rows | None = None         # every node (samples + duplicate), reweighted and normalised

    def _weights(self) -> torch.Tensor:
        text = self.text()
        if getattr(self, "_weights_of", None) is not text:
            self._weights_of, self._weights_val = text, feature_weights(text)
        return self._weights_val

    def _add(self, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append a sample: (the samples seen (m, D), all nodes reweighted (m + 1, D), the new pair (2, D))."""
        if self._seen is None:
            self._seen, self._nodes = Rows(feature[None]), Rows(feature[None])
        m = self._seen.n
        self._seen.put(m, feature)
        row = F.normalize((feature * self._weights())[None], dim=1)[0]
        self._nodes.put(m, row)                 # the new sample takes the previous duplicate's place
        self._nodes.put(m + 1, row)
        new = F.normalize(feature[None], dim=1).expand(2, -1)
        return self._seen.view(), self._nodes.view(), new

    def step(self, feature: torch.Tensor) -> torch.Tensor:
        """Add one sample's feature (D,) to the graph and propagate: its scores (C,)."""
        cfg, text, g = self.config, self.text(), self.graph
        c = text.shape[0]
        seen, weighted, new = self._add(feature)
        n = weighted.shape[0]
        stable = cfg.ties == "stable"
        knn_sim, knn_idx, im_sim, im_idx = image_neighbours(g, weighted, new, cfg.k_image, stable)
        new_text_sim, new_text_idx = top(feature[None] @ text.T, min(cfg.k_text, c), stable)
        if g is None:
            text_sim, text_idx = torch.cat([new_text_sim] * 2), torch.cat([new_text_idx] * 2)
        else:
            text_sim = torch.cat([g.text_sim[:-1], new_text_sim, new_text_sim])
            text_idx = torch.cat([g.text_idx[:-1], new_text_idx, new_text_idx])
        carried = torch.zeros(n, c, dtype=text.dtype, device=text.device)
        if g is not None:               # the previous duplicate's row and the two new rows start at 0
            carried[torch.arange(n - 2, device=text.device), g.carry_idx[:-1]] = g.carry_val[:-1]
        sim = torch.cat([im_sim, text_sim], dim=1) ** cfg.gamma
        idx = torch.cat([im_idx + c, text_idx], dim=1)
        edges, weights = normalised_edges(idx, sim, c)
        scores = propagate(edges, weights, carried, c, cfg.alpha, cfg.iterations)
        best_val, best_idx = scores.max(dim=1)
        self.graph = Graph(seen, knn_sim, knn_idx, text_sim, text_idx, best_val / cfg.carry_divisor, best_idx)
        return scores[-1]

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            scores = self.step(ctx.base_feature.float())
        return MethodOutput(self.config.logit_scale * scores, extras={"nodes": int(self.graph.features.shape[0])})

    # -- online state --------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        seen = 0 if self.graph is None else int(self.graph.features.shape[0])
        state: dict[str, Any] = {"seen": seen,
                                 "graph": None}
        if self.graph is not None:
            state["graph"] = {k: v.detach().cpu().clone() for k, v in vars(self.graph).items()}
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        g = state["graph"]
        held = 0 if g is None else int(g["features"].shape[0])
        if int(state["seen"]) != held:
            raise ValueError(f"ecalp: state says {state['seen']} samples seen but its graph holds {held}")
        dev = self.model.device
        self.reset()
        if g is not None:
            self.graph = Graph(**{k: v.to(dev) for k, v in g.items()})
            feats = self.graph.features
            self._seen = Rows(feats, feats)
            weighted = F.normalize(feats * self._weights(), dim=1)
            self._nodes = Rows(feats, torch.cat([weighted, weighted[-1:]]))
            self.graph.features = self._seen.view()
