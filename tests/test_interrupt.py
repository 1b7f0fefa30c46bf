"""SIGINT / SIGTERM during `shiftlab run`: records flushed, one line on stderr ("interrupted after N
of M samples; continue with --resume"), exit 130 / 143 (128 + the signal, what shells and schedulers
read), and `--resume` completes to the records of an uninterrupted run. No traceback: an interrupt is
the user's or the scheduler's decision, not a fault to debug.

Every signalled CLI run is held at a gate after its first step (tests/_gate.py): the signal arrives
once the first sample's records are written, never at a moment guessed with a sleep."""
from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from _gate import GatedRun
from _runs import comparable
from shiftlab.cli import main as cli_main
from shiftlab.engine import interrupt
from shiftlab.engine import loop as engine
from shiftlab.options import speaking_cli
from shiftlab.rundir import record_files
from shiftlab.synthetic import make_imagenet_r

MESSAGE = "shiftlab run: interrupted after 1 of 4 samples; continue with --resume"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 25), per_class=1)   # 8 images


def _argv(data: Path, out: Path, *extra: str, methods: str = "zeroshot,tpt,tda") -> list[str]:
    # an online method checkpointed every batch, so its records are written with the sample's others; a method's
    # --set only where it runs (the run warns of values for methods it does not run: one more stderr line)
    sets = [a for name, value in (("tpt", "steps=1"), ("tda", "text_head=zeroshot")) if name in methods.split(",")
            for a in ("--set", f"{name}.{value}")]
    return ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none", "--methods", methods,
            *sets, "--views", "4", "--batch-size", "1",
            "--limit", "4", "--device", "cpu", "--no-progress", "--allow-partial", "--online-checkpoint-seconds", "0",
            "--out", str(out), *extra]


def _strip(path: Path) -> list[str]:
    return comparable(record_files.iter_records(path))


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory, one_thread_module) -> list[str]:
    out = tmp_path_factory.mktemp("ref") / "run"
    assert cli_main(_argv(data, out, "--workers", "0")) == 0
    return _strip(out / "records.jsonl")


def _said(err: str) -> list[str]:
    """stderr without the synthetic dataset's empty-class warning."""
    return [ln for ln in err.splitlines() if ln.strip() and "class folders have no images" not in ln]


def _check_interrupted(out: Path, err: str) -> None:
    assert _said(err) == [MESSAGE] and "Traceback" not in err
    assert not (out / "run.lock").exists()   # issue 40, 21: SIGTERM left the lock file behind
    lines = (out / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 3 and all(line.endswith(b"\n") for line in lines)       # one sample, every method
    assert len(list(record_files.iter_records(out / "records.jsonl"))) == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_this_process_ends_in_one_line_and_resumes_exactly(data, reference, tmp_path, monkeypatch,
                                                                       capsys, sig):
    class SignalAfterFirstStep(engine.RunHooks):
        def after_step(self, ids, recs):
            os.kill(os.getpid(), sig)      # the handler cli.main installed raises here
            raise AssertionError(f"{signal.Signals(sig).name} did not interrupt the run")

    out = tmp_path / "run"
    previous = signal.getsignal(sig)
    real_run = engine.run
    monkeypatch.setattr(engine, "run", lambda *a, **kw: real_run(*a, **{**kw, "hooks": SignalAfterFirstStep()}))
    capsys.readouterr()
    assert cli_main(_argv(data, out, "--workers", "0")) == 128 + sig
    _check_interrupted(out, capsys.readouterr().err)
    assert signal.getsignal(sig) == previous                                     # the handler is not left behind
    monkeypatch.undo()
    assert cli_main(_argv(data, out, "--workers", "0", "--resume")) == 0
    assert _strip(out / "records.jsonl") == reference


def test_a_forked_child_does_not_hold_the_run_lock(tmp_path):
    """Issue 40 case 19: a DataLoader worker (a forked child) inherited the lock's descriptor, so after its run
    was killed an orphaned worker held the directory and a resume was refused naming a dead pid. The lock is
    the run's: a child closes its copy at once, and the parent's lock is still held while the parent lives."""
    from shiftlab.rundir.lock import RunLock, RunLockedError
    lock = RunLock(tmp_path).acquire()
    go_on, hold = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: lives on, as an orphaned worker would, until the test lets it go
        try:
            os.close(hold)
            os.read(go_on, 1)
        finally:
            os._exit(0)
    try:
        os.close(go_on)
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()} "):
            RunLock(tmp_path).acquire()          # the parent still holds it
        lock.release()                           # the run ends (or dies) while its child lives
        RunLock(tmp_path).acquire().release()    # free at once, not when the child goes
    finally:
        os.close(hold)
        os.waitpid(pid, 0)


