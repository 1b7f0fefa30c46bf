"""How a run and the demo start (issue 40 case 9): something is said before torch loads, an impossible dirichlet
stream is refused before the model is loaded, and the demo says what it proves and gives numbers that differ."""
from __future__ import annotations

import json
import sys

import pytest

from _synthetic import make_image_folder
from shiftlab.cli import main as cli_main


@pytest.fixture()
def uneven(tmp_path):
    """Five classes of 10, 10, 10, 10 and 2 images: with delta 0.01 every class lands whole in one chunk, so the
    chunk of the 2-image class never reaches its 8 samples: no dirichlet draw succeeds."""
    root = tmp_path / "data"
    make_image_folder(root, ["a", "b", "c", "d"], per_class=10, size=(8, 8))
    make_image_folder(root, ["e"], per_class=2, size=(8, 8), seed=1)
    return root


def _run_args(data, out, *more):
    return ["run", "--dataset", "imagefolder", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none",
            "--methods", "zeroshot", "--workers", "0", "--device", "cpu", "--out", str(out), *more]


def test_an_impossible_dirichlet_stream_is_refused_before_the_model_loads(uneven, tmp_path, capsys, monkeypatch):
    """It failed after the model and the methods were built (95-103 s of silence on a loaded machine)."""
    import shiftlab.engine.prepare as prepare
    monkeypatch.setattr(prepare, "prepare", lambda *a, **k: pytest.fail("the model was loaded first"))
    code = cli_main(_run_args(uneven, tmp_path / "run", "--order", "dirichlet", "--delta", "0.01"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("shiftlab run: error: no dirichlet stream with delta 0.01 gives every one of the 5 "
                             "chunks 8 samples in 1000 draws")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_on_a_terminal_says_what_it_loads_before_its_bar(uneven, tmp_path, capsys, monkeypatch):
    """`shiftlab run` was silent 12-26 s before its progress bar: torch, the model and the class heads load first."""
    import shiftlab.engine.loop as loop
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setattr(loop, "run", lambda *a, **k: {})          # the engine itself is tested elsewhere
    assert cli_main(_run_args(uneven, tmp_path / "run", "--limit", "2")) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("shiftlab run: ")]
    # the data is listed before torch loads (its problems are refused there), then torch, the model, the methods
    assert said[0].startswith("shiftlab run: listing imagefolder under "), said
    assert said[1] == "shiftlab run: loading torch and the methods ...", said
    assert any(line.startswith("shiftlab run: loading shiftlab-tiny (random weights)") for line in said), said
    assert said[-1] == "shiftlab run: building 1 method(s) and their class heads ..."


@pytest.mark.slow
def test_the_demo_says_what_it_proves_and_gives_numbers_that_differ(tmp_path):
    """`shiftlab demo` printed nothing for 33 s and showed 0.00 top-1 for every method (200 classes, 12 images);
    now five classes: chance is 20 % and the methods' numbers differ. A few methods here keep the test short."""
    import subprocess
    import time
    out = tmp_path / "demo"
    start = time.monotonic()
    with open(tmp_path / "stderr", "w") as err:   # a file: the progress bar never fills a pipe
        proc = subprocess.Popen([sys.executable, "-u", "-m", "shiftlab", "demo", "--out", str(out),
                                 "--methods", "zeroshot,tda,onzeta,tent"],
                                stdout=subprocess.PIPE, stderr=err, text=True)
        first = proc.stdout.readline()
        first_after = time.monotonic() - start
        rest = proc.stdout.read()
        proc.wait(timeout=600)
    assert proc.returncode == 0, (tmp_path / "stderr").read_text()
    assert first.startswith("shiftlab demo: every method through the real engine on 10 synthetic images of 5 classes")
    assert first_after < 10                                   # before torch (2 s on an idle machine)
    text = first + rest
    assert "What it proves:" in text and "What it does not: accuracy." in text and "(20 % for 5 classes" in text
    summary = json.loads((out / "summary.json").read_text())
    top1 = {name: entry["top1"] for name, entry in summary["methods"].items()}
    assert set(top1) == {"zeroshot", "tda", "onzeta", "tent"} and all(e["n"] == 10 for e in summary["methods"].values())
    assert len(set(top1.values())) > 1 and any(v > 0 for v in top1.values())   # 20, 20, 30, 0 here
    assert len({round(entry["ece"], 2) for entry in summary["methods"].values()}) == 4
    assert summary["config"]["classnames"] == ["goldfish", "pizza", "tree frog", "violin", "volcano"]
