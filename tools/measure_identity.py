"""Measure what a feature store's content-digest identity costs: hashing a sample's JPEG vs decoding it
and encoding its views (docs/ARCHITECTURE.md, "Feature store").

    python tools/measure_identity.py [--model RN50-quickgelu] [--views 64] [--repeat 20]

A realistic 500x375 JPEG (quality 90, photographic noise + structure) is hashed (SHA-256 of its bytes,
read from the page cache), stat'ed (the `--trust-mtime` fast path), and decoded + turned into views +
encoded by the model with random weights (no download), per sample; the ratio is printed.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _jpeg(path: Path) -> None:
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    base = np.stack([np.sin(x / 17.0) * 60 + 128, np.cos(y / 23.0) * 60 + 128, (x + y) % 256 * 0.5 + 64], -1)
    img = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype("uint8")
    Image.fromarray(img).save(path, format="JPEG", quality=90)


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="RN50-quickgelu")
    p.add_argument("--views", type=int, default=64)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    import torch

    from shiftlab.datasets.imageio import decode_image
    from shiftlab.models import load_model
    from shiftlab.views.generator import ViewConfig, ViewGenerator
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sample.jpg"
        _jpeg(path)
        size = path.stat().st_size
        hash_s = _best(lambda: hashlib.sha256(path.read_bytes()).hexdigest(), args.repeat * 50)
        stat_s = _best(lambda: os.stat(path), args.repeat * 50)
        model = load_model(args.model, pretrained=None)
        gen = ViewGenerator(ViewConfig(n_views=args.views), seed=0, preprocess=model.preprocess)

        def decode_encode() -> None:
            views = gen(decode_image(path), 0)
            with torch.inference_mode():
                model.encode_views(views)
        decode_encode()   # warm-up
        enc_s = _best(decode_encode, max(2, args.repeat // 10) if args.views > 8 else args.repeat)
    print(f"{args.model}, {args.views} views, a {size / 1024:.0f} KiB 500x375 JPEG, torch threads "
          f"{torch.get_num_threads()}: sha256 {hash_s * 1e3:.3f} ms, stat {stat_s * 1e6:.1f} us, "
          f"decode+views+encode {enc_s * 1e3:.1f} ms; hashing is {enc_s / hash_s:,.0f}x cheaper")
    return 0


if __name__ == "__main__":
    sys.exit(main())
