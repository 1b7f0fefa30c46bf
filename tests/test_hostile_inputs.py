"""The library refuses an input it cannot use in one line, as ValueError or TypeError naming the argument
(issue 29, item 5 and finding 6: `shiftlab.predict("some/dir/")` raised UnboundLocalError 'fmt', a
(0, 10, 3) array ZeroDivisionError, `method=None` AttributeError)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import shiftlab
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.synthetic import make_imagenet_r

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog"]
GOOD = np.zeros((9, 9, 3), np.uint8)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=[0, 1], per_class=1)


def _run(root: Path, tmp: Path, **kw):
    base = dict(data=str(root), model="shiftlab-tiny", pretrained=None, methods=["zeroshot"], views=1, limit=1,
                out=str(tmp / "run"), workers=0, progress=False, device="cpu", allow_partial=True)
    return lambda: shiftlab.run(RunConfig(**{**base, **kw}))


def hostile(model, method, data: Path, tmp: Path) -> dict[str, tuple]:
    """name -> (call, the text its message must hold)."""
    predict = shiftlab.predict
    return {
        # shiftlab.predict
        "predict: a directory": (lambda: predict(str(tmp), model=model, classes=CLASSES), "a directory"),
        "predict: (0, 10, 3) array": (lambda: predict(np.zeros((0, 10, 3), np.uint8), model=model, classes=CLASSES),
                                      "image has no pixels"),
        "predict: 0 x 0 PIL image": (lambda: predict(Image.new("RGB", (0, 0)), model=model, classes=CLASSES),
                                     "image has no pixels"),
        "predict: method=None": (lambda: predict(GOOD, method=None, model=model, classes=CLASSES), "method"),
        "predict: method=3": (lambda: predict(GOOD, method=3, model=model, classes=CLASSES), "method"),
        "predict: method list": (lambda: predict(GOOD, method=["zeroshot"], model=model, classes=CLASSES), "method"),
        "predict: image=None": (lambda: predict(None, model=model, classes=CLASSES), "image"),
        "predict: NaN float array": (lambda: predict(np.full((9, 9, 3), np.nan), model=model, classes=CLASSES),
                                     "image array must be uint8"),
        "predict: classes=None": (lambda: predict(GOOD, model=model, classes=None), "classes"),
        "predict: classes=[1, 2]": (lambda: predict(GOOD, model=model, classes=[1, 2]), "classnames[0]"),
        "predict: model=None": (lambda: predict(GOOD, model=None, classes=CLASSES), "model"),
        "predict: seed=NaN": (lambda: predict(GOOD, model=model, classes=CLASSES, seed=math.nan), "seed"),
        "predict: protocol=None": (lambda: predict(GOOD, model=model, classes=CLASSES, protocol=None), "protocol"),
        "predict: lr=NaN": (lambda: predict(GOOD, method="tpt", model=model, classes=CLASSES, lr=math.nan), "tpt.lr"),
        # create_method
        "create_method: name None": (lambda: shiftlab.create_method(None, model, CLASSES), "method"),
        "create_method: name 7": (lambda: shiftlab.create_method(7, model, CLASSES), "method"),
        "create_method: model None": (lambda: shiftlab.create_method("zeroshot", None, CLASSES), "model"),
        "create_method: model 'RN50'": (lambda: shiftlab.create_method("zeroshot", "RN50", CLASSES), "model"),
        "create_method: classnames 'cat'": (lambda: shiftlab.create_method("zeroshot", model, "cat"), "classnames"),
        "create_method: classnames None": (lambda: shiftlab.create_method("zeroshot", model, None), "classnames"),
        "create_method: unknown field": (lambda: shiftlab.create_method("zeroshot", model, CLASSES, nope=1), "nope"),
        # Method.predict
        "Method.predict: None": (lambda: method.predict(None), "views"),
        "Method.predict: no views": (lambda: method.predict(torch.zeros(0, 3, 64, 64)), "views"),
        "Method.predict: uint8": (lambda: method.predict(torch.zeros(1, 3, 64, 64, dtype=torch.uint8)), "views"),
        "Method.predict: array": (lambda: method.predict(np.zeros((1, 3, 64, 64), np.float32)), "views"),
        # Method.predict_image
        "predict_image: a directory": (lambda: method.predict_image(tmp), "a directory"),
        "predict_image: 0 x 0 array": (lambda: method.predict_image(np.zeros((0, 0, 3), np.uint8)),
                                       "image has no pixels"),
        "predict_image: (3, 0, 5) tensor": (lambda: method.predict_image(torch.zeros(3, 0, 5, dtype=torch.uint8)),
                                            "image has no pixels"),
        "predict_image: bytes": (lambda: method.predict_image(b"\x89PNG"), "image must be"),
        "predict_image: missing file": (lambda: method.predict_image(tmp / "nope.jpg"), "file not found"),
        "predict_image: seed None": (lambda: method.predict_image(GOOD, seed=None), "seed"),
        "predict_image: sample_id -1": (lambda: method.predict_image(GOOD, sample_id=-1), "sample_id"),
        # FeatureStore
        "FeatureStore: None": (lambda: shiftlab.FeatureStore(None), "root"),
        "FeatureStore: 3": (lambda: shiftlab.FeatureStore(3), "root"),
        "FeatureStore: a file": (lambda: shiftlab.FeatureStore(__file__), "not a feature store"),
        "FeatureStore: missing": (lambda: shiftlab.FeatureStore(tmp / "none"), "not a feature store"),
        "FeatureStore: mode": (lambda: shiftlab.FeatureStore(tmp / "fs", "x"), "mode"),
        # build_dataset
        "build_dataset: name None": (lambda: build_dataset(None, tmp), "dataset name"),
        "build_dataset: name 3": (lambda: build_dataset(3, tmp), "dataset name"),
        "build_dataset: root None": (lambda: build_dataset("imagenet-r", None), "root"),
        "build_dataset: root a file": (lambda: build_dataset("imagenet-r", __file__), "not a directory"),
        "build_dataset: classnames 'abc'": (lambda: build_dataset("imagenet-r", data, classnames="abc"),
                                            "classnames"),
        "build_dataset: empty folder": (lambda: build_dataset("imagenet-r", tmp / "empty"), "imagenet-r"),
        # run
        "run: None": (lambda: shiftlab.run(None), "RunConfig"),
        "run: a dict": (lambda: shiftlab.run({"data": str(data)}), "RunConfig"),
        "run: methods 'zeroshot'": (_run(data, tmp, methods="zeroshot"), "RunConfig.methods"),
        "run: methods None": (_run(data, tmp, methods=None), "RunConfig.methods"),
        "run: methods [None]": (_run(data, tmp, methods=[None]), "RunConfig.methods"),
        "run: views NaN": (_run(data, tmp, views=math.nan), "RunConfig.views"),
        "run: views 0": (_run(data, tmp, views=0), "RunConfig.views"),
        "run: limit -1": (_run(data, tmp, limit=-1), "RunConfig.limit"),
        "run: batch_size 0": (_run(data, tmp, batch_size=0), "RunConfig.batch_size"),
        "run: seed 'x'": (_run(data, tmp, seed="x"), "RunConfig.seed"),
        "run: data None": (_run(data, tmp, data=None), "RunConfig.data"),
        "run: model None": (_run(data, tmp, model=None), "RunConfig.model"),
        "run: out None": (_run(data, tmp, out=None), "RunConfig.out"),
        "run: device 'gpu7'": (_run(data, tmp, device="gpu7"), "device"),
        "run: method_config {'zeroshot': 3}": (_run(data, tmp, method_config={"zeroshot": 3}),
                                               "RunConfig.method_config"),
        "run: classnames 'ab'": (_run(data, tmp, classnames="ab"), "RunConfig.classnames"),
        "run: online_checkpoint_seconds NaN": (_run(data, tmp, online_checkpoint_seconds=math.nan),
                                               "RunConfig.online_checkpoint_seconds"),
        "run: features_dtype 'int8'": (_run(data, tmp, features_dtype="int8"), "RunConfig.features_dtype"),
        "run: a directory as data file": (_run(data, tmp, data=__file__), "not a directory"),
    }


def test_hostile_inputs_raise_value_or_type_errors_naming_the_argument(data, tmp_path, tiny_model):
    (tmp_path / "empty").mkdir()
    method = shiftlab.create_method("zeroshot", tiny_model, CLASSES)
    wrong = []
    for name, (call, says) in hostile(tiny_model, method, data, tmp_path).items():
        try:
            call()
        except (ValueError, TypeError) as exc:
            message = str(exc)
            if says not in message or "\n" in message:
                wrong.append(f"{name}: {type(exc).__name__}: {message!r} (expected {says!r} in one line)")
        except Exception as exc:   # noqa: BLE001 - what this test exists to catch
            wrong.append(f"{name}: {type(exc).__name__} escaped: {exc}")
        else:
            wrong.append(f"{name}: accepted")
    assert not wrong, "\n".join(wrong)
    assert not (tmp_path / "run").exists()   # every refused run refused before its directory was made


def test_a_good_call_still_works(tiny_model, data, tmp_path):
    # the checks refuse only what they should: the tiny model on a 1 x 1 image, a Path as data and out
    assert shiftlab.predict(np.zeros((1, 1, 3), np.uint8), model=tiny_model, classes=CLASSES).name in CLASSES
    summary = shiftlab.run(RunConfig(data=data, model="shiftlab-tiny", pretrained=None, methods=("zeroshot",),
                                     views=1, limit=1, out=tmp_path / "run", workers=0, progress=False,
                                     device="cpu", allow_partial=True))
    assert summary["methods"]["zeroshot"]["n"] == 1
