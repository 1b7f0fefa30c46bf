"""One way to start a run (`engine.prepare`): the library refuses what the CLI refuses, in its own
spelling, and never changes the config it is given."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

import shiftlab
from shiftlab.cli import main as cli_main
from shiftlab.engine.config import RunConfig
from shiftlab.engine.prepare import CannotStart, prepare
from shiftlab.synthetic import make_imagenet_r

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sparse(tmp_path_factory) -> Path:
    """ImageNet-R with 4 of its 200 classes (98% empty), one image each."""
    return make_imagenet_r(tmp_path_factory.mktemp("sparse"), classes=range(0, 200, 50), per_class=1)


def _config(data: Path, out: Path, **kw) -> RunConfig:
    base = dict(data=str(data), model="shiftlab-tiny", pretrained=None, methods=["zeroshot"], views=1, limit=2,
                out=str(out), workers=0, progress=False, device="cpu")
    return RunConfig(**{**base, **kw})


def test_library_run_refuses_a_mostly_empty_dataset_as_the_cli_does(sparse, tmp_path, capsys):
    # issue 34 finding 2: shiftlab.run ran a 98%-empty dataset the CLI refuses
    with pytest.raises(CannotStart) as info:
        shiftlab.run(_config(sparse, tmp_path / "lib"))
    message = str(info.value)
    assert "196 of 200 classes (98%) have no images" in message
    assert "allow_partial=True" in message and "--allow-partial" not in message   # Python's spelling
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "lib").exists()   # refused before the run directory is made
    # the CLI refuses it too, naming its flag
    argv = ["run", "--data", str(sparse), "--model", "shiftlab-tiny", "--pretrained", "none", "--methods",
            "zeroshot", "--views", "1", "--limit", "2", "--workers", "0", "--device", "cpu", "--no-progress",
            "--out", str(tmp_path / "cli")]
    capsys.readouterr()
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert "196 of 200 classes" in err and "--allow-partial" in err and "allow_partial=True" not in err


def test_allow_partial_runs_it(sparse, tmp_path):
    summary = shiftlab.run(_config(sparse, tmp_path / "run", allow_partial=True))
    assert summary["methods"]["zeroshot"]["n"] == 2
    assert (tmp_path / "run" / "records.jsonl").is_file()
    top1 = summary["methods"]["zeroshot"]["top1"]   # the result prints as one readable line, not a dict dump
    assert repr(summary) == f"RunSummary({str(tmp_path / 'run')!r}, imagenet-r, n=2, top-1 %: zeroshot {top1:.2f})"


def test_run_never_changes_its_argument(sparse, tmp_path):
    # "all" is expanded, the attack's fields filled, duplicates dropped: all of it on the engine's copy
    cfg = _config(sparse, tmp_path / "run", allow_partial=True, methods=["zeroshot", "zeroshot", "prompt_ensemble"],
                  attack={"name": "pgd", "steps": 1}, views=2)
    before = copy.deepcopy(cfg)
    shiftlab.run(cfg)
    assert cfg == before
    assert dataclasses.asdict(cfg) == dataclasses.asdict(before)


def test_encode_never_changes_its_argument(sparse, tmp_path):
    from shiftlab.engine.features import encode
    # COSMIC's DINOv2 is encoded into the store too: random weights (Meta's checkpoint is not here)
    cfg = _config(sparse, tmp_path / "run", allow_partial=True, methods=["all"], features=str(tmp_path / "feats"),
                  views=8, method_config={"cosmic": {"dino_pretrained": "none"}})
    before = copy.deepcopy(cfg)
    done = encode(cfg)
    assert done["samples"] == 2 and done["encoded"] == 2
    assert cfg == before


def test_prepare_says_every_problem_at_once(tmp_path):
    cfg = _config(tmp_path / "nothing-here", tmp_path / "run", model="shiftlab-tiny", pretrained="no-such-tag")
    with pytest.raises(CannotStart) as info:
        prepare(cfg, ["imagenet-r", "imagenet-a"])
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == ["dataset imagenet-r", "dataset imagenet-a", "model"]
    assert all("\n" not in p for p in problems)
    assert "allow_download=True" in problems[0] and "--download" not in problems[0]
    assert "no-such-tag" in problems[2]


def test_prepare_keeps_given_datasets_and_model(sparse):
    from shiftlab.datasets import build_dataset
    from shiftlab.synthetic import tiny_clip
    dataset, model = build_dataset("imagenet-r", sparse), tiny_clip(0)
    cfg = _config(sparse, Path("unused"))
    prepared = prepare(cfg, model=model, given={"imagenet-r": dataset})   # given: the caller's choice, not refused
    assert prepared.model is model and prepared.datasets == {"imagenet-r": dataset}


@pytest.mark.parametrize("precision, said", [("fp16", True), ("bf16", True), ("auto", False), ("fp32", False)])
def test_a_precision_the_device_does_not_run_is_said(sparse, tiny_model, precision, said):
    """`--precision fp16` (or bf16) on the CPU computed in float32 without a word."""
    from shiftlab.datasets import build_dataset
    heard: list[str] = []
    prepare(_config(sparse, Path("unused"), precision=precision), model=tiny_model,
            given={"imagenet-r": build_dataset("imagenet-r", sparse)}, warn=heard.append)
    assert heard == ([f"precision={precision} is autocast on CUDA only: on cpu every computation runs in float32"]
                     if said else [])


def test_run_config_repr_is_one_readable_line():
    cfg = RunConfig(data="/data", methods=["tpt"], views=8, allow_partial=True)
    text = repr(cfg)
    assert text.startswith("RunConfig(dataset='imagenet-r', data='/data', model='RN50', pretrained='openai', "
                           "methods=['tpt'], out='runs/run'")
    assert "views=8" in text and "allow_partial=True" in text
    assert "seed=" not in text and "save_probs" not in text   # defaults are left out
    assert "\n" not in text


def test_method_repr_is_its_name_classes_and_effective_config(tiny_model):
    method = shiftlab.create_method("ctpt", tiny_model, ["cat", "dog"], protocol="paper", lr=0.01)
    text = repr(method)
    assert text.startswith("CTPT('ctpt', 2 classes, ")
    assert "lr=0.01" in text and "lambda_atfd=20.0" in text   # --set and the paper protocol's value
    assert "views='64 views: original + 63 x RandomResizedCrop" in text and "\n" not in text


def test_the_engine_step_takes_one_typed_context():
    # Runner.__init__ took 13 parameters, several typed Any; now one StepContext whose fields say their types
    import inspect
    import typing

    from shiftlab.engine import step
    assert list(inspect.signature(step.Runner.__init__).parameters) == ["self", "context"]
    hints = typing.get_type_hints(step.StepContext, {**vars(step), "ImageAttack": object, "Plan": object,
                                                     "FolderDataset": object})
    untyped = [name for name, hint in hints.items() if hint is typing.Any]
    assert untyped == ["features"]   # named in a comment: engine.features imports the step module
