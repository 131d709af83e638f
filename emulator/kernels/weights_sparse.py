"""The CNA's weight decompressor (RK3576 sparse weights): DCOMP register values -> which
streams to read, and the streams -> the dense weight blob the MAC array uses.

DECOMP_CONTROL 5 (4:2 along input channels) and 6 (along output channels, npuemu's register
stand-in for the vendor's 0x1024 mode bits, isa/sparse_layout.py) both read the vendor's two
streams (isa/sparse_vendor.py, compiler/LOWERING.md 27 and 43, REGISTER_SEMANTICS.md 2.8.1 and 42). Decompression is exact: the MACs see the same int8 weights as
a dense build of the pruned values, so outputs are bit-identical to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa import sparse_layout, sparse_vendor
from npuemu.isa.weight_layout import pack_conv_weights
from npuemu.isa.errors import EmulationError


@dataclass(frozen=True)
class Decompression:
    """DCOMP_CTRL.DECOMP_CONTROL's stream format and DCOMP_AMOUNT0..REGNUM-1."""

    mode: str
    amounts: tuple[int, ...]

    @property
    def span(self) -> int:
        """Bytes the weight DMA reads from DCOMP_ADDR0 (both streams)."""
        return sparse_vendor.span_bytes(self.amounts)


def decompression(control: int, bypass: int, regnum: int, amounts: list[int], where: str) -> Decompression | None:
    """The decompressor's setting from the register values (None: dense weights, DECOMP_CONTROL 0)."""
    if control == 0:
        return None
    if bypass:
        raise EmulationError(f"{where}: DCOMP_CTRL WT_DEC_BYPASS=1 with DECOMP_CONTROL={control} is not modelled")
    mode = sparse_layout.MODE_OF_CONTROL.get(control)
    if mode is None:
        known = ", ".join(f"{code} ({name})" for code, name in sorted(sparse_layout.MODE_OF_CONTROL.items()))
        raise EmulationError(f"{where}: DCOMP_CTRL DECOMP_CONTROL={control} is not modelled (0 dense, {known})")
    if not 1 <= regnum <= sparse_layout.MAX_STREAMS:
        raise EmulationError(f"{where}: DCOMP_REGNUM={regnum} with DECOMP_CONTROL={control}: expected 1 to "
                             f"{sparse_layout.MAX_STREAMS} streams")
    if regnum < sparse_vendor.STREAMS:  # the vendor's two streams, AMOUNT0/1; it writes REGNUM 5 [V]
        raise EmulationError(f"{where}: DCOMP_REGNUM={regnum} with DECOMP_CONTROL={control}: its "
                             f"{sparse_vendor.STREAMS} streams need DCOMP_AMOUNT0 and 1 (the vendor writes 5)")
    return Decompression(mode, tuple(amounts[:sparse_vendor.STREAMS]))


def decompress_weights(raw: np.ndarray, setting: Decompression, dense_bytes: int, where: str,
                       shape: tuple[int, int, int, int], layout) -> np.ndarray:
    """The streams' bytes (``setting.span`` of them) -> ``dense_bytes`` int8 of the dense blob in
    ``layout`` (the vendor's streams are decoded for the conv ``shape`` [OC][IC][KH][KW])."""
    try:
        weights = sparse_vendor.decode(raw, setting.amounts, tuple(shape), sparse_layout.ALONG[setting.mode])
    except sparse_vendor.VendorFormatError as error:
        raise EmulationError(f"{where}: sparse weights (DCOMP_ADDR0): {error}") from None
    blob = pack_conv_weights(weights, layout)
    if blob.size != dense_bytes:
        raise EmulationError(f"{where}: sparse weights (DCOMP_ADDR0): a {'x'.join(map(str, shape))} conv "
                             f"decodes to {blob.size} bytes, the weight sizes say {dense_bytes}")
    return blob


__all__ = ["Decompression", "decompress_weights", "decompression"]
