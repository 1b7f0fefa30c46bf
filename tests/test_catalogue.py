"""The method catalogue (shiftlab/data/methods.json): generated from the registry, and checked against it,
so that `shiftlab methods` and the CLI's flag checks can read it without importing torch."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

import shiftlab
from shiftlab import catalogue, params
from shiftlab.attacks import catalogue as attack_catalogue
from shiftlab.cli import main as cli_main
from shiftlab.commands.checks import method_names, method_override
from shiftlab.methods.base import Method, ViewMethodConfig, get_method_class, register_method
from shiftlab.params import param
from test_registry import CLASSNAMES, _numeric_fields, _outside


def test_the_committed_catalogue_is_the_registrys():
    assert catalogue.render() == catalogue.PATH.read_text(encoding="utf-8"), (
        f"{catalogue.PATH.name} is out of date with the method registry: run `{catalogue.COMMAND}`")


def test_the_readme_methods_table_is_the_registrys():
    text = catalogue.README.read_text(encoding="utf-8")
    assert catalogue.readme_with_table(text, catalogue.build()) == text, (
        f"README.md's methods table is out of date with the method registry: run `{catalogue.COMMAND}`")
    cells = [[c.strip() for c in line.strip("|").split(" | ")]
             for line in catalogue.readme_table(catalogue.build()).splitlines() if line.startswith("| `")]
    rows = {row[0].strip("`"): row for row in cells}
    assert list(rows) == shiftlab.list_methods(kind="episodic") + shiftlab.list_methods(kind="online")
    # each cell read from the method's own class: its published numbers (leaderboard, paper), recipe, fidelity
    assert rows["tpt"][3:5] == ["58.9", "59.11"] and rows["tda"][3:5] == ["—", "62.58"]
    assert rows["zeroshot"][5] == "as leaderboard" and rows["mta"][5] == "precision fp16"
    assert "its code's values on 15 datasets" in rows["ctpt"][5] and rows["ctpt"][6] == "golden (λ 20, 50)"


def test_the_protocols_and_published_numbers_read_from_the_file_are_the_registrys(from_file):
    from shiftlab.methods import protocols
    assert catalogue.protocols() == protocols.PROTOCOLS
    assert catalogue.default_protocol() == protocols.DEFAULT_PROTOCOL
    assert catalogue.unrecorded_protocol() == protocols.UNRECORDED_PROTOCOL
    assert catalogue.published()["ctpt"]["aliases"] == ["ctpt20"]
    assert [p["value"] for p in catalogue.published()["ctpt"]["published"]] == [57.7, 58.0, 4.57]


def test_the_committed_attack_catalogue_is_the_registrys():
    assert attack_catalogue.render_file() == attack_catalogue.PATH.read_text(encoding="utf-8"), (
        f"{attack_catalogue.PATH.name} is out of date with the attack registry: run `{catalogue.COMMAND}`")


def test_the_attack_file_answers_as_the_registry_does(monkeypatch):
    from shiftlab.attacks import get_attack_class, list_attacks
    live = {n: (attack_catalogue.field_specs(n), attack_catalogue.defaults(n)) for n in list_attacks()}
    monkeypatch.setattr(attack_catalogue, "_registry_loaded", lambda: False)
    assert attack_catalogue.names() == list_attacks()
    for name, (specs, defaults) in live.items():
        assert attack_catalogue.field_specs(name) == specs == params.field_specs(get_attack_class(name).config_class)
        assert attack_catalogue.defaults(name) == defaults
    # `--set attack.FIELD=V` names the attack, so no method may be called so
    assert "attack" not in catalogue.names()


@pytest.fixture
def from_file(monkeypatch):
    """Answers from the committed file, as in a fresh `shiftlab` process (no registry imported)."""
    monkeypatch.setattr(catalogue, "_registry_loaded", lambda: False)


def test_the_file_lists_every_method_with_its_fields(from_file):
    assert catalogue.names() == shiftlab.list_methods()
    for name in catalogue.names():
        assert catalogue.field_specs(name) == params.field_specs(get_method_class(name).config_class), name
    assert [e["name"] for e in catalogue.entries()] == shiftlab.list_methods()


def _refusal(item: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        method_override(item)
    return str(info.value)


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_set_read_from_the_file_refuses_as_create_method_does(name, tiny_model, from_file):
    for f, kind, rng in _numeric_fields(name):
        for value in [_outside(rng, kind), True, "fast"] + ([] if kind is float else [1.5]):
            with pytest.raises(ValueError) as info:
                shiftlab.create_method(name, tiny_model, CLASSNAMES, **{f.name: value})
            assert _refusal(f"{name}.{f.name}={value!r}") == str(info.value)
        good = getattr(get_method_class(name).config_class(), f.name)
        assert method_override(f"{name}.{f.name}={good!r}") == (name, f.name, good)
    for f in dataclasses.fields(get_method_class(name).config_class):
        rng = params.field_range(f)
        if rng is not None and rng.choices is not None:
            with pytest.raises(ValueError) as info:
                shiftlab.create_method(name, tiny_model, CLASSNAMES, **{f.name: "nosuch"})
            assert _refusal(f"{name}.{f.name}=nosuch") == str(info.value)


def test_names_and_fields_come_from_the_file(from_file, monkeypatch):
    entries = json.loads(catalogue.PATH.read_text(encoding="utf-8"))["methods"]
    ctpt = next(e for e in entries if e["name"] == "ctpt")
    ctpt["fields"]["lr"] = {"type": "float", "range": {"ge": 10}}   # what a stale file would say
    monkeypatch.setattr(catalogue, "_committed", lambda: {e["name"]: e for e in entries})
    with pytest.raises(argparse.ArgumentTypeError, match=r"ctpt\.lr: 0\.01 is out of range; must be a finite float "
                                                         r">= 10"):
        method_override("ctpt.lr=0.01")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown method nope"):
        method_names("tpt,nope")


@dataclasses.dataclass
class _ScaleConfig(ViewMethodConfig):
    factor: float = param(2.0, gt=0)


class _Scale(Method):
    config_class = _ScaleConfig
    summary = "test: a method only this test registers"


def test_a_method_registered_at_run_time_is_listed_and_checked(capsys):
    register_method("test_scale")(_Scale)
    try:
        assert method_names("test_scale,tpt") == ["test_scale", "tpt"]
        assert method_override("test_scale.factor=3") == ("test_scale", "factor", 3.0)
        assert "test_scale.factor: 0 is out of range" in _refusal("test_scale.factor=0")
        assert cli_main(["methods"]) == 0
        assert "test: a method only this test registers" in capsys.readouterr().out
    finally:
        from shiftlab.methods import base
        base._REGISTRY.pop("test_scale")
    assert "test_scale" not in catalogue.names()


def test_the_check_command_says_when_the_file_is_stale(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "methods.json"
    stale.write_text(catalogue.render().replace('"lr": 0.005', '"lr": 0.006', 1), encoding="utf-8")
    readme = tmp_path / "README.md"
    text = catalogue.README.read_text(encoding="utf-8")
    readme.write_text(text.replace("| `tpt` | ", "| `tpt` | (stale) ", 1), encoding="utf-8")
    monkeypatch.setattr(catalogue, "PATH", stale)
    monkeypatch.setattr(catalogue, "README", readme)
    assert catalogue.main([]) == 1
    err = capsys.readouterr().err
    assert catalogue.COMMAND in err and "methods.json" in err and "README.md" in err
    assert catalogue.main(["--write"]) == 0 and catalogue.main([]) == 0
    assert stale.read_text(encoding="utf-8") == catalogue.render()
    assert readme.read_text(encoding="utf-8") == text
