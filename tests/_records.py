"""The registry-wide "records identical" check: one small run of every registered method, and its stored records.

`records_run(tmp)` runs every registered method (its spec's `offline_config` + `test_config`, 8 views, the tiny
random CLIP, 4 synthetic ImageNet-R images, one thread) through the engine, as `shiftlab run` would, and returns
each method's records without their timings. tests/fixtures/records/<method>.json holds what that run wrote when
the fixture was made (`python tests/fixtures/records/make_records.py [METHOD ...]`); tests/test_records_identical.py
compares the two with `same_records`, so a change that moves code proves it keeps every method's records.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "records"
N_IMAGES, N_VIEWS, SEED = 4, 8, 0
REGENERATE = "python tests/fixtures/records/make_records.py"

ABS_TOL = 1e-5
"""Floats in records (confidences, true-class probabilities, a method's extras) made on another machine: on the
machine that made the fixtures a rerun is bit-identical (difference 0); another CPU's float32 kernels sum in
another order, which moves logits (100 x cosine) by ~1e-4 (tests/_golden.py, LOGITS) and probabilities by far less
than 1e-5 unless the method tunes at test time. REL_TOL covers extras of larger scale (losses, norms)."""
REL_TOL = 1e-4


def small_config(name: str) -> dict[str, Any]:
    """What a registry-wide test runs `name` with: its spec's `offline_config` (nothing to download) and its small
    `test_config` (the fewest views, steps and buffer slots that still exercise its state)."""
    from shiftlab.methods.catalogue.declarations import spec
    return {**spec(name).offline_config, **spec(name).test_config}


def records_run(tmp: Path, methods: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """{method: its records in (id, setting) order, `seconds` removed} of one run of `methods` (default: all)."""
    import torch

    import shiftlab
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.loop import run
    from shiftlab.methods.catalogue.declarations import spec
    from shiftlab.rundir import record_files
    from shiftlab.synthetic import make_imagenet_r, tiny_clip

    methods = methods or shiftlab.list_methods()
    data = make_imagenet_r(tmp / "data", per_class=1, classes=range(0, 200, 200 // N_IMAGES)[:N_IMAGES],
                           size=(48, 40))
    method_config = {n: small_config(n) for n in methods}
    # a method bound to ViTs (its spec's `towers`: TCA) runs on the tiny ViT, in a run of its own
    vit_only = [n for n in methods if "resnet" not in spec(n).towers]
    groups = [(m, name) for m, name in (([n for n in methods if n not in vit_only], "shiftlab-tiny"),
                                        (vit_only, "shiftlab-tiny-vit")) if m]
    by_method: dict[str, list[dict[str, Any]]] = {n: [] for n in methods}
    prev = torch.get_num_threads()
    torch.set_num_threads(1)          # the fixtures were made with one thread (float32 sums split the same way)
    try:
        for names, model_name in groups:
            out = tmp / f"run-{model_name}"
            model = tiny_clip(0) if model_name == "shiftlab-tiny" else shiftlab.load_model(model_name, None, seed=0)
            run(RunConfig(dataset="imagenet-r", data=str(data), model=model_name, pretrained=None, methods=names,
                          method_config={n: method_config[n] for n in names}, views=N_VIEWS, seed=SEED, out=str(out),
                          workers=0, batch_size=2, progress=False, device="cpu", allow_partial=True), model=model)
            for rec in record_files.load_records(out):
                rec.pop("seconds", None)
                by_method[rec["method"]].append(rec)
    finally:
        torch.set_num_threads(prev)
    return {n: sorted(recs, key=lambda r: (r["id"], r.get("setting", ""))) for n, recs in by_method.items()}


def fixture_path(method: str) -> Path:
    return FIXTURES / f"{method}.json"


def load_fixture(method: str) -> list[dict[str, Any]] | None:
    path = fixture_path(method)
    return json.loads(path.read_text())["records"] if path.is_file() else None


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where `got` differs from `want`: floats beyond ABS_TOL / REL_TOL, anything else (ints, bools, strings,
    None, list lengths, keys) at all. An empty list: the same records."""
    if isinstance(want, float) or isinstance(got, float):
        if type(got) is not type(want):          # an int that became a float (or None, or a string) is a change
            return [f"{where}: {got!r} != {want!r}"]
        if math.isnan(want) and math.isnan(got):
            return []
        ok = math.isclose(got, want, rel_tol=REL_TOL, abs_tol=ABS_TOL)
        return [] if ok else [f"{where}: {got!r} != {want!r} (tolerance {ABS_TOL} + {REL_TOL} relative)"]
    if isinstance(want, dict) and isinstance(got, dict):
        if got.keys() != want.keys():
            return [f"{where}: fields {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} entries != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{where}[{i}]")]
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r} != {want!r}"]
