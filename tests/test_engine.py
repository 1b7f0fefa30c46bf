"""End-to-end runs on a synthetic ImageNet-R folder: records, summary, resume after SIGKILL, bad images."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _gate import GatedRun, child_env
from _imports import lazy_module
from _runs import comparable as _strip
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.datasets.imageio import decode_image
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.rundir import record_files, records
from shiftlab.rundir.stream import stream_order
from shiftlab.synthetic import make_imagenet_r, tiny_clip
from shiftlab.views.generator import ViewConfig, ViewGenerator

open_clip = lazy_module("open_clip", optional=False)   # imported by the first test that reads it

REPO = Path(__file__).resolve().parents[1]
FAST_METHODS = "zeroshot,prompt_ensemble,view_ensemble,tpt,ctpt,rtpt,mta,zero"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    return make_imagenet_r(root, classes=range(0, 200, 20), per_class=1, size=(80, 64))


def _cli_run(data, ckpt, out, *extra):
    return cli_main(["run", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
                     str(ckpt), "--views", "8", "--workers", "0", "--no-progress", "--out", str(out),
                     "--allow-partial", *extra])


@pytest.mark.slow
def test_cli_run_writes_records_and_summary(synthetic, tiny_checkpoint, tmp_path):
    out = tmp_path / "run"
    assert _cli_run(synthetic, tiny_checkpoint, out, "--methods", FAST_METHODS) == 0
    recs = list(record_files.iter_records(out / "records.jsonl"))
    methods = FAST_METHODS.split(",")
    assert len(recs) == 10 * len(methods)
    assert {(r["id"], r["method"]) for r in recs} == {(i, m) for i in range(10) for m in methods}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == set(methods) and summary["errors"] == 0
    for name, m in summary["methods"].items():
        mine = [r for r in recs if r["method"] == name]
        assert m["n"] == 10
        assert m["top1"] == pytest.approx(100 * sum(r["correct"] for r in mine) / 10)
        assert 0 <= m["ece"] <= 100 and m["seconds_per_image"] > 0
    md = (out / "summary.md").read_text()
    assert "| tpt |" in md and "RANDOM" not in md  # a checkpoint file is not labelled random
    # a second run into the same folder without --resume is refused, records untouched
    assert _cli_run(synthetic, tiny_checkpoint, out, "--methods", "zeroshot") == 2
    assert len(list(record_files.iter_records(out / "records.jsonl"))) == len(recs)


@pytest.mark.slow
def test_zeroshot_record_matches_plain_open_clip(synthetic, tmp_path):
    model = tiny_clip(0)
    dataset = build_dataset("imagenet-r", synthetic)
    run(RunConfig(methods=["zeroshot"], views=1, out=str(tmp_path / "r"), workers=0, progress=False),
        model=model, dataset=dataset)
    recs = {r["id"]: r for r in record_files.iter_records(tmp_path / "r" / "records.jsonl")}
    clip = model.clip
    text = clip.encode_text(open_clip.tokenize([f"a photo of a {c}." for c in dataset.classnames]), normalize=True)
    views = ViewGenerator(ViewConfig(n_views=1, size=64))
    for sid in range(len(dataset)):
        x = views(decode_image(dataset.path(sid)), sid).float() / 255
        x = (x - torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(3, 1, 1)) / torch.tensor(
            open_clip.OPENAI_DATASET_STD).view(3, 1, 1)
        with torch.no_grad():
            logits = model.logit_scale * clip.encode_image(x, normalize=True) @ text.T
        probs = logits[0].softmax(-1)
        assert recs[sid]["pred"] == int(logits[0].argmax())
        assert recs[sid]["top5"] == probs.topk(5).indices.tolist()
        assert recs[sid]["confidence"] == pytest.approx(float(probs.max()), abs=1e-4)
        assert recs[sid]["true_prob"] == pytest.approx(float(probs[recs[sid]["label"]]), abs=1e-4)


@pytest.mark.slow
def test_results_independent_of_batching_and_workers(synthetic, tmp_path):
    model = tiny_clip(0)
    dataset = build_dataset("imagenet-r", synthetic)
    outs = []
    for i, (bs, workers, order) in enumerate([(1, 0, "sorted"), (4, 2, "shuffled")]):
        out = tmp_path / f"r{i}"
        run(RunConfig(methods=["zeroshot", "tpt", "mta", "view_ensemble"], views=8, batch_size=bs,
                      workers=workers, order=order, out=str(out), progress=False), model=model, dataset=dataset)
        outs.append({(r["id"], r["method"]): r for r in record_files.iter_records(out / "records.jsonl")})
    assert outs[0].keys() == outs[1].keys()
    for key, a in outs[0].items():
        b = outs[1][key]
        assert a["pred"] == b["pred"] and a["top5"] == b["top5"], key
        assert a["confidence"] == pytest.approx(b["confidence"], abs=1e-4)


@pytest.mark.slow
def test_bad_images_become_error_records(tmp_path):
    data = make_imagenet_r(tmp_path / "data", classes=[0, 1, 2], size=(64, 64))
    wnid_dir = sorted(p for p in data.iterdir() if p.is_dir())[0]
    (wnid_dir / "art_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (wnid_dir / "art_empty.jpg").write_bytes(b"")
    dataset = build_dataset("imagenet-r", data)
    summary = run(RunConfig(methods=["zeroshot", "tpt"], views=4, out=str(tmp_path / "r"), workers=0,
                            progress=False), model=tiny_clip(0), dataset=dataset)
    recs = list(record_files.iter_records(tmp_path / "r" / "records.jsonl"))
    errors = [r for r in recs if "error" in r]
    assert sorted(Path(r["path"]).name for r in errors) == ["art_broken.jpg", "art_empty.jpg"]
    assert all(r["method"] is None and r["error"] for r in errors)
    assert summary["errors"] == 2 and summary["methods"]["tpt"]["n"] == 3


def test_stream_order_is_seeded_permutation():
    a, b = stream_order(50, "shuffled", 0), stream_order(50, "shuffled", 0)
    assert a == b and sorted(a) == list(range(50)) and a != list(range(50))
    assert stream_order(50, "shuffled", 1) != a and stream_order(5, "sorted", 0) == [0, 1, 2, 3, 4]


def _error_record(sid: int) -> dict:
    return {"id": sid, "path": f"c/{sid}.jpg", "label": 0, "method": "zeroshot", "setting": "clean", "error": "x"}


def test_torn_last_line_is_ignored_and_cut(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(_error_record(0)) + '\n{"id": 1, "meth')
    assert [r["id"] for r in record_files.iter_records(path)] == [0]
    with record_files.RecordWriter(path) as w:
        w.write([_error_record(1)])
    assert [r["id"] for r in record_files.iter_records(path)] == [0, 1]


@pytest.mark.slow
def test_resume_after_sigkill_loses_nothing_and_duplicates_nothing(tmp_path, tiny_checkpoint):
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 5), size=(72, 64))  # 40 images
    argv = ["run", "--allow-partial", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny",
            "--pretrained", str(tiny_checkpoint), "--views", "8", "--workers", "0", "--batch-size", "1",
            "--methods", "zeroshot,tpt,mta", "--no-progress"]
    args = [sys.executable, "-m", "shiftlab", *argv]
    env = child_env()
    killed = tmp_path / "killed"
    with GatedRun(tmp_path / "gate", [*argv, "--out", str(killed)], at="after_step:4") as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    records_file = killed / "records.jsonl"
    assert len(list(record_files.iter_records(records_file))) == 4 * 3     # 4 samples of 40, 3 methods each
    subprocess.run(args + ["--out", str(killed), "--resume"], env=env, check=True, capture_output=True)
    reference = tmp_path / "reference"
    subprocess.run(args + ["--out", str(reference)], env=env, check=True, capture_output=True)
    got = list(record_files.iter_records(records_file))
    want = list(record_files.iter_records(reference / "records.jsonl"))
    assert len(got) == len({records.record_key(r) for r in got}) == 120
    assert _strip(got) == _strip(want)


@pytest.mark.gpu
@pytest.mark.slow
def test_a_cuda_run_gives_the_probabilities_of_the_cpu_run(synthetic, tiny_checkpoint, tmp_path):
    """`--device cuda --precision fp32` (TF32 off) computes what the CPU computes: each saved probability
    within float16 storage and float32 summation order, the same top-1 wherever the CPU's top two are
    further apart than that. Continuous methods only: a discrete choice inside a method (TPT's
    confident views) may flip on a near tie, and then the whole output differs legitimately."""
    from shiftlab.rundir.probs import load_probs
    saved = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        assert _cli_run(synthetic, tiny_checkpoint, out, "--methods", "zeroshot,view_ensemble", "--device", device,
                        "--precision", "fp32", "--save-probs") == 0
        saved[device] = {k: v.astype("float64") for k, v in load_probs(out).items()}
    assert saved["cuda"].keys() == saved["cpu"].keys() and len(saved["cpu"]) == 2 * 10
    for key, want in saved["cpu"].items():
        got = saved["cuda"][key]
        assert abs(got - want).max() < 2e-3, key
        second, first = sorted(want)[-2:]
        if first - second > 4e-3:
            assert got.argmax() == want.argmax(), key


def test_run_precision_reaches_prompt_tuning_unless_set_per_method(tiny_model):
    from shiftlab.engine.step import Evaluator
    from shiftlab.models.precision import resolve
    ev = Evaluator(tiny_model, ["cat", "dog"], ["tpt", "rtpt", "zeroshot"], {"rtpt": {"precision": "bf16"}},
                   precision="fp32")
    assert ev.methods["tpt"].precision.name == "fp32" and ev.methods["rtpt"].precision.name == "bf16"
    assert ev.methods["zeroshot"].precision.name == "fp32"
    assert ev.precision.amp_dtype is None and resolve("auto", torch.device("cpu")).amp_dtype is None
    with pytest.raises(ValueError, match="precision"):
        resolve("fp8", torch.device("cpu"))


def test_runner_step_is_the_engine_step_and_reports_phases(synthetic, tmp_path):
    """`Runner.step` alone (as `shiftlab bench` uses it) gives the run's records, and its phase timer
    splits the time, the text tower included, without touching torch."""
    from shiftlab.engine.phases import PhaseTimer
    from shiftlab.engine.step import Evaluator, Runner, StepContext, view_generators
    model = tiny_clip(0)
    dataset = build_dataset("imagenet-r", synthetic)
    methods = ["zeroshot", "tpt"]
    run(RunConfig(methods=methods, views=4, batch_size=4, order="sorted", out=str(tmp_path / "r"), workers=0,
                  progress=False), model=model, dataset=dataset)
    want = _strip(record_files.iter_records(tmp_path / "r" / "records.jsonl"))
    backward, grad = torch.Tensor.backward, torch.autograd.grad
    timer = PhaseTimer(text=True)
    evaluator = Evaluator(model, dataset.classnames, methods, text_timer=timer, run_views={"n_views": 4})
    runner = Runner(StepContext(evaluator, dataset, view_generators(evaluator.methods, model.preprocess, 0),
                                timer=timer))
    got = [r.to_dict() for ids in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9]) for r in runner.step(runner.load(ids))]
    evaluator.close()
    assert _strip(got) == want
    assert {"decode_views", "encode", "predict:zeroshot", "predict:tpt", "text:tpt"} <= set(timer.seconds)
    assert 0 < timer.seconds["text:tpt"] < timer.seconds["predict:tpt"] and "text:zeroshot" not in timer.seconds
    assert torch.Tensor.backward is backward and torch.autograd.grad is grad
    assert "features" not in evaluator.methods["tpt"].prompt.__dict__
