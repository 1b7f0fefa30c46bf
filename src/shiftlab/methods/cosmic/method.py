"""COSMIC (Huang et al., CVPR 2025): Clique-Oriented Semantic Multi-space Integration, training-free and online.

Two spaces, each with an online memory of the stream's confident test features:
- CLIP: DMN's dynamic memory (per class up to `clip_shots` features, the mean feature of the most confident
  views, replaced by entropy) read by attention into one adaptive class centre per class;
- DINOv2: a TDA-style positive cache of view 0's DINOv2 feature (per class up to `dino_shots`, by the entropy
  of the CLIP prediction), whose class means are the class centres.
In each space a graph joins centres that are similar (its threshold bisected to a target average degree; with
`second_order`, an edge needs two common neighbours), its maximal cliques are the "semantic groups", and the
test feature reads the centres of the cliques nearest to it. The prediction is the zero-shot probability of
view 0 plus the weighted clique scores of both spaces. Online: see docs/ONLINE.md.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..common.dmn_memory import DynamicMemory
from ..common.online_common import view_features
from ..context import SampleContext
from ..frozen_encoder import FrozenEncoder
from ..head_kinds import check_descriptions, text_head
from ..kinds import OnlineMethod
from .dino import dino_features
from .spec import COSMICSpec

MAX_BISECTIONS = 500      # utils_cosmic.py make_max_cliques: build_graph_by_degree(..., tol=1e-2, max_iter=500)
DEGREE_TOLERANCE = 1e-2


# -- the pieces (each a small pure function over tensors) -------------------------------------------------------

def confident_mean(probs: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices (k,) of the k = max(1, int(N ratio)) lowest-entropy rows of probs (N, C), entropy with +1e-6
    inside the log (utils_cosmic.py select_confident_samples)."""
    ent = -(probs * (probs + 1e-6).log()).sum(-1)
    k = max(1, int(probs.shape[0] * ratio))
    return torch.argsort(ent)[:k]


def marginal_entropy_of(scores: torch.Tensor) -> float:
    """Their `avg_entropy` of one row (C,) read as logits: the entropy of softmax(scores)."""
    logp = scores - scores.logsumexp(-1)
    return float(-(logp * logp.exp()).sum())


def memory_centres(feature: torch.Tensor, memory: DynamicMemory, text: torch.Tensor, beta: float) -> torch.Tensor:
    """DMN's attention readout (DualMems.py get_image_pred, 'attn' with its zero biases): per class the stored
    features then the text feature, weighted by exp(-beta (1 - cos)), summed and L2-normalised: (C, D)."""
    values = text.unsqueeze(1)                                             # (C, 1, D)
    if memory.features is not None:
        values = torch.cat([memory.features.to(feature), values], dim=1)   # (C, M + 1, D); empty slots are 0
    weights = (beta * (values @ feature) - beta).exp()
    return F.normalize((weights.unsqueeze(-1) * values).sum(1), dim=-1)


def degree_threshold(sim: torch.Tensor, target_degree: float) -> float:
    """The similarity threshold bisected between sim's min and max until the graph `sim > t` (no self-loops)
    has an average degree within 1e-2 of `target_degree`, or after 500 steps (utils_cosmic.py
    build_graph_by_degree). The same sequence of thresholds as theirs (each compared in float32 with the
    float32 matrix, the degree a float32 count / n); the count above a threshold is read from the sorted
    off-diagonal entries (one sort, then a binary search per step) instead of an n x n comparison per step:
    with features as alike as random weights give, the tolerance is never met and all 500 steps run."""
    n = sim.shape[0]
    offdiag = sim[~torch.eye(n, dtype=torch.bool, device=sim.device)].sort().values
    low, high = sim.min().item(), sim.max().item()
    mid = (low + high) / 2
    for _ in range(MAX_BISECTIONS):
        mid = (low + high) / 2
        at_most = torch.searchsorted(offdiag, torch.tensor([mid], dtype=sim.dtype, device=sim.device), right=True)
        degree = (offdiag.numel() - at_most[0]).to(torch.float32) / n
        if abs(degree - target_degree) < DEGREE_TOLERANCE:
            break
        if degree < target_degree:
            high = mid
        else:
            low = mid
    return mid


def degree_graph(space: torch.Tensor, target_degree: float, second_order: bool) -> torch.Tensor:
    """The adjacency (n, n) float of `space`'s similarity graph at `degree_threshold`; with `second_order`,
    only the edges whose ends share at least two neighbours (make_max_cliques with is_SOG)."""
    sim = space @ space.T
    adj = (sim > degree_threshold(sim, target_degree)).float()
    adj.fill_diagonal_(0)
    if second_order:
        adj = ((adj * (adj @ adj)) > 1).float()
    return adj


