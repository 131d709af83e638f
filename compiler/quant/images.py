"""Reading calibration images: our own PNG decoder on zlib, JPEG through Pillow when present.

``read_image(path)`` returns an ``(H, W, C)`` uint8 array with C = 1 (gray), 2 (gray +
alpha), 3 (RGB) or 4 (RGBA), channels in the file's order (RGB, never BGR).

PNG (ISO/IEC 15948): every critical chunk is checked (signature, CRC, IHDR fields, IDAT
stream, IEND); bit depth 8 for gray, RGB, gray+alpha, RGBA and palette images, and 16 bits
for the non-palette types (reduced to 8 bits by dropping the low byte, as OpenCV's default
read does). Interlaced (Adam7) and 1/2/4-bit images raise :class:`ImageError` with the
reason; re-save them plainly or convert them to ``.npy``.

JPEG needs a full Huffman/IDCT decoder, which we do not write: it goes through Pillow, an
optional extra (``pip install 'npuemu[images]'``); without it the error says so.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Channels per pixel for PNG colour types 0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA.
PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
MAX_PIXELS = 1 << 28  # refuses absurd headers before allocating

JPEG_SUFFIXES = (".jpg", ".jpeg")
PNG_SUFFIXES = (".png",)
IMAGE_SUFFIXES = PNG_SUFFIXES + JPEG_SUFFIXES


class ImageError(Exception):
    """The file is not an image we can read; the message says why (no path: callers add it)."""


def read_image(path: Path) -> np.ndarray:
    """The image at ``path`` as (H, W, C) uint8, by its suffix (.png, .jpg, .jpeg)."""
    suffix = path.suffix.lower()
    if suffix in PNG_SUFFIXES:
        return decode_png(path.read_bytes())
    if suffix in JPEG_SUFFIXES:
        return read_jpeg(path)
    raise ImageError(f"unsupported image type '{suffix}'; expected {', '.join(IMAGE_SUFFIXES)}")


# ---- PNG -------------------------------------------------------------------------------------

def decode_png(data: bytes) -> np.ndarray:
    """Decode a PNG file's bytes into (H, W, C) uint8 (palette images expand to RGB/RGBA)."""
    if not data.startswith(PNG_SIGNATURE):
        raise ImageError("not a PNG file (bad signature)")
    chunks = list(_png_chunks(data))
    if not chunks or chunks[0][0] != b"IHDR":
        raise ImageError("PNG does not start with an IHDR chunk")
    width, height, depth, color, channels = _png_header(chunks[0][1])
    idat = b"".join(body for kind, body in chunks if kind == b"IDAT")
    if not idat:
        raise ImageError("PNG has no IDAT (image data) chunk")
    if chunks[-1][0] != b"IEND":
        raise ImageError("PNG is truncated (no IEND chunk)")
    bytes_per_pixel = channels * depth // 8
    stride = width * bytes_per_pixel
    try:
        raw = zlib.decompress(idat)
    except zlib.error as error:
        raise ImageError(f"PNG image data does not decompress: {error}") from None
    if len(raw) != height * (stride + 1):
        raise ImageError(f"PNG image data has {len(raw)} bytes; {height} rows of 1 + {stride} expected")
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, stride + 1)
    if rows[:, 0].max(initial=0) > 4:
        bad = int(np.argmax(rows[:, 0] > 4))
        raise ImageError(f"PNG row {bad} has filter type {rows[bad, 0]}; expected 0-4")
    pixels = _unfilter_jitted()(rows, bytes_per_pixel)
    if depth == 16:  # big-endian samples: keep the high byte
        pixels = pixels.reshape(height, width * channels, 2)[:, :, 0]
    image = pixels.reshape(height, width, channels)
    if color == 3:
        image = _apply_palette(image[:, :, 0], chunks)
    return np.ascontiguousarray(image)


def _png_chunks(data: bytes):
    offset = len(PNG_SIGNATURE)
    while offset < len(data):
        if offset + 8 > len(data):
            raise ImageError(f"PNG is truncated inside a chunk header at byte {offset}")
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        end = offset + 12 + length
        if end > len(data):
            raise ImageError(f"PNG chunk {kind!r} at byte {offset} runs past the end of the file")
        body = data[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length:end])
        if zlib.crc32(kind + body) != crc:
            raise ImageError(f"PNG chunk {kind!r} at byte {offset} has a bad CRC")
        yield kind, body
        if kind == b"IEND":
            return
        offset = end


