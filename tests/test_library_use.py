"""The library as a newcomer copies it from the README and docs/LIBRARY.md (issue 40 cases 8 and 15): random
weights by the command line's spelling, one-line reprs, damaged weights refused at load, a run over any
map-style dataset object, and the results as a DataFrame."""
from __future__ import annotations

import pytest
import torch

import shiftlab
from conftest import make_tiny_model
from shiftlab.models import ModelLoadError

pytestmark = pytest.mark.usefixtures("one_thread")


# -- weights ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["none", "None", "random"])
def test_pretrained_none_is_random_weights_as_on_the_command_line(tiny_model, spelling):
    model = shiftlab.load_model("shiftlab-tiny", pretrained=spelling, seed=0)
    assert model.pretrained is None and model.checkpoint_sha256 is None and model.weights_seed == 0
    assert model.weights_sha256 == tiny_model.weights_sha256     # the same weights as pretrained=None


def test_run_config_pretrained_none_is_random_weights():
    from shiftlab.engine.config import check_run_config
    assert check_run_config(shiftlab.RunConfig(pretrained="none")).pretrained is None
    assert check_run_config(shiftlab.RunConfig(pretrained="openai")).pretrained == "openai"


@pytest.mark.parametrize("field", ["seed", "stream_seed", "ood_seed"])
@pytest.mark.parametrize("value", [-1, 2 ** 64])
def test_run_config_refuses_a_seed_no_generator_takes(field, value):
    """seed=-1 used to run, every sample an error record ("expected non-negative integer"); 2**64 a traceback."""
    from shiftlab.engine.config import check_run_config
    with pytest.raises(ValueError, match=rf"RunConfig\.{field}: {value} is out of range"):
        check_run_config(shiftlab.RunConfig(**{field: value}))
    assert getattr(check_run_config(shiftlab.RunConfig(**{field: 2 ** 64 - 1})), field) == 2 ** 64 - 1


