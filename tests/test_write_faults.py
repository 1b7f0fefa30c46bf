"""Fault injection, the way SQLite tests its I/O error paths: the N-th OS call of `shiftlab.writes` (open,
write, fsync, rename, truncate, mkdir, unlink: every file shiftlab writes goes through that module) fails
with EROFS, ENOSPC or EIO, and so does every call after it, for N = 1, 2, ... until the command completes.
For every N: exit code 1, one line on stderr naming the file and the reason, no traceback, no temporary
left behind once the command is run again, and the command run again (`--resume`) gives exactly the
records, probability vectors, tables or stored features of an uninterrupted run.

The fast tier fails the first call on each file that `shiftlab run` writes with two online methods,
`--save-probs` and `--features` (records.jsonl, probs/, online_state.pt, run.json, the locks, the
store's shards, ...); the slow tier fails every call N of that run, and every distinct failure point
(a kind of call on a file: "the fsync of online_state.pt", "the rename of a shard's index", ...) of
`shiftlab encode`, `shiftlab sweep` and a two-dataset suite."""
from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from _faults import FailingDisk, orphans, point, target
from _runs import comparable
from _synthetic import make_image_folder, make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.datasets.classes import imagenet_a_wnids
from shiftlab.models import loader
from shiftlab.rundir import probs as run_probs
from shiftlab.rundir import record_files
from shiftlab.rundir.feature_store import FeatureStore

