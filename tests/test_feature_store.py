"""The feature store: keys, atomic shards, damage, changed files, the lock, and runs read from it."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import shiftlab
from _records import small_config
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.methods.base import get_method_class, list_methods
from shiftlab.methods.catalogue.declarations import spec
from shiftlab.rundir import record_files
from shiftlab.rundir.feature_store import FeatureStore, feature_key, key_digest
from shiftlab.rundir.lock import RunLockedError
from shiftlab.synthetic import make_imagenet_r, tiny_clip
from shiftlab.views.recipe import ViewRecipe

REPO = Path(__file__).resolve().parents[1]


def _key(**over):
    model = SimpleNamespace(name="RN50", checkpoint_sha256="c" * 64, device=torch.device("cpu"))
    kw = dict(samples_sha256="s" * 64, model=model, recipe=ViewRecipe(), n_views=64, seed=0, precision="fp32",
              storage="fp32") | over
    return feature_key(**kw)


def _files(tmp_path, n):
    out = []
    for i in range(n):
        p = tmp_path / f"img{i}.jpg"
        p.write_bytes(bytes([i]) * (100 + i))
        out.append(p)
    return out


def _fill(root, paths, key, feats):
    with FeatureStore(root, "w") as store:
        for sid, (p, f) in enumerate(zip(paths, feats)):
            store.put(key, sid, p, f)


def test_stored_features_read_back_exactly_and_keys_never_mix(tmp_path):
    paths, feats = _files(tmp_path, 3), torch.randn(3, 64, 8)
    key = _key()
    _fill(tmp_path / "fs", paths, key, feats)
    store = FeatureStore(tmp_path / "fs")
    entry = store.entry(key)
    assert entry.ids() == [0, 1, 2]
    for sid in range(3):
        assert torch.equal(entry.features(sid, paths[sid]), feats[sid])
    for other in (_key(seed=1), _key(n_views=32), _key(precision="fp16"), _key(storage="fp16"),
                  _key(recipe=ViewRecipe(augmix=True)), _key(samples_sha256="t" * 64)):
        assert key_digest(other) != key_digest(key) and store.entry(other).features(0) is None
    with pytest.raises(ValueError, match="put"):
        store.put(key, 5, paths[0], feats[0])


def test_fp16_storage_is_within_1e3_and_half_the_bytes(tmp_path):
    paths = _files(tmp_path, 2)
    feats = torch.nn.functional.normalize(torch.randn(2, 64, 1024), dim=-1)
    _fill(tmp_path / "h", paths, _key(storage="fp16"), feats)
    _fill(tmp_path / "f", paths, _key(storage="fp32"), feats)
    half = FeatureStore(tmp_path / "h").entry(_key(storage="fp16")).features(1)
    assert half.dtype == torch.float32 and not torch.equal(half, feats[1])
    assert (half - feats[1]).abs().max() < 1e-3
    size = {d: sum(p.stat().st_size for p in (tmp_path / d).rglob("*.bin")) for d in "hf"}
    assert size["h"] == 2 * 64 * 1024 * 2 and size["f"] == 2 * size["h"]


def test_damaged_or_truncated_shard_is_not_served(tmp_path, capsys):
    paths, feats = _files(tmp_path, 2), torch.randn(2, 4, 8)
    _fill(tmp_path / "fs", paths, _key(), feats)
    (binary,) = (tmp_path / "fs").rglob("*.bin")
    data = bytearray(binary.read_bytes())
    data[5] ^= 0xFF
    binary.write_bytes(bytes(data))
    entry = FeatureStore(tmp_path / "fs").entry(_key())
    assert entry.features(0) is None and "damaged or truncated" in capsys.readouterr().err
    binary.write_bytes(bytes(data[: len(data) // 2]))
    assert FeatureStore(tmp_path / "fs").entry(_key()).features(1) is None
    # encoded again and re-stored: the intact copy is read from then on
    with FeatureStore(tmp_path / "fs", "w") as store:
        assert not store.entry(_key()).has(1) or store.entry(_key()).features(1) is None
        store.put(_key(), 1, paths[1], feats[1])
    assert torch.equal(FeatureStore(tmp_path / "fs").entry(_key()).features(1, paths[1]), feats[1])


def test_uncommitted_shard_is_ignored(tmp_path):
    paths, feats = _files(tmp_path, 1), torch.randn(1, 4, 8)
    _fill(tmp_path / "fs", paths, _key(), feats)
    (index,) = [p for p in (tmp_path / "fs").rglob("*.json") if p.name not in ("key.json", "store.json")]
    index.unlink()   # a writer killed between the .bin and its index
    assert FeatureStore(tmp_path / "fs").entry(_key()).features(0) is None


def test_changed_file_is_not_served_touched_file_is(tmp_path):
    paths, feats = _files(tmp_path, 2), torch.randn(2, 4, 8)
    _fill(tmp_path / "fs", paths, _key(), feats)
    paths[0].write_bytes(b"other content")
    paths[1].write_bytes(paths[1].read_bytes())   # same bytes, new mtime: the content digest decides
    entry = FeatureStore(tmp_path / "fs").entry(_key())
    assert not entry.has(0, paths[0]) and entry.features(0, paths[0]) is None
    assert torch.equal(entry.features(1, paths[1]), feats[1])


def test_one_writer_many_readers(tmp_path):
    writer = FeatureStore(tmp_path / "fs", "w")
    with pytest.raises(RunLockedError, match="in use"):
        FeatureStore(tmp_path / "fs", "w")
    FeatureStore(tmp_path / "fs")   # readers take no lock
    writer.close()
    FeatureStore(tmp_path / "fs", "w").close()
    with pytest.raises(FileNotFoundError, match="not a feature store"):
        FeatureStore(tmp_path / "nothing")


def test_readme_example_runs(tmp_path, monkeypatch):
    code = re.search(r"## Stored features.*?```python\n(.*?)```", (REPO / "docs" / "LIBRARY.md").read_text(),
                     re.S).group(1)
    paths = _files(tmp_path, 2)
    _fill(tmp_path / "feats", paths, _key(storage="fp16"), torch.nn.functional.normalize(torch.randn(2, 64, 8), dim=-1))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/LIBRARY.md", "exec"), scope)
    assert scope["feats"].shape == (64, 8) and scope["score"].shape == ()
    assert shiftlab.FeatureStore is FeatureStore


# --- runs from the store ---------------------------------------------------------------------------------

# a method that reads pixels (RLCF's reward model encodes the views) makes its run decode every sample, so the
# store's runs leave those out; test_sweep_runs_every_point_from_the_store checks that they are refused. So does a
# test-set method's pass (TIPPLE: docs/PROTOCOLS.md, the pass decodes every sample), which these runs' refusing
# dataset cannot serve
STORE_METHODS = [n for n in list_methods() if not spec(n).needs_pixels and spec(n).reads_ahead != "test_set"]


@pytest.fixture(scope="module")
def store_runs(tmp_path_factory):
    """Every registered method that reads features (its spec's small test config) three times on the same
    samples: uncached, filling an fp32 store, and read from it (its dataset refuses to decode: every feature must
    come from the store).
    Methods that need pixels (`Method.needs_pixels`: they tune the image tower) never read a store."""
    root = tmp_path_factory.mktemp("store-runs")
    data = make_imagenet_r(root / "data", classes=range(0, 200, 40), per_class=1, size=(80, 64))
    methods = STORE_METHODS

    def go(out: str, decode: bool = True, **kw):
        dataset = build_dataset("imagenet-r", data)
        if not decode:
            def refuse(sid):
                raise AssertionError(f"sample {sid} was decoded")
            dataset.image = refuse
        # each method as the registry-wide tests run it (tests/_records.py): nothing downloaded, its small config
        run(RunConfig(methods=methods, method_config={n: small_config(n) for n in methods}, views=8,
                      out=str(root / out), workers=0, progress=False, batch_size=2, **kw),
            model=tiny_clip(0), dataset=dataset)
        return {(r["id"], r["method"]): {k: v for k, v in r.items() if k != "seconds"}
                for r in record_files.iter_records(root / out / "records.jsonl")}

    plain = go("plain")
    filled = go("fill", features=str(root / "fs"), features_dtype="fp32")
    read = go("read", decode=False, features=str(root / "fs"), features_dtype="fp32")
    return plain, filled, read


@pytest.mark.slow
@pytest.mark.parametrize("method", STORE_METHODS)
def test_records_read_from_store_equal_uncached(store_runs, method):
    plain, filled, read = store_runs
    mine = {k: v for k, v in plain.items() if k[1] == method}
    assert len(mine) == 5
    assert {k: v for k, v in filled.items() if k[1] == method} == mine
    assert {k: v for k, v in read.items() if k[1] == method} == mine


# TDA with the one-template head in the store's own tests: its default 80-template head is built again by every run
# (half of each test's time) and no assertion here depends on the head
ONE_TEMPLATE = {"tda": {"text_head": "zeroshot"}}
ONE_TEMPLATE_FLAGS = ["--set", "tda.text_head=zeroshot"]


@pytest.mark.slow
def test_run_says_how_many_came_from_the_store(tmp_path, capsys):
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=1, size=(80, 64))
    cfg = dict(methods=["zeroshot", "tda"], views=8, workers=0, progress=False, batch_size=2,
               features=str(tmp_path / "fs"), method_config=ONE_TEMPLATE)
    run(RunConfig(out=str(tmp_path / "a"), **cfg), model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    assert "0 sample(s) read from the store" in capsys.readouterr().err
    run(RunConfig(out=str(tmp_path / "b"), **cfg), model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    assert "4 sample(s) read from the store" in capsys.readouterr().err
    # another view seed is another key: nothing read, all encoded again
    run(RunConfig(out=str(tmp_path / "c"), seed=1, **cfg), model=tiny_clip(0),
        dataset=build_dataset("imagenet-r", data))
    assert "0 sample(s) read from the store" in capsys.readouterr().err
    # fp16 storage (the default): logits close to the uncached run's, not equal
    a = {(r["id"], r["method"]): r for r in record_files.iter_records(tmp_path / "a" / "records.jsonl")}
    b = {(r["id"], r["method"]): r for r in record_files.iter_records(tmp_path / "b" / "records.jsonl")}
    keys = json.loads(next((tmp_path / "fs").glob("*/key.json")).read_text())
    assert keys["storage"] == "fp16" and a.keys() == b.keys()
    for k, rec in a.items():
        assert rec["pred"] == b[k]["pred"] or abs(rec["confidence"] - b[k]["confidence"]) < 1e-2


@pytest.mark.slow
def test_encode_fills_the_store_a_run_then_reads(tmp_path, tiny_checkpoint, capsys):
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=1, size=(80, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--views", "8", "--workers", "0", "--no-progress", "--allow-partial",
             "--methods", "zeroshot,mta,tda", *ONE_TEMPLATE_FLAGS, "--features", str(tmp_path / "fs"),
             "--features-dtype", "fp32"]
    assert cli_main(["encode", *flags]) == 0
    assert "4 samples: 0 already stored, 4 encoded" in capsys.readouterr().out
    assert cli_main(["encode", *flags]) == 0
    assert "4 already stored, 0 encoded" in capsys.readouterr().out
    assert cli_main(["run", *flags, "--out", str(tmp_path / "run")]) == 0
    assert "4 sample(s) read from the store" in capsys.readouterr().err
    assert cli_main(["run", *flags[:-4], "--out", str(tmp_path / "plain")]) == 0
    strip = [{(r["id"], r["method"]): {k: v for k, v in r.items() if k != "seconds"}
              for r in record_files.iter_records(tmp_path / d / "records.jsonl")} for d in ("run", "plain")]
    assert strip[0] == strip[1] and len(strip[0]) == 12


@pytest.mark.slow
def test_sweep_runs_every_point_from_the_store(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=1, size=(80, 64))
    flags = ["sweep", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--views", "8", "--workers", "0", "--no-progress", "--allow-partial",
             *ONE_TEMPLATE_FLAGS, "--features", str(tmp_path / "fs"), "--out", str(tmp_path / "sweep"),
             "--grid", "tda.pos_alpha=1,4"]
    out_dir = tmp_path / "sweep"
    assert cli_main(flags) == 0
    err, out = capsys.readouterr().err, (out_dir / "sweep.md").read_text()
    # one pass: each sample decoded and encoded once, every point reads those features
    assert "0 sample(s) read from the store" in err and "4 encoded and stored" in err
    # no `*`: --set tda.text_head=zeroshot makes every point differ from tda's own setting (issue 40 case 11);
    # tests/test_feature_store.py::test_a_sweep_keeps_one_base_per_folder... checks the mark where it is due
    assert "| tda.pos_alpha=1.0 | tda |" in out and "| tda.pos_alpha=4.0 | tda |" in out and out.count("| 4 |") == 2
    assert " * |" not in out
    run_json = json.loads((out_dir / "run.json").read_text())["methods"]
    assert {v: c["pos_alpha"] for v, c in run_json.items()} == {"tda@pos_alpha=1.0": 1, "tda@pos_alpha=4.0": 4}
    recs = list(record_files.iter_records(out_dir / "records.jsonl"))
    assert sorted({r["method"] for r in recs}) == ["tda@pos_alpha=1.0", "tda@pos_alpha=4.0"] and len(recs) == 8
    # each point is the method itself under that setting: the records of a plain run with --set (no store:
    # the sweep's own pass used the features it encoded, not their fp16 copies)
    plain_flags = [f for f in flags[1:flags.index("--features")]]
    assert cli_main(["run", *plain_flags, "--out", str(tmp_path / "plain"), "--methods", "tda",
                     "--set", "tda.pos_alpha=4"]) == 0
    plain = {r["id"]: {k: v for k, v in r.items() if k not in ("seconds", "method")}
             for r in record_files.iter_records(tmp_path / "plain" / "records.jsonl")}
    point = {r["id"]: {k: v for k, v in r.items() if k not in ("seconds", "method")}
             for r in recs if r["method"] == "tda@pos_alpha=4.0"}
    assert point == plain
    capsys.readouterr()
    # more grid values later: the same directory gains the new point, read from the store
    assert cli_main([*flags[:-1], "tda.pos_alpha=1,4,8"]) == 0
    err, out = capsys.readouterr().err, (out_dir / "sweep.md").read_text()
    assert "4 sample(s) read from the store" in err and "0 encoded" in err
    assert "| tda.pos_alpha=8.0 | tda |" in out and out.count("| 4 |") == 3
    assert json.loads((out_dir / "sweep.json").read_text())["rows"][0]["variant"] == "tda@pos_alpha=1.0"
    from shiftlab.report.build import build_report
    build_report([out_dir], tmp_path / "report")
    html = (tmp_path / "report" / "report.html").read_text()
    section = re.search(r'<section id="sweep">.*?</section>', html, re.S).group(0)
    assert section.count("tda.pos_alpha=") == 3 and "tda.pos_alpha=1.0 *" not in section
    monkeypatch.setattr(get_method_class("tda").spec, "needs_pixels", True)
    assert cli_main(flags) == 2 and "need pixels" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_ranks_write_their_own_shards_into_one_store(tmp_path, tiny_model, monkeypatch, capsys):
    from shiftlab.engine import distributed
    from shiftlab.engine.distributed import DistContext
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=1, size=(80, 64))
    dataset = build_dataset("imagenet-r", data)
    cfg = dict(methods=["zeroshot", "view_ensemble"], views=4, workers=0, progress=False, batch_size=2, resume=True,
               features=str(tmp_path / "fs"), features_dtype="fp32")

    def rank(world, r, out):   # one rank of a `world`-rank job, in this process (as tests/test_distributed.py)
        with monkeypatch.context() as m:
            ctx = DistContext(r, world)
            m.setattr(distributed, "context", lambda: ctx)
            m.setattr(distributed, "all_gather", lambda c, obj: [obj] * c.world_size)
            run(RunConfig(out=str(tmp_path / out), **cfg), model=tiny_model, dataset=dataset)

    rank(2, 1, "job")
    rank(2, 0, "job")
    shards = sorted(p.name[:4] for p in (tmp_path / "fs").rglob("*.bin"))
    assert set(shards) == {"r000", "r001"}
    capsys.readouterr()
    rank(1, 0, "single")
    assert "4 sample(s) read from the store" in capsys.readouterr().err
    strip = [{(r["id"], r["method"]): {k: v for k, v in r.items() if k != "seconds"}
              for r in record_files.iter_records(tmp_path / d / "records.jsonl")} for d in ("job", "single")]
    assert strip[0] == strip[1] and len(strip[0]) == 8


# --- every byte read back is verified (issue 29 findings 2-3, issue 34 item 4) ---------------------------


def test_rows_are_bound_to_their_sample_ids_not_their_places(tmp_path, capsys):
    """Two index rows swapped consistently (ids and samples, and the index's own checksum made to match,
    as a tool rewriting the index would) serve neither sample the other's features."""
    from shiftlab.rundir import feature_store
    paths, feats = _files(tmp_path, 2), torch.randn(2, 4, 8)
    _fill(tmp_path / "fs", paths, _key(), feats)
    (index,) = [p for p in (tmp_path / "fs").rglob("*.json") if p.name not in ("key.json", "store.json")]
    meta = json.loads(index.read_text())
    for field in ("ids", "samples"):
        meta[field] = meta[field][::-1]
    index.write_text(json.dumps(meta))
    # the index's own checksum no longer matches: not read at all
    assert FeatureStore(tmp_path / "fs").entry(_key()).features(0) is None
    assert "altered shard index" in capsys.readouterr().err
    meta["index_sha256"] = feature_store._index_digest(meta)
    index.write_text(json.dumps(meta))
    # what the issue found: each sample served the other's features (rows checked by position alone)
    entry = FeatureStore(tmp_path / "fs").entry(_key())
    assert entry.features(0, paths[0]) is None and entry.features(1, paths[1]) is None
    assert "damaged or truncated, or its index was altered" in capsys.readouterr().err


def test_entries_say_which_sample_each_row_is_and_print_readably(tmp_path):
    paths, feats = _files(tmp_path, 3), torch.randn(3, 4, 8)
    key = _key()
    with FeatureStore(tmp_path / "fs", "w") as store:
        for sid in range(3):
            store.put(key, sid, None, feats[sid], info=feature_store_info(paths[sid], label=10 + sid))
        assert "writing" in repr(store)
    store = FeatureStore(tmp_path / "fs")
    entry = store.find(model="RN50")
    assert [entry.label(s) for s in entry.ids()] == [10, 11, 12]
    assert [entry.source(s) for s in entry.ids()] == [f"src/{p.name}" for p in paths]
    assert entry.label(7) is None and entry.source(7) is None
    assert repr(store) == f"<FeatureStore {str(tmp_path / 'fs')!r} (read-only): 1 entry of RN50>"
    assert repr(entry) == (f"<FeatureStore entry {key_digest(key)}: RN50, 64 views (views), seed 0, fp32, "
                           "stored fp32; 3 samples>")


def test_a_key_file_edited_or_damaged_is_said_never_listed_as_another_key(tmp_path, capsys):
    # key.json names an entry for find() and iteration; one that is not its folder's key would list an empty entry
    # under the edited key and hide the stored one
    paths, feats = _files(tmp_path, 2), torch.randn(2, 4, 8)
    _fill(tmp_path / "fs", paths, _key(), feats)
    _fill(tmp_path / "fs", paths, _key(seed=1), feats)
    edited, damaged = (tmp_path / "fs" / key_digest(k) / "key.json" for k in (_key(), _key(seed=1)))
    edited.write_text(json.dumps({**_key(), "n_views": 32}))
    damaged.write_text('{"format": 2, "mod')
    store = FeatureStore(tmp_path / "fs")
    assert store.keys() == [] and list(store) == []
    err = capsys.readouterr().err
    assert f"feature store: {edited} is not the key of its entry {edited.parent.name} (edited or moved)" in err
    assert f"feature store: {damaged} is unreadable" in err
    with pytest.raises(ValueError, match="no entry of .* matches"):
        store.find(n_views=32)
    assert torch.equal(store.entry(_key()).features(1, paths[1]), feats[1])   # a run keys entries itself


def feature_store_info(path, label):
    from shiftlab.rundir.feature_store import file_digest, sample_info
    return sample_info(f"src/{path.name}", file_digest(path), label)


@pytest.mark.slow
def test_an_image_replaced_with_its_size_and_mtime_kept_is_encoded_again(tmp_path, capsys):
    """`cp -p`, rsync and tar restore mtimes: a sample is the same only when its content is."""
    import os

    from shiftlab.synthetic import random_image
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=1, size=(64, 48),
                           image_format="bmp")   # uncompressed: every image the same byte size
    cfg = dict(methods=["zeroshot", "mta"], views=8, workers=0, progress=False, batch_size=1,
               features=str(tmp_path / "fs"), features_dtype="fp32")   # batches of 1: encoded alike in every run
    run(RunConfig(out=str(tmp_path / "a"), **cfg), model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    target = sorted(data.rglob("*.bmp"))[0]
    st = target.stat()
    random_image((64, 48), seed=4242).save(target, format="BMP")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))   # touch -r
    assert target.stat().st_size == st.st_size and target.stat().st_mtime_ns == st.st_mtime_ns
    capsys.readouterr()
    run(RunConfig(out=str(tmp_path / "b"), **cfg), model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    assert "3 sample(s) read from the store" in capsys.readouterr().err
    run(RunConfig(out=str(tmp_path / "plain"), **{**cfg, "features": None}), model=tiny_clip(0),
        dataset=build_dataset("imagenet-r", data))
    b, plain = ({(r["id"], r["method"]): {k: v for k, v in r.items() if k != "seconds"}
                 for r in record_files.iter_records(tmp_path / d / "records.jsonl")} for d in ("b", "plain"))
    assert b == plain and len(b) == 8
    # the new image was stored beside the old one: a third run reads all four
    run(RunConfig(out=str(tmp_path / "c"), **cfg), model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    assert "4 sample(s) read from the store" in capsys.readouterr().err


@pytest.mark.slow
def test_a_second_sweep_with_another_grid_keeps_every_point_in_the_tables(tmp_path, tiny_checkpoint, capsys):
    """Issue 29 finding 7: sweep.json/md/csv and the report list every point with records in the
    directory, marked with the grid(s) it came from; a damaged sweep.json is said, its points recovered."""
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 100), per_class=1, size=(48, 40))
    flags = ["sweep", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--views", "4", "--workers", "0", "--no-progress", "--allow-partial",
             *ONE_TEMPLATE_FLAGS, "--features", str(tmp_path / "fs"), "--out", str(tmp_path / "sweep")]
    assert cli_main([*flags, "--grid", "tda.pos_alpha=1,4"]) == 0
    assert cli_main([*flags, "--grid", "tda.neg_alpha=0.2"]) == 0
    out = tmp_path / "sweep"
    body = json.loads((out / "sweep.json").read_text())
    assert {(r["variant"], tuple(r["grids"]), r["n"]) for r in body["rows"]} == {
        ("tda@pos_alpha=1.0", (1,), 2), ("tda@pos_alpha=4.0", (1,), 2), ("tda@neg_alpha=0.2", (2,), 2)}
    assert body["grids"] == [[["tda", "pos_alpha", [1.0, 4.0]]], [["tda", "neg_alpha", [0.2]]]]
    md = (out / "sweep.md").read_text()
    assert "| tda.pos_alpha=4.0 | tda |" in md and "| 2 | 1 |" in md and "| tda.neg_alpha=0.2 | tda |" in md
    assert "| 2 | 2 |" in md
    assert len((out / "sweep.csv").read_text().strip().splitlines()) == 4
    from shiftlab.report.build import build_report
    build_report([out], tmp_path / "report")
    section = re.search(r'<section id="sweep">.*?</section>', (tmp_path / "report" / "report.html").read_text(),
                        re.S).group(0)
    assert section.count("tda.pos_alpha=") == 2 and section.count("tda.neg_alpha=") == 1
    # the first grid again: nothing new, nothing lost; a damaged sweep.json is said and its points recovered
    (out / "sweep.json").write_text((out / "sweep.json").read_text().replace('"n": 2', '"n": 3', 1))
    capsys.readouterr()
    assert cli_main([*flags, "--grid", "tda.pos_alpha=1,4"]) == 0
    assert "sweep.json cannot be trusted" in capsys.readouterr().err
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert sorted(r["variant"] for r in rows) == ["tda@neg_alpha=0.2", "tda@pos_alpha=1.0", "tda@pos_alpha=4.0"]
    assert all(r["n"] == 2 for r in rows)


