"""Decoding one image file into an 8-bit RGB PIL image, or a clear ``ImageDecodeError``.

Every failure mode seen in scraped datasets becomes either a correct RGB image or an
``ImageDecodeError`` whose message names the file and the reason, so the engine can write an
error record and move on instead of crashing (or, worse, silently feeding garbage pixels).

Decisions:
- Transparency (RGBA, LA, PA, palette or grayscale/RGB images with a tRNS colour) is composited
  onto a WHITE background, which is how the images look in a browser/viewer, where the labels
  were assigned. Dropping alpha instead would expose whatever colour hides under transparent
  pixels (often black).
- 16-bit (and 32-bit integer) grayscale is rescaled linearly from 0..65535 to 0..255 (so 16-bit
  white stays white); Pillow's own ``convert("L")`` clips instead, turning most pixels white.
- Oversized images (more than ``max_pixels``): JPEGs are decoded at a reduced DCT scale
  (1/2, 1/4 or 1/8 via ``Image.draft``), which is cheap and keeps the whole picture; any other
  format raises ``ImageDecodeError`` ("too large") rather than allocating gigabytes. Pillow's own
  global limit (``Image.MAX_IMAGE_PIXELS``, 2x of which raises ``DecompressionBombError`` at open)
  still applies on top and is reported the same way; this module never changes Pillow globals.
- Truncated files are errors: ``ImageFile.LOAD_TRUNCATED_IMAGES`` is never set.
- EXIF orientation is applied; a corrupt EXIF block is ignored (orientation left as stored),
  because the pixels themselves decoded fine.
- Animated images (GIF/WebP): the first frame.
"""
from __future__ import annotations

import io
import math
import os
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["ImageDecodeError", "decode_image", "decode_image_bytes", "DEFAULT_MAX_PIXELS"]

# Same default as Pillow's Image.MAX_IMAGE_PIXELS (~89 Mpx, ~256 MiB as RGB). ImageNet-R's largest
# images are far below it; anything above is almost certainly a bomb or a scan we must downscale.
DEFAULT_MAX_PIXELS = 89_478_485

_BACKGROUND = (255, 255, 255)


class ImageDecodeError(ValueError):
    """An image file could not be turned into RGB pixels. ``path`` and ``reason`` are attributes. A
    ValueError: what the library raises for an input it cannot use."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{reason}: {self.path}")


def decode_image(path: str | os.PathLike, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode ``path`` fully into an 8-bit RGB image (EXIF orientation applied).

    ``max_pixels``: width x height limit after decoding; JPEGs above it are decoded at a reduced
    scale (aspect ratio kept, size divided by 2, 4 or 8), other formats raise. ``None`` disables the
    check (Pillow's global bomb limit still applies). Raises ``ImageDecodeError`` for anything that
    is not a complete, decodable image.
    """
    path = Path(path)
    try:
        nbytes = path.stat().st_size
    except FileNotFoundError:
        raise ImageDecodeError(path, "file not found") from None
    except OSError as exc:
        raise ImageDecodeError(path, f"cannot read file ({exc.strerror or exc})") from exc
    if path.is_dir():
        raise ImageDecodeError(path, "a directory, not an image file")
    if nbytes == 0:
        raise ImageDecodeError(path, "empty file (0 bytes)")
    return _decode(path, path, max_pixels)


