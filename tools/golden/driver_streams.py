"""Golden orders of the label-shifted (Dirichlet) stream, from mariodoebler/test-time-adaptation's own code.

    python tools/golden/driver_streams.py MIRROR_DIR   # a checkout or bare mirror of the repository

Reads `sort_by_dirichlet` from classification/datasets/data_loading.py at the mirror's HEAD (its only
imports are numpy and time; the rest of the file needs the repository's datasets, so the function is taken
out of the file with `ast` and run unmodified), seeds numpy's global generator as the repository's
`RNG_SEED` does, and writes tests/fixtures/golden/streams/dirichlet.json: for each (labels, delta, seed),
the order of sample indices it returns. tests/test_streams.py compares shiftlab.rundir.stream with it.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SOURCE = "classification/datasets/data_loading.py"
OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "golden" / "streams" / "dirichlet.json"


def their_function(mirror: str):
    text = subprocess.run(["git", "-C", mirror, "show", f"HEAD:{SOURCE}"], check=True, capture_output=True,
                          text=True).stdout
    commit = subprocess.run(["git", "-C", mirror, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "sort_by_dirichlet")
    scope = {"np": np, "time": time, "logger": None}
    exec(compile(ast.Module([node], []), SOURCE, "exec"), scope)
    return scope["sort_by_dirichlet"], commit, f"{SOURCE}:{node.lineno}-{node.end_lineno}"


def main(mirror: str) -> None:
    sort_by_dirichlet, commit, where = their_function(mirror)
    cases = []
    # 4 classes x 12 samples (>= 10 per chunk possible), classes interleaved as a folder listing would not be
    labels_a = [i % 4 for i in range(48)]
    # 3 classes of unequal size
    labels_b = [0] * 14 + [1] * 11 + [2] * 17
    for labels in (labels_a, labels_b):
        for delta in (0.01, 0.1, 1.0):
            for seed in (0, 1, 7):
                np.random.seed(seed)
                samples = [(i, lab) for i, lab in enumerate(labels)]
                out = sort_by_dirichlet(delta, samples)
                cases.append({"labels": labels, "delta": delta, "seed": seed, "order": [int(i) for i, _ in out]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"source": f"mariodoebler/test-time-adaptation@{commit} {where}",
                               "driver": "tools/golden/driver_streams.py", "cases": cases}) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main(sys.argv[1])
