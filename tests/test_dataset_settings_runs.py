"""Per-dataset method settings in real runs: under `--protocol paper` the engine passes the run's dataset,
so each method runs (and records in summary.json) what its authors' code sets for that dataset; under
`leaderboard` the dataset changes nothing."""
from __future__ import annotations

import json

import pytest

from _synthetic import make_imagenet_r, make_split_dataset
from shiftlab.datasets import build_dataset
from shiftlab.datasets.classes import load_templates
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.methods.catalogue.protocols import dataset_overrides
from shiftlab.methods.tda.method import TDA
from shiftlab.models.text import TIP_TEMPLATES
from shiftlab.synthetic import tiny_clip

METHODS = ["ctpt", "tda", "dmn_zs"]
# --set views=4: fast, and must not touch the rest; DMN's paper head (tip_cupl) needs a CuPL file
SMALL = {"ctpt": {"views": 4}, "tda": {"views": 4}, "dmn_zs": {"views": 4, "text_head": "ensemble"}}


def _run(root, name, out, protocol, dataset=None):
    dataset = dataset or build_dataset(name, root)
    cfg = RunConfig(dataset=name, data=str(root), methods=list(METHODS), protocol=protocol, limit=1,
                    order="sorted", workers=0, progress=False, out=str(out), method_config=SMALL)
    run(cfg, model=tiny_clip(0), dataset=dataset)
    summary = json.loads((out / "summary.json").read_text())
    return summary["config"]["method_settings"]


@pytest.fixture(scope="module")
def flowers(tmp_path_factory):
    root = tmp_path_factory.mktemp("fg")
    make_split_dataset(root, "flowers102", real_images=True)
    return root


def _config(settings, method):
    entry = settings[method]
    return entry.get("config", entry)


def test_paper_runs_the_fine_grained_settings_and_templates(flowers, tmp_path):
    settings = _run(flowers, "Flowers102", tmp_path / "paper", "paper")   # an alias: the canonical name is used
    ctpt, tda, dmn = (_config(settings, m) for m in METHODS)
    assert ctpt["lambda_atfd"] == 50.0 and ctpt["ctx_init"] == "a photo of a"
    assert tda["pos_beta"] == 5.0                                   # TDA configs/oxford_flowers.yaml
    flowers = {k: v for k, v in dataset_overrides("paper", TDA, "flowers102").items() if k != "templates"}
    assert {k: tda[k] for k in flowers} == flowers
    assert list(tda["templates"]) == ["a photo of a {}, a type of flower."]
    assert dmn["dynamic_weight"] == 10.0
    assert list(dmn["templates"]) == ["a photo of a {}, a type of flower."]   # DMN's ID_to_prompts['flower102']
    assert settings["ctpt"]["views"]["n_views"] == 4   # --set still wins over the dataset's values


def test_leaderboard_ignores_the_dataset(flowers, tmp_path):
    settings = _run(flowers, "flowers102", tmp_path / "lb", "leaderboard")
    ctpt, tda, dmn = (_config(settings, m) for m in METHODS)
    assert ctpt["lambda_atfd"] != 50.0
    assert tda["templates"] is None and dmn["templates"] is None
    assert (tda["pos_alpha"], tda["pos_beta"], dmn["dynamic_weight"]) == (1.0, 8.0, 0.3)


def test_paper_on_imagenet_r_runs_its_own_values(tmp_path):
    root = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 40), per_class=1, size=(48, 40))
    settings = _run(root, "imagenet_r", tmp_path / "r", "paper", dataset=build_dataset("imagenet-r", str(root)))
    ctpt, tda, dmn = (_config(settings, m) for m in METHODS)
    assert ctpt["lambda_atfd"] == 20.0
    assert tda["templates"] is None                     # CLIP's 80 (configs/imagenet_r.yaml's classifier)
    assert dmn["dynamic_weight"] == 0.3
    assert tuple(dmn["templates"]) == TIP_TEMPLATES           # DMN's tip_imagenet_templates on ImageNet-R


def test_the_dataset_templates_are_the_head_the_method_uses():
    import torch

    from shiftlab.methods.base import create_method
    from shiftlab.methods.head_kinds import text_head
    from shiftlab.models.text import class_head
    model = tiny_clip(0)
    names = ["banded", "blotchy", "braided"]
    for method in ("tda",):
        paper = create_method(method, model, names, protocol="paper", dataset="dtd")
        assert paper.config.templates == ("{} texture.",)
        assert torch.allclose(text_head(paper), class_head(model, names, ["{} texture."]))
        plain = create_method(method, model, names, protocol="leaderboard", dataset="dtd")
        assert torch.allclose(text_head(plain), class_head(model, names, load_templates()))
