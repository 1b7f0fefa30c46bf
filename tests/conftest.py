"""Shared fixtures: a tiny random CLIP, the golden folder, synthetic data."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import shiftlab
from shiftlab.models.architectures import builtin_configs

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = builtin_configs()["shiftlab-tiny"]  # the golden architecture


def make_tiny_model(seed: int = 0) -> shiftlab.ClipModel:
    from shiftlab.synthetic import tiny_clip
    return tiny_clip(seed)


@pytest.fixture(scope="session")
def tiny_model() -> shiftlab.ClipModel:
    return make_tiny_model()


@pytest.fixture(scope="session")
def tiny_vit_model() -> shiftlab.ClipModel:
    return shiftlab.load_model("shiftlab-tiny-vit", None, seed=0)


def model_for_method(request: pytest.FixtureRequest, tiny_model: shiftlab.ClipModel) -> shiftlab.ClipModel:
    """The tiny CLIP a registry-wide test runs its `name` parameter's method on: the tiny ResNet, or the tiny ViT
    for a method whose spec's `towers` exclude ResNets (TCA)."""
    from shiftlab.methods.catalogue.declarations import spec, spec_names
    name = getattr(getattr(request.node, "callspec", None), "params", {}).get("name")
    if name in spec_names() and "resnet" not in spec(name).towers:
        return request.getfixturevalue("tiny_vit_model")
    return tiny_model


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The tiny random CLIP saved as an OpenAI-format state dict: open_clip's ResNet CLIP keys are
    OpenAI's, so `--model shiftlab-tiny --pretrained FILE` rebuilds exactly `make_tiny_model(0)`."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny_openai.pt"
    torch.save(make_tiny_model(0).clip.state_dict(), path)
    return path


@pytest.fixture(autouse=True, scope="session")
def _no_head_cache(tmp_path_factory):
    # Class heads read from ~/.cache would make a test depend on what an earlier run left there (and on
    # the thread count it built them with); tests/test_head_cache.py turns the cache on where it is tested.
    import os
    old = {k: os.environ.get(k) for k in ("SHIFTLAB_HEAD_CACHE", "SHIFTLAB_CACHE")}
    os.environ["SHIFTLAB_HEAD_CACHE"] = "0"
    os.environ["SHIFTLAB_CACHE"] = str(tmp_path_factory.mktemp("shiftlab-cache"))
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True, scope="session")
def _temp_files_inside_pytests_folder(tmp_path_factory):
    # What the tests, their subprocesses and the libraries under them (torchrun's agent, torch's compiler,
    # wandb) put in the temp folder lands in pytest's own folder, removed with it (pyproject's
    # tmp_path_retention_policy), instead of piling up in /tmp run after run on a machine whose disk CI shares.
    import os
    import tempfile
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    tempfile.tempdir = None
    yield
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None


@pytest.fixture(scope="session")
def golden_dir(tmp_path_factory) -> Path:
    """The golden fixtures (tests/fixtures/golden, stored compactly) in the format the tests read."""
    from _golden import materialize
    return materialize(tmp_path_factory.mktemp("golden"))


@pytest.fixture(scope="session")
def golden_model(golden_dir) -> tuple[shiftlab.ClipModel, list[str]]:
    """The golden tiny CLIP (frozen) and its 200 class names, loaded once for the golden tests."""
    import json
    classnames = json.loads((golden_dir / "golden.json").read_text())["classnames"]
    return shiftlab.load_model("shiftlab-tiny", str(golden_dir / "tiny_clip_openai.pt")), classnames


@pytest.fixture(scope="module")
def golden_vit(golden_dir):
    """The golden tiny ViT CLIP, its 200 class names and their class heads, per test module (the golden tests of
    the methods that read a ViT tower or adapt one)."""
    import json

    from _golden import VIT_MODEL_FILE
    from shiftlab.methods.context import ClassHeads
    names = json.loads((golden_dir / "golden.json").read_text())["classnames"]
    model = shiftlab.load_model("shiftlab-tiny-vit", str(golden_dir / VIT_MODEL_FILE))
    return model, names, ClassHeads(model, names)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """torch on one CPU thread inside, the previous count restored after. The golden values were made
    with one thread and tests compare runs bit for bit: the thread count changes how float32 sums are
    split, hence their rounding; and the tiny model is fastest on one thread of a shared machine."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for the test (`single_thread`); a module uses it for every test with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    with single_thread():
        yield


@pytest.fixture(scope="module")
def one_thread_module() -> Iterator[None]:
    """One torch thread for the module-scoped fixtures that request it (a run whose records later tests
    redo must be computed as they are), and so for the whole module."""
    with single_thread():
        yield


@pytest.fixture(autouse=True)
def _restore_threads():
    # A test that sets the thread count itself (the CLI does, from SHIFTLAB_NUM_THREADS) leaves the
    # next test the count it started with.
    prev = torch.get_num_threads()
    yield
    torch.set_num_threads(prev)


HEAVY_AT_COLLECTION = ("open_clip", "torchvision", "torch._dynamo", "scipy", "sklearn")
"""Imported by the first test that needs them, never while the tests are collected: torchvision imports
torch._dynamo, ~4 s of CPU (as much as torch), and open_clip imports torchvision (tests/_imports.lazy_module)."""
collection_imports = pytest.StashKey[list]()


def pytest_collection_modifyitems(config, items):
    import sys
    config.stash[collection_imports] = [m for m in HEAVY_AT_COLLECTION if m in sys.modules]
    # `gpu` tests need CUDA; on a machine without it they are skipped, said once per test in -ra's summary.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