@pytest.mark.parametrize("key", ["visual.conv1.weight", "text_projection", "logit_scale"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_checkpoint_with_non_finite_weights_is_refused_at_load_in_one_line(tmp_path, key, bad):
    """Issue 40 case 15: such a checkpoint used to load, and the whole run gave error records with exit 0."""
    sd = {k: v.clone().contiguous() for k, v in make_tiny_model(0).clip.state_dict().items()}
    sd[key].view(-1)[0] = bad
    path = tmp_path / "damaged.pt"
    torch.save(sd, path)
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and key in msg and "NaN or Inf" in msg


# -- reprs --------------------------------------------------------------------------------------------

def test_model_repr_is_one_line(tiny_model):
    text = repr(tiny_model)
    assert "\n" not in text and len(text) < 200
    assert "shiftlab-tiny" in text and "random weights (seed 0)" in text and "parameters" in text
    assert str(tiny_model) == text


def test_dataset_repr_is_one_line(tmp_path):
    from shiftlab.synthetic import make_imagenet_r
    data = make_imagenet_r(tmp_path, classes=range(0, 200, 10))
    dataset = shiftlab.build_dataset("imagenet-r", data)
    text = repr(dataset)
    assert "\n" not in text and len(text) < 300
    assert "imagenet-r" in text and "20 samples" in text and "200 classes" in text
    assert dataset.samples[0][0] not in text                      # no sample list


# -- a run over any dataset object, its results as a table -----------------------------------------------

class Toys:
    """A map-style dataset as a user writes one: (image, label) pairs and `classes`, torch-free images of two
    kinds (uint8 (H, W, 3) arrays, float (3, H, W) tensors in [0, 1]), no shiftlab type anywhere."""

    classes = ["bird", "cat", "dog"]   # as an image folder of these names labels them (sorted)

    def __init__(self, images, labels):
        self.images, self.labels_ = images, labels

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        import numpy as np
        pixels = np.array(self.images[i])
        if i % 2:
            return torch.from_numpy(pixels).permute(2, 0, 1).float() / 255, self.labels_[i]
        return pixels, self.labels_[i]


@pytest.fixture(scope="module")
def object_and_folder_runs(tmp_path_factory, one_thread_module):
    """The same six images run as a folder (`build_dataset`) and as a `Toys` object: zero-shot and TDA."""
    from _synthetic import make_image_folder
    from shiftlab.engine.loop import run
    tmp = tmp_path_factory.mktemp("objects")
    folder = shiftlab.build_dataset("imagefolder", make_image_folder(tmp / "data", Toys.classes, per_class=2))
    toys = Toys([folder.image(i) for i in range(len(folder))], folder.labels)
    assert folder.classnames == Toys.classes
    model = make_tiny_model(0)
    runs = {}
    for kind, dataset, name in (("folder", folder, "imagefolder"), ("object", toys, "my-toys")):
        cfg = shiftlab.RunConfig(dataset=name, methods=["zeroshot", "tda"], out=str(tmp / kind), workers=0,
                                 progress=False, views=4, batch_size=2)
        runs[kind] = (run(cfg, model=model, dataset=dataset), tmp / kind)
    return runs


def test_a_run_over_a_dataset_object_gives_the_records_of_the_same_images_in_a_folder(object_and_folder_runs):
    from _runs import json_lines
    recs = {kind: json_lines(out / "records.jsonl") for kind, (_, out) in object_and_folder_runs.items()}
    assert len(recs["object"]) == 12 and {r["path"] for r in recs["object"]} == {f"#{i}" for i in range(6)}
    strip = [{k: v for k, v in r.items() if k not in ("seconds", "path")} for r in recs["object"]]
    assert sorted(map(repr, strip)) == sorted(repr({k: v for k, v in r.items() if k not in ("seconds", "path")})
                                              for r in recs["folder"])
    summary, _ = object_and_folder_runs["object"]
    assert summary["config"]["dataset"] == "my-toys"             # recorded under its own name


def test_dataset_objects_refused_in_one_line():
    from shiftlab.datasets.base import DatasetError
    images = [torch.zeros(3, 8, 8), torch.zeros(3, 8, 8)]
    cases = [
        (Toys([], []), "is empty"),
        (type("NoNames", (), {"__len__": lambda s: 1, "__getitem__": lambda s, i: (images[0], 0)})(), "no class names"),
        (type("Normalised", (Toys,), {"__getitem__": lambda s, i: (images[i] - 0.5, 0)})(images, [0, 0]),
         "normalising transform"),
        (Toys([images[0].permute(1, 2, 0).numpy()], [7]), "label 7"),
    ]
    for dataset, expected in cases:
        with pytest.raises(DatasetError) as info:
            shiftlab.as_dataset(dataset)
        assert expected in str(info.value) and "\n" not in str(info.value)


def test_result_rows_are_the_summary_and_the_records(object_and_folder_runs):
    from shiftlab.results.frame import result_rows
    summary, out = object_and_folder_runs["object"]
    rows = result_rows(out)
    assert sorted((r["dataset"], r["method"], r["setting"]) for r in rows) == [("my-toys", "tda", "clean"),
                                                                               ("my-toys", "zeroshot", "clean")]
    assert {r["method"]: r["top1"] for r in rows} == {m: e["top1"] for m, e in summary["methods"].items()}
    assert {r["method"]: r["n"] for r in rows} == {"zeroshot": 6, "tda": 6}
    recs = result_rows(out, records=True)
    assert len(recs) == 12 and {r["dataset"] for r in recs} == {"my-toys"}
    top1 = sum(r["correct"] for r in recs if r["method"] == "zeroshot") / 6
    assert top1 == pytest.approx(summary["methods"]["zeroshot"]["top1"] / 100)


def test_load_results_is_a_dataframe_or_one_line_without_pandas(object_and_folder_runs, monkeypatch):
    import sys
    _, out = object_and_folder_runs["object"]
    monkeypatch.setitem(sys.modules, "pandas", None)               # pandas is optional: not installed
    with pytest.raises(ImportError) as info:
        shiftlab.load_results(out)
    assert "pip install pandas" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.undo()
    pytest.importorskip("pandas")
    frame = shiftlab.load_results(out)
    assert list(frame.columns[:4]) == ["dataset", "method", "setting", "top1"] and len(frame) == 2
    assert len(shiftlab.load_results(out, records=True)) == 12
