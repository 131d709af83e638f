"""Transpose of the last two stored axes (H <-> W) as DPU-only copies (LOWERING.md 35).

A ``[1, C, H, W]`` map with perm (0, 1, 3, 2), a ``[1, A, B]`` / ``[A, B]`` tensor with (0, 2, 1) /
(1, 0) (stored as C x A x B, isa/container_views.tensor_cube) all swap the stored H and W. The
vendor compiles it as one DPU-only task per C1 surface with every stage bypassed, moving whole
atoms ([V] tests/emulator/vendor_dpu_transpose nwh_int8_16x6x10 (one task), nwh_fp16_16x6x10
(two tasks, bases one 60-atom surface apart); emulator/REGISTER_SEMANTICS.md 31):

- the MRDMA reads a cube of W 1 x H lines, its "channels" the W input pixels of a line (one
  atom each: CHANNEL = W x 8 - 1 in int16 elements, IN = PROC = OUT precision int16, code 1,
  in int8 and fp16 builds alike), lines W atoms apart (LINE_NOTCH_ADDR W - 1) and "surfaces"
  one atom apart (SURF_NOTCH = 1 - (H + (H - 1) x (W - 1)), a negative 28-bit field);
- the WDMA writes it plainly (WDMA W x H = H x 1, SIZE_C_WDMA = W - 1): surface x (input
  column x) at x x H atoms, line y at y - i.e. output pixel (x, y) of the H-wide output.

Columns are cut into runs of at most :data:`MAX_COLUMNS` (CHANNEL is 13 bits) [C]; the vendor
builds seen have at most 10.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from npuemu.isa.errors import CompileError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task

from .descriptions import DpuCube, DpuStages
from .emit_dpu import ENABLE_DPU_ONLY, INT_CLEAR_ALL, INT_MASK_DPU, RdmaSources, write_dpu_body, write_s_pointers
from .fields import RegisterBuilder
from .layers import FLOAT16, INT8, Quant
from .lookup import unpacked_pair
from .placement import Placement

INT16 = 1  # DPU precision code of the 2-byte moves (REGISTER_SEMANTICS.md 31) [V]
MOVE_ELEMENT_BYTES = 2
CHANNEL_FIELD = 1 << 13  # DATA_CUBE_CHANNEL.CHANNEL is bits 12:0 (isa/regmaps/rk3588.yaml)
MAX_HEIGHT = 1 << 13  # DATA_CUBE_HEIGHT.HEIGHT is bits 12:0
SURF_NOTCH_MASK = (1 << 28) - 1  # SURF_NOTCH_ADDR bits 31:4, two's complement in atoms


@dataclass(frozen=True)
class TransposeLayer:
    """A stored (C, H, W) tensor written as (C, W, H): ``quant`` the shared int8 quantization."""

    name: str
    input: str
    output: str
    input_shape: tuple[int, int, int]
    quant: Quant | None
    dtype: str = INT8

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        if self.dtype not in (INT8, FLOAT16):
            raise CompileError(f"layer {self.name}: a transpose of {self.dtype!r}; expected int8 or float16")
        if self.input_shape[1] > MAX_HEIGHT:
            raise CompileError(f"layer {self.name}: transpose of {self.input_shape[1]} rows; the DPU cube takes "
                               f"at most {MAX_HEIGHT}")

    @property
    def output_shape(self) -> tuple[int, int, int]:
        channels, height, width = self.input_shape
        return channels, width, height


@dataclass(frozen=True)
class TransposeTask:
    """One DPU-only H <-> W copy: ``columns`` input pixels of ``height`` lines, lines ``line_atoms`` apart."""

    layer: str
    source_address: int
    dst_address: int
    height: int
    columns: int
    line_atoms: int
    atom_elements: int  # int16 elements in one atom


def lower_transpose(layer: TransposeLayer, placements: Mapping[str, Placement], platform) -> tuple[TransposeTask, ...]:
    """One task per C1 surface holding channels and run of at most ``CHANNEL_FIELD / atom_elements`` columns."""
    source, out = unpacked_pair(layer, placements, "a transpose")
    if source.pixel_bytes != source.atom_bytes or out.pixel_bytes != out.atom_bytes:
        raise CompileError(f"layer {layer.name}: a transpose moves whole atoms; {source.pixel_bytes}-byte pixels "
                           f"in {source.atom_bytes}-byte atoms are not lowered")
    _, height, width = layer.input_shape
    atom = source.atom_bytes
    elements = atom // MOVE_ELEMENT_BYTES
    run = CHANNEL_FIELD // elements
    tasks = []
    for c1 in range(-(-layer.input_shape[0] // source.c2)):  # the surfaces holding channels (a conv's output has more)
        src, dst = source.address + c1 * source.surface_bytes, out.address + c1 * out.surface_bytes
        for first in range(0, width, run):
            tasks.append(TransposeTask(layer.name, src + first * atom, dst + first * height * atom, height,
                                       min(run, width - first), width, elements))
    return tuple(tasks)


def _replace(b: RegisterBuilder, block: str, register: str, **fields: int) -> None:
    """Rewrite one of the body's writes in place (the order stays the vendor's)."""
    scratch = RegisterBuilder(b.regmap, b.layer)
    scratch.write(block, register, **fields)
    index = next(i for i, w in enumerate(b.writes) if (w.block, w.register) == (block, register))
    b.writes[index] = scratch.writes[0]


def emit_transpose_task(task: TransposeTask, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    """The 69 writes of a DPU-only task (emit_dpu), with the transpose's read and write geometry."""
    b = RegisterBuilder(regmap, task.layer)
    write_s_pointers(b)
    cube = DpuCube(width=1, height=task.height, channels=task.columns * task.atom_elements,
                   orig_channels=task.columns * task.atom_elements, dst_address=task.dst_address,
                   dst_surface_stride=task.height, surfaces_per_pass=1, precision=INT16)
    line_notch = task.line_atoms - 1
    notch = (1 - (task.height + (task.height - 1) * line_notch)) & SURF_NOTCH_MASK
    write_dpu_body(b, cube, DpuStages(), conv_mode=0, flying=True,
                   sources=RdmaSources(src_address=task.source_address, src_notch=notch))
    _replace(b, "DPU", "WDMA_SIZE_0", SIZE_C_WDMA=task.columns - 1, CHANNEL_WDMA=cube.channels - 1)
    _replace(b, "DPU", "WDMA_SIZE_1", WIDTH_WDMA=task.height - 1)
    _replace(b, "DPU_RDMA", "SRC_DMA_CFG", LINE_NOTCH_ADDR=line_notch)
    return Task(b.done(), ENABLE_DPU_ONLY, int_mask=INT_MASK_DPU, int_clear=INT_CLEAR_ALL, op_idx=op_idx)


__all__ = ["TransposeLayer", "TransposeTask", "emit_transpose_task", "lower_transpose"]
