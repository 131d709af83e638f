"""FlatConcat: feature maps flattened and joined along the pixels (LOWERING.md 29).

``[1, C, H_i, W_i]`` maps -> one ``[1, C, 1, sum(H_i * W_i)]`` map, input i's pixels in row-major
order from column ``sum(H_j * W_j, j < i)`` on (YOLOX's Reshape-per-head + Concat(axis 2) tail).

In NC1HWC2 a surface holds its pixels row after row with no gap (isa/tensor_layout.py: a line
is W atoms, the surface ``align(H*W, 4)`` atoms), so input i's surface is the run of atoms
``[off_i, off_i + H_i*W_i)`` of the output's surface. One DPU-only copy task per input writes it
there: the source cube as the input is stored (W_i x H_i, lines W_i atoms apart, as the DPU
writes them: rknpu-isa.md, WDMA walks W then H then surfaces), DST_BASE_ADDR moved by ``off_i``
atoms and DST_SURF_STRIDE the output's - the copy stages of a channel Concat's input
(lower_eltwise.copy_stages: int8 requantizing, float16 plain).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from npuemu.isa.errors import CompileError

from .descriptions import PRECISION_CODES, DpuCube, DpuTask
from .layers import JoinedLayer
from .lookup import joined_placements
from .lower_eltwise import copy_stages
from .placement import Placement, align


@dataclass(frozen=True)
class FlatConcatLayer(JoinedLayer):
    """Inputs (C, H_i, W_i) flattened and concatenated into (C, 1, sum H_i W_i)."""

    WHAT: ClassVar[str] = "flat concat"

    def __post_init__(self) -> None:
        super().__post_init__()
        if len({shape[0] for shape in self.shapes}) != 1:
            raise CompileError(f"layer {self.name}: flat concat inputs differ in channels: {list(self.shapes)}")

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return self.shapes[0][0], 1, sum(height * width for _, height, width in self.shapes)


def lower_flat_concat(layer: FlatConcatLayer, placements: Mapping[str, Placement], platform) -> tuple[DpuTask, ...]:
    """One DPU-only copy per input into its run of columns of every output surface."""
    out, sources = joined_placements(layer, placements, "a flat concat")
    tasks, column = [], 0
    for source, shape, quant in sources:
        channels, height, width = shape
        cube = DpuCube(width=width, height=height, channels=align(channels, out.c2), orig_channels=channels,
                       dst_address=out.address + column * out.pixel_bytes,
                       dst_surface_stride=out.surface_stride_atoms, surfaces_per_pass=1,
                       precision=PRECISION_CODES[layer.dtype])
        tasks.append(DpuTask(layer.name, source.address, source.surface_stride_atoms, cube,
                             copy_stages(quant, layer.output_quant, layer.name, layer.dtype)))
        column += height * width
    return tuple(tasks)


__all__ = ["FlatConcatLayer", "lower_flat_concat"]
