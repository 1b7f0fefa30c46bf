"""Regenerate the online / ZERO / attack golden fixtures from the authors' own code.

    python tools/golden/make_golden.py --checkouts DIR [--model FULL_TINY_CLIP.pt]

DIR holds unmodified checkouts of the authors' repositories (names: see REPOS; e.g.
`git clone https://github.com/kdiAAA/TDA DIR/TDA`). Each repository runs in its own
subprocess (they all ship a top-level `clip` package) with this file as a driver: it
imports their modules and patches only from outside -- the device (`.cuda()` -> CPU),
fp16 (`.half()` -> float32, autocast off), data loading (an in-memory stream of fixed
views instead of their datasets), model loading (the tiny CLIP file), and stubs for
logging-only imports (wandb, gdown, ipdb). None of their code is copied here.

Outputs go to tests/fixtures/golden/online/ (tensors in `<method>.pt`, provenance in
`online.json`: repository commits, patches, SHA-256 of every file), and the compact tiny
CLIP in tests/fixtures/golden/ is rewritten to keep the token rows of every prompt used.
See tests/fixtures/golden/online/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from drivers import WORKERS, make_stream  # noqa: E402  (tools/golden is sys.path[0])

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import _golden as G  # noqa: E402

OUT = G.FIXTURES / "online"
REPOS = {"tda": ("TDA", "https://github.com/kdiAAA/TDA"),
         "dmn": ("DMN", "https://github.com/YBZh/DMN"),
         "zero": ("zero", "https://github.com/FarinaMatteo/zero"),
         "rtpt": ("R-TPT", "https://github.com/TomSheng21/R-TPT"),
         "boostadapter": ("BoostAdapter", "https://github.com/taolinzhang/BoostAdapter"),
         "dota": ("DOTA", "https://github.com/skylineeeeen/DOTA"),
         "dpe": ("DPE-CLIP", "https://github.com/zhangce01/DPE-CLIP"),
         "onzeta": ("OnZeta", "https://github.com/idstcv/OnZeta"),
         "ecalp": ("ECALP", "https://github.com/Yushu-Li/ECALP"),
         "tps": ("TPS", "https://github.com/elaine-sui/TPS"),
         "dynaprompt": ("DynaPrompt", "https://github.com/zzzx1224/DynaPrompt"),
         "ttl": ("TTL-Test-Time-Low-Rank-Adaptation", "https://github.com/Razaimam45/TTL-Test-Time-Low-Rank-Adaptation"),
         "rlcf": ("RLCF", "https://github.com/mzhaoshuai/RLCF")}


def load_driver(name: str):
    """The driver beside a fixture folder, tests/fixtures/golden/<name>/driver.py, as module `driver_<name>`."""
    spec = importlib.util.spec_from_file_location(f"driver_{name}", G.FIXTURES / name / "driver.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# the drivers beside their fixtures' folders (TDA's, DMN's, ZERO's and R-TPT's are in drivers.py)
DRIVERS = ("boostadapter", "dota", "dpe", "onzeta", "ecalp", "tps", "dynaprompt", "ttl", "rlcf")
WORKERS.update({name: getattr(load_driver(name), f"run_{name}") for name in DRIVERS})
# drivers that run on the tiny ViT (tests/fixtures/golden/tiny_vit_compact.pt) instead of the tiny ResNet
VIT_WORKERS = {"ttl"}
# (fixture name, driver, variant) in the order they are made
JOBS = [("tda", "tda", "authors"), ("tda_small", "tda", "small"), ("dmn", "dmn", "authors"),
        ("dmn_small", "dmn", "small"), ("zero", "zero", "authors"), ("zero_ties", "zero", "ties"),
        ("rtpt_attack", "rtpt", "authors"),
        *(("boostadapter" + s, "boostadapter", s[1:] or "authors") for s in ("", "_original", "_small")),
        ("dota", "dota", "authors"), ("dota_strong", "dota", "strong"),
        ("dpe", "dpe", "authors"), ("dpe_a", "dpe", "imagenet_a"),
        ("onzeta", "onzeta", "authors"),
        ("ecalp", "ecalp", "authors"), ("ecalp_small", "ecalp", "small"),
        ("tps", "tps", "authors"), ("tps_steps", "tps", "steps"),
        ("dynaprompt", "dynaprompt", "authors"), ("dynaprompt_small", "dynaprompt", "small"),
        ("ttl", "ttl", "authors"), ("ttl_steps", "ttl", "steps"),
        ("rlcf", "rlcf", "authors")]


# -- orchestration ---------------------------------------------------------------------------------

def git_commit(path: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def worker_main(args: argparse.Namespace) -> None:
    inputs = torch.load(args.inputs, weights_only=True)
    classnames = json.loads(Path(args.classnames).read_text())
    res = WORKERS[args.worker](Path(args.checkout).resolve(), args.model, inputs, classnames, args.variant)
    torch.save({"tensors": res["tensors"], "tokens": res["tokens"]}, args.result)
    Path(args.result + ".json").write_text(json.dumps(res["meta"], indent=1, default=str))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkouts", required=True, help="folder with the authors' checkouts (see REPOS)")
    ap.add_argument("--model", help="the full tiny CLIP (default: rebuilt from tests/fixtures/golden)")
    ap.add_argument("--vit-model", help="the full tiny ViT CLIP (default: rebuilt from tests/fixtures/golden, "
                    "or made anew by tests/fixtures/golden/ttl/driver.py tiny_vit_state when it is not there)")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)make, e.g. tda tda_small")
    ap.add_argument("--commit", nargs="*", metavar="DIR=SHA",
                    help="the commit of a checkout that is not a git repository (e.g. a `git archive` export)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    for hidden in ("--checkout", "--inputs", "--classnames", "--result", "--variant"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker_main(args)

    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="golden-"))
    golden = G.materialize(tmp / "golden")
    model = args.model or str(golden / G.MODEL_FILE)
    vit_model = args.vit_model or str(golden / G.VIT_MODEL_FILE)
    if not Path(vit_model).is_file():
        torch.save(sys.modules["driver_ttl"].tiny_vit_state(), vit_model)
    classnames = json.loads((golden / "golden.json").read_text())["classnames"]
    (tmp / "classnames.json").write_text(json.dumps(classnames))
    stream = make_stream()
    torch.save(stream, OUT / "stream.pt")
    info_path = OUT / "online.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {"fixtures": {}}
    jobs = JOBS
    given_commits = dict(c.split("=", 1) for c in args.commit or [])
    missing = [REPOS[w][0] for _, w, _ in jobs if not (Path(args.checkouts) / REPOS[w][0]).is_dir()]
    if missing and not args.only:
        raise SystemExit(f"missing checkouts in {args.checkouts}: {', '.join(sorted(set(missing)))}")
    for name, worker, variant in jobs:
        if args.only and name not in args.only:
            continue
        checkout = Path(args.checkouts) / REPOS[worker][0]
        result = tmp / f"{name}.result.pt"
        subprocess.run([sys.executable, __file__, "--checkouts", args.checkouts, "--worker", worker,
                        "--checkout", str(checkout), "--model", vit_model if worker in VIT_WORKERS else model,
                        "--inputs", str(OUT / "stream.pt"),
                        "--classnames", str(tmp / "classnames.json"), "--result", str(result),
                        "--variant", variant], check=True)
        res = torch.load(result, weights_only=True)
        torch.save({**res["tensors"], "prompt_tokens": res["tokens"]}, OUT / f"{name}.pt")
        commit = git_commit(checkout) or given_commits.get(REPOS[worker][0])
        info["fixtures"][name] = {"repository": REPOS[worker][1], "commit": commit,
                                  "variant": variant, "n_tokens": int(res["tokens"].numel()),
                                  **json.loads(Path(str(result) + ".json").read_text())}
        info_path.write_text(json.dumps(info, indent=1, default=str) + "\n")   # keep what is done
    vit_fixtures = {n for n, w, _ in JOBS if w in VIT_WORKERS}
    compact_vit(vit_model, [torch.load(OUT / f"{n}.pt", weights_only=True)["prompt_tokens"]
                            for n in sorted(vit_fixtures) if (OUT / f"{n}.pt").is_file()], not args.vit_model)
    # keep every token row that some fixture's prompt reads; the rows come from the model used
    full = torch.load(model, map_location="cpu", weights_only=True)
    tokens = [torch.load(golden / "expected.pt", weights_only=True)["init/tokenized_prompts"].flatten()]
    tokens += [torch.load(p, weights_only=True)["prompt_tokens"]
               for p in sorted(OUT.glob("*.pt")) if p.name != "stream.pt" and p.stem not in vit_fixtures]
    needed = torch.unique(torch.cat(tokens))
    table = full[G.TOKEN_KEY]
    if not args.model and not table[needed].any(-1).all():
        raise SystemExit("a prompt needs token rows that the compact model dropped: pass --model FULL_FILE")
    torch.save(G.compact_state_dict(full, needed), G.FIXTURES / G.COMPACT_MODEL_FILE)
    compact_info_path = G.FIXTURES / "compact.json"
    compact_info = json.loads(compact_info_path.read_text())
    record = compact_info["tiny_clip_compact.pt"]
    rows = table[needed]
    record["kept_token_rows"] = int(needed.numel())
    record["kept_tokens"] = ("every token id of init/tokenized_prompts (the 200 prompts of golden.json) and of "
                             "every prompt of the online fixtures (online/online.json)")
    record["original_tensor_sha256"][G.TOKEN_KEY + "[kept rows]"] = [str(rows.dtype), list(rows.shape),
                                                                      G.tensor_sha256(rows)]
    compact_info["files_sha256"] = {p.name: sha256(p) for p in sorted(G.FIXTURES.glob("*.pt"))}
    compact_info_path.write_text(json.dumps(compact_info, indent=1) + "\n")
    info["generated_with"] = {"torch": torch.__version__, "threads": 1, "device": "cpu", "dtype": "float32",
                              "stream": "make_stream(seed=2024); views: tests/_golden.py crop_views"}
    info["files_sha256"] = {p.name: sha256(p) for p in sorted(OUT.glob("*.pt"))}
    info_path.write_text(json.dumps(info, indent=1, default=str) + "\n")
    print(f"wrote {OUT} ({', '.join(sorted(info['fixtures']))}); compact model keeps {needed.numel()} token rows")


def compact_vit(vit_model: str, tokens: list[torch.Tensor], from_fixture: bool) -> None:
    """Write tests/fixtures/golden/tiny_vit_compact.pt (the token rows of `tokens` only) and its record
    in compact.json."""
    if not tokens:
        return
    full = torch.load(vit_model, map_location="cpu", weights_only=True)
    needed = torch.unique(torch.cat(tokens))
    table = full[G.TOKEN_KEY]
    if from_fixture and not table[needed].any(-1).all():
        raise SystemExit("a prompt needs token rows that the compact ViT dropped: pass --vit-model FULL_FILE")
    torch.save(G.compact_state_dict(full, needed), G.FIXTURES / G.COMPACT_VIT_FILE)
    info_path = G.FIXTURES / "compact.json"
    info = json.loads(info_path.read_text())
    state = {k: v for k, v in full.items() if k != G.TOKEN_KEY}
    sums = {k: [str(v.dtype), list(v.shape), G.tensor_sha256(v)] for k, v in state.items()}
    sums[G.TOKEN_KEY + "[kept rows]"] = [str(table.dtype), [int(needed.numel()), table.shape[1]],
                                         G.tensor_sha256(table[needed])]
    info[G.COMPACT_VIT_FILE] = {
        "made_by": "tests/fixtures/golden/ttl/driver.py tiny_vit_state(seed=0): shiftlab.synthetic.tiny_vit(0) "
                   "(shiftlab-tiny-vit, open_clip's seeded random init) in float16, logit_scale float32 ln(25)",
        "token_embedding_shape": list(table.shape), "kept_token_rows": int(needed.numel()),
        "kept_tokens": "every token id of the prompts TTL's text head reads (online/ttl*.pt, prompt_tokens)",
        "original_tensor_sha256": sums}
    info_path.write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
