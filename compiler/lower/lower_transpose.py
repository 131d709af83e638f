"""Transpose of a stored (C, H, W) map as DPU-only moves (LOWERING.md 35, 36).

The perm is the stored cube's (passes/transpose_npu.py maps the ONNX perm onto it):

- (0, 2, 1), H <-> W: perm (0, 1, 3, 2) of a ``[1, C, H, W]`` map, (0, 2, 1) / (1, 0) of a
  ``[1, A, B]`` / ``[A, B]`` tensor (stored as C x A x B, isa/container_views.tensor_cube). The
  vendor compiles it as one DPU-only task per C1 surface with every stage bypassed, moving whole
  atoms ([V] tests/emulator/vendor_dpu_transpose nwh_int8_16x6x10 (one task), nwh_fp16_16x6x10
  (two tasks, bases one 60-atom surface apart); emulator/REGISTER_SEMANTICS.md 31):
  the MRDMA reads a cube of W 1 x H lines, its "channels" the W input pixels of a line (one
  atom each: CHANNEL = W x 8 - 1 in int16 elements, IN = PROC = OUT precision int16, code 1,
  in int8 and fp16 builds alike), lines W atoms apart (LINE_NOTCH_ADDR W - 1) and "surfaces"
  one atom apart (SURF_NOTCH = 1 - (H + (H - 1) x (W - 1)), a negative 28-bit field);
  the WDMA writes it plainly (WDMA W x H = H x 1, SIZE_C_WDMA = W - 1): surface x (input
  column x) at x x H atoms, line y at y - i.e. output pixel (x, y) of the H-wide output.
  Columns are cut into runs of at most :data:`MAX_COLUMNS` (CHANNEL is 13 bits) [C]; the vendor
  builds seen have at most 10.
- (1, 2, 0) NHWC and (2, 0, 1) its reverse: the vendor's TP_EN / TP_ORG_EN task chains with a
  scratch tensor (transpose_perms.py). A layer with scratch is built as two layers (``stage`` 1:
  the tasks reading the input, writing the scratch; ``stage`` 2: the rest, reading the scratch),
  so the memory plan keeps the scratch alive between them (passes/transpose_npu.expand_transpose).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from npuemu.isa.errors import CompileError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task

from .dpu_moves import TransposeTask, emit_move
from .layers import FLOAT16, INT8, Quant
from .lookup import check_feature, tensor, unpacked_pair
from .placement import Placement, feature_placement
from .transpose_perms import Geometry, plan_moves

INT16 = 1  # DPU precision code of the 2-byte moves (REGISTER_SEMANTICS.md 31) [V]
MOVE_ELEMENT_BYTES = 2
CHANNEL_FIELD = 1 << 13  # DATA_CUBE_CHANNEL.CHANNEL is bits 12:0 (isa/regmaps/rk3588.yaml)
MAX_HEIGHT = 1 << 13  # DATA_CUBE_HEIGHT.HEIGHT is bits 12:0
SWAP_HW = (0, 2, 1)


def permuted(shape: tuple[int, int, int], perm: tuple[int, int, int]) -> tuple[int, int, int]:
    return tuple(shape[p] for p in perm)


@dataclass(frozen=True)
class TransposeLayer:
    """A stored (C, H, W) tensor written permuted by ``perm`` (of the cube's axes): ``quant`` the
    shared int8 quantization. ``stage`` 1 / 2: the two halves of a perm with scratch (module
    docstring); their scratch tensor is stage 1's output and stage 2's input, ``scratch_shape``
    its stored shape, ``source_shape`` the map being transposed."""

    name: str
    input: str
    output: str
    input_shape: tuple[int, int, int]
    quant: Quant | None
    dtype: str = INT8
    perm: tuple[int, int, int] = SWAP_HW
    stage: int = 0
    source_shape: tuple[int, int, int] | None = None
    scratch_shape: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        object.__setattr__(self, "perm", tuple(int(v) for v in self.perm))
        if self.dtype not in (INT8, FLOAT16):
            raise CompileError(f"layer {self.name}: a transpose of {self.dtype!r}; expected int8 or float16")
        if self.perm == SWAP_HW and self.input_shape[1] > MAX_HEIGHT:
            raise CompileError(f"layer {self.name}: transpose of {self.input_shape[1]} rows; the DPU cube takes "
                               f"at most {MAX_HEIGHT}")
        if self.stage and (self.source_shape is None or self.scratch_shape is None):
            raise CompileError(f"layer {self.name}: stage {self.stage} of a transpose needs its source and "
                               f"scratch shapes")

    @property
    def source(self) -> tuple[int, int, int]:
        return self.input_shape if self.source_shape is None else tuple(self.source_shape)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        if self.stage == 1:
            return tuple(self.scratch_shape)
        return permuted(self.source, self.perm)


def lower_transpose(layer: TransposeLayer, placements: Mapping[str, Placement], platform) -> tuple[TransposeTask, ...]:
    if layer.perm == SWAP_HW:
        return _swap_height_width(layer, placements)
    return _permute(layer, placements, platform)


def _swap_height_width(layer: TransposeLayer, placements: Mapping[str, Placement]) -> tuple[TransposeTask, ...]:
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
            columns = min(run, width - first)
            channels = columns * elements
            tasks.append(TransposeTask(
                layer.name, src + first * atom, dst + first * height * atom, width=1, height=height,
                channels=channels, precision=INT16, dst_surface_stride=height, surface_add=height,
                wdma=(channels, columns, height, 1), line_notch=width - 1,
                surf_notch=1 - (height + (height - 1) * (width - 1))))
    return tuple(tasks)


def transpose_geometry(shape, dtype: str, perm, platform) -> Geometry:
    """The plan's view of a transpose of a stored ``shape`` map (surface strides as placed)."""
    source = feature_placement("x", 0, shape, dtype, platform)
    out = feature_placement("y", 0, permuted(shape, perm), dtype, platform)
    return Geometry(tuple(shape), dtype, source.surface_stride_atoms, out.surface_stride_atoms)


def _permute(layer: TransposeLayer, placements: Mapping[str, Placement], platform) -> tuple[TransposeTask, ...]:
    """The tasks of ``layer.stage`` of the perm's plan (transpose_perms.py)."""
    geometry = transpose_geometry(layer.source, layer.dtype, layer.perm, platform)
    moves, scratch_atoms = plan_moves(layer.perm, geometry)
    stored = {"x": layer.input if layer.stage != 2 else None, "y": layer.output if layer.stage != 1 else None,
              "e": {1: layer.output, 2: layer.input}.get(layer.stage)}
    shapes = {"x": layer.source, "y": permuted(layer.source, layer.perm), "e": layer.scratch_shape}
    addresses = {}
    for key, name in stored.items():
        if name is None:
            continue
        placed = tensor(placements, name, layer.name)
        check_feature(placed, shapes[key], layer.dtype, "input" if name == layer.input else "output", layer.name)
        if placed.packed:
            raise CompileError(f"layer {layer.name}: a transpose needs NC1HWC2 tensors, not packed images")
        if key == "e" and placed.size < scratch_atoms * placed.atom_bytes:
            raise CompileError(f"layer {layer.name}: scratch {name!r} holds {placed.size} bytes, the moves need "
                               f"{scratch_atoms * placed.atom_bytes}")
        expected = {"x": geometry.source_surface, "y": geometry.out_surface}.get(key)
        if expected is not None and placed.surface_stride_atoms != expected:
            raise CompileError(f"layer {layer.name}: {name!r} surfaces are {placed.surface_stride_atoms} atoms "
                               f"apart, the plan reads them {expected} apart")
        addresses[key] = placed.address
    picked = [m for m in moves if layer.stage == 0 or (m.source[0] == "x") == (layer.stage == 1)]
    if any(not {m.source[0], m.dst[0]} <= set(addresses) for m in picked):
        raise CompileError(f"layer {layer.name}: stage {layer.stage} of cube perm {layer.perm} reads or writes a "
                           f"tensor it has no placement for")
    return tuple(m.resolve(layer.name, addresses) for m in picked)


def emit_transpose_task(task: TransposeTask, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    """The 69 writes of a DPU-only task (emit_dpu), with the move's read and write geometry."""
    return emit_move(task, regmap, op_idx)


__all__ = ["SWAP_HW", "TransposeLayer", "TransposeTask", "emit_transpose_task", "lower_transpose", "permuted",
           "transpose_geometry"]
