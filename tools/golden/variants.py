"""The command line shared by the golden drivers that run their authors' code once per variant, each variant in
a process of its own (their modules patch torch on import): `python <fixture folder>/driver.py --checkout DIR
[--commit SHA]` runs every variant, checks that the prompts use only tokens the compact tiny ViT keeps, and
writes `<variant>.pt` plus `<folder>.json` (the reference, the model, the stream, the command and, per variant,
what was called and the SHA-256 of its tensors)."""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


def checkout_commit(path: str) -> str | None:
    """The commit of a git checkout (None for a `git archive` export)."""
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def variants_main(driver: str, run: Callable[[Path, Path, str], dict], variants: Iterable[str], repository: str,
                  description: str | None = None) -> None:
    """The driver's `main()`: `run(checkout, golden_dir, variant)` returns {"tensors", "meta", "tokens"}."""
    here = Path(driver).resolve().parent
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", required=True, help=f"a checkout or `git archive` export of {repository}")
    ap.add_argument("--commit", help="the commit, when the checkout is a `git archive` export")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--golden", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch
    if args.variant:                # one variant per process: their modules patch torch
        torch.set_num_threads(1)
        res = run(Path(args.checkout).resolve(), Path(args.golden), args.variant)
        torch.save(res["tensors"], here / f"{args.variant}.pt")
        (here / f"{args.variant}.tokens.json").write_text(json.dumps(res["tokens"].tolist()))
        (here / f"{args.variant}.meta.json").write_text(json.dumps(res["meta"], indent=1, default=str))
        return

    import _golden as G
    golden = G.materialize(Path(tempfile.mkdtemp(prefix="golden-")))
    kept = set(torch.load(G.FIXTURES / G.COMPACT_VIT_FILE, weights_only=True)[G.INDEX_KEY].tolist())
    info = {"reference": {"repository": repository, "commit": args.commit or checkout_commit(args.checkout)},
            "model": "tests/fixtures/golden tiny_vit_compact.pt (rebuilt by tests/_golden.materialize)",
            "stream": "tests/fixtures/golden/online/stream.pt",
            "command": f"python tests/fixtures/golden/{here.name}/driver.py --checkout CHECKOUT --commit SHA",
            "fixtures": {}}
    for variant in variants:
        subprocess.run([sys.executable, driver, "--checkout", args.checkout, "--variant", variant,
                        "--golden", str(golden)], check=True)
        meta = json.loads((here / f"{variant}.meta.json").read_text())
        tokens = json.loads((here / f"{variant}.tokens.json").read_text())
        (here / f"{variant}.meta.json").unlink()
        (here / f"{variant}.tokens.json").unlink()
        if not set(tokens) <= kept:
            raise SystemExit(f"{variant}: prompts use tokens the compact tiny ViT does not keep")
        meta["sha256"] = hashlib.sha256((here / f"{variant}.pt").read_bytes()).hexdigest()
        info["fixtures"][variant] = meta
    (here / f"{here.name}.json").write_text(json.dumps(info, indent=1) + "\n")
