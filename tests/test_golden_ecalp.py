"""ECALP against its authors' own code on the 24-sample stream (tests/fixtures/golden/online/ecalp*.pt).

tools/golden/make_golden.py ran Yushu-Li/ECALP's `main.py` as a script (zero-shot, CPU, float32) on a
features file of the stream (view 0 and CLIP's 80-template head of the tiny CLIP, through OpenAI's
clip package) and recorded, after every sample, the output, every test node's final scores and the
graph state: each node's kept image neighbours (indices and similarities), its text neighbours, and
the carried labels Y_0. `ecalp`: their defaults; `ecalp_small`: k_image 3, k_text 2, alpha 0.8 (so
that the carried labels enter every step and the neighbour lists are truncated more).

A sample and its duplicate node always tie, so the authors' neighbour lists depend on torch.topk's
order among ties: these tests run `ties="topk"` (the same call on the same CPU gives the same order).
Tolerances (float32): fed the authors' features and head, neighbour indices exactly, similarities
1e-6, scores and carried labels 1e-7 (scores are ~1e-2; the output is softmax(1e4 * scores));
through shiftlab's encoders (features within 1e-6 of theirs) the same, scores 1e-6; predictions
exactly.
"""
from __future__ import annotations

import pytest
import torch

import shiftlab
from _golden import FEATURES, online_fixture, stream_views
from _golden import assert_close as _close
from shiftlab.methods.context import ClassHeads, SampleContext

SIMS, SCORES = 1e-6, 1e-7
VARIANTS = {"ecalp": {}, "ecalp_small": {"k_image": 3, "k_text": 2, "alpha": 0.8}}


pytestmark = [pytest.mark.golden, pytest.mark.usefixtures("one_thread")]


def _check_graph(m, want, i: int, what: str, scores_atol: float) -> None:
    g = m.graph
    assert torch.equal(g.knn_idx, want[f"{i}/knn_idx"]), f"{what} {i}: image neighbours"
    assert torch.equal(g.text_idx, want[f"{i}/text_idx"]), f"{what} {i}: text neighbours"
    _close(g.knn_sim, want[f"{i}/knn_sim"], SIMS, f"{what} {i} image similarities")
    _close(g.text_sim, want[f"{i}/text_sim"], SIMS, f"{what} {i} text similarities")
    carried = torch.zeros_like(want[f"{i}/carried"])
    carried[torch.arange(len(g.carry_idx)), g.carry_idx] = g.carry_val
    _close(carried, want[f"{i}/carried"], scores_atol, f"{what} {i} carried labels")
    assert g.features.shape[0] == i + 1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_ecalp_replays_the_authors_graph_exactly(golden_model, golden_dir, name):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, name)
    m = shiftlab.create_method("ecalp", model, classnames, ties="topk", **VARIANTS[name])
    d = info["defaults"]
    if name == "ecalp":
        assert (m.config.k_text, m.config.k_image, m.config.gamma, m.config.alpha, m.config.iterations) == (
            d["k_text"], d["k_image"], d["gamma"], d["alpha"], d["num_iterations"])
    m.text = lambda: want["text_features"]              # their features and head as inputs
    for i, x in enumerate(want["image_features"]):
        scores = m.step(x)
        _close(scores, want[f"{i}/scores"][-1], SCORES, f"{i} scores")
        _check_graph(m, want, i, name, SCORES)
        assert int(scores.argmax()) == int(want["predictions"][i])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_ecalp_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, name):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, name)
    heads = ClassHeads(model, classnames)
    m = shiftlab.create_method("ecalp", model, classnames, heads=heads, ties="topk", **VARIANTS[name])
    stable = shiftlab.create_method("ecalp", model, classnames, heads=heads, **VARIANTS[name])
    _close(m.text(), want["text_features"], FEATURES, "text head")
    preds, stable_preds, truncated = [], [], 0
    for i, views in enumerate(stream_views(golden_dir, info["n_views"])):
        ctx = SampleContext(model, heads, model.normalize(views))
        _close(ctx.base_feature, want[f"{i}/feature"] if f"{i}/feature" in want else want["image_features"][i],
               FEATURES, f"{i} feature")
        out = m.predict_context(ctx)
        _close(out.logits / m.config.logit_scale, want[f"{i}/scores"][-1], 1e-6, f"{i} scores")
        _check_graph(m, want, i, name, 1e-6)
        preds.append(int(out.logits.argmax()))
        stable_preds.append(int(stable.predict_context(ctx).logits.argmax()))
        truncated += int(want[f"{i}/knn_idx"].shape[1] > min(m.config.k_image, i + 2))
    assert preds == want["predictions"].tolist()
    assert truncated > 0                              # the stream exercises the kept-candidate lists
    # the default (stable ties) picks the sample over its duplicate at a tied boundary; on this stream
    # the predictions are the same
    assert stable_preds == preds
