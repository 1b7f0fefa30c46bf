"""ZERO (Farina et al. 2025, "Frustratingly Easy Test-Time Adaptation of VLMs"), training-free.

TPT's confidence filter followed by zero-temperature voting: keep the int(N * 0.3)
lowest-entropy views of the zero-shot view logits, let each cast one vote for its
argmax, predict the class with the most votes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base import MethodOutput
from ..common.confidence import lowest, n_selected, select_confident
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import ZeroSpec

# Share of the score given to the kept views' mean probability. It is kept below the
# worth of one vote, so it only orders classes with equal votes (the tie-break), and
# it gives classes without votes a small non-zero probability, so NLL stays finite.
_SOFT_SHARE = 1e-3


@dataclass
class ZeroVote:
    """The vote over one sample's (or, with leading dimensions, several samples') views."""
    scores: torch.Tensor        # (..., C) sums to 1: (1 - s) * vote share + s * mean kept probability
    winner: torch.Tensor        # (...) argmax of scores: most votes, ties by summed kept probability
    votes: torch.Tensor         # (..., C) number of kept views voting for each class
    kept: torch.Tensor          # (..., k) indices of the voting views, lowest entropy first


def zero_vote(view_logits: torch.Tensor, keep_ratio: float) -> ZeroVote:
    """Majority vote of the int(N * keep_ratio) (at least 1) most confident views: (..., N, C).

    Tie-break: among the classes with the most votes, the one with the highest summed
    softmax probability over the kept views wins (classes whose summed probabilities agree
    to within float32 rounding of the score, about 1e-4 relative, fall back to the lowest
    class index, as does an exact tie).
    """
    view_logits = view_logits.float()
    kept = select_confident(view_logits, keep_ratio)
    kept_logits = torch.gather(view_logits, -2, kept.unsqueeze(-1).expand(*kept.shape, view_logits.shape[-1]))
    k = kept.shape[-1]
    ballots = kept_logits.argmax(-1)
    ones = torch.ones_like(ballots, dtype=view_logits.dtype)
    votes = torch.zeros_like(view_logits[..., 0, :]).scatter_add_(-1, ballots, ones)
    mean_prob = kept_logits.softmax(-1).mean(-2)
    # one vote is worth (1 - s) / k; the probability term at most s, so s < (1 - s) / k
    soft_share = min(_SOFT_SHARE, 0.5 / k)
    scores = (1 - soft_share) * votes / k + soft_share * mean_prob
    return ZeroVote(scores, scores.argmax(-1), votes, kept)


def zero_vote_authors(view_logits: torch.Tensor, keep_ratio: float) -> ZeroVote:
    """ZERO as its authors' code decides one sample (N, C) (`ttas/zero.py`, `ttas/base.py`,
    `utils/tools.py`).

    Voters: the int(N * keep_ratio) lowest entropies, computed as the authors do,
    -sum(p * log p): a view whose softmax underflows to 0 for some class gets NaN and sorts
    last, so it never votes (shiftlab's default uses log_softmax, where it is the most
    confident view). On a tie for the most votes, the non-voting views are scanned in
    entropy order and the first whose argmax is a tied class decides; if none is, the
    authors' fallback (`break_sample_tie`) takes the argmax of the first non-voting view
    after setting to -inf the entries it indexes with `~ties` (bitwise NOT of the class
    indices: class C - 1 - t). The winner then gets one extra vote. `votes` is the authors'
    output (vote counts); `scores` are those votes normalised to sum to 1.
    """
    view_logits = view_logits.float()
    n, num_classes = view_logits.shape
    probs = view_logits.softmax(-1)
    order = lowest(-(probs * probs.log()).sum(-1), 1.0)
    k = n_selected(n, keep_ratio)
    kept = order[:k]
    votes = torch.bincount(view_logits[kept].argmax(-1), minlength=num_classes).to(view_logits.dtype)
    tied = torch.nonzero(votes == votes.max()).flatten()
    winner = int(tied[0])
    if len(tied) > 1:
        ballots = view_logits[order[k:]].argmax(-1)
        hits = torch.isin(ballots, tied).nonzero().flatten()
        if len(hits):
            winner = int(ballots[hits[0]])
        else:
            first = view_logits[order[k]].clone()
            first[~tied] = float("-inf")
            winner = int(first.argmax())
        votes[winner] += 1
    return ZeroVote(votes / votes.sum(), torch.tensor(winner), votes, kept)


class Zero(EpisodicMethod):
    """ZERO: majority vote of the 30% lowest-entropy views' zero-shot argmaxes.

    Scores: `probs` are (1 - s) * (share of the kept views voting for the class)
    + s * (mean softmax probability of the class over the kept views), with s = 1e-3
    (smaller when more than 500 views vote), and `logits` = log(probs), so softmax(logits)
    = probs. The confidence (max prob) is therefore, to within 1e-3, the fraction of the
    confident views that agree with the prediction; top-5 orders classes by votes, then by
    mean kept probability. The small probability term breaks vote ties and keeps the
    probability of a class without votes above zero.
    """
    spec = ZeroSpec

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        if self.config.vote_rule == "authors":
            vote = zero_vote_authors(ctx.zeroshot_view_logits, self.config.keep_ratio)
        else:
            vote = zero_vote(ctx.zeroshot_view_logits, self.config.keep_ratio)
        logits = vote.scores.clamp_min(torch.finfo(vote.scores.dtype).tiny).log()
        winner = int(vote.winner)
        k = vote.kept.shape[-1]
        return MethodOutput(logits, probs=vote.scores,
                            extras={"vote_share": float(vote.votes[winner]) / k, "n_voters": k})
