"""What `shiftlab run` (and `encode`, `sweep`) check about the files a command line names, before torch is
imported: the class-names file, the run directory `--out` and the feature store `--features`. Each check
returns one line (or raises ValueError with it); nothing is written."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["read_classnames", "out_problem", "features_problem"]

# what a folder holds once shiftlab has run into it (a run directory, a suite directory): anything else in a
# non-empty --out is someone else's, and a run would overwrite its summary.json
_RUN_FILES = frozenset({"run.json", "records.jsonl", "shards", "suite.json", "run.lock"})


def read_classnames(path: str | Path) -> list[str]:
    """One class name per non-empty line of a UTF-8 file (a byte-order mark is dropped), each name once; a
    one-line ValueError for a file that is not UTF-8 text, lists no name or names a class twice."""
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = Path(path).read_bytes()[:exc.start].count(b"\n") + 1
        raise ValueError(f"--classnames {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}); "
                         "save it as UTF-8, one class name per line") from None
    except OSError as exc:
        raise ValueError(f"--classnames {path}: cannot be read ({exc.strerror or exc})") from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise ValueError(f"--classnames {path} lists no class name (one per line)")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(f"--classnames {path}: {name!r} is listed twice (lines {seen[name] + 1} and {i + 1} of "
                             "the names): two classes with one name get the same text features; name every class once")
        seen[name] = i
    return names


def _is_run_dir(folder: Path) -> bool:
    """Whether shiftlab has written into `folder`: a run's or suite's files, or a temporary only shiftlab names
    so (`writes.TMP_SUFFIX`: a write that failed before its file was in place)."""
    from ..writes import TMP_SUFFIX
    try:
        names = {p.name for p in folder.iterdir()}
    except OSError:
        return False
    return bool(names & _RUN_FILES) or any(name.endswith(TMP_SUFFIX) for name in names)


def out_problem(args: argparse.Namespace, entries: list[str] | None = None) -> str | None:
    """`--out` as `shiftlab run` would use it, or None: a non-empty folder that is no shiftlab run (or suite)
    directory is refused before anything in it is overwritten; one holding records without --resume is refused
    as the engine would refuse it, but now before the model is loaded. `entries`: a suite's, each run into
    OUT/<entry> (None: OUT is one run directory)."""
    out = Path(args.out).expanduser()
    if not out.is_dir() or os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        return None   # under torchrun the engine's collective check refuses records on every rank at once
    try:
        held_files = [p for p in out.iterdir() if not p.name.startswith(".")]
    except OSError as exc:
        return f"--out {out}: cannot be read ({exc.strerror or exc})"
    if not held_files:
        return None
    suite = entries is not None
    runs = [out / name for name in entries] if suite else [out]
    ours = _is_run_dir(out) or (suite and any(_is_run_dir(d) for d in entries_of(out)))
    if not ours:
        more = " and more" if len(held_files) > 1 else ""
        return (f"--out {out} is a non-empty folder that is not a shiftlab run directory (it holds no run.json or "
                f"records, but {held_files[0].name}{more}); a run would overwrite its files: choose a new or empty "
                "folder")
    if args.resume:
        return None
    held = [d for d in runs if (d / "records.jsonl").is_file() or (d / "shards").is_dir()]
    if held:
        return f"{held[0]} already holds records; pass --resume to continue it or choose another --out"
    return None


def entries_of(folder: Path) -> list[Path]:
    """The folders directly inside `folder` (a suite directory's entries, whichever suite wrote them)."""
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return []


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def features_problem(features: str | None, data: str, names: list[str]) -> str | None:
    """A feature store inside a folder a dataset is read from, or None: its files would be listed as the
    dataset's own (an unexpected class folder, images that are not the dataset's), and every later run on it
    refused. `names`: the datasets and OOD sets read from `data`."""
    if not features:
        return None
    from ..datasets.build import expand_root, locate
    store = Path(features).expanduser()
    for name in names:
        root = expand_root(data, name).expanduser()
        if not root.is_dir():
            continue
        folder = locate(name, root) or root
        if _inside(store, folder):
            return (f"--features {features} is inside {folder}, the folder {name} is read from: the store's files "
                    "would be read as part of the dataset; put the store outside it")
    return None
