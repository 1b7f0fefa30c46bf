"""`shiftlab demo` (issue 34, finding 8): it names its run folder before any work, its flags have help, and
no library warning reaches the terminal unfiltered (ECALP's sparse tensor warned mid-progress-bar)."""
from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from shiftlab.cli import main as cli_main
from shiftlab.commands import demo


@pytest.mark.slow
def test_ecalp_sparse_graph_does_not_warn():
    # torch warns once per process: a fresh process, every warning shown
    code = ("import torch\nfrom shiftlab.methods.ecalp.method import normalised_edges, propagate\n"
            "idx = torch.tensor([[0, 3], [1, 2]]); sim = torch.tensor([[0.9, 0.5], [0.8, 0.4]])\n"
            "edges, w = normalised_edges(idx, sim, 2)\n"
            "print(propagate(edges, w, torch.full((2, 2), 0.5), 2, 0.5, 3).shape)\n")
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([2, 2])" in done.stdout
    assert "Warning" not in done.stderr and "Sparse invariant" not in done.stderr, done.stderr


@pytest.mark.slow
def test_demo_names_its_run_folder_and_lets_no_warning_through(tmp_path):
    out = tmp_path / "demo-run"
    done = subprocess.run([sys.executable, "-W", "always", "-m", "shiftlab", "demo", "--images", "2", "--views", "2",
                           "--methods", "zeroshot,ecalp", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[:4]
    assert f"run folder: {out}" in first, done.stdout
    assert (out / "records.jsonl").is_file() and (out / "summary.md").is_file()
    assert f"run folder: {out} (see it as a page: shiftlab report {out}" in done.stdout
    # a warning, if any, is one line of ours after the run, never Python's two-line print
    for line in done.stderr.splitlines():
        assert "Warning" not in line or line.startswith("shiftlab demo: library warning: "), done.stderr
    assert "Sparse invariant" not in done.stderr


def test_demo_without_out_names_a_kept_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_run", lambda args, root, out: 0)
    monkeypatch.setattr(demo.tempfile, "tempdir", str(tmp_path))
    assert cli_main(["demo", "--images", "1"]) == 0
    printed = capsys.readouterr().out
    folder = Path(re.search(r"^run folder: (\S+)$", printed, re.M).group(1))
    assert folder.parent.parent == tmp_path and folder.parent.name.startswith("shiftlab-demo-")
    assert folder.parent.is_dir()   # kept: the run stays for shiftlab report


def test_demo_runs_every_method_its_tiny_resnet_runs(tmp_path, monkeypatch):
    """"every method": DiffTPT (and COSMIC) were left out, "all" expanded before their offline configs applied."""
    from shiftlab.methods.catalogue.declarations import spec, spec_names
    seen = {}
    monkeypatch.setattr("shiftlab.engine.loop.run", lambda cfg, **kw: seen.update(methods=cfg.methods))
    assert cli_main(["demo", "--images", "1", "--out", str(tmp_path / "run")]) == 0
    assert seen["methods"] == [n for n in spec_names() if "resnet" in spec(n).towers]
    assert {"difftpt", "cosmic"} <= set(seen["methods"])


@pytest.mark.parametrize("flags, short", [
    (["--views", "4"], ["mta (5)"]),
    (["--views", "1", "--methods", "zeroshot,mta,rtpt"], ["mta (5)", "rtpt (2)"]),
])
def test_too_few_views_are_refused_with_the_demos_own_flags(tmp_path, monkeypatch, capsys, flags, short):
    """`shiftlab demo --views 4` said "raise --views or --set mta.views=5": the demo has no --set."""
    monkeypatch.setattr("shiftlab.engine.loop.run", lambda cfg, **kw: pytest.fail("refused before the run"))
    assert cli_main(["demo", "--images", "1", "--out", str(tmp_path / "run"), *flags]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if ": warning: " not in line]   # (what all leaves out)
    most = max(int(s.split("(")[1].rstrip(")")) for s in short)
    assert err == [f"shiftlab demo: error: --views {flags[1]} is too few for {', '.join(short)}: the number of views "
                   f"(incl. the original) each needs; raise --views to {most}, or leave "
                   f"{'it' if len(short) == 1 else 'them'} out with --methods"], err
    assert not (tmp_path / "run").exists()


def test_demo_flags_have_help(capsys):
    with pytest.raises(SystemExit):
        cli_main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--images N synthetic images to evaluate, spread over 5 classes (default 10)" in text
    assert "--views V views per image for the methods that augment" in text


def test_library_warnings_are_said_once_each_in_one_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn("Sparse invariant checks are implicitly disabled.\nSecond line", UserWarning, stacklevel=1)
        warnings.warn("old", DeprecationWarning, stacklevel=1)
    lines = demo.warning_lines(caught)
    assert len(lines) == 2
    assert re.fullmatch(r"UserWarning \(test_demo\.py:\d+\): Sparse invariant checks are implicitly disabled\. "
                        r"\[x3\]", lines[0]), lines
    assert re.fullmatch(r"DeprecationWarning \(test_demo\.py:\d+\): old", lines[1]), lines
