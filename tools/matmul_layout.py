"""Matmul normal <-> native layout conversion (seed guide table 3-5, digest hardware.md §2).

Normal layouts: A is (M, K), B is (K, N), C is (M, N), row-major.
Native layouts (divisions round up, padding is zero):
  A: [K/a, M, a]        native[k1, m, k2]     = A[m, k1*a + k2]
  B: [N/n, K/k, n, k]   native[n1, k1, n2, k2] = B[k1*k + k2, n1*n + n2]
  C: [N/c, M, c]        native[n1, m, n2]     = C[m, n1*c + n2]
The mapping is the element mapping of the guide's reference code (rknn-toolkit2
rknpu2/examples/rknn_matmul_api_demo/src/matmul_utils.cpp: norm_layout_to_perf_layout for A,
norm_layout_to_native_layout for B, perf_layout_to_norm_layout for C), checked element by
element in tests/tools/test_matmul_layout_reference.py.

int4 native operands may also be given packed, two values per byte (``packed=True``), with the
reference code's nibble orders, which differ between A and B: A puts the even element (inner
index) in the low nibble, B in the high nibble (``INT4_HIGH_FIRST``).
B is split along K into T = ceil(K/S) segments, each laid out on its own, when K > S
(S = 8192 on RK3588, 4096 on RK356x; guide §3.5.4 / table 3-7 notes). Every block size and S
is read from the chip's platform YAML (``matmul.layouts``, ``matmul.b_segment_k``).
"""
from __future__ import annotations

import numpy as np

from npuemu.isa import weight_layout
from npuemu.isa.errors import CompileError
from npuemu.tools.matmul_types import check_type_on_chip, matmul_figures, normalize_chip

#: int4 nibble order of packed native operands, from the guide's reference code (module
#: docstring): A's norm_layout_to_perf_layout writes an even output index to the low nibble,
#: B's norm_layout_to_native_layout writes it shifted left by 4 (high nibble) - the orders the
#: NPU reads features and weights in (isa.weight_layout).
INT4_HIGH_FIRST = {"A": weight_layout.FEATURE_INT4_HIGH_FIRST, "B": weight_layout.WEIGHT_INT4_HIGH_FIRST}


