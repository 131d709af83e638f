"""Which Transposes run on the NPU (LOWERING.md 35, 36): the partition's rule, the record's form,
and the split of a Transpose that needs scratch into two build layers.

A Transpose is a byte move. Its ONNX perm is mapped onto the stored cube (C, H, W)
(isa/container_views.tensor_cube: [1, C, H, W]; [c, h, w]; [h, w] as 1 x h x w): perm (0, a, b, c)
of a rank-4 map is cube perm (a - 1, b - 1, c - 1), a rank-3 perm is its own, (1, 0) of a matrix
is (0, 2, 1). Every perm that keeps N runs on the DPU (lower/lower_transpose.py, transpose_perms.py):
(0, 2, 1) - H <-> W, one copy per C1 surface; (1, 2, 0) - NHWC, ONNX (0, 2, 3, 1); (2, 0, 1) - its
reverse, ONNX (0, 3, 1, 2); (1, 0, 2) - ONNX (0, 2, 1, 3); (2, 1, 0) - ONNX (0, 3, 2, 1). One whose
plan does not fit the DPU fields but a pair of others does is made that pair before the partition
(:func:`transposes_as_lowered_pairs`); a perm that moves N, or a map neither fits, stays a host
step naming why.

The NHWC forms need the vendor's ``x_exSecondary`` scratch tensor. At build stage 5
(``layer_records``) :func:`expand_transpose` splits such a node into two Transpose nodes around a
scratch tensor (``<output>_exSecondary``, int8 / float16 like the map, [1, C2, 1, atoms]); the
records carry the form (:func:`transpose_form`): stage 1 runs the tasks that read the input,
stage 2 the rest.
"""

from __future__ import annotations

import dataclasses

from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.tensor_layout import surface_atoms

from ..ir import Graph, Node, Tensor
from ..lower.lower_transpose import SWAP_HW, emit_transpose_task, permuted, transpose_geometry
from ..lower.transpose_perms import PLANS, Geometry, plan_moves
from .constraints import Constraint, as_cube, shape
from .context import PassContext

ATOM_BYTES = 16  # the moves are whole 16-byte atoms: int8 C2 16 and fp16 C2 8 (RK3588/RK3576)
MAX_ROWS = 1 << 13  # DATA_CUBE_HEIGHT.HEIGHT is 13 bits (lower_transpose.MAX_HEIGHT)
LOWERED = (SWAP_HW, *PLANS)
STAGE, SOURCE, SCRATCH = "npu_stage", "npu_source_shape", "npu_scratch_shape"  # attrs of split nodes


