"""Dtype names used by the platform tables, and the error for a dtype a chip lacks."""

from __future__ import annotations

from npuemu.isa.errors import CompileError

COMPUTE_DTYPES = ("int4", "int8", "int16", "fp16", "bf16", "tf32")
"""Dtypes the MAC array computes in (rknpu-isa.md §3 precision codes)."""
STORAGE_DTYPES = COMPUTE_DTYPES + ("int32", "fp32")
"""Dtypes a tensor can be stored in (adds the accumulator / output widths)."""
MATMUL_DTYPES = ("int4", "int8", "fp16")
"""Input dtypes of the matmul layouts (hardware.md §2, guide table 3-5)."""

_DTYPE_SYNONYMS = {
    "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "tfloat32": "tf32",
    "float32": "fp32", "float": "fp32", "uint8": "int8", "uint4": "int4", "uint16": "int16",
}


class UnsupportedDtypeError(CompileError):
    """A dtype the chip has no hardware path for (e.g. int4 on RK3568).

    A :class:`CompileError`: choosing a dtype is the compiler's job, so the situation arises
    when compiling a model for a chip that cannot run it; the CLI prints it without traceback.
    """


def normalize_dtype(dtype: str) -> str:
    """Canonical dtype name ('float16' -> 'fp16'); an unknown name is a programming error."""
    name = _DTYPE_SYNONYMS.get(dtype.lower(), dtype.lower())
    if name not in STORAGE_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(STORAGE_DTYPES)}")
    return name
