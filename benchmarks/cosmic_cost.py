"""COSMIC's own work per image against the floor (its 8 views through the frozen CLIP image tower).

    PYTHONPATH=src python benchmarks/cosmic_cost.py --model RN50 --images 20 [--dino vit_large_patch14_reg4_dinov2]

Random weights (nothing downloaded), 200 classes, 224 px, float32, one thread. Times per image: the floor
(8 views encoded), COSMIC's CLIP side (memory, centres, the CLIP clique graph and its scores: `predict_context`
on the encoded views with the DINOv2 path off), and one 224 px view through the DINOv2 (random weights). The
graph is rebuilt at every sample while the memory fills (the first C x 16 samples of a stream), the worst case.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import shiftlab
from shiftlab import ClassHeads, SampleContext
from shiftlab.datasets.specs import classnames
from shiftlab.methods.cosmic.dino import dino_features, load_dino


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="RN50")
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--dino", default="vit_large_patch14_reg4_dinov2")
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = {"RN50": "RN50-quickgelu", "ViT-B-16": "ViT-B-16-quickgelu"}.get(args.model, args.model)
    model = shiftlab.load_model(arch, None)
    names = classnames("imagenet-r")
    heads = ClassHeads(model, names)
    method = shiftlab.create_method("cosmic", model, names, heads=heads, text_head="zeroshot", dino_model=None)
    gen = torch.Generator().manual_seed(0)
    views = [model.normalize(torch.rand(8, 3, 224, 224, generator=gen)) for _ in range(args.images)]
    t0 = time.perf_counter()
    feats = [model.encode_views(v) for v in views]
    floor = (time.perf_counter() - t0) / args.images
    t0 = time.perf_counter()
    for v, f in zip(views, feats):
        method.predict_context(SampleContext(model, heads, v, image_features=f))
    clip_side = (time.perf_counter() - t0) / args.images
    cfg = type(method.config)(dino_model=args.dino, dino_pretrained="none")
    load_dino(cfg, model.device)
    t0 = time.perf_counter()
    for v in views[:5]:
        dino_features(cfg, model.device, SampleContext(model, heads, v))
    dino = (time.perf_counter() - t0) / 5
    print(json.dumps({"model": arch, "images": args.images, "floor_s": floor, "cosmic_clip_side_s": clip_side,
                      "dino_view0_s": dino, "clip_side_ratio": clip_side / floor,
                      "with_dino_ratio": (clip_side + dino) / floor,
                      "loadavg": open("/proc/loadavg").read().split()[:3]}))


if __name__ == "__main__":
    main()
