"""The OOD score CLIPTTA's open-set methods record as their own (its OOD variant, UniEnt, OSTTA): one view's
cosine logits at a scale of their own, reduced as their `get_scores` does (MarcLafon/cliptta@f4221f4,
`ttavlm/methods/abstract_model.py:517-538`). The kinds, torch-free: `norm_config.SCORES`."""
from __future__ import annotations

import torch


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
