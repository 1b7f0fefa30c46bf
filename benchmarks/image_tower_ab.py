"""Interleaved A/B of the image tower's execution choices, with identical predictions checked.

Every variant encodes the same views (A, B, C, A, B, C, ... in one process, so that a busy
machine's load changes hit every variant alike); the script reports each variant's median
seconds per 64 views with the spread (min-max) and, against the first variant (the plain
encoder), the top-1 agreement and the largest logit difference on a 200-class head.

    PYTHONPATH=src python benchmarks/image_tower_ab.py                      # RN50, CPU, fp32
    PYTHONPATH=src python benchmarks/image_tower_ab.py --variants plain,cl --reps 5 --json
    PYTHONPATH=src python benchmarks/image_tower_ab.py --device cuda --precision fp16 --views 256

Variants (name = memory format / gradient mode / chunk of views per tower call):
  plain      contiguous, torch.no_grad, one call for all views (the encoder before issue 15)
  cl         channels_last weights and input, torch.inference_mode, one call
  cl-c16/32  as cl, chunks of 16/32 views per call
  cl-c128/256  as cl, chunks of 128/256 views (256: shiftlab's ENCODE_CHUNK, the engine's choice)
  nograd-cl  channels_last under torch.no_grad (isolates inference_mode's share)
  compile    as cl, the visual tower wrapped in torch.compile (compile time is reported, not timed)
Weights are random (`RN50-quickgelu`, the architecture of OpenAI's RN50 weights); the cost does
not depend on the weights' values.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from shiftlab.models import load_model

VARIANTS = {
    # name: (channels_last, inference_mode, chunk (0 = all views at once), compile)
    "plain": (False, False, 0, False),
    "cl": (True, True, 0, False),
    "cl-c16": (True, True, 16, False),
    "cl-c32": (True, True, 32, False),
    "cl-c128": (True, True, 128, False),
    "cl-c256": (True, True, 256, False),
    "nograd-cl": (True, False, 0, False),
    "compile": (True, True, 0, True),
}


def _encoder(visual: torch.nn.Module, spec: tuple, device: torch.device, precision: str):
    channels_last, inference, chunk, compiled = spec
    visual = copy.deepcopy(visual)
    if channels_last:
        visual = visual.to(memory_format=torch.channels_last)
    if compiled:
        visual = torch.compile(visual)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)

    def encode(x: torch.Tensor) -> torch.Tensor:
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        mode = torch.inference_mode() if inference else torch.no_grad()
        cast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        size = chunk or x.shape[0]
        with mode, cast:
            return torch.cat([F.normalize(visual(x[i:i + size]).float(), dim=-1)
                              for i in range(0, x.shape[0], size)])
    return encode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="plain,cl,cl-c32", help=f"comma-separated, from {sorted(VARIANTS)}")
    p.add_argument("--model", default="RN50-quickgelu")
    p.add_argument("--views", type=int, default=64)
    p.add_argument("--reps", type=int, default=3, help="timed rounds (each round runs every variant once)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--classes", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = load_model(args.model, None, device=device)
    size = model.image_size
    x = model.normalize(torch.rand(args.views, 3, size, size, device=device))
    with torch.no_grad():
        probe = model.clip.visual(x[:1])
    head = F.normalize(torch.randn(args.classes, probe.shape[-1], device=device), dim=-1)

    encoders, compile_seconds, ref = {}, {}, None
    for name in names:   # build + one untimed warm-up call each (compiles the compiled variant)
        t0 = time.perf_counter()
        encoders[name] = _encoder(model.clip.visual, VARIANTS[name], device, args.precision)
        encoders[name](x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        compile_seconds[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {n: [] for n in names}
    logits: dict[str, torch.Tensor] = {}
    for rep in range(args.reps):
        for name in names:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            feats = encoders[name](x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[name].append(time.perf_counter() - t0)
            logits[name] = (100.0 * feats @ head.T).cpu()
        print(f"round {rep + 1}/{args.reps}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names),
              file=sys.stderr, flush=True)
    ref = logits[names[0]]
    result = {
        "model": args.model, "device": str(device), "precision": args.precision, "views": args.views,
        "reps": args.reps, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "variants": {},
    }
    base = statistics.median(times[names[0]])
    for name in names:
        t = times[name]
        med = statistics.median(t)
        agree = float((logits[name].argmax(-1) == ref.argmax(-1)).float().mean())
        result["variants"][name] = {
            "spec": dict(zip(("channels_last", "inference_mode", "chunk", "compile"), VARIANTS[name])),
            "median_seconds": med, "min_seconds": min(t), "max_seconds": max(t), "seconds": t,
            "speedup_vs_first": base / med, "top1_agreement_vs_first": agree,
            "max_abs_logit_diff_vs_first": float((logits[name] - ref).abs().max()),
            "build_and_first_call_seconds": compile_seconds[name],
        }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{args.model} on {device}, {args.precision}, {args.views} views, {args.reps} interleaved rounds, "
              f"{result['threads']} threads, load {result['loadavg']}")
        for name, r in result["variants"].items():
            print(f"  {name:<10} median {r['median_seconds']:.2f} s (min {r['min_seconds']:.2f}, max "
                  f"{r['max_seconds']:.2f})  x{r['speedup_vs_first']:.2f} vs {names[0]}  top-1 "
                  f"{r['top1_agreement_vs_first']:.0%}  max|dlogit| {r['max_abs_logit_diff_vs_first']:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
