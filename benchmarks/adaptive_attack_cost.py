"""The cost of an attack through a method's adaptation (`--attack-target adaptive`) per image, against the floor
(one zero-shot forward of the base view) and against the transfer attack's gradient (zero-shot CLIP's).

    PYTHONPATH=src python benchmarks/adaptive_attack_cost.py --model RN50 --methods tpt,mta,tda,tent
    PYTHONPATH=src python benchmarks/adaptive_attack_cost.py --model ViT-B-16 --methods tpt,mta,tda,tent

Random weights (nothing downloaded), ImageNet-R's 200 classes, one 224 px image, float32, one thread, each method
at its defaults (TPT, MTA, TDA: 64 views; TENT: view 0, its batch of one). An attack iteration through the
adaptation is one forward and one backward of the method's differentiable prediction (`attacks.adaptive.
method_target`: its views drawn from the attacked image, then its spec's `adaptive.impl`: TPT's AdamW step
with create_graph, MTA's mode seeking, TDA against its (here empty) caches, TENT against its norm state); the
transfer iteration is zero-shot CLIP's forward and backward. Each is timed `--repeats` times (best); the defaults'
per-image cost is extrapolated from one iteration: APGD-CE 100 iterations, APGD-T 9 x 100 (AutoAttack's parts
that take gradients; Square's 5,000 queries are forwards of the same prediction: one forward each, also printed).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import shiftlab
from shiftlab import ClassHeads
from shiftlab.attacks import ZeroShotClassifier
from shiftlab.attacks.adaptive import method_target
from shiftlab.datasets.specs import classnames


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="RN50")
    ap.add_argument("--methods", default="tpt,mta,tda,tent")
    ap.add_argument("--repeats", type=int, default=1, help="best of this many timings of each iteration")
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = {"RN50": "RN50-quickgelu", "ViT-B-16": "ViT-B-16-quickgelu"}.get(args.model, args.model)
    model = shiftlab.load_model(arch, None)
    names = classnames("imagenet-r")
    heads = ClassHeads(model, names)
    clf = ZeroShotClassifier(model, heads.zeroshot, model.logit_scale)
    x = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = clf(x).argmax(dim=1)

    def floor():
        with torch.no_grad():
            clf(x)

    def gradient(fn):
        def run():
            z = x.clone().requires_grad_(True)
            torch.autograd.grad(torch.nn.functional.cross_entropy(fn(z), y), z)
        return run

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(x)
        return run

    t_floor = timed(floor, 3)
    transfer = timed(gradient(clf), max(args.repeats, 2))
    out = {"model": arch, "floor_s": t_floor, "transfer_iteration_s": transfer, "methods": {}}
    for name in args.methods.split(","):
        method = shiftlab.create_method(name, model, names, heads=heads)
        method.prepare()
        target = method_target(method, [0], run_seed=0)
        it = timed(gradient(target), args.repeats)
        fwd = timed(forward(target), args.repeats)
        full = {"apgd_ce": 100 * it, "apgd_t": 900 * it, "square": 5000 * fwd}
        full["autoattack"] = sum(full.values())
        out["methods"][name] = {"mode": method.adaptive.label, "iteration_s": it, "forward_s": fwd,
                                "iteration_x_floor": it / t_floor, "iteration_x_transfer": it / transfer,
                                "per_image_s": full, "per_image_x_floor": {k: v / t_floor for k, v in full.items()}}
        print(json.dumps({name: out["methods"][name]}), flush=True)
    out["loadavg"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
