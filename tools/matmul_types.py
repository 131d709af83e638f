"""Matmul API type combinations, and which chips support which (read from the platform YAMLs).

The type names are the API's (seed guide §3.5.4, digest in shared/docs/hardware.md §2,
"Matmul types"). Which chips have the API and which combinations each runs are chip figures:
they live in ``platforms/<chip>.yaml`` (``matmul.supported``, ``matmul.type_combinations``,
each with its source) and are read from the loaded platform here.
"""
from __future__ import annotations

from dataclasses import dataclass

from npuemu.emulator.memo import Memo
from npuemu.isa.errors import CompileError, ConfigError
from npuemu.platforms import list_platforms, load_platform, resolve_name
from npuemu.platforms.groups import Matmul


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

# Numpy dtype of each element type (int4 is held one value per int8 element when "normal").
NP_DTYPES = {"int4": "int8", "int8": "int8", "int16": "int16", "int32": "int32",
             "fp16": "float16", "fp32": "float32"}


def get_type(name: str) -> MatmulType:
    try:
        return TYPES[name]
    except KeyError:
        raise MatmulTypeError(
            f"unknown matmul type {name!r}; known types: {', '.join(_NAMES)}") from None


#: the matmul group of each shipped platform, by canonical name (loading a YAML takes ms)
_MATMUL = Memo(lambda name: load_platform(name).matmul)


def matmul_figures(name: str):
    """The ``matmul`` group of platform ``name`` (loaded once)."""
    return _MATMUL(name)


def matmul_chips() -> list[str]:
    """The shipped platforms with a Matmul API (``matmul.supported``)."""
    return [name for name in list_platforms() if _MATMUL(name).supported]


def normalize_chip(chip: str) -> str:
    """The canonical platform name of ``chip`` (a name or alias), refused if that platform has
    no Matmul API."""
    try:
        name = resolve_name(chip)
    except ConfigError:
        raise MatmulTypeError(
            f"unknown chip {chip!r} for the Matmul API; known: {', '.join(matmul_chips())}") from None
    if not _MATMUL(name).supported:
        raise MatmulTypeError(f"chip {chip!r} has no Matmul API ({_MATMUL(name).source})")
    return name


def matmul_group(chip: str) -> Matmul:
    """The ``matmul`` figures of ``chip``'s platform (a chip with a Matmul API)."""
    return _MATMUL(normalize_chip(chip))


def check_type_on_chip(name: str, chip: str) -> MatmulType:
    """Return the type, or raise if the chip cannot run it (not in its
    ``matmul.type_combinations``: the int4 types run on RK3588 only)."""
    t = get_type(name)
    group = matmul_group(chip)
    if name not in group.type_combinations:
        chips = [chip_name.upper() for chip_name in matmul_chips() if name in _MATMUL(chip_name).type_combinations]
        raise MatmulTypeError(
            f"matmul type {name} is not available on {chip}: only {', '.join(chips) or 'no chip'} "
            f"{'supports' if len(chips) == 1 else 'support'} it (matmul.type_combinations of the "
            f"platform YAMLs; {group.source})")
    return t


def types_for_chip(chip: str) -> list[str]:
    """The chip's Matmul types, in the API's order."""
    available = matmul_group(chip).type_combinations
    return [n for n in _NAMES if n in available]