@pytest.mark.slow
def test_a_resume_right_after_kill_9_is_not_refused_by_an_orphaned_worker(data, reference, tmp_path):
    """Issue 40 case 19 end to end: `--workers 1`, the main process killed with SIGKILL (its DataLoader worker
    orphaned, alive for seconds until it notices), then at once the lock and a resume."""
    from shiftlab.rundir.lock import RunLock
    out = tmp_path / "run"
    argv = _argv(data, out, "--workers", "1")
    with GatedRun(tmp_path / "gate", argv, at="after_step:1", new_session=True) as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL          # the main process only: its worker lives on
        RunLock(out).acquire().release()                # free at once (was: "in use ... pid <dead>")
    argv[argv.index("--workers") + 1] = "0"
    assert cli_main([*argv, "--resume"]) == 0
    assert _strip(out / "records.jsonl") == reference


def test_a_lock_file_removed_between_open_and_flock_is_not_the_one_held(tmp_path, monkeypatch):
    """The holder removes run.lock on release; a process that opened the old file just before then locks a file
    no longer named run.lock, so it must let it go and lock the new one (else two processes hold two files)."""
    from shiftlab import writes
    from shiftlab.rundir import lock as run_lock
    opened, real = [], writes.LockFile

    def open_then_released(path, then=""):
        handle = real(path, then)
        if not opened:                  # the holder releases right after our first open
            os.unlink(path)
        opened.append(handle)
        return handle

    monkeypatch.setattr(run_lock.writes, "LockFile", open_then_released)
    held = run_lock.RunLock(tmp_path).acquire()
    assert len(opened) == 2 and os.fstat(opened[1].fd).st_ino == os.stat(tmp_path / "run.lock").st_ino
    held.release()


def _checkpoint_argv(data: Path, out: Path, *extra: str) -> list[str]:
    argv = _argv(data, out, "--workers", "0", *extra)
    argv[argv.index("--online-checkpoint-seconds") + 1] = "600"   # by the sample count alone
    return argv


@pytest.mark.parametrize("every, said", [
    (None, "interrupted after 0 of 4 samples (records on disk: zeroshot 3, tpt 3, tda 0 of 4)"),
    ("2", "interrupted after 2 of 4 samples (records on disk: zeroshot 3, tpt 3, tda 2 of 4)")],
    ids=["default", "every-2-samples"])
def test_an_interrupt_inside_a_step_counts_each_methods_records_on_disk(data, reference, tmp_path, monkeypatch,
                                                                        capsys, every, said):
    """Issue 40 case 4: Ctrl-C inside a step (the online state part-way through it: no checkpoint) said
    "interrupted after 0 of 40 samples" with 38 records on disk. The line counts what is on disk, per method
    when they differ; the online records reach disk every --online-checkpoint-samples samples; and --resume
    still completes to the uninterrupted records."""
    from shiftlab.engine.step import Runner
    real_step, steps = Runner.step, []

    def step_interrupted_in_the_fourth(self, batch):
        out = real_step(self, batch)
        steps.append(1)
        if len(steps) == 4:
            os.kill(os.getpid(), signal.SIGINT)   # inside the step: its records are not written
        return out

    monkeypatch.setattr(Runner, "step", step_interrupted_in_the_fourth)
    out = tmp_path / "run"
    argv = _checkpoint_argv(data, out, *(["--online-checkpoint-samples", every] if every else []))
    capsys.readouterr()
    assert cli_main(argv) == 130
    assert _said(capsys.readouterr().err) == [f"shiftlab run: {said}; continue with --resume"]
    monkeypatch.undo()
    assert cli_main([*argv, "--resume"]) == 0
    resumed = [ln for ln in _said(capsys.readouterr().err) if "resuming" in ln]
    done = said.replace("interrupted after ", "").replace(" samples (", " samples already done (")
    assert resumed == [f"shiftlab: resuming {out}: {done}"]
    assert _strip(out / "records.jsonl") == reference


@pytest.mark.slow
def test_a_kill_loses_at_most_the_online_records_since_the_last_sample_count_checkpoint(data, reference, tmp_path):
    """--online-checkpoint-samples 2: killed (SIGKILL) right after the first checkpoint, the online records of
    samples 1-2 are on disk (not only after a minute), and --resume completes to the uninterrupted records."""
    out = tmp_path / "run"
    argv = _checkpoint_argv(data, out, "--online-checkpoint-samples", "2")
    with GatedRun(tmp_path / "gate", argv, at="after_step:3") as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    methods = [r["method"] for r in record_files.iter_records(out / "records.jsonl")]
    assert {m: methods.count(m) for m in ("zeroshot", "tpt", "tda")} == {"zeroshot": 3, "tpt": 3, "tda": 2}
    assert cli_main([*argv, "--resume"]) == 0
    assert _strip(out / "records.jsonl") == reference


