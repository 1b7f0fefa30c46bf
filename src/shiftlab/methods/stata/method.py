"""StatA (Zanella, Fuchs, De Vleeschouwer & Ben Ayed, CVPR 2025, "Realistic Test-Time Adaptation of
Vision-Language Models").

A batch method (the episodic-batch protocol, docs/PROTOCOLS.md): the images of a batch are labelled
together by alternating (1) soft labels z from Gaussian class likelihoods (a mean and a diagonal covariance
per class), the zero-shot prior and a kNN Laplacian over the batch, and (2) the class means and variances
from z, each pulled towards its text-derived anchor by a weight that grows with the number of images
predicted in the class (the statistical anchor: a class absent from the batch keeps its zero-shot model).
No state crosses batches: their batch and online settings run the same solver, and differ in the streams
that make the batches (few classes per batch; a Dirichlet-correlated stream). Authors' code:
github.com/MaxZanella/StatA (`solvers/StatA.py`, `main.py`), cited below at commit eea8637. What it is and
every choice that differs: README.md in this folder.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..base import MethodOutput
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import BatchMethod
from .spec import StatAConfig, StatASpec

TEMPERATURE = 50.0      # update_z's fixed 1/50 on the log-scores and its 50 / (2 n_neighbors) (StatA.py:70, 78)
CHUNK = 2500            # init_cov's chunk of queries (StatA.py:129): its normalisation runs once per chunk

Record = Callable[[str, int, torch.Tensor], None]


def knn_affinity(features: torch.Tensor, n_neighbors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, D) unit features -> (idx (N, k), values (N, k)): each row's k most similar other rows and their
    cosines, the row itself (its first top-k entry) left out (build_affinity_matrix, StatA.py:14-28);
    k = min(n_neighbors, N - 1)."""
    k = min(n_neighbors, features.shape[0] - 1)
    affinity = features @ features.T
    idx = affinity.topk(k + 1, -1, largest=True).indices[:, 1:]
    return idx, affinity.gather(1, idx)


