"""Generate DiffTPT's diffusion views of a folder of test images: the folder `--set difftpt.diffusion_views=DIR` reads
(its layout: src/shiftlab/methods/difftpt/views_folder.py).

    python tools/generate_diffusion_views.py --images DATASET_DIR --out VIEWS_DIR [--model RN50] [--n 63]
        [--guidance-scale 3] [--seed 0] [--device cuda]

What the authors' image_generator_R.py (chunmeifeng/DiffTPT@03f1169) does, per test image: diffusers'
StableDiffusionImageVariationPipeline from "lambdalabs/sd-image-variations-diffusers" revision "v2.0", fed the image
as a (224, 224) bicubic resize (no antialias) normalised with CLIP's mean and std, guidance scale 3, one call per
generated view (their --dfu_times 65, of which their loop reads the first 63: `--n`), the safety checker off. Each
test image's views go to VIEWS_DIR/KEY/<i>.png, KEY its view 0's key (`view0_key`: the centre crop at `--model`'s
input size, as shiftlab's runs draw it), and manifest.json names every view's SHA-256 (written last, after every view
is on disk; a rerun resumes: images already in the manifest are kept).

Needs diffusers (with transformers and accelerate) and the pipeline's weights (downloaded by diffusers, or in its
cache); neither ships with shiftlab. Without them it says so in one line and exits 1.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

PIPELINE, REVISION = "lambdalabs/sd-image-variations-diffusers", "v2.0"   # image_generator_R.py:75-76
MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def fail(message: str) -> None:
    print(f"generate_diffusion_views: error: {message}", file=sys.stderr)
    raise SystemExit(1)


def load_pipeline(device: str):
    """The authors' pipeline, or a one-line exit naming what is missing."""
    try:
        from diffusers import StableDiffusionImageVariationPipeline
    except ImportError as exc:
        fail(f"diffusers is not installed ({exc}); pip install diffusers transformers accelerate, then run again")
    try:
        pipe = StableDiffusionImageVariationPipeline.from_pretrained(PIPELINE, revision=REVISION)
    except Exception as exc:   # noqa: BLE001 - diffusers raises OSError, ValueError or its own errors for no weights
        reason = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"cannot load {PIPELINE} (revision {REVISION}): {reason}; download its weights (or point HF_HOME at a "
             "cache holding them) and run again")
    pipe.safety_checker = lambda images, clip_input: (images, False)    # image_generator_R.py:51
    return pipe.to(device)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", required=True, help="a folder of test images (searched recursively)")
    ap.add_argument("--out", required=True, help="the diffusion-views folder to write (or resume)")
    ap.add_argument("--model", default="RN50", help="the CLIP whose view 0 keys the images (its input size)")
    ap.add_argument("--n", type=int, default=63, help="views per image (their loop reads 63)")
    ap.add_argument("--guidance-scale", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0, help="torch's seed before each image's views")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    images_dir, out = Path(args.images).expanduser(), Path(args.out).expanduser()
    if not images_dir.is_dir():
        fail(f"{images_dir}: no such folder of test images")
    if args.n < 1:
        fail(f"--n must be >= 1, got {args.n}")
    pipe = load_pipeline(args.device)

    import torch
    from torchvision import transforms

    from shiftlab.datasets.base import IMAGE_EXTENSIONS
    from shiftlab.datasets.imageio import decode_image
    from shiftlab.methods.difftpt.views_folder import FORMAT, MANIFEST, view0_key
    from shiftlab.models.architectures import model_preprocess
    from shiftlab.views.generator import base_view, to_uint8_tensor
    from shiftlab.views.preprocess import Preprocess
    from shiftlab.writes import make_dirs, write_file

    cfg = model_preprocess(args.model)
    preprocess = Preprocess.from_open_clip(cfg, int(cfg["size"] if isinstance(cfg["size"], int) else cfg["size"][0]))
    resize = transforms.Resize((224, 224), interpolation=transforms.InterpolationMode.BICUBIC, antialias=False)
    tform = transforms.Compose([transforms.ToTensor(), resize, transforms.Normalize(MEAN, STD)])
    manifest_file = out / MANIFEST
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {
        "format": FORMAT, "image_size": preprocess.image_size,
        "generator": {"pipeline": PIPELINE, "revision": REVISION, "guidance_scale": args.guidance_scale,
                      "seed": args.seed, "input": "(224, 224) bicubic resize, CLIP mean/std (image_generator_R.py)",
                      "view0": {"model": args.model, "resize_mode": preprocess.resize_mode,
                                "interpolation": preprocess.interpolation}},
        "images": {}}
    paths = sorted(p for p in images_dir.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    for count, path in enumerate(paths):
        image = decode_image(path)
        key = view0_key(to_uint8_tensor(base_view(image, preprocess.image_size, preprocess)).numpy().tobytes())
        if key in manifest["images"] and len(manifest["images"][key]["views"]) >= args.n:
            continue
        make_dirs(out / key)
        torch.manual_seed(args.seed)
        shas = []
        with torch.no_grad():
            for i in range(args.n):
                batch = tform(image).unsqueeze(0).to(pipe.device)
                generated = pipe(batch, guidance_scale=args.guidance_scale).images[0]
                target = out / key / f"{i}.png"
                generated.save(target)
                shas.append(hashlib.sha256(target.read_bytes()).hexdigest())
        manifest["images"][key] = {"source": str(path.relative_to(images_dir)), "views": shas}
        write_file(manifest_file, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        print(f"{count + 1}/{len(paths)} {path.relative_to(images_dir)} -> {key}", flush=True)


if __name__ == "__main__":
    main()
