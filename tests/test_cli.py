"""The command line refuses every user mistake with one line (flag + what it accepts), before any work,
and never shows a traceback for the user's or the machine's problems: a traceback tells the user
nothing they can act on and hides the one line that does."""
from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
import torch

import shiftlab
from _synthetic import make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.methods.catalogue import listing as catalogue
from shiftlab.rundir import record_files


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    # every class present (a dataset with empty classes is refused), one small image each
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(200), per_class=1, size=(32, 24))


def run_argv(data: Path, ckpt: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(ckpt), "--views", "4",
            "--workers", "0", "--device", "cpu", "--methods", "zeroshot", "--limit", "3", "--out", str(out), *extra]


def one_line_error(capsys, code: int, *fragments: str) -> str:
    """The stderr of a command that exited with `code`: one line holding every fragment, no traceback."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert code in (1, 2)
    return lines[0]


@pytest.mark.parametrize("flags, fragments", [
    (["--views", "0"], ["--views", "between 1 and 1024, got 0"]),
    (["--views", "-1"], ["--views", "between 1 and 1024, got -1"]),
    (["--views", "100000"], ["--views", "between 1 and 1024, got 100000"]),
    (["--views", "many"], ["--views", "expected an integer"]),
    (["--limit", "-5"], ["--limit", "at least 1, got -5"]),
    (["--limit", "0"], ["--limit", "at least 1, got 0"]),
    (["--batch-size", "0"], ["--batch-size", "at least 1"]),
    (["--methods", ","], ["--methods", "names no method", "zeroshot"]),
    (["--methods", "tpt,nosuch"], ["--methods", "unknown method nosuch; registered:"]),
    # the names as the README and the papers spell them: the registered name is suggested (no suggestion before)
    (["--methods", "TPT"], ["--methods", "unknown method TPT (did you mean tpt?)"]),
    (["--methods", "zeroshot,C-TPT,DMN-ZS"], ["--methods", "unknown method C-TPT (did you mean ctpt?), DMN-ZS (did "
                                              "you mean dmn_zs?)"]),
    (["--set", "nosuch.lr=1"], ["--set", "unknown method nosuch"]),
    (["--set", "tpt.lr=abc"], ["--set", "tpt.lr: 'abc' is not a float; must be a finite float >= 0"]),
    (["--set", "tpt.steps=1.5"], ["--set", "tpt.steps: 1.5 is not an integer; must be an integer >= 0"]),
    # ranges (shiftlab.params), the same check as create_method's
    (["--set", "tpt.lr=1e400"], ["--set", "tpt.lr: 1e400 is not finite; must be a finite float >= 0"]),
    (["--set", "tpt.lr=-1"], ["--set", "tpt.lr: -1 is out of range; must be a finite float >= 0"]),
    (["--set", "tpt.steps=-3"], ["--set", "tpt.steps: -3 is out of range; must be an integer >= 0"]),
    (["--set", "tpt.steps=True"], ["--set", "tpt.steps: True is not an integer"]),
    (["--set", "tpt.selection_ratio=5"], ["--set", "tpt.selection_ratio: 5 is out of range",
                                          "must be a finite float in (0, 1]"]),
    (["--set", "tda.entropy_norm=log10"], ["--set", "tda.entropy_norm: 'log10' is not a choice; "
                                           "must be one of 'log2', 'ln'"]),
    (["--set", "zero.vote_rule=hard"], ["--set", "zero.vote_rule: 'hard' is not a choice", "'soft', 'authors'"]),
    (["--set", "tpt.share_prefix=yes"], ["--set", "tpt.share_prefix: 'yes' is not True or False"]),
    (["--set", "mta.neighbour_ratio=nan"], ["--set", "mta.neighbour_ratio: 'nan' is not a float"]),
    (["--set", "tda.pos_capacity=1.0"], ["--set", "tda.pos_capacity: 1.0 is not an integer; must be an integer >= 0"]),
    (["--set", "dmn_zs.memory_size=0"], ["--set", "dmn_zs.memory_size: 0 is out of range; must be an integer >= 1"]),
    (["--set", "tpt.lr"], ["--set", "expected METHOD.FIELD=VALUE"]),
    (["--set", "tpt.nosuch=1"], ["--set", "tpt has no setting nosuch", "lr"]),
    (["--set", "tpt.views=many"], ["--set", "tpt.views must be a view count or a dict", "got 'many'"]),
    (["--set", "tpt.views={'n_view': 8}"], ["--set", "tpt.views: unknown recipe field(s) ['n_view']"]),
    (["--eps", "2"], ["--eps", "between 0 and 1", "got 2"]),
    (["--eps=-1/255"], ["--eps", "between 0 and 1"]),
    # a negative fraction after a space was taken for a flag: "argument --eps: expected one argument"
    (["--attack", "pgd", "--eps", "-1/255"], ["--eps", "between 0 and 1", "got -1/255"]),
    (["--attack", "pgd", "--alpha", "-2/255"], ["--alpha", "between 0 and 1", "got -2/255"]),
    (["--attack", "fgsm"], ["--attack", "unknown attack 'fgsm'", "pgd"]),
    (["--device", "tpu"], ["--device", "unknown device 'tpu'", "cuda:N"]),
    (["--online-checkpoint-seconds", "-1"], ["--online-checkpoint-seconds", "0 or more"]),
    # a seed seeds numpy's and torch's generators: below 0 every sample was an error record, at 2**64 a traceback
    (["--seed", "-1"], ["--seed", "between 0 and 18446744073709551615, got -1"]),
    (["--seed", str(2 ** 64)], ["--seed", "between 0 and 18446744073709551615"]),
    # a feature store that is a file: the run started, then "FILE: File exists (the run's records are safe; ...)"
    (["--features", __file__], ["--features", f"{__file__} is a file, not a folder"]),
])
def test_bad_values_are_refused_before_any_work(tmp_path, capsys, flags, fragments):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(run_argv(tmp_path / "no-data", tmp_path / "no.pt", out, *flags))
    line = one_line_error(capsys, exit_info.value.code, *fragments)
    assert exit_info.value.code == 2 and line.startswith("shiftlab run: error: argument ")
    assert "\"" not in line        # no KeyError repr around the message
    assert not out.exists()        # nothing created: a bad --set or --attack leaves no empty run folder


@pytest.mark.parametrize("flags, fragments", [
    # MTA's bandwidths need int(0.3 * (N - 1)) >= 1 neighbours: N >= 5 (today 4 views made every record an error)
    (["--methods", "zeroshot,mta", "--views", "4"], ["mta: needs at least 5 views (incl. the original), got 4",
                                                     "--set mta.views=5"]),
    (["--methods", "mta", "--set", "mta.views=3"], ["mta: needs at least 5 views", "got 3"]),
    (["--methods", "mta", "--views", "8", "--set", "mta.neighbour_ratio=0.1"], ["mta: needs at least 11 views"]),
    (["--methods", "rtpt", "--views", "1"], ["rtpt: needs at least 2 views (incl. the original), got 1"]),
    (["--methods", "all", "--views", "2"], ["mta: needs at least 5 views"]),
    (["--methods", "tpt", "--set", "tpt.precision=fp16-pure"], ["tpt.precision: 'fp16-pure'", "tda, ",
                                                                 "only; use fp16 (autocast) or fp32"]),
    (["--suite", "cross-dataset", "--methods", "mta", "--views", "2"], ["mta: needs at least 5 views"]),
])
def test_a_method_config_the_run_cannot_use_is_refused_before_any_work(tmp_path, capsys, flags, fragments):
    out = tmp_path / "run"
    code = cli_main(run_argv(tmp_path / "no-data", tmp_path / "no.pt", out, *flags))
    line = one_line_error(capsys, code, *fragments)
    assert code == 2 and line.startswith("shiftlab run: error: ")
    assert "no-data" not in line and "no.pt" not in line   # refused before the data and the weights are looked at
    assert not out.exists()


@pytest.mark.parametrize("flags", [
    ["--methods", "mta", "--views", "5"],
    ["--methods", "mta", "--views", "4", "--set", "mta.views=8"],         # --set has the last word
    ["--methods", "mta", "--views", "4", "--set", "mta.neighbour_ratio=1.0"],   # one neighbour from N = 2
    ["--methods", "zeroshot,tpt,zero,tda,dmn_zs,view_ensemble", "--views", "1"],
])
def test_enough_views_pass_the_view_check(tmp_path, capsys, flags):
    code = cli_main(run_argv(tmp_path / "no-data", tmp_path / "no.pt", tmp_path / "run", *flags))
    err = capsys.readouterr().err
    assert code == 1 and "dataset imagenet-r: imagenet-r root does not exist" in err   # as far as the data
    assert "needs at least" not in err


def test_missing_required_flag_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["run", "--data", "x"])
    one_line_error(capsys, exit_info.value.code, "required", "--out", "shiftlab run --help")


def test_cuda_without_a_gpu_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for device in ("cuda", "cuda:0"):
        with pytest.raises(SystemExit) as exit_info:
            cli_main(run_argv(tmp_path, tmp_path / "no.pt", tmp_path / "run", "--device", device))
        one_line_error(capsys, exit_info.value.code, "--device", "no CUDA GPU")


def test_a_gpu_index_beyond_the_machine_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(run_argv(tmp_path, tmp_path / "no.pt", tmp_path / "run", "--device", "cuda:2"))
    one_line_error(capsys, exit_info.value.code, "--device", "2 visible GPU(s), cuda:0 to cuda:1")


def test_device_help_documents_picking_a_gpu(capsys):
    with pytest.raises(SystemExit):
        cli_main(["run", "--help"])
    assert "cuda:N" in " ".join(capsys.readouterr().out.split())


def test_missing_classnames_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(run_argv(tmp_path, tmp_path / "no.pt", tmp_path / "run", "--dataset", "imagefolder",
                          "--classnames", str(tmp_path / "names.txt")))
    one_line_error(capsys, exit_info.value.code, "--classnames", "names.txt: no such file")


def test_out_under_a_regular_file(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(SystemExit) as exit_info:
            cli_main(run_argv(tmp_path, tmp_path / "no.pt", out))
        one_line_error(capsys, exit_info.value.code, "--out", "not a directory")


def test_read_only_out_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == parent else real_access(p, mode))
    with pytest.raises(SystemExit) as exit_info:
        cli_main(run_argv(tmp_path, tmp_path / "no.pt", parent / "run"))
    one_line_error(capsys, exit_info.value.code, "--out", "is not writable")
    assert not (parent / "run").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 555 folder")
def test_read_only_out_folder_by_permissions(tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli_main(run_argv(tmp_path, tmp_path / "no.pt", parent / "run"))
        one_line_error(capsys, exit_info.value.code, "--out", "is not writable")
    finally:
        parent.chmod(0o755)


def test_bad_checkpoint_is_one_line(data, tmp_path, capsys):
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(b"not a checkpoint at all" * 10)
    code = cli_main(run_argv(data, bad, tmp_path / "run"))
    assert code == 1
    one_line_error(capsys, code, "shiftlab run: error: model:")
    assert not (tmp_path / "run").exists()


def test_online_methods_with_clean_and_robust_run_each_setting(data, tmp_path, capsys, tiny_checkpoint):
    """An online method in a clean-and-robust run is no longer refused: it runs with one state per setting
    (tests/test_online.py checks those records against one run per setting)."""
    out = tmp_path / "run"
    code = cli_main(run_argv(data, tiny_checkpoint, out, "--methods", "zeroshot,tda", "--attack", "pgd",
                             "--set", "attack.steps=1", "--clean-and-robust", "--no-progress"))
    assert code == 0, capsys.readouterr().err
    recs = record_files.load_records(out)
    assert sorted((r["method"], r["setting"]) for r in recs if "error" not in r) == sorted(
        (m, s) for m in ("tda", "zeroshot") for s in ("clean", "pgd") for _ in range(3))


def test_failed_download_leaves_no_data_folder(data, tmp_path, capsys, monkeypatch, tiny_checkpoint):
    # `make run` offline: the default data folder must not be created by a download that failed
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")
    monkeypatch.setattr("urllib.request.urlopen", offline)
    root = tmp_path / "cache" / "shiftlab" / "data"
    code = cli_main(["run", "--data", str(root), "--download", "--model", "shiftlab-tiny", "--pretrained",
                     str(tiny_checkpoint), "--device", "cpu", "--out", str(tmp_path / "run")])
    assert code == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 2 and "Traceback" not in captured.err, captured.err
    assert err[0].startswith("shiftlab run: error: dataset imagenet-r:") and "no network" in err[0]
    # every problem at once: --methods all includes RLCF, whose reward model (OpenAI's ViT-L/14) is not cached either
    assert err[1].startswith("shiftlab run: error: rlcf: its model ViT-L-14 (openai): no internet connection")
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_disk_full_is_one_line_and_keeps_the_records(data, tmp_path, capsys, monkeypatch, tiny_checkpoint):
    out = tmp_path / "run"
    calls = []

    def write(self, records):
        calls.append(len(records))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
    monkeypatch.setattr(record_files.RecordWriter, "write", write)
    code = cli_main(run_argv(data, tiny_checkpoint, out, "--no-progress"))
    assert code == 1 and calls
    one_line_error(capsys, code, "No space left on device", "records.jsonl", "--resume")


def test_a_write_refused_while_running_is_one_line(data, tmp_path, capsys, monkeypatch, tiny_checkpoint):
    def refuse(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
    monkeypatch.setattr(Path, "mkdir", refuse)
    code = cli_main(run_argv(data, tiny_checkpoint, tmp_path / "run"))
    assert code == 1
    one_line_error(capsys, code, "Read-only file system", "run")


@pytest.mark.slow
def test_no_progress_still_prints_the_results_table(data, tmp_path, capsys, tiny_checkpoint):
    out = tmp_path / "run"
    assert cli_main(run_argv(data, tiny_checkpoint, out, "--no-progress")) == 0
    printed = capsys.readouterr().out
    assert (out / "summary.md").read_text() in printed and "| zeroshot |" in printed


def test_report_without_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    code = cli_main(["report", str(tmp_path), "--out", str(tmp_path / "report")])
    assert code == 1
    one_line_error(capsys, code, "matplotlib", "pip install 'shiftlab[report]'")
    assert not (tmp_path / "report").exists()


@pytest.mark.slow
def test_entry_point_shows_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "shiftlab", "run", "--data", str(tmp_path), "--out",
                           str(tmp_path / "run"), "--set", "tpt.lr=abc"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "tpt.lr" in proc.stderr


def test_import_and_help_load_no_heavy_library():
    # `import shiftlab` and building the whole CLI parser (what `shiftlab --help` does) stay light:
    # torch, open_clip, torchvision and matplotlib load only when a command or a library call needs them
    code = ("import sys, shiftlab, shiftlab.cli; shiftlab.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'open_clip', 'torchvision', 'matplotlib') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


HEAVY = ("torch", "open_clip", "torchvision", "matplotlib", "numpy")
# each command in a fresh process; the exit code, then the heavy modules it imported
COMMAND_IN_A_FRESH_PROCESS = f"""
import json, sys
from shiftlab.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
print(code, sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
"""


RUN = ["run", "--data", "DIR", "--out", "DIR/run"]


@pytest.mark.parametrize("argv, code, says", [
    (["methods"], 0, ""),
    (["methods", "--json"], 0, ""),
    (RUN + ["--set", "tpt.lr=abc"], 2, "argument --set: tpt.lr: 'abc' is not a float; must be a finite float >= 0"),
    (RUN + ["--set", "tpt.views=0"], 2, "tpt.views: n_views must be an integer >= 1, got 0"),
    (RUN + ["--set", "rtpt.self_mask=diag"], 2, "rtpt.self_mask: 'diag' is not a choice"),
    (RUN + ["--set", "nope.lr=1"], 2, "unknown method nope"),
    (RUN + ["--set", "tpt.nosuch=1"], 2, "tpt has no setting nosuch"),
    (RUN + ["--methods", "tpt,nope"], 2, "argument --methods: unknown method nope"),
    (RUN + ["--views", "0"], 2, "argument --views: must be between 1"),
    (RUN + ["--attack", "fgsm"], 2,
     "argument --attack: unknown attack 'fgsm'; choose from: none, apgd_ce, apgd_t, autoattack, fab_t, pgd, square"),
    (RUN + ["--attack", "pgd", "--set", "attack.eps=2"], 2,
     "--set attack.eps=2: pgd.eps: 2 is out of range; must be a finite float in [0, 1]"),
    (RUN + ["--set", "attack.steps=3", "--attack", "pgd", "--quantize", "ceil"], 2,
     "--quantize: pgd.quantize: 'ceil' is not a choice"),
    (RUN + ["--attack", "pgd", "--set", "attack.magnitude=1"], 2, "attack pgd has no field magnitude"),
    (RUN + ["--steps", "3"], 2, "--steps sets a field of the attack, but no attack is chosen"),
    (RUN + ["--precision", "x"], 2, "argument --precision: invalid choice: 'x'"),
    (["run", "--device", "cpu", "--set", "tpt.lr=0.01"], 2, "the following arguments are required: --data, --out"),
    # the dataset registry imports neither numpy nor PIL (its loaders do): said before the model is loaded
    (RUN + ["--dataset", "imagenet-rr"], 2, "dataset imagenet-rr: unknown dataset 'imagenet-rr' (did you mean"),
    (RUN + ["--datasets", "imagenet-r,sketchy"], 2, "dataset sketchy: unknown dataset 'sketchy'"),
])
def test_listing_methods_and_refusing_a_flag_import_nothing_heavy(tmp_path, argv, code, says):
    # the robust form of "under a second": importing torch and open_clip alone takes seconds
    argv = [a.replace("DIR", str(tmp_path)) for a in argv]
    proc = subprocess.run([sys.executable, "-c", COMMAND_IN_A_FRESH_PROCESS, json.dumps(argv)],
                          capture_output=True, text=True, timeout=120)
    *message, verdict = proc.stderr.strip().splitlines()
    assert verdict == f"{code} []", proc.stderr
    if says:
        assert len(message) == 1 and says in message[0], message
    else:   # every method listed by its whole name (a substring would take "ctpt" for "tpt")
        assert not message
        if "--json" in argv:
            assert [r["name"] for r in json.loads(proc.stdout)] == shiftlab.list_methods()
        else:   # by block (single-image, then the transductive ones: docs/PROTOCOLS.md), each by name
            listed = re.findall(r"^(\S+) +(?:episodic|online) ", proc.stdout, flags=re.MULTILINE)
            assert listed == [n for b in catalogue.BLOCKS for n in shiftlab.list_methods() if catalogue.block(n) == b]
    assert not (tmp_path / "run").exists()


def test_lazy_package_attributes():
    import shiftlab
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.loop import run
    from shiftlab.models import load_model
    from shiftlab.views.generator import ViewGenerator
    assert shiftlab.load_model is load_model and "load_model" in dir(shiftlab)
    assert set(shiftlab.__all__) <= set(dir(shiftlab))
    # what a library user needs is one attribute away: every public name resolves
    assert (shiftlab.RunConfig, shiftlab.run, shiftlab.ViewGenerator) == (RunConfig, run, ViewGenerator)
    for name in shiftlab.__all__:
        assert getattr(shiftlab, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        shiftlab.nosuch  # noqa: B018


def test_version_flag_prints_the_package_version():
    import shiftlab
    proc = subprocess.run([sys.executable, "-m", "shiftlab", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"shiftlab {shiftlab.__version__}"


@pytest.mark.parametrize("dataset, hint", [
    ("imagenet-r", "run `shiftlab download imagenet-r --root"),
    ("imagenet", "cannot be downloaded automatically"),
    ("imagenet-sketch", "cannot be downloaded automatically"),
])
def test_missing_dataset_hints_the_download_only_where_it_can_help(tmp_path, capsys, tiny_checkpoint, dataset, hint):
    code = cli_main(["run", "--dataset", dataset, "--data", str(tmp_path / "nothing"), "--model", "shiftlab-tiny",
                     "--pretrained", str(tiny_checkpoint), "--device", "cpu", "--out", str(tmp_path / "run"),
                     "--methods", "zeroshot"])   # (all methods: RLCF's reward model would be a second problem)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and hint in err
    assert ("shiftlab download" in err) == (dataset == "imagenet-r")


def test_class_names_that_do_not_fit_the_dataset_get_no_download_advice(data, tmp_path, capsys, tiny_checkpoint):
    """A --classnames file of 2 names for ImageNet-R's 200 classes was answered "-> run `shiftlab download ...`"."""
    names = tmp_path / "names.txt"
    names.write_text("cat\ndog\n")
    code = cli_main(run_argv(data, tiny_checkpoint, tmp_path / "run", "--classnames", str(names)))
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "got 2 class names for 200 classes" in err
    assert "download" not in err


def test_datasets_command_lists_names_layouts_downloads_and_what_is_found(tmp_path, capsys):
    (tmp_path / "oxford_flowers").mkdir()
    (tmp_path / "imagenet-rendition" / "imagenet-r").mkdir(parents=True)
    assert cli_main(["datasets", "--data", str(tmp_path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    from shiftlab.datasets import list_datasets
    assert set(rows) == set(list_datasets())
    assert rows["flowers102"]["found"] == str(tmp_path / "oxford_flowers")
    assert "flowers" in rows["flowers102"]["aliases"]
    assert rows["imagenet-r"]["found"] == str(tmp_path / "imagenet-rendition" / "imagenet-r")
    assert rows["imagenet-a"]["found"] is None
    assert rows["imagenet-r"]["download"] == "shiftlab download" and rows["imagenet"]["download"].startswith("by hand")
    assert cli_main(["datasets"]) == 0
    assert "imagenet-r" in capsys.readouterr().out


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_datasets_with_a_data_root_that_is_not_there_says_so(tmp_path, capsys, json_flag):
    """A misspelt --data listed every dataset as "found: no" and exited 0: nothing said the root was missing."""
    missing = tmp_path / "nope"
    assert cli_main(["datasets", "--data", str(missing), *json_flag]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"shiftlab datasets: error: --data {missing}: no such folder\n"


def test_a_closed_pipe_is_not_an_error():
    # `shiftlab datasets | head -1`: head leaves early; no "error: Broken pipe" line
    proc = subprocess.run(f"{sys.executable} -m shiftlab datasets | head -1", shell=True, capture_output=True,
                          text=True)
    assert proc.stdout.startswith("caltech101") and "error" not in proc.stderr


def test_shiftlabs_logged_warnings_are_said_as_the_cli_says_its_warnings(tmp_path, capsys, monkeypatch):
    """A new user saw `WARNING:shiftlab.engine.config:methods 'all' on ... leaves out ...`: open_clip's
    `logging.info` installs Python's default logging set-up (logging.basicConfig), whose format printed it."""
    import logging
    default = logging.StreamHandler(sys.stderr)   # what logging.basicConfig installs on the root logger
    default.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    logging.getLogger().addHandler(default)
    monkeypatch.setattr("shiftlab.engine.loop.run", lambda cfg, **kw: None)   # the methods "all" names, no run
    try:
        assert cli_main(["demo", "--images", "1", "--out", str(tmp_path / "run")]) == 0
    finally:
        logging.getLogger().removeHandler(default)
    err = capsys.readouterr().err.splitlines()
    assert not [line for line in err if re.match(r"[A-Z]+:[\w.]+:", line)], err
    said = [line for line in err if "leaves out" in line]
    assert len(said) == 1 and said[0].startswith("shiftlab demo: warning: methods 'all' leaves out ")
    assert said[0].endswith(" (another image tower only)")
    shiftlab_log = logging.getLogger("shiftlab")   # a library user's logging is as it was
    assert shiftlab_log.propagate and not shiftlab_log.handlers
