"""ECALP's pieces against straightforward (dense, looped) computations, its config checks, and runs
through the engine (resume after a crash, robust accuracy). The authors' code: the golden checks below.

Golden checks (marked `golden`): ECALP against its authors' own code on the 24-sample stream
(tests/fixtures/golden/online/ecalp*.pt).

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
exactly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, online_fixture, stream_views
from _golden import assert_close as _close
from shiftlab.methods.base import describe
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.ecalp.method import (
    Graph,
    feature_weights,
    image_neighbours,
    normalised_edges,
    propagate,
    reweighted_similarity,
    top,
)

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_feature_weights_and_reweighted_similarity():
    text, q, x = _unit(5, 4, seed=0), _unit(3, 4, seed=1), _unit(2, 4, seed=2)
    mean = text.mean(0)
    var = ((text - mean) ** 2).sum(0) / (5 - 1)             # unbiased, over classes
    w = var / var.norm()
    torch.testing.assert_close(feature_weights(text), w)
    for a in range(3):
        for b in range(2):
            qa = q[a] * w
            want = float(qa @ x[b]) / float(qa.norm() * x[b].norm())
            assert float(reweighted_similarity(q, x, w)[a, b]) == pytest.approx(want, abs=1e-6)


def test_top_keeps_ties_in_column_order_or_leaves_them_to_topk():
    s = torch.tensor([[0.5, 0.75, 0.5, 0.5, 0.125]])
    assert top(s, 3)[1].tolist() == [[1, 0, 2]]
    values, index = top(s, 3, stable=False)
    assert values.tolist() == [[0.75, 0.5, 0.5]] and index[0, 0] == 1 and set(index[0, 1:].tolist()) <= {0, 2, 3}


def test_normalised_edges_are_the_symmetric_normalised_adjacency():
    c, n, width = 3, 4, 2
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, c + n, (n, width), generator=g)
    sim = torch.rand(n, width, generator=g)
    sim[0, 1] = 0                                           # a zero weight is no edge
    dense = torch.zeros(c + n, c + n)
    for r in range(n):
        for j in range(width):
            dense[c + r, idx[r, j]] += sim[r, j]
    dense = dense + dense.T
    d = 1 / (dense.sum(1).sqrt() + 1e-6)
    want = d[:, None] * dense * d[None, :]
    edges, weights = normalised_edges(idx, sim, c)
    got = torch.sparse_coo_tensor(edges, weights, (c + n, c + n)).to_dense()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert bool((weights != 0).all())


def test_propagate_is_the_dense_iteration():
    c, n = 3, 4
    g = torch.Generator().manual_seed(4)
    idx, sim = torch.randint(0, c + n, (n, 3), generator=g), torch.rand(n, 3, generator=g)
    edges, weights = normalised_edges(idx, sim, c)
    w = torch.sparse_coo_tensor(edges, weights, (c + n, c + n)).to_dense()[c:]
    carried = torch.rand(n, c, generator=g)
    y = carried
    for _ in range(2):
        y = 0.7 * w @ torch.cat([torch.eye(c), y]) + 0.3 * carried
    torch.testing.assert_close(propagate(edges, weights, carried, c, 0.7, 2), y, rtol=0, atol=1e-6)


def test_new_nodes_take_their_neighbours_over_every_node():
    text, feats = _unit(5, 4, seed=5), _unit(7, 4, seed=6)
    w = feature_weights(text)

    def node_set(m):
        nodes = torch.cat([feats[:m], feats[m - 1:m]])
        return F.normalize(nodes * w, dim=1), F.normalize(nodes[-2:], dim=1), nodes

    weighted, new, _ = node_set(1)
    kept_sim, kept_idx, sim, idx = image_neighbours(None, weighted, new, 3)
    assert idx.shape == (2, 2) and torch.equal(kept_idx, idx)            # k = min(k_image, nodes)
    graph = Graph(feats[:1], kept_sim, kept_idx, sim, idx, torch.zeros(2), torch.zeros(2, dtype=torch.long))
    for m in range(2, 7):
        weighted, new, nodes = node_set(m)
        kept_sim, kept_idx, sim, idx = image_neighbours(graph, weighted, new, 3)
        want_sim, want_idx = top(reweighted_similarity(nodes, nodes[-2:], w).T, 3)
        assert torch.equal(idx[-2:], want_idx)
        torch.testing.assert_close(sim[-2:], want_sim)
        assert idx.shape == (m + 1, 3) and kept_idx.shape[0] == m + 1
        assert bool((kept_sim[:-2] == kept_sim[:-2].sort(1, descending=True).values).all())
        graph = Graph(feats[:m], kept_sim, kept_idx, sim, idx, torch.zeros(m + 1), torch.zeros(m + 1, dtype=torch.long))


def test_state_survives_a_round_trip_and_the_buffers_grow(tiny_model):
    m = shiftlab.create_method("ecalp", tiny_model, CLASSNAMES, text_head="zeroshot")
    d = m.text().shape[1]
    xs = _unit(40, d, seed=8)
    for x in xs[:20]:
        m.step(x)                               # past the first buffer (16 rows): it grew
    other = shiftlab.create_method("ecalp", tiny_model, CLASSNAMES, text_head="zeroshot")
    other.load_state_dict(m.state_dict())
    for x in xs[20:]:
        assert torch.equal(m.step(x), other.step(x))
    torch.testing.assert_close(m.graph.features, xs)


def test_first_sample_equals_a_dense_computation(tiny_model):
    """Sample 1: nodes (x, x); the image kNN is both nodes, the text kNN the 3 best classes."""
    m = shiftlab.create_method("ecalp", tiny_model, CLASSNAMES, text_head="zeroshot")
    text = m.text()
    c = text.shape[0]
    x = _unit(text.shape[1], seed=7)
    w = feature_weights(text)
    s_img = reweighted_similarity(torch.stack([x, x]), torch.stack([x, x]), w)         # (2, 2)
    s_txt = x @ text.T
    dense = torch.zeros(c + 2, c + 2)
    best = s_txt.topk(3).indices
    for r in range(2):
        for j in range(2):
            dense[c + r, c + j] += s_img[r, j] ** 10
        for k in best:
            dense[c + r, k] += s_txt[k] ** 10
    dense = dense + dense.T
    d = 1 / (dense.sum(1).sqrt() + 1e-6)
    wt = (d[:, None] * dense * d[None, :])[c:]
    y = torch.zeros(2, c)
    for _ in range(3):
        y = wt @ torch.cat([torch.eye(c), y])
    out = m.predict_context(_Ctx(x))
    torch.testing.assert_close(out.logits, 10000 * y[-1], rtol=1e-5, atol=1e-6)
    assert m.graph.carry_val.tolist() == pytest.approx((y.max(1).values / 5).tolist())


class _Ctx:
    def __init__(self, feature: torch.Tensor):
        self.base_feature = feature


@pytest.mark.parametrize("bad,match", [({"text_head": "cupl"}, "text_head"), ({"k_image": 0}, "k_image"),
                                       ({"ties": "random"}, "ties")])
def test_bad_settings_are_refused_in_one_line(tiny_model, bad, match):
    with pytest.raises(ValueError, match=match) as err:
        shiftlab.create_method("ecalp", tiny_model, CLASSNAMES, **bad)
    assert "\n" not in str(err.value)


def test_paper_protocol_is_float32_with_the_authors_tie_order():
    paper = describe("paper", "ecalp")
    assert paper["precision"] == "fp32" and paper["config"]["ties"] == "topk" and paper["views"] == {"n_views": 1}
    assert describe("leaderboard", "ecalp")["config"]["ties"] == "stable"


# -- through the engine ------------------------------------------------------------------------------


# -- golden checks: the authors' code --------------------------------------------------------------------------

SIMS, SCORES = 1e-6, 1e-7
VARIANTS = {"ecalp": {}, "ecalp_small": {"k_image": 3, "k_text": 2, "alpha": 0.8}}


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


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
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


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
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