def maximal_cliques(adj: torch.Tensor) -> list[list[int]]:
    """The graph's maximal cliques in networkx's order (`find_cliques`, their code's); an isolated node is a
    clique of its own. The graph is built as their `from_numpy_matrix` builds it (nodes 0..n-1, then the
    edges (u <= v) in row-major order), from the edge list rather than the dense matrix."""
    import networkx as nx
    graph = nx.Graph()
    graph.add_nodes_from(range(adj.shape[0]))
    graph.add_edges_from(torch.triu(adj).nonzero().tolist())
    cliques = [list(c) for c in nx.find_cliques(graph)]
    covered = {v for c in cliques for v in c}
    missing = [v for v in range(adj.shape[0]) if v not in covered]   # their rule; none: singletons are cliques
    if missing and not cliques:
        cliques.append([])
    for v in missing:
        cliques[0].append(v)
    return cliques


def clique_anchors(space: torch.Tensor, cliques: list[list[int]]) -> torch.Tensor:
    """(K, D): each clique's mean feature (not normalised)."""
    members = torch.tensor([v for c in cliques for v in c], device=space.device)
    which = torch.repeat_interleave(torch.arange(len(cliques), device=space.device),
                                    torch.tensor([len(c) for c in cliques], device=space.device))
    sums = space.new_zeros(len(cliques), space.shape[1]).index_add_(0, which, space[members])
    return sums / torch.bincount(which, minlength=len(cliques)).unsqueeze(1).to(space.dtype)


def clique_scores(feature: torch.Tensor, anchors: torch.Tensor, space: torch.Tensor, cliques: list[list[int]],
                  ratio: float, alpha: float, beta: float) -> torch.Tensor:
    """(n,): the nodes of the max(1, int(K ratio)) cliques whose anchors are nearest to `feature` score
    alpha exp(-beta (1 - cos(feature, node))), every other node 0 (utils_cosmic.py compute_clique_logits)."""
    k = max(1, int(len(cliques) * ratio))
    nearest = torch.topk(feature @ anchors.T, k=k).indices
    nodes = sorted({v for i in nearest.tolist() for v in cliques[i]})
    index = torch.tensor(nodes, device=space.device)
    scores = torch.zeros(space.shape[0], device=space.device, dtype=space.dtype)
    scores[index] = alpha * (beta * (space[index] @ feature) - beta).exp()
    return scores


def cache_update(cache: dict[int, list[tuple[torch.Tensor, float]]], label: int, feature: torch.Tensor,
                 loss: float, capacity: int) -> bool:
    """TDA's positive cache (utils_cosmic.py update_cache): append while the class has room, else replace its
    highest-loss entry when lower; entries sorted by loss. Returns whether the cache changed."""
    entries = cache.get(label)
    if entries is None:
        cache[label] = [(feature, loss)]
        return True
    updated = False
    if len(entries) < capacity:
        entries.append((feature, loss))
        updated = True
    elif loss < entries[-1][1]:
        entries[-1] = (feature, loss)
        updated = True
    entries.sort(key=lambda e: e[1])
    return updated


def cache_centres(cache: dict[int, list[tuple[torch.Tensor, float]]], n_classes: int, dim: int,
                  like: torch.Tensor) -> torch.Tensor:
    """(C, D): each class's mean cached feature, zeros for classes with none (make_prototype_features)."""
    centres = like.new_zeros(n_classes, dim)
    for label, entries in cache.items():
        centres[label] = torch.stack([f for f, _ in entries]).mean(0)
    return centres


class Graph:
    """One space's cliques and their anchors, rebuilt when the rule of their code says (cosmic_main.py:452)."""

    def __init__(self) -> None:
        self.cliques: list[list[int]] = []
        self.anchors: torch.Tensor | None = None

    def due(self, step: int, updated: bool, warmup: int, interval: int) -> bool:
        """Rebuild while the memory fills (every update up to C x shots samples), then every `interval`."""
        return (updated and step <= warmup) or (step % interval == 0 and step > warmup) or self.anchors is None

    def rebuild(self, space: torch.Tensor, degree: float, second_order: bool) -> None:
        self.cliques = maximal_cliques(degree_graph(space, degree, second_order))
        self.anchors = clique_anchors(space, self.cliques)

    def state(self) -> dict[str, Any]:
        return {"cliques": self.cliques, "anchors": None if self.anchors is None else self.anchors.cpu()}

    def load(self, state: dict[str, Any], device: torch.device) -> None:
        self.cliques = [list(map(int, c)) for c in state["cliques"]]
        self.anchors = None if state["anchors"] is None else state["anchors"].to(device, torch.float32)