ERRNOS = (errno.EROFS, errno.ENOSPC, errno.EIO)
SUITE = ("imagenet-r", "imagenet-a")
ONLINE = ["--methods", "tda,dmn_zs", "--set", "tda.text_head=zeroshot", "--set", "dmn_zs.text_head=zeroshot"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    make_image_folder(root / "pets", ["cat", "dog"], per_class=2, size=(40, 32))            # 4 images
    # a two-dataset suite: 4 images of ImageNet-R and 4 of ImageNet-A (the other classes empty)
    make_imagenet_r(root, classes=range(0, 200, 50), per_class=1, size=(40, 32))
    make_image_folder(root / "imagenet-a", imagenet_a_wnids(), per_class=0)
    make_image_folder(root / "imagenet-a", imagenet_a_wnids()[:4], per_class=1, size=(40, 32), seed=3)
    return root


@pytest.fixture
def disk(monkeypatch) -> FailingDisk:
    # the model is loaded once: its loading writes nothing, and the test is about what follows
    real, cache = loader.load_model, {}

    def cached(name, pretrained="openai", **kw):
        key = (name, str(pretrained), kw.get("seed"))
        if key not in cache:
            cache[key] = real(name, pretrained, **kw)
        return cache[key]
    monkeypatch.setattr(loader, "load_model", cached)
    return FailingDisk(monkeypatch)


def common(data: Path, ckpt: Path, dataset: str = "pets") -> list[str]:
    return ["--data", str(data / dataset), "--dataset", "imagefolder", "--model", "shiftlab-tiny", "--pretrained",
            str(ckpt), "--views", "2", "--workers", "0", "--device", "cpu", "--batch-size", "1", "--no-progress"]


class Scenario:
    """One command over fresh folders: `argv(dirs)` the failing command, `again(dirs)` the one that
    finishes the work, `state(dirs)` what must equal the uninterrupted command's."""

    def __init__(self, name: str, argv: Callable[[dict], list[str]], again: Callable[[dict], list[str]],
                 state: Callable[[dict], object], advice: Callable[[str, dict], str]):
        self.name, self.argv, self.again, self.state, self.advice = name, argv, again, state, advice

    def dirs(self, root: Path) -> dict[str, Path]:
        return {"run": root / "run", "fs": root / "fs"}


def run_scenario(data: Path, ckpt: Path) -> Scenario:
    def argv(d):
        return ["run", *common(data, ckpt), *ONLINE, "--save-probs", "--online-checkpoint-seconds", "0",
                "--features", str(d["fs"]), "--features-dtype", "fp32", "--out", str(d["run"])]

    def state(d):
        vectors = run_probs.load_probs(d["run"])
        return (comparable(record_files.load_records(d["run"])),
                {k: v.tobytes() for k, v in sorted(vectors.items())})
    return Scenario("run", argv, lambda d: argv(d) + ["--resume"], state, _advice("--resume"))


def encode_scenario(data: Path, ckpt: Path) -> Scenario:
    def argv(d):
        return ["encode", *common(data, ckpt), *ONLINE, "--features", str(d["fs"]), "--features-dtype", "fp32"]
    return Scenario("encode", argv, argv, lambda d: stored(d["fs"]), _advice(None))


def sweep_scenario(data: Path, ckpt: Path) -> Scenario:
    def argv(d):
        return ["sweep", *common(data, ckpt), "--grid", "tda.pos_alpha=1,4", "--set", "tda.text_head=zeroshot",
                "--features", str(d["fs"]), "--features-dtype", "fp32", "--out", str(d["run"])]

    def state(d):
        table = json.loads((d["run"] / "sweep.json").read_text())
        return (comparable(record_files.load_records(d["run"])), table, (d["run"] / "sweep.md").read_text(),
                (d["run"] / "sweep.csv").read_text())
    def advice(path, d):
        return "the same sweep again" if Path(target(path)).name.startswith("sweep.") else _advice("--resume")(path, d)
    return Scenario("sweep", argv, argv, state, advice)


def suite_scenario(data: Path, ckpt: Path) -> Scenario:
    def argv(d):
        flags = common(data, ckpt)
        flags[flags.index("--data") + 1] = str(data)   # the root holding both datasets
        return ["run", *[f for f in flags if f not in ("--dataset", "imagefolder")], "--datasets", ",".join(SUITE),
                "--allow-partial", "--methods", "zeroshot,tda", "--set", "tda.text_head=zeroshot",
                "--out", str(d["run"])]

    def state(d):
        return ({name: comparable(record_files.load_records(d["run"] / name)) for name in SUITE},
                [line for line in (d["run"] / "suite.md").read_text().splitlines() if "s/img" not in line])
    return Scenario("suite", argv, lambda d: argv(d) + ["--resume"], state, _advice("--resume"))


def report_scenario(source: Path) -> Scenario:
    """`shiftlab report` of a finished run (`source`) into a fresh folder; run again, the same files."""
    def argv(d):
        return ["report", str(source), "--out", str(d["run"]), "--bootstrap", "50"]

    def state(d):
        files = sorted(p.name for p in d["run"].iterdir())
        return files, [(d["run"] / name).read_text() for name in files if name.endswith(".csv")]
    return Scenario("report", argv, argv, state, lambda path, d: "shiftlab report again")


def _advice(run_dir_word: str | None) -> Callable[[str, dict], str]:
    def advice(path: str, d: dict) -> str:
        if path.startswith(str(d["fs"])):
            return "the feature store can be deleted"
        if making_run_folder("_mkdir", path, d):
            return ""   # the folder could not be made: nothing in it to resume (`fail_and_recover` checks)
        return run_dir_word or ""
    return advice


def making_run_folder(op: str, path: str, d: dict) -> bool:
    """Whether the call made a run folder itself (the run's, the suite's or a suite dataset's): one that could
    not be made holds no records, and its line says nothing of a resume (`--out /proc/x` did)."""
    return op == "_mkdir" and Path(path) in (d["run"], *(d["run"] / name for name in SUITE))


def stored(root: Path) -> dict:
    """Every feature a store serves, by entry key and sample id."""
    if not (root / "store.json").is_file():
        return {}
    store = FeatureStore(root)
    out = {}
    for entry in store:
        for sid in entry.ids():
            out[(json.dumps(entry.key, sort_keys=True), sid)] = entry.features(sid).numpy().tobytes()
    return out


def err_lines(capsys, root: Path) -> list[str]:
    """stderr's lines, with the command's folder written ROOT (to compare with another command's)."""
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return captured.err.replace(str(root), "ROOT").splitlines()


def uninterrupted(scenario: Scenario, disk: FailingDisk, root: Path, capsys) -> tuple[object, list, list[str]]:
    """The command without faults: its state, its OS calls, its stderr lines (warnings every run prints)."""
    d = scenario.dirs(root)
    disk.arm(None)
    assert cli_main(scenario.argv(d)) == 0
    calls = list(disk.calls)
    return scenario.state(d), calls, err_lines(capsys, root)


def fail_and_recover(scenario: Scenario, disk: FailingDisk, root: Path, n: int, capsys, reference: object,
                     reference_store: dict, clean_err: Sequence[str]) -> bool:
    """Fail the n-th call; False when the command finished before making n calls."""
    d = scenario.dirs(root)
    err = ERRNOS[n % len(ERRNOS)]
    disk.arm(n, err)
    code = cli_main(scenario.argv(d))
    disk.disarm()
    failing = disk.failure
    lines = [line for line in err_lines(capsys, root) if line not in clean_err]
    if failing is None:
        assert code == 0 and not lines
        return False
    op, path = failing
    where = f"call {n} ({op} {path}, {os.strerror(err)})"
    assert code == 1 and len(lines) == 1, f"{where}: exit {code}, stderr {lines}"
    line = lines[0]
    assert line.startswith(f"shiftlab {scenario.argv(d)[0]}: error: "), (where, line)
    assert target(path).replace(str(root), "ROOT") in line and os.strerror(err) in line, (where, line)
    assert scenario.advice(path, d) in line, (where, line)
    assert not making_run_folder(op, path, d) or "resume" not in line, (where, line)
    # the command again, on a disk that works: exactly what an uninterrupted command leaves
    assert cli_main(scenario.again(d)) == 0, where
    capsys.readouterr()
    assert scenario.state(d) == reference, where
    # a feature store may lack what a failed command encoded and could not store (a resumed online
    # stream does not encode again what its checkpoint covers), never hold a wrong feature
    assert stored(d["fs"]).items() <= reference_store.items(), where
    assert not orphans(*d.values()), (where, orphans(*d.values()))
    return True


def first_calls(calls: Sequence[tuple[str, str]], d: dict, per: str = "point") -> list[int]:
    """1-based indices of the first call of each distinct failure point (per="point") or on each file
    (per="file"); a suite's second dataset writes the files of its first: the same points."""
    seen: dict[object, int] = {}
    for i, (op, path) in enumerate(calls, start=1):
        where = point(op, path, d, {f"/{name}/": "/DATASET/" for name in SUITE})
        seen.setdefault(where if per == "point" else where[1], i)
    return sorted(seen.values())


def check_points(scenario: Scenario, disk: FailingDisk, tmp_path: Path, capsys, per: str) -> int:
    """Fail every call (per="call"), the first of each failure point ("point") or on each file ("file")."""
    reference, calls, clean_err = uninterrupted(scenario, disk, tmp_path / "reference", capsys)
    reference_store = stored(scenario.dirs(tmp_path / "reference")["fs"])
    points = range(1, len(calls) + 1) if per == "call" else \
        first_calls(calls, scenario.dirs(tmp_path / "reference"), per)
    for n in points:
        assert fail_and_recover(scenario, disk, tmp_path / f"n{n}", n, capsys, reference, reference_store, clean_err)
    # one past the last call: the command completes untouched
    assert not fail_and_recover(scenario, disk, tmp_path / "past", len(calls) + 1, capsys, reference,
                                reference_store, clean_err)
    print(f"{scenario.name}: {len(points)} failure points of {len(calls)} calls")   # for docs/ARCHITECTURE.md
    return len(points)


def test_a_run_fails_in_one_line_on_every_file_and_resumes_exactly(data, tiny_checkpoint, disk, tmp_path,
                                                                             capsys):
    scenario = run_scenario(data, tiny_checkpoint)
    reference, calls, _ = uninterrupted(scenario, disk, tmp_path / "probe", capsys)
    ops = {op for op, _ in calls}
    files = {point(op, p, scenario.dirs(tmp_path / "probe"))[1] for op, p in calls}
    # the run writes every kind of file this test means to cover
    assert {"_open", "_write", "_fsync", "_rename", "_truncate", "_mkdir"} <= ops
    assert {"run/records.jsonl", "run/probs/probs.f16", "run/probs/probs.jsonl", "run/online_state.pt",
            "run/run.json", "run/run.lock", "run/summary.json", "run/summary.md", "fs/store.json", "fs/run.lock",
            "fs/ENTRY/key.json", "fs/ENTRY/SHARD.bin", "fs/ENTRY/SHARD.json"} <= files
    records, vectors = reference
    assert len(records) == 8 and len(vectors) == 8 and len(stored(scenario.dirs(tmp_path / "probe")["fs"])) == 4
    assert check_points(scenario, disk, tmp_path, capsys, per="file") >= 17


@pytest.mark.slow
def test_a_run_fails_in_one_line_at_every_call_and_resumes_exactly(data, tiny_checkpoint, disk, tmp_path, capsys):
    assert check_points(run_scenario(data, tiny_checkpoint), disk, tmp_path, capsys, per="call") >= 70


@pytest.mark.slow
@pytest.mark.parametrize("make", [encode_scenario, sweep_scenario, suite_scenario], ids=["encode", "sweep", "suite"])
def test_encode_sweep_and_suite_fail_in_one_line_and_recover_exactly(make, data, tiny_checkpoint, disk, tmp_path,
                                                                     capsys):
    assert check_points(make(data, tiny_checkpoint), disk, tmp_path, capsys, per="point") >= 10


@pytest.mark.slow
def test_a_report_fails_in_one_line_and_is_written_again(data, tiny_checkpoint, disk, tmp_path, capsys):
    source = tmp_path / "source"
    assert cli_main(["run", *common(data, tiny_checkpoint), "--methods", "zeroshot,tda", "--set",
                     "tda.text_head=zeroshot", "--out", str(source)]) == 0
    capsys.readouterr()
    assert check_points(report_scenario(source), disk, tmp_path, capsys, per="file") >= 6
