"""TTC: test-time counterattacks on view 0, as `tau_thres_weighted_counterattacks` computes them
(github.com/Sxing2/CLIP-Test-time-Counterattacks@793fbff, code/test_time_counterattack.py:68-159).

Per image x in [0, 1] (the defaults: eps 4/255, step 1/255, 2 steps, tau 0.2, beta 2):

1. a random start d_0 ~ U(-eps, eps), clipped so that x + d_0 stays in [0, 1];
2. the ratio tau = |f(x + d_0) - f(x)| / |f(x)| of the image tower's raw embedding f (the "falsely stable"
   test: an adversarial image barely moves under noise);
3. `steps` signed-gradient ascent steps on |f(x + d) - f(x)|^2 from d_0, each clipped to the eps-ball and
   to [0, 1]: d_1 .. d_K;
4. tau < tau_thres: d = sum_k w_k d_k with w = softmax(beta k) (later steps weigh more); otherwise d = d_0;
5. the logits of x + d (zero-shot CLIP: normalised features against the class head).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from ..base import MethodOutput
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import TTCSpec

_SEED_SALT = 0x77C0_C7A7   # keeps the random start's stream apart from the views' and the attacks'


class Counterattack(NamedTuple):
    delta: torch.Tensor      # (N, 3, S, S) the perturbation added to the image
    ratio: torch.Tensor      # (N,) tau of the random start (NaN where not computed: eps 0 or no steps)
    weighted: torch.Tensor   # (N,) bool: the steps were weighted in (tau < tau_thres), else the random start


def random_start(shape: torch.Size, eps: float, seed: int, sample_id: int) -> torch.Tensor:
    """U(-eps, eps) of `shape` from a CPU generator seeded by (seed, sample id): the same on every device."""
    state = np.random.SeedSequence([int(seed), int(sample_id), _SEED_SALT]).generate_state(2, dtype=np.uint64)
    gen = torch.Generator().manual_seed(int(state[0] >> 1))
    return torch.empty(shape).uniform_(-eps, eps, generator=gen)


def step_weights(ratio: torch.Tensor, steps: int, tau_thres: float, beta: float) -> torch.Tensor:
    """(N,) ratios -> (N, steps + 1) weights of d_0 .. d_K: exp(beta k) normalised where tau_thres - ratio > 0,
    else all on d_0 (their lines 119 and 140-149, in their order of operations)."""
    sign = (tau_thres - ratio).sign()
    k = torch.arange(steps + 1, device=ratio.device).unsqueeze(0).expand(ratio.shape[0], -1)
    soft = torch.exp(sign.view(-1, 1) * k * beta)
    soft = soft / soft.sum(dim=1, keepdim=True)
    hard = torch.zeros_like(soft)
    hard[:, 0] = 1.0
    return torch.where(sign.unsqueeze(1) > 0, soft, hard)


def counterattack(embed: Callable[[torch.Tensor], torch.Tensor], x01: torch.Tensor, start: torch.Tensor, *,
                  eps: float, step_size: float, steps: int, tau_thres: float, beta: float) -> Counterattack:
    """The counterattack of images `x01` (N, 3, S, S) in [0, 1] from the random start `start` (same shape, in
    [-eps, eps]); `embed` maps images in [0, 1] to raw (unnormalised) image embeddings (N, D)."""
    nan = torch.full((x01.shape[0],), float("nan"), device=x01.device)
    no = torch.zeros(x01.shape[0], dtype=torch.bool, device=x01.device)
    if eps <= 0:
        return Counterattack(torch.zeros_like(x01), nan, no)
    lo, hi = -x01, 1 - x01
    d = torch.clamp(start.to(x01), lo, hi)
    if steps == 0:                                  # their "random noise" baseline (line 89)
        return Counterattack(d, nan, no)
    with torch.no_grad():
        ref = embed(x01)
        ref_norm = ref.norm(dim=-1)
    deltas = [d]
    ratio = nan
    for k in range(steps):
        d = d.detach().requires_grad_(True)
        emb = embed(x01 + d)
        if k == 0:                                  # tau of the random start (line 115-117)
            ratio = ((emb - ref).norm(dim=-1) / ref_norm).detach()
            if not bool(((tau_thres - ratio).sign() > 0).any()):
                # every image keeps its random start: their weights (1, 0, ..., 0) give d_0 exactly, so the
                # steps, which they compute anyway, are skipped (the usual case of a clean image)
                return Counterattack(deltas[0].detach(), ratio, no)
        loss = ((emb - ref) ** 2).sum(1).sum()
        (grad,) = torch.autograd.grad(loss, d)
        with torch.no_grad():
            d = torch.clamp(d + step_size * grad.sign(), -eps, eps)
            d = torch.clamp(d, lo, hi)
        deltas.append(d)
    weights = step_weights(ratio, steps, tau_thres, beta)
    delta = (weights.view(*weights.shape, 1, 1, 1) * torch.stack(deltas, dim=1)).sum(dim=1)
    return Counterattack(delta.detach(), ratio, (tau_thres - ratio).sign() > 0)


class TTC(EpisodicMethod):
    """Counterattack view 0 away from its own embedding, then classify it zero-shot."""
    spec = TTCSpec

    def head(self) -> torch.Tensor:
        template = self.config.template
        return self.heads.zeroshot if template is None else self.heads.templated([template])

    def prepare(self) -> None:
        _ = self.head()

    def embed(self, x01: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] -> raw float32 image embeddings (with gradient), as their `encode_image`."""
        x = self.model.normalize(x01)
        if self.model.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with self.precision.autocast():
            return self.model.clip.encode_image(x.to(self.model.input_dtype)).float()

    def counterattack(self, x01: torch.Tensor, sample_id: int) -> Counterattack:
        cfg = self.config
        start = random_start(x01.shape, cfg.eps, cfg.seed, sample_id)
        return counterattack(self.embed, x01, start, eps=cfg.eps, step_size=cfg.step_size, steps=cfg.steps,
                             tau_thres=cfg.tau_thres, beta=cfg.beta)

    def logits(self, x01: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] -> (N, C) zero-shot logits against the method's head."""
        with torch.no_grad():
            feats = torch.nn.functional.normalize(self.embed(x01), dim=-1)
        return self.model.logit_scale * feats @ self.head().float().T

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        if ctx.views is None:
            raise ValueError("ttc counterattacks view 0's pixels and needs them, not stored features")
        view = ctx.views[:1].float()
        x01 = view * self.model.std.to(view) + self.model.mean.to(view)
        result = self.counterattack(x01, 0 if ctx.sample_id is None else ctx.sample_id)
        return MethodOutput(self.logits(x01 + result.delta)[0])
