"""DynaPrompt (Xiao et al., ICLR 2025, "DynaPrompt: Dynamic Test-Time Prompt Tuning"): online prompt tuning
over a buffer of prompts.

Source: github.com/zzzx1224/DynaPrompt at acd33cf (`dynap_classification.py` `test_time_tuning` and
`test_time_adapt_eval`, `clip/custom_clip_lessctx.py` `PromptLearner`, `run_dynap.sh`,
`scripts/test_dynap.sh`); line numbers below are of that commit.

State (kept along the stream): N prompts, each the initial context ("a photo of a") plus a residual that
starts at zero (`ctx`, custom_clip_lessctx.py:101, 214), their order of last use (`ctx_order`, the least
recently used first) and use counts (`ctx_use`). Per sample, for each tuning step:

1. once every prompt has been used, the least recently used one is reset to the initial context and marked
   unused (dynap_classification.py:394-400: "delete", then "append" a fresh prompt);
2. every prompt's mean view entropy and its probability-difference statistic (view 0's largest logit minus
   each other view's, averaged) rank the prompts (:110-123);
3. the "initial" prompt is the least recently used one; the selection is it plus, where some prompts both
   have lower entropy than it and are among the top `rank` by the statistic (`rank` its place in the entropy
   order), the prompts found by reading those prompts' indices as positions in the entropy order (:124-132,
   `ent_order[alllist]`; `--set dynaprompt.intersection=prompts` takes the prompts themselves);
4. each selected prompt moves to the end of the order and its count goes up (:136-140);
5. TPT's loss on the selected prompts: the 10% of views with the lowest entropy averaged over them, the
   entropy of their mean probability per prompt, averaged (:148-150); one AdamW step on the whole buffer
   (weight decay reaches every prompt's residual) with a fresh optimiser state per sample (:402).

The output is the mean over the selected prompts (a prompt selected twice counts twice) of view 0's logits
with the updated prompts (:423-426). Ties: see `ranking`.
"""
from __future__ import annotations

from typing import Any

import torch

from ...models.text import ContextPrompt
from ..base import MethodOutput
from ..common.confidence import entropy, lowest, marginal_entropy_as_tpt
from ..common.online_common import view_features
from ..context import SampleContext
from ..kinds import OnlineMethod
from .spec import DynaPromptSpec


def ranking(values: torch.Tensor, ties: str) -> list[int]:
    """Indices of `values` (N,) from the largest down. "stable": equal values keep the lower index first;
    "topk": torch.topk's order (unspecified for equal values, CPU and CUDA differ)."""
    if ties == "topk":
        return values.topk(values.shape[0]).indices.tolist()
    return torch.sort(values, descending=True, stable=True).indices.tolist()


def select_prompts(entropies: torch.Tensor, plpd: torch.Tensor, initial: int, ties: str = "stable",
                   intersection: str = "rank") -> list[int]:
    """The prompts one tuning step uses (dynap_classification.py:119-132), `initial` last; a prompt may
    appear twice (then it counts twice in the loss, the bookkeeping and the readout, as in their code)."""
    n = entropies.shape[0]
    ent_order, plpd_order = ranking(entropies, ties), ranking(plpd, ties)
    rank = ent_order.index(initial)
    lower = set(ent_order[min(rank + 1, n - 1):])        # the clamp keeps `initial` itself when it ranks last
    both = sorted(lower.intersection(plpd_order[:rank]))
    if not both:
        return [initial]
    return ([ent_order[j] for j in both] if intersection == "rank" else both) + [initial]