def test_interrupt_helpers():
    assert interrupt.exit_code(KeyboardInterrupt()) == 130
    assert interrupt.exit_code(interrupt.Interrupted(signal.SIGTERM)) == 143
    assert isinstance(interrupt.Interrupted(signal.SIGINT), KeyboardInterrupt)    # no `except Exception` takes it
    exc = interrupt.Interrupted(signal.SIGTERM)
    assert interrupt.message(exc) == "interrupted"
    exc.progress = (3, 24)
    assert interrupt.message(exc) == "interrupted after 3 of 24 samples; continue with resume=True"
    with speaking_cli():
        assert interrupt.message(exc) == "interrupted after 3 of 24 samples; continue with --resume"


@pytest.mark.slow
@pytest.mark.parametrize("sig,workers,group", [(signal.SIGINT, 0, False), (signal.SIGTERM, 0, False),
                                               (signal.SIGINT, 1, True), (signal.SIGTERM, 1, True)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-group-with-workers", "SIGTERM-group-with-workers"])
def test_a_signalled_cli_run_exits_with_one_line_and_resumes_exactly(data, reference, tmp_path, sig, workers,
                                                                     group):
    """`group`: the signal goes to the process group (Ctrl-C in a terminal, a scheduler), DataLoader
    workers included; else to the main process alone (`kill PID`)."""
    out = tmp_path / "run"
    with GatedRun(tmp_path / "gate", _argv(data, out, "--workers", str(workers)), at="after_step:1",
                  new_session=True) as child:
        child.wait_reached()
        child.signal(sig, group=group)
        assert child.wait(timeout=120) == 128 + sig
    _check_interrupted(out, child.stderr)
    assert cli_main(_argv(data, out, "--workers", "0", "--resume")) == 0
    assert _strip(out / "records.jsonl") == reference


@pytest.mark.slow
def test_torchrun_ranks_each_handle_the_signal_and_rank0_alone_says_so(data, tmp_path):
    """SIGTERM to torchrun (a scheduler pre-empting the job): the agent forwards it to every rank;
    each exits 143, rank 0 prints the one line, and a resume completes to the uninterrupted records."""
    methods = "zeroshot,tpt"
    ref = tmp_path / "ref"
    assert cli_main(_argv(data, ref, "--workers", "0", methods=methods)) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs, out = tmp_path / "logs", tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
                "--log-dir", str(logs), "--redirects", "3"]
    with GatedRun(tmp_path / "gate", _argv(data, out, "--workers", "0", methods=methods), at="after_step:1",
                  launcher=torchrun, env={"OMP_NUM_THREADS": None}) as child:
        child.wait_reached(ranks=(0, 1))
        child.signal(signal.SIGTERM)
        child.wait(timeout=120)
    rank_err = {int(p.parent.name): p.read_text() for p in logs.rglob("stderr.log")}
    assert sorted(rank_err) == [0, 1], child.stderr[-2000:]
    assert _said(rank_err[0]) == ["shiftlab run: interrupted after 2 of 4 samples; continue with --resume"]
    assert _said(rank_err[1]) == [] and not any("Traceback" in e for e in rank_err.values())
    assert [child.exit_code(r) for r in (0, 1)] == [143, 143]   # what each rank returned
    assert cli_main(_argv(data, out, "--workers", "0", "--resume", methods=methods)) == 0
    assert _strip(out / "records.jsonl") == _strip(ref / "records.jsonl")


@pytest.mark.slow
def test_held_back_online_records_are_written_when_the_signal_comes_between_steps(data, reference, tmp_path):
    """Issue 29 finding 8: with the default checkpoint interval an online method holds its records back;
    an interrupt between steps checkpoints them, so the line counts the samples whose records are all on
    disk (it said 0 while records.jsonl held the episodic ones), and --resume completes exactly."""
    out = tmp_path / "run"
    argv = _argv(data, out, "--workers", "0")
    argv[argv.index("--online-checkpoint-seconds") + 1] = "600"
    with GatedRun(tmp_path / "gate", argv, at="after_step:1") as child:
        child.wait_reached()
        child.signal(signal.SIGINT)
        assert child.wait(timeout=120) == 130
    _check_interrupted(out, child.stderr)
    assert {r["method"] for r in record_files.iter_records(out / "records.jsonl")} == {"zeroshot", "tpt", "tda"}
    assert cli_main([*argv, "--resume"]) == 0
    assert _strip(out / "records.jsonl") == reference
