"""Matmul K/N/M limits per chip and type (seed guide table 3-7, digest hardware.md §2)."""
from __future__ import annotations

from npuemu.isa.errors import CompileError
from npuemu.tools.matmul_types import check_type_on_chip, normalize_chip


class MatmulLimitError(CompileError):
    """A Matmul shape breaks a limit of table 3-7."""


_RK356X = ("rk3562", "rk3566", "rk3568")


def limits(type_name: str, chip: str) -> dict:
    """Return {'K_max', 'K_align', 'N_max', 'N_align'} (None = no maximum) for this type/chip."""
    t = check_type_on_chip(type_name, chip)
    c = normalize_chip(chip)
    if t.b == "int4":
        # Table 3-7, int4 (RK3588 only): K 32-aligned, N <= 8192 and 64-aligned.
        return {"K_max": None, "K_align": 32, "N_max": 8192, "N_align": 64}
    if c in _RK356X:
        # Table 3-7: K <= 10240, 32-aligned; N <= 4096, 16-aligned on RK3562/RK3566/RK3568.
        return {"K_max": 10240, "K_align": 32, "N_max": 4096, "N_align": 16}
    # Table 3-7: RK3576/RK3588: K 32-aligned, N <= 4096 and 32-aligned.
    return {"K_max": None, "K_align": 32, "N_max": 4096, "N_align": 32}


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
