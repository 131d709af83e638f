"""Which Transposes run on the NPU (LOWERING.md 35): the partition's rule.

A Transpose is a byte move, so it runs on the DPU when its perm swaps the two axes the NPU stores
as H and W (isa/container_views.tensor_cube): perm (0, 1, 3, 2) of a [1, C, H, W] map, (0, 2, 1)
of a rank-3 tensor (stored C x H x W; a transformer's [1, T, C] <-> [1, C, T]), (1, 0) of a matrix.
The vendor's form of these is one DPU copy per C1 surface (lower/lower_transpose.py). Other perms
stay host steps, with the perm named in the partition report (the vendor's multi-task forms of
the other perms are in emulator/REGISTER_SEMANTICS.md 31; not lowered yet).
"""

from __future__ import annotations

from ..ir import Graph, Node
from .constraints import Constraint, as_cube, shape
from .context import PassContext

ATOM_BYTES = 16  # the moves are whole 16-byte atoms: int8 C2 16 and fp16 C2 8 (RK3588/RK3576)
MAX_ROWS = 1 << 13  # DATA_CUBE_HEIGHT.HEIGHT is 13 bits (lower_transpose.MAX_HEIGHT)


def swapped_last_two(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


@Constraint
def transpose_swaps_height_width(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Transpose swaps the last two axes - perm (0, 1, 3, 2) of [1, C, H, W], (0, 2, 1) of a rank-3
    tensor, (1, 0) of a matrix: the stored H and W - with at most 8192 rows, on a chip whose int8
    and float16 pixels are 16-byte atoms (DPU copies, LOWERING.md 35)."""
    dims = shape(graph, node.inputs[0])
    perm = [int(p) for p in node.attrs["perm"]]
    if not 2 <= len(dims) <= 4 or perm != swapped_last_two(len(dims)):
        return f"perm {perm} of a rank-{len(dims)} tensor is not lowered"
    cube, out = as_cube(dims), as_cube(shape(graph, node.outputs[0]))
    if cube is None or out != (cube[0], cube[2], cube[1]):  # [1, C] is stored C x 1 x 1, [C, 1] 1 x C x 1
        return f"'{node.inputs[0]}' of shape {list(dims)} is not stored with those axes as H and W"
    if cube[1] > MAX_ROWS:
        return f"'{node.inputs[0]}' has {cube[1]} rows"
    platform = ctx.platform
    if platform.c2("int8") != ATOM_BYTES or 2 * platform.c2("float16") != ATOM_BYTES:
        return f"{platform.name} pixels are not 16-byte atoms"
    return None


__all__ = ["swapped_last_two", "transpose_swaps_height_width"]
