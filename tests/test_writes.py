"""shiftlab.writes, the one module through which every file is written: atomic replacement, appends,
one error type whose message is one line (file, reason, what to do), orphaned temporaries cleaned;
and a scan of src/ so that no other module writes a file by itself. The regressions of issue 29's
finding 5 (a run directory turning read-only while the online state is saved; a full disk under the
feature store) are here too; tests/test_write_faults.py fails every call in turn."""
from __future__ import annotations

import ast
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _faults import FailingDisk, orphans
from _runs import comparable
from _synthetic import make_image_folder
from shiftlab import writes
from shiftlab.cli import main as cli_main
from shiftlab.rundir import probs as run_probs
from shiftlab.rundir import record_files

CLI_RESUME_ADVICE = "then rerun with --resume: the records written so far are kept"   # as the CLI says it (#34)

SRC = Path(__file__).resolve().parents[1] / "src" / "shiftlab"


# -- the module ----------------------------------------------------------------------------------

@pytest.mark.parametrize("err, reason, advice", [
    (errno.EROFS, "Read-only file system", "make the folder writable"),
    (errno.ENOSPC, "No space left on device", "free some space"),
    (errno.EACCES, "Permission denied", "make the folder writable"),
    (errno.EIO, "Input/output error", "check the disk"),
])
def test_a_failed_write_is_one_line_naming_file_reason_and_what_to_do(tmp_path, monkeypatch, err, reason, advice):
    def refuse(fd, data, path):
        raise OSError(err, os.strerror(err))   # a write() on a descriptor: the OS names no file
    monkeypatch.setattr(writes, "_write", refuse)
    with pytest.raises(writes.WriteError) as info:
        writes.write_file(tmp_path / "summary.json", "{}", then="then rerun")
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'summary.json'}: {reason} ({advice}") and text.endswith("; then rerun)")
    assert "\n" not in text and info.value.errno == err and info.value.filename == str(tmp_path / "summary.json")
    assert isinstance(info.value, OSError)


