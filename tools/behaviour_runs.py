"""Record, or compare, one fixed run per protocol: the check that a refactor keeps behaviour.

    python tools/behaviour_runs.py record DIR      # every method, tiny random CLIP, 12 synthetic images
    python tools/behaviour_runs.py compare DIR_A DIR_B

`record` runs `shiftlab run` (through the CLI, as a user would) once per protocol into DIR/<protocol>;
`compare` says, per protocol, whether the two records.jsonl are identical field for field with the
`seconds` field left out, and lists the first differences. A refactor that moves code must keep them
identical on one machine (floats included: same code, same CPU, same summation order).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

PROTOCOLS = ("leaderboard", "paper")
N_IMAGES = 12


def record(out: Path) -> None:
    from shiftlab.synthetic import make_imagenet_r
    out.mkdir(parents=True, exist_ok=True)
    data = make_imagenet_r(out / "data", classes=range(0, 200, 200 // N_IMAGES), size=(96, 80))
    cupl = out / "cupl.json"   # a stand-in for CuPL's descriptions, which the paper recipes of DMN-ZS and DPE read
    from shiftlab.datasets import classnames
    names = classnames("imagenet-r")
    cupl.write_text(json.dumps({c: [f"a {c} seen up close.", f"a drawing of a {c}."] for c in names}))
    for protocol in PROTOCOLS:
        cmd = [sys.executable, "-m", "shiftlab", "run", "--dataset", "imagenet-r", "--data", str(data),
               "--model", "shiftlab-tiny", "--pretrained", "none", "--methods", "all", "--protocol", protocol,
               "--limit", str(N_IMAGES), "--seed", "0", "--workers", "0", "--no-progress", "--allow-partial",
               "--out", str(out / protocol)]
        if protocol == "paper":
            cmd += description_files(cupl)
        cmd += offline_settings()
        subprocess.run(cmd, check=True)


def description_files(path: Path) -> list[str]:
    """--set flags giving every method whose paper recipe reads a file of class descriptions (CuPL's for DMN-ZS
    and DPE, GPT-4 descriptors for TPS: the same {class: [sentences]} format) the stand-in file."""
    import dataclasses

    from shiftlab.methods.base import get_method_class, list_methods
    return [flag for name in list_methods() for field in dataclasses.fields(get_method_class(name).config_class)
            if field.name in ("cupl_file", "descriptors_file") for flag in ("--set", f"{name}.{field.name}={path}")]


def offline_settings() -> list[str]:
    """--set flags of every method's `offline_config` (RLCF: a random-weight reward model, nothing downloaded)."""
    from shiftlab.methods.base import get_method_class, list_methods
    return [flag for name in list_methods() for field, value in get_method_class(name).offline_config.items()
            for flag in ("--set", f"{name}.{field}={value}")]


def _records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        row.pop("seconds", None)
    return sorted(rows, key=lambda r: (r["id"], str(r.get("method")), r.get("setting", "")))


def compare(a: Path, b: Path) -> int:
    """Field for field, over the methods both recordings ran (a method added since is listed, not compared)."""
    status = 0
    for protocol in PROTOCOLS:
        ra, rb = _records(a / protocol), _records(b / protocol)
        ma, mb = {r.get("method") for r in ra}, {r.get("method") for r in rb}
        if ma != mb:
            print(f"{protocol}: methods in one recording only (not compared): {sorted(map(str, ma ^ mb))}")
        ra, rb = [r for r in ra if r.get("method") in mb], [r for r in rb if r.get("method") in ma]
        diffs = [(x, y) for x, y in zip(ra, rb) if x != y]
        if len(ra) != len(rb) or diffs:
            status = 1
            print(f"{protocol}: {len(ra)} vs {len(rb)} records, {len(diffs)} differ")
            for x, y in diffs[:5]:
                print("  ", json.dumps(x, sort_keys=True), "\n  ", json.dumps(y, sort_keys=True))
        else:
            print(f"{protocol}: {len(ra)} records identical field for field (seconds aside)")
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("record").add_argument("dir", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.dir)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