class DynaPrompt(OnlineMethod):
    """DynaPrompt: a buffer of prompts tuned along the stream; per sample TPT's loss on the prompts its
    entropy and probability-difference rules select, the least recently used prompt reset once all are used."""
    spec = DynaPromptSpec


    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        if not cfg.ctx_init.strip():
            raise ValueError(f"{self.name}.ctx_init: empty; the context is initialised from its words' embeddings "
                             "(the authors': 'a photo of a')")
        self.prompt = ContextPrompt(self.model, self.classnames, ctx_init=cfg.ctx_init, share_prefix=cfg.share_prefix)
        self.prompt.ctx.requires_grad_(False)
        self.last: dict[str, Any] = {}
        self.reset()

    def reset(self) -> None:
        n = self.config.n_prompts
        self.residuals = torch.zeros(n, *self.prompt.init_ctx.shape, device=self.model.device)
        self.order = list(range(n))       # least recently used first (their ctx_order)
        self.uses = [0] * n               # their ctx_use
        self.seen = 0

    # -- the computation -------------------------------------------------------------------------------
    def _view_logits(self, features: torch.Tensor, residuals: torch.Tensor) -> torch.Tensor:
        """(V, D) view features and (k, n_ctx, W) residuals -> (V, k, C) float32 logits, the text tower under the
        method's precision."""
        with self.precision.autocast():
            text = self.prompt.features(self.prompt.init_ctx + residuals)
            logits = self.model.logit_scale * torch.einsum("vd,kcd->vkc", features.to(text.dtype), text)
        return logits.float()

    @staticmethod
    def groups(residuals: torch.Tensor) -> torch.Tensor:
        """(N,) for each prompt the lowest index of a prompt with a bit-equal residual (-0.0 equals 0.0)."""
        flat = residuals.flatten(1)
        return (flat[:, None] == flat[None]).all(-1).int().argmax(1)

    def statistics(self, features: torch.Tensor, residuals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each prompt's mean view entropy and probability-difference statistic (N,), (N,). Identical prompts
        (every fresh one; prompts tuned together from equal states) are evaluated once, so their statistics are
        exactly equal, as the authors' batched forward gives them."""
        first = self.groups(residuals)
        distinct = torch.unique(first)
        logits = self._view_logits(features, residuals[distinct])            # (V, U, C)
        ent = entropy(logits).mean(0)
        top = logits.max(-1).values
        plpd = (top[0] - top[1:]).mean(0)
        where = torch.searchsorted(distinct, first)
        return ent[where], plpd[where]

    def loss_and_grad(self, features: torch.Tensor, residuals: torch.Tensor, chosen: list[int], scale: float
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """TPT's loss on the chosen prompts (with their multiplicity): the confident views by entropy averaged
        over the prompts, per prompt the entropy of their mean probability, averaged. Returns the gradient of
        the loss times `scale` on the whole buffer (N, n_ctx, W), zero for the other prompts, and the loss,
        views, per-prompt terms and the chosen prompts' (V, k, C) view logits.

        Bit-equal prompts share one text forward; each gets its share (its multiplicity over the group's) of
        the group's gradient, which is its own gradient, so prompts tuned together stay bit-equal as in the
        authors' code."""
        first = self.groups(residuals)
        reps = sorted({int(first[p]) for p in chosen})
        leaf = residuals[reps].clone().requires_grad_(True)
        with torch.enable_grad():
            logits = self._view_logits(features, leaf)[:, [reps.index(int(first[p])) for p in chosen]]   # (V, k, C)
            views = lowest(entropy(logits.detach()).mean(-1), self.config.selection_ratio)
            terms = marginal_entropy_as_tpt(logits[views].transpose(0, 1))
            loss = terms.mean()
            (group_grad,) = torch.autograd.grad(loss * scale, leaf)
        grad = torch.zeros_like(residuals)
        for p in set(chosen):
            group = [q for q in chosen if int(first[q]) == int(first[p])]
            grad[p] = group_grad[reps.index(int(first[p]))] * (chosen.count(p) / len(group))
        return grad, {"loss": loss.detach(), "views": views, "terms": terms.detach(), "logits": logits.detach()}

    def step(self, features: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """One sample's views (V, D) -> its logits (C,) and extras; updates the buffer."""
        cfg = self.config
        refreshed = -1
        if cfg.refresh and min(self.uses) > 0:
            refreshed = self.order[0]
            self.uses[refreshed] = 0
            self.residuals[refreshed] = 0
        residuals = torch.nn.Parameter(self.residuals.clone())
        optimizer = torch.optim.AdamW([residuals], lr=cfg.lr, weight_decay=cfg.weight_decay)
        scale = cfg.loss_scale if self.precision.loss_scaling else 1.0
        steps = []
        for _ in range(cfg.steps):
            ent, plpd = self.statistics(features, residuals.detach())
            chosen = select_prompts(ent, plpd, self.order[0], cfg.ties, cfg.intersection)
            for p in chosen:
                self.order.remove(p)
                self.order.append(p)
                self.uses[p] += 1
            grad, info = self.loss_and_grad(features, residuals.detach(), chosen, scale)
            residuals.grad = grad.div_(scale) if scale != 1.0 else grad
            steps.append({"entropy": ent, "plpd": plpd, "chosen": chosen, "grad": residuals.grad.clone(), **info})
            # GradScaler skips the whole step (weight decay included) when a gradient overflows
            if bool(torch.isfinite(residuals.grad).all()):
                optimizer.step()
        self.residuals = residuals.detach()
        first = self.groups(self.residuals)
        reps = sorted({int(first[p]) for p in chosen})
        logits = self._view_logits(features[:1], self.residuals[reps])[0]
        logits = logits[[reps.index(int(first[p])) for p in chosen]].mean(0)
        self.seen += 1
        self.last = {"refreshed": refreshed, "steps": steps}
        return logits, {"prompts": chosen, "loss": float(info["loss"]), "refreshed": refreshed,
                        "fresh": self.uses.count(0)}

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        features = view_features(ctx, self.config.views.n_views)
        with torch.no_grad():
            logits, extras = self.step(features)
        return MethodOutput(logits, extras=extras)

    # -- online state --------------------------------------------------------------------------------------
    def save_state(self) -> dict[str, Any]:
        return {"seen": self.seen,
                "residuals": self.residuals.detach().cpu().clone(), "order": list(self.order),
                "uses": list(self.uses)}

    def load_state(self, state: dict[str, Any]) -> None:
        residuals = state["residuals"]
        if tuple(residuals.shape) != tuple(self.residuals.shape):
            raise ValueError(f"{self.name}: state holds prompts of shape {tuple(residuals.shape)}, this config "
                             f"{tuple(self.residuals.shape)} (n_prompts, context tokens, width)")
        order, uses = [int(p) for p in state["order"]], [int(u) for u in state["uses"]]
        if sorted(order) != list(range(len(uses))) or len(uses) != self.config.n_prompts:
            raise ValueError(f"{self.name}: state's prompt order {order} is not a permutation of its "
                             f"{len(uses)} prompts")
        self.residuals = residuals.to(self.model.device, torch.float32).clone()
        self.order, self.uses, self.seen = order, uses, int(state["seen"])
