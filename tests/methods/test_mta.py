"""MTA and ZERO: golden fidelity against the authors' code, and properties on the tiny random CLIP."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import shiftlab
from _golden import FEATURES, LOGITS, LOSS, assert_close
from shiftlab.methods.context import SampleContext
from shiftlab.methods.mta.method import kernel_density, mode_step
from shiftlab.methods.zero.method import zero_vote

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]


# -- golden fidelity ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def golden(golden_dir, one_thread_module):
    expected = torch.load(golden_dir / "expected.pt", weights_only=True)
    inputs = torch.load(golden_dir / "inputs.pt", weights_only=True)
    classnames = json.loads((golden_dir / "golden.json").read_text())["classnames"]
    model = shiftlab.load_model("shiftlab-tiny", str(golden_dir / "tiny_clip_openai.pt"))
    views = [model.normalize(v) for v in inputs["views_unit"]]
    return model, classnames, views, expected


@pytest.mark.golden
def test_mta_matches_golden(golden, one_thread):
    model, classnames, views, expected = golden
    mta = shiftlab.create_method("mta", model, classnames)
    for i, sample_views in enumerate(views):
        ctx = SampleContext(model, mta.heads, sample_views)
        got = mta.solve(ctx.image_features, ctx.zeroshot_view_logits, mta.heads.zeroshot)
        want = lambda name: expected[f"mta/{i}/{name}"]  # noqa: E731, B023 (used in this iteration only)
        assert_close(got.logits, want("logits"), LOGITS, f"mta {i} logits")
        assert_close(got.inlierness, want("inlierness"), LOSS, f"mta {i} inlierness")
        assert_close(got.bandwidth, want("bandwidth"), LOSS, f"mta {i} bandwidth")
        assert_close(got.mode, want("mode"), FEATURES, f"mta {i} mode")
        assert got.outer_iterations == int(want("outer_iterations"))
        assert_close(mta.predict_context(ctx).logits, want("logits"), LOGITS, f"mta {i} predict")


@pytest.mark.golden
@pytest.mark.parametrize("average", ["probs", "logits"])
def test_view_ensemble_matches_golden(golden, one_thread, average):
    """The R-TPT table's Ensemble ships no code: its views' logits are the authors' (TPT's CLIP, the golden
    view logits), their equal-weight mean of probabilities (or of logits) is computed here in float64."""
    model, classnames, views, expected = golden
    ensemble = shiftlab.create_method("view_ensemble", model, classnames, average=average)
    for i, sample_views in enumerate(views):
        view_logits = expected[f"zeroshot/{i}/view_logits"].double()
        want = (view_logits.softmax(-1).mean(0).log() if average == "probs" else view_logits.mean(0)).float()
        got = ensemble.predict(sample_views)
        if average == "probs":    # a log-probability: compared as the distribution it stands for
            got, want = got.softmax(-1), want.softmax(-1)
        assert_close(got, want, LOGITS, f"view ensemble ({average}) sample {i}")


@pytest.mark.golden
def test_zeroshot_matches_golden(golden, one_thread):
    model, classnames, views, expected = golden
    zeroshot = shiftlab.create_method("zeroshot", model, classnames)
    assert_close(zeroshot.heads.zeroshot, expected["zeroshot/text_features"], FEATURES, "text features")
    for i, sample_views in enumerate(views):
        assert_close(zeroshot.predict(sample_views), expected[f"zeroshot/{i}/logits"], LOGITS, f"{i} logits")
        ctx = SampleContext(model, zeroshot.heads, sample_views)
        assert_close(ctx.zeroshot_view_logits, expected[f"zeroshot/{i}/view_logits"], LOGITS,
                     f"{i} view logits")
        assert_close(ctx.image_features, expected[f"zeroshot/{i}/image_features"], FEATURES,
                     f"{i} image features")


# -- MTA properties on the tiny random CLIP -----------------------------------------------

def _views(model, n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    size = model.image_size
    return model.normalize(torch.rand(n, 3, size, size, generator=gen))


@pytest.fixture(scope="module")
def tiny_mta(tiny_model):
    return shiftlab.create_method("mta", tiny_model, CLASSNAMES)


def test_mta_mode_is_view0_when_all_views_identical(tiny_model, tiny_mta):
    views = _views(tiny_model, 1).repeat(8, 1, 1, 1)
    ctx = SampleContext(tiny_model, tiny_mta.heads, views)
    got = tiny_mta.solve(ctx.image_features, ctx.zeroshot_view_logits, tiny_mta.heads.zeroshot)
    torch.testing.assert_close(got.mode, ctx.image_features[0], rtol=0, atol=1e-6)
    assert torch.isfinite(got.logits).all()


def test_mode_step_is_kernel_weighted_mean_with_equal_inlierness():
    gen = torch.Generator().manual_seed(1)
    feats = torch.nn.functional.normalize(torch.randn(7, 5, generator=gen, dtype=torch.float64), dim=-1)
    bandwidth = 0.3 + torch.rand(7, generator=gen, dtype=torch.float64)
    mode = feats[2]
    uniform = torch.full((7,), 1 / 7, dtype=torch.float64)
    weights = [torch.exp(-((f - mode) ** 2).sum() / (2 * h ** 2)) for f, h in zip(feats, bandwidth)]
    mean = sum(w * f for w, f in zip(weights, feats)) / sum(weights)
    torch.testing.assert_close(kernel_density(feats, mode, bandwidth), torch.stack(weights))
    torch.testing.assert_close(mode_step(feats, mode, bandwidth, uniform), mean / mean.norm())


def test_mta_invariant_to_permuting_views_after_the_first(tiny_model, tiny_mta):
    ctx = SampleContext(tiny_model, tiny_mta.heads, _views(tiny_model, 12, seed=2))
    feats, view_logits = ctx.image_features, ctx.zeroshot_view_logits
    order = torch.cat([torch.tensor([0]), 1 + torch.randperm(11, generator=torch.Generator().manual_seed(3))])
    base = tiny_mta.solve(feats, view_logits, tiny_mta.heads.zeroshot)
    permuted = tiny_mta.solve(feats[order], view_logits[order], tiny_mta.heads.zeroshot)
    torch.testing.assert_close(permuted.logits, base.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(permuted.mode, base.mode, rtol=0, atol=1e-5)
    torch.testing.assert_close(permuted.inlierness, base.inlierness[order], rtol=0, atol=1e-5)


def test_mta_batch_equals_one_at_a_time(tiny_model, tiny_mta):
    ctxs = [SampleContext(tiny_model, tiny_mta.heads, _views(tiny_model, 10, seed=s)) for s in range(3)]
    batched = tiny_mta.predict_batch(ctxs)
    for ctx, out in zip(ctxs, batched):
        single = tiny_mta.predict_context(ctx)
        torch.testing.assert_close(out.logits, single.logits, rtol=0, atol=1e-5)
        assert out.extras["inlierness_entropy"] == pytest.approx(single.extras["inlierness_entropy"], abs=1e-5)


# -- ZERO voting ----------------------------------------------------------------------------

def _plain_majority(view_logits: torch.Tensor, keep_ratio: float) -> int:
    """Reference: vote of the lowest-entropy views, ties by summed probability, then lowest index."""
    logp = view_logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    k = max(1, int(view_logits.shape[0] * keep_ratio))
    kept = sorted(range(view_logits.shape[0]), key=lambda v: float(entropy[v]))[:k]
    counts = Counter(int(view_logits[v].argmax()) for v in kept)
    summed = logp[kept].exp().sum(0)
    best = max(counts.values())
    return max((c for c, n in counts.items() if n == best), key=lambda c: (float(summed[c]), -c))


def test_zero_vote_without_ties():
    view_logits = torch.tensor([[0.0, 9.0, 0.0, 0.0],    # class 1, confident
                                [0.0, 8.0, 0.0, 0.0],    # class 1
                                [0.0, 0.0, 0.0, 7.0],    # class 3
                                [0.0, 0.0, 0.0, 9.5],    # class 3: the most confident view, yet outvoted
                                [0.0, 6.0, 0.0, 0.0],    # class 1
                                [0.5, 0.0, 0.0, 0.0],    # near-uniform: filtered out
                                [0.0, 0.0, 0.4, 0.0]])   # near-uniform: filtered out
    vote = zero_vote(view_logits, keep_ratio=0.75)       # int(7 * 0.75) = 5 voters
    assert int(vote.winner) == 1 == _plain_majority(view_logits, 0.75)
    assert vote.votes.tolist() == [0.0, 3.0, 0.0, 2.0]
    assert float(vote.scores.sum()) == pytest.approx(1.0, abs=1e-6)
    assert float(vote.scores[1]) == pytest.approx(3 / 5, abs=1e-3)


def test_zero_vote_tie_goes_to_highest_summed_probability():
    view_logits = torch.tensor([[0.0, 5.0, 4.8, 0.0],    # class 1, but close to class 2
                                [0.0, 5.0, 4.8, 0.0],    # class 1
                                [0.0, 0.0, 8.0, 0.0],    # class 2, confident
                                [0.0, 0.0, 8.0, 0.0],    # class 2
                                [0.0, 0.0, 0.0, 0.0],    # uniform: filtered out
                                [0.1, 0.0, 0.0, 0.0]])   # near-uniform: filtered out
    vote = zero_vote(view_logits, keep_ratio=0.7)        # int(6 * 0.7) = 4 voters, 2 against 2
    assert vote.votes.tolist() == [0.0, 2.0, 2.0, 0.0]
    assert int(vote.winner) == 2 == _plain_majority(view_logits, 0.7)
    swapped = view_logits[:, [0, 2, 1, 3]]               # the same tie with the class indices exchanged
    assert int(zero_vote(swapped, 0.7).winner) == 1 == _plain_majority(swapped, 0.7)


def test_zero_vote_matches_plain_majority_on_random_logits():
    gen = torch.Generator().manual_seed(4)
    for _ in range(50):
        view_logits = 3 * torch.randn(10, 3, generator=gen)   # 3 classes and 3 voters: ties are common
        assert int(zero_vote(view_logits, 0.3).winner) == _plain_majority(view_logits, 0.3)


def test_zero_output_probs_are_vote_shares(tiny_model):
    zero = shiftlab.create_method("zero", tiny_model, CLASSNAMES)
    out = zero.predict_context(SampleContext(tiny_model, zero.heads, _views(tiny_model, 10)))
    probs = out.probabilities()
    torch.testing.assert_close(out.logits.softmax(-1), probs, rtol=0, atol=1e-6)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)
    assert out.extras["n_voters"] == 3
    assert float(probs.max()) == pytest.approx(out.extras["vote_share"], abs=1e-3)
    assert int(out.logits.argmax()) == int(probs.argmax())


# -- registry ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mta", "zero"])
def test_registered_and_callable(tiny_model, name):
    assert name in shiftlab.list_methods()
    logits = shiftlab.create_method(name, tiny_model, CLASSNAMES).predict(_views(tiny_model, 8))
    assert logits.shape == (len(CLASSNAMES),)
    assert torch.isfinite(logits).all()
