"""Both protocols end to end on the tiny model: each method sees the views its recipe declares, methods with
equal recipes share one encoding (image-tower rows counted), and a recorded config reruns identically."""
from __future__ import annotations

import json

import pytest
import torch

from shiftlab.datasets import build_dataset
from shiftlab.datasets.imageio import decode_image
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.engine.step import Evaluator
from shiftlab.rundir import record_files
from shiftlab.synthetic import make_imagenet_r, tiny_clip
from shiftlab.views.generator import ViewConfig, ViewGenerator

METHODS = ["zeroshot", "view_ensemble", "zero", "mta", "ctpt", "tda", "dmn_zs"]
N_SAMPLES = 2
# rows through the image tower per sample: one encoding per distinct recipe family (CPU: one precision)
ROWS = {"leaderboard": 64,              # everything is a prefix of the shared 64 views
        "paper": 64 + 64 + 32}          # plain 64 (zero, mta, ...), AugMix 64 (ctpt, tda), DMN's 32 at scale 0.5-1


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 40), per_class=1, size=(80, 64))
    return root, build_dataset("imagenet-r", str(root), allow_partial=True) if _takes_allow_partial() else \
        build_dataset("imagenet-r", str(root))


@pytest.fixture(scope="module")
def cupl(data, tmp_path_factory) -> dict[str, dict[str, str]]:
    """Stand-in CuPL descriptions for the dataset's classes (the paper protocol's DMN-ZS head needs them)."""
    _, dataset = data
    path = tmp_path_factory.mktemp("cupl") / "cupl.json"
    path.write_text(json.dumps({c.replace("_", " "): [f"A {c} seen from afar.", f"Some {c}, drawn."]
                                for c in dataset.classnames}))
    return {"dmn_zs": {"cupl_file": str(path)}}


def _takes_allow_partial() -> bool:
    import inspect
    return "allow_partial" in inspect.signature(build_dataset).parameters


def _run(data, out, protocol, monkeypatch, **extra):
    root, dataset = data
    model = tiny_clip(0)
    rows: list[int] = []
    seen: dict[str, list[torch.Tensor]] = {}
    encode = model.encode_normalized

    def counting(x):
        rows.append(x.shape[0])
        return encode(x)

    model.encode_normalized = counting
    predict = Evaluator.predict

    def recording(self, name, ctxs):
        seen.setdefault(name, []).extend(c.views for c in ctxs)
        return predict(self, name, ctxs)

    monkeypatch.setattr(Evaluator, "predict", recording)
    cfg = RunConfig(dataset="imagenet-r", data=str(root), methods=list(METHODS), protocol=protocol,
                    limit=N_SAMPLES, order="sorted", workers=0, progress=False, out=str(out), **extra)
    summary = run(cfg, model=model, dataset=dataset)
    monkeypatch.setattr(Evaluator, "predict", predict)
    return summary, rows, seen, model


@pytest.mark.parametrize("protocol", ["leaderboard", "paper"])
def test_views_per_method_as_declared_and_shared_encodings(data, cupl, tmp_path, protocol, monkeypatch):
    summary, rows, seen, model = _run(data, tmp_path / protocol, protocol, monkeypatch,
                                      method_config=cupl if protocol == "paper" else {})
    _, dataset = data
    assert sum(rows) == ROWS[protocol] * N_SAMPLES
    settings = summary["config"]["method_settings"]
    assert summary["config"]["protocol"] == protocol
    sid = sorted(range(len(dataset)))[0]
    img = decode_image(dataset.path(sid))
    for name in METHODS:
        recipe = settings[name].get("views", {"n_views": 1})
        got = seen[name][0]
        assert got.shape[0] == recipe["n_views"], name
        if recipe["n_views"] > 1:
            from shiftlab.views.recipe import ViewRecipe
            want = ViewGenerator(ViewConfig.from_recipe(ViewRecipe.coerce(recipe)), seed=0,
                                 preprocess=model.preprocess)(img, sid)
            torch.testing.assert_close(got, model.normalize(want.float() / 255), rtol=0, atol=1e-6)
    if protocol == "paper":
        assert settings["dmn_zs"]["views"]["scale"] == [0.5, 1.0] and settings["ctpt"]["views"]["augmix"]
        assert settings["tda"]["views"]["augmix"] and settings["ctpt"]["precision"] == "fp16"
        assert settings["dmn_zs"]["text_head"] == "tip_cupl"
        assert settings["dmn_zs"]["cupl_file"] == cupl["dmn_zs"]["cupl_file"]


def test_paper_protocol_refuses_dmn_zs_without_cupl_descriptions(data, tmp_path, monkeypatch):
    with pytest.raises(ValueError) as err:
        _run(data, tmp_path / "run", "paper", monkeypatch)
    assert str(err.value) == (
        "dmn_zs.cupl_file: text_head 'tip_cupl' needs CuPL's class descriptions (a JSON file, class name -> "
        "sentences, not shipped): pass dmn_zs's cupl_file='PATH' (RunConfig: method_config={'dmn_zs': "
        "{'cupl_file': 'PATH'}}) (or dmn_zs's text_head='ensemble' (RunConfig: method_config={'dmn_zs': "
        "{'text_head': 'ensemble'}}))")
    from shiftlab.options import speaking_cli
    with speaking_cli(), pytest.raises(ValueError) as err:   # the CLI's spelling of the same refusal (#34)
        _run(data, tmp_path / "run", "paper", monkeypatch)
    assert str(err.value).endswith("pass --set dmn_zs.cupl_file=PATH (or --set dmn_zs.text_head=ensemble)")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.slow
def test_recorded_config_reruns_identically(data, cupl, tmp_path, monkeypatch):
    first, _, _, _ = _run(data, tmp_path / "a", "paper", monkeypatch, method_config=cupl)
    settings = first["config"]["method_settings"]
    # the CuPL file's digest identifies the run (run.json) but is no setting a run takes back
    run_json = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run_json["methods"]["dmn_zs"]["cupl_file_sha256"] and "cupl_file_sha256" not in settings["dmn_zs"]
    again, _, _, _ = _run(data, tmp_path / "b", "paper", monkeypatch, method_config=json.loads(json.dumps(settings)))
    assert again["config"]["method_settings"] == settings
    strip = lambda recs: sorted(json.dumps({k: v for k, v in r.items() if k != "seconds"}, sort_keys=True)  # noqa: E731
                                for r in recs)
    assert strip(record_files.load_records(tmp_path / "a")) == strip(record_files.load_records(tmp_path / "b"))
