"""TIPPLE: stage I's loss against a straightforward computation, its batches, the engine's test-set pass (the
views it draws, the run's records against the method shown those views by hand, a killed run resumed), and
the authors' own code on the golden tiny CLIP (tests/fixtures/golden/tipple, made by the driver beside it from
zhiheLu/TIPPLE's `train_stage1_one_epoch` x 3 and `test_time_adapt_eval`, float32 on the CPU: 24 images,
3 epochs of 3 batches, then stage II per image from their task prompt; thresholds 0.7 and 0.99).

Golden tolerances: tests/_golden.py's and the fixture's tolerances.json; the selected views after a margin check.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import shiftlab
from _golden import (
    FIXTURES,
    LOGITS,
    PARAMS,
    TUNED_LOGITS,
    OptimizerStepRecorder,
    assert_close,
    assert_selection_margin,
    check_margin,
    crop_views,
    entropy_tolerance,
    fixture_tolerances,
)
from _runs import Crash, comparable, crash_before_step, json_lines
from _synthetic import make_image_folder
from shiftlab import ClassHeads, SampleContext
from shiftlab.datasets.build import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import own_test_set_generators, run
from shiftlab.methods.common.confidence import entropy
from shiftlab.methods.tipple.method import (
    confident_pseudo_labels,
    negative_entropy_of_mean,
    task_batches,
    task_loss,
)
from shiftlab.views.generator import ViewConfig, ViewGenerator

TOLERANCES = fixture_tolerances("tipple")  # tests/fixtures/golden/tipple/tolerances.json
TIPPLE_GRAD_RTOL = TOLERANCES["grad_rtol"]
TIPPLE_LOSS = TOLERANCES["loss"]
TIPPLE_TASK_CTX = TOLERANCES["task_ctx"]
TIPPLE_WELL_CONDITIONED = TOLERANCES["well_conditioned"]

pytestmark = pytest.mark.usefixtures("one_thread")


# -- stage I's maths ------------------------------------------------------------------------------------------

def _hand_task_loss(weak: torch.Tensor, strong: torch.Tensor, threshold: float, weight: float) -> torch.Tensor:
    """main.py:208-223 written out view by view: the weak views above the threshold (else the most confident)
    pseudo-label the strong ones; + weight x (B / selected) x the mean of both batches' sum p log(p + 1e-8)."""
    chosen, labels, best, best_p = [], [], 0, -1.0
    for i in range(weak.shape[0]):
        p = weak[i].softmax(-1)
        if float(p.max().detach()) > threshold:
            chosen.append(i)
            labels.append(int(p.argmax()))
        if float(p.max().detach()) > best_p:
            best, best_p = i, float(p.max().detach())
    if not chosen:
        chosen, labels = [best], [int(weak[best].argmax())]
    ce = sum(-strong[i].log_softmax(-1)[c] for i, c in zip(chosen, labels)) / len(chosen)

    def div(logits):
        mean = sum(logits[i].softmax(-1) for i in range(logits.shape[0])) / logits.shape[0]
        return sum(mean[c] * torch.log(mean[c] + 1e-8) for c in range(logits.shape[1]))
    return ce + weight * weak.shape[0] / len(chosen) * (div(weak) + div(strong)) / 2


