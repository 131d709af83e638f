"""Reference layouts (NUMERICS.md section 8), as numpy reshapes and block concatenations."""

from __future__ import annotations

import numpy as np


def align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def nchw_to_nc1hwc2(x: np.ndarray, c2: int, c1: int | None = None) -> np.ndarray:
    """[C][H][W] -> [C1][H][W][C2] by zero-padding C and splitting it."""
    channels, height, width = x.shape
    groups = c1 if c1 is not None else -(-channels // c2)
    padded = np.zeros((groups * c2, height, width), x.dtype)
    padded[:channels] = x
    return padded.reshape(groups, c2, height, width).transpose(0, 2, 3, 1).copy()


def nc1hwc2_to_nchw(x: np.ndarray, channels: int) -> np.ndarray:
    groups, height, width, c2 = x.shape
    return x.transpose(0, 3, 1, 2).reshape(groups * c2, height, width)[:channels].copy()


def conv_blob(w: np.ndarray, oc_block: int, ic_block: int, ic_align: int, oc_align: int,
              fill, pow2_atoms: bool = False) -> np.ndarray:
    """Pack [OC][IC][KH][KW]: per output group, per input group, a [KH][KW][oc][ic] block.
    ``pow2_atoms``: the partial input group holds 1, 2 or 4 atoms of ``ic_align`` (the vendor's
    fp16 rule, LOWERING.md 34)."""
    out_channels, in_channels, kh, kw = w.shape
    stored_ic = align(in_channels, ic_align)
    if pow2_atoms and in_channels % ic_block:
        sizes = [ic_align * 2 ** n for n in range(8) if ic_align * 2 ** n <= ic_block]
        partial = min(s for s in sizes if s >= in_channels % ic_block)
        stored_ic = in_channels - in_channels % ic_block + partial
    full, rest = divmod(out_channels, oc_block)
    stored_oc = full * oc_block + (align(rest, oc_align) if rest else 0)
    padded = np.zeros((stored_oc, stored_ic, kh, kw), w.dtype)
    padded[:out_channels, :in_channels] = w
    padded[:out_channels, in_channels:] = np.broadcast_to(
        np.asarray(fill, w.dtype), (out_channels,))[:, None, None, None]
    blocks = []
    for o0 in range(0, stored_oc, oc_block):
        for i0 in range(0, stored_ic, ic_block):
            block = padded[o0:o0 + oc_block, i0:i0 + ic_block]
            blocks.append(block.transpose(2, 3, 0, 1).reshape(-1))
    return np.concatenate(blocks)


def depthwise_blob(w: np.ndarray, block: int, tail_align: int, fill=0) -> np.ndarray:
    """Pack [C][1][KH][KW]: per channel group a [KH][KW][channels] block."""
    channels, _, kh, kw = w.shape
    full, rest = divmod(channels, block)
    stored = full * block + (align(rest, tail_align) if rest else 0)
    padded = np.full((stored, kh, kw), fill, w.dtype)
    padded[:channels] = w[:, 0]
    return np.concatenate([padded[c0:c0 + block].transpose(1, 2, 0).reshape(-1)
                           for c0 in range(0, stored, block)])
