"""PromptAlign's cost per image against the floor (its views through the frozen CLIP image tower, no gradient).

    PYTHONPATH=src:tests python benchmarks/promptalign_cost.py --model ViT-B-16 --views 8 --images 2

Random weights (nothing downloaded), ImageNet-R's 200 classes, 224 px, float32, one thread; a MaPLe checkpoint and
ImageNet statistics that are seeded random stand-ins in their formats (tests/fixtures/golden/promptalign/driver.py:
depth 9, (12, 199, 768)), the DG config otherwise (depth 3, one step). Per image: one step (the 200-class text tower
with the deep text prompts and the prompted image tower over the views, forward and backward), then view 0 and the
text tower again with the tuned prompts.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import torch

import shiftlab
from shiftlab import ClassHeads
from shiftlab.datasets.specs import classnames

DRIVER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "golden" / "promptalign" / "driver.py"


def stand_in_files(folder: Path, blocks: int, tokens: int, vision_width: int, text_width: int) -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("promptalign_driver", DRIVER)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    for name, value in driver.stand_in_statistics(blocks, tokens, vision_width).items():
        torch.save(value, folder / f"ImgNetpre_vis_{name}.pt")
    torch.save(driver.stand_in_checkpoint(2, text_width, vision_width), folder / "model.pth.tar-2")
    return {"means": str(folder / "ImgNetpre_vis_means.pt"), "vars": str(folder / "ImgNetpre_vis_vars.pt"),
            "prompts": str(folder / "model.pth.tar-2")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ViT-B-16")
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--images", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = {"ViT-B-16": "ViT-B-16-quickgelu"}.get(args.model, args.model)
    model = shiftlab.load_model(arch, None)
    names = classnames("imagenet-r")
    heads = ClassHeads(model, names)
    visual = model.clip.visual
    files = stand_in_files(Path(tempfile.mkdtemp()), len(visual.transformer.resblocks),
                           visual.positional_embedding.shape[0] + 2, visual.conv1.out_channels,
                           model.clip.token_embedding.weight.shape[1])
    method = shiftlab.create_method("promptalign", model, names, heads=heads, views=args.views, **files)
    gen = torch.Generator().manual_seed(0)
    views = [model.normalize(torch.rand(args.views, 3, 224, 224, generator=gen)) for _ in range(args.images)]
    t0 = time.perf_counter()
    for v in views:
        model.encode_views(v)
    floor = (time.perf_counter() - t0) / args.images
    t0 = time.perf_counter()
    for v in views:
        method.predict(v)
    per_image = (time.perf_counter() - t0) / args.images
    print(json.dumps({"model": arch, "views": args.views, "images": args.images, "floor_s": floor,
                      "promptalign_s": per_image, "ratio": per_image / floor,
                      "loadavg": open("/proc/loadavg").read().split()[:3]}))


if __name__ == "__main__":
    main()