class COSMIC(OnlineMethod):
    """COSMIC, online; `dino_model=None` is the CLIP-only variant (no DINOv2 cache, no DINOv2 cliques)."""
    spec = COSMICSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_descriptions(self.name, self.config, self.classnames)
        self._encoder: FrozenEncoder | None = None
        self.reset()

    def prepare(self) -> None:
        _ = text_head(self)
        if self.config.dino_model is not None:
            from .dino import load_dino
            load_dino(self.config, self.model.device)

    def loaded_weights(self) -> dict[str, Any]:
        """The DINOv2 checkpoint's SHA-256 (a --resume with another file is refused); None: random weights of
        dino_seed, or the CLIP-only variant (both said by the config)."""
        cfg = self.config
        if cfg.dino_model is None or cfg.dino_pretrained == "none":
            return {"dino_checkpoint_sha256": None}
        from .dino_checkpoint import weights_sha256
        return {"dino_checkpoint_sha256": weights_sha256(cfg.dino_pretrained)}

    def frozen_encoder(self) -> FrozenEncoder | None:
        """DINOv2 over view 0 (None: the CLIP-only variant): the engine encodes it once per sample, and a feature
        store holds it keyed by the checkpoint's digest (or the random seed) and the model."""
        cfg = self.config
        if self._encoder is None:
            identity = self.spec.frozen_encoder_identity(cfg)
            if identity is None:
                return None
            from .dino import encode_view0
            self._encoder = FrozenEncoder(identity, lambda view0: encode_view0(cfg, self.model.device, view0))
        return self._encoder

    def reset(self) -> None:
        c = len(self.classnames)
        self.memory = DynamicMemory(c, self.config.clip_shots)
        self.dino_cache: dict[int, list[tuple[torch.Tensor, float]]] = {}
        self.clip_graph, self.dino_graph = Graph(), Graph()
        self.seen = 0

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        cfg = self.config
        step = self.seen
        n_classes = len(self.classnames)
        with torch.no_grad():
            feats = view_features(ctx, cfg.views.n_views).float()
            text = text_head(self).float()
            scale = self.model.logit_scale
            probs = (scale * feats @ text.T).softmax(-1)                      # (N, C)
            kept = confident_mean(probs, cfg.view_ratio)
            mean_prob = probs[kept].mean(0)
            label = int(mean_prob.argmax())
            entropy = float(-(mean_prob * (mean_prob + 1e-8).log()).sum())
            stored = self.memory.update(label, F.normalize(feats[kept].mean(0), dim=-1), entropy) is not None
            centres = memory_centres(feats[0], self.memory, text, cfg.memory_beta)      # (C, D)
            p_zs = probs[0]
            p_mem = (scale * centres @ feats[0]).softmax(-1)
            combined = p_zs + p_mem
            cache_label, cache_loss = int(combined.argmax()), marginal_entropy_of(combined)

            clip_space = torch.cat([text, centres])                                     # (2C, D)
            if self.clip_graph.due(step, stored, n_classes * cfg.clip_shots, cfg.graph_interval):
                self.clip_graph.rebuild(clip_space, cfg.target_degree * cfg.clip_degree_factor, cfg.second_order)
            node_scores = clique_scores(feats[0], self.clip_graph.anchors, clip_space, self.clip_graph.cliques,
                                        cfg.clique_ratio, cfg.cache_alpha, cfg.cache_beta)
            clip_cliques = (node_scores[:n_classes] + node_scores[n_classes:]) / 2
            score = p_zs + cfg.clip_clique_weight * clip_cliques
            extras = {"pseudo_label": label, "stored": stored, "memory_entries": len(self.memory),
                      "clip_cliques": len(self.clip_graph.cliques)}
            if cfg.dino_model is not None:
                encoder = self.frozen_encoder()
                dino = dino_features(cfg, self.model.device, ctx, encoder.id)           # (d,)
                cached = cache_update(self.dino_cache, cache_label, dino, cache_loss, cfg.dino_shots)
                dino_space = cache_centres(self.dino_cache, n_classes, dino.shape[0], dino)
                if self.dino_graph.due(step, cached, n_classes * cfg.dino_shots, cfg.graph_interval):
                    self.dino_graph.rebuild(dino_space, cfg.target_degree, cfg.second_order)
                dino_cliques = clique_scores(dino, self.dino_graph.anchors, dino_space, self.dino_graph.cliques,
                                             cfg.clique_ratio, cfg.cache_alpha, cfg.cache_beta)
                score = score + cfg.dino_clique_weight * dino_cliques
                extras.update(dino_cached=cached, dino_cliques=len(self.dino_graph.cliques))
            self.seen += 1
            out_probs = score / score.sum()
            logits = out_probs.clamp_min(torch.finfo(out_probs.dtype).tiny).log()
        return MethodOutput(logits, probs=out_probs, extras=extras)

    def save_state(self) -> dict[str, Any]:
        cache = [(label, [f.cpu() for f, _ in entries], [loss for _, loss in entries])
                 for label, entries in sorted(self.dino_cache.items())]
        return {"seen": self.seen,
                "memory": self.memory.state_dict(),
                "dino_cache": cache, "clip_graph": self.clip_graph.state(), "dino_graph": self.dino_graph.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        device = self.model.device
        self.memory = DynamicMemory.from_state(state["memory"], len(self.classnames), self.config.clip_shots, device)
        self.dino_cache = {int(label): [(f.to(device, torch.float32), float(loss)) for f, loss in zip(feats, losses)]
                           for label, feats, losses in state["dino_cache"]}
        self.clip_graph.load(state["clip_graph"], device)
        self.dino_graph.load(state["dino_graph"], device)
        self.seen = int(state["seen"])
