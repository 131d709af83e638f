"""A kernel loaded from Numba's cache keeps its linking bitcode unparsed until something links
against it (issue 20, first call; emulator/numba_lazy_link.py): the symbols seeded from the
machine code are among those the bitcode defines (every cached kernel in the cache directory),
a function compiled later links against a lazily loaded kernel and computes what the kernel
does, and the engine's symbol table, once completed, is the one Numba's own load builds."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as ll
import pytest

from npuemu.emulator import machine  # noqa: F401  (installs the cache load)
from npuemu.emulator import numba_lazy_link, numerics

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys
import numpy as np
from numba import njit
from npuemu.emulator import machine  # (installs the cache load)
from npuemu.emulator import numba_lazy_link, numerics
from numba.core.registry import cpu_target
x = np.int64(1 << 40)
direct = int(numerics.saturate_int32(x))
engine = cpu_target.target_context.codegen()._engine
pending = sum(len(v) for v in numba_lazy_link._pending.values())
from numba.core.runtime import nrt
nrt_before = nrt.rtsys._library is not None

@njit
def outer(value):
    return numerics.saturate_int32(value) + 1

linked = int(outer(x))

@njit
def allocates(n):  # (a new compile: links the NRT library, compiled on demand)
    return np.arange(n).sum()

total = int(allocates(10))
engine.is_symbol_defined("npuemu.no.such.symbol")  # (a miss: completes the table)
print("RESULT " + json.dumps({"direct": direct, "linked": linked, "pending": pending, "total": total,
      "nrt_before": nrt_before, "nrt_after": nrt.rtsys._library is not None,
      "hits": len(numerics.saturate_int32.stats.cache_hits),
      "symbols": sorted(s for s in engine._defined_symbols if "npuemu" in s)}))
"""


def _child(full_load: bool) -> dict:
    """A fresh process: a kernel from the cache, then new compiles against it and the NRT."""
    env = {**os.environ, "NPUEMU_NUMBA_FULL_LOAD": "1" if full_load else "0"}
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_a_later_compile_links_against_a_lazily_loaded_kernel_and_the_table_ends_as_numbas():
    rows = [_child(False) for _ in range(2)]  # (the first may compile: another test edited numerics)
    lazy = rows[-1]
    assert lazy["hits"] == 1 and lazy["pending"] >= 1, lazy
    assert lazy["direct"] == 2**31 - 1 and lazy["linked"] == lazy["direct"] + 1 and lazy["total"] == 45
    assert not lazy["nrt_before"] and lazy["nrt_after"], lazy  # (emulator/numba_nrt_deferred.py)
    full = _child(True)
    assert full["hits"] == 1 and full["pending"] == 0 and full["linked"] == lazy["linked"] and full["total"] == 45
    assert full["nrt_before"] and full["nrt_after"]
    assert lazy["symbols"] == full["symbols"] and lazy["symbols"]


def _cached_kernels(limit: int = 60) -> list[tuple]:
    numerics.saturate_int32(1)  # (at least one entry)
    folders = {Path(numerics.saturate_int32._cache._cache_path)}
    from npuemu.emulator.kernels import dpu_pixel

    folders.add(Path(dpu_pixel._tile._cache._cache_path))  # (the kernels' folder)
    rows = []
    for path in sorted(p for folder in folders for p in folder.glob("*.nbc"))[:limit]:
        try:
            payload = pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001 - a file another process is writing, or of a module not importable here
            continue
        if payload[0][1] == "object":
            rows.append((path.name, payload[0][2], payload[1].llvm_cpython_wrapper_name))
    return rows


def test_seeded_symbols_are_defined_by_the_bitcode_and_name_the_entry_point():
    rows = _cached_kernels()
    assert rows
    for name, (object_code, bitcode), wrapper in rows:
        seeded = numba_lazy_link.defined_symbols(object_code)
        module = ll.parse_bitcode(bitcode)
        defined = {g.name for g in (*module.functions, *module.global_variables) if not g.is_declaration}
        assert seeded and seeded <= defined, name
        assert wrapper in seeded, name


@pytest.mark.parametrize("blob", [b"", b"not an object", b"\x7fELF\x01\x01" + bytes(64),  # (32-bit)
                                  b"\x7fELF\x02\x02" + bytes(64),  # (big-endian)
                                  b"\x7fELF\x02\x01" + bytes(20)])  # (truncated)
def test_anything_but_an_elf64_little_endian_object_is_not_read(blob):
    assert numba_lazy_link.defined_symbols(blob) is None


def test_a_corrupt_section_table_is_not_read():
    rows = _cached_kernels(limit=1)
    assert rows
    object_code = bytearray(rows[0][1][0])
    struct.pack_into("<Q", object_code, 0x28, len(object_code) + 4096)  # e_shoff past the end
    assert numba_lazy_link.defined_symbols(bytes(object_code)) is None


class _Engine:
    def __init__(self, defined=()):
        self._defined_symbols = set(defined)

    def is_symbol_defined(self, name):
        return name in self._defined_symbols


def test_the_nrt_library_is_compiled_first_for_machine_code_naming_a_symbol_nothing_defines(monkeypatch):
    from npuemu.emulator import numba_nrt_deferred

    calls = []
    monkeypatch.setattr(numba_nrt_deferred, "ensure", lambda: calls.append(1))
    numba_nrt_deferred.ensure_for({"PyErr_SetString", "memset", "defined_in_engine"}, _Engine(["defined_in_engine"]))
    assert not calls
    numba_nrt_deferred.ensure_for({"PyErr_SetString", "NRT_incref_npuemu_test_only"}, _Engine())
    assert calls == [1]


def test_symbol_names_splits_defined_and_undefined():
    rows = _cached_kernels(limit=3)
    assert rows
    for name, (object_code, _), wrapper in rows:
        defined, undefined = numba_lazy_link.symbol_names(object_code)
        assert wrapper in defined and not defined & undefined, name
        assert "PyArg_UnpackTuple" in undefined, name  # (every wrapper unpacks its arguments)
