"""OGA (Fuchs, Zanella & De Vleeschouwer, 2025, "Online Gaussian Adaptation of Vision-Language Models").

A memory of the lowest-entropy test features per zero-shot pseudo-label (a fixed number of shots per
class) gives a Gaussian model of each class (a mean per class, one shared covariance); each sample's
prediction is the maximum a posteriori class, with the zero-shot probabilities as the prior and the
Gaussian likelihoods (tempered by tau) as the evidence. Online, one feature per sample (view 0).
Authors' code: github.com/cfuchs2023/OGA (`OGA/OGA_core.py`, `runner.py`, `main.py`), cited below at
commit b91d449. What it is and every choice that differs from it: src/shiftlab/methods/oga/README.md.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..base import Method, MethodOutput
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import BatchMethod, OnlineMethod
from .spec import OGABatchSpec, OGASpec


def zero_shot(feature: torch.Tensor, prototypes: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One feature (D,), prototypes (C, D) -> (probabilities (C,) float64, entropy () float64), as
    float32 logits, then softmax and -sum p log(p + 1e-9) in float64 (runner.py:138-146)."""
    probs = (scale * feature @ prototypes.T).double().softmax(-1)     # (100 x f) @ P, as runner.py:138
    return probs, -(torch.log(probs + 1e-9) * probs).sum()


