"""What each method declares about itself in its own module (shiftlab.methods.catalogue.cards): its recipe per protocol,
its published numbers, its per-dataset values, its text head. Parametrised over the registry, so a new
method that leaves one out fails here the moment it registers."""
from __future__ import annotations

import dataclasses
import re
import tomllib
from importlib import resources

import pytest

import shiftlab
from shiftlab import params
from shiftlab.datasets import DATASETS
from shiftlab.datasets.classes import load_templates
from shiftlab.methods import head_kinds as heads
from shiftlab.methods.base import get_method_class, make_config
from shiftlab.methods.catalogue import cards as facts
from shiftlab.methods.catalogue.protocols import DEFAULT_PROTOCOL, PAPER, PROTOCOLS, dataset_overrides, method_overrides
from shiftlab.results.published import canonical_method

METHODS = shiftlab.list_methods()


def _paper(method: str, dataset: str) -> dict:
    return dataset_overrides(PAPER, get_method_class(method).spec, dataset)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_declares_its_facts_in_its_own_class(name):
    cls = get_method_class(name).spec
    missing = [fact for fact in facts.REQUIRED if fact not in vars(cls)]
    assert not missing, f"{name} ({cls.__module__}) declares no {missing} (shiftlab.methods.catalogue.cards)"
    assert cls.summary and isinstance(facts.declared(cls, "fidelity"), str)
    assert set(facts.declared(cls, "protocols")) <= set(PROTOCOLS) - {DEFAULT_PROTOCOL}, \
        f"{name}: {DEFAULT_PROTOCOL} is the config's defaults, it takes no overrides"
    for protocol in facts.declared(cls, "protocols"):
        make_config(cls, **method_overrides(protocol, cls))    # every field known and in its range
    for entry in facts.declared(cls, "published"):
        assert facts.check_published(entry, PROTOCOLS) is None, (name, entry, facts.check_published(entry, PROTOCOLS))
        assert entry["dataset"] == DATASETS.canonical(entry["dataset"]), entry


@pytest.mark.parametrize("name", METHODS)
def test_dataset_values_name_canonical_datasets_and_known_fields(name):
    cls = get_method_class(name).spec
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    for dataset, values in facts.declared(cls, "dataset_values").items():
        assert dataset in DATASETS and DATASETS.canonical(dataset) == dataset, (name, dataset)
        assert set(values) <= fields, (name, dataset, set(values) - fields)
        make_config(cls, **method_overrides(PAPER, cls, dataset=dataset))
    for dataset in facts.declared(cls, "cupl_files"):
        assert DATASETS.canonical(dataset) == dataset


@pytest.mark.parametrize("name", METHODS)
def test_every_text_head_a_method_can_name_is_declared_once(name):
    cls = get_method_class(name).spec
    field = next((f for f in dataclasses.fields(cls.config_class) if f.name == "text_head"), None)
    kinds = {cls.text_head} if field is None else set(params.field_range(field).choices)
    assert kinds <= set(heads.head_kinds()), (name, kinds - set(heads.head_kinds()))
    if heads.TIP_CUPL in kinds:    # a directory of CuPL files is searched by the dataset's file name
        assert "cupl_file" in {f.name for f in dataclasses.fields(cls.config_class)}
        # DMN's code names a CuPL file for every labelled benchmark it ran, none for the corrupted sets
        # (ImageNet-C, CIFAR-C) and none for the label-free OOD sets
        labelled = {n for n in DATASETS.names() if DATASETS.get(n).classes is not None
                    and not DATASETS.get(n).corrupted}
        assert set(facts.declared(cls, "cupl_files")) == labelled - {"imagefolder"}
        assert heads.cupl_templates(cls) in heads.CUPL_TEMPLATES


def test_a_head_kind_is_declared_once():
    with pytest.raises(ValueError, match="declared twice"):
        heads.register_head("zeroshot", lambda cls, fields: "")


def test_facts_are_not_inherited():
    # BoostAdapter and TDA derive from one cache base (methods/common/tda_cache.py): TDA's number and recipe are
    # TDA's alone, and a registered method's subclass (CLIPTTA's OOD variant) declares its own
    from shiftlab.methods.common.tda_cache import TDACacheMethod
    tda, boost = get_method_class("tda").spec, get_method_class("boostadapter").spec
    assert issubclass(get_method_class("boostadapter"), TDACacheMethod) and issubclass(get_method_class("tda"),
                                                                                      TDACacheMethod)
    assert facts.declared(tda, "published")
    ood, cliptta = get_method_class("cliptta_ood").spec, get_method_class("cliptta").spec
    assert issubclass(get_method_class("cliptta_ood"), get_method_class("cliptta"))
    assert facts.label(ood) != facts.label(cliptta)
    assert facts.declared(boost, "published") == () and facts.label(boost) == "BoostAdapter"
    assert "views" in method_overrides(PAPER, tda) and "views" not in method_overrides(PAPER, boost)


def test_aliases_name_one_method_each():
    seen: dict[str, str] = {}
    for name in METHODS:
        for alias in (name, *facts.declared(get_method_class(name).spec, "aliases")):
            key = re.sub(r"[^a-z0-9]", "", alias.lower())
            assert seen.setdefault(key, name) == name, f"{alias!r} names {seen[key]} and {name}"
            assert canonical_method(alias) == name
    assert canonical_method("C-TPT") == "ctpt" and canonical_method("CLIP") == "zeroshot"
    assert canonical_method("ensemble80") == "prompt_ensemble" and canonical_method("nope") is None


