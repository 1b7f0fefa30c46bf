"""LAME: its pieces against straightforward computations, runs through the CLI (the episodic-batch protocol),
and two authors' codes on the golden stream (tests/fixtures/golden/lame, made by the driver beside the fixtures:
CLIPTTA's `Lame` (the CLIP toolkit, the defaults) and fiveai/LAME's `LAME.run_step` (the paper's code, `--protocol
paper`), on the golden tiny ViT, float32 on the CPU).

Golden checks, two ways. Fed their features and probabilities (`replay`), the kernel, the iteration count and the
output are bit-identical (measured 0.0: the same float32 operations in the same order), held to REPLAY (1e-6) for
another CPU. Through shiftlab's own encoder (features within FEATURES of theirs) the unary's probabilities move by
up to scale x FEATURES: outputs are held to LAME_PROBS (the fixture's tolerances.json). The iteration count is held
to one step either way: the stopping rule (relative energy change <= 1e-8) reads float32 energies, whose spacing
(6e-8) is coarser than the threshold, so when it stops is a rounding event once Y has converged.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, assert_close, fixture_tolerances, stream_views
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.lame import method as M

LAME_PROBS = fixture_tolerances("lame")["probs"]  # tests/fixtures/golden/lame/tolerances.json

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]
REPLAY = 1e-6

pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


# -- the pieces ---------------------------------------------------------------------------------------

def test_knn_kernel_marks_each_rows_nearest_others():
    x = _unit(7, 5, seed=0)
    kernel = M.affinity(x, "knn", 3)
    for i in range(7):
        others = sorted((j for j in range(7) if j != i), key=lambda j: float((x[i] - x[j]).norm()))[:3]
        assert kernel[i].nonzero().flatten().tolist() == sorted(others)
    assert float(kernel.sum()) == 21 and float(kernel.diagonal().abs().sum()) == 0
    assert float(M.affinity(x[:1], "knn", 3).abs().sum()) == 0          # one image: no neighbour


def test_rbf_kernel_bandwidth_is_the_mean_kth_distance_counting_the_row_itself():
    x = _unit(6, 4, seed=1)
    d = torch.cdist(x, x)
    sigma = torch.stack([d[i].sort().values[2] for i in range(6)]).mean()   # 3rd smallest: itself + 2 others
    torch.testing.assert_close(M.affinity(x, "rbf", 3), torch.exp(-d ** 2 / (2 * sigma ** 2)), rtol=0, atol=1e-6)
    torch.testing.assert_close(M.affinity(x, "linear", 3), x @ x.T)
    assert float(M.affinity(x[:1], "rbf", 5).abs().sum()) == 0          # one image: theirs is 0/0, here no term


def test_iterations_are_the_fixed_point_updates_and_stop_on_the_energy():
    g = torch.Generator().manual_seed(2)
    p = torch.rand(5, 4, generator=g).softmax(-1)
    kernel = M.affinity(_unit(5, 3, seed=3), "knn", 2)
    unary = -torch.log(p + 1e-10)
    y, steps = M.laplacian_optimization(unary, kernel, 1.0, 100)
    want, energies = p.clone(), []
    for _ in range(steps):                                          # the same updates, written out
        pairwise = kernel @ want
        want = torch.softmax(-unary + pairwise, -1)
        energies.append(float((unary * want - pairwise * want + want * want.clamp_min(1e-20).log()).sum()))
    torch.testing.assert_close(y, want)
    assert 2 < steps < 100 and abs(energies[-1] - energies[-2]) <= 1e-8 * abs(energies[-2])
    assert all(abs(b - a) > 1e-8 * abs(a) for a, b in zip(energies[1:-2], energies[2:-1]))
    # no pairwise term: the fixed point is the zero-shot probabilities themselves
    y0, _ = M.laplacian_optimization(unary, torch.zeros(5, 5), 1.0, 100)
    torch.testing.assert_close(y0, p, rtol=0, atol=1e-6)
    assert M.laplacian_optimization(unary, kernel, 1.0, 1)[1] == 1


def test_a_batch_pulls_an_image_towards_its_neighbours_labels(tiny_model):
    lame = shiftlab.create_method("lame", tiny_model, CLASSNAMES, logit_scale=10.0, knn=2)
    x = torch.cat([_unit(1, 32, seed=4).repeat(3, 1) + 0.01 * _unit(3, 32, seed=5), _unit(1, 32, seed=6)])
    x = F.normalize(x, dim=-1)
    probs = torch.tensor([[0.6, 0.4], [0.6, 0.4], [0.6, 0.4], [0.45, 0.55]]).repeat(1, 3) / 3
    y, _ = M.adjust(x, probs, lame.config)
    assert y[:3].argmax(1).tolist() == [0, 0, 0] and float(y[0, 0]) > 0.2        # sharpened by agreeing neighbours


def test_config_ranges_are_refused_in_one_line(tiny_model):
    for bad, match in (({"knn": 0}, "knn"), ({"affinity": "cosine"}, "affinity"), ({"logit_scale": 0.0}, "logit_scale"),
                       ({"max_steps": 0}, "max_steps")):
        with pytest.raises(ValueError, match=match) as err:
            shiftlab.create_method("lame", tiny_model, CLASSNAMES, **bad)
        assert "\n" not in str(err.value)


def test_output_scale_reports_cliptta_s_softmax_with_the_same_prediction(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    size = tiny_model.image_size
    views = [tiny_model.normalize(torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(s)))
             for s in range(4)]
    ctxs = [SampleContext(tiny_model, heads, v) for v in views]
    plain = shiftlab.create_method("lame", tiny_model, CLASSNAMES, heads=heads).adapt_batch(ctxs)
    scaled = shiftlab.create_method("lame", tiny_model, CLASSNAMES, heads=heads, output_scale=100.0).adapt_batch(ctxs)
    for a, b in zip(plain, scaled):
        torch.testing.assert_close(b.probs, (100 * a.probs).softmax(-1))
        assert int(a.probs.argmax()) == int(b.probs.argmax()) and a.extras["batch"] == 4


# -- through the command line -------------------------------------------------------------------------

@pytest.mark.slow
def test_its_own_ood_score_is_cliptta_s_max_prob_of_the_assignments(tiny_model):
    """CLIPTTA's get_scores of LAME's Y: the largest softmax(ood_logit_scale x Y), written out; the spec declares it."""
    x = F.normalize(torch.randn(6, 32, generator=torch.Generator().manual_seed(7)), dim=-1)
    ctxs = [SampleContext(tiny_model, None, None, image_features=row.unsqueeze(0)) for row in x]
    for scale in (1.0, 30.0):
        lame = shiftlab.create_method("lame", tiny_model, CLASSNAMES, ood_logit_scale=scale, output_scale=100.0)
        outs = lame.adapt_batch(ctxs)
        y, _ = M.adjust(x, lame.zero_shot(x), lame.config)
        want = [max(torch.exp(scale * row) / torch.exp(scale * row).sum()).item() for row in y]
        assert [o.ood_score for o in outs] == pytest.approx(want, abs=1e-6)
    assert "max_prob" in M.LAME.spec.own_ood_score


def test_cli_runs_lame_on_batches_from_stored_features_as_from_pixels(tmp_path, tiny_checkpoint, capsys):
    from _runs import comparable, json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 40), per_class=2, size=(80, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial", "--methods", "lame"]
    store = ["--features", str(tmp_path / "fs"), "--features-dtype", "fp32"]
    assert cli_main(["run", *flags, "--batch-size", "4", "--out", str(tmp_path / "b4")]) == 0
    assert cli_main(["run", *flags, *store, "--batch-size", "4", "--out", str(tmp_path / "b4s")]) == 0
    assert cli_main(["run", *flags, "--protocol", "paper", "--batch-size", "4", "--out", str(tmp_path / "p")]) == 0
    b4 = json_lines(tmp_path / "b4" / "records.jsonl")
    assert comparable(b4) == comparable(json_lines(tmp_path / "b4s" / "records.jsonl"))
    assert sorted(r["extras"]["batch"] for r in b4) == [2, 2] + [4] * 8       # 10 images in batches of 4
    run = json.loads((tmp_path / "p" / "run.json").read_text())
    assert run["shared"]["batch_size"] == 4 and run["methods"]["lame"]["affinity"] == "rbf"
    assert run["methods"]["lame"]["logit_scale"] is None
    capsys.readouterr()


# -- the authors' code (tests/fixtures/golden/lame) ------------------------------------------------------

VARIANTS = ["cliptta_knn", "cliptta_rbf", "cliptta_linear", "fiveai_rbf", "fiveai_knn"]


def _fixture(golden_dir, variant):
    info = json.loads((golden_dir / "lame" / "lame.json").read_text())["fixtures"][variant]
    return torch.load(golden_dir / "lame" / f"{variant}.pt", map_location="cpu", weights_only=True), info


def _config(info) -> dict:
    """The variant's settings in shiftlab's fields: CLIPTTA's are the defaults; fiveai's the paper protocol's."""
    affinity = info["affinity"].lower()
    if info["code"] == "cliptta":
        assert info["logit_scale_arg"] == 100.0 and info["tta_reduction"] == "probs"
        return {"affinity": affinity}
    assert info["knn"] == 5 and info["force_symmetry"] is False
    return {"affinity": affinity, "logit_scale": None}


