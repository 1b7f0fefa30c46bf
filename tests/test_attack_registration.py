"""A second attack, registered by this test alone: `--attack NAME --set attack.FIELD=V` accepts its own
fields and refuses values outside their ranges in one line, and its records, run.json, summary.md and
report are labelled from its own config (nothing in the CLI, the summary or the report knows its fields)."""
from __future__ import annotations

import csv
import dataclasses
import json
import typing

import pytest
import torch

from shiftlab import params
from shiftlab.attacks import (
    ImageAttack,
    attack_config,
    attack_seed,
    eps_255,
    get_attack_class,
    list_attacks,
    register_attack,
)
from shiftlab.attacks import catalogue as attack_catalogue
from shiftlab.attacks.base import ATTACKS, AttackConfig
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.params import param
from shiftlab.report.build import build_report
from shiftlab.rundir import record_files
from shiftlab.synthetic import make_imagenet_r, tiny_clip


@dataclasses.dataclass
class SignNoiseConfig(AttackConfig):
    magnitude: float = param(2 / 255, ge=0, le=1)   # a test's own: no source
    seed: int | None = param(None, ge=0)


class SignNoise(ImageAttack):
    """Every pixel moved by +- magnitude (in grey levels, floored), the sign drawn per sample."""

    config_class = SignNoiseConfig
    summary = "test: random-sign noise of a fixed magnitude"
    label_format = "magnitude={magnitude:/255}"

    def attack_image(self, clean_u8, label, sample_id, run_seed):
        g = torch.Generator().manual_seed(attack_seed(run_seed, sample_id))
        sign = torch.randint(0, 2, clean_u8.shape, generator=g) * 2 - 1
        return (clean_u8.int() + eps_255(self.config.magnitude) * sign).clamp(0, 255).to(torch.uint8)


@pytest.fixture
def noise():
    register_attack("signnoise")(SignNoise)
    try:
        yield "signnoise"
    finally:
        ATTACKS.pop("signnoise")
    assert "signnoise" not in attack_catalogue.names()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=[3, 50, 120], per_class=1, size=(90, 70))


def argv(data, checkpoint, out, *extra):
    return ["run", "--allow-partial", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
            str(checkpoint), "--methods", "zeroshot,mta", "--views", "8", "--workers", "0", "--device", "cpu",
            "--no-progress", "--out", str(out), *extra]


@pytest.mark.parametrize("flags, says", [
    (["--set", "attack.magnitude=2"],
     "--set attack.magnitude=2: signnoise.magnitude: 2 is out of range; must be a finite float in [0, 1]"),
    (["--set", "attack.magnitude=-1/255"], "signnoise.magnitude: -1/255 is out of range"),
    (["--set", "attack.magnitude=lots"], "signnoise.magnitude: 'lots' is not a float"),
    (["--set", "attack.seed=-3"], "signnoise.seed: -3 is out of range; must be an integer >= 0 or None"),
    (["--set", "attack.steps=3"], "--set attack.steps=3: attack signnoise has no field steps; its fields: "
                                  "magnitude, seed"),
    (["--eps", "4/255"], "--eps: attack signnoise has no field eps; its fields: magnitude, seed"),
    (["--no-random-start"], "--random-start: attack signnoise has no field random_start"),
])
def test_its_fields_are_checked_before_any_work(noise, tmp_path, capsys, flags, says):
    out = tmp_path / "run"
    code = cli_main(argv(tmp_path / "no-data", tmp_path / "no.pt", out, "--attack", noise, *flags))
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0], lines
    assert "no-data" not in lines[0] and not out.exists()


def test_the_attacks_fields_without_an_attack_are_refused(tmp_path, capsys):
    for flags in (["--set", "attack.eps=4/255"], ["--steps", "3"]):
        code = cli_main(argv(tmp_path, tmp_path / "no.pt", tmp_path / "run", *flags))
        line = capsys.readouterr().err.strip()
        assert code == 2 and "no attack is chosen: add --attack NAME" in line and "\n" not in line
    # and PGD's values go through the same check (--set and the shortcut alike)
    code = cli_main(argv(tmp_path, tmp_path / "no.pt", tmp_path / "run", "--attack", "pgd", "--quantize", "ceil"))
    assert code == 2 and "--quantize: pgd.quantize: 'ceil' is not a choice" in capsys.readouterr().err


