"""ND host tensors (isa/CONTAINER.md 3.3): row-major storage of any rank and element type,
and the trailer schema's checks of their records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.cpu_ops_tensors import read_nd, write_nd
from npuemu.emulator.memory import Memory
from npuemu.isa.container_trailer import ND_DTYPES, SchemaViolation, validate_trailer
from npuemu.isa.errors import InputError


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(ND_DTYPES), st.lists(st.integers(0, 4), min_size=0, max_size=5), st.integers(0, 99))
def test_nd_round_trip_is_row_major(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    values = (rng.normal(size=shape) * 50).astype(dtype) if dtype != "bool" else rng.random(shape) > 0.5
    memory = Memory(1 << 16)
    info = {"name": "t", "shape": shape, "dtype": dtype, "layout": "ND", "address": 64,
            "size": max(1, values.nbytes)}
    write_nd(memory, info, values)
    np.testing.assert_array_equal(read_nd(memory, info), values)
    raw = memory.dump(64, values.nbytes)  # row-major little-endian bytes, nothing else
    assert raw.tobytes() == np.ascontiguousarray(values).astype(np.dtype(dtype).newbyteorder("<")).tobytes()


def test_nd_write_checks_the_shape():
    memory = Memory(1 << 12)
    info = {"name": "t", "shape": [2, 3], "dtype": "int64", "layout": "ND", "address": 0, "size": 48}
    with pytest.raises(InputError, match="expected shape"):
        write_nd(memory, info, np.zeros((3, 2), np.int64))


def test_trailer_checks_nd_records():
    validate_trailer({"tensors": [{"name": "t", "shape": [2, 1, 3, 1, 2], "dtype": "bool", "layout": "ND"}]})
    with pytest.raises(SchemaViolation, match=r"tensors\[0\]\.dtype"):
        validate_trailer({"tensors": [{"name": "t", "shape": [2], "dtype": "float8e4m3fn", "layout": "ND"}]})
    with pytest.raises(SchemaViolation, match="needs its 'shape'"):
        validate_trailer({"tensors": [{"name": "t", "dtype": "int64", "layout": "ND"}]})


def test_compiler_host_ops_are_the_runtime_ops():
    """build_host.CPU_OPS (what the compiler may emit as a CPU step) is what the runtime runs."""
    from npuemu.compiler.build_host import CPU_OPS
    from npuemu.emulator.cpu_ops import OPS

    assert set(CPU_OPS) == set(OPS)
