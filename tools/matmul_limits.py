"""Matmul K/N/M limits per chip and type: the ``matmul.limits`` rows of the platform YAMLs
(seed guide table 3-7, digest hardware.md §2), one per B element type."""
from __future__ import annotations

from npuemu.isa.errors import CompileError
from npuemu.tools.matmul_types import check_type_on_chip, matmul_group


class MatmulLimitError(CompileError):
    """A Matmul shape breaks a limit of table 3-7."""


def limits(type_name: str, chip: str) -> dict:
    """Return {'K_max', 'K_align', 'N_max', 'N_align'} (None = no maximum) for this type/chip:
    the platform's limits row of B's element type (the YAMLs give int8 and fp16 equal rows)."""
    t = check_type_on_chip(type_name, chip)
    row = getattr(matmul_group(chip).limits, t.b)
    return {"K_max": row.k_max, "K_align": row.k_align, "N_max": row.n_max, "N_align": row.n_align}


def check_shape(M: int, K: int, N: int, type_name: str, chip: str) -> None:
    """Raise MatmulLimitError naming the broken limit."""
    for name, v in (("M", M), ("K", K), ("N", N)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise MatmulLimitError(f"matmul {name}={v!r} must be a positive integer")
    lim = limits(type_name, chip)
    for name, v in (("K", K), ("N", N)):
        mx, al = lim[f"{name}_max"], lim[f"{name}_align"]
        if mx is not None and v > mx:
            raise MatmulLimitError(
                f"matmul {name}={v} exceeds the limit {name} <= {mx} for {type_name} on {chip} (table 3-7)")
        if v % al:
            raise MatmulLimitError(
                f"matmul {name}={v} must be a multiple of {al} for {type_name} on {chip} (table 3-7)")
