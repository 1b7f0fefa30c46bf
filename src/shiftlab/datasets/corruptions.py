"""Common corruptions (Hendrycks & Dietterich, ICLR 2019, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations"): their names and severities, and the corruption of one image generated on the
fly with the `imagecorruptions` package, the reference implementation of their functions.

A generated corruption is deterministic per (run seed, sample id, corruption, severity): the functions draw
from numpy's global random state (and `glass_blur` / `impulse_noise` from a seed they are given), so each
sample's corruption runs under a seed derived from those four (`corruption_seed`), and the global state is
restored afterwards. The image is first brought to ImageNet-C's size as its authors made it (resize the
shorter side to 256, centre crop 224: `make_imagenet_c.py`), then corrupted; the views are drawn from that
corrupted 224 x 224 image, as they are from an ImageNet-C file.

Which package: `imagecorruptions` 1.1.2 on PyPI (2020) no longer runs on numpy >= 2 (`np.float_`) nor
scikit-image >= 0.19 (`multichannel`). shiftlab installs `imagecorruptions-imaug`, the maintained fork of the
same code (same module name, same functions and constants), whose only behavioural change is an explicit
`seed` for `glass_blur` (numba-compiled) and `impulse_noise`; shiftlab passes the per-sample seed there.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..options import name_of

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["COMMON", "EXTRA", "CORRUPTIONS", "SEVERITIES", "DEFAULT_SEVERITY", "IMAGENET_C_SIZE",
           "check_corruption", "corruption_seed", "corrupt_image", "prepare_like_imagenet_c", "parse_corruptions",
           "package_version", "describe"]

# The 15 corruptions of ImageNet-C's benchmark, in the paper's order (noise, blur, weather, digital), and the
# four "extra" ones its authors ship for validation (the `imagecorruptions` package's 'validation' subset).
COMMON = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
          "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression")
EXTRA = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
CORRUPTIONS = COMMON + EXTRA
SEVERITIES = (1, 2, 3, 4, 5)
DEFAULT_SEVERITY = 5          # the field's default: CLIPTTA's ttavlm/configuration.py `--severity` default [5]
IMAGENET_C_SIZE = (256, 224)  # make_imagenet_c.py: Resize(256), CenterCrop(224), then the corruption
_EXPLICIT_SEED = ("glass_blur", "impulse_noise")   # the fork's functions that take `seed=` instead of the global RNG


def check_corruption(name: str, severity: int) -> None:
    """ValueError (one line) unless `name` is a known corruption and `severity` one of 1..5."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int) or severity not in SEVERITIES:
        raise ValueError(f"corruption severity must be one of 1..5, got {severity!r}")


def parse_corruptions(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """`--corruptions a,b` (or 'common' / 'all' / None: the 15 common ones) as names, checked."""
    if text is None or text == "common":
        return COMMON
    if text == "all":
        return CORRUPTIONS
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if not names:
        raise ValueError(f"{name_of('corruptions')} needs at least one corruption name")
    for name in names:
        check_corruption(name, DEFAULT_SEVERITY)
    if len(set(names)) != len(names):
        raise ValueError(f"{name_of('corruptions')} lists a corruption twice: {','.join(names)}")
    return tuple(names)


def corruption_seed(seed: int, sample_id: int, corruption: str, severity: int) -> int:
    """A 32-bit seed (numpy's legacy `np.random.seed` range) from (run seed, sample id, corruption,
    severity): the same sample gets the same corruption in every process, worker and order."""
    text = f"{int(seed)}\t{int(sample_id)}\t{corruption}\t{int(severity)}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "little")


def prepare_like_imagenet_c(img: Image.Image) -> Image.Image:
    """Resize the shorter side to 256 (bilinear, torchvision's default) and centre crop 224, as ImageNet-C."""
    from PIL import Image as PILImage
    resize, crop = IMAGENET_C_SIZE
    img = img.convert("RGB")
    w, h = img.size
    scale = resize / min(w, h)
    size = (max(resize, int(w * scale)), max(resize, int(h * scale)))   # torchvision truncates the long side
    img = img.resize(size, PILImage.BILINEAR)
    left, top = int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))
    return img.crop((left, top, left + crop, top + crop))


def corrupt_image(img: Image.Image, corruption: str, severity: int, seed: int) -> Image.Image:
    """`imagecorruptions.corrupt(img, severity, corruption)` under `seed` (see `corruption_seed`), as an RGB
    uint8 image; numpy's global random state is restored afterwards."""
    import numpy as np
    from imagecorruptions import corrupt
    from PIL import Image as PILImage

    check_corruption(corruption, severity)
    array = np.asarray(img.convert("RGB"))
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        extra = {"seed": seed} if corruption in _EXPLICIT_SEED else {}
        out = corrupt(array, severity=severity, corruption_name=corruption, **extra)
    finally:
        np.random.set_state(state)
    return PILImage.fromarray(np.uint8(out))


def package_version() -> str | None:
    """The installed imagecorruptions distribution and version, for run.json ('imagecorruptions-imaug 1.1.5')."""
    from importlib import metadata
    for dist in ("imagecorruptions-imaug", "imagecorruptions"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def describe(corruption: str | None, severity: int | None) -> str:
    return f"{corruption} (severity {severity})" if corruption else "none"
