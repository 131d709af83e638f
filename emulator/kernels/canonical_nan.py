"""The CORE's one NaN: every NaN an fp16 / bf16 MAC sum produces is stored as the canonical NaN
(issue 20; NUMERICS.md 3.3, the section on canonical NaN sums).

Where two NaNs meet in one add or multiply, x86 keeps one operand's sign and payload, and which one is
the compiled instruction's choice (``llvm.fma`` or ``fmul`` + ``fadd``, operand order, the plain loops);
a NaN product of an infinity and a zero is x86's default NaN (0xFFC00000). The fp16 output conversion
keeps a NaN's sign and the top of its payload, so a NaN sum's fp16 bits would depend on the host and
the path. The sums' stores replace every NaN by one pattern instead - one compare and one select a
stored vector, no finite or infinite value touched:

- ``BITS`` 0x7FC00000: positive, quiet, payload 0 (fp16 0x7E00 after the conversion). The NPU's own
  NaN is undocumented and no fixture shows one; this is the default NaN of ARM's FPCR.DN mode (the
  SoC's own cores), RISC-V's canonical NaN and numpy's ``np.float32(np.nan)``.
- ``canonical_ir``: the IR form (the micro-kernels' stores); ``canonical``: a value in a Numba loop;
  ``canonical_nans`` / ``canonical_rows``: a pass over a float32 line / rows after their sums are
  complete (the plain loops, whose sums live in memory). A NaN sum stays NaN whatever is added after it, so canonicalising
  a partial sum early and the final sum again gives the same pattern.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit

#: fp32 bits of the canonical NaN (positive quiet NaN, payload 0)
BITS = 0x7FC00000
#: fp16 bits it becomes at the CORE / DPU output conversion
BITS16 = 0x7E00
#: the canonical NaN as a float32 (a Numba global: a float32 constant in the compiled loops)
NAN32 = np.array([BITS], np.uint32).view(np.float32)[0]


def canonical_ir(builder, value):
    """IR: ``value`` (float or float vector) with each NaN lane replaced by the canonical NaN."""
    kind = value.type
    nan = float(NAN32)  # (llvmlite writes a float constant through float32: 0x7FC00000)
    constant = ir.Constant(kind, [nan] * kind.count) if isinstance(kind, ir.VectorType) else ir.Constant(kind, nan)
    return builder.select(builder.fcmp_unordered("uno", value, value), constant, value)


@njit(cache=True, inline="always")
def canonical(value):
    """``value`` (float32), or the canonical NaN if it is a NaN."""
    return value if value == value else NAN32


@njit(cache=True)
def canonical_nans(values):
    """Every NaN of the float32 array ``values`` (1-D, any stride) made the canonical NaN in place: a
    select an element, which LLVM vectorises (no branch)."""
    for i in range(values.shape[0]):
        values[i] = canonical(values[i])


@njit(cache=True)
def canonical_rows(values):
    """``canonical_nans`` of each row of the 2-D float32 array ``values``."""
    for r in range(values.shape[0]):
        row = values[r]
        for i in range(row.shape[0]):
            row[i] = canonical(row[i])