def test_a_library_run_refuses_its_bad_config_before_touching_the_run_dir(noise, data, tmp_path):
    cfg = RunConfig(data=str(data), methods=["zeroshot"], out=str(tmp_path / "run"), device="cpu", workers=0,
                    progress=False, attack={"name": noise, "magnitude": 5.0})
    with pytest.raises(ValueError, match=r"signnoise\.magnitude: 5\.0 is out of range"):
        run(cfg, model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_its_records_summary_and_report_read_its_own_config(noise, data, tmp_path, tiny_checkpoint):
    out = tmp_path / "run"
    assert cli_main(argv(data, tiny_checkpoint, out, "--attack", noise, "--set", "attack.magnitude=3/255",
                         "--clean-and-robust")) == 0
    recs = record_files.load_records(out)
    attacked = [r for r in recs if r["setting"] == noise]
    assert len(attacked) == 3 * 2 and not [r for r in recs if "error" in r]
    for r in attacked:   # its record fields (those its label names), then what every image attack measures
        assert set(r["attack"]) == {"name", "magnitude", "flipped", "linf_255"}
        assert r["attack"]["name"] == noise and r["attack"]["magnitude"] == pytest.approx(3 / 255)
        assert r["attack"]["linf_255"] == 3
    identity = json.loads((out / "run.json").read_text())
    assert identity["shared"]["attack"] == {"name": noise, "magnitude": pytest.approx(3 / 255), "seed": None}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attack"]["magnitude"] == pytest.approx(3 / 255) and summary["attack"]["n"] == 3
    md = (out / "summary.md").read_text()
    assert f"attack {noise} magnitude=3/255, success rate on zero-shot" in md and "steps" not in md

    report = build_report([out], tmp_path / "report", n_resamples=50)
    rows = list(csv.DictReader((report.parent / "metrics.csv").open()))
    robust = [r for r in rows if r["setting"] == noise]
    assert robust and all(r["setting_label"] == f"{noise} magnitude=3/255" for r in robust)
    assert all(r["run_label"].endswith(f", attack {noise} magnitude=3/255") and r["attack_eps"] == "" for r in rows)
    assert f"{noise} magnitude=3/255" in report.read_text()


def test_an_attack_only_a_script_knew_is_labelled_with_its_fields():
    assert "signnoise" not in attack_catalogue.names()   # as in a process that never ran the script
    record = {"name": "signnoise", "magnitude": 0.5, "flipped": True, "linf_255": 127}
    assert attack_catalogue.label(record) == "signnoise magnitude=0.5" and attack_catalogue.details(record) == ""
    assert attack_catalogue.label({"name": "pgd", "eps": 4 / 255, "steps": 7}) == "pgd eps=4/255"
    assert attack_catalogue.details({"name": "pgd", "eps": 4 / 255, "steps": 7}) == "steps=7"


def test_a_declaration_that_cannot_work_is_refused(noise):
    class Wrong(SignNoise):
        label_format = "eps={eps:/255}"
    with pytest.raises(ValueError, match=r"name field\(s\) \['eps'\] that SignNoiseConfig does not have"):
        register_attack("wrong")(Wrong)
    with pytest.raises(ValueError, match="already registered"):
        register_attack(noise)(Wrong)
    with pytest.raises(ValueError, match="'none' means no attack"):
        register_attack("none")(SignNoise)
    assert "wrong" not in ATTACKS


@pytest.mark.parametrize("name", list_attacks())
def test_every_attack_declares_a_range_for_each_number_and_labels_from_its_fields(name):
    cls = get_attack_class(name)
    for field, spec in params.field_specs(cls.config_class).items():
        arms = set(typing.get_args(spec.hint)) or {spec.hint}
        if arms & {int, float}:
            assert spec.range is not None, f"{name}.{field} has no declared range"
    defaults = attack_config({"name": name})
    assert cls.label(defaults).startswith(name) and set(cls.record_fields()) <= set(defaults)
