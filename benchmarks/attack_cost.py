"""Each attack's cost per image against the floor (one zero-shot forward of the base view), transfer protocol
(the attack differentiates zero-shot CLIP with the initial prompt; every method then scores the adversarial image).

    PYTHONPATH=src python benchmarks/attack_cost.py --model RN50
    PYTHONPATH=src python benchmarks/attack_cost.py --model ViT-B-16

Random weights (nothing downloaded), ImageNet-R's 200 classes, one 224 px image, float32, one thread. Each
image is labelled with zero-shot's own prediction, so that every attack works on it (an image the model
already gets wrong is not attacked at all). A full AutoAttack at the standard settings takes minutes per
image on a CPU, so each part is timed at small iteration counts (APGD 2 and 6, Square 10 and 30
queries) and the cost of one iteration (APGD: one forward and backward; Square: one forward) is the larger
count's time over its count, from which the defaults' cost is extrapolated: APGD-CE 100 iterations, APGD-T
9 targets x 100, Square 5,000 queries, and AutoAttack's worst case (a sample that survives every part, so
each runs in full), all for the one image. Square is timed on a label it cannot overturn (the model's worst
class, margins negated), so that it runs every query it is given.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import shiftlab
from shiftlab import ClassHeads
from shiftlab.attacks import ZeroShotClassifier
from shiftlab.attacks.apgd_ce.attack import apgd_run
from shiftlab.attacks.square.attack import square_run
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
    ap.add_argument("--repeats", type=int, default=2, help="best of this many timings of each count")
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = {"RN50": "RN50-quickgelu", "ViT-B-16": "ViT-B-16-quickgelu"}.get(args.model, args.model)
    model = shiftlab.load_model(arch, None)
    clf = ZeroShotClassifier(model, ClassHeads(model, classnames("imagenet-r")).zeroshot, model.logit_scale)
    x = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = clf(x).argmax(dim=1)
    eps = 4 / 255

    def floor():
        with torch.no_grad():
            clf(x)

    def apgd(steps, loss="ce"):
        target = None if loss == "ce" else clf(x).detach().sort(dim=1)[1][:, -2]
        return lambda: apgd_run(clf, x, y, eps=eps, norm="Linf", steps=steps, rho=0.75, loss=loss, target=target)

    def square(queries):
        # a margin that never falls below 0 keeps the search going for every query (random weights may break
        # the image early, which would time fewer queries than asked): the label is the model's worst class
        worst = clf(x).detach().argmin(dim=1)
        return lambda: square_run(lambda z: -clf(z), x, worst, eps=eps, queries=queries, p_init=0.8)

    t_floor = timed(floor, 3)
    lo, hi = 2, 6
    ce = [timed(apgd(k), args.repeats) for k in (lo, hi)]
    dlr = [timed(apgd(k, "dlr-targeted"), args.repeats) for k in (lo, hi)]
    sq = [timed(square(q), args.repeats) for q in (10, 30)]
    # the cost of one iteration: the larger count's time over its count (it holds the one-off work too, so it
    # errs high); the difference of the two timings, which excludes that work, is printed beside it, but on a
    # loaded machine a difference of two timings can be off by more than the one-off work itself
    per_ce, per_dlr, per_q = ce[1] / hi, dlr[1] / hi, sq[1] / 30
    diffs = {"apgd": (ce[1] - ce[0]) / (hi - lo), "apgd_t": (dlr[1] - dlr[0]) / (hi - lo),
             "square": (sq[1] - sq[0]) / 20}
    full = {"apgd_ce": per_ce * 100, "apgd_t": 9 * per_dlr * 100, "square": per_q * 5000}
    full["autoattack"] = sum(full.values())
    print(json.dumps({"model": arch, "floor_s": t_floor, "apgd_iteration_s": per_ce, "apgd_t_iteration_s": per_dlr,
                      "square_query_s": per_q, "differences_s": diffs, "timings_s": {"apgd": ce, "apgd_t": dlr,
                                                                                   "square": sq},
                      "per_image_s": full,
                      "per_image_x_floor": {k: v / t_floor for k, v in full.items()},
                      "loadavg": open("/proc/loadavg").read().split()[:3]}))


if __name__ == "__main__":
    main()
