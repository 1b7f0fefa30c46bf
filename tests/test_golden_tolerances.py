"""The golden tolerances and margin checks (tests/_golden.py) do what they say: a result from
another machine (last-bit noise) passes, a real change fails, and a discrete result whose
deciding values are too close fails with "margin too small" instead of flaking."""
from __future__ import annotations

import math

import pytest
import torch

from _golden import (
    FEATURES,
    FLOAT32_UNDERFLOW_LOG,
    LOGITS,
    assert_close,
    assert_selection_margin,
    assert_top1_margin,
    assert_underflow_margin,
    check_margin,
    entropy_tolerance,
)

pytestmark = [pytest.mark.golden, pytest.mark.usefixtures("one_thread")]


def _another_machine(t: torch.Tensor, size: float = 1.1e-6, seed: int = 0) -> torch.Tensor:
    """t moved by up to `size` per value, in most values: what another CPU's float32 kernels give
    (measured on the golden text features: max 1.1e-6, 96% of the values differing)."""
    g = torch.Generator().manual_seed(seed)
    return t + (torch.rand(t.shape, generator=g) * 2 - 1) * size


def test_another_machines_text_features_pass_and_a_real_change_fails(golden_dir):
    want = torch.load(golden_dir / "expected.pt", weights_only=True)["zeroshot/text_features"]
    other = _another_machine(want)
    assert float((other != want).float().mean()) > 0.9 and float((other - want).abs().max()) > 1e-6
    assert_close(other, want, FEATURES, "text features")
    other[3, 5] += 1e-3                                  # a bug-sized change in one entry
    with pytest.raises(AssertionError, match="text features"):
        assert_close(other, want, FEATURES, "text features")
    with pytest.raises(AssertionError, match="shape"):
        assert_close(want[:2], want, FEATURES, "text features")


def test_check_margin_says_margin_too_small():
    check_margin(3e-4, 1e-4, "ok")
    with pytest.raises(AssertionError, match="votes: margin too small"):
        check_margin(1.9e-4, 1e-4, "votes")


def test_a_selection_boundary_closer_than_the_tolerance_is_refused():
    scores = torch.tensor([0.5, 0.1, 0.3, 0.30001, 0.9])      # sorted: 0.1, 0.3, 0.30001, 0.5, 0.9
    assert_selection_margin(scores, 1, 1e-3, "wide")           # 0.1 | 0.3
    assert_selection_margin(scores, 3, 1e-3, "wide")           # 0.30001 | 0.5 (order inside the set is free)
    with pytest.raises(AssertionError, match=r"narrow \(views 2 \| 3\): margin too small"):
        assert_selection_margin(scores, 2, 1e-4, "narrow")     # 0.3 | 0.30001
    # per-entry tolerances: the boundary uses the mean of its two entries' bounds
    assert_selection_margin(scores, 2, torch.tensor([0, 0, 4e-6, 4e-6, 0]), "per entry")
    # non-finite scores (NaN entropies) sort last; their boundary is the underflow check's job
    assert_selection_margin(torch.tensor([0.2, math.nan, 0.1]), 2, 1.0, "nan")


def test_an_argmax_closer_than_the_tolerance_is_refused():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 5.0, 5.0 - 3e-4]])
    assert_top1_margin(logits[:1], LOGITS, "clear")
    with pytest.raises(AssertionError, match=r"row 1: top-1 vs top-2\): margin too small"):
        assert_top1_margin(logits, LOGITS, "ballots")


def test_entropy_tolerance_bounds_the_change_of_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 200, generator=g) * 8
    noise = (torch.rand(16, 200, generator=g) * 2 - 1) * LOGITS

    def h(z):
        logp = z.double().log_softmax(-1)
        return -(logp.exp() * logp).sum(-1)
    bound = entropy_tolerance(logits)
    assert ((h(logits + noise) - h(logits)).abs() <= bound.double() * 1.01).all()
    assert (bound > 0).all() and (bound <= LOGITS * math.log(200)).all()


def test_a_softmax_at_the_edge_of_float32_underflow_is_refused():
    near = torch.tensor([[0.0, FLOAT32_UNDERFLOW_LOG + 1e-5, 0.0]])
    far = torch.tensor([[0.0, -50.0, -120.0], [0.0, -30.0, -10.0]])
    assert_underflow_margin(far, LOGITS, "far")
    with pytest.raises(AssertionError, match="float32 underflow\\): margin too small"):
        assert_underflow_margin(near, LOGITS, "near")
    # the check describes what float32 does: below the point exp() is 0, above it is not
    assert float(torch.tensor(FLOAT32_UNDERFLOW_LOG - 1e-3).exp()) == 0.0
    assert float(torch.tensor(FLOAT32_UNDERFLOW_LOG + 1e-3).exp()) > 0.0
