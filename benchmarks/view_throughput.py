"""Images per second that ONE loader worker makes: JPEG decode + the views (`shiftlab.views`).

ImageNet-R's images are mostly around 500x400 JPEGs; the script writes such files (a smooth
random image plus pixel noise, so that the JPEG carries realistic detail and file size), then
decodes each and draws its views exactly as a `shiftlab run` loader worker does, in one
thread. It reports wall-clock and CPU seconds per image (on a shared machine the CPU time is
the steadier estimate of what a free core does) and, for a model speed given in images per
second (`--model-ips`), how many such workers keep the model fed.

    PYTHONPATH=src python benchmarks/view_throughput.py                    # 64 views, 500x400, 16 images
    PYTHONPATH=src python benchmarks/view_throughput.py --augmix --json    # C-TPT/TDA's AugMix views
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from shiftlab.synthetic import random_image
from shiftlab.views.generator import ViewConfig, ViewGenerator


def write_jpegs(folder: Path, n: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    paths = []
    for i in range(n):
        rng = np.random.default_rng(seed + i)
        base = np.asarray(random_image(size, seed=seed + i), dtype=np.int16)
        noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        path = folder / f"img_{i:04d}.jpg"
        Image.fromarray(noisy, "RGB").save(path, format="JPEG", quality=90)
        paths.append(path)
    return paths


def measure(paths: list[Path], views: ViewGenerator, reps: int) -> dict:
    wall, cpu = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        for sid, path in enumerate(paths):
            with Image.open(path) as img:
                out = views(img, sid)
            assert out.shape[0] == views.config.n_views
        wall.append((time.perf_counter() - w0) / len(paths))
        cpu.append((time.process_time() - c0) / len(paths))
    return {"wall_seconds_per_image": statistics.median(wall), "wall_spread": [min(wall), max(wall)],
            "cpu_seconds_per_image": statistics.median(cpu), "cpu_spread": [min(cpu), max(cpu)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--views", type=int, default=64)
    p.add_argument("--size", default="500x400", help="JPEG size WxH")
    p.add_argument("--view-size", type=int, default=224)
    p.add_argument("--augmix", action="store_true")
    p.add_argument("--model-ips", type=float, default=None,
                   help="model speed in images/s: report the workers needed to feed it")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)   # a DataLoader worker runs one thread
    w, h = (int(v) for v in args.size.lower().split("x"))
    views = ViewGenerator(ViewConfig(n_views=args.views, size=args.view_size, augmix=args.augmix), seed=0)
    with tempfile.TemporaryDirectory(prefix="shiftlab-views-") as tmp:
        paths = write_jpegs(Path(tmp), args.images, (w, h))
        kib = statistics.mean(p.stat().st_size for p in paths) / 1024
        measure(paths[:2], views, 1)   # warm-up
        result = measure(paths, views, args.reps)
    result |= {"images": args.images, "reps": args.reps, "views": args.views, "jpeg_size": [w, h],
               "mean_jpeg_kib": kib, "augmix": args.augmix, "torch": torch.__version__,
               "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    result["images_per_second_per_worker_cpu"] = 1 / result["cpu_seconds_per_image"]
    result["images_per_second_per_worker_wall"] = 1 / result["wall_seconds_per_image"]
    if args.model_ips:
        result["model_images_per_second"] = args.model_ips
        result["workers_needed"] = math.ceil(args.model_ips * result["cpu_seconds_per_image"])
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"decode + {args.views} views{' (AugMix)' if args.augmix else ''} of {w}x{h} JPEGs "
              f"(~{kib:.0f} KiB), one thread: {result['cpu_seconds_per_image'] * 1000:.1f} ms CPU / image "
              f"({result['images_per_second_per_worker_cpu']:.1f} img/s/worker; wall "
              f"{result['wall_seconds_per_image'] * 1000:.1f} ms, load {result['loadavg']})")
        if args.model_ips:
            print(f"workers to feed {args.model_ips:g} img/s: {result['workers_needed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
