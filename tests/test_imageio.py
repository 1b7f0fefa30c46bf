"""decode_image on every kind of bad or unusual image file."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from _synthetic import random_image
from shiftlab.datasets.imageio import ImageDecodeError, decode_image


def _jpeg_bytes(image: Image.Image, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=95, **kwargs)
    return buffer.getvalue()


def _write(path, image: Image.Image, fmt: str, **kwargs):
    image.save(path, fmt, **kwargs)
    return path


def _decode_error(path, **kwargs) -> str:
    with pytest.raises(ImageDecodeError) as info:
        decode_image(path, **kwargs)
    message = str(info.value)
    assert str(path) in message and info.value.path == str(path)
    return info.value.reason


def test_plain_rgb_jpeg_round_trip(tmp_path):
    path = _write(tmp_path / "a.jpg", random_image((40, 30)), "JPEG", quality=95)
    image = decode_image(path)
    assert image.mode == "RGB" and image.size == (40, 30)
    diff = np.abs(np.asarray(image, dtype=int) - np.asarray(random_image((40, 30)), dtype=int))
    assert diff.mean() < 6


def test_zero_byte_file(tmp_path):
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    assert "empty file" in _decode_error(path)


def test_missing_file(tmp_path):
    assert "not found" in _decode_error(tmp_path / "missing.jpg")


def test_text_file_named_jpg(tmp_path):
    path = tmp_path / "fake.jpg"
    path.write_text("<html>404 Not Found</html>")
    assert "not a recognised image" in _decode_error(path)


def test_truncated_jpeg_is_an_error(tmp_path):
    data = _jpeg_bytes(random_image((200, 150), seed=3))
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) // 2])
    assert "truncated" in _decode_error(path)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False  # never switched on globally


def test_truncated_png_is_an_error(tmp_path):
    buffer = io.BytesIO()
    random_image((200, 150), seed=4).save(buffer, "PNG")
    path = tmp_path / "cut.png"
    path.write_bytes(buffer.getvalue()[:-200])
    reason = _decode_error(path)
    assert "PNG" in reason


def test_cmyk_jpeg_becomes_rgb(tmp_path):
    source = Image.new("RGB", (32, 24), (200, 30, 40))
    path = _write(tmp_path / "cmyk.jpg", source.convert("CMYK"), "JPEG", quality=95)
    assert Image.open(path).mode == "CMYK"
    image = decode_image(path)
    assert image.mode == "RGB" and image.size == (32, 24)
    assert np.allclose(np.asarray(image)[12, 16], (200, 30, 40), atol=8)


def test_palette_png_with_transparency_on_white(tmp_path):
    image = Image.new("P", (10, 10), 0)
    image.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)  # index 0 black, index 1 blue
    image.paste(1, (0, 0, 5, 10))
    path = _write(tmp_path / "pal.png", image, "PNG", transparency=0)
    decoded = np.asarray(decode_image(path))
    assert decoded.shape == (10, 10, 3)
    assert tuple(decoded[0, 0]) == (0, 0, 255)  # opaque blue stays blue
    assert tuple(decoded[0, 9]) == (255, 255, 255)  # transparent black becomes white, not black


def test_rgba_and_la_composited_on_white(tmp_path):
    rgba = np.zeros((4, 6, 4), dtype=np.uint8)
    rgba[:, :3] = (255, 0, 0, 255)  # opaque red
    rgba[:, 3:] = (0, 0, 0, 0)  # fully transparent black
    rgba[0, 5] = (0, 0, 0, 128)  # half-transparent black -> mid grey
    decoded = np.asarray(decode_image(_write(tmp_path / "a.png", Image.fromarray(rgba, "RGBA"), "PNG")))
    assert tuple(decoded[1, 0]) == (255, 0, 0) and tuple(decoded[1, 4]) == (255, 255, 255)
    assert np.allclose(decoded[0, 5], 127, atol=2)
    la = Image.fromarray(np.stack([np.zeros((4, 6), np.uint8), np.full((4, 6), 0, np.uint8)], -1), "LA")
    decoded = np.asarray(decode_image(_write(tmp_path / "la.png", la, "PNG")))
    assert (decoded == 255).all()


def test_16_bit_grayscale_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257 * 64, 32768, 65535]], dtype=np.uint16).repeat(3, axis=0)
    path = _write(tmp_path / "g16.png", Image.fromarray(values), "PNG")
    assert Image.open(path).mode.startswith("I")
    decoded = np.asarray(decode_image(path))
    assert decoded.shape == (3, 4, 3) and decoded.dtype == np.uint8
    assert list(decoded[0, :, 0]) == [0, 64, 128, 255]  # 16-bit white stays white, mid-grey stays mid
    assert (decoded[..., 0] == decoded[..., 2]).all()


def test_32_bit_integer_gray_from_16_bit_source(tmp_path):
    values = np.array([[0, 65535]], dtype=np.int32)
    path = _write(tmp_path / "i32.tif", Image.fromarray(values, "I"), "TIFF")
    assert list(np.asarray(decode_image(path))[0, :, 0]) == [0, 255]


def test_grayscale_and_bilevel_become_rgb(tmp_path):
    gray = Image.fromarray(np.array([[0, 100, 255]], dtype=np.uint8), "L")
    decoded = np.asarray(decode_image(_write(tmp_path / "l.png", gray, "PNG")))
    assert decoded.shape == (1, 3, 3) and list(decoded[0, :, 1]) == [0, 100, 255]
    bilevel = Image.new("1", (5, 5), 1)
    assert np.asarray(decode_image(_write(tmp_path / "b.png", bilevel, "PNG"))).min() == 255


def test_gif_first_frame(tmp_path):
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    decoded = np.asarray(decode_image(path))
    assert decoded.shape == (8, 8, 3) and tuple(decoded[0, 0]) == (255, 0, 0)


def test_exif_orientation_applied(tmp_path):
    image = Image.new("RGB", (40, 30), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 10, 30))  # white band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # stored image must be rotated 90 degrees clockwise for display
    path = tmp_path / "rot.jpg"
    path.write_bytes(_jpeg_bytes(image, exif=exif.tobytes()))
    decoded = decode_image(path)
    assert decoded.size == (30, 40)
    pixels = np.asarray(decoded, dtype=float)
    assert pixels[:8].mean() > 215 and pixels[-25:].mean() < 40  # clockwise: the left band is now on top


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_decompression_bomb_refused(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_header_only(100_000, 100_000))  # 10 Gpx declared in a few bytes
    reason = _decode_error(path)
    assert "too large" in reason


def test_oversized_png_refused_with_reason(tmp_path):
    path = _write(tmp_path / "big.png", random_image((400, 300)), "PNG")
    reason = _decode_error(path, max_pixels=10_000)
    assert "400x300" in reason and "max_pixels=10000" in reason


def test_oversized_jpeg_decoded_at_reduced_scale(tmp_path):
    path = _write(tmp_path / "big.jpg", random_image((400, 300)), "JPEG")
    image = decode_image(path, max_pixels=10_000)
    assert image.mode == "RGB" and image.size == (100, 75)  # 1/4 scale: 7,500 pixels
    assert decode_image(path, max_pixels=40_000).size == (200, 150)
    assert decode_image(path, max_pixels=None).size == (400, 300)
    assert "even at 1/8" in _decode_error(path, max_pixels=100)
