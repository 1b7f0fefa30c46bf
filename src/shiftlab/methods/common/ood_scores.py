"""The OOD score CLIPTTA's open-set methods record as their own (CLIPTTA and its OOD variant, UniEnt, OSTTA):
one view's cosine logits at a scale of their own, reduced as their `get_scores` does (MarcLafon/cliptta@f4221f4,
`ttavlm/methods/abstract_model.py:517-538`). The kinds, torch-free: `norm_config.SCORES`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..context import SampleContext
from ..outputs import MethodOutput
from .norm_adaptation import NormTTAMethod


def ood_scores(cosines: torch.Tensor, kind: str, scale: float) -> torch.Tensor:
    """(B, C) cosine logits -> (B,) their get_scores (abstract_model.py:517-538) of one view at `scale`
    (--ood_logit_scale): higher = more in-distribution."""
    logits = scale * cosines
    if kind == "max_prob":
        return logits.softmax(-1).max(-1).values
    if kind == "max_log_prob":
        return logits.softmax(-1).log().max(-1).values     # log of the softmax, as theirs (not log_softmax)
    if kind == "max_logit":
        return logits.max(-1).values
    if kind == "logsumexp":
        return logits.logsumexp(-1)
    probs = logits.softmax(-1)                              # "entropy": minus the entropy
    return (probs * probs.log()).sum(-1)


class OwnOODScoreMethod(NormTTAMethod):
    """A norm-adaptation method that records its own OOD score (its spec's `own_ood_score`): `adapt` puts it in each
    image's extras as "ood_score" (`scored_logits`), and every output carries it."""

    def scored_logits(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) -> the (B, C) logits through the tower as adapted and the (B,) scores of `config.score` at
        `config.ood_logit_scale`, both without gradients."""
        with torch.no_grad():
            cosines = self.encode(pixels) @ self.head.T
            return self.scale * cosines, ood_scores(cosines, self.config.score, self.config.ood_logit_scale)

    @staticmethod
    def scored_extras(scores: torch.Tensor, losses: Sequence[float],
                      per_image: Mapping[str, Sequence[Any]] | None = None, **batch: Any) -> list[dict[str, Any]]:
        """One extras dict per image of a batch: its OOD score (`scores`, (B,)), its `per_image` values ({name: one
        value per image}), the `batch` values, then the first and last update's losses (None where none ran)."""
        first, last = (losses[0], losses[-1]) if losses else (None, None)
        per_image = per_image or {}
        return [{"ood_score": float(score), **{k: v[i] for k, v in per_image.items()}, **batch, "loss": first,
                 "last_loss": last} for i, score in enumerate(scores)]

    def adapt_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        outs = super().adapt_batch(ctxs)
        for out in outs:
            out.ood_score = out.extras["ood_score"]
        return outs
