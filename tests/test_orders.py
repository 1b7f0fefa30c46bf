"""`--orders K` and stream kinds end to end: K seeded orders, their statistics (mean, std, worst, Expected
Tail Accuracy), the feature store serving every later order, and the stream recorded in run.json."""
from __future__ import annotations

import json
import math

import pytest

from _records import small_config
from _runs import json_lines
from _synthetic import make_image_folder
from shiftlab.cli import main as cli_main
from shiftlab.datasets.build import build_dataset
from shiftlab.engine.config import RunConfig, run_stream
from shiftlab.engine.loop import run
from shiftlab.methods.base import get_method_class, list_methods
from shiftlab.results.orders import order_dir, order_stats
from shiftlab.rundir.identity import RunIdentityError
from shiftlab.rundir.stream import order_seeds

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = make_image_folder(tmp_path_factory.mktemp("orders") / "data", ["cat", "dog", "fox"], per_class=2,
                             size=(48, 40))
    return build_dataset("imagefolder", root)


def test_order_stats_follow_ogas_expected_tail_accuracy():
    values = [float(v) for v in range(20, 0, -1)]   # 20 orders: the worst 10 % are two
    stats = order_stats(values)
    assert stats["mean"] == pytest.approx(10.5) and stats["worst"] == 1.0
    assert stats["eta"] == pytest.approx(1.5) and stats["tail"] == 2
    assert stats["std"] == pytest.approx(math.sqrt(sum((v - 10.5) ** 2 for v in values) / 20))
    assert order_stats([50.0, 70.0, 60.0])["eta"] == 50.0   # ceil(0.3) = 1 order
    assert order_stats([40.0] * 11)["tail"] == 2            # ceil(1.1)


def _config(out, **kw):
    # TDA with the one-template head: its 80-template head would be built again by every order's run, and no
    # assertion here reads it
    base = dict(dataset="imagefolder", methods=["zeroshot", "tda"], workers=0, progress=False, batch_size=2, seed=3,
                views=4, out=str(out), device="cpu", online_checkpoint_seconds=0,
                method_config={"tda": {"text_head": "zeroshot"}})
    return RunConfig(**{**base, **kw})


@pytest.mark.slow
def test_orders_run_online_methods_per_order_and_reuse_episodic_records(data, tiny_model, tmp_path):
    out = tmp_path / "k3"
    result = run(_config(out, orders=3), model=tiny_model, dataset=data)
    seeds = order_seeds(3, 3)
    table = json.loads((out / "orders.json").read_text())
    assert table == result["orders"] and table["order_seeds"] == seeds and table["missing"] == []
    assert "| tda | online | 3 |" in (out / "orders.md").read_text()
    for k in (1, 2):   # the online method alone, in its own order
        shared = json.loads((order_dir(out, k) / "run.json").read_text())["shared"]
        assert shared["stream_seed"] == seeds[k] and shared["orders"] == 3 and shared["order_seeds"] == seeds
        assert {r["method"] for r in json_lines(order_dir(out, k) / "records.jsonl")} == {"tda"}
        stream = run_stream(_config(out, orders=3, stream_seed=seeds[k]), data)
        tda = [r["id"] for r in json_lines(order_dir(out, k) / "records.jsonl")]
        assert sorted(tda) == sorted(stream)
    tops = [json.loads((d / "summary.json").read_text())["methods"]["tda"]["top1"]
            for d in (out, order_dir(out, 1), order_dir(out, 2))]
    assert table["methods"]["tda"]["top1"] == tops
    assert table["methods"]["tda"]["eta"] == pytest.approx(min(tops))
    zs = json.loads((out / "summary.json").read_text())["methods"]["zeroshot"]["top1"]
    assert table["methods"]["zeroshot"] == {"kind": "episodic", "top1": [zs] * 3, **order_stats([zs] * 3)}
    # a resume with another K, kind or delta is refused, naming the field
    with pytest.raises(RunIdentityError, match=r"orders 3 -> 4"):
        run(_config(out, orders=4, resume=True), model=tiny_model, dataset=data)
    with pytest.raises(RunIdentityError, match=r"order \"shuffled\" -> \"dirichlet\""):
        run(_config(out, orders=3, order="dirichlet", delta=0.5, resume=True), model=tiny_model, dataset=data)


