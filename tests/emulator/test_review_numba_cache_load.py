"""Review (session 16) of emulator/numba_cache_load.py: after a kernel loads from the cache without
Numba's refresh, a later JIT compile in the same process (which refreshes then) works - typed
containers, str hashing, np.sort (numba.np.arraymath; not np.linalg: Numba's needs SciPy, which
the project does not install), np.random, an exception with a message, and a call into the kernel
loaded without refresh - and the loaded kernel computes what it computes after a compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys
import numpy as np
from npuemu.emulator import machine  # (installs the cache load)
from npuemu.emulator.kernels import lut_folded
table = np.array([5, 5, 1, 2, 2, 2, 7], np.int8)
around = [tuple(int(v) for v in lut_folded._run_around(table, i)) for i in range(7)]
result = {"around": around, "hits": len(lut_folded._run_around.stats.cache_hits),
          "refreshed": "numba.np.linalg" in sys.modules}
if sys.argv[1] == "later":
    from numba import njit, typed, types

    @njit
    def later(table, n):
        d = typed.Dict.empty(types.unicode_type, types.int64)
        d["a" + str(n)] = n
        np.random.seed(n)
        r = np.random.randint(0, 1000)
        inv = np.sort(np.array([4.0, 0.25, 2.0, 1.0])).reshape(2, 2)  # (numba.np.arraymath)
        a, b = lut_folded._run_around(table, n)
        if n < 0:
            raise ValueError("negative n")
        return d["a" + str(n)] + a * 10 + b, r, inv[1, 1], hash("npuemu") == hash("npu" + "emu")

    got = later(table, 3)
    np.random.seed(3)
    result["later"] = [int(got[0]), float(got[2]), bool(got[3])]
    try:
        later(table, -1)
    except ValueError as error:
        result["error"] = str(error)
print("RESULT " + json.dumps(result))
"""


def _child(mode: str, cache: Path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    env.pop("NPUEMU_NUMBA_FULL_LOAD", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, env=env, cwd=ROOT,
                         check=True).stdout
    return json.loads(out.split("RESULT ", 1)[1])


def test_a_kernel_loaded_without_refresh_then_a_later_compile(tmp_path):
    compiled = _child("first", tmp_path)  # compiles and writes the cache
    assert compiled["hits"] == 0
    loaded = _child("later", tmp_path)
    assert loaded["hits"] == 1 and not loaded["refreshed"]  # (the fast path: no refresh before the load)
    want = [(0, 1), (0, 1), (2, 2), (3, 5), (3, 5), (3, 5), (6, 6)]
    assert [tuple(a) for a in compiled["around"]] == [tuple(a) for a in loaded["around"]] == want
    assert loaded["later"] == [3 + 35, 4.0, True]
    assert loaded["error"] == "negative n"
