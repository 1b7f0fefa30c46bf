"""The classic batch TTA methods on CLIP together (issue #32's "Done when"): every method whose spec declares
`family = "classic"` (TENT, EATA, SAR, LAME, CLIPArTT, WATT, CLIPTTA, ...; a new one joins by declaring it) runs
over a synthetic corrupted stream from the CLI beside single-image methods, a run killed mid-stream resumes to
the records of an uninterrupted run, and the suite table and the report show them in the batch-transductive block,
never among the single-image methods."""
from __future__ import annotations

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
from shiftlab.methods.catalogue.declarations import MethodSpec, spec, spec_names
from shiftlab.methods.common.norm_config import NormTTAConfig
from shiftlab.report.build import build_report

pytestmark = pytest.mark.usefixtures("one_thread")
SINGLE_IMAGE = ("zeroshot", "tda")     # run in the same stream: the single-image block


def classic() -> list[str]:
    return catalogue.family_members(facts.CLASSIC)


def classic_on_resnet() -> list[str]:
    """The classic methods the stream below runs on the tiny ResNet (a ViT-only one, CLIP-OT, runs on the tiny ViT
    in the registry-wide tests)."""
    return [name for name in classic() if "resnet" in spec(name).towers]


# ------------------------------------------------------------------ the declaration


def test_the_classic_methods_are_those_that_declare_it():
    names = classic()
    assert {"tent", "eata", "sar", "lame", "clipartt", "watt", "cliptta"} <= set(names)
    # every method on the shared norm-adaptation machinery is one of them (a new one must declare the family)
    on_norm_tta = [n for n in spec_names() if issubclass(spec(n).config_class, NormTTAConfig)]
    assert set(on_norm_tta) <= set(names), sorted(set(on_norm_tta) - set(names))
    # all of them batch methods: the batch-transductive block
    assert {catalogue.block(n) for n in names} == {catalogue.BATCH_TRANSDUCTIVE}
    entry = next(e for e in catalogue.entries() if e["name"] == "tent")
    assert entry["family"] == "classic"
    assert next(e for e in catalogue.entries() if e["name"] == "zeroshot")["family"] == ""


def test_an_unknown_family_is_refused():
    with pytest.raises(TypeError, match="family 'modern' is none of classic"):
        type("Modern", (MethodSpec,), {"name": "modern", "family": "modern"})
    with pytest.raises(ValueError, match="unknown method family 'modern'; known: classic"):
        catalogue.family_members("modern")


# ------------------------------------------------------------------ all of them over a corrupted stream


def _run_argv(data, out) -> list[str]:
    """`shiftlab run` of the corruption suite (one corruption, generated): the classic methods with their specs'
    small test configs, zero-shot and TDA beside them; 4 images in batches of 2 (2 batches)."""
    names = classic_on_resnet()
    sets = [a for name in names for field, value in {**spec(name).offline_config, **spec(name).test_config}.items()
            for a in ("--set", f"{name}.{field}={value!r}")]
    return ["run", "--suite", "corruption", "--dataset", "imagenet-r", "--corruptions", "fog", "--severity", "5",
            "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none", "--views", "1",
            "--workers", "0", "--batch-size", "2", "--seed", "3", "--device", "cpu", "--no-progress",
            "--allow-partial", "--online-checkpoint-seconds", "0", "--methods", ",".join([*SINGLE_IMAGE, *names]),
            "--set", "tda.text_head=zeroshot", *sets, "--out", str(out)]


@pytest.mark.slow
def test_every_classic_method_over_a_corrupted_stream_resumes_exactly_and_is_tabled_apart(tmp_path, capsys):
    data = make_imagenet_r(tmp_path / "data", classes=(0, 50), per_class=2, size=(40, 32)).parent
    methods = [*SINGLE_IMAGE, *classic_on_resnet()]
    assert cli_main(_run_argv(data, tmp_path / "whole")) == 0
    whole = json_lines(tmp_path / "whole" / "fog-5" / "records.jsonl")
    assert sorted({r["method"] for r in whole}) == sorted(methods) and len(whole) == 4 * len(methods)
    assert not [r for r in whole if "error" in r]

    # killed (SIGKILL) after the first batch's checkpoint: its online records are only in the checkpoint
    out = tmp_path / "killed"
    with GatedRun(tmp_path / "gate", _run_argv(data, out), at="after_checkpoint:1") as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    cut = json_lines(out / "fog-5" / "records.jsonl")
    first = json.loads((out / "fog-5" / "stream.json").read_text())["ids"][:2]
    online = [n for n in methods if not spec(n).episodic]
    assert sorted((r["method"], r["id"]) for r in cut) == sorted((m, i) for m in methods if m not in online
                                                                 for i in first)
    assert len(online) >= 5 and not (out / "suite.md").exists()
    capsys.readouterr()
    assert cli_main(_run_argv(data, out) + ["--resume"]) == 0
    assert f"{2 * len(online)} online record(s) restored from the last checkpoint" in capsys.readouterr().err
    assert comparable(json_lines(out / "fog-5" / "records.jsonl")) == comparable(whole)
    shared = json.loads((out / "fog-5" / "run.json").read_text())["shared"]
    assert shared["corruption"]["name"] == "fog" and shared["batch_size"] == 2

    # suite.md: the single-image rows first, every classic method under the batch-transductive label
    md = (out / "suite.md").read_text()
    label = f"**{catalogue.BLOCKS[catalogue.BATCH_TRANSDUCTIVE]}**"
    single, _, batch = md.partition(label)
    assert batch, md
    for name in SINGLE_IMAGE:
        assert f"| {name} |" in single and f"| {name} |" not in batch
    for name in classic_on_resnet():
        assert f"| {name} |" in batch and f"| {name} |" not in single
    # the report: each block its own labelled table in the suite and the results sections
    html = build_report([out], tmp_path / "report", n_resamples=10).read_text()
    suite = re.search(r'<section id="suite">.*?</section>', html, re.S).group(0)
    main_table = re.search(r'<table[^>]*id="suite-table-0".*?</table>', suite, re.S).group(0)
    batch_table = re.search(r'<table[^>]*id="suite-table-0-batch-transductive".*?</table>', suite, re.S).group(0)
    results = re.search(r'<section id="results">.*?</section>', html, re.S).group(0)
    metrics = re.search(r'<table[^>]*id="metrics-table".*?</table>', results, re.S).group(0)
    batch_metrics = re.search(r'<table[^>]*id="metrics-table-batch-transductive".*?</table>', results, re.S).group(0)
    for name in SINGLE_IMAGE:
        assert f">{name}<" in main_table and f">{name}<" not in batch_table
        assert f">{name}<" in metrics and f">{name}<" not in batch_metrics
    for name in classic_on_resnet():
        assert f">{name}<" in batch_table and f">{name}<" not in main_table
        # the results tables key a method that reads other test images by its block (report/load.py block_mark)
        assert f">{name} (batch-transductive)<" in batch_metrics and f">{name}" not in metrics