def test_stream_kind_and_delta_in_run_json_and_a_resume_with_another_refused(data, tmp_path, tiny_checkpoint,
                                                                             capsys):
    argv = ["run", "--dataset", "imagefolder", "--data", str(data.root), "--model", "shiftlab-tiny",
            "--pretrained", str(tiny_checkpoint),
            "--views", "4", "--workers", "0", "--device", "cpu", "--methods", "zeroshot", "--no-progress",
            "--out", str(tmp_path / "d")]
    assert cli_main(argv + ["--order", "dirichlet", "--delta", "0.1"]) == 0
    shared = json.loads((tmp_path / "d" / "run.json").read_text())["shared"]
    assert (shared["order"], shared["delta"], shared["orders"], shared["stream_seed"]) == ("dirichlet", 0.1, 1, None)
    capsys.readouterr()
    assert cli_main(argv + ["--order", "dirichlet", "--delta", "0.2", "--resume"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(err) == 1 and "delta 0.1 -> 0.2" in err[0]
    assert cli_main(argv + ["--resume"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(err) == 1 and 'order "dirichlet" -> "shuffled"' in err[0] and "delta 0.1 -> null" in err[0]


@pytest.mark.parametrize(("flags", "words"), [
    (["--order", "dirichlet"], "needs its concentration: --delta D"),
    (["--delta", "0.1"], "drop --delta"),
    (["--order", "class-sorted", "--orders", "5"], "one order only"),
    (["--delta", "-1", "--order", "dirichlet"], "--delta: must be a finite number > 0"),
    (["--orders", "0"], "--orders"),
])
def test_stream_flags_refused_in_one_line(data, tmp_path, tiny_checkpoint, capsys, flags, words):
    argv = ["run", "--dataset", "imagefolder", "--data", str(data.root), "--model", "shiftlab-tiny",
            "--pretrained", str(tiny_checkpoint),
            "--methods", "zeroshot", "--out", str(tmp_path / "x"), *flags]
    try:
        code = cli_main(argv)
    except SystemExit as exc:   # argparse's refusal of a flag's value
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(lines) == 1 and words in lines[0]
    assert not (tmp_path / "x" / "run.json").exists()


@pytest.mark.slow
def test_twenty_orders_of_every_online_method_read_later_orders_from_the_store(data, tiny_model, tmp_path,
                                                                               monkeypatch, capsys):
    # every online method of the tiny ResNet that a feature store can serve (TCA, bound to ViTs by its spec's
    # `towers`, is not run here; a method reading pixels through its own tower re-encodes by design)
    online = [n for n in list_methods("online") if "resnet" in get_method_class(n).spec.towers
              and not get_method_class(n).spec.needs_pixels]
    methods = ["zeroshot", *online]
    offline = {n: small_config(n) for n in methods}   # the specs' small test configs
    calls = []
    encode = type(tiny_model).encode_views
    monkeypatch.setattr(type(tiny_model), "encode_views",
                        lambda self, *a, **k: calls.append(1) or encode(self, *a, **k))
    run(_config(tmp_path / "one", methods=methods, method_config=offline, features=str(tmp_path / "fs1"),
                features_dtype="fp32"), model=tiny_model, dataset=data)
    one_order = len(calls)
    calls.clear()
    capsys.readouterr()
    result = run(_config(tmp_path / "k20", methods=methods, method_config=offline, orders=20,
                         features=str(tmp_path / "fs20"), features_dtype="fp32"), model=tiny_model, dataset=data)
    assert len(calls) == one_order > 0   # orders 1..19 encode nothing: every feature is read from the store
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "shiftlab: features:" in ln]
    assert len(lines) == 20 and all(f"{len(data)} sample(s) read from the store" in ln and ", 0 encoded" in ln
                                    for ln in lines[1:])
    table = result["orders"]
    assert set(table["methods"]) == set(methods) and table["missing"] == []
    for name in online:
        row = table["methods"][name]
        assert len(row["top1"]) == 20 and row["tail"] == 2
        assert row["eta"] == pytest.approx(sum(sorted(row["top1"])[:2]) / 2)
        assert row["worst"] == min(row["top1"]) and row["mean"] == pytest.approx(sum(row["top1"]) / 20)


@pytest.mark.slow
def test_cli_orders_prints_the_table_and_merge_gathers_it_again(data, tmp_path, tiny_checkpoint, capsys):
    out = tmp_path / "k"
    argv = ["run", "--dataset", "imagefolder", "--data", str(data.root), "--model", "shiftlab-tiny",
            "--pretrained", str(tiny_checkpoint), "--views", "4", "--workers", "0", "--device", "cpu",
            "--methods", "zeroshot,tda", "--set", "tda.text_head=zeroshot", "--orders", "2", "--no-progress",
            "--out", str(out)]
    assert cli_main(argv) == 0
    assert "| tda | online | 2 |" in capsys.readouterr().out
    table = json.loads((out / "orders.json").read_text())
    (out / "orders.json").write_text(json.dumps({**table, "methods": {
        n: {**row, "top1": [0.0] * 2} for n, row in table["methods"].items()}}))   # stale numbers
    assert cli_main(["merge", str(out)]) == 0
    assert json.loads((out / "orders.json").read_text()) == table
    assert "| tda | online | 2 |" in capsys.readouterr().out


class _Crash(Exception):
    pass


@pytest.mark.slow
def test_orders_interrupted_in_a_later_order_resume_exactly(data, tiny_model, tmp_path):
    from _runs import comparable
    from shiftlab.engine.loop import RunHooks
    run(_config(tmp_path / "ref", orders=3, online_checkpoint_seconds=0), model=tiny_model, dataset=data)

    class CrashInOrderOne(RunHooks):   # order 0 takes 3 steps of 2 images; stop in the middle of order 1
        steps = 0

        def before_step(self, ids):
            if self.steps == 4:
                raise _Crash
            self.steps += 1
    with pytest.raises(_Crash):
        run(_config(tmp_path / "cut", orders=3, online_checkpoint_seconds=0), model=tiny_model, dataset=data,
            hooks=CrashInOrderOne())
    assert not (tmp_path / "cut" / "orders.json").exists() and not order_dir(tmp_path / "cut", 2).exists()
    run(_config(tmp_path / "cut", orders=3, online_checkpoint_seconds=0, resume=True), model=tiny_model, dataset=data)
    for sub in (lambda d: d, lambda d: order_dir(d, 1), lambda d: order_dir(d, 2)):
        assert (comparable(json_lines(sub(tmp_path / "cut") / "records.jsonl"))
                == comparable(json_lines(sub(tmp_path / "ref") / "records.jsonl")))
    assert (json.loads((tmp_path / "cut" / "orders.json").read_text())
            == json.loads((tmp_path / "ref" / "orders.json").read_text()))


@pytest.mark.slow
def test_orders_with_a_limit_reorder_the_same_samples(data, tiny_model, tmp_path):
    out = tmp_path / "lim"
    run(_config(out, orders=3, limit=4), model=tiny_model, dataset=data)
    first = [r["id"] for r in json_lines(out / "records.jsonl") if r["method"] == "tda"]
    assert len(first) == 4
    streams = [json.loads((d / "stream.json").read_text())["ids"] for d in (out, order_dir(out, 1), order_dir(out, 2))]
    assert all(sorted(s) == sorted(first) for s in streams) and len({tuple(s) for s in streams}) > 1
    for k in (1, 2):
        assert sorted(r["id"] for r in json_lines(order_dir(out, k) / "records.jsonl")) == sorted(first)
