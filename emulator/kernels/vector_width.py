"""512-bit vectors for the loops of a kernel where LLVM would pick 256 (issue 20, NUMERICS.md 84).

LLVM's tuning for Intel's AVX-512 cores (Skylake-SP to Emerald Rapids) prefers 256-bit vectors
("prefer-256-bit": the 512-bit units once lowered the clock), so Numba's loops there run on ymm
registers with half the lanes the host has. ``wide_vectors()``, called in a kernel's body, gives
that function the attribute ``"prefer-vector-width"="512"``: its loops are vectorised 16 float32 /
8 float64 / 16 int32 lanes at a time where the target has AVX-512, and the attribute does nothing
elsewhere (no 512-bit vector is legal without AVX-512F; hosts whose tuning already prefers 512 see
no change). It marks the function whose code the call ends up in: the kernel itself, and its
``inline="always"`` helpers, whose loops are inlined into it before the vectoriser runs.

Only the width of the vectors changes: each element's operations are the same (the kernels that
take it have no reassociated reductions: ``fastmath`` at most ``contract``, which fuses the same
products either way), so no bit differs - ``python -m benchmarks.bitexact`` checks it on every
model. Used where it measured faster on an Emerald Rapids host (session 25: the int8 DPU's folded
lines 0.72 -> 0.49 ns an element; the fp chain's fused loops, dpu_fp_fused, 0.29 -> 0.17 on conv + bias +
ReLU); not everywhere: the LUT's index loop (lut_folded) ran slower, the depthwise row store
(depthwise_direct._emit) no faster, and the byte copies and other loops measured no clear gain.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

#: the LLVM function attribute (a string attribute: llvmlite's FunctionAttributes knows only the
#: enumerated ones, hence ``set.add``)
ATTRIBUTE = '"prefer-vector-width"="512"'


@intrinsic
def wide_vectors(typingctx):
    """Mark the function being compiled ``"prefer-vector-width"="512"`` (a no-op at run time)."""
    def codegen(context, builder, signature, args):
        set.add(builder.function.attributes, ATTRIBUTE)
        return context.get_dummy_value()
    return types.none(), codegen
