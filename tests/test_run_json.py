"""run.json is validated as a whole, and a method it does not list is a new method.

A damaged run.json must be named in one line (`shared` as a list would otherwise fail deep inside with
"cannot convert dictionary update sequence element #0"), and a method whose entry was deleted must not
be resumed under other settings while its earlier records are kept as if they matched."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.rundir import identity, record_files
from shiftlab.rundir.identity import RunIdentityError
from shiftlab.synthetic import make_imagenet_r, tiny_clip

FAST_TDA = {"text_head": "zeroshot"}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 25), per_class=1)


@pytest.fixture(scope="module")
def dataset(data):
    return build_dataset("imagenet-r", data)


@pytest.fixture(scope="module")
def model():
    return tiny_clip(0)


def _cfg(out: Path, **kw) -> RunConfig:
    base = dict(methods=["zeroshot", "tda"], views=4, workers=0, progress=False, batch_size=1, limit=6,
                out=str(out), device="cpu", method_config={"tda": dict(FAST_TDA)}, online_checkpoint_seconds=0)
    return RunConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model, dataset, one_thread_module) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run(_cfg(out), model=model, dataset=dataset)
    return out


def _by_method(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in record_files.iter_records(path):
        out.setdefault(r["method"], []).append(json.dumps({k: v for k, v in r.items() if k != "seconds"},
                                                          sort_keys=True))
    return {m: sorted(v) for m, v in out.items()}


def _set(data: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize("field,value,expected", [
    ("shared", ["dataset", "imagenet-r"], "shared must be an object, got a list"),
    ("methods", [], "methods must be an object, got a list"),
    ("methods.tda", "tda", "methods.tda must be an object, got a string"),
    ("shiftlab", 1, "shiftlab must be a string, got an integer"),
    ("shared.views", "4", "shared.views must be an integer or null, got a string"),
    ("shared.seed", True, "shared.seed must be an integer, got true or false"),
    ("shared.augmix", 0, "shared.augmix must be true or false, got an integer"),
    ("shared.attack", None, "shared.attack must be an object, got null"),
    ("shared.weights_sha256", 5, "shared.weights_sha256 must be a string or null, got an integer"),
    ("shared", _DELETE, "shared is missing"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_a_malformed_run_json_is_refused_in_one_line_naming_file_and_field(finished, tmp_path, model, data, dataset,
                                                                          capsys, field, value, expected):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "run.json"
    path.write_text(json.dumps(_set(json.loads(path.read_text()), field, value)))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    with pytest.raises(RunIdentityError) as info:
        run(_cfg(out, resume=True), model=model, dataset=dataset)
    assert str(info.value).startswith(f"{path}: {expected} (") and "\n" not in str(info.value)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    assert after == before
    capsys.readouterr()
    argv = ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none", "--methods", "zeroshot",
            "--views", "4", "--workers", "0", "--device", "cpu", "--no-progress", "--allow-partial", "--limit", "6",
            "--out", str(out), "--resume"]
    assert cli_main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(err) == 1 and err[0].startswith(f"shiftlab run: error: {path}: {expected}")


def test_a_run_json_that_is_not_an_object_is_refused(tmp_path):
    (tmp_path / "run.json").write_text("[1, 2]")
    with pytest.raises(RunIdentityError, match=r"run\.json: the file must be an object, got a list"):
        identity.read(tmp_path)


def test_the_identity_a_run_writes_validates(finished):
    data = json.loads((finished / "run.json").read_text())
    assert identity.validate(data) is data
    assert set(data["shared"]) == set(identity.SHARED_TYPES)     # the declared types cover every field


def test_a_method_missing_from_run_json_is_a_new_method(finished, tmp_path, model, dataset, capsys):
    """Its old records are quarantined and redone with this resume's settings, never matched."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "run.json"
    # the entry deleted in a run.json from before its self-checksum (a sealed one edited so is refused:
    # test_a_hand_edited_run_json_is_refused_naming_the_file_and_what_to_do)
    path.write_text(json.dumps(_set(_set(json.loads(path.read_text()), "methods.tda", _DELETE), "self_sha256",
                                    _DELETE)))
    other = {"tda": {**FAST_TDA, "pos_alpha": 3.0}}
    ref = tmp_path / "ref"
    run(_cfg(ref, method_config=other), model=model, dataset=dataset)
    old, expected = _by_method(finished / "records.jsonl"), _by_method(ref / "records.jsonl")
    assert old["tda"] != expected["tda"]                          # the setting changes tda's records

    capsys.readouterr()
    run(_cfg(out, resume=True, method_config=other), model=model, dataset=dataset)
    err = capsys.readouterr().err
    assert "6 record(s) moved to" in err and "method 'tda' is not one of the run's methods (run.json)" in err
    assert _by_method(out / "records.jsonl") == {"zeroshot": old["zeroshot"], "tda": expected["tda"]}
    quarantined = [json.loads(line) for line in (out / record_files.QUARANTINE).read_text().splitlines()]
    assert len(quarantined) == 6 and all(q["problem"].startswith("method 'tda' is not one of the run's methods")
                                         for q in quarantined)
    assert sorted(json.loads(q["text"])["id"] for q in quarantined) == sorted(
        json.loads(r)["id"] for r in old["tda"])
    assert json.loads(path.read_text())["methods"]["tda"]["pos_alpha"] == 3.0


