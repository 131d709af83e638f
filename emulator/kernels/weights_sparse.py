"""The CNA's weight decompressor (RK3576 sparse weights): DCOMP register values -> which
streams to read, and the streams -> the dense weight blob the MAC array uses.

The stream format is isa/sparse_layout.py's (compiler/LOWERING.md 23); the registers are
described in emulator/REGISTER_SEMANTICS.md 2.8. Decompression is exact: the MACs see the
same int8 weights as a dense build of the pruned values, so outputs are bit-identical to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa import sparse_layout
from npuemu.isa.errors import EmulationError


@dataclass(frozen=True)
class Decompression:
    """DCOMP_CTRL.DECOMP_CONTROL's stream format and DCOMP_AMOUNT0..REGNUM-1."""

    mode: str
    amounts: tuple[int, ...]

    @property
    def span(self) -> int:
        """Bytes the weight DMA reads from DCOMP_ADDR0 (all streams)."""
        return sparse_layout.span_bytes(self.amounts)


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
    return Decompression(mode, tuple(amounts[:regnum]))


def decompress_weights(raw: np.ndarray, setting: Decompression, dense_bytes: int, where: str) -> np.ndarray:
    """The streams' bytes (``setting.span`` of them) -> ``dense_bytes`` int8 of the dense blob."""
    try:
        return sparse_layout.decompress(raw, setting.amounts, dense_bytes, setting.mode)
    except sparse_layout.SparseFormatError as error:
        raise EmulationError(f"{where}: sparse weights (DCOMP_ADDR0): {error}") from None


__all__ = ["Decompression", "decompress_weights", "decompression"]
