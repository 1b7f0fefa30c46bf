"""Tiny synthetic datasets on disk for the tests (import as ``from _synthetic import ...``).

``make_imagenet_r`` and ``random_image`` are the package's own (``shiftlab.synthetic``, also used by
``shiftlab demo``); ``make_image_folder`` writes a generic ``<root>/<folder>/img_<k>.<ext>`` tree
(imagefolder, or ImageNet-V2's ``0``..``999`` folders). Images are deterministic for a given seed.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from shiftlab.synthetic import RENDITIONS, make_imagenet_r, random_image

__all__ = ["RENDITIONS", "make_imagenet_r", "make_image_folder", "random_image"]


def make_image_folder(root: str | Path, folders: Sequence[str], per_class: int = 1,
                      size: tuple[int, int] = (40, 30), seed: int = 0, image_format: str = "png") -> Path:
    """Write ``root/<folder>/img_<k>.<image_format>`` for each folder; return ``root``."""
    root = Path(root)
    for index, name in enumerate(folders):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            buf = io.BytesIO()
            image = random_image(size, seed * 1_000_003 + index * 1000 + k)
            image.save(buf, format="JPEG" if image_format in ("jpg", "jpeg") else image_format.upper(), quality=90)
            (folder / f"img_{k}.{image_format}").write_bytes(buf.getvalue())
    return root


# ------------------------------------------------------------------ cross-dataset sets (CoOp splits)
# Where each set's images live under the data root, in the three layouts shiftlab finds on its own:
# CoOp's DATASETS.md, TPT's ID_to_DIRNAME (+ data/fewshot_datasets.py's image sub-folder), and
# CLIP_benchmark's `--dataset_root root/{dataset}` with torchvision's folders inside.
SPLIT_LAYOUTS = {
    "coop": {"flowers102": "oxford_flowers/jpg", "dtd": "dtd/images", "oxford-pets": "oxford_pets/images",
             "stanford-cars": "stanford_cars", "ucf101": "ucf101/UCF-101-midframes",
             "caltech101": "caltech-101/101_ObjectCategories", "food101": "food-101/images",
             "sun397": "sun397/SUN397", "fgvc-aircraft": "fgvc_aircraft", "eurosat": "eurosat/2750"},
    "tpt": {"flowers102": "Flower102/jpg", "dtd": "DTD/images", "oxford-pets": "OxfordPets",
            "stanford-cars": "StanfordCars", "ucf101": "UCF101", "caltech101": "Caltech101",
            "food101": "Food101/images", "sun397": "SUN397", "fgvc-aircraft": "fgvc_aircraft", "eurosat": "eurosat"},
    "clip_benchmark": {"flowers102": "flowers/flowers-102/jpg", "dtd": "dtd/dtd/dtd/images",
                       "oxford-pets": "pets/oxford-iiit-pet/images", "stanford-cars": "cars/stanford_cars",
                       "caltech101": "caltech101/caltech101/101_ObjectCategories",
                       "food101": "food101/food-101/images", "sun397": "sun397/SUN397",
                       "fgvc-aircraft": "fgvc_aircraft/fgvc-aircraft-2013b/data", "eurosat": "eurosat/eurosat/2750"},
}


def make_split_dataset(root: str | Path, name: str, layout: str = "coop", split_dir: str | None = None,
                       with_images: Sequence[int] | None = None, real_images: bool = False) -> tuple[Path, list]:
    """Write a stand-in of cross-dataset set ``name`` under data root ``root`` in ``layout``.

    The test split has the real test size with labels assigned round-robin; the first test image of each
    label in ``with_images`` (default: every label) is written (tiny bytes, or a real PNG when
    ``real_images``). The split file goes into the set's folder (CoOp) or ``root/<split_dir>``.
    Returns (image folder, [(relative path, label), ...] of the whole listed split).
    """
    import json

    from shiftlab.datasets import DATASETS
    spec = DATASETS.get(name)
    image_dir = Path(root) / SPLIT_LAYOUTS[layout][spec.name]
    n, size = spec.num_classes, spec.split.test_size
    if spec.split.split_file is None:  # FGVCAircraft: images/<id>.jpg listed in images_variant_test.txt
        from shiftlab.datasets import classnames
        names = classnames(spec.name)
        listed = [(f"images/{1000000 + k}.jpg", k % n) for k in range(size)]
        image_dir.mkdir(parents=True, exist_ok=True)
        (image_dir / "images_variant_test.txt").write_text(
            "".join(f"{1000000 + k} {names[k % n]}\n" for k in range(size)))
    else:
        listed = [(f"c{k % n:03d}/img_{k // n:05d}.jpg", k % n) for k in range(size)]
        split = {"train": [], "val": [], "test": [[p, label, f"class{label}"] for p, label in listed]}
        place = image_dir.parent if layout == "coop" and split_dir is None else Path(root) / (split_dir or "")
        if layout == "coop" and split_dir is None and spec.name == "stanford-cars":
            place = image_dir  # stanford_cars/ is both the set's folder and its image folder
        place.mkdir(parents=True, exist_ok=True)
        (place / spec.split.split_file).write_text(json.dumps(split))
    wanted = set(range(n)) if with_images is None else set(with_images)
    for rel, label in listed:
        if label in wanted:
            wanted.discard(label)
            path = image_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if real_images:
                random_image((48, 40), label).save(path, format="PNG")
            else:
                path.write_bytes(b"x")
    return image_dir, listed
