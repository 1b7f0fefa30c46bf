"""What a `--resume` says and refuses before it computes anything (shiftlab.engine.loop calls these).

`say_resuming`: the one line on stderr, counting what the run directory holds (each method's samples where they
differ, shiftlab.engine.interrupt.count). `check_same_encoding`: a resume computes the missing records as the
first session computed the others, or is refused (docs/RUNS.md, "What is identical")."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..options import name_of, say
from ..results import summary as run_summary
from ..rundir import identity, records
from ..rundir.online_state import OnlineState
from . import interrupt
from .config import RunConfig


def records_left(names: Sequence[str], order: Sequence[int], settings: Sequence[str], done: set) -> bool:
    """Whether a record of `names` over `order` and `settings` is not in `done` (an error record counts)."""
    return any(records.is_missing(sid, n, s, done) for n in names for s in settings for sid in order)


def check_same_encoding(run_dir: Path, old: dict | None, config: RunConfig, order: Sequence[int],
                         settings: Sequence[str], done: set) -> None:
    """A resume computes the records still missing as the first session computed the others (issue 40 case 18).

    The image tower encodes a step's views together: every sample of the batch (--batch-size), and for each
    view recipe the views its methods need (zero-shot alone encodes view 0, beside TDA its 64 views). Another
    batch size or other methods beside a method change those shapes, which moves its records in the last float
    bits (about 1e-7; docs/RUNS.md). So a resume with another batch size is refused, and so is one with other
    methods (their variants aside, which share their recipe) while any of the directory's records is missing;
    methods are added to a finished run only."""
    if old is None or not done:
        return
    before = (old.get(run_summary.CONFIG) or {}).get("batch_size")
    if isinstance(before, int) and before != config.batch_size:
        raise identity.RunIdentityError(
            f"cannot resume {run_dir} with {name_of('batch_size')} {config.batch_size}: its records were made with "
            f"{before}, and a batch's views are encoded together, so records of another batch size differ in the "
            f"last float bits (docs/RUNS.md). Resume with {name_of('batch_size')} {before} or choose {say('out')}")
    earlier = list(old.get("methods") or {})
    unfinished = [n for n in earlier if records_left([n], order, settings, done)]

    def family(names: Sequence[str]) -> list[str]:
        return sorted({n.split("@", 1)[0] for n in names})
    if unfinished and family(config.methods) != family(earlier):
        raise identity.RunIdentityError(
            f"cannot resume {run_dir} with other methods ({', '.join(config.methods)}) while records of "
            f"{', '.join(unfinished)} are missing: they were computed beside {', '.join(family(earlier))}, and the "
            f"views of the methods run together are encoded together, so records computed beside others differ "
            f"in the last float bits (docs/RUNS.md). Finish it with {name_of('methods')} {','.join(earlier)}, "
            f"then add methods")


def say_resuming(run_dir: Path, resumed: identity.Resume, order: Sequence[int], methods: Sequence[str],
                  settings: Sequence[str], in_files: set, done: set, state: OnlineState | None) -> None:
    """One line on stderr: how much of the run was already done, and what this resume adds.

    A sample is done when every (method, setting) record it needs is in the records files and valid
    (`in_files`: the keys read after the quarantine); records restored from the online checkpoint
    (`done` has them too) are said apart, so the count never hides a deleted or damaged line."""
    counted = [n for n in methods if n not in resumed.added_methods]   # this run's methods the directory had
    scope = ""
    if not counted:   # only new methods (a sweep adding points): count what the directory's earlier ones hold
        earlier = [n for n in resumed.identity.get("methods", {}) if n not in resumed.added_methods]
        counted, scope = (earlier, " by its earlier method(s)") if earlier else (list(methods), "")
    before, per = interrupt.count(in_files, order, counted, settings)
    line = (f"shiftlab: resuming {run_dir}: {before} of {len(order)} samples already done{scope}"
            f"{interrupt.per_method_note(before, per, len(order))}")
    if state is not None and state.restored:
        line += f"; {state.restored} online record(s) restored from the last checkpoint"
        after = interrupt.count(done, order, counted, settings)[0]
        line += f" (now {after} of {len(order)})" if after != before else ""
    if resumed.added_methods:
        line += f"; adding method(s) {', '.join(resumed.added_methods)} (same samples and shared settings)"
    if resumed.limit_raised:
        old, new = resumed.limit_raised
        line += f"; extending {name_of('limit')} {old} -> {new or 'all samples'}"
    if state is not None and state.replayed:
        if any(n in state.methods for n in resumed.added_methods):
            line += "; the online methods replay the stream from its start (an added one has no state yet)"
        else:
            line += "; online records are missing before the last checkpoint, so the online methods replay the stream"
    print(line, file=sys.stderr, flush=True)
