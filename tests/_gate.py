"""Hold a `shiftlab` CLI run at a point of the engine loop, then signal, kill or release it there.

A kill timed by the clock or by polling the records file lands wherever the run happens to be on a
loaded machine: too early (nothing written) or too late (the run finished). A gate makes the point
exact. Run as a script (`python tests/_gate.py ARGV...`, also under torchrun), this file is the
CLI with the engine's default hooks (`shiftlab.engine.loop.RunHooks`) replaced: at the N-th call of
the hook named in SHIFTLAB_TEST_GATE_AT ("after_step:4", "after_checkpoint:3", "before_step:1") the
process writes its pid to `<dir>/reached-<RANK>` and waits while `<dir>/gate` exists. The records
then hold exactly what those N steps wrote, and a test acts on a process that cannot move on.

`GatedRun` starts such a child and drives it:

    with GatedRun(tmp_path / "gate", ["run", ...], at="after_step:4") as child:
        child.wait_reached()
        child.kill()            # or child.signal(SIGTERM), or child.release() and child.wait()

Without SHIFTLAB_TEST_GATE_AT the script is the plain CLI; SHIFTLAB_TEST_SETUP ("module:function",
imported from tests/, the script's folder) runs first, e.g. to register a test-only method in every
torchrun rank.
"""
from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
DIR_ENV, AT_ENV, SETUP_ENV = "SHIFTLAB_TEST_GATE_DIR", "SHIFTLAB_TEST_GATE_AT", "SHIFTLAB_TEST_SETUP"
HOOKS = ("before_step", "after_step", "after_checkpoint")
POLL_SECONDS = 0.02        # how often a held child looks for the gate, and a test for `reached`


def child_env(setup: str | None = None, **overrides: str | None) -> dict[str, str]:
    """The environment of a child CLI run: this checkout's sources first, one thread (the tests compare
    records bit for bit with in-process runs made with one thread); `None` removes a variable."""
    env = dict(os.environ, SHIFTLAB_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p))
    env.pop(DIR_ENV, None)
    env.pop(AT_ENV, None)
    if setup is not None:
        env[SETUP_ENV] = setup
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def parse_at(at: str) -> tuple[str, int]:
    """("after_step", 4) from "after_step:4"; refuses an unknown hook or a count below 1."""
    hook, _, count = at.partition(":")
    n = int(count or "1")
    if hook not in HOOKS or n < 1:
        raise ValueError(f"gate point {at!r}: expected one of {', '.join(HOOKS)}, then ':N' with N >= 1")
    return hook, n


class GatedRun:
    """A CLI run in a child process held at `at` (see the module docstring); a context manager that
    kills what is still running on exit. `launcher`: what runs this script (python, or torchrun with
    its options); `new_session`: the child leads its own process group (signals to the group)."""

    def __init__(self, folder: Path, argv: Sequence[str], *, at: str, launcher: Sequence[str] = (sys.executable,),
                 setup: str | None = None, env: Mapping[str, str | None] | None = None, new_session: bool = False):
        parse_at(at)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.gate = self.folder / "gate"
        self.gate.write_text("")
        self.new_session = new_session
        self._out = open(self.folder / "stdout.log", "wb")
        self._err = open(self.folder / "stderr.log", "wb")
        environment = child_env(setup, **dict(env or {}))
        environment.update({DIR_ENV: str(self.folder), AT_ENV: at})
        self.proc = subprocess.Popen([*launcher, str(SCRIPT), *argv], env=environment, stdout=self._out,
                                     stderr=self._err, start_new_session=new_session)

    def __enter__(self) -> GatedRun:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            if self.new_session:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
            self.proc.wait()
        self._out.close()
        self._err.close()

    @property
    def stderr(self) -> str:
        """What the child wrote to stderr so far (a file: a pipe nobody reads could fill and block it)."""
        return (self.folder / "stderr.log").read_text(errors="replace")

    def wait_reached(self, ranks: Sequence[int] = (0,), timeout: float = 300) -> dict[int, int]:
        """Wait until every rank in `ranks` holds at the gate; returns their pids. Fails at once when the
        run ends first (with its stderr), and after `timeout` seconds only as a last resort."""
        paths = {r: self.folder / f"reached-{r}" for r in ranks}
        deadline = time.monotonic() + timeout
        while not all(p.exists() for p in paths.values()):
            code = self.proc.poll()
            assert code is None, f"the run ended (exit {code}) before it reached the gate:\n{self.stderr[-3000:]}"
            assert time.monotonic() < deadline, f"the run did not reach the gate in {timeout} s:\n{self.stderr[-3000:]}"
            time.sleep(POLL_SECONDS)
        return {r: int(p.read_text()) for r, p in paths.items()}

    def signal(self, sig: int, *, group: bool = False, rank: int | None = None) -> None:
        """`sig` to the child (the launcher), its process group, or the process of one rank."""
        if rank is not None:
            os.kill(self.wait_reached((rank,))[rank], sig)
        elif group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def kill(self, timeout: float = 120) -> int:
        """SIGKILL the child and wait for it; its exit status (-9)."""
        self.proc.kill()
        return self.wait(timeout)

    def release(self) -> None:
        """Open the gate: the held run goes on (and later calls of the hook do not hold)."""
        self.gate.unlink(missing_ok=True)

    def wait(self, timeout: float = 300) -> int:
        return self.proc.wait(timeout=timeout)

    def running(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self, rank: int = 0) -> int:
        """What `shiftlab.cli.main` returned in `rank` (a rank's own status, not the launcher's)."""
        return int((self.folder / f"exit-{rank}").read_text())


# -- the child ---------------------------------------------------------------------------------

def _install(folder: Path, at: str) -> None:
    from shiftlab.engine.loop import RunHooks

    hook, n = parse_at(at)
    rank = os.environ.get("RANK", "0")
    calls = [0]

    def hold(self, *args) -> None:
        calls[0] += 1
        if calls[0] != n:
            return
        tmp = folder / f".reached-{rank}"
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, folder / f"reached-{rank}")      # whole, never half-written, when the test reads it
        while (folder / "gate").exists():
            time.sleep(POLL_SECONDS)

    # the class, not an instance: the engine builds its default hooks itself, however the CLI imports it
    setattr(RunHooks, hook, hold)


def _main() -> int:
    setup = os.environ.get(SETUP_ENV)
    if setup:
        module, _, function = setup.partition(":")
        getattr(importlib.import_module(module), function)()
    at, folder = os.environ.get(AT_ENV), os.environ.get(DIR_ENV)
    if at:
        _install(Path(folder), at)
    from shiftlab.cli import main
    code = main(sys.argv[1:])
    if at:
        (Path(folder) / f"exit-{os.environ.get('RANK', '0')}").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(_main())