def decode_image_bytes(data: bytes, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    """``decode_image`` for an encoded image held in memory (a member of a tar shard, a parquet cell);
    ``name`` is where it came from, for the error message."""
    if not data:
        raise ImageDecodeError(name, "empty file (0 bytes)")
    return _decode(io.BytesIO(data), Path(name), max_pixels)


def _decode(source: Path | io.BytesIO, path: Path, max_pixels: int | None) -> Image.Image:
    fmt = "unknown format"   # what the message says when Image.open itself fails
    try:
        with Image.open(source) as im:
            fmt = im.format or "unknown format"
            _limit_size(im, path, max_pixels)
            im.load()  # decode every pixel now, so truncation/corruption surfaces here
            image = _to_rgb(_apply_exif_orientation(im), path)
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(path, f"too large, refused as a decompression bomb ({exc})") from exc
    except UnidentifiedImageError:
        raise ImageDecodeError(path, "not a recognised image format") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        # Pillow signals truncated/corrupt data with OSError ("image file is truncated"),
        # SyntaxError (bad headers in some plugins) or ValueError.
        reason = str(exc) or type(exc).__name__
        kind = "truncated" if "truncat" in reason.lower() or isinstance(exc, EOFError) else "corrupt"
        raise ImageDecodeError(path, f"{kind} {fmt} image ({reason})") from exc
    return image


def _apply_exif_orientation(im: Image.Image) -> Image.Image:
    # Before the colour conversion: compositing on white drops the EXIF block.
    try:
        return ImageOps.exif_transpose(im)
    except Exception:  # noqa: BLE001 - a malformed EXIF block must not cost us a good image
        return im


def _limit_size(im: Image.Image, path: Path, max_pixels: int | None) -> None:
    """Shrink an oversized JPEG via DCT scaling before decoding, or refuse an oversized image."""
    width, height = im.size
    if max_pixels is None or width * height <= max_pixels:
        return
    if im.format == "JPEG":
        for factor in (2, 4, 8):  # the DCT scales libjpeg supports
            if math.ceil(width / factor) * math.ceil(height / factor) <= max_pixels:
                # draft() picks the largest scale whose result is >= the requested size; asking for
                # floor(size / factor) guarantees it picks at least `factor`.
                im.draft("RGB", (max(1, width // factor), max(1, height // factor)))
                if im.size[0] * im.size[1] <= max_pixels:
                    return
                break
    raise ImageDecodeError(
        path, f"too large: {width}x{height} = {width * height} pixels > max_pixels={max_pixels}"
        + (" even at 1/8 JPEG scale" if im.format == "JPEG" else ""))


def _on_white(rgba: Image.Image) -> Image.Image:
    background = Image.new("RGBA", rgba.size, _BACKGROUND + (255,))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _to_rgb(im: Image.Image, path: Path) -> Image.Image:
    mode = im.mode
    if mode == "RGB" and "transparency" not in im.info:
        return im.copy()
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info:
        # Palette/L/RGB images with a tRNS entry become RGBA through convert(), which honours it.
        return _on_white(im.convert("RGBA"))
    if mode.startswith("I;16") or mode == "I":
        return _high_bit_depth_gray(im, path)
    if mode == "F":
        import numpy as np  # here: listing a dataset (this module's other users) needs no numpy
        values = np.asarray(im, dtype=np.float64)
        # Float images in [0, 1] are the common convention; otherwise assume an 8-bit scale.
        scale = 255.0 if values.size and np.nanmax(values) <= 1.0 else 1.0
        gray = np.clip(np.nan_to_num(values * scale), 0, 255).round().astype(np.uint8)
        return Image.fromarray(gray, "L").convert("RGB")
    try:
        # P, L, 1, CMYK (Pillow undoes Adobe's inverted CMYK for JPEG), YCbCr, ...
        return im.convert("RGB")
    except (ValueError, OSError) as exc:
        raise ImageDecodeError(path, f"unsupported colour mode {mode!r} ({exc})") from exc


def _high_bit_depth_gray(im: Image.Image, path: Path) -> Image.Image:
    import numpy as np
    values = np.asarray(im).astype(np.int64)
    if im.mode.startswith("I;16"):
        full_scale = 65535
    else:
        # Mode "I" holds 32-bit ints; in practice it comes from 16-bit sources (PNG/TIFF), so use
        # 65535 unless the values prove otherwise.
        peak = int(values.max()) if values.size else 0
        full_scale = 65535 if peak <= 65535 else (1 << 31) - 1
    if values.size and values.min() < 0:
        raise ImageDecodeError(path, f"unsupported signed grayscale data (mode {im.mode})")
    gray = (values * 255 + full_scale // 2) // full_scale  # rounded, exact: 65535 -> 255
    return Image.fromarray(gray.astype(np.uint8), "L").convert("RGB")
