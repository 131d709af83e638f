"""Matmul API type combinations and which chips support them.

Source: seed guide §3.5.4 (digest in shared/docs/hardware.md §2, "Matmul types"; chips in §1).
"""
from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.errors import CompileError


class MatmulTypeError(CompileError):
    """Unknown Matmul type, or a type the chip does not support."""


@dataclass(frozen=True)
class MatmulType:
    name: str
    a: str  # element type of A (M x K)
    b: str  # element type of B (K x N)
    c: str  # element type of C (M x N)


_NAMES = (
    "fp16xfp16->fp32", "int8xint8->int32", "int8xint8->int8", "fp16xfp16->fp16",
    "fp16xint8->fp32", "fp16xint8->fp16", "fp16xint4->fp32", "fp16xint4->fp16",
    "int4xint4->int16", "int8xint4->int32",
)


def _parse(name: str) -> MatmulType:
    ab, c = name.split("->")
    a, b = ab.split("x")
    return MatmulType(name, a, b, c)


TYPES: dict[str, MatmulType] = {n: _parse(n) for n in _NAMES}

# Chips with a Matmul API; RV1103/RV1106 have none (hardware.md §1 table, "no Matmul API").
MATMUL_CHIPS = ("rk3562", "rk3566", "rk3568", "rk3576", "rk3588")
NO_MATMUL_CHIPS = ("rv1103", "rv1106")

# Numpy dtype of each element type (int4 is held one value per int8 element when "normal").
NP_DTYPES = {"int4": "int8", "int8": "int8", "int16": "int16", "int32": "int32",
             "fp16": "float16", "fp32": "float32"}


def get_type(name: str) -> MatmulType:
    try:
        return TYPES[name]
    except KeyError:
        raise MatmulTypeError(
            f"unknown matmul type {name!r}; known types: {', '.join(_NAMES)}") from None


def normalize_chip(chip: str) -> str:
    c = chip.lower().replace("rk3588s", "rk3588")
    if c in NO_MATMUL_CHIPS:
        raise MatmulTypeError(f"chip {chip!r} has no Matmul API (RV1103/RV1106, guide §3.5.4)")
    if c not in MATMUL_CHIPS:
        raise MatmulTypeError(f"unknown chip {chip!r} for the Matmul API; known: {', '.join(MATMUL_CHIPS)}")
    return c


def check_type_on_chip(name: str, chip: str) -> MatmulType:
    """Return the type, or raise if the chip cannot run it (int4 types are RK3588-only)."""
    t = get_type(name)
    c = normalize_chip(chip)
    if "int4" in (t.a, t.b) and c != "rk3588":
        raise MatmulTypeError(f"matmul type {name} uses int4, which only RK3588 supports (chip {chip})")
    return t


def types_for_chip(chip: str) -> list[str]:
    c = normalize_chip(chip)
    return [n for n in _NAMES if c == "rk3588" or "int4" not in n]
