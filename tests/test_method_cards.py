"""A method's facts are data: each folder's card.toml (docs/METHOD_CARDS.md), read without torch; a variant
`extends` its base's table and replaces only what differs; spec.py declares no fact."""
from __future__ import annotations

import ast
import importlib.util
import sys
import tomllib
import types
from pathlib import Path

import pytest

from shiftlab.methods.catalogue import cards
from shiftlab.methods.catalogue.declarations import MethodSpec, spec, specs

METHODS = Path(cards.__file__).parents[1]
FOLDERS = sorted(p.parent.name for p in METHODS.glob("*/spec.py"))
TOOL = Path(__file__).resolve().parents[1] / "tools" / "spec_facts_to_toml.py"


def test_every_folder_has_a_card_and_its_spec_declares_no_fact():
    facts = set(cards.DEFAULTS) | {"bibtex", "summary", "adaptive"}
    for folder in FOLDERS:
        tables = tomllib.loads((METHODS / folder / cards.CARD).read_text())
        names = {n for n, s in specs().items() if s.__module__ == f"shiftlab.methods.{folder}.spec"}
        assert set(tables) == names, folder       # one table per registered name, no stray one
        tree = ast.parse((METHODS / folder / "spec.py").read_text())
        for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            assigned = {t.id for s in node.body if isinstance(s, ast.Assign) for t in s.targets
                        if isinstance(t, ast.Name)}
            assert not assigned & facts, (folder, node.name, assigned & facts)


def test_the_card_is_what_the_spec_carries():
    tpt = spec("tpt")
    assert tpt.label == "TPT" and tpt.protocols == {"paper": {"precision": "fp16"}}
    assert tpt.published[1] == {"dataset": "imagenet-r", "backbone": "RN50", "protocol": "paper", "metric": "top1",
                                "value": 59.11, "source": "github.com/azshue/TPT README.md@63ecbac, 'Main Results / "
                                "Out-of-Distribution Generalization' table (CLIP RN50)"}
    assert isinstance(tpt.published, tuple) and spec("ctpt").aliases == ("ctpt20",)   # arrays read as tuples
    assert spec("lame").protocols["paper"]["logit_scale"] is None                        # "None": the override None
    assert spec("tpt").adaptive.modes == ("full", "bpda", "eot") and spec("tda").adaptive.impl   # an Adaptive
    # a variant: the base's keys, its own replacing them (prompt_ensemble extends zeroshot)
    assert spec("prompt_ensemble").bibtex == spec("zeroshot").bibtex and spec("prompt_ensemble").bibtex
    assert spec("prompt_ensemble").label != spec("zeroshot").label
    assert spec("prompt_ensemble").published != spec("zeroshot").published


TABLES = {"base": {"label": "B", "fidelity": "golden", "aliases": ["b"]},
          "variant": {"extends": "base", "label": "V"},
          "grandchild": {"extends": "variant", "fidelity": "none"}}


def test_extends_resolves_along_the_chain():
    assert cards.resolve(TABLES, "variant") == {"label": "V", "fidelity": "golden", "aliases": ["b"]}
    assert cards.resolve(TABLES, "grandchild") == {"label": "V", "fidelity": "none", "aliases": ["b"]}
    assert cards.resolve(TABLES, "base") == TABLES["base"]


def test_extends_cannot_cycle_or_name_a_missing_table():
    cycle = {"a": {"extends": "b"}, "b": {"extends": "c"}, "c": {"extends": "a"}}
    with pytest.raises(ValueError, match=r"extends a cycle: a -> b -> c -> a"):
        cards.resolve(cycle, "a")
    with pytest.raises(ValueError, match="extends a cycle: self -> self"):
        cards.resolve({"self": {"extends": "self"}}, "self")
    with pytest.raises(ValueError, match=r"\[variant\] extends 'nowhere', which has no table"):
        cards.resolve({"variant": {"extends": "nowhere"}}, "variant")


def _scratch_module(tmp_path, monkeypatch, card: str) -> str:
    """A module beside a card.toml, as a method folder's spec.py is."""
    (tmp_path / "spec.py").write_text("")
    (tmp_path / cards.CARD).write_text(card)
    name = f"scratch_card_{abs(hash(card))}"
    module = types.ModuleType(name)
    module.__file__ = str(tmp_path / "spec.py")
    monkeypatch.setitem(sys.modules, name, module)
    return name


def _spec_class(module: str, body: dict) -> type:
    return type("ScratchSpec", (MethodSpec,), {"__module__": module, "impl": "x.y:Z", **body})


def test_a_spec_gets_its_facts_from_the_card(tmp_path, monkeypatch):
    module = _scratch_module(tmp_path, monkeypatch, '[scratch]\nlabel = "S"\nprotocols = {paper = {lr = 0.5}}\n'
                                                    '[scratch_v]\nextends = "scratch"\nlabel = "SV"\n')
    cls = _spec_class(module, {"name": "scratch_v"})
    assert (cls.label, cls.protocols, vars(cls)["label"]) == ("SV", {"paper": {"lr": 0.5}}, "SV")


@pytest.mark.parametrize(("card", "body", "error", "message"), [
    ('[scratch]\nlabel = "S"\n', {"name": "scratch", "label": "T"}, TypeError, "label is declared in its spec and in"),
    ('[other]\nlabel = "S"\n', {"name": "scratch"}, ValueError, r"no \[scratch\] table"),
    ('[scratch]\nlable = "S"\n', {"name": "scratch"}, ValueError, r"\[scratch\] holds lable, none of the facts"),
    ('[scratch]\nlabel = \n', {"name": "scratch"}, ValueError, "card.toml: "),
])
def test_a_bad_card_is_refused_in_one_line(tmp_path, monkeypatch, card, body, error, message):
    module = _scratch_module(tmp_path, monkeypatch, card)
    with pytest.raises(error, match=message):
        _spec_class(module, body)


def test_the_converter_writes_toml_that_reads_back_in_order():
    loaded = importlib.util.spec_from_file_location("spec_facts_to_toml", TOOL)
    tool = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(tool)
    facts = {"label": "X", "aliases": ("x1", "x 2"), "bibtex": "@misc{x,\n  title = {A \\'e}\n}",
             "protocols": {"paper": {"precision": "fp16", "views": {"n_views": 64, "augmix": True}, "lr": 1e-05,
                                     "scale": None, "text_head": "ensemble", "logit_scale": 100.0}},
             "dataset_values": {"imagenet-r": {"views": {"augmix": False}}, "dtd": {"templates": ("a {}.",)}},
             "published": ({"dataset": "imagenet-r", "value": 58.9, "source": 'the "R-TPT" table'},)}
    text = "\n".join(tool.table("x", facts, {"label": ["# a comment"]}))
    back = tomllib.loads(text)["x"]
    assert list(back["protocols"]["paper"]) == list(facts["protocols"]["paper"])   # the order kept
    assert back["protocols"]["paper"]["scale"] == "None" and back["bibtex"] == facts["bibtex"]
    assert cards._tuples(back)["published"] == facts["published"] and "# a comment\nlabel" in text
    assert cards._tuples(back)["dataset_values"] == facts["dataset_values"]