def _png_header(body: bytes) -> tuple[int, int, int, int, int]:
    if len(body) != 13:
        raise ImageError(f"PNG IHDR has {len(body)} bytes; expected 13")
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", body)
    if width == 0 or height == 0 or width * height > MAX_PIXELS:
        raise ImageError(f"PNG size {width}x{height} is not supported")
    if color not in PNG_CHANNELS:
        raise ImageError(f"PNG colour type {color} is not valid; expected 0, 2, 3, 4 or 6")
    allowed = (8,) if color == 3 else (8, 16)
    if depth not in allowed:
        raise ImageError(f"PNG bit depth {depth} (colour type {color}) is not supported; expected "
                         f"{' or '.join(map(str, allowed))} bits - re-save the image as 8-bit or convert it to .npy")
    if compression != 0 or filtering != 0:
        raise ImageError(f"PNG compression/filter method {compression}/{filtering} is not 0/0")
    if interlace != 0:
        raise ImageError("interlaced (Adam7) PNG is not supported - re-save it without interlacing or convert it to .npy")
    return width, height, depth, color, PNG_CHANNELS[color]


def _apply_palette(indices: np.ndarray, chunks: list[tuple[bytes, bytes]]) -> np.ndarray:
    palette_body = next((body for kind, body in chunks if kind == b"PLTE"), None)
    if palette_body is None or len(palette_body) % 3 or not palette_body:
        raise ImageError("palette PNG has no valid PLTE chunk")
    palette = np.frombuffer(palette_body, dtype=np.uint8).reshape(-1, 3)
    if indices.max(initial=0) >= len(palette):
        raise ImageError(f"palette PNG uses index {int(indices.max())} of a {len(palette)}-colour palette")
    alpha_body = next((body for kind, body in chunks if kind == b"tRNS"), None)
    if alpha_body is None:
        return palette[indices]
    alpha = np.full(len(palette), 255, dtype=np.uint8)
    alpha[:min(len(alpha_body), len(palette))] = np.frombuffer(alpha_body[:len(palette)], dtype=np.uint8)
    return np.concatenate([palette[indices], alpha[indices][:, :, None]], axis=2)


_UNFILTER = []


def _unfilter_jitted():
    """``_unfilter`` compiled on first use: importing Numba costs ~0.3 s, which a compile that
    reads no PNG should not pay."""
    if not _UNFILTER:
        from numba import njit
        _UNFILTER.append(njit(cache=True)(_unfilter))
    return _UNFILTER[0]


def _unfilter(rows, bpp):
    """Undo the per-row PNG filters (0 none, 1 sub, 2 up, 3 average, 4 Paeth) in place of a copy.

    A Numba loop: sub, average and Paeth depend on the pixel just reconstructed to the left,
    so they do not vectorize.
    """
    height, stride = rows.shape[0], rows.shape[1] - 1
    out = np.zeros((height, stride), dtype=np.uint8)
    for y in range(height):
        kind = rows[y, 0]
        for x in range(stride):
            raw = np.int32(rows[y, x + 1])
            left = np.int32(out[y, x - bpp]) if x >= bpp else 0
            up = np.int32(out[y - 1, x]) if y > 0 else 0
            up_left = np.int32(out[y - 1, x - bpp]) if (x >= bpp and y > 0) else 0
            if kind == 1:
                raw += left
            elif kind == 2:
                raw += up
            elif kind == 3:
                raw += (left + up) // 2
            elif kind == 4:
                estimate = left + up - up_left
                distance_left, distance_up = abs(estimate - left), abs(estimate - up)
                distance_up_left = abs(estimate - up_left)
                if distance_left <= distance_up and distance_left <= distance_up_left:
                    raw += left
                elif distance_up <= distance_up_left:
                    raw += up
                else:
                    raw += up_left
            out[y, x] = raw & 0xFF
    return out


def encode_png(image: np.ndarray) -> bytes:
    """A minimal 8-bit PNG encoder (no filtering) for tests and demos: (H, W) or (H, W, C)
    uint8 with C = 1, 2, 3 or 4."""
    image = np.asarray(image, dtype=np.uint8)
    if image.ndim == 2:
        image = image[:, :, None]
    height, width, channels = image.shape
    color = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    raw = b"".join(b"\x00" + image[y].tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    return PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


# ---- JPEG ------------------------------------------------------------------------------------

def read_jpeg(path: Path) -> np.ndarray:
    """A JPEG through Pillow, converted to RGB (or kept gray)."""
    try:
        from PIL import Image  # optional extra "images"
    except ImportError:
        raise ImageError("reading JPEG needs Pillow, which is not installed: pip install 'npuemu[images]' "
                         "(or pip install pillow), or convert the image to .png or .npy") from None
    try:
        with Image.open(path) as image:
            image = image.convert("L" if image.mode in ("L", "I", "I;16", "1") else "RGB")
            array = np.asarray(image, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError) as error:  # Pillow's "cannot identify image file" etc.
        raise ImageError(f"not a readable JPEG: {error}") from None
    return array[:, :, None] if array.ndim == 2 else array
