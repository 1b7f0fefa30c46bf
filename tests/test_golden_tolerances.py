"""The golden tolerances and margin checks (tests/_golden.py) do what they say: a result from
another machine (last-bit noise) passes, a real change fails, and a discrete result whose
deciding values are too close fails with "margin too small" instead of flaking."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from _golden import (
    FEATURES,
    FIXTURES,
    FLOAT32_UNDERFLOW_LOG,
    LOGITS,
    TOLERANCES_FILE,
    assert_close,
    assert_selection_margin,
    assert_top1_margin,
    assert_underflow_margin,
    check_margin,
    entropy_tolerance,
    fixture_tolerances,
    tolerance_file_problems,
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


def _tolerance_files() -> list[Path]:
    return sorted(FIXTURES.glob(f"*/{TOLERANCES_FILE}"))


def test_every_fixtures_tolerances_file_is_well_formed_and_read_by_its_test():
    """Each tests/fixtures/golden/<name>/tolerances.json parses (positive values, a why each), and a test reads
    it with fixture_tolerances("<name>") and uses every key."""
    tests = {p: p.read_text() for p in (FIXTURES.parents[1]).rglob("test_*.py")}
    assert len(_tolerance_files()) >= 11
    for path in _tolerance_files():
        name = path.parent.name
        assert tolerance_file_problems(json.loads(path.read_text())) == [], path
        readers = [text for text in tests.values() if f'fixture_tolerances("{name}")' in text]
        assert readers, f"{path}: no test calls fixture_tolerances({name!r})"
        unused = [key for key in fixture_tolerances(name) if not any(f'["{key}"]' in text for text in readers)]
        assert not unused, f"{path}: keys no test reads: {unused}"


def test_a_malformed_tolerances_file_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    good = {"logits": {"value": 2e-4, "why": "logit noise of another CPU's kernels, x 100 the feature noise"}}
    (tmp_path / "m" / TOLERANCES_FILE).write_text(json.dumps(good))
    assert fixture_tolerances("m", tmp_path) == {"logits": 2e-4}
    bad = {"Logits": {"value": 2e-4, "why": "x"}, "loss": {"value": -1.0, "why": "a why of eight words is not here"},
           "ok": {"value": 1e-5}, "nan": {"value": math.nan, "why": "not a number is no bound on any difference"}}
    assert [p.split(":")[0] for p in tolerance_file_problems(bad)] == ["'Logits'", "'loss'", "'ok'", "'nan'"]
    (tmp_path / "m" / TOLERANCES_FILE).write_text(json.dumps({"loss": {"value": 1e-5, "why": "too short"}}))
    with pytest.raises(ValueError, match="'loss': 'why' does not say why"):
        fixture_tolerances("m", tmp_path)
