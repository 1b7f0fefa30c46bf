"""`shiftlab` command line: one module per subcommand under `shiftlab.commands`.

A user mistake ends in one line on stderr and exit code 2 (bad flags, refused while parsing, before
any work: see commands/checks.py) or 1 (the environment: missing data or weights, disk full,
read-only or vanished paths), never in a traceback. SIGINT and SIGTERM end in one line too ("interrupted
after N of M samples; continue with --resume", from rank 0 only under torchrun) and exit code 130 / 143
(shiftlab.engine.interrupt)."""
from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import importlib
import logging
import os
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

from . import commands, writes
from .commands import config_file
from .engine import interrupt
from .options import speaking_cli


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest of `known` (difflib, as argparse's `suggest_on_error` of
    Python 3.14), or ''."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its usage block replaced by a pointer to --help: an error is one line; an unknown
    flag, subcommand or choice gets the closest known one. A value that starts like a negative number
    ('--eps -1/255') is the flag's value, refused by its range check, never taken for a flag (as Python 3.13's
    argparse reads it; 3.11 took only '-1' and '-0.5' for numbers)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, with a suggestion for each unknown flag among the flags of the (sub)command that met it."""
        parsed, extras = super().parse_known_args(args, namespace)
        unknown = [e for e in extras if e.startswith("-")]
        if unknown and self._subparsers is not None and getattr(parsed, "command", None):
            chosen = self._subparsers._group_actions[0].choices.get(parsed.command)
            flags = [f for action in chosen._actions for f in action.option_strings] if chosen else []
            hints = [f"{flag.split('=')[0]}{did_you_mean(flag.split('=')[0], flags)}" for flag in unknown]
            if any("did you mean" in h for h in hints):
                chosen.error(f"unrecognized arguments: {', '.join(hints)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="shiftlab", description=(
        "Test-time adaptation of CLIP models under distribution shift: accuracy, robust accuracy and "
        "calibration of TPT, C-TPT, R-TPT, MTA, ZERO, TDA, ... in one run."))
    from .version import __version__
    parser.add_argument("--version", action="version", version=f"shiftlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "add_parser"):
            module.add_parser(sub)
    return parser


def describe_os_error(exc: OSError) -> str:
    """'No space left on device: runs/x/records.jsonl' and what to do about it."""
    where = f": {exc.filename}" if exc.filename else ""
    text = f"{exc.strerror or exc}{where}"
    if exc.errno == errno.ENOSPC:
        text += " (free some space, then rerun with --resume: the records written so far are kept)"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        text += " (choose a writable folder)"
    return text


class _WarningLine(logging.Handler):
    """A record logged by shiftlab as the command's other warnings: '<command>: warning: <message>', one line."""

    def __init__(self, command: Callable[[], str]):
        super().__init__(logging.WARNING)
        self.command = command

    def emit(self, record: logging.LogRecord) -> None:
        message = " ".join(record.getMessage().split())
        print(f"{self.command()}: {record.levelname.lower()}: {message}", file=sys.stderr)


@contextlib.contextmanager
def shiftlab_log_as_lines(command: Callable[[], str]) -> Iterator[None]:
    """Within: what shiftlab logs (`logging.getLogger(__name__).warning`) is said by `_WarningLine`, never by the
    root logger, whose format is Python's default one ('WARNING:shiftlab.engine.config:...') once a library
    has called `logging.info` (open_clip does: it installs `logging.basicConfig`)."""
    logger = logging.getLogger(__package__)
    handler, propagate = _WarningLine(command), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def main(argv: list[str] | None = None) -> int:
    command = "shiftlab"
    with interrupt.handling_signals(), speaking_cli(), shiftlab_log_as_lines(lambda: command):
        try:
            parser = build_parser()
            try:   # --config FILE: the file's flags go before the typed ones (commands/config_file.py)
                argv, config_record = config_file.expand(parser, sys.argv[1:] if argv is None else list(argv))
            except config_file.ConfigFileError as exc:
                print(f"{command}: error: {exc}", file=sys.stderr)
                return 2
            args = parser.parse_args(argv)
            args.config_file = config_record
            command = f"shiftlab {args.command}"
            return int(args.func(args) or 0)
        except BrokenPipeError:   # `shiftlab datasets | head`: the reader has gone, nothing is wrong
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except writes.WriteError as exc:   # every file shiftlab writes: one line naming it, why, what to do
            print(f"{command}: error: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:   # disk full, read-only or vanished paths: the machine, not a bug to trace
            print(f"{command}: error: {describe_os_error(exc)}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as exc:   # SIGINT / SIGTERM: the records written so far are complete
            if os.environ.get("RANK", "0") == "0":
                print(f"{command}: {interrupt.message(exc)}", file=sys.stderr, flush=True)
            return interrupt.exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