def class_means(memory: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """(K', S, D) float16 memory, (K', S) filled slots -> (K', D) float32: the mean over ALL S slots of the
    filled ones (empty slots count as zeros, OGA_core.py:86), in float16 as theirs, then float32."""
    return torch.mean(filled[..., None] * memory, dim=1).float()


def gaussian_log_likelihoods(x: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor,
                             precision_x: torch.Tensor) -> torch.Tensor:
    """x (D,), W = P mus^T (D, C), b = -diag(mus P mus^T) / 2 (C,), P x (D,) -> (C,) x^T P mu_c - mu_c^T P mu_c / 2
    - x^T P x / 2 (OGA_core.py:154-161)."""
    return x @ weights + bias - 0.5 * (x @ precision_x)


def map_posterior(prior: torch.Tensor, log_likelihoods: torch.Tensor, tau: float) -> torch.Tensor:
    """prior (C,) float64, log-likelihoods (C,) -> (C,) float64 z = prior * softmax(tau * ll), renormalised
    (get_MAP with simplex_p=True, lambda 1: OGA_core.py:163-190, runner.py:256)."""
    z = prior * (tau * log_likelihoods).softmax(-1)
    return z / z.sum()


class GaussianClassMemory(Method):
    """OGA's machinery, which OGA (a sample at a time) and OGABatch share: online Gaussian class models over a
    per-class memory of confident features, MAP with the zero-shot prior (training-free).

    Per sample (view 0's feature x): zero-shot probabilities p (the prior), their entropy H and pseudo-label k.
    If H is below the highest entropy stored for class k, x replaces that slot (float16, as theirs); then class
    k's mean is the mean of its slots once it holds >= 2, and once any class holds >= 3 the shared covariance's
    inverse P is re-estimated from every stored feature minus its class mean. The output is the posterior
    p * softmax(tau * log N(x | mu_c, P^-1)), renormalised, with the updated model (update, then predict).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.reset()

    def prototypes(self) -> torch.Tensor:
        """(C, D) float32 class prototypes: the text head, float16-rounded as theirs unless half_prototypes=False."""
        head = text_head(self)
        return head.half().float() if self.config.half_prototypes else head.float()

    def prepare(self) -> None:
        _ = self.prototypes()

    def reset(self) -> None:
        protos = self.prototypes()
        n, dim = protos.shape
        s, dev = self.config.shot_capacity, protos.device
        self.memory = torch.zeros(n, s, dim, dtype=torch.float16, device=dev)
        self.filled = torch.zeros(n, s, dtype=torch.bool, device=dev)
        # every empty slot's entropy is the largest possible, ln C, in float16 (OGA_core.py:31-37)
        self.entropies = torch.full((n, s), -math.log(1 / n), dtype=torch.float16, device=dev)
        self.soft_labels = torch.zeros(n, s, dtype=torch.float16, device=dev)
        self.means = protos.clone()
        # the stored features minus their class mean: sum of outer products and sum, in float64 (updated per class)
        self.scatter = torch.zeros(dim, dim, dtype=torch.float64, device=dev)
        self.offset_sum = torch.zeros(dim, dtype=torch.float64, device=dev)
        self.estimated = False       # P = d I until a class holds 3 features (OGA_core.py:20, 113)
        self.seen = 0
        self._refresh()

    # -- the algorithm -------------------------------------------------------------------------
    def _class_offsets(self, k: int) -> torch.Tensor:
        """(n_k, D) float64 offsets of class k's stored features from its mean, slot order."""
        return (self.memory[k][self.filled[k]].float() - self.means[k]).double()

    def store(self, x: torch.Tensor, prior: torch.Tensor, entropy: torch.Tensor, k: int) -> bool:
        """Put x in class k's memory if its entropy beats the class's worst slot (OGA_core.py:43-56); then
        class k's mean and the covariance statistics follow. Returns whether x was stored."""
        if not bool((entropy < self.entropies[k]).any()):
            return False
        before = self._class_offsets(k)
        slot = int(torch.argmax(self.entropies[k]))        # the first slot of the highest entropy
        self.memory[k, slot] = x
        self.entropies[k, slot] = entropy
        self.filled[k, slot] = True
        self.soft_labels[k, slot] = prior[k]
        if int(self.filled[k].sum()) >= 2:                 # OGA_core.py:87 (">= 2, was > 2")
            mean = class_means(self.memory[k:k + 1], self.filled[k:k + 1])[0]
            self.means[k] = mean / mean.norm() if self.config.normalize_mu else mean
        after = self._class_offsets(k)
        self.scatter.addmm_(after.T, after).addmm_(before.T, before, alpha=-1)
        self.offset_sum += after.sum(0) - before.sum(0)
        if not self.estimated and bool((self.filled.sum(1) > 2).any()):   # OGA_core.py:113
            self.estimated = True
        return True

    def scatter_matrix(self) -> torch.Tensor:
        """(D, D) float64 (n - 1) M: the scatter of the offsets about their mean."""
        n = int(self.filled.sum())
        mean = self.offset_sum / n
        return torch.addr(self.scatter, mean, mean, alpha=-n)

    def covariance(self) -> torch.Tensor:
        """(D, D) the covariance M of the offsets, centred on their mean, with n - 1 (OGA_core.py:114-127)."""
        return (self.scatter_matrix() / (int(self.filled.sum()) - 1)).float()

    def _uses_ridge(self) -> bool:
        cfg = self.config
        n, dim = int(self.filled.sum()), self.means.shape[1]
        return cfg.estimator == "ridge" or (cfg.estimator == "ridge-moore-penrose" and n <= 4 * dim)

    def _refresh(self) -> None:
        """The current model's discriminant, in one of two forms. Ridge: P = d A^-1 with A = (n - 1) M + tr(M) I
        positive definite (tr(M) > 0), so the authors' pseudo-inverse is the inverse (OGA_core.py:129-135); it
        is applied through A's Cholesky factor L, never formed: with y = L^-1 x and Y = L^-1 mus^T the
        likelihoods are d (y . Y_c - |Y_c|^2 / 2 - |y|^2 / 2). Otherwise P itself (d I before any estimate,
        OGA_core.py:20; the pseudo-inverse of M, OGA_core.py:140, 150) with W = P mus^T and b."""
        dim = self.means.shape[1]
        self._factor = self._precision = None
        if not self.estimated:
            self._weights = dim * self.means.T                              # P = d I
        elif self._uses_ridge():
            system = self.scatter_matrix().float()
            system.diagonal().add_(float(torch.trace(system)) / (int(self.filled.sum()) - 1))   # + tr(M) I
            self._factor = torch.linalg.cholesky(system)
            self._weights = torch.linalg.solve_triangular(self._factor, self.means.T, upper=False)   # Y (D, C)
            self._bias = -0.5 * dim * (self._weights * self._weights).sum(0)
            return
        else:
            self._precision = torch.linalg.pinv(self.covariance())
            self._weights = self._precision @ self.means.T
        self._bias = -0.5 * (self.means.T * self._weights).sum(0)

    def log_likelihoods(self, x: torch.Tensor) -> torch.Tensor:
        """(C,) log N(x | mu_c, P^-1) up to a constant, x (D,): x^T P mu_c - mu_c^T P mu_c / 2 - x^T P x / 2
        (get_log_probs, OGA_core.py:154-161)."""
        dim = self.means.shape[1]
        if self._factor is not None:
            y = torch.linalg.solve_triangular(self._factor, x[:, None], upper=False)[:, 0]
            return dim * (y @ self._weights) + self._bias - 0.5 * dim * (y @ y)
        px = dim * x if self._precision is None else self._precision @ x
        return gaussian_log_likelihoods(x, self._weights, self._bias, px)

    def precision_matrix(self) -> torch.Tensor:
        """(D, D) the inverse covariance the likelihoods use (their `inv_Sig`); not on the per-sample path."""
        dim = self.means.shape[1]
        if self._factor is not None:
            return dim * torch.cholesky_inverse(self._factor)
        return dim * torch.eye(dim, device=self.means.device) if self._precision is None else self._precision

    def step(self, x: torch.Tensor) -> dict[str, Any]:
        """One sample's feature (D,) -> its prior, entropy, pseudo-label, log-likelihoods and posterior; updates."""
        scale = self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale
        prior, entropy = zero_shot(x, self.prototypes(), scale)
        k = int(prior.argmax())
        stored = self.store(x, prior, entropy, k)
        if stored:
            self._refresh()
        self.seen += 1
        ll = self.log_likelihoods(x)
        return {"prior": prior, "entropy": entropy, "pseudo_label": k, "stored": stored, "log_likelihoods": ll,
                "posterior": map_posterior(prior, ll, self.config.tau)}

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        with torch.no_grad():
            s = self.step(ctx.base_feature.float())
        z = s["posterior"]
        logits = z.clamp_min(torch.finfo(z.dtype).tiny).log().float()
        return MethodOutput(logits, probs=z.float(), extras={"stored": s["stored"], "entropy": float(s["entropy"]),
                                                             "memory": int(self.filled.sum())})

    # -- online state --------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        slots = self.filled.nonzero()
        return {"seen": self.seen,
                "shot_capacity": self.config.shot_capacity, "slots": slots.cpu(),
                "features": self.memory[self.filled].cpu(), "entropies": self.entropies.cpu().clone(),
                "soft_labels": self.soft_labels[self.filled].cpu(), "means": self.means.cpu().clone(),
                "scatter": self.scatter.cpu().clone(), "offset_sum": self.offset_sum.cpu().clone(),
                "estimated": self.estimated}

    def load_state(self, state: dict[str, Any]) -> None:
        if state["shot_capacity"] != self.config.shot_capacity:
            raise ValueError(f"oga: state was saved with shot_capacity {state['shot_capacity']}, this run has "
                             f"{self.config.shot_capacity}")
        self.reset()
        dev = self.means.device
        k, s = state["slots"][:, 0].to(dev), state["slots"][:, 1].to(dev)
        self.filled[k, s] = True
        self.memory[k, s] = state["features"].to(dev, torch.float16)
        self.soft_labels[k, s] = state["soft_labels"].to(dev, torch.float16)
        self.entropies = state["entropies"].to(dev, torch.float16)
        self.means = state["means"].to(dev, torch.float32)
        self.scatter = state["scatter"].to(dev, torch.float64)
        self.offset_sum = state["offset_sum"].to(dev, torch.float64)
        self.estimated = bool(state["estimated"])
        self.seen = int(state["seen"])
        self._refresh()


class OGA(GaussianClassMemory, OnlineMethod):
    """OGA: online Gaussian class models over a per-class memory of confident features, MAP with the zero-shot
    prior (training-free), one sample at a time (`GaussianClassMemory`)."""
    spec = OGASpec


class OGABatch(GaussianClassMemory, BatchMethod):
    """OGA on batches (their benchmark's default): every image of the batch is offered to the memory in stream
    order, then the means and the covariance are re-estimated once and every image is predicted with them."""
    spec = OGABatchSpec

    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        with torch.no_grad():
            xs = [c.base_feature.float() for c in ctxs]
            scale = self.model.logit_scale if self.config.logit_scale is None else self.config.logit_scale
            priors = [zero_shot(x, self.prototypes(), scale) for x in xs]
            # update_memory: each image's memory decision in order, one re-estimate after (OGA_core.py:58-81)
            stored = [self.store(x, prior, entropy, int(prior.argmax())) for x, (prior, entropy) in zip(xs, priors)]
            if any(stored):
                self._refresh()
            self.seen += len(xs)
            outs = []
            for x, (prior, entropy), kept in zip(xs, priors, stored):
                z = map_posterior(prior, self.log_likelihoods(x), self.config.tau)
                outs.append(MethodOutput(z.clamp_min(torch.finfo(z.dtype).tiny).log().float(), probs=z.float(),
                                         extras={"stored": kept, "entropy": float(entropy),
                                                 "memory": int(self.filled.sum())}))
        return outs

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self.adapt_batch([ctx])[0]
