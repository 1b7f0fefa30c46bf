"""StatA: its pieces against straightforward computations, runs through the CLI (the episodic-batch protocol),
and its authors' own code on the golden stream (tests/fixtures/golden/stata, made by the driver beside the
fixtures from github.com/MaxZanella/StatA's `StatA_solver`, float32 on the CPU).

Golden checks, two ways. Fed the authors' features and prototypes (`replay`), every intermediate of the
solver agrees to float32 rounding: measured 1.2e-7 on z, 2.5e-7 on the covariances; held to REPLAY (1e-6):
shiftlab expands the squared distances into matrix products, which sum in another order. Through
shiftlab's own encoders (features within FEATURES of theirs), the zero-shot logits move by up to 100 x
FEATURES, so probabilities are held to PROBS (5e-5; measured 1.2e-5), the soft anchor weights to LOSS,
means to FEATURES, covariances (entries ~1e-2) to COV (2e-6; measured 6e-7); predictions exactly, after a
top-1 margin check.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, LOSS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.catalogue.declarations import make_config
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.stata import method as S
from shiftlab.methods.stata.spec import StatASpec

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]
REPLAY, PROBS, COV = 1e-6, 5e-5, 2e-6

pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


# -- the pieces ---------------------------------------------------------------------------------------

def test_knn_graph_leaves_each_row_out_and_its_term_is_the_dense_products():
    x = _unit(7, 5, seed=0)
    idx, values = S.knn_affinity(x, 3)
    sims = x @ x.T
    dense = torch.zeros(7, 7)
    for i in range(7):
        others = sorted((j for j in range(7) if j != i), key=lambda j: -float(sims[i, j]))[:3]
        assert sorted(idx[i].tolist()) == sorted(others)
        dense[i, others] = sims[i, others]
    z = torch.rand(7, 4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(S.graph_term(idx, values, z), dense.T @ z + dense @ z, rtol=0, atol=1e-6)
    # two images: each other's only neighbour; one image: none (the authors' code needs four)
    assert S.knn_affinity(x[:2], 3)[0].tolist() == [[1], [0]]
    idx1, val1 = S.knn_affinity(x[:1], 3)
    assert idx1.shape == (1, 0) and float(S.graph_term(idx1, val1, z[:1]).abs().sum()) == 0


def test_likelihoods_and_weighted_squares_are_the_direct_sums():
    x, mu = _unit(5, 6, seed=2), _unit(3, 6, seed=3)
    cov = 0.01 + torch.rand(3, 6, generator=torch.Generator().manual_seed(4)) * 0.05
    want = torch.tensor([[-0.5 * float((((x[i] - mu[k]) ** 2) / cov[k]).sum()) for k in range(3)] for i in range(5)])
    torch.testing.assert_close(S.log_likelihoods(x, mu, cov), want, rtol=0, atol=1e-4)
    z = torch.rand(5, 3, generator=torch.Generator().manual_seed(5))
    want_sq = torch.stack([sum(z[i, k] * (x[i] - mu[k]) ** 2 for i in range(5)) for k in range(3)])
    torch.testing.assert_close(S.weighted_squares(x, z, mu), want_sq, rtol=0, atol=1e-6)


def test_initial_covariance_divides_after_every_chunk_as_theirs(monkeypatch):
    x, mu = _unit(5, 4, seed=6), _unit(3, 4, seed=7)
    z = torch.rand(5, 3, generator=torch.Generator().manual_seed(8))
    parts = [S.weighted_squares(x[i:i + 2], z[i:i + 2], mu).sum(0) for i in (0, 2, 4)]
    assert torch.allclose(S.initial_covariance(x, z, mu), sum(parts) / 5, atol=1e-7)   # one chunk: the mean
    monkeypatch.setattr(S, "CHUNK", 2)
    torch.testing.assert_close(S.initial_covariance(x, z, mu), ((parts[0] / 5 + parts[1]) / 5 + parts[2]) / 5)


def test_anchor_weights_count_hard_predictions_or_soft_mass():
    z = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8]])
    torch.testing.assert_close(S.anchor_weights(z, 1.0, soft=False), torch.tensor([2 / 3, 0.0, 1 / 2]))
    mass = z.sum(0)
    torch.testing.assert_close(S.anchor_weights(z, 3.0, soft=True), mass / (3 + mass))


def test_a_class_absent_from_the_batch_keeps_its_zero_shot_model():
    x, protos = _unit(6, 8, seed=9), _unit(4, 8, seed=10)
    seen = {}
    S.solve(x, protos, 100.0, S.StatAConfig(max_iter=2), lambda n, t, v: seen.__setitem__((n, t), v.clone()))
    beta = seen[("beta", 0)]
    absent = beta == 0
    assert absent.any()
    torch.testing.assert_close(seen[("mu", 0)][absent], protos[absent])
    torch.testing.assert_close(seen[("cov", 0)][absent], seen[("init_cov", 0)].expand(4, -1)[absent])


def test_config_ranges_are_refused_in_one_line(tiny_model):
    for bad, match in (({"alpha": 0.0}, "alpha"), ({"n_neighbors": 0}, "n_neighbors"), ({"z_steps": 0}, "z_steps")):
        with pytest.raises(ValueError, match=match) as err:
            shiftlab.create_method("stata", tiny_model, CLASSNAMES, **bad)
        assert "\n" not in str(err.value)


# -- through the command line -------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_runs_stata_on_batches_from_stored_features_as_from_pixels(tmp_path, tiny_checkpoint, capsys):
    from _runs import comparable, json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 40), per_class=2, size=(80, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial", "--methods", "stata"]
    store = ["--features", str(tmp_path / "fs"), "--features-dtype", "fp32"]
    assert cli_main(["run", *flags, "--batch-size", "4", "--out", str(tmp_path / "b4")]) == 0
    assert cli_main(["run", *flags, *store, "--batch-size", "4", "--out", str(tmp_path / "b4s")]) == 0
    assert cli_main(["run", *flags, *store, "--batch-size", "10", "--out", str(tmp_path / "b10")]) == 0
    b4 = json_lines(tmp_path / "b4" / "records.jsonl")
    assert comparable(b4) == comparable(json_lines(tmp_path / "b4s" / "records.jsonl"))
    assert sorted(r["extras"]["batch"] for r in b4) == [2, 2] + [4] * 8       # 10 images in batches of 4
    assert json.loads((tmp_path / "b4" / "run.json").read_text())["shared"]["batch_size"] == 4
    b10 = json_lines(tmp_path / "b10" / "records.jsonl")
    assert {r["extras"]["batch"] for r in b10} == {10}
    capsys.readouterr()


# -- the authors' code (tests/fixtures/golden/stata) ------------------------------------------------------

def _fixture(golden_dir, variant):
    info = json.loads((golden_dir / "stata" / "stata.json").read_text())["fixtures"][variant]
    return torch.load(golden_dir / "stata" / f"{variant}.pt", map_location="cpu", weights_only=True), info


def _config(info) -> S.StatAConfig:
    hp = info["hp"]
    cfg = make_config(StatASpec, logit_scale=100.0, alpha=hp["alpha"], soft_beta=hp["soft_beta"],
                      lambda_laplacian=hp["lambda_laplacian"], lambda_y_hat=hp["lambda_y_hat"],
                      n_neighbors=hp["n_neighbors"])
    return cfg


def _check_batch(got: dict, want: dict, b: int, tol: dict) -> None:
    assert_close(got["init_cov"], want[f"{b}/init_cov"], tol["cov"], f"{b} initial covariance")
    for t in range(11):
        assert_close(got[("z", t)], want[f"{b}/{t}/z"], tol["probs"], f"{b}/{t} z")
        if t < 10:
            assert_close(got[("beta", t)], want[f"{b}/{t}/beta"], tol["beta"], f"{b}/{t} beta")
        if f"{b}/{t}/mu" in want:
            assert_close(got[("mu", t)], want[f"{b}/{t}/mu"], tol["mu"], f"{b}/{t} means")
            assert_close(got[("cov", t)], want[f"{b}/{t}/cov"], tol["cov"], f"{b}/{t} covariances")


def _run(features, prototypes, cfg) -> tuple[torch.Tensor, torch.Tensor, dict]:
    got: dict = {}
    prior, z = S.solve(features, prototypes, 100.0, cfg,
                       lambda n, t, v: got.__setitem__(n if n == "init_cov" else (n, t), v.clone()))
    return prior, z, got


@pytest.mark.golden
@pytest.mark.parametrize("variant", ["stata", "stata_soft"])
def test_stata_replays_the_authors_solver_from_their_inputs(golden_dir, variant):
    want, info = _fixture(golden_dir, variant)
    cfg = _config(info)
    tol = {"probs": REPLAY, "beta": REPLAY, "mu": REPLAY, "cov": REPLAY}
    for b in range(info["n_batches"]):
        prior, z, got = _run(want[f"{b}/features"], want["prototypes"], cfg)
        assert_close(prior, want[f"{b}/y_hat"], REPLAY, f"{b} zero-shot")
        assert_close(z, want[f"{b}/z"], REPLAY, f"{b} z")
        _check_batch(got, want, b, tol)


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["stata", "stata_soft"])
def test_stata_matches_the_authors_code_batch_by_batch(golden_model, golden_dir, variant):
    model, classnames = golden_model
    want, info = _fixture(golden_dir, variant)
    heads = ClassHeads(model, classnames)
    method = shiftlab.create_method("stata", model, classnames, heads=heads, **vars(_config(info)))
    assert info["templates"] == ["a photo of a {}."]          # their ImageNet 'standard' prompt: the zeroshot head
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "prototypes")
    ctxs = [SampleContext(model, heads, model.normalize(v)) for v in stream_views(golden_dir, 1)]
    size, changed = info["batch_size"], 0
    tol = {"probs": PROBS, "beta": LOSS, "mu": FEATURES, "cov": COV}
    for b in range(info["n_batches"]):
        batch = ctxs[b * size:(b + 1) * size]
        feats = torch.stack([c.base_feature for c in batch])
        assert_close(feats, want[f"{b}/features"], FEATURES, f"{b} features")
        outs = method.adapt_batch(batch)
        z = torch.stack([o.probs for o in outs])
        assert_close(z, want[f"{b}/z"], PROBS, f"{b} z")
        _, _, got = _run(feats.float(), heads.zeroshot.float(), method.config)
        _check_batch(got, want, b, tol)
        assert_top1_margin(want[f"{b}/z"], PROBS, f"{b} z")
        assert z.argmax(1).tolist() == want[f"{b}/z"].argmax(1).tolist(), f"{b} predictions"
        changed += int((want[f"{b}/z"].argmax(1) != want[f"{b}/y_hat"].argmax(1)).sum())
    assert changed > 0              # the solver changes some zero-shot predictions