@pytest.mark.golden
@pytest.mark.parametrize("variant", VARIANTS)
def test_lame_replays_the_authors_code_from_their_inputs(golden_dir, variant):
    want, info = _fixture(golden_dir, variant)
    cfg = shiftlab.methods.base.make_config(M.LAME, **_config(info))
    for b in range(info["n_batches"]):
        feats, probs = want[f"{b}/features"], want[f"{b}/probas"]
        assert_close(M.affinity(feats, cfg.affinity, cfg.knn), want[f"{b}/kernel"], REPLAY, f"{b} kernel")
        y, iterations = M.adjust(feats, probs, cfg)
        assert_close(y, want[f"{b}/Y"], REPLAY, f"{b} Y")
        assert abs(iterations - int(want[f"{b}/iterations"])) <= 1     # equal here (see the end-to-end test)



@pytest.mark.golden
@pytest.mark.parametrize("variant", VARIANTS)
def test_lame_matches_the_authors_code_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want, info = _fixture(golden_dir, variant)
    assert [t.lower() for t in info["templates"]] == ["a photo of a {}."]      # the zeroshot head
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "prototypes")
    method = shiftlab.create_method("lame", model, names, heads=heads, **_config(info))
    ctxs = [SampleContext(model, heads, model.normalize(v)) for v in stream_views(golden_dir, 1)]
    size = info["batch_size"]
    for b in range(info["n_batches"]):
        batch = ctxs[b * size:(b + 1) * size]
        feats = torch.stack([c.base_feature for c in batch])
        assert_close(feats, want[f"{b}/features"], FEATURES, f"{b} features")
        outs = method.adapt_batch(batch)
        y = torch.stack([o.probs for o in outs])
        assert_close(y, want[f"{b}/Y"], LAME_PROBS, f"{b} Y")
        # the stopping rule compares float32 energies whose relative change falls below float32's own spacing
        # (6e-8) before it reaches 1e-8: when it stops is a rounding event, one step either way, after Y has converged
        assert abs(outs[0].extras["iterations"] - int(want[f"{b}/iterations"])) <= 1
        if info["code"] == "cliptta":   # their OOD score of Y (get_scores, `--score_type max_prob`)
            assert info["score_type"] == "max_prob"
            scores = torch.tensor([o.ood_score for o in outs])
            assert_close(scores, want[f"{b}/scores"], LAME_PROBS, f"{b} scores")