def test_the_papers_suite_tables_name_methods_by_registry_names_and_agree_with_them():
    from shiftlab.methods.catalogue import listing as catalogue
    from shiftlab.results.published_suites import _data
    entries = {e["name"]: e for e in catalogue.entries()}
    for row in _data()["rows"]:
        assert row["method"] is None or row["method"] in METHODS, row["label"]
        if row["method"] and row["backbone"] == "RN50" and "imagenet-r" in row["values"]:
            # the same number the method declares for its own recipe (suite rows are all `paper` runs)
            assert row["values"]["imagenet-r"] == catalogue.published_value(entries[row["method"]], PAPER), row


# -- per-dataset values: the authors' own -------------------------------------------------------------------

def test_dataset_values_are_the_authors_values():
    assert _paper("ctpt", "flowers") == {"lambda_atfd": 50.0, "views": {"augmix": True}}   # test_tpt_ctpt_fg.sh
    assert _paper("ctpt", "R") == {"lambda_atfd": 20.0, "views": {"augmix": True}}         # test_tpt_ctpt_ds.sh
    assert _paper("tpt", "R") == {"views": {"augmix": False}}
    assert _paper("tpt", "dtd") == {"views": {"augmix": True}}                              # augmix=len(set_id)>1
    tda_r = _paper("tda", "imagenet_r")                                                     # configs/imagenet_r.yaml
    assert (tda_r["pos_capacity"], tda_r["pos_alpha"], tda_r["pos_beta"]) == (3, 1.0, 8.0)
    assert (tda_r["neg_alpha"], tda_r["neg_entropy_lower"], tda_r["neg_mask_lower"]) == (0.117, 0.2, 0.03)
    assert (_paper("tda", "K")["pos_alpha"], _paper("tda", "K")["pos_beta"]) == (2.363, 7.45)
    assert _paper("tda", "caltech101")["pos_alpha"] == 5.0                                  # configs/caltech101.yaml
    assert _paper("dmn_zs", "flowers102")["dynamic_weight"] == 10.0
    assert _paper("dmn_zs", "R")["dynamic_weight"] == 0.3
    assert _paper("zeroshot", "R") == {} and _paper("ecalp", "imagefolder") == {}
    assert facts.setting_source("tda", "imagenet-r") == "github.com/kdiAAA/TDA configs/imagenet_r.yaml"


def test_templates_per_dataset_are_each_methods_code():
    assert _paper("tda", "flowers102")["templates"] == ("a photo of a {}, a type of flower.",)
    assert _paper("dmn_zs", "flower102")["templates"] == ("a photo of a {}, a type of flower.",)
    assert _paper("dmn_zs", "stanford-cars")["templates"] == ("a photo of a {}, a type of car.",)
    assert "templates" not in _paper("tda", "imagenet-r")          # CLIP's 80 on R and K: the config's default
    assert _paper("tda", "imagenet-a")["templates"][0] == "itap of a {}." and len(_paper("tda", "A")["templates"]) == 7
    assert _paper("boostadapter", "dtd")["templates"] == _paper("dota", "dtd")["templates"] == ("{} texture.",)
    # a dataset the method's code names nothing for: the dataset's CoOp template, else "a photo of a {}."
    assert _paper("tda", "imagefolder") == {"templates": ("a photo of a {}.",)}
    for method in ("tda", "dmn_zs", "dpe", "boostadapter", "dota"):
        for dataset in DATASETS.names():
            assert all(t.count("{}") == 1 for t in _paper(method, dataset).get("templates", load_templates()))


def test_cupl_file_names_follow_dmns_table():
    files = facts.declared(get_method_class("dmn_zs").spec, "cupl_files")
    assert files["oxford-pets"] == "CuPL_prompts_oxfordpets.json"
    assert files["flowers102"] == "CuPL_prompts_flowers102.json"
    assert files["fgvc-aircraft"] == "CuPL_prompts_fgvcaircraft.json"
    assert files["stanford-cars"] == "CuPL_prompts_stanfordcars.json"
    assert {files[DATASETS.canonical(d)] for d in ("I", "A", "V", "R", "K")} == {"CuPL_prompts_imagenet.json"}
    assert facts.declared(get_method_class("dpe").spec, "cupl_files") == files


def _card(folder):
    return tomllib.loads(resources.files("shiftlab").joinpath("methods", folder, "card.toml").read_text())


SETTINGS = sorted(p.name for p in resources.files("shiftlab").joinpath("methods").iterdir()
                  if p.joinpath("card.toml").is_file() and "settings" in _card(p.name).get(p.name, {}))


def test_the_settings_tables_are_found():
    assert SETTINGS == ["boostadapter", "dmn_zs", "dota", "dpe", "tda"]


@pytest.mark.parametrize("method", SETTINGS)
def test_every_settings_entry_cites_its_source(method):
    data = _card(method)[method]["settings"]
    assert method in METHODS and set(data) <= {"about", "datasets", "templates", "cupl_files", "templates_of"}
    for section in ("datasets", "templates", "cupl_files"):
        for dataset, entry in data.get(section, {}).items():
            assert dataset in DATASETS.names() and entry["source"].startswith("github.com/"), (method, dataset)
    for entry in data.get("cupl_files", {}).values():
        assert re.fullmatch(r"CuPL_prompts_[a-z0-9]+\.json", entry["file"]) and "YBZh/DMN" in entry["source"]
