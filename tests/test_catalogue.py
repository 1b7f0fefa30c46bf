"""The method catalogue (shiftlab.methods.catalogue.listing): read from the methods' specs, so that
`shiftlab methods`, the methods table and the CLI's flag checks answer without importing torch, and answer as the
classes do."""
from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

import shiftlab
from _registered import registered
from shiftlab import params
from shiftlab.attacks import catalogue as attack_catalogue
from shiftlab.cli import main as cli_main
from shiftlab.commands.checks import method_names, method_override
from shiftlab.methods.base import Method, ViewMethodConfig, get_method_class
from shiftlab.methods.catalogue import listing as catalogue
from shiftlab.methods.catalogue.declarations import MethodSpec
from shiftlab.params import param
from test_registry import CLASSNAMES, _numeric_fields, _outside

REPO = Path(__file__).resolve().parents[1]


def test_the_methods_table_is_read_from_the_specs():
    cells = [[c.strip() for c in line.strip("|").split(" | ")]
             for line in catalogue.readme_table(catalogue.entries()).splitlines() if line.startswith("| [`")]
    rows = {re.match(r"\[`(\w+)`\]", row[0]).group(1): row for row in cells}
    # one table per block (single-image, then the transductive ones), each episodic then online
    assert list(rows) == [n for b in catalogue.BLOCKS for kind in ("episodic", "online")
                          for n in shiftlab.list_methods(kind=kind) if catalogue.block(n) == b]
    assert "stata" in rows and catalogue.block("stata") == catalogue.BATCH_TRANSDUCTIVE
    # each cell read from the method's own spec: its published numbers (leaderboard, paper), recipe, fidelity
    table = catalogue.readme_table(catalogue.entries())
    sources = dict(re.findall(r"^(\d+)\. (.*)$", table, re.M))

    def published(row: list[str]) -> list[tuple[str, str]]:     # (number, its source) per published column
        return [(cell, "") if cell == "—" else (cell.split(" [")[0], sources[cell.split(" [")[1].rstrip("]")])
                for cell in row[4:7]]

    assert [n for n, _ in published(rows["tpt"])] == ["58.9", "59.11", "—"]
    assert "R-TPT paper" in published(rows["tpt"])[0][1] and "azshue/TPT README.md" in published(rows["tpt"])[1][1]
    assert [n for n, _ in published(rows["tda"])] == ["—", "62.58", "—"]
    # a number on another backbone in its own column; a transductive method's numbers say their block
    assert published(rows["scap"])[2][0] == "81.68 (batch-transductive)" and "figs/results_1.png" in \
        published(rows["scap"])[2][1]
    assert [n for n, _ in published(rows["tipple"])] == ["—", "64.17 (transductive)", "80.37 (transductive)"]
    # what each method reads, from its capabilities
    assert (rows["zeroshot"][3], rows["tent"][3]) == ("view features", "pixels (own tower)")
    assert rows["cosmic"][3] == "view features + its own frozen encoder"
    assert rows["zeroshot"][7] == "as leaderboard" and rows["mta"][7] == "precision fp16"
    assert "its code's values on 15 datasets" in rows["ctpt"][7] and rows["ctpt"][8] == "golden (λ 20, 50)"
    # each name links its folder's README.md, which exists
    for name, row in rows.items():
        link = re.match(r"\[`\w+`\]\((.*)\)", row[0]).group(1)
        assert link == catalogue.readme_link(name) and (REPO / link).is_file(), (name, link)


def test_the_protocols_and_published_numbers_are_the_methods():
    from shiftlab.methods.catalogue import protocols
    assert catalogue.protocols() == protocols.PROTOCOLS
    assert catalogue.default_protocol() == protocols.DEFAULT_PROTOCOL
    assert catalogue.unrecorded_protocol() == protocols.UNRECORDED_PROTOCOL
    assert catalogue.published()["ctpt"]["aliases"] == ["ctpt20"]
    assert [p["value"] for p in catalogue.published()["ctpt"]["published"]] == [57.7, 58.0, 4.57]


def test_the_attack_specs_answer_as_the_classes_do():
    from shiftlab.attacks import get_attack_class, list_attacks
    assert attack_catalogue.names() == list_attacks() == ["apgd_ce", "apgd_t", "autoattack", "fab_t", "pgd", "square"]
    for name in list_attacks():
        cls = get_attack_class(name)
        assert attack_catalogue.field_specs(name) == params.field_specs(cls.config_class)
        assert attack_catalogue.defaults(name) == dataclasses.asdict(cls.config_class())
        assert (cls.label_format, cls.details_format) == (attack_catalogue.entry(name)["label"],
                                                           attack_catalogue.entry(name)["details"])
    # `--set attack.FIELD=V` names the attack, so no method may be called so
    assert "attack" not in catalogue.names()