@pytest.mark.parametrize("threshold", [0.8, 0.99])
def test_task_loss_and_its_gradient_against_a_straightforward_computation(threshold):
    gen = torch.Generator().manual_seed(0)
    weak = (torch.randn(6, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    strong = (torch.randn(6, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    loss, parts = task_loss(weak, strong, threshold, 0.2)
    w2, s2 = weak.detach().clone().requires_grad_(True), strong.detach().clone().requires_grad_(True)
    want = _hand_task_loss(w2, s2, threshold, 0.2)
    assert float(loss.detach()) == pytest.approx(float(want.detach()), abs=1e-12)
    loss.backward()
    want.backward()
    torch.testing.assert_close(weak.grad, w2.grad, rtol=0, atol=1e-12)   # the weak views' gradient: diversity only
    torch.testing.assert_close(strong.grad, s2.grad, rtol=0, atol=1e-12)
    conf = weak.detach().softmax(-1).max(-1).values
    if threshold == 0.99:   # none passes: the single most confident view, its class
        assert bool((conf <= threshold).all()) and parts["selected"].tolist() == [int(conf.argmax())]
    else:
        assert parts["selected"].tolist() == (conf > threshold).nonzero().flatten().tolist()
        assert 1 < len(parts["selected"]) < 6


def test_pseudo_labels_and_diversity_on_known_values():
    logits = torch.log(torch.tensor([[0.8, 0.1, 0.1], [0.2, 0.5, 0.3], [0.05, 0.05, 0.9]]))
    idx, labels = confident_pseudo_labels(logits, 0.7)
    assert idx.tolist() == [0, 2] and labels.tolist() == [0, 2]
    idx, labels = confident_pseudo_labels(logits, 0.95)
    assert idx.tolist() == [2] and labels.tolist() == [2]
    mean = torch.tensor([0.35, 0.2166667, 0.4333333])
    assert float(negative_entropy_of_mean(logits)) == pytest.approx(float((mean * (mean + 1e-8).log()).sum()),
                                                                     abs=1e-6)
    # the uniform mean is the minimum: -log C
    assert float(negative_entropy_of_mean(torch.eye(3) * 5)) == pytest.approx(-math.log(3), abs=1e-6)


def test_task_batches_are_a_fresh_permutation_per_epoch_from_the_seed():
    batches = task_batches(10, 4, 3, seed=5)
    assert [[len(b) for b in epoch] for epoch in batches] == [[4, 4, 2]] * 3
    orders = [torch.cat(epoch).tolist() for epoch in batches]
    assert all(sorted(o) == list(range(10)) for o in orders) and len({tuple(o) for o in orders}) == 3
    gen = torch.Generator().manual_seed(5)   # one randperm per epoch, as a shuffling DataLoader draws them
    assert orders == [torch.randperm(10, generator=gen).tolist() for _ in range(3)]
    assert [torch.cat(e).tolist() for e in task_batches(10, 4, 3, seed=5)] == orders
    assert [torch.cat(e).tolist() for e in task_batches(10, 4, 3, seed=6)] != orders
    assert [torch.cat(e).tolist() for e in task_batches(10, 4, 2, seed=5, shuffle=False)] == [list(range(10))] * 2


# -- the engine's test-set pass -------------------------------------------------------------------------------

SMALL = {"task_epochs": 2, "task_batch_size": 3, "views": 6, "task_threshold": 0.3}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = make_image_folder(tmp_path_factory.mktemp("tipple") / "data", ["cat", "dog", "fox", "owl"],
                             per_class=2, size=(48, 40))
    return build_dataset("imagefolder", root)


def _config(out, **kw):
    base = dict(dataset="imagefolder", methods=["tipple"], workers=0, progress=False, batch_size=3, seed=4,
                out=str(out), device="cpu", method_config={"tipple": SMALL})
    return RunConfig(**{**base, **kw})


@pytest.mark.slow
def test_a_run_predicts_as_the_method_shown_its_weak_and_strong_views_by_hand(data, tiny_model, tmp_path):
    """The pass draws each image's weak and strong views (the run seed, streams 1 and 2) and the stage-I
    shuffles from the run seed: the records are those of the method handed the same views directly."""
    run(_config(tmp_path / "run"), model=tiny_model, dataset=data)
    recs = {r["id"]: r for r in json_lines(tmp_path / "run" / "records.jsonl")}
    method = shiftlab.create_method("tipple", tiny_model, data.classnames, **SMALL)
    heads = method.heads
    weak_gen = ViewGenerator(ViewConfig.from_recipe(method.test_set_views["weak"]), seed=4,
                             preprocess=tiny_model.preprocess, stream=1)
    strong_gen = ViewGenerator(ViewConfig.from_recipe(method.test_set_views["strong"]), seed=4,
                               preprocess=tiny_model.preprocess, stream=2)
    assert set(own_test_set_generators(method, tiny_model.preprocess, 4)) == {"weak", "strong"}

    def ctx(gen, sid):
        return SampleContext(tiny_model, heads, tiny_model.normalize(gen(data.image(sid), sid).float() / 255))
    ids = list(range(len(data)))
    weak, strong = [ctx(weak_gen, s) for s in ids], [ctx(strong_gen, s) for s in ids]
    assert not torch.equal(weak[0].views[1], strong[0].views[1])   # independent crops
    method.observe_test_set({"weak": weak[:5], "strong": strong[:5]})
    method.observe_test_set({"weak": weak[5:], "strong": strong[5:]})
    method.test_set_seed = 4
    method.finish_test_set()
    assert [step["epoch"] for step in method.task_log] == [0, 0, 0, 1, 1, 1]
    assert [step["lr"] for step in method.task_log] == [1e-3] * 3 + [1e-4] * 3
    stream = ViewGenerator(ViewConfig.from_recipe(method.view_recipe), seed=4, preprocess=tiny_model.preprocess)
    for sid in ids:
        views = tiny_model.normalize(stream(data.image(sid), sid).float() / 255)
        probs = method.predict(views).softmax(-1)
        assert recs[sid]["pred"] == int(probs.argmax())
        assert recs[sid]["confidence"] == pytest.approx(float(probs.max()), abs=1e-5)
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert config["reads_ahead"] == {"tipple": "test_set"}


def test_the_task_prompt_moves_and_stage_two_starts_from_it(data, tiny_model):
    method = shiftlab.create_method("tipple", tiny_model, data.classnames, **SMALL)
    start = method.prompt.init_ctx.clone()
    with pytest.raises(ValueError, match=r"^tipple reads the whole test set before predicting: .*observe_test_set"
                                         r"\(...\) \(per group \{name: contexts\} of its test_set_views\) and call "
                                         r"finish_test_set\(\) first"):
        method.predict(torch.zeros(6, 3, tiny_model.image_size, tiny_model.image_size))
    with pytest.raises(ValueError, match="the test set is empty"):
        method.finish_test_set()
    gens = own_test_set_generators(method, tiny_model.preprocess, 0)
    method.observe_test_set({key: [SampleContext(tiny_model, method.heads, tiny_model.normalize(
        gen(data.image(s), s).float() / 255)) for s in range(len(data))] for key, gen in gens.items()})
    method.finish_test_set()
    moved = float((method.prompt.init_ctx - start).abs().max())
    assert moved > 1e-4   # lr 1e-3 for 3 steps, 1e-4 for 3
    # stage II is TPT from the task prompt: with steps 0 it predicts view 0 with the task prompt itself
    still = shiftlab.create_method("tipple", tiny_model, data.classnames, **{**SMALL, "steps": 0})
    still.prompt.init_ctx.copy_(method.prompt.init_ctx)
    still.test_set_seen = True
    views = tiny_model.normalize(torch.rand(6, 3, tiny_model.image_size, tiny_model.image_size,
                                            generator=torch.Generator().manual_seed(0)))
    text = method.prompt.features(method.prompt.init_ctx)
    want = tiny_model.logit_scale * tiny_model.encode_views(views[:1])[0] @ text.T
    torch.testing.assert_close(still.predict(views), want, rtol=0, atol=1e-4)


def test_a_scaled_loss_gives_the_same_prompt_and_an_overflow_skips_its_step(data, tiny_model, monkeypatch):
    """Under fp16 (CUDA) stage I's loss is scaled (GradScaler(init_scale=1000)): the gradient unscaled gives the
    same step, and a non-finite one skips its step, weight decay included, as GradScaler does."""
    import types

    import shiftlab.methods.tipple.method as tipple_method
    method = shiftlab.create_method("tipple", tiny_model, data.classnames, **SMALL)
    gen = torch.Generator().manual_seed(3)
    feats = torch.nn.functional.normalize(torch.randn(2, 6, 1, tiny_model.clip.text_projection.shape[1],
                                                      generator=gen), dim=-1)
    weak, strong = feats[0], feats[1]
    halves = [torch.arange(3), torch.arange(3, 6)]
    plain = method.learn_task_prompt(weak, strong, [halves])
    monkeypatch.setattr(method, "precision", types.SimpleNamespace(loss_scaling=True,
                                                                   autocast=method.precision.autocast))
    torch.testing.assert_close(method.learn_task_prompt(weak, strong, [halves]), plain, rtol=0, atol=1e-7)
    real, calls = tipple_method.task_loss, []

    def overflowing(*args):
        loss, parts = real(*args)
        calls.append(len(calls))
        return (loss * float("inf") if len(calls) == 1 else loss), parts
    monkeypatch.setattr(tipple_method, "task_loss", overflowing)
    skipped = method.learn_task_prompt(weak, strong, [halves])
    monkeypatch.setattr(tipple_method, "task_loss", real)
    monkeypatch.setattr(method, "precision", types.SimpleNamespace(loss_scaling=False,
                                                                   autocast=method.precision.autocast))
    torch.testing.assert_close(skipped, method.learn_task_prompt(weak, strong, [halves[1:]]), rtol=0, atol=1e-7)
    assert not torch.allclose(skipped, plain)


@pytest.mark.slow
def test_a_killed_run_resumes_with_identical_records(data, tiny_model, tmp_path):
    run(_config(tmp_path / "ref"), model=tiny_model, dataset=data)
    reference = json_lines(tmp_path / "ref" / "records.jsonl")

    with pytest.raises(Crash):
        run(_config(tmp_path / "cut"), model=tiny_model, dataset=data, hooks=crash_before_step(1))
    assert 0 < len(json_lines(tmp_path / "cut" / "records.jsonl")) < len(reference)
    run(_config(tmp_path / "cut", resume=True), model=tiny_model, dataset=data)
    assert comparable(json_lines(tmp_path / "cut" / "records.jsonl")) == comparable(reference)


@pytest.mark.slow
def test_the_cli_runs_it_under_the_paper_protocol(data, tiny_checkpoint, tmp_path, capsys):
    from shiftlab.cli import main as cli_main
    out = tmp_path / "cli"
    code = cli_main(["run", "--dataset", "imagefolder", "--data", str(data.root), "--model", "shiftlab-tiny",
                     "--pretrained", str(tiny_checkpoint), "--views", "4", "--workers", "0", "--device", "cpu",
                     "--methods", "tipple", "--protocol", "paper", "--batch-size", "4", "--set",
                     "tipple.task_epochs=1", "--set", "tipple.task_batch_size=4", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    recs = json_lines(out / "records.jsonl")
    assert sorted(r["id"] for r in recs) == list(range(len(data))) and all("error" not in r for r in recs)
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["reads_ahead"] == {"tipple": "test_set"}
    assert "transductive (not comparable with single-image methods): tipple" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_the_bench_shows_it_the_bench_images_first(capsys):
    from shiftlab.cli import main as cli_main
    code = cli_main(["bench", "--tiny", "--json", "--methods", "tipple", "--images", "2", "--warmup", "0", "--repeats",
                     "0", "--no-baseline", "--views", "4", "--classes", "10", "--workers", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert list(result["test_set_pass_seconds_per_image"]) == ["tipple"]
    assert result["test_set_pass_seconds_per_image"]["tipple"] > 0
    assert result["methods"]["tipple"]["seconds_per_image"] > 0
    assert "tipple: test-set pass" in captured.err


def test_facts_and_config():
    from shiftlab.methods.catalogue.declarations import spec
    s = spec("tipple")
    assert s.capabilities.reads_ahead == "test_set" and s.episodic
    assert {(p["backbone"], p["value"]) for p in s.published} == {("RN50", 64.17), ("ViT-B/16", 80.37)}
    assert s.dataset_values["imagenet-r"]["task_diversity"] == 0.1 and s.dataset_values["dtd"]["task_diversity"] == 0.2
    with pytest.raises(ValueError, match="task_threshold"):
        shiftlab.create_method("tipple", shiftlab.load_model("shiftlab-tiny", None, seed=0), ["a", "b"],
                               task_threshold=1.0)


# -- golden checks: the authors' code ---------------------------------------------------------------------------

VARIANTS = {"paper": {"task_threshold": 0.7, "task_diversity": 0.1, "steps": 1},
            "strict": {"task_threshold": 0.99, "task_diversity": 0.2, "steps": 1}}
COMMON = {"task_epochs": 3, "task_batch_size": 8, "lr": 1e-3, "task_lr": 1e-3, "views": 32}


@pytest.fixture(scope="module")
def golden(golden_model, golden_dir, one_thread_module):
    expected = torch.load(FIXTURES / "tipple" / "tipple.pt", weights_only=True)
    model, classnames = golden_model
    heads = ClassHeads(model, classnames)
    bases = torch.load(golden_dir / "online" / "stream.pt", weights_only=True)["base_u8"]
    got: dict[str, torch.Tensor] = {}
    for variant, config in VARIANTS.items():
        method = shiftlab.create_method("tipple", model, classnames, heads=heads, **COMMON, **config)
        s1 = [model.normalize(crop_views(b, 7).float() / 255) for b in bases]
        method.observe_test_set({"weak": [SampleContext(model, heads, v[[0, 1, 2, 3]]) for v in s1],
                                 "strong": [SampleContext(model, heads, v[[0, 4, 5, 6]]) for v in s1]})
        order = torch.stack([torch.cat(e) for e in task_batches(len(bases), 8, 3, seed=0)])
        got[f"{variant}/order"] = order
        method.test_set_seed = 0
        got[f"{variant}/init_ctx"] = method.prompt.init_ctx.clone()
        with OptimizerStepRecorder() as rec:
            method.finish_test_set()
        for k, (step, g, c) in enumerate(zip(method.task_log, rec.grad, rec.param)):
            p = f"{variant}/s1/{k}/"
            got[p + "selected"], got[p + "loss"] = torch.tensor(step["selected"]), torch.tensor(step["loss"])
            got[p + "lr"], got[p + "ctx_grad"], got[p + "ctx"] = torch.tensor(step["lr"]), g, c
        got[f"{variant}/task_ctx"] = method.prompt.init_ctx.clone()
        # stage II from the authors' task prompt: each stage held to its own inputs (tests/_golden.py, TUNED_LOGITS)
        method.prompt.init_ctx.copy_(expected[f"{variant}/task_ctx"])
        method._graph = None
        got[f"{variant}/weak"] = torch.stack([c.image_features[1:] for c in
                                              [SampleContext(model, heads, v[[0, 1, 2, 3]]) for v in s1]])
        with torch.no_grad():
            task_text = method.prompt.features(expected[f"{variant}/task_ctx"])
        for i, b in enumerate(bases):
            ctx = SampleContext(model, heads, model.normalize(crop_views(b, 32).float() / 255))
            with OptimizerStepRecorder() as rec:
                out = method.predict_context(ctx)
            p = f"{variant}/s2/{i}/"
            got[p + "selected"], got[p + "logits"] = torch.tensor(out.extras["selected"]), out.logits
            got[p + "ctx"], got[p + "ctx_grad"] = rec.param[-1][0], rec.grad[0][0]
            got[p + "loss"], got[p + "lr"] = torch.tensor(out.extras["loss"]), torch.tensor(method.config.lr)
            got[p + "view_logits"] = model.logit_scale * ctx.image_features @ task_text.T
        got[f"{variant}/method"] = method
    return {"expected": expected, "got": got}


def _check_stage_one_selection(golden, variant: str, k: int, want: torch.Tensor) -> None:
    """The weak views above the threshold (or the most confident) are a set no LOGITS-size change moves."""
    expected, got = golden["expected"], golden["got"]
    method = got[f"{variant}/method"]
    with torch.no_grad():   # the context before the step, the authors'
        text = method.prompt.features(expected[f"{variant}/s1/{k - 1}/ctx"] if k else got[f"{variant}/init_ctx"])
    epoch = k // 3
    idx = expected[f"{variant}/order"][epoch].split(8)[k % 3]
    logits = method.model.logit_scale * got[f"{variant}/weak"][idx, epoch] @ text.T
    conf = logits.softmax(-1).max(-1).values
    threshold = VARIANTS[variant]["task_threshold"]
    tol = 2 * LOGITS * float(conf.max())   # d p / d z <= p: a LOGITS move of every logit moves p by <= 2 LOGITS p
    check_margin(float((conf - threshold).abs().min()), tol, f"{variant}/s1/{k}: confidence vs threshold")
    if len(want) == 1 and float(conf.max()) <= threshold:
        top2 = conf.topk(2).values
        check_margin(float(top2[0] - top2[1]), tol, f"{variant}/s1/{k}: the fallback's most confident view")


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_golden_key(golden, variant):
    expected, got = golden["expected"], golden["got"]
    keys = sorted(k for k in expected if k.startswith(variant + "/"))
    steps = VARIANTS[variant]["steps"]
    assert len(keys) == 2 + 9 * 5 + 24 * 6, (len(keys), steps)
    # stage II images whose first-step entropy is within its noise: their selection and loss only
    noisy = {f"{variant}/s2/{i}/" for i in range(24)
             if float(expected[f"{variant}/s2/{i}/loss"]) < TIPPLE_WELL_CONDITIONED}
    assert len(noisy) <= 11, sorted(noisy)
    failures = []
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        want = expected[key]
        if key.rsplit("/", 1)[0] + "/" in noisy and name not in ("selected", "loss", "lr"):
            continue
        try:
            assert key in got, f"{key}: not computed"
            have = got[key].detach().float() if name not in ("order", "lr") else got[key].double()
            assert have.shape == want.shape, f"{key}: shape {tuple(have.shape)} != {tuple(want.shape)}"
            if name == "order":
                assert torch.equal(have, want), key
            elif name == "selected" and "/s1/" in key:
                _check_stage_one_selection(golden, variant, int(key.split("/")[2]), want)
                assert have.tolist() == want.tolist(), f"{key}: {have.tolist()} != {want.tolist()}"
            elif name == "selected":
                view_logits = got[key.rsplit("/", 1)[0] + "/view_logits"]
                assert_selection_margin(entropy(view_logits), len(want), entropy_tolerance(view_logits, LOGITS), key)
                assert sorted(have.tolist()) == sorted(want.tolist()), f"{key}: {have.tolist()} != {want.tolist()}"
            elif name == "ctx_grad":
                err, scale = float((have - want).abs().max()), float(want.abs().max())
                assert err <= TIPPLE_GRAD_RTOL * scale, f"{key}: max error {err:.3g} vs max|want| {scale:.3g}"
            elif name == "ctx" and "/s2/" in key:
                assert_close(have, want, PARAMS * steps, key)
            elif name in ("ctx", "task_ctx"):
                assert_close(have, want, TIPPLE_TASK_CTX, key)
            elif name == "lr":
                assert float(have) == pytest.approx(float(want), rel=1e-7), key
            elif name == "loss":
                assert_close(have, want, TIPPLE_LOSS, key)
            else:
                assert name == "logits", key
                assert_close(have, want, TUNED_LOGITS, key)
        except AssertionError as exc:
            lines = str(exc).splitlines()
            failures.append(" ".join([lines[0]] + [x.strip() for x in lines if "bsolute difference" in x]) if lines
                            else key)
    assert not failures, "\n".join(failures)
