"""The PNG decoder (compiler/quant/images.py) against PNG files built here with zlib and
struct, including every row filter (encoded by the reference filters below, written from the
PNG specification), every supported colour type, 16-bit samples, and each refusal."""

from __future__ import annotations

import re
import struct
import zlib

import numpy as np
import pytest

from npuemu.compiler.quant.images import ImageError, decode_png, encode_png, read_image

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chunk(kind: bytes, body: bytes, *, crc: int | None = None) -> bytes:
    value = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", value)


def header(width: int, height: int, depth: int = 8, color: int = 2, interlace: int = 0) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, interlace))


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def filter_row(kind: int, row: bytes, previous: bytes, bpp: int) -> bytes:
    """The encoder side of the five PNG filters (spec section 9.2)."""
    out = bytearray()
    for i, value in enumerate(row):
        a = row[i - bpp] if i >= bpp else 0
        b = previous[i]
        c = previous[i - bpp] if i >= bpp else 0
        predictor = [0, a, b, (a + b) // 2, paeth(a, b, c)][kind]
        out.append((value - predictor) % 256)
    return bytes([kind]) + bytes(out)


def build_png(pixels: np.ndarray, color: int, depth: int = 8, filters: list[int] | None = None,
              extra: bytes = b"") -> bytes:
    """PNG bytes for ``pixels`` (H, W, samples) of uint8 or uint16, one filter per row."""
    height, width = pixels.shape[:2]
    raw_rows = [pixels[y].astype(">u2" if depth == 16 else np.uint8).tobytes() for y in range(height)]
    bpp = max(1, pixels.shape[2] * depth // 8)
    previous = bytes(len(raw_rows[0]))
    data = b""
    for y, row in enumerate(raw_rows):
        data += filter_row((filters or [0])[y % len(filters or [0])], row, previous, bpp)
        previous = row
    return SIGNATURE + header(width, height, depth, color) + extra + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")


@pytest.fixture
def rgb() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (7, 5, 3), dtype=np.uint8)


@pytest.mark.parametrize("kind", [0, 1, 2, 3, 4])
def test_each_filter_type(rgb, kind):
    assert np.array_equal(decode_png(build_png(rgb, 2, filters=[kind])), rgb)


def test_filters_mixed_per_row(rgb):
    assert np.array_equal(decode_png(build_png(rgb, 2, filters=[4, 3, 1, 0, 2])), rgb)


@pytest.mark.parametrize("color,samples", [(0, 1), (4, 2), (2, 3), (6, 4)])
def test_colour_types(color, samples):
    pixels = np.random.default_rng(color).integers(0, 256, (4, 6, samples), dtype=np.uint8)
    decoded = decode_png(build_png(pixels, color, filters=[4, 1]))
    assert decoded.shape == (4, 6, samples) and decoded.dtype == np.uint8
    assert np.array_equal(decoded, pixels)


def test_sixteen_bit_keeps_the_high_byte():
    pixels = np.random.default_rng(1).integers(0, 65536, (3, 4, 3), dtype=np.uint16)
    decoded = decode_png(build_png(pixels, 2, depth=16, filters=[1, 4, 3]))
    assert np.array_equal(decoded, (pixels >> 8).astype(np.uint8))


def test_palette_with_transparency():
    palette = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255]], dtype=np.uint8)
    indices = np.array([[0, 1, 2], [2, 1, 0]], dtype=np.uint8)[:, :, None]
    extra = chunk(b"PLTE", palette.tobytes()) + chunk(b"tRNS", bytes([255, 128]))
    decoded = decode_png(build_png(indices, 3, extra=extra))
    assert np.array_equal(decoded[:, :, :3], palette[indices[:, :, 0]])
    assert decoded[:, :, 3].tolist() == [[255, 128, 255], [255, 128, 255]]  # entries past tRNS are opaque


def test_our_encoder_round_trips(rgb):
    assert np.array_equal(decode_png(encode_png(rgb)), rgb)
    gray = rgb[:, :, 0]
    assert np.array_equal(decode_png(encode_png(gray))[:, :, 0], gray)


def test_idat_split_over_chunks(rgb):
    whole = build_png(rgb, 2)
    start = whole.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", whole[start:start + 4])
    data = whole[start + 8:start + 8 + length]
    split = whole[:start] + chunk(b"IDAT", data[:5]) + chunk(b"IDAT", data[5:]) + whole[start + 12 + length:]
    assert np.array_equal(decode_png(split), rgb)


def _bad(rgb: np.ndarray, what: str) -> bytes:
    good = build_png(rgb, 2)
    if what == "signature":
        return b"GIF89a" + good[6:]
    if what == "crc":
        return SIGNATURE + header(5, 7)[:-4] + b"\x00\x00\x00\x00" + good[len(SIGNATURE) + 25:]
    if what == "truncated":
        return good[:-20]
    if what == "interlaced":
        return SIGNATURE + header(5, 7, interlace=1) + good[len(SIGNATURE) + 25:]
    if what == "depth":
        return SIGNATURE + header(5, 7, depth=4, color=0) + good[len(SIGNATURE) + 25:]
    if what == "color":
        return SIGNATURE + header(5, 7, color=5) + good[len(SIGNATURE) + 25:]
    if what == "no_idat":
        return SIGNATURE + header(5, 7) + chunk(b"IEND", b"")
    if what == "short_data":
        return SIGNATURE + header(5, 8) + good[len(SIGNATURE) + 25:]
    if what == "filter":
        data = bytearray(zlib.decompress(good[good.index(b"IDAT") + 4:good.index(b"IEND") - 8]))
        data[0] = 9
        return SIGNATURE + header(5, 7) + chunk(b"IDAT", zlib.compress(bytes(data))) + chunk(b"IEND", b"")
    if what == "zlib":
        return SIGNATURE + header(5, 7) + chunk(b"IDAT", b"not deflate") + chunk(b"IEND", b"")
    if what == "palette":
        return build_png(np.zeros((2, 2, 1), np.uint8), 3)
    raise AssertionError(what)


@pytest.mark.parametrize("what,message", [
    ("signature", "not a PNG file"),
    ("crc", "bad CRC"),
    ("truncated", "runs past the end"),
    ("interlaced", "interlaced (Adam7) PNG is not supported"),
    ("depth", "bit depth 4"),
    ("color", "colour type 5"),
    ("no_idat", "no IDAT"),
    ("short_data", "rows of 1 + 15 expected"),
    ("filter", "filter type 9"),
    ("zlib", "does not decompress"),
    ("palette", "no valid PLTE"),
])
def test_refusals_say_why(rgb, what, message):
    with pytest.raises(ImageError, match=re.escape(message)):
        decode_png(_bad(rgb, what))


def test_read_image_by_suffix(tmp_path, rgb):
    path = tmp_path / "a.PNG"
    path.write_bytes(encode_png(rgb))
    assert np.array_equal(read_image(path), rgb)
    with pytest.raises(ImageError, match="unsupported image type '.gif'"):
        read_image(tmp_path / "a.gif")