def test_the_specs_list_every_method_with_its_classes_fields():
    assert catalogue.names() == shiftlab.list_methods()
    for name in catalogue.names():
        assert catalogue.field_specs(name) == params.field_specs(get_method_class(name).spec.config_class), name
    assert [e["name"] for e in catalogue.entries()] == shiftlab.list_methods()


def _refusal(item: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        method_override(item)
    return str(info.value)


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_set_read_from_the_spec_refuses_as_create_method_does(name, tiny_model):
    for f, kind, rng in _numeric_fields(name):
        for value in [_outside(rng, kind), True, "fast"] + ([] if kind is float else [1.5]):
            with pytest.raises(ValueError) as info:
                shiftlab.create_method(name, tiny_model, CLASSNAMES, **{f.name: value})
            assert _refusal(f"{name}.{f.name}={value!r}") == str(info.value)
        good = getattr(get_method_class(name).spec.config_class(), f.name)
        assert method_override(f"{name}.{f.name}={good!r}") == (name, f.name, good)
    for f in dataclasses.fields(get_method_class(name).spec.config_class):
        rng = params.field_range(f)
        if rng is not None and rng.choices is not None:
            with pytest.raises(ValueError) as info:
                shiftlab.create_method(name, tiny_model, CLASSNAMES, **{f.name: "nosuch"})
            assert _refusal(f"{name}.{f.name}=nosuch") == str(info.value)


def test_names_and_fields_come_from_the_spec_not_the_class():
    @dataclasses.dataclass
    class Config(ViewMethodConfig):
        lr: float = param(10.0, ge=10)

    spec = type("SpecOnly", (MethodSpec,), {"name": "test_spec_only", "impl": "shiftlab.nosuch_module:Nothing",
                                           "config_class": Config, "summary": "test: a spec without a class"})
    with registered("test_spec_only", spec=spec):
        with pytest.raises(argparse.ArgumentTypeError, match=r"test_spec_only\.lr: 0\.01 is out of range; must be "
                                                             r"a finite float >= 10"):
            method_override("test_spec_only.lr=0.01")
        assert method_override("test_spec_only.lr=12") == ("test_spec_only", "lr", 12.0)
        assert method_names("test_spec_only,tpt") == ["test_spec_only", "tpt"]
        with pytest.raises(ModuleNotFoundError):   # only building it looks for the class
            get_method_class("test_spec_only")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown method nope"):
        method_names("tpt,nope")


@dataclasses.dataclass
class _ScaleConfig(ViewMethodConfig):
    factor: float = param(2.0, gt=0)


class _Scale(Method):
    config_class = _ScaleConfig
    summary = "test: a method only this test registers"


def test_a_method_registered_at_run_time_is_listed_and_checked(capsys):
    with registered("test_scale", _Scale):
        assert method_names("test_scale,tpt") == ["test_scale", "tpt"]
        assert method_override("test_scale.factor=3") == ("test_scale", "factor", 3.0)
        assert "test_scale.factor: 0 is out of range" in _refusal("test_scale.factor=0")
        assert cli_main(["methods"]) == 0
        assert "test: a method only this test registers" in capsys.readouterr().out
    assert "test_scale" not in catalogue.names()


def test_a_command_reads_the_catalogue_once_and_sees_a_spec_registered_or_changed(monkeypatch, tmp_path, capsys):
    want = catalogue.entries()
    made = []
    real_entry = catalogue.entry
    monkeypatch.setattr(catalogue, "entry", lambda name: made.append(name) or real_entry(name))
    with catalogue.read_once():
        first = catalogue.entries()
        first[0]["summary"] = "changed by a caller"   # a caller's copy: the next reading is not changed
        assert catalogue.entries() == want != first
        assert len(made) == len(catalogue.names())   # made once, read back twice
        with registered("test_scale", _Scale):   # a spec registered inside: read again, with it
            assert "test_scale" in [e["name"] for e in catalogue.entries()]
        assert catalogue.entries() == want
    made.clear()   # a run's checks (refused here at its --data, before torch) make the entries once
    assert cli_main(["run", "--data", str(tmp_path / "none"), "--model", "shiftlab-tiny", "--methods", "tpt,tda",
                     "--out", str(tmp_path / "run")]) == 1
    assert "imagenet-r root does not exist" in capsys.readouterr().err and len(made) == len(catalogue.names())
    # outside one command every call reads the specs: a spec changed between two commands is seen
    monkeypatch.setattr(catalogue.spec("tpt"), "summary", "test: tpt's summary changed")
    assert {e["name"]: e["summary"] for e in catalogue.entries()}["tpt"] == "test: tpt's summary changed"