@pytest.mark.slow
def test_a_sweep_keeps_one_base_per_folder_and_marks_only_the_whole_published_config(tmp_path, tiny_checkpoint,
                                                                                      capsys):
    """Issue 40 case 11 (and 21): a second sweep with another `--set` base was accepted into the same folder
    and listed beside the first one's points; a sweep with `--set tda.pos_beta=3` marked `pos_alpha=1.0 *` as
    the published setting; adding a point said "0 of N samples already done"."""
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 100), per_class=1, size=(48, 40))
    flags = ["sweep", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--views", "4", "--workers", "0", "--no-progress", "--allow-partial",
             "--features", str(tmp_path / "fs")]   # tda's own text head: its whole published config
    out, other = tmp_path / "sweep", tmp_path / "other"
    assert cli_main([*flags, "--out", str(out), "--grid", "tda.pos_alpha=1,2"]) == 0
    capsys.readouterr()
    assert cli_main([*flags, "--out", str(out), "--grid", "tda.pos_alpha=4"]) == 0
    err = capsys.readouterr().err
    assert (f"resuming {out}: 2 of 2 samples already done by its earlier method(s); adding method(s) "
            f"tda@pos_alpha=4.0") in err
    before = (out / "records.jsonl").read_bytes()
    assert cli_main([*flags, "--out", str(out), "--grid", "tda.pos_alpha=8", "--set", "tda.pos_beta=3"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "class folders" not in ln]
    assert err == [f"shiftlab sweep: error: {out} holds tda@pos_alpha=1.0, swept on other base settings (pos_beta "
                   f"8.0 there, 3.0 here); a new point beside it would differ by more than its grid values: sweep "
                   f"into another --out, or give the same --set as that sweep"]
    assert (out / "records.jsonl").read_bytes() == before and "pos_alpha=8" not in (out / "sweep.md").read_text()
    assert "| tda.pos_alpha=1.0 * | tda |" in (out / "sweep.md").read_text()   # tda's own setting
    assert cli_main([*flags, "--out", str(other), "--grid", "tda.pos_alpha=1,2", "--set", "tda.pos_beta=3"]) == 0
    md = (other / "sweep.md").read_text()
    assert "| tda.pos_alpha=1.0 | tda |" in md and " * |" not in md   # pos_beta 3 is not tda's own setting
