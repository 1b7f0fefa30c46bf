"""AutoAttack through the CLI: `--attack-subset` (a seeded subset, recorded in run.json), a robust run
killed at a gate and resumed to identical records, and the sanity checks in summary.json and summary.md."""
from __future__ import annotations

import json

import pytest

from _gate import GatedRun
from _golden import MODEL_FILE
from _runs import comparable
from shiftlab.cli import main as cli_main
from shiftlab.engine.loop import attack_subset_ids
from shiftlab.rundir import record_files
from shiftlab.synthetic import make_imagenet_r

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 25), per_class=1, size=(64, 64))


def _argv(data, out, golden_dir, *extra):
    # the golden tiny CLIP: its zero-shot predictions fall under small budgets (tiny_clip(0)'s hardly move)
    return ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(golden_dir / MODEL_FILE),
            "--methods", "zeroshot", "--batch-size", "1", "--limit", "6", "--device", "cpu", "--workers", "0",
            "--no-progress", "--allow-partial", "--out", str(out), "--clean-and-robust", *extra]


# attack_misclassified: zero-shot on the golden tiny CLIP gets these images wrong, and AutoAttack as the
# original would leave them clean
AUTOATTACK = ["--attack", "autoattack", "--eps", "4/255", "--steps", "2", "--set", "attack.targets=2",
              "--set", "attack.queries=5", "--set", "attack.attack_misclassified=True", "--attack-subset", "3"]


@pytest.fixture(scope="module")
def reference(data, golden_dir, tmp_path_factory, one_thread_module):
    out = tmp_path_factory.mktemp("ref") / "run"
    assert cli_main(_argv(data, out, golden_dir, *AUTOATTACK)) == 0
    return out


def test_attack_subset_attacks_a_seeded_subset_recorded_in_run_json(reference):
    recs = record_files.load_records(reference)
    run = json.loads((reference / "run.json").read_text())
    assert run["shared"]["attack_subset"] == 3
    stream = json.loads((reference / "stream.json").read_text())["ids"]
    subset = attack_subset_ids(stream, 3, 0)
    assert len(subset) == 3 and subset <= set(stream)
    assert {r["id"] for r in recs if r["setting"] == "clean"} == set(stream)
    assert {r["id"] for r in recs if r["setting"] == "autoattack"} == subset
    assert attack_subset_ids(stream[::-1], 3, 0) == subset != attack_subset_ids(stream, 3, 1)   # seed, not order
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["methods"]["zeroshot"]["robust"]["n"] == 3 and summary["attack"]["n"] == 3
    for r in recs:
        if r["setting"] == "autoattack":
            a = r["attack"]
            assert a["broken_by"] in (None, "apgd_ce", "apgd_t", "fab_t", "square")
            assert isinstance(a["noise_flipped"], bool)
            assert (a["norm"], a["budget"], a["threat"]) == ("Linf", 4 / 255, "eps=4/255")
    flips = [r["attack"]["noise_flipped"] for r in recs if r["setting"] == "autoattack"]
    assert summary["attack"]["noise_success_rate"] == pytest.approx(100 * sum(flips) / 3)
    assert isinstance(summary["sanity"], list)
    assert "autoattack eps=4/255 parts=apgd_ce,apgd_t,fab_t,square steps=2" in (reference / "summary.md").read_text()


@pytest.mark.slow
def test_a_killed_robust_run_resumes_to_identical_records(data, golden_dir, reference, tmp_path, capsys):
    out = tmp_path / "run"
    with GatedRun(tmp_path / "gate", _argv(data, out, golden_dir, *AUTOATTACK), at="after_step:2") as child:
        child.wait_reached()
        child.kill()
    assert 0 < len(record_files.load_records(out)) < len(record_files.load_records(reference))
    assert cli_main(_argv(data, out, golden_dir, *AUTOATTACK, "--resume")) == 0
    assert comparable(record_files.iter_records(out / "records.jsonl")) == \
        comparable(record_files.iter_records(reference / "records.jsonl"))
    # another subset is another run: refused rather than mixed
    capsys.readouterr()
    assert cli_main(_argv(data, out, golden_dir, *AUTOATTACK[:-1], "4", "--resume")) != 0
    assert "other settings (attack_subset 3 -> 4)" in capsys.readouterr().err


def test_records_carry_the_broken_images_verdicts(reference):
    recs = [r for r in record_files.load_records(reference) if r["setting"] == "autoattack"]
    # every sample is misclassified clean, so the first part takes it (attack_misclassified) and moves it
    assert [r["attack"]["broken_by"] for r in recs] == ["apgd_ce"] * 3
    assert all(r["attack"]["linf_255"] == 4 for r in recs)


def test_a_too_weak_attack_is_flagged_in_the_summary(data, golden_dir, tmp_path):
    # APGD without a single step at 16/255, leaving the misclassified samples clean as the original does:
    # it changes no zero-shot prediction, while uniform noise of the same budget changes some
    out = tmp_path / "run"
    argv = _argv(data, out, golden_dir, "--attack", "apgd_ce", "--eps", "16/255", "--steps", "0", "--limit", "4")
    assert cli_main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attack"]["success_rate"] < summary["attack"]["noise_success_rate"]
    [warning] = [w for w in summary["sanity"] if w["check"] == "noise_beats_attack"]
    assert warning["method"] == "zeroshot" and "weaker than random noise" in warning["message"]
    assert "SANITY CHECK FAILED: zeroshot: uniform noise at eps=16/255" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_an_eps_list_is_one_pass_with_a_setting_per_budget(data, golden_dir, tmp_path):
    out = tmp_path / "run"
    argv = _argv(data, out, golden_dir, "--attack", "pgd", "--eps", "4/255,0,1/255", "--steps", "1", "--limit", "3")
    assert cli_main(argv) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["shared"]["attack"]["eps"] == [4 / 255, 0.0, 1 / 255]
    assert run["shared"]["attack"]["alpha"] == [1 / 255, 0.0, 1 / 1020]     # what follows from each budget
    recs = record_files.load_records(out)
    assert {r["setting"] for r in recs} == {"clean", "pgd@eps4", "pgd@eps0", "pgd@eps1"}
    for r in recs:
        if r["setting"] != "clean":
            want = {"pgd@eps4": 4 / 255, "pgd@eps0": 0.0, "pgd@eps1": 1 / 255}[r["setting"]]
            assert r["attack"]["eps"] == want and r["attack"]["linf_255"] <= round(want * 255)
    by = {(r["id"], r["setting"]): r for r in recs}
    for sid in {r["id"] for r in recs}:   # the 64x64 images are their own base view: eps 0 is the clean image
        assert by[(sid, "pgd@eps0")]["pred"] == by[(sid, "clean")]["pred"]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["attacks"]) == ["pgd@eps4", "pgd@eps0", "pgd@eps1"]           # the budgets' order
    assert summary["attacks"]["pgd@eps1"]["eps"] == 1 / 255 and summary["attack"]["eps"] == 4 / 255
    zs = summary["methods"]["zeroshot"]
    assert zs["robust"]["setting"] == "pgd@eps4" and list(zs["robust_by_setting"]) == list(summary["attacks"])
    assert "robust top-1 (pgd@eps1)" in (out / "summary.md").read_text()
    # resumed: nothing to do, the same records
    assert cli_main(argv + ["--resume"]) == 0
    assert len(record_files.load_records(out)) == len(recs)