class MatmulLayoutError(CompileError):
    """An array does not fit the layout asked for, or the layout is not defined for this type."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _layout(dtype: str, chip: str):
    """Table 3-5's native layout of ``dtype`` operands on ``chip``: the ``matmul.layouts`` of its
    platform YAML (hardware.md 2)."""
    return getattr(matmul_figures(normalize_chip(chip)).layouts, dtype)


def a_block(type_name: str, chip: str) -> int:
    t = check_type_on_chip(type_name, chip)
    return _layout(t.a, chip).a_k


def b_blocks(type_name: str, chip: str) -> tuple[int, int]:
    t = check_type_on_chip(type_name, chip)
    layout = _layout(t.b, chip)
    return layout.b_n, layout.b_k


def c_block(type_name: str, chip: str) -> int:
    """C's inner block: the table's C column of the layout whose output is ``t.c`` (int16 after
    int4 products, int32 after int8, fp32 after fp16); int8 and fp16 C have no native layout."""
    t = check_type_on_chip(type_name, chip)
    layouts = matmul_figures(normalize_chip(chip)).layouts
    for dtype in ("int4", "int8", "fp16"):
        layout = getattr(layouts, dtype)
        if layout is not None and layout.c_dtype == t.c:
            return layout.c_n
    raise MatmulLayoutError(f"table 3-5 defines no native C layout for {t.c} output ({type_name}) on {chip}")


def b_segment_k(chip: str) -> int | None:
    """K above which B is split into segments (``matmul.b_segment_k``, table 3-7 notes)."""
    return matmul_figures(normalize_chip(chip)).b_segment_k


def _check2d(x, name, shape):
    x = np.asarray(x)
    if x.shape != shape:
        raise MatmulLayoutError(f"matmul {name} has shape {x.shape}, expected {shape}")
    return x


# ---- A and C: [rows, cols] <-> [cols / block][rows][block] (zero padded) -------------
def _to_blocks(x: np.ndarray, block: int) -> np.ndarray:
    rows, cols = x.shape
    pad = np.zeros((rows, _ceil(cols, block) * block), dtype=x.dtype)
    pad[:, :cols] = x
    return pad.reshape(rows, -1, block).transpose(1, 0, 2).copy()


def _from_blocks(xn: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return xn.transpose(1, 0, 2).reshape(rows, -1)[:, :cols].copy()


def a_to_native(A, M: int, K: int, type_name: str, chip: str, packed: bool = False) -> np.ndarray:
    """[K/a, M, a]; int4 with ``packed``: uint8 [K/a, M, a/2] (low nibble first)."""
    return _pack_if(_to_blocks(_check2d(A, "A", (M, K)), a_block(type_name, chip)), "A", packed, type_name, chip)


def a_from_native(An, M: int, K: int, type_name: str, chip: str) -> np.ndarray:
    """A (M, K) from native A (int4 also packed, as a_to_native(packed=True) gives it)."""
    a = a_block(type_name, chip)
    An = unpack_native(An, "A", a, type_name, chip)
    return _from_blocks(_check2d_n(An, "A", (_ceil(K, a), M, a)), M, K)


def _check2d_n(x, name, shape):
    x = np.asarray(x)
    if x.shape != shape:
        raise MatmulLayoutError(f"native matmul {name} has shape {x.shape}, expected {shape}")
    return x


# ---- B -------------------------------------------------------------------------------
def _b_one(B, K, N, n, k):
    n1, k1 = _ceil(N, n), _ceil(K, k)
    pad = np.zeros((k1 * k, n1 * n), dtype=B.dtype)
    pad[:K, :N] = B
    # pad[k1*k + k2, n1*n + n2] -> native[n1, k1, n2, k2]
    return pad.reshape(k1, k, n1, n).transpose(2, 0, 3, 1).copy()


def _b_one_back(Bn, K, N):
    n1, k1, n, k = Bn.shape
    return Bn.transpose(1, 3, 0, 2).reshape(k1 * k, n1 * n)[:K, :N].copy()


def b_segments(K: int, chip: str) -> list[tuple[int, int]]:
    """(k_start, k_len) of each B segment along K."""
    s = b_segment_k(chip)
    if s is None or K <= s:
        return [(0, K)]
    return [(i, min(s, K - i)) for i in range(0, K, s)]


def b_to_native(B, K: int, N: int, type_name: str, chip: str, packed: bool = False) -> list[np.ndarray]:
    """Return a list of native B segments (one element unless K exceeds the segment size);
    int4 with ``packed``: uint8 [N/n, K/k, n, k/2] (high nibble first)."""
    B = _check2d(B, "B", (K, N))
    n, k = b_blocks(type_name, chip)
    return [_pack_if(_b_one(B[s:s + L], L, N, n, k), "B", packed, type_name, chip) for s, L in b_segments(K, chip)]


def b_from_native(segments, K: int, N: int, type_name: str, chip: str) -> np.ndarray:
    n, k = b_blocks(type_name, chip)
    segs = b_segments(K, chip)
    if len(segments) != len(segs):
        raise MatmulLayoutError(f"native B has {len(segments)} segments, expected {len(segs)} for K={K}")
    parts = []
    for Bn, (_s, L) in zip(segments, segs):
        Bn = _check2d_n(unpack_native(Bn, "B", k, type_name, chip), "B segment", (_ceil(N, n), _ceil(L, k), n, k))
        parts.append(_b_one_back(Bn, L, N))
    return np.concatenate(parts, axis=0)


# ---- C -------------------------------------------------------------------------------
def c_to_native(C, M: int, N: int, type_name: str, chip: str) -> np.ndarray:
    return _to_blocks(_check2d(C, "C", (M, N)), c_block(type_name, chip))


def c_from_native(Cn, M: int, N: int, type_name: str, chip: str) -> np.ndarray:
    c = c_block(type_name, chip)
    return _from_blocks(_check2d_n(Cn, "C", (_ceil(N, c), M, c)), M, N)


# ---- int4 packing (two values per byte) ------------------------------------------------
def pack_int4(values, high_first: bool) -> np.ndarray:
    """int4 values (int8 array, last axis even) -> uint8 bytes, two values per byte along the
    last axis; ``high_first`` puts the even element in the high nibble."""
    v = np.asarray(values)
    if v.shape[-1] % 2:
        raise MatmulLayoutError(f"int4 packing needs an even last axis, got shape {v.shape}")
    if v.size and (v.min() < -8 or v.max() > 7):
        raise MatmulLayoutError("int4 packing: values outside [-8, 7]")
    return weight_layout.pack_int4(v, high_first)


def unpack_int4(packed, high_first: bool) -> np.ndarray:
    """uint8 bytes -> int4 values as int8 (sign-extended), two per byte along the last axis
    (isa.weight_layout.unpack_int4, the emulator's reader)."""
    return weight_layout.unpack_int4(np.asarray(packed).astype(np.uint8), high_first)


def _is_int4(operand: str, type_name: str, chip: str) -> bool:
    t = check_type_on_chip(type_name, chip)
    return (t.a if operand == "A" else t.b) == "int4"


def _pack_if(x: np.ndarray, operand: str, packed: bool, type_name: str, chip: str):
    if not packed:
        return x
    if not _is_int4(operand, type_name, chip):
        raise MatmulLayoutError(f"packed=True applies to int4 operands only; {operand} of {type_name} is not int4")
    return pack_int4(x, INT4_HIGH_FIRST[operand])


def unpack_native(x, operand: str, block: int, type_name: str, chip: str) -> np.ndarray:
    """A native int4 operand given packed (uint8, innermost axis block / 2) -> one value per
    int8 element; anything else is returned as it is."""
    x = np.asarray(x)
    if _is_int4(operand, type_name, chip) and x.dtype == np.uint8 and x.ndim and x.shape[-1] == block // 2:
        return unpack_int4(x, INT4_HIGH_FIRST[operand])
    return x