def test_a_method_missing_from_run_json_is_redone_even_with_its_old_settings(finished, tmp_path, model, dataset):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "run.json"
    # the entry deleted in a run.json from before its self-checksum (a sealed one edited so is refused:
    # test_a_hand_edited_run_json_is_refused_naming_the_file_and_what_to_do)
    path.write_text(json.dumps(_set(_set(json.loads(path.read_text()), "methods.zeroshot", _DELETE), "self_sha256",
                                    _DELETE)))
    run(_cfg(out, resume=True), model=model, dataset=dataset)
    quarantined = [json.loads(line) for line in (out / record_files.QUARANTINE).read_text().splitlines()]
    assert len(quarantined) == 6 and {json.loads(q["text"])["method"] for q in quarantined} == {"zeroshot"}
    assert _by_method(out / "records.jsonl") == _by_method(finished / "records.jsonl")


def test_a_hand_edited_run_json_is_refused_naming_the_file_and_what_to_do(finished, tmp_path, model, data, dataset,
                                                                          capsys):
    """Leftover of #34: run.json carries a checksum of itself, verified on read. Without it, editing the views
    in run.json to match another run resumed that run and mixed records made with 4 views and with 2."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "run.json"
    sealed = json.loads(path.read_text())
    assert sealed["self_sha256"] == identity.self_checksum(sealed)        # written with it
    assert "self_sha256" not in identity.read(out)                        # read without it: not a setting
    path.write_text(json.dumps(_set(sealed, "shared.views", 2), indent=2))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    with pytest.raises(RunIdentityError) as info:
        run(_cfg(out, resume=True, views=2), model=model, dataset=dataset)
    assert str(info.value) == (
        f"{path} was changed after shiftlab wrote it (its self_sha256 does not match its contents), so the run's "
        "settings cannot be trusted: restore the file, or choose another out= and run again")
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    assert after == before
    argv = ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none", "--methods", "zeroshot",
            "--views", "2", "--workers", "0", "--device", "cpu", "--no-progress", "--allow-partial", "--limit", "6",
            "--out", str(out), "--resume"]
    capsys.readouterr()
    assert cli_main(argv) != 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(err) == 1 and err[0].endswith("restore the file, or choose another --out and run again"), err
    # a run.json written before the checksum existed has none, and is read as before
    del sealed["self_sha256"]
    path.write_text(json.dumps(_set(sealed, "shared.views", 4)))
    assert identity.read(out)["shared"]["views"] == 4
