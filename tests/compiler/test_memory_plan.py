"""The memory plan: area order and alignment, lifetime-based reuse, 32-bit limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler.memory_plan import (
    ALIGN, DEFAULT_BASE, TensorLifetime, TensorView, fold_views, lifetimes_from_steps, plan_memory, reuse_offsets,
    view_roots,
)
from npuemu.isa.errors import CompileError


def _overlap(a, b) -> bool:
    return a.address < b.end and b.address < a.end


lifetimes = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=1, max_size=40,
).map(lambda rows: [TensorLifetime(f"t{i}", size, first, first + length) for i, (size, first, length) in enumerate(rows)])


@given(lifetimes)
def test_live_tensors_never_overlap(tensors: list[TensorLifetime]) -> None:
    plan = plan_memory({}, tensors)
    area = plan.area("internal")
    for i, a in enumerate(tensors):
        alloc_a = plan[a.name]
        assert alloc_a.address % ALIGN == 0
        assert area.base <= alloc_a.address and alloc_a.end <= area.base + area.size
        for b in tensors[i + 1:]:
            if a.overlaps(b):
                assert not _overlap(alloc_a, plan[b.name]), (a, b)
    assert area.size <= sum(-(-t.size // ALIGN) * ALIGN for t in tensors)


def test_a_chain_reuses_memory() -> None:
    steps = [((f"x{i}",), (f"x{i + 1}",)) for i in range(10)]
    sizes = {f"x{i}": 100_000 for i in range(11)}
    tensors = lifetimes_from_steps(steps, sizes, inputs=["x0"], outputs=["x10"])
    plan = plan_memory({"w": 1000}, tensors)
    internal = plan.area("internal").size
    assert internal <= 2 * 100_032  # two live buffers ping-pong through the chain
    assert sum(sizes.values()) > 5 * internal
    assert plan["x0"].area == "io" and plan["x10"].area == "io" and plan["x5"].area == "internal"


def test_area_order_alignment_and_trailer() -> None:
    plan = plan_memory([("b", 100), ("a", 70)], [TensorLifetime("t", 10, 0, 1),
                                                 TensorLifetime("in", 30, kind="input")], regcmd_bytes=1000)
    assert [a.name for a in plan.areas] == ["weights", "internal", "io", "regcmd"]
    assert plan["b"].address == DEFAULT_BASE and plan["a"].address == DEFAULT_BASE + 128  # in order, 64-aligned
    assert all(a.address % 64 == 0 for a in plan.allocations)
    assert plan["regcmd"].address == plan.area("regcmd").base and plan["regcmd"].size == 1000
    for earlier, later in zip(plan.areas, plan.areas[1:]):
        assert earlier.base + earlier.size == later.base
    trailer = plan.trailer()
    assert trailer["regions"] == [{"name": "ddr", "base": DEFAULT_BASE, "size": plan.size}]
    assert [a["name"] for a in trailer["areas"]] == ["weights", "internal", "io", "regcmd"]


def test_limits_and_errors() -> None:
    with pytest.raises(CompileError, match="exceed the 32-bit NPU address space"):
        plan_memory({"w": 1 << 32}, [])
    with pytest.raises(CompileError, match="'x' is allocated twice"):
        plan_memory({"x": 10}, [TensorLifetime("x", 10)])
    with pytest.raises(CompileError, match="64-byte aligned"):
        plan_memory({}, [], base=0x1001)
    with pytest.raises(CompileError, match="ends before it starts"):
        TensorLifetime("t", 10, 5, 2)


def test_first_fit_fills_gaps() -> None:
    tensors = [TensorLifetime("a", 1000, 0, 1), TensorLifetime("b", 500, 2, 3), TensorLifetime("c", 400, 0, 3)]
    offsets, extent = reuse_offsets(tensors)
    assert offsets["a"] == 0 and offsets["b"] == 0  # b reuses a's bytes
    assert offsets["c"] == 1024 and extent == 1472


@st.composite
def lifetimes_with_views(draw):
    """Random lifetimes, some tensors made views (at 16-byte offsets) of an earlier tensor, so
    views of views occur and no cycle does."""
    tensors = draw(lifetimes)
    views = []
    for index, tensor in enumerate(tensors[1:], start=1):
        if draw(st.booleans()):
            parent = draw(st.integers(0, index - 1))
            views.append(TensorView(tensor.name, f"t{parent}", 16 * draw(st.integers(0, 200)), tensor.size))
    return tensors, views


@settings(max_examples=60, deadline=None)
@given(lifetimes_with_views())
def test_views_never_share_bytes_with_other_live_tensors(case) -> None:
    """A view's bytes (inside its root) are never reused while the view - or its root - is
    live: the root's lifetime and size cover its views (fold_views)."""
    tensors, views = case
    roots = view_roots(views)
    plan = plan_memory({}, fold_views(tensors, views))
    area = plan.area("internal")

    def span(name, size):
        root, offset = roots.get(name, (name, 0))
        return root, plan.address(root) + offset, plan.address(root) + offset + size

    placed = [(t, *span(t.name, t.size)) for t in tensors]
    for t, root, start, end in placed:
        assert area.base <= start and end <= area.base + area.size
        assert end <= plan[root].end, (t, root)  # inside the root's allocation
    for i, (a, root_a, start_a, end_a) in enumerate(placed):
        for b, root_b, start_b, end_b in placed[i + 1:]:
            if root_a != root_b and a.overlaps(b):
                assert not (start_a < end_b and start_b < end_a), (a, b)


def test_view_limits() -> None:
    live = [TensorLifetime("x", 64, kind="input"), TensorLifetime("a", 64, 0, 1), TensorLifetime("b", 64, 1, 2)]
    with pytest.raises(CompileError, match="graph input"):
        fold_views(live, [TensorView("a", "x", 0, 64)])
    with pytest.raises(CompileError, match="cycle"):
        view_roots([TensorView("a", "b", 0, 64), TensorView("b", "a", 0, 64)])
    with pytest.raises(CompileError, match="multiple of 16"):
        TensorView("a", "b", 8, 64)
    folded = fold_views(live, [TensorView("a", "b", 128, 64)])
    assert [(t.name, t.size, t.first, t.last) for t in folded] == [("x", 64, 0, 0), ("b", 192, 0, 2)]
