"""Numba's array type without importing numpy.ma (issue 20, first call;
emulator/numba_array_typeof.py): the installed rule answers what Numba's own rule answers for
arrays of any dtype, rank, layout and writeability, raises Numba's errors, still refuses masked
arrays once numpy.ma exists, and a fresh process's first inference leaves numpy.ma unimported."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba.core import errors
from numba.core.typing import typeof as numba_typeof

from npuemu.emulator import numba_array_typeof

ROOT = Path(__file__).resolve().parents[2]
DTYPES = ["int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "float32", "float64", "complex64",
          "bool", "datetime64[ns]", "timedelta64[s]", "M8", "U3", "S2", "O", [("a", "i4"), ("b", "f8")]]


@contextmanager
def _as_if_numpy_ma_unimported():
    """The rule's fast path even when this test process imported numpy.ma (pytest plugins do)."""
    saved = sys.modules.pop("numpy.ma", None)
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["numpy.ma"] = saved


def _rules():
    assert numba_array_typeof.install()
    installed = numba_typeof.typeof_impl.registry[np.ndarray]
    return installed, installed.numba_rule


@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
       view=st.sampled_from(["c", "f", "step", "transpose"]), readonly=st.booleans())
def test_the_same_type_as_numbas_rule(dtype, shape, view, readonly):
    installed, numba_rule = _rules()
    value = np.zeros(shape, dtype=dtype)
    if view == "f":
        value = np.asfortranarray(value)
    elif view == "step" and value.ndim:
        value = value[::2]
    elif view == "transpose":
        value = value.T
    value.flags.writeable = not readonly
    context = numba_typeof.Purpose.argument
    expected = numba_rule(value, context)
    with _as_if_numpy_ma_unimported():
        assert installed(value, context) == expected
        assert numba_typeof.typeof(value, context) == expected


@pytest.mark.parametrize("dtype", ["V3", np.dtype("f2").newbyteorder(), [("a", object)]])
def test_numbas_errors_for_what_it_cannot_type(dtype):
    installed, numba_rule = _rules()
    value = np.zeros(2, dtype=dtype)
    with pytest.raises(errors.NumbaValueError) as numbas:
        numba_rule(value, None)
    with _as_if_numpy_ma_unimported(), pytest.raises(errors.NumbaValueError) as ours:
        installed(value, None)
    assert str(ours.value) == str(numbas.value)


def test_masked_arrays_are_still_refused():
    installed, _ = _rules()
    masked = np.ma.masked_array([1, 2], mask=[0, 1])  # (numpy.ma imported from here on)
    with pytest.raises(errors.NumbaTypeError):
        installed(masked, None)


_CHILD = """
import json, sys
import numpy as np
from benchmarks.fixed_cost import chain_model
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
runtime = Runtime(ModelFile.read(sys.argv[1]))
runtime.set_input(runtime.inputs[0], np.load(sys.argv[2]))
runtime.run()
print("RESULT " + json.dumps({"ma": "numpy.ma" in sys.modules}))
"""


def test_a_first_inference_leaves_numpy_ma_unimported(tmp_path):
    from benchmarks.fixed_cost import chain_model
    from npuemu.compiler.build import build_model
    from tests.compiler.test_build_e2e import compile_graph

    shape = (1, 16, 8, 8)
    model = build_model(compile_graph(chain_model(1, 0, input_name="x"), shape))
    npu, x_path = tmp_path / "m.npu", tmp_path / "x.npy"
    model.write(npu)
    np.save(x_path, np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(npu), str(x_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    assert json.loads(line[len("RESULT "):]) == {"ma": False}