def swapped_last_two(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


def cube_perm(dims: tuple[int, ...], perm: list[int]) -> tuple[int, int, int] | None:
    """The ONNX ``perm`` of a ``dims`` tensor as a perm of its stored (C, H, W); None if it moves the batch."""
    if len(dims) == 4:
        return tuple(p - 1 for p in perm[1:]) if perm[0] == 0 else None
    if len(dims) == 3:
        return tuple(perm)
    if len(dims) == 2:
        return 0, perm[0] + 1, perm[1] + 1
    return None


def _fits(name: str, cube: tuple[int, int, int], perm: tuple[int, int, int], ctx: PassContext) -> str | None:
    """The plan's tasks emitted for ``ctx.platform`` (dtype float16 and int8): a field overflow names itself."""
    regmap = load_regmap(ctx.platform.register_map.family)
    for dtype in ("int8", "float16"):
        moves, _ = plan_moves(perm, transpose_geometry(cube, dtype, perm, ctx.platform))
        try:
            for move in moves:
                emit_transpose_task(move.resolve(name, {"x": 0, "e": 0, "y": 0}), regmap)
        except CompileError as error:
            return f"{dtype}: {error}"
    return None


@Constraint
def transpose_swaps_height_width(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Transpose of a [1, C, H, W] map (or a tensor of rank 2 or 3 stored as such) whose perm swaps
    the stored H and W, or is (0, 2, 3, 1), (0, 3, 1, 2), (0, 2, 1, 3) or (0, 3, 2, 1), with the DPU fields
    fitting, on a chip whose int8 and float16 pixels are 16-byte atoms (DPU moves, LOWERING.md 35, 36)."""
    dims = shape(graph, node.inputs[0])
    perm = [int(p) for p in node.attrs["perm"]]
    moved = cube_perm(dims, perm) if 2 <= len(dims) <= 4 else None
    if moved not in LOWERED:
        return f"perm {perm} of a rank-{len(dims)} tensor is not lowered"
    cube, out = as_cube(dims), as_cube(shape(graph, node.outputs[0]))
    if cube is None or out != permuted(cube, moved):  # [1, C] is stored C x 1 x 1, [C, 1] 1 x C x 1
        return f"'{node.inputs[0]}' of shape {list(dims)} is not stored with those axes as C, H and W"
    platform = ctx.platform
    if platform.c2("int8") != ATOM_BYTES or 2 * platform.c2("float16") != ATOM_BYTES:
        return f"{platform.name} pixels are not 16-byte atoms"
    if moved == SWAP_HW:
        return f"'{node.inputs[0]}' has {cube[1]} rows" if cube[1] > MAX_ROWS else None
    return _fits(node.name, cube, moved, ctx)


#: cube perms built as two lowered ones where their own plan does not fit [C]: (1, 0, 2) = ONNX
#: (0, 2, 1, 3) as NHWC then H <-> W (its plan's TP_EN lines are Hp / R atoms: at most 8); (2, 1, 0)
#: = ONNX (0, 3, 2, 1) as NWCH then H <-> W (its plan's tiles are W Hp / R: at most 1024)
COMPOSED = {(1, 0, 2): ((1, 2, 0), SWAP_HW), (2, 1, 0): ((2, 0, 1), SWAP_HW)}


def _onnx_perm(rank: int, perm: tuple[int, int, int]) -> list[int]:
    return [0, *(p + 1 for p in perm)] if rank == 4 else list(perm)


def transposes_as_lowered_pairs(graph: Graph, ctx: PassContext) -> int:
    """A Transpose (0, 2, 1, 3) or (0, 3, 2, 1) too large for its own plan becomes two the DPU runs."""
    changed = 0
    for node in list(graph.nodes):
        if node.op_type != "Transpose" or node.fused:
            continue
        dims = tuple(shape(graph, node.inputs[0]))
        moved = cube_perm(dims, [int(p) for p in node.attrs["perm"]]) if 2 < len(dims) <= 4 else None
        cube = as_cube(dims)
        if moved not in COMPOSED or cube is None or as_cube(shape(graph, node.outputs[0])) != permuted(cube, moved):
            continue
        first, second = COMPOSED[moved]
        middle = permuted(cube, first)
        if ctx.platform.c2("int8") != ATOM_BYTES or 2 * ctx.platform.c2("float16") != ATOM_BYTES \
                or (moved in PLANS and _fits(node.name, cube, moved, ctx) is None) \
                or middle[1] > MAX_ROWS or _fits(node.name, cube, first, ctx) is not None:
            continue   # stays one Transpose: the partition names why
        source = graph.tensor(node.inputs[0])
        mid = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{node.outputs[0]}_perm"),
                                      (1, *middle) if len(dims) == 4 else middle, source.dtype))
        before = Node(graph.unique_node_name(f"{node.name}_perm"), "Transpose", [source.name], [mid.name],
                      {"perm": _onnx_perm(len(dims), first)})
        graph.nodes.insert(graph.nodes.index(node), before)
        node.inputs, node.attrs = [mid.name], {**node.attrs, "perm": _onnx_perm(len(dims), second)}
        changed += 1
    return changed


def transpose_form(graph: Graph, node: Node) -> dict:
    """The TransposeLayer fields of a Transpose node beyond its input: the cube perm, and for the
    two halves of a split node their stage, source and scratch shapes."""
    perm = cube_perm(tuple(graph.tensor(node.inputs[0]).shape), [int(p) for p in node.attrs["perm"]])
    if STAGE not in node.attrs:
        return {"perm": perm}
    source = tuple(node.attrs[SOURCE])
    return {"perm": cube_perm((1, *source), [int(p) for p in node.attrs["perm"]]), "stage": node.attrs[STAGE],
            "source_shape": source, "scratch_shape": tuple(node.attrs[SCRATCH])}


def expand_transpose(graph: Graph, node: Node) -> tuple[list[Tensor], list[Node]] | None:
    """(scratch tensor, [stage 1, stage 2]) of an NPU Transpose whose plan needs scratch; else None."""
    if node.op_type != "Transpose" or node.target != "NPU" or STAGE in node.attrs:
        return None
    source = graph.tensor(node.inputs[0])
    cube = as_cube(tuple(source.shape))
    perm = cube_perm(tuple(source.shape), [int(p) for p in node.attrs["perm"]])
    if perm not in PLANS or cube is None:
        return None
    dtype = "float16" if source.quant is not None and source.quant.dtype == "float16" else "int8"
    lanes = ATOM_BYTES // (2 if dtype == "float16" else 1)
    # the scratch's size only: the plan's atoms, one surface of C2 lanes (its layout is the plan's)
    moves, atoms = plan_moves(perm, _plain_geometry(cube, dtype, perm))
    if all("e" not in (move.source[0], move.dst[0]) for move in moves):
        return None  # x -> y in one move (fp16 NHWC of one whole surface): no scratch, one layer
    scratch_shape = (lanes, 1, atoms)
    scratch = Tensor(graph.unique_tensor_name(f"{node.outputs[0]}_exSecondary"), (1, *scratch_shape), source.dtype, quant=source.quant)
    # an ONNX perm over [1, C, H, W] that gives the cube perm: stage records map it back (transpose_form)
    onnx_perm = [0, *(p + 1 for p in perm)]
    attrs = {"perm": onnx_perm, SOURCE: list(cube), SCRATCH: list(scratch_shape)}
    first = Node(graph.unique_node_name(f"{node.name}_tp1"), "Transpose", [source.name], [scratch.name], {**attrs, STAGE: 1}, [], "NPU")
    second = dataclasses.replace(node, attrs={**attrs, STAGE: 2}, inputs=[scratch.name])
    return [scratch], [first, second]


def _plain_geometry(cube, dtype, perm):
    """transpose_geometry without a platform: both dtypes' atoms are 16 bytes here (the rule's check)."""
    out = permuted(cube, perm)
    return Geometry(tuple(cube), dtype, surface_atoms(cube[1], cube[2]), surface_atoms(out[1], out[2]))


__all__ = ["COMPOSED", "cube_perm", "expand_transpose", "swapped_last_two", "transpose_form",
           "transpose_swaps_height_width", "transposes_as_lowered_pairs"]
