"""Scale-out with torchrun: the work plan, shard files across world sizes, resume, merge, timings.

Fast tests simulate ranks in one process (`distributed.context` and the collective patched);
the slow ones start real torchrun jobs on CPU/gloo and compare them, record for record
(ignoring the timing field `seconds`), with a single-process run.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from _gate import SCRIPT, GatedRun, child_env
from _registered import registered
from _runs import comparable as _strip
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.engine import distributed, planning
from shiftlab.engine import loop as engine
from shiftlab.engine.config import RunConfig
from shiftlab.engine.distributed import DistContext
from shiftlab.methods import base as method_base
from shiftlab.methods.base import Method, MethodOutput, register_method
from shiftlab.options import speaking_cli
from shiftlab.rundir import record_files, records, stream
from shiftlab.rundir.online_state import OnlineState
from shiftlab.synthetic import make_imagenet_r, tiny_clip

ONLINE = "test_stream_mean"
N_IMAGES = 8


# -- an online (non-episodic) method whose outputs depend on the exact stream order ---------

class StreamMean(Method):
    """Zero-shot logits plus a bias from the mean feature of the samples seen so far.

    `extras.prev` is the previous sample of the stream and `extras.seen` the count, so any
    change of order, a lost state or a replayed sample shows up in the records.
    """
    episodic = False
    needs_views = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.total, self.seen, self.prev = None, 0, -1

    def predict_context(self, ctx):
        feature = ctx.base_feature.detach().float().cpu()
        logits = ctx.zeroshot_logits.detach().float().cpu()
        if self.total is not None:
            logits = logits + 10.0 * (self.total / self.seen) @ self.heads.zeroshot.detach().float().cpu().T
        out = MethodOutput(logits, extras={"seen": self.seen, "prev": self.prev})
        self.total = feature.clone() if self.total is None else self.total + feature
        self.seen, self.prev = self.seen + 1, int(ctx.sample_id)
        return out

    def state_dict(self):
        return {"total": self.total, "seen": self.seen, "prev": self.prev}

    def load_state_dict(self, state):
        self.total, self.seen, self.prev = state["total"], state["seen"], state["prev"]


def register_online() -> str:
    if ONLINE not in method_base._REGISTRY:
        register_method(ONLINE)(StreamMean)   # registers in a child process
    return ONLINE


@pytest.fixture
def online_method():
    with registered(ONLINE, StreamMean):   # other test modules are parametrised over the registry
        yield ONLINE


pytestmark = pytest.mark.usefixtures("one_thread")


def _key_counts(recs):
    return Counter(records.record_key(r) for r in recs)


# -- the plan ------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [1, 3])
def test_plan_every_pair_exactly_once_and_online_on_rank0_in_stream_order(block):
    order = stream.stream_order(11, "shuffled", 3)
    methods = {"a": SimpleNamespace(episodic=True), "b": SimpleNamespace(episodic=True),
               "on": SimpleNamespace(episodic=False)}
    want = Counter((sid, m) for sid in order for m in methods)
    single = [[order[i] for i in b] for b in planning.plan(order, DistContext(), methods, block).batches(order)]
    assert single == [order[i:i + block] for i in range(0, 11, block)]
    for world in (1, 2, 3, 4):
        owned = Counter()
        batches = []
        for rank in range(world):
            plan = planning.plan(order, DistContext(rank, world), methods, block)
            owned.update((sid, m) for sid in plan.ids for m in methods if plan.owns(sid, m))
            assert plan.ids == [s for s in order if s in set(plan.ids)]          # stream order kept
            blocks = [order[i:i + block] for i in range(rank * block, 11, world * block)]
            shard = [sid for b in blocks for sid in b]
            assert planning.shard(order, DistContext(rank, world), block=block) == shard
            if rank == 0:
                assert plan.ids == order and plan.online == ("on",)              # the whole stream
            else:
                assert plan.ids == shard and plan.online == ()
                batches += [[shard[i] for i in b] for b in plan.batches(shard)]
            assert [s for s in plan.ids if plan.owns(s, "a")] == shard
        assert owned == want, world
        assert all(b in single for b in batches)   # every rank runs a single process's batches


def test_plan_batches_after_resume_split_only_interrupted_blocks():
    order = list(range(10))
    plan = planning.plan(order, DistContext(1, 2), {"a": SimpleNamespace(episodic=True)}, block=3)
    assert plan.ids == [3, 4, 5, 9]
    pending = [4, 5, 9]                                            # 3 was done before the interruption
    assert [[pending[i] for i in b] for b in plan.batches(pending)] == [[4, 5], [9]]


def test_plan_pending_skips_done_and_error_records():
    order = [4, 2, 0, 1, 3]
    methods = {"a": SimpleNamespace(episodic=True), "on": SimpleNamespace(episodic=False)}
    done = {(4, "a", "clean"), (4, "on", "clean"), (1, None, "clean"), (0, "on", "clean"), (2, "a", "clean")}
    rank0 = planning.plan(order, DistContext(0, 2), methods)   # episodic: 4, 0, 3; online: all
    assert rank0.pending(["clean"], done) == [2, 0, 3]             # 2: online missing; 0: "a" missing
    rank1 = planning.plan(order, DistContext(1, 2), methods)   # episodic: 2, 1
    assert rank1.pending(["clean"], done) == []
    assert rank1.pending(["clean", "pgd"], done) == [2, 1]
    assert planning.shard(order, DistContext(1, 2)) == [2, 1]   # online methods do not change the shard


def test_records_path_per_rank(tmp_path):
    assert distributed.records_path(tmp_path, DistContext()) == tmp_path / "records.jsonl"
    assert distributed.records_path(tmp_path, DistContext(2, 3)) == tmp_path / "shards" / "records-rank2.jsonl"


def test_threads_split_per_rank(monkeypatch):
    monkeypatch.setattr(distributed, "_usable_cpus", lambda: 16)
    monkeypatch.delenv("SHIFTLAB_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")                     # what torchrun sets when unset
    assert distributed.set_threads(4) == 4 and torch.get_num_threads() == 4
    assert distributed.set_threads(32) == 1
    assert distributed.set_threads(1) is None                      # one process: torch's default
    monkeypatch.setenv("OMP_NUM_THREADS", "3")                     # the user's choice wins
    assert distributed.set_threads(4) is None
    monkeypatch.setenv("SHIFTLAB_NUM_THREADS", "2")
    assert distributed.set_threads(4) == 2 and distributed.set_threads(1) == 2


# -- records across world sizes ---------------------------------------------------------

def _rec(sid, method="a", setting="clean", **extra):
    """A complete record (a prediction, or an error record with `error=`)."""
    base = {"id": sid, "path": f"c/{sid}.jpg", "method": method, "setting": setting, "label": 0}
    if "error" in extra:
        return {**base, **extra}
    return {**base, "pred": 0, "top5": [0], "confidence": 1.0, "true_prob": 1.0, "correct": True, "seconds": 0.1,
            **extra}


def _write(path: Path, recs, torn: str = ""):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in recs) + torn)


def test_prior_records_agree_and_read_every_shard(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert distributed.prior_records(run_dir, False, DistContext()) == set()
    # an interrupted run: merged records, then 3-rank shards with torn tails, then a 2-rank shard
    _write(run_dir / "records.jsonl", [_rec(0)])
    _write(run_dir / "shards" / "records-rank0.jsonl", [_rec(1), _rec(1, None, error="x")], torn='{"id": 9')
    _write(run_dir / "shards" / "records-rank2.jsonl", [_rec(2), _rec(0)], torn='{"id": 8, "meth')
    with pytest.raises(FileExistsError, match="pass resume=True to continue it or choose another out="):
        distributed.prior_records(run_dir, False, DistContext())
    with speaking_cli(), pytest.raises(FileExistsError, match="pass --resume to continue it or choose another --out"):
        distributed.prior_records(run_dir, False, DistContext())
    assert distributed.prior_records(run_dir, True, DistContext()) == {
        (0, "a", "clean"), (1, "a", "clean"), (1, None, "clean"), (2, "a", "clean")}

    # a rank of a new 2-rank run appends to a shard name an older run used: nothing is lost
    with record_files.RecordWriter(distributed.records_path(run_dir, DistContext(0, 2))) as w:
        w.write([_rec(3)])
    keys = record_files.done_keys(record_files.load_records(run_dir))
    assert {(3, "a", "clean"), (1, "a", "clean"), (2, "a", "clean")} <= keys
    assert (9, "a", "clean") not in keys
    merged = record_files.merge_records(run_dir)
    first = merged.read_bytes()
    assert not (run_dir / "shards").exists()
    recs = list(record_files.iter_records(merged))
    assert max(_key_counts(recs).values()) == 1 and len(recs) == 5
    record_files.merge_records(run_dir)
    assert merged.read_bytes() == first                          # idempotent

    # agreement: one rank seeing records makes every rank refuse (before any rank writes)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(distributed, "all_gather", lambda ctx, obj: [obj, True])
    with pytest.raises(FileExistsError):
        distributed.prior_records(empty, False, DistContext(0, 2))


def test_gather_timings_aggregates_and_detects_unshared_run_dir(tmp_path, monkeypatch, capsys):
    one = distributed.gather_timings(DistContext(), tmp_path, 2.0, 4, 1.0)
    assert one == {"wall_seconds": 2.0, "images": 4, "shared_seconds_per_image": 0.25}
    _write(tmp_path / "shards" / "records-rank0.jsonl", [_rec(0)])
    _write(tmp_path / "shards" / "records-rank1.jsonl", [_rec(1)])
    size1 = (tmp_path / "shards" / "records-rank1.jsonl").stat().st_size
    other = {"rank": 1, "host": "h1", "wall_seconds": 5.0, "images": 6, "encode_seconds": 3.0,
             "shard": "shards/records-rank1.jsonl", "shard_bytes": size1}
    monkeypatch.setattr(distributed, "all_gather", lambda ctx, obj: [obj, other])
    assert distributed.gather_timings(DistContext(1, 2), tmp_path, 1.0, 1, 1.0) is None
    t = distributed.gather_timings(DistContext(0, 2), tmp_path, 2.0, 4, 1.0)
    assert t["wall_seconds"] == 5.0 and t["images"] == 10 and t["ranks"] == 2
    assert t["shared_seconds_per_image"] == pytest.approx(0.4)     # per image, not divided by ranks
    assert [p["rank"] for p in t["per_rank"]] == [0, 1]
    other["shard_bytes"] = size1 + 1                               # rank 0 sees an older copy
    assert distributed.gather_timings(DistContext(0, 2), tmp_path, 2.0, 4, 1.0) is None
    assert "shiftlab merge" in capsys.readouterr().err


# -- simulated ranks in one process (fast) -------------------------------------------------

@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist-data")
    make_imagenet_r(root, classes=range(0, 200, 25), per_class=1)   # 8 images
    return root


class _Crash(Exception):
    pass


def _simulate(monkeypatch, model, dataset, out, methods, world, rank, crash_after=None, **cfg):
    """Run one rank of a `world`-rank job in this process; optionally die after N batches."""
    ctx = DistContext(rank, world)
    monkeypatch.setattr(distributed, "context", lambda: ctx)
    monkeypatch.setattr(distributed, "all_gather", lambda c, obj: [obj] * c.world_size)
    calls = []

    class CrashAfter(engine.RunHooks):
        def before_step(self, ids):
            if crash_after is not None and len(calls) >= crash_after:
                raise _Crash()
            calls.append(ids)

    cfg = {"views": 4, "workers": 0, "batch_size": 1, "progress": False, "resume": True,
           "online_checkpoint_seconds": 0, **cfg}  # checkpoint online state after every batch
    config = RunConfig(data="", methods=list(methods), out=str(out), **cfg)
    try:
        return engine.run(config, model=model, dataset=dataset, hooks=CrashAfter())
    except _Crash:
        return None
    finally:
        monkeypatch.undo()


@pytest.mark.slow
@pytest.mark.parametrize("resume_world", [1, 2])
def test_simulated_interrupted_3_ranks_resumed_with_other_world(data_root, tiny_model, online_method, tmp_path,
                                                                monkeypatch, resume_world):
    dataset = build_dataset("imagenet-r", str(data_root))
    methods = ["zeroshot", "view_ensemble", online_method]
    ref = _simulate(monkeypatch, tiny_model, dataset, tmp_path / "ref", methods, 1, 0)
    assert ref["methods"][online_method]["n"] == N_IMAGES
    reference = list(record_files.iter_records(tmp_path / "ref" / "records.jsonl"))

    out = tmp_path / "run"
    _simulate(monkeypatch, tiny_model, dataset, out, methods, 3, 1, crash_after=1)
    _simulate(monkeypatch, tiny_model, dataset, out, methods, 3, 2)                  # done, waits for rank 0
    _simulate(monkeypatch, tiny_model, dataset, out, methods, 3, 0, crash_after=3)   # killed mid-stream
    with open(out / "shards" / "records-rank1.jsonl", "a") as fh:
        fh.write('{"id": 3, "method": "zeroshot", "pr')                              # killed mid-write
    before = {records.record_key(r): r for r in record_files.load_records(out)}
    assert 0 < len(before) < len(reference)
    assert (out / OnlineState.FILE).is_file()

    for rank in reversed(range(resume_world)):                                      # rank 0 last: it merges
        summary = _simulate(monkeypatch, tiny_model, dataset, out, methods, resume_world, rank)
    assert summary["methods"][online_method]["n"] == N_IMAGES and summary["errors"] == 0
    final = list(record_files.iter_records(out / "records.jsonl"))
    assert max(_key_counts(final).values()) == 1
    assert _strip(final) == _strip(reference)
    assert not (out / "shards").exists()
    for rec in final:                                     # what existed was kept, not recomputed
        if records.record_key(rec) in before:
            assert rec["seconds"] == before[records.record_key(rec)]["seconds"]


def test_simulated_two_ranks_equal_single_process(data_root, tiny_model, online_method, tmp_path, monkeypatch):
    dataset = build_dataset("imagenet-r", str(data_root))
    methods = ["zeroshot", online_method]
    # batches of 3 one-view samples: the rows a batch encodes together match a single process's
    _simulate(monkeypatch, tiny_model, dataset, tmp_path / "ref", methods, 1, 0, batch_size=3)
    _simulate(monkeypatch, tiny_model, dataset, tmp_path / "run", methods, 2, 1, batch_size=3)
    rank1 = list(record_files.iter_records(tmp_path / "run" / "shards" / "records-rank1.jsonl"))
    assert {r["method"] for r in rank1} == {"zeroshot"} and len(rank1) == 3           # the 2nd block
    summary = _simulate(monkeypatch, tiny_model, dataset, tmp_path / "run", methods, 2, 0, batch_size=3)
    assert summary["timings"]["ranks"] == 2
    assert _strip(record_files.iter_records(tmp_path / "run" / "records.jsonl")) == \
        _strip(record_files.iter_records(tmp_path / "ref" / "records.jsonl"))


@pytest.mark.parametrize("target", ["transfer", "adaptive"])
def test_simulated_robust_run_over_two_ranks_killed_and_resumed_equals_single_process(data_root, tiny_model, tmp_path,
                                                                                     monkeypatch, target):
    """Robust runs spread and resume as clean runs do (issue #41): PGD, clean and attacked settings, transfer or
    through the adaptation, 2 ranks with rank 0 killed mid-stream and resumed: the records of one process."""
    dataset = build_dataset("imagenet-r", str(data_root))
    methods = ["zeroshot", "tpt"]
    robust = {"attack": {"name": "pgd", "eps": 4 / 255, "alpha": 1 / 255, "steps": 2}, "clean_and_robust": True,
              "attack_target": target, "method_config": {"tpt": {"steps": 1}}}
    _simulate(monkeypatch, tiny_model, dataset, tmp_path / "ref", methods, 1, 0, **robust)
    reference = list(record_files.iter_records(tmp_path / "ref" / "records.jsonl"))
    assert {r["setting"] for r in reference} == {"clean", *(["pgd"] if target == "transfer" else ["pgd-adaptive"])}
    out = tmp_path / "run"
    _simulate(monkeypatch, tiny_model, dataset, out, methods, 2, 1, **robust)
    _simulate(monkeypatch, tiny_model, dataset, out, methods, 2, 0, crash_after=1, **robust)   # killed mid-stream
    summary = _simulate(monkeypatch, tiny_model, dataset, out, methods, 2, 0, **robust)        # resumed: merges
    assert summary["errors"] == 0 and summary["timings"]["ranks"] == 2
    assert _strip(record_files.iter_records(out / "records.jsonl")) == _strip(reference)


# -- real torchrun jobs (CPU, gloo) ----------------------------------------------------------

ALL = f"zeroshot,tpt,view_ensemble,{ONLINE}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# tests/_gate.py's SCRIPT is the CLI that first registers the test-only online method, in every rank
SETUP = "test_distributed:register_online"


def _env() -> dict[str, str]:
    return child_env(SETUP, OMP_NUM_THREADS=None)     # torchrun sets its own


def _torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-port", str(_free_port())]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchrun")
    make_imagenet_r(root / "data", classes=range(0, 200, 25), per_class=1)
    ckpt = root / "tiny.pt"
    torch.save(tiny_clip(0).clip.state_dict(), ckpt)      # OpenAI key format: loads as shiftlab-tiny
    args = ["run", "--data", str(root / "data"), "--model", "shiftlab-tiny", "--pretrained", str(ckpt), "--views", "8",
            "--workers", "0", "--no-progress", "--batch-size", "2", "--allow-partial"]     # 4 blocks of 2 in the stream
    ref = root / "ref"
    subprocess.run([sys.executable, str(SCRIPT), *args, "--methods", ALL, "--out", str(ref)],
                   env=_env(), check=True, capture_output=True, timeout=120)
    return SimpleNamespace(root=root, args=args,
                           reference=list(record_files.iter_records(ref / "records.jsonl")))


@pytest.mark.slow
def test_torchrun_two_ranks_equal_single_process(job):
    out = job.root / "two"
    cmd = _torchrun(2) + ["-m", "shiftlab", *job.args, "--methods", "zeroshot,tpt,view_ensemble", "--out", str(out)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = list(record_files.iter_records(out / "records.jsonl"))
    assert len(recs) == 3 * N_IMAGES and max(_key_counts(recs).values()) == 1
    assert _strip(recs) == _strip(job.reference, {"zeroshot", "tpt", "view_ensemble"})
    assert not (out / "shards").exists()
    summary = json.loads((out / "summary.json").read_text())
    t = summary["timings"]
    assert t["ranks"] == 2 and t["images"] == N_IMAGES and [p["images"] for p in t["per_rank"]] == [4, 4]
    for m in summary["methods"].values():
        assert m["n"] == N_IMAGES and 0 < m["seconds_per_image"] < t["wall_seconds"]

    # `shiftlab merge` alone is idempotent on a finished run
    summary_before = json.loads((out / "summary.json").read_text())
    before = (out / "records.jsonl").read_bytes()
    for _ in range(2):
        assert cli_main(["merge", str(out)]) == 0
        assert (out / "records.jsonl").read_bytes() == before
    assert json.loads((out / "summary.json").read_text())["methods"] == summary_before["methods"]

    # a second fresh run into the same directory: every rank refuses, nothing is written
    proc = subprocess.run(_torchrun(2) + ["-m", "shiftlab", *job.args, "--methods", "zeroshot", "--out", str(out)],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "already holds records" in proc.stderr
    assert (out / "records.jsonl").read_bytes() == before and not (out / "shards").exists()


def _complete_lines(path: Path) -> int:
    return sum(1 for _ in record_files.iter_records(path)) if path.is_file() else 0


@pytest.mark.slow
def test_torchrun_rank_killed_then_resumed_with_three_ranks(job):
    out = job.root / "killed"
    shards = out / "shards"
    # both ranks hold after their first step: rank 1 has written its first block (2 samples x 3 episodic
    # methods), rank 0 its own; then rank 1 dies and torchrun stops rank 0
    with GatedRun(job.root / "gate", [*job.args, "--methods", ALL, "--out", str(out)], at="after_step:1",
                  launcher=_torchrun(2), setup=SETUP, env={"OMP_NUM_THREADS": None}) as child:
        child.wait_reached(ranks=(0, 1))
        assert _complete_lines(shards / "records-rank1.jsonl") == 2 * 3
        assert _complete_lines(shards / "records-rank0.jsonl") >= 2 * 3
        child.signal(signal.SIGKILL, rank=1)
        returncode = child.wait(timeout=60)
    assert returncode != 0
    before = {records.record_key(r): r for r in record_files.load_records(out)}
    assert 0 < len(before) < len(job.reference) and not (out / "records.jsonl").exists()

    cmd = _torchrun(3) + [str(SCRIPT), *job.args, "--methods", ALL, "--out", str(out), "--resume"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    final = list(record_files.iter_records(out / "records.jsonl"))
    assert max(_key_counts(final).values()) == 1
    assert _strip(final) == _strip(job.reference)
    for rec in final:                                     # the killed job's records were kept as they were
        if records.record_key(rec) in before:
            assert rec == before[records.record_key(rec)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["timings"]["ranks"] == 3 and summary["methods"][ONLINE]["n"] == N_IMAGES
