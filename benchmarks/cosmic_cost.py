"""COSMIC's own work per image against the floor (its 8 views through the frozen CLIP image tower).

    PYTHONPATH=src python benchmarks/cosmic_cost.py --model RN50 --images 8 --rounds 3 [--dino NAME]

Random weights (nothing downloaded), 200 classes, 224 px, float32, one thread. Times per image: the floor
(8 views encoded); COSMIC's CLIP side (memory, centres, the CLIP clique graph and its scores: `predict_context`
on the encoded views with the DINOv2 path off); the DINOv2 encode of view 0 (a frozen encoding: what the engine
computes once per sample and a feature store holds, `shiftlab encode`); and COSMIC's own work, everything but the
two frozen encodings: `predict_context` with the CLIP features and the DINOv2 feature handed in, as a feature store
serves them (CLIP side + the DINOv2 cache, its clique graph and scores). The graphs are rebuilt at every sample
while the memories fill (the first C x 16 samples of a stream), the worst case.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import shiftlab
from shiftlab import ClassHeads, SampleContext
from shiftlab.datasets.specs import classnames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="RN50")
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--dino", default="vit_large_patch14_reg4_dinov2")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = {"RN50": "RN50-quickgelu", "ViT-B-16": "ViT-B-16-quickgelu"}.get(args.model, args.model)
    model = shiftlab.load_model(arch, None)
    names = classnames("imagenet-r")
    heads = ClassHeads(model, names)
    warm = shiftlab.create_method("cosmic", model, names, heads=heads, text_head="zeroshot", dino_model=None)
    warm.prepare()         # the class head through the text tower, once per run (not per image): not timed
    size = model.image_size
    warm_views = model.normalize(torch.rand(8, 3, size, size))
    warm.predict_context(SampleContext(model, heads, warm_views))   # first-call imports (networkx): not timed
    gen = torch.Generator().manual_seed(0)
    views = [model.normalize(torch.rand(8, 3, size, size, generator=gen)) for _ in range(args.images)]
    t0 = time.perf_counter()
    feats = [model.encode_views(v) for v in views]
    floor = (time.perf_counter() - t0) / args.images
    full = shiftlab.create_method("cosmic", model, names, heads=heads, text_head="zeroshot", dino_model=args.dino,
                                  dino_pretrained="none")
    full.prepare()         # loads the DINOv2 (once per process): not timed
    encoder = full.frozen_encoder()
    t0 = time.perf_counter()
    dino = [encoder.encode(v[:1]) for v in views]
    dino_s = (time.perf_counter() - t0) / args.images

    def clip_side() -> float:
        fresh = shiftlab.create_method("cosmic", model, names, heads=heads, text_head="zeroshot", dino_model=None)
        t0 = time.perf_counter()
        for v, f in zip(views, feats):
            fresh.predict_context(SampleContext(model, heads, v, image_features=f))
        return (time.perf_counter() - t0) / args.images

    def own_work() -> float:
        fresh = shiftlab.create_method("cosmic", model, names, heads=heads, text_head="zeroshot",
                                       dino_model=args.dino, dino_pretrained="none")
        t0 = time.perf_counter()
        for f, d in zip(feats, dino):
            fresh.predict_context(SampleContext(model, heads, None, image_features=f, encoded={encoder.id: d}))
        return (time.perf_counter() - t0) / args.images
    # interleaved rounds, medians: the shared machine's load comes in bursts
    rounds = [(clip_side(), own_work()) for _ in range(args.rounds)]
    clip_side_s = statistics.median(r[0] for r in rounds)
    own = statistics.median(r[1] for r in rounds)
    print(json.dumps({"model": arch, "dino": args.dino, "images": args.images, "rounds": args.rounds,
                      "floor_s": floor, "cosmic_clip_side_s": clip_side_s, "dino_view0_s": dino_s,
                      "own_work_s": own, "rounds_s": rounds, "clip_side_ratio": clip_side_s / floor,
                      "dino_ratio": dino_s / floor, "own_work_ratio": own / floor,
                      "with_dino_encode_ratio": (own + dino_s) / floor,
                      "loadavg": open("/proc/loadavg").read().split()[:3]}))


if __name__ == "__main__":
    main()