def test_a_file_replaced_whole_is_the_old_or_the_new_never_a_part(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    writes.write_file(path, "old")
    assert path.read_text() == "old" and not orphans(tmp_path)

    def half(fd, data, p):
        os.write(fd, bytes(data)[:2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(writes, "_write", half)
    with pytest.raises(writes.WriteError, match="No space left on device"):
        writes.write_file(path, "new contents")
    assert path.read_text() == "old" and not orphans(tmp_path)   # the temporary is removed with the failure
    monkeypatch.undo()
    writes.write_file(path, b"new")
    assert path.read_bytes() == b"new"
    monkeypatch.setattr(writes, "BLOCK", 4)
    writes.write_file(path, (f"line {k}\n" for k in range(3)))   # chunks: a large file is never held whole
    assert path.read_text() == "line 0\nline 1\nline 2\n"


def test_appends_reach_the_file_at_once_and_a_torn_tail_is_cut(tmp_path):
    path = tmp_path / "records.jsonl"
    fh = writes.AppendFile(path)
    fh.append('{"a": 1}\n')
    assert path.read_text() == '{"a": 1}\n'          # no buffer in the process: a kill keeps it
    fh.append(b'{"b": ')
    fh.cut(len('{"a": 1}\n'))
    fh.append('{"c": 3}\n')
    fh.sync()
    fh.close()
    assert path.read_text() == '{"a": 1}\n{"c": 3}\n'


def test_torch_save_errors_become_one_line(tmp_path):
    """torch.save writing a file itself raises RuntimeError, not OSError (issue 29, finding 5): guard()
    turns it into the one error type. shiftlab's own writes serialise into memory instead."""
    for where, err in (("/dev/full", errno.EIO), (str(tmp_path / "missing" / "state.pt"), errno.ENOENT)):
        with pytest.raises(writes.WriteError) as info:
            with writes.guard(where, then="then rerun with --resume"):
                torch.save({"x": torch.zeros(10_000)}, where)   # /dev/full: every write fails
        assert str(info.value).startswith(f"{where}: {os.strerror(err)} (") and "--resume" in str(info.value)
        assert info.value.errno == err
    read_only = RuntimeError("[enforce fail at inline_container.cc:747] . open file failed because of errno 30 on "
                             "fopen: Read-only file system, file path: x")
    assert writes.error("state.pt", read_only).errno == errno.EROFS
    with pytest.raises(ValueError), writes.guard(tmp_path / "state.pt"):
        raise ValueError("not a write")       # anything else passes through


def test_orphaned_temporaries_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = writes._HOST
        names = {"dead": f"a.bin~{host}~{dead.pid}{writes.TMP_SUFFIX}",
                 "live": f"b.bin~{host}~{live.pid}{writes.TMP_SUFFIX}",
                 "other_host": f"c.bin~elsewhere~{dead.pid}{writes.TMP_SUFFIX}",
                 "mine": f"d.bin~{host}~{os.getpid()}{writes.TMP_SUFFIX}",
                 "not_ours": "e.bin.tmp123"}
        for name in names.values():
            (tmp_path / name).write_bytes(b"x")
        assert writes.clean_orphans(tmp_path) == 2
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {names["live"], names["other_host"], names["not_ours"]}
    finally:
        live.kill()
        live.wait()


# -- every write goes through it -----------------------------------------------------------------

# (module, call): writes that deliberately do not go through shiftlab.writes, and why
ALLOWED = {
    ("shiftlab/datasets/extract.py", "extractall"): "a tar archive is extracted by tarfile (its 'data' filter "
                                                      "checks every member) into a staging folder published whole; "
                                                      "an OSError becomes a WriteError there",
    ("shiftlab/cli.py", "os.open"): "stdout pointed at /dev/null once its reader has gone (a broken pipe)",
    ("shiftlab/report/trackers.py", "save"): "--log: each tracker's own client (wandb, mlflow, tensorboard) "
                                             "writes its files; a failure there is the client's",
}
# method names that write or open for writing whatever object they are called on
WRITING_METHODS = {"write_text", "write_bytes", "extractall", "mkdir", "rmdir", "unlink", "truncate", "touch",
                   "symlink_to", "hardlink_to", "to_csv", "to_parquet", "savefig"}
# module functions that write
WRITING_FUNCTIONS = {"os": {"open", "write", "pwrite", "replace", "rename", "renames", "remove", "unlink", "mkdir",
                            "makedirs", "rmdir", "ftruncate", "truncate", "fsync", "link", "symlink"},
                     "shutil": {"copy", "copy2", "copyfile", "copyfileobj", "copytree", "move"},
                     "tempfile": {"mkstemp", "NamedTemporaryFile", "TemporaryFile"},
                     "json": {"dump"}, "np": {"save", "savez"}, "numpy": {"save", "savez"}, "torch": {"save"}}
IN_MEMORY = {"buf", "buffer"}   # serialising into these is not a write: the bytes go through shiftlab.writes


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _write_calls(path: Path) -> list[tuple[int, str]]:
    """(line, call) of every call in a module that writes a file or opens one for writing."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func, args = node.func, node.args
        name = _name(func)
        owner = _name(func.value) if isinstance(func, ast.Attribute) else ""
        if owner in WRITING_FUNCTIONS and name in WRITING_FUNCTIONS[owner]:
            target = args[1] if (owner, name) in (("torch", "save"), ("json", "dump")) and len(args) > 1 else \
                args[0] if args else None
            if not (isinstance(target, ast.Name) and target.id in IN_MEMORY):
                found.append((node.lineno, f"{owner}.{name}"))
        elif name == "open" and owner in ("", "path") or (name == "open" and isinstance(func, ast.Attribute)
                                                            and owner not in ("tarfile", "zf", "Image", "zipfile")):
            mode = args[1] if name == "open" and owner == "" and len(args) > 1 else \
                args[0] if owner and args else next((k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                found.append((node.lineno, "open"))
        elif name in ("replace", "rename") and isinstance(func, ast.Attribute) and len(args) == 1 \
                and owner not in ("dataclasses", "os"):
            found.append((node.lineno, name))   # Path.replace(target) (str.replace takes two)
        elif name in WRITING_METHODS and isinstance(func, ast.Attribute):
            target = args[0] if args else None
            if not (name == "savefig" and isinstance(target, ast.Name) and target.id in IN_MEMORY):
                found.append((node.lineno, name))
        elif name == "save" and isinstance(func, ast.Attribute) and owner not in {*WRITING_FUNCTIONS, "self"} and args:
            if not (isinstance(args[0], ast.Name) and args[0].id in IN_MEMORY):   # PIL's image.save(path)
                found.append((node.lineno, "save"))
    return found


def test_no_module_writes_a_file_but_through_shiftlab_writes():
    offenders, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC.parent))
        if rel == "shiftlab/writes.py":
            continue
        for line, call in _write_calls(path):
            if (rel, call) in ALLOWED:
                used.add((rel, call))
            else:
                offenders.append(f"{rel}:{line}: {call}(...)")
    assert not offenders, ("write through shiftlab.writes (write_file, AppendFile, make_dirs, remove, rename, "
                           "LockFile), or add the site to ALLOWED with the reason: " + "; ".join(offenders))
    listed = {site for site in ALLOWED if (SRC.parent / site[0]).is_file()}   # a removed module needs no entry
    assert used == listed, f"ALLOWED lists sites that no longer write: {listed - used}"


def test_the_scan_finds_writes():
    """The scan above is not vacuous: each way of writing a file is found in a module that does it."""
    sample = SRC.parent.parent / "tests" / "fixtures" / "write_sites_sample.py"
    found = {call for _, call in _write_calls(sample)}
    assert found == {"open", "write_text", "write_bytes", "save", "savefig", "os.replace", "mkdir", "unlink",
                     "shutil.copyfile", "json.dump", "os.fsync", "truncate", "torch.save", "os.open", "extractall",
                     "replace"}


def test_the_architecture_page_lists_the_write_sites():
    text = (SRC.parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Writing files"):]
    for name in ("records.jsonl", "probs/", "online_state.pt", "run.json", "run.lock", "summary.json", "suite.md",
                 "sweep.json", "report.html", "feature store", "head cache", "WriteError", "clean_orphans"):
        assert name in section, name


# -- issue 29, finding 5 ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pets(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data") / "pets", ["cat", "dog"], per_class=2, size=(40, 32))


def _argv(pets: Path, ckpt: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--data", str(pets), "--dataset", "imagefolder", "--model", "shiftlab-tiny", "--pretrained",
            str(ckpt), "--views", "2", "--workers", "0", "--device", "cpu", "--batch-size", "1", "--no-progress",
            "--methods", "zeroshot,tda", "--set", "tda.text_head=zeroshot", "--save-probs",
            "--online-checkpoint-seconds", "0", "--out", str(out), *extra]


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC])
def test_run_dir_turning_read_only_while_saving_online_state_is_one_line_and_resumes(pets, tiny_checkpoint, tmp_path,
                                                                                    monkeypatch, capsys, err):
    """Issue 29, finding 5: the online state's save ended in a traceback (torch.save's RuntimeError)."""
    assert cli_main(_argv(pets, tiny_checkpoint, tmp_path / "whole")) == 0
    capsys.readouterr()
    disk = FailingDisk(monkeypatch)
    disk.arm(2, err, on="online_state.pt")     # the second checkpoint: records and a state on disk already
    code = cli_main(_argv(pets, tiny_checkpoint, tmp_path / "run"))
    disk.disarm()
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err
    assert captured.err.splitlines() == [f"shiftlab run: error: {tmp_path / 'run' / 'online_state.pt'}: "
                                         f"{os.strerror(err)} ({writes.what_to_do(err, CLI_RESUME_ADVICE)})"]
    assert cli_main(_argv(pets, tiny_checkpoint, tmp_path / "run", "--resume")) == 0
    runs = [tmp_path / "whole", tmp_path / "run"]
    assert comparable(record_files.load_records(runs[0])) == comparable(record_files.load_records(runs[1]))
    vectors = [{k: v.tobytes() for k, v in run_probs.load_probs(r).items()} for r in runs]
    assert vectors[0] == vectors[1] and len(vectors[0]) == 8
    assert not orphans(tmp_path / "run")


def test_a_full_disk_under_the_feature_store_says_so_and_leaves_no_temporaries(pets, tiny_checkpoint, tmp_path,
                                                                               monkeypatch, capsys):
    """Issue 29, finding 5: a full disk under the store left `*.bin.tmp<pid>` files forever, and its message
    named no file and gave run-directory advice."""
    store = tmp_path / "fs"
    disk = FailingDisk(monkeypatch)
    disk.arm(2, errno.ENOSPC, on=".bin")       # its write: the temporary exists
    real_unlink = writes._unlink

    def stuck(path):   # the disk is full and the temporary cannot even be removed now
        if ".bin" in path:
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real_unlink(path)
    monkeypatch.setattr(writes, "_unlink", stuck)
    code = cli_main(_argv(pets, tiny_checkpoint, tmp_path / "run", "--features", str(store)))
    disk.disarm()
    monkeypatch.setattr(writes, "_unlink", real_unlink)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 1 and "Traceback" not in captured.err and len(lines) == 1, captured.err
    op, path = disk.failure
    shard = path.split("~")[0]
    assert shard.endswith(".bin") and Path(shard).parent.parent == store
    assert lines[0] == (f"shiftlab run: error: {shard}: No space left on device (free some space; the run's records "
                        "are safe; the feature store can be deleted, or the run continued without --features)")
    assert [p.name.split("~")[0] for p in orphans(store)] == [Path(shard).name]   # left by the failure...
    assert cli_main(_argv(pets, tiny_checkpoint, tmp_path / "run", "--features", str(store), "--resume")) == 0
    assert not orphans(store) and not orphans(tmp_path / "run")             # ...and cleaned on the next open
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["methods"]["tda"]["n"] == 4
