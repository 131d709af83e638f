"""Deterministic natural-looking test images, for calibration tests and demos without a dataset.

Pure noise is a poor calibration set: real activations come from smooth regions, edges and
texture. These images are built from what photographs and documents are made of: a smooth
colour gradient, low-frequency shading, filled shapes with soft edges, lines of dark
text-like strokes, and a little sensor noise. Every image is a function of its size, kind
and seed only.

- ``scene``: a coloured background with shapes and a few text lines (general CNN input);
- ``document``: light paper with several text lines and an occasional coloured block
  (OCR detection, document orientation);
- ``text_line``: one line of strokes across a light strip (OCR text-line classifiers).
"""

from __future__ import annotations

import numpy as np

KINDS = ("scene", "document", "text_line")


def synthetic_image(height: int, width: int, seed: int, kind: str = "scene") -> np.ndarray:
    """An (H, W, 3) uint8 RGB image."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    canvas = _background(rng, height, width, light=kind != "scene")
    if kind == "scene":
        for _ in range(rng.integers(3, 8)):
            _shape(rng, canvas)
        _text_lines(rng, canvas, lines=int(rng.integers(1, 4)), size=int(rng.integers(8, max(9, height // 8))))
    elif kind == "document":
        if rng.random() < 0.6:
            _shape(rng, canvas)
        _text_lines(rng, canvas, lines=int(rng.integers(3, 9)), size=int(rng.integers(10, max(11, height // 10))),
                    paragraph=True)
    else:
        _text_lines(rng, canvas, lines=1, size=int(height * rng.uniform(0.45, 0.7)), full_width=True)
    canvas += rng.normal(0.0, 2.5, canvas.shape)
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def _smooth_field(rng: np.random.Generator, height: int, width: int, cells: int) -> np.ndarray:
    """Low-frequency noise in [-1, 1]: a coarse random grid, bilinearly upsampled."""
    grid = rng.uniform(-1, 1, (cells + 1, cells + 1))
    ys = np.linspace(0, cells, height)
    xs = np.linspace(0, cells, width)
    y0, x0 = np.minimum(ys.astype(int), cells - 1), np.minimum(xs.astype(int), cells - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def _background(rng: np.random.Generator, height: int, width: int, *, light: bool) -> np.ndarray:
    if light:  # paper: a light grey with a slight tint per corner
        corners = rng.uniform(185, 245, (2, 2, 1)) + rng.uniform(-10, 10, (2, 2, 3))
    else:
        corners = rng.uniform(20, 235, (2, 2, 3))
    fy = np.linspace(0, 1, height)[:, None, None]
    fx = np.linspace(0, 1, width)[None, :, None]
    gradient = (corners[0, 0] * (1 - fx) + corners[0, 1] * fx) * (1 - fy) + (corners[1, 0] * (1 - fx) + corners[1, 1] * fx) * fy
    shading = _smooth_field(rng, height, width, int(rng.integers(2, 5)))[:, :, None] * (12 if light else 30)
    return gradient + shading


def _shape(rng: np.random.Generator, canvas: np.ndarray) -> None:
    """A filled ellipse or rectangle with a soft edge, blended onto the canvas."""
    height, width, _ = canvas.shape
    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    ry, rx = rng.uniform(0.06, 0.3) * height, rng.uniform(0.06, 0.3) * width
    y, x = np.mgrid[0:height, 0:width]
    if rng.random() < 0.5:
        distance = np.sqrt(((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2)
    else:
        distance = np.maximum(np.abs(y - cy) / ry, np.abs(x - cx) / rx)
    softness = rng.uniform(0.02, 0.15)
    mask = np.clip((1 - distance) / softness, 0, 1)[:, :, None]
    color = rng.uniform(0, 255, 3) + _smooth_field(rng, height, width, 3)[:, :, None] * 20
    canvas[:] = canvas * (1 - mask) + color * mask


def _stroke(canvas: np.ndarray, p0: np.ndarray, p1: np.ndarray, thickness: float, color: np.ndarray) -> None:
    """A line segment with anti-aliased edges (distance to the segment), on its bounding box."""
    height, width, _ = canvas.shape
    pad = thickness + 1
    top, bottom = int(max(min(p0[0], p1[0]) - pad, 0)), int(min(max(p0[0], p1[0]) + pad + 1, height))
    left, right = int(max(min(p0[1], p1[1]) - pad, 0)), int(min(max(p0[1], p1[1]) + pad + 1, width))
    if top >= bottom or left >= right:
        return
    y, x = np.mgrid[top:bottom, left:right].astype(np.float64)
    direction = p1 - p0
    length2 = max(float(direction @ direction), 1e-9)
    t = np.clip(((y - p0[0]) * direction[0] + (x - p0[1]) * direction[1]) / length2, 0, 1)
    distance = np.hypot(y - (p0[0] + t * direction[0]), x - (p0[1] + t * direction[1]))
    alpha = np.clip(thickness / 2 + 0.5 - distance, 0, 1)[:, :, None]
    region = canvas[top:bottom, left:right]
    region[:] = region * (1 - alpha) + color * alpha


def _text_lines(rng: np.random.Generator, canvas: np.ndarray, *, lines: int, size: int, full_width: bool = False,
                paragraph: bool = False) -> None:
    """Rows of 'characters': each a few strokes inside a size x 0.7 size box; a paragraph
    stacks the rows at a regular spacing from a random top margin."""
    height, width, _ = canvas.shape
    size = max(size, 6)
    color = rng.uniform(0, 70, 3)
    thickness = max(1.0, size * rng.uniform(0.08, 0.14))
    first = rng.uniform(0, max(height - lines * size * 1.6, 1))
    for line in range(lines):
        if full_width:
            top = (height - size) / 2
        elif paragraph:
            top = first + line * size * 1.6
        else:
            top = rng.uniform(0, max(height - size, 1))
        left = rng.uniform(0, width * 0.1) if full_width else rng.uniform(0, width * 0.5)
        end = width - rng.uniform(0, width * 0.1) if full_width else min(width, left + rng.uniform(0.3, 0.9) * width)
        x = left
        while x + size * 0.7 < end:
            if rng.random() < 0.15:  # a space between words
                x += size * 0.6
                continue
            box = np.array([top, x])
            for _ in range(rng.integers(2, 5)):
                p0 = box + rng.uniform([0, 0], [size, size * 0.7])
                p1 = box + rng.uniform([0, 0], [size, size * 0.7])
                _stroke(canvas, p0, p1, thickness, color)
            x += size * rng.uniform(0.75, 0.95)


def synthetic_batch(shape: tuple[int, ...], seed: int, kind: str = "scene") -> np.ndarray:
    """A [1, 3, H, W] float32 array of pixel values 0..255 (before any mean/std)."""
    if len(shape) != 4 or shape[0] != 1 or shape[1] != 3:
        raise ValueError(f"expected an input shape [1, 3, H, W], got {list(shape)}")
    image = synthetic_image(shape[2], shape[3], seed, kind)
    return np.ascontiguousarray(image.transpose(2, 0, 1)[None]).astype(np.float32)
