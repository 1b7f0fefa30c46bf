"""Adding a method touches only its folder (and its test file): a scratch method copied into a temporary
checkout is listed by `shiftlab methods`, checked by `--set`, run through the CLI and the library, and
present in the methods table, while no other file of the checkout changes (git says so)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# the whole method: a sharpened zero-shot CLIP (scale x the zero-shot logits of view 0)
SPEC = '''"""Scratch: zero-shot CLIP with its logits scaled (a test's method). Its spec, without torch."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodConfig, MethodSpec


@dataclass
class ScratchConfig(MethodConfig):
    scale: float = param(1.0, gt=0)   # a test's own: no source


class ScratchSpec(MethodSpec):
    name = "scratch"
    impl = "shiftlab.methods.scratch.method:Scratch"
    config_class = ScratchConfig
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
'''
CARD = '''[scratch]
summary = "scratch: zero-shot logits times a scale"
protocols = {}
fidelity = ""
'''
METHOD = '''"""Scratch: zero-shot CLIP with its logits scaled (a test's method)."""
from __future__ import annotations

from ..base import Method, MethodOutput
from .spec import ScratchSpec


class Scratch(Method):
    spec = ScratchSpec

    def predict_context(self, ctx):
        return MethodOutput(self.config.scale * ctx.zeroshot_logits)
'''
FOLDER = {"__init__.py": '"""The scratch method folder."""\n', "spec.py": SPEC, "card.toml": CARD, "method.py": METHOD,
          "README.md": "# Scratch (`scratch`)\n\nZero-shot CLIP with its logits scaled: a test's method.\n"}
TEST = "def test_nothing():\n    pass\n"

LIBRARY = """
import json, sys, torch
import shiftlab
from shiftlab.synthetic import tiny_clip
model = tiny_clip()
names = ["cat", "dog", "fox"]
size = model.image_size
views = model.normalize(torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(0)))
scaled = shiftlab.create_method("scratch", model, names, scale=3.0).predict(views)
plain = shiftlab.create_method("zeroshot", model, names).predict(views)
print(json.dumps({"close": bool(torch.allclose(scaled, 3.0 * plain, atol=1e-5)),
                  "listed": "scratch" in shiftlab.list_methods()}))
"""


def _checkout(root: Path) -> Path:
    """A temporary checkout: the tracked source and docs, committed in a git repository of its own."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "src", "docs", "README.md", "pyproject.toml"],
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "checkout"], check=True)
    return root


def _shiftlab(root: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "shiftlab", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root, timeout=300)


@pytest.mark.slow
def test_a_scratch_method_folder_is_all_a_method_needs(tmp_path):
    root = _checkout(tmp_path / "checkout")
    folder = root / "src" / "shiftlab" / "methods" / "scratch"
    folder.mkdir()
    for name, text in FOLDER.items():
        (folder / name).write_text(text)
    (root / "tests" / "methods").mkdir(parents=True)
    (root / "tests" / "methods" / "test_scratch.py").write_text(TEST)

    listed = _shiftlab(root, "methods")
    assert listed.returncode == 0, listed.stderr
    assert "scratch: zero-shot logits times a scale" in listed.stdout
    assert any(line.split()[:2] == ["scratch", "episodic"] for line in listed.stdout.splitlines())
    table = _shiftlab(root, "methods", "--table")
    row = next(line for line in table.stdout.splitlines() if line.startswith("| [`scratch`]"))
    assert "(src/shiftlab/methods/scratch/README.md)" in row and "scratch: zero-shot logits times a scale" in row

    refused = _shiftlab(root, "run", "--data", str(tmp_path), "--out", str(tmp_path / "no"), "--set", "scratch.scale=0")
    assert refused.returncode == 2 and "scratch.scale: 0 is out of range" in refused.stderr, refused.stderr

    from shiftlab.synthetic import make_imagenet_r
    data = make_imagenet_r(tmp_path / "data", classes=[0, 1, 2], size=(40, 30))
    out = tmp_path / "run"
    run = _shiftlab(root, "run", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny",
                    "--pretrained", "none", "--methods", "scratch,zeroshot", "--set", "scratch.scale=3",
                    "--limit", "3", "--workers", "0", "--no-progress", "--allow-partial", "--out", str(out))
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    by = {(r["id"], r["method"]): r for r in records}
    assert sorted({r["method"] for r in records}) == ["scratch", "zeroshot"] and len(records) == 6
    for i in range(3):   # the same ranking, sharper probabilities: its code ran with its --set value
        scratch, zeroshot = by[(i, "scratch")], by[(i, "zeroshot")]
        assert scratch["top5"] == zeroshot["top5"] and scratch["confidence"] > zeroshot["confidence"]
    assert json.loads((out / "run.json").read_text())["methods"]["scratch"]["scale"] == 3.0

    library = _shiftlab(root, code=LIBRARY)
    assert library.returncode == 0, library.stderr
    assert json.loads(library.stdout) == {"close": True, "listed": True}

    # nothing else changed: only the method's folder and its test file are new, nothing tracked was modified
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert sorted(status) == sorted([f"?? src/shiftlab/methods/scratch/{n}" for n in FOLDER]
                                    + ["?? tests/methods/test_scratch.py"])
