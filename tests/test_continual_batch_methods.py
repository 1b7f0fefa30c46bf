"""Issue #43's "Done when": a continual corrupted stream (two corruptions of one dataset, one after the other) with
every batch TTA method shiftlab registers (selected from the registry: the classic family and the issue's sixteen
that are registered, so the methods landing later join by their spec's family or their registration), killed at
a gate after the first domain's batch and resumed, gives the records of an uninterrupted run, and the report tables
the batch methods in the batch-transductive block, the single-image ones (MEMO, TTAug, zero-shot, TDA) apart."""
from __future__ import annotations

import dataclasses
import json
import re
import signal

import pytest

from _gate import GatedRun
from _runs import comparable, json_lines
from _synthetic import make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.methods.catalogue import cards as facts
from shiftlab.methods.catalogue import listing as catalogue
from shiftlab.methods.catalogue.declarations import spec, spec_names
from shiftlab.report.build import build_report
from shiftlab.views.recipe import ViewRecipe

pytestmark = pytest.mark.usefixtures("one_thread")
ISSUE_43 = ("cotta", "rmt", "roid", "cmf", "santa", "memo", "rpl", "norm_stats", "ttaug", "gtta", "adacontrast",
            "rotta", "sotta", "ostta", "stamp", "unient")
SINGLE_IMAGE = ("zeroshot", "tda")     # beside them: the single-image block


def stream_methods() -> list[str]:
    """The classic family and the registered ones of the issue's sixteen (GTTA is registered but refused, so never
    among `spec_names()`)."""
    every = set(catalogue.family_members(facts.CLASSIC)) | {n for n in spec_names() if n in ISSUE_43}
    return sorted(n for n in every if "resnet" in spec(n).towers)     # the stream runs the tiny ResNet


def _value(value: object) -> object:
    return dataclasses.asdict(value) if isinstance(value, ViewRecipe) else value


def _argv(data, out, methods) -> list[str]:
    """`shiftlab run` of the corruption suite as one continual stream (fog then contrast, severity 5, 2 images each,
    batches of 2: a domain per batch), the methods with their specs' small test configs, one checkpoint per batch."""
    sets = [a for name in methods for field, value in {**spec(name).offline_config, **spec(name).test_config}.items()
            for a in ("--set", f"{name}.{field}={_value(value)!r}")]
    return ["run", "--suite", "corruption", "--dataset", "imagenet-r", "--corruptions", "fog,contrast", "--severity",
            "5", "--order", "continual", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none",
            "--views", "1", "--workers", "0", "--batch-size", "2", "--seed", "3", "--device", "cpu", "--no-progress",
            "--allow-partial", "--online-checkpoint-seconds", "0", "--methods", ",".join(methods),
            "--set", "tda.text_head=zeroshot", *sets, "--out", str(out)]


def test_the_stream_holds_the_issues_registered_methods_and_the_classic_ones():
    methods = stream_methods()
    assert {"tent", "eata", "sar", "lame", "clipartt", "watt", "cliptta", "deyo"} <= set(methods)
    assert {"roid", "cmf", "rpl", "norm_stats", "memo", "ttaug", "sotta", "ostta", "stamp", "unient"} <= set(methods)
    assert "gtta" not in methods and not set(SINGLE_IMAGE) & set(methods)


@pytest.mark.slow
def test_every_batch_method_over_a_continual_corrupted_stream_resumes_exactly(tmp_path, capsys):
    data = make_imagenet_r(tmp_path / "data", classes=(0, 50), per_class=1, size=(40, 32)).parent
    methods = [*SINGLE_IMAGE, *stream_methods()]
    assert cli_main(_argv(data, tmp_path / "whole", methods)) == 0
    whole = json_lines(tmp_path / "whole" / "records.jsonl")
    assert sorted({r["method"] for r in whole}) == sorted(methods) and len(whole) == 4 * len(methods)
    assert not [r for r in whole if "error" in r]
    shared = json.loads((tmp_path / "whole" / "run.json").read_text())["shared"]
    assert shared["order"] == "continual" and sorted(shared["domains"]) == ["contrast-5", "fog-5"]

    # killed (SIGKILL) after the first batch's checkpoint (the end of the first domain): the online methods' records
    # of that batch are only in the checkpoint
    out = tmp_path / "killed"
    with GatedRun(tmp_path / "gate", _argv(data, out, methods), at="after_checkpoint:1") as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    cut = json_lines(out / "records.jsonl")
    online = [n for n in methods if not spec(n).episodic]
    assert {r["method"] for r in cut} == {m for m in methods if m not in online} and len(online) >= 15
    capsys.readouterr()
    assert cli_main(_argv(data, out, methods) + ["--resume"]) == 0
    assert f"{2 * len(online)} online record(s) restored from the last checkpoint" in capsys.readouterr().err
    assert comparable(json_lines(out / "records.jsonl")) == comparable(whole)

    # the report: the batch methods in the batch-transductive block, the single-image ones in the main table
    html = build_report([out], tmp_path / "report", n_resamples=10).read_text()
    results = re.search(r'<section id="results">.*?</section>', html, re.S).group(0)
    metrics = re.search(r'<table[^>]*id="metrics-table".*?</table>', results, re.S).group(0)
    batch = re.search(r'<table[^>]*id="metrics-table-batch-transductive".*?</table>', results, re.S).group(0)
    for name in methods:
        if catalogue.block(name) == catalogue.BATCH_TRANSDUCTIVE:
            assert f">{name} (batch-transductive)<" in batch and f">{name}" not in metrics, name
        else:
            assert f">{name}<" in metrics and f">{name}" not in batch, name
    assert sum(catalogue.block(n) == catalogue.BATCH_TRANSDUCTIVE for n in methods) >= 15
