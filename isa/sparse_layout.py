"""RK3576 sparse (4:2) weights: the modes npuemu writes, how its register form names them, and
the compressed weights a layer stores. Shared by the compiler (compiler/sparse_weights.py) and
the emulator (emulator/kernels/weights_sparse.py); the stream contents, both axes, are the
vendor's (isa/sparse_vendor.py, compiler/LOWERING.md 27 and 43), the registers
emulator/REGISTER_SEMANTICS.md 2.8 and 42.

What tells the modes apart. The vendor writes DCOMP_CTRL.DECOMP_CONTROL 5 in both and marks
the axis in RK3576 words that have no RK3588 position [V: chosen-weight builds, LOWERING.md 43]:
CNA 0x1024 bits 31:30 (3 along input channels, 2 along output channels), CORE 0x3018 bit 12 or
13, the halved size (WEIGHT_BYTES_PER_KERNEL along input channels, the kernel count along
output channels) and DPU words of the output order. npuemu's own programs hold RK3576 tasks at
RK3588 register positions (LOWERING.md 39), where none of those words exists, so that form
carries the axis in DECOMP_CONTROL: 5 along input channels (the vendor's value), 6 along output
channels and 7 for 16:4 (the vendor: 0x1024 mode 3 with half the kernels, CORE bits 12 and 13) -
**npuemu's stand-ins [I]**, values the vendor never writes; the streams they point at are the
vendor's [V].
"""

from __future__ import annotations

from dataclasses import dataclass

#: The sparse modes of platforms/*.yaml ``sparse.modes`` whose streams npuemu writes. 16:4 is the
#: vendor's "method 3" (4 x 4 tiles keeping 2 kernels x 2 channels); ``out_in_16_4`` keeps the same
#: weights, and no build shows a second 16:4 format (LOWERING.md 43).
MODES = ("in_4_2", "out_4_2", "in_out_16_4")
#: The sparse axis of each mode, as isa/sparse_vendor.py names it.
ALONG = {"in_4_2": "in", "out_4_2": "out", "in_out_16_4": "both"}
#: How many dense values per stored value: the vendor's listing shape and WEIGHT_BYTES [V].
DENSE_PER_KEPT = {"in_4_2": 2, "out_4_2": 2, "in_out_16_4": 4}
#: DCOMP_CTRL.DECOMP_CONTROL per mode in npuemu's RK3588-position form: 5 [V]; 6 and 7 [I] (above).
DECOMP_CONTROL = {"in_4_2": 5, "out_4_2": 6, "in_out_16_4": 7}
MODE_OF_CONTROL = {code: mode for mode, code in DECOMP_CONTROL.items()}
GROUP = 4  # values per sparse group
KEPT = 2  # values kept per group
MAX_STREAMS = 16  # DCOMP_AMOUNT0..15


@dataclass(frozen=True)
class SparseStreams:
    """A layer's compressed weights: the bytes at DCOMP_ADDR0 and the DCOMP register values."""

    mode: str
    data: bytes  # the vendor's tensor: both streams, then its zero reserve
    amounts: tuple[int, ...]  # DCOMP_AMOUNT0..REGNUM-1 (the vendor's AMOUNT0/1, then zeros)
    dense_bytes: int  # the dense blob the streams decompress to

    @property
    def control(self) -> int:
        return DECOMP_CONTROL[self.mode]


__all__ = ["ALONG", "DECOMP_CONTROL", "DENSE_PER_KEPT", "GROUP", "KEPT", "MAX_STREAMS", "MODES", "MODE_OF_CONTROL",
           "SparseStreams"]
