"""TIPPLE's test-set pass, its two costs apart (src/shiftlab/methods/tipple/README.md, "Cost"):

* per image: the pass's views through the frozen image tower (weak and strong, 1 + task_epochs each: 8 views);
* per stage-I step: the text tower's forward and backward over the class prompts at one context, and the
  (B x D) @ (D x C) logits of a batch of 256 images' weak and strong features (the paper's batch).

ImageNet-R's stage I has ceil(30000 / 256) x 3 = 354 steps, so per image the pass costs the 8-view encoding
+ 354 / 30000 steps.

    python benchmarks/tipple_pass.py --model RN50 --images 2 --steps 2
    python benchmarks/tipple_pass.py --model ViT-B-16 --images 2 --steps 2
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

import shiftlab
from shiftlab.datasets.classes import classnames_for_wnids, imagenet_r_wnids
from shiftlab.methods.tipple.method import task_batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="RN50")
    ap.add_argument("--images", type=int, default=2, help="images whose 8 pass views are encoded")
    ap.add_argument("--steps", type=int, default=2, help="stage-I steps timed (batches of 256 random features)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--test-set", type=int, default=30000, help="images of the test set the projection is for")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = shiftlab.load_model(args.model, None, seed=0)
    names = classnames_for_wnids(imagenet_r_wnids())
    method = shiftlab.create_method("tipple", model, names)
    n_views = sum(r.n_views for r in method.test_set_views.values())
    size = model.image_size
    pixels = model.normalize(torch.rand(n_views, 3, size, size, generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        model.encode_views(pixels[:2])   # first-call costs
        t0 = time.perf_counter()
        for _ in range(args.images):
            model.encode_views(pixels)
        encode = (time.perf_counter() - t0) / args.images
    dim = model.encode_views(pixels[:1]).shape[-1]
    gen = torch.Generator().manual_seed(1)
    feats = torch.nn.functional.normalize(torch.randn(256, 2, method.config.task_epochs, dim, generator=gen), dim=-1)
    method.learn_task_prompt(feats[:, 0], feats[:, 1], [task_batches(256, 256, 1, 0)[0]])   # first-call costs
    t0 = time.perf_counter()
    for _ in range(args.steps):
        method.learn_task_prompt(feats[:, 0], feats[:, 1], [task_batches(256, 256, 1, 0)[0]])
    step = (time.perf_counter() - t0) / args.steps
    steps = math.ceil(args.test_set / method.config.task_batch_size) * method.config.task_epochs
    print(json.dumps({"model": args.model, "classes": len(names), "pass_views": n_views, "threads": args.threads,
                      "encode_seconds_per_image": encode, "stage_one_seconds_per_step": step,
                      "test_set": args.test_set, "stage_one_steps": steps,
                      "pass_seconds_per_image": encode + steps * step / args.test_set}, indent=1))


if __name__ == "__main__":
    main()