def graph_term(idx: torch.Tensor, values: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """(W^T + W) z for the sparse kNN matrix W (W_ij = values at j in idx_i): z (N, C) -> (N, C)."""
    w_z = (values[..., None] * z[idx]).sum(1)                                      # W z
    spread = (values[..., None] * z[:, None, :]).reshape(-1, z.shape[1])                     # W_ij z_i
    wt_z = torch.zeros_like(z).index_add_(0, idx.reshape(-1), spread)                       # W^T z
    return wt_z + w_z


def log_likelihoods(features: torch.Tensor, mu: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """-1/2 sum_d (x_d - mu_kd)^2 / cov_kd: features (N, D), mu (C, D), cov (C, D) -> (N, C) (Gaussian.forward,
    StatA.py:39-57), expanded into three matrix products instead of an (N, C, D) tensor."""
    inv = 1.0 / cov
    quad = (features * features) @ inv.T - 2.0 * features @ (mu * inv).T + (mu * mu * inv).sum(1)
    return -0.5 * quad


def weighted_squares(features: torch.Tensor, z: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """(C, D) sum_i z_ik (x_i - mu_k)^2 per class and dimension, as three matrix products."""
    mass = z.sum(0)
    return z.T @ (features * features) - 2.0 * mu * (z.T @ features) + mu * mu * mass[:, None]


def initial_covariance(features: torch.Tensor, z: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """(D,) sum_i sum_k z_ik (x_i - mu_k)^2 / N, computed per chunk of CHUNK queries and divided by N after
    each chunk, as init_cov does (StatA.py:126-146: for N > 2500 the earlier chunks are divided again)."""
    n = features.shape[0]
    cov = None
    for start in range(0, n, CHUNK):
        part = weighted_squares(features[start:start + CHUNK], z[start:start + CHUNK], mu).sum(0)
        cov = part if cov is None else cov + part
        cov = cov / n
    return cov


def update_z(ll: torch.Tensor, prior: torch.Tensor, z: torch.Tensor, graph: tuple[torch.Tensor, torch.Tensor],
             cov: torch.Tensor, cfg: StatAConfig) -> torch.Tensor:
    """`z_steps` rounds of z = prior^lambda exp((ll + graph term - 1/2 sum log cov) / 50), renormalised
    (update_z, StatA.py:67-80). All (N, C)."""
    log_det = 0.5 * cov.log().sum(1)
    weight = cfg.lambda_laplacian * (TEMPERATURE / (cfg.n_neighbors * 2))
    powered = prior ** cfg.lambda_y_hat
    for _ in range(cfg.z_steps):
        scores = ll + weight * graph_term(*graph, z) - log_det
        scores = scores - scores.max(1, keepdim=True).values
        z = powered * torch.exp(scores / TEMPERATURE)
        z = z / z.sum(1, keepdim=True)
    return z


def anchor_weights(z: torch.Tensor, alpha: float, soft: bool) -> torch.Tensor:
    """(C,) beta_k = n_k / (alpha + n_k), n_k the images predicted in class k (or sum z_k when soft)
    (update_beta, StatA.py:148-157)."""
    if soft:
        mass = z.sum(0)
        return mass / (alpha + mass)
    counts = torch.bincount(z.argmax(1), minlength=z.shape[1]).to(z.dtype)
    return counts / (alpha + counts + 1e-12)


def update_means(features: torch.Tensor, z: torch.Tensor, beta: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """(C, D) unit class means: the z-weighted mean, normalised, mixed with the anchor by beta, normalised
    (update_mu, StatA.py:83-91)."""
    mu = (z.T @ features) / z.sum(0)[:, None]
    mu = mu / mu.norm(dim=-1, keepdim=True)
    mu = beta[:, None] * mu + (1 - beta)[:, None] * anchors
    return mu / mu.norm(dim=-1, keepdim=True)


def update_covariances(features: torch.Tensor, z: torch.Tensor, beta: torch.Tensor, mu: torch.Tensor,
                       anchors: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """(C, D) diagonal covariances: z-weighted squared deviations from the new means, mixed by beta with the
    initial covariance plus the squared drift of the mean from its anchor (update_cov, StatA.py:94-122)."""
    cov = weighted_squares(features, z, mu) / z.sum(0)[:, None]
    drift = (anchors - mu) ** 2
    return beta[:, None] * cov + (1 - beta)[:, None] * (initial + drift)


def solve(features: torch.Tensor, prototypes: torch.Tensor, scale: float, cfg: StatAConfig,
          record: Record | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch: features (N, D) unit, prototypes (C, D) -> (zero-shot probabilities, z), both (N, C)
    (StatA_solver, StatA.py:165-234). `record(name, iteration, tensor)` sees every intermediate."""
    rec = record or (lambda name, t, value: None)
    prior = (scale * features @ prototypes.T).softmax(-1)
    z = prior.clone()
    mu = prototypes
    initial = initial_covariance(features, z, mu).expand(prototypes.shape[0], -1)
    rec("init_cov", 0, initial[0])
    cov = initial
    graph = knn_affinity(features, cfg.n_neighbors)      # a batch of one image: no neighbours, no graph term
    for t in range(cfg.max_iter + 1):
        ll = log_likelihoods(features, mu, cov)
        z = update_z(ll, prior, z, graph, cov, cfg)
        rec("z", t, z)
        if t == cfg.max_iter:
            break
        beta = anchor_weights(z, cfg.alpha, cfg.soft_beta)
        mu = update_means(features, z, beta, prototypes)
        cov = update_covariances(features, z, beta, mu, prototypes, initial)
        rec("beta", t, beta)
        rec("mu", t, mu)
        rec("cov", t, cov)
    return prior, z


class StatA(BatchMethod):
    """StatA: transductive Gaussian labelling of each batch with statistical anchors to the zero-shot class
    models (training-free; the episodic-batch protocol, `--batch-size B`, theirs 64)."""
    spec = StatASpec

    def prepare(self) -> None:
        _ = text_head(self)

    def reset(self) -> None:
        pass                        # nothing is carried from batch to batch

    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        features = torch.stack([c.base_feature.float() for c in ctxs])
        scale = self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale
        with torch.no_grad():
            prior, z = solve(features, text_head(self).float(), scale, self.config)
        out = []
        for p0, row in zip(prior, z):
            logits = row.clamp_min(torch.finfo(row.dtype).tiny).log()
            out.append(MethodOutput(logits, probs=row, extras={"batch": len(ctxs),
                                                                "zero_shot_pred": int(p0.argmax())}))
        return out

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self.adapt_batch([ctx])[0]
