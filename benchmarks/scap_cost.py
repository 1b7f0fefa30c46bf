"""SCAP's cost per image against the floor (its views through the frozen CLIP image tower, no gradient).

    PYTHONPATH=src python benchmarks/scap_cost.py --model ViT-B-16 --views 8 --batch 2 --batches 1

Random weights (nothing downloaded), ImageNet-R's 200 classes, 224 px, float32, one thread. SCAP's per-image work
does not depend on how many templates form its fixed ensemble (one (C, D) tensor built once, kept in the class-head
cache), so the timing runs with two templates (`--templates` more); the one-off ensemble build is timed apart.
Per batch: one pass over the originals, one AdamW step per clique, then per image one step over its views (image
tower and the 200-class text tower, forward and backward), one pass over its views and one over its original.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import shiftlab
from shiftlab import ClassHeads, SampleContext
from shiftlab.datasets.specs import classnames
from shiftlab.methods.scap.spec import R_TEMPLATES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ViT-B-16")
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--batches", type=int, default=1)
    ap.add_argument("--templates", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = {"RN50": "RN50-quickgelu", "ViT-B-16": "ViT-B-16-quickgelu"}.get(args.model, args.model)
    model = shiftlab.load_model(arch, None)
    names = classnames("imagenet-r")
    heads = ClassHeads(model, names)
    method = shiftlab.create_method("scap", model, names, heads=heads, views=args.views,
                                    templates=R_TEMPLATES[:args.templates])
    t0 = time.perf_counter()
    method.prepare()
    setup = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    n = args.batch * args.batches
    views = [model.normalize(torch.rand(args.views, 3, 224, 224, generator=gen)) for _ in range(n)]
    t0 = time.perf_counter()
    for v in views:
        model.encode_views(v)
    floor = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for b in range(args.batches):
        method.adapt_batch([SampleContext(model, heads, v) for v in views[b * args.batch:(b + 1) * args.batch]])
    per_image = (time.perf_counter() - t0) / n
    print(json.dumps({"model": arch, "views": args.views, "batch": args.batch, "images": n,
                      "templates": args.templates, "setup_s": setup, "floor_s": floor, "scap_s": per_image,
                      "ratio": per_image / floor, "loadavg": open("/proc/loadavg").read().split()[:3]}))


if __name__ == "__main__":
    main()
