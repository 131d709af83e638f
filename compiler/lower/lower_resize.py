"""Resize nearest by whole factors -> DPU-only unpooling tasks, as the vendor lowers it
(rknn-fixtures-ops resize_nearest_2x_int8 / _fp16; LOWERING.md 19).

One task per C2 surface of the input (the vendor: 4 tasks for 64 int8 channels, 8 for 64 fp16):
the MRDMA reads the surface's H x W atoms, DPU_RDMA SRC_DMA_CFG turns on unpooling with kernel =
stride = the factors, and the DPU writes each atom into its fy x fx block of the output surface.
Register values copied from the vendor's tasks [V]:

- DATA_FORMAT / DPU_RDMA FEATURE_MODE_CFG IN_PRECISION int16, the MRDMA cube W x H with one atom
  of int16 channels (CHANNEL 7): the atom's bytes move as they are, whatever the data type;
  PROC/OUT_PRECISION the tensor's (int8 0, fp16 2); the DPU cube fx*W wide, H lines, C2 channels;
- every stage bypassed, OUT_CVT scale 1 (the body's defaults), SIZE_E 1;
- DST_SURF_STRIDE = one output row (W_out atoms): where kernel row i goes; DATA_CUBE_NOTCH_ADDR
  0 and 1 = W_out x (fy - 1): lines then lie fy rows apart (emulator/kernels/dpu_unpool.py);
- SURFACE_ADD = one whole output surface (the vendor's 6400 = 80 x 80).

Only the factor 2 x 2 is in a vendor stream; other factors up to 8 (the 3-bit kernel fields)
follow the same reading of the registers [I].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from npuemu.isa.errors import CompileError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task
from npuemu.platforms.model import Platform

from .descriptions import PRECISION_CODES, DpuCube, DpuStages
from .emit_dpu import BURST_LEN, ENABLE_DPU_ONLY, INT_CLEAR_ALL, INT_MASK_DPU, RdmaSources, write_dpu_body, write_s_pointers
from .fields import RegisterBuilder
from .layers import ResizeLayer
from .lookup import unpacked_pair
from .placement import Placement, TensorPlacement

#: the MRDMA reads atoms as int16 in both vendor builds (DATA_FORMAT.IN_PRECISION 1)
INT16_CODE = 1
INT16_BYTES = 2


@dataclass(frozen=True)
class UnpoolTask:
    """One DPU-only unpooling task: one C2 surface of the input into its output surface."""

    layer: str
    source_address: int
    source_width: int
    source_height: int
    source_line_notch: int  # atoms past W in each input line (LINE_NOTCH_ADDR)
    factors: tuple[int, int]  # (fy, fx)
    cube: DpuCube  # the DPU's: fx*W wide, H lines, C2 channels; DST_SURF_STRIDE one output row
    output_surface_atoms: int  # SURFACE_ADD
    atom_bytes: int
    line_notch: int | None = None  # DATA_CUBE_NOTCH_ADDR; None: W x (fy - 1), the next line fy rows on


def _edge_tasks(layer: ResizeLayer, source: TensorPlacement, out: TensorPlacement, surface: int) -> list[UnpoolTask]:
    """The edge-padded copy of one C2 surface as 1 x 1 unpooling copies (LOWERING.md 19.1), the vendor's
    five edge copies in its order (resize_bilinear_2x_int8 tasks 0-4 [V]): the interior at (1, 1)
    with line notch 2, the top and bottom rows, then the left and right columns read back from the
    padded tensor itself (1 wide, line notch W + 1: so the corners come from the rows just written)."""
    _, height, width = layer.input_shape
    wide = width + 2
    atom = out.atom_bytes
    src, dst = source.address + surface * source.surface_bytes, out.address + surface * out.surface_bytes
    line = source.line_stride_atoms * atom

    def copy(from_address, cols, rows, src_notch, to_address):
        cube = DpuCube(width=cols, height=rows, channels=out.c2, orig_channels=out.c2, dst_address=to_address,
                       dst_surface_stride=wide, surfaces_per_pass=2, precision=PRECISION_CODES[layer.dtype])
        return UnpoolTask(layer.name, from_address, cols, rows, src_notch, (1, 1), cube, out.surface_stride_atoms,
                          atom, line_notch=wide - cols)

    notch = source.line_stride_atoms - width
    return [copy(src, width, height, notch, dst + (wide + 1) * atom),
            copy(src, width, 1, notch, dst + atom),
            copy(src + (height - 1) * line, width, 1, notch, dst + ((height + 1) * wide + 1) * atom),
            copy(dst + atom, 1, height + 2, wide - 1, dst),
            copy(dst + width * atom, 1, height + 2, wide - 1, dst + (width + 1) * atom)]


def _surface_task(layer: ResizeLayer, source: TensorPlacement, out: TensorPlacement, surface: int) -> UnpoolTask:
    fy, fx = layer.factors
    _, height, width = layer.input_shape
    out_width = width * fx
    cube = DpuCube(width=out_width, height=height, channels=out.c2, orig_channels=out.c2,
                   dst_address=out.address + surface * out.surface_bytes, dst_surface_stride=out_width,
                   surfaces_per_pass=2, precision=PRECISION_CODES[layer.dtype])
    return UnpoolTask(layer.name, source.address + surface * source.surface_bytes, width, height,
                      source.line_stride_atoms - width, layer.factors, cube, out.surface_stride_atoms,
                      source.atom_bytes)


def lower_resize(layer: ResizeLayer, placements: Mapping[str, Placement], platform: Platform) -> tuple[UnpoolTask, ...]:
    """One unpooling task per C2 surface holding real channels (module docstring)."""
    source, out = unpacked_pair(layer, placements, "a resize")
    if source.c2 != out.c2 or source.pixel_bytes != source.atom_bytes:
        raise CompileError(f"layer {layer.name}: input and output must hold one {source.atom_bytes}-byte atom "
                           f"a pixel in the same C2")
    surfaces = -(-layer.input_shape[0] // out.c2)  # surfaces of real channels (a conv's padding ones are skipped)
    if layer.edge_pad:
        if layer.edge_pad != 1 or out.line_stride_atoms != layer.input_shape[2] + 2:
            raise CompileError(f"layer {layer.name}: an edge-padded copy pads one pixel into a dense output")
        return tuple(task for surface in range(surfaces) for task in _edge_tasks(layer, source, out, surface))
    return tuple(_surface_task(layer, source, out, surface) for surface in range(surfaces))


def _replace(b: RegisterBuilder, block: str, register: str, **fields: int) -> None:
    """Rewrite one write of the body in place (same position, so the vendor's order holds)."""
    probe = RegisterBuilder(b.regmap, b.layer)
    probe.write(block, register, **fields)
    for index, write in enumerate(b.writes):
        if (write.block, write.register) == (block, register):
            b.writes[index] = probe.writes[0]
            return
    raise CompileError(f"layer {b.layer}: the DPU body has no {block} {register} write")


def emit_unpool_task(task: UnpoolTask, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    """69 writes, enable 0x18: the DPU-only body (emit_dpu) with the unpooling registers."""
    b = RegisterBuilder(regmap, task.layer)
    write_s_pointers(b)
    cube, (fy, fx) = task.cube, task.factors
    write_dpu_body(b, cube, DpuStages(), conv_mode=0, flying=True, sources=RdmaSources(task.source_address))
    notch = cube.width * (fy - 1) if task.line_notch is None else task.line_notch
    precision = cube.precision
    _replace(b, "DPU", "DATA_FORMAT", OUT_PRECISION=precision, IN_PRECISION=INT16_CODE, PROC_PRECISION=precision)
    _replace(b, "DPU", "DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_1=notch, NOTCH_ADDR_0=notch)
    _replace(b, "DPU", "SURFACE_ADD", SURF_ADD=task.output_surface_atoms)
    _replace(b, "DPU_RDMA", "DATA_CUBE_WIDTH", WIDTH=task.source_width - 1)
    _replace(b, "DPU_RDMA", "DATA_CUBE_HEIGHT", HEIGHT=task.source_height - 1)
    _replace(b, "DPU_RDMA", "DATA_CUBE_CHANNEL", CHANNEL=task.atom_bytes // INT16_BYTES - 1)
    _replace(b, "DPU_RDMA", "FEATURE_MODE_CFG", IN_PRECISION=INT16_CODE, BURST_LEN=BURST_LEN, PROC_PRECISION=precision,
             FLYING_MODE=1)
    _replace(b, "DPU_RDMA", "SRC_DMA_CFG", LINE_NOTCH_ADDR=task.source_line_notch, UNPOOLING_EN=1,
             KERNEL_STRIDE_HEIGHT=fy - 1, KERNEL_STRIDE_WIDTH=fx - 1, KERNEL_HEIGHT=fy - 1, KERNEL_WIDTH=fx - 1)
    return Task(b.done(), ENABLE_DPU_ONLY, int_mask=INT_MASK_DPU, int_clear=INT_CLEAR_ALL, op_idx=op_idx)


__all__ = ["UnpoolTask", "emit_unpool_task", "lower_resize"]
