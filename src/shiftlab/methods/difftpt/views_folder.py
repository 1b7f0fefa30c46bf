"""The folder of diffusion-generated views DiffTPT reads (torch-free: a run plan checks it before torch is imported).

Layout (written by tools/generate_diffusion_views.py, or by hand in the same shape)::

    DIR/manifest.json     {"format": 1, "image_size": S, "generator": {...what made the views...},
                           "images": {KEY: {"source": "the test image, as a person reads it",
                                            "views": [SHA-256 of KEY/0.png, of KEY/1.png, ...]}}}
    DIR/KEY/0.png, DIR/KEY/1.png, ...   the generated views of one test image, in generation order

KEY is `view0_key`: the first 16 hex of the SHA-256 of the test image's view 0 as the model sees it (the centre
crop at the model's input size S, 8-bit RGB, channels first), so a run finds an image's views from its pixels alone,
whichever dataset layout it came from, and a feature store can hold their encoding like any frozen feature. The
folder's identity (what a run records, and a feature store's key) is the SHA-256 of manifest.json, which names every
view's SHA-256; a view that does not match its manifest entry is refused when read (in a run: DiffTPT's error
record for that image, naming the file; the other images and methods go on).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT = 1


class ViewsFolderError(ValueError):
    """A diffusion-views folder that cannot be read as the layout says (one line)."""


def view0_key(pixels_u8: bytes) -> str:
    """The folder key of a test image: its view 0's 8-bit RGB pixels (3, S, S), channels first, as bytes."""
    return hashlib.sha256(pixels_u8).hexdigest()[:16]


def manifest_path(folder: str | Path) -> Path:
    return Path(folder).expanduser() / MANIFEST


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The folder's manifest, checked for its shape; ViewsFolderError in one line otherwise."""
    path = manifest_path(folder)
    if not Path(folder).expanduser().is_dir():
        raise ViewsFolderError(f"{folder}: no such folder of diffusion views")
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ViewsFolderError(f"{path}: missing; a diffusion-views folder holds a {MANIFEST} "
                               "(tools/generate_diffusion_views.py writes one)") from None
    except (OSError, ValueError) as exc:
        raise ViewsFolderError(f"{path}: unreadable ({exc})") from None
    images = manifest.get("images") if isinstance(manifest, dict) else None
    if (not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(images, dict)
            or not isinstance(manifest.get("image_size"), int)
            or not all(isinstance(v, dict) and isinstance(v.get("views"), list) for v in images.values())):
        raise ViewsFolderError(f"{path}: not a diffusion-views manifest of format {FORMAT} (format, image_size, "
                               "images: {key: {source, views}})")
    return manifest


def folder_digest(folder: str | Path) -> str:
    """The SHA-256 of the folder's manifest: its identity (the manifest names each view's SHA-256)."""
    return hashlib.sha256(manifest_path(folder).read_bytes()).hexdigest()


def fewest_views(manifest: dict[str, Any]) -> int:
    """The smallest number of views the manifest holds for one image (0 for an empty folder)."""
    return min((len(entry["views"]) for entry in manifest["images"].values()), default=0)
