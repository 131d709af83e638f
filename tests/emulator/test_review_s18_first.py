"""Review of session 18's first-call changes (issue 20): hostile bytes for the ELF symbol reader
(emulator/numba_lazy_link.py), a bare deferred cache (emulator/numba_deferred_cache.py), array
subclasses typed as Numba types them (emulator/numba_array_typeof.py), pickled dispatchers, and
fresh processes that load kernels lazily and then use them from threads, from new compiles that
link against them, and from fork and spawn children (CHILD's scenarios)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as ll
import numpy as np
import pytest
from numba.core.typing import typeof as numba_typeof

from npuemu.emulator import machine  # noqa: F401  (installs the cache load and the array rule)
from npuemu.emulator import numba_array_typeof, numba_lazy_link, numerics
from npuemu.emulator.kernels import canonical_nan
from npuemu.emulator.numba_deferred_cache import DeferredCache

ROOT = Path(__file__).resolve().parents[2]
_ELF = struct.Struct("<16xHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")


def _object() -> bytes:
    """A small ELF object from LLVM: defined f, g, weak w; undefined ext."""
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    module = ll.parse_assembly("define i64 @f(i64 %x) {\n ret i64 %x\n}\n@g = global i64 1\n"
                               "declare i64 @ext(i64)\n"
                               "define weak i64 @w() {\n %r = call i64 @ext(i64 1)\n ret i64 %r\n}\n")
    return ll.Target.from_default_triple().create_target_machine(codemodel="jitdefault").emit_object(module)


class _CountingSymbol:
    """numba_lazy_link's symbol-entry reader, counting the entries it reads."""

    def __init__(self, real):
        self.real, self.size, self.reads = real, real.size, 0

    def unpack_from(self, data, offset):
        self.reads += 1
        return self.real.unpack_from(data, offset)


@pytest.fixture
def counting(monkeypatch):
    symbol = _CountingSymbol(numba_lazy_link._SYMBOL)
    monkeypatch.setattr(numba_lazy_link, "_SYMBOL", symbol)
    return symbol


def _valid(table) -> bool:
    return table is None or (isinstance(table, tuple) and all(isinstance(part, set) for part in table))


def test_the_llvm_object_reads_as_its_symbols():
    assert numba_lazy_link.symbol_names(_object()) == ({"f", "g", "w"}, {"ext"})


def test_many_section_headers_naming_one_big_symbol_table_are_read_once(counting):
    """3000 headers all pointing at one 3000-entry table: read once (was 9 million reads)."""
    headers, entries, strings = 3000, 3000, b"\0a\0"
    table = struct.pack("<IBBHQQ", 1, 0x10, 0, 1, 0, 0) * entries
    data = 64 + 64 * headers
    sections = [_SECTION.pack(0, 3, 0, 0, data, len(strings), 0, 0, 1, 0)]
    sections += [_SECTION.pack(0, 2, 0, 0, data + len(strings), len(table), 0, 0, 8, 24)] * (headers - 1)
    header = struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, 64, 0, 64, 0, 0, 64, headers, 0)
    blob = (b"\x7fELF\x02\x01\x01" + bytes(9) + header
            + b"".join(sections) + strings + table)
    assert numba_lazy_link.symbol_names(blob) == ({"a"}, set())
    assert counting.reads <= entries


def test_every_truncation_of_an_object_reads_as_nothing_or_a_table(counting):
    whole = _object()
    for end in range(len(whole)):
        assert _valid(numba_lazy_link.symbol_names(whole[:end])), end
    assert counting.reads <= len(whole) ** 2 // 24  # (each prefix reads at most its own entries)


@pytest.mark.parametrize("field", ["sh_offset", "sh_size", "sh_link", "sh_name", "e_shoff", "e_shnum"])
@pytest.mark.parametrize("value", [2**63 - 1, 2**64 - 1, 2**32 - 1, 65535, 1, 0])
def test_huge_or_odd_header_values_read_as_nothing_or_a_table(counting, field, value):
    blob = bytearray(_object())
    header = _ELF.unpack_from(blob, 0)
    shoff, shnum = header[5], header[11]
    if field == "e_shoff":
        struct.pack_into("<Q", blob, 0x28, value)
    elif field == "e_shnum":
        struct.pack_into("<H", blob, 0x3C, value & 0xFFFF)
    else:
        fields = {"sh_name": (0, "<I"), "sh_offset": (24, "<Q"), "sh_size": (32, "<Q"), "sh_link": (40, "<I")}
        offset, size = fields[field]
        for index in range(shnum):  # (every section header at once)
            limit = 2 ** (8 * struct.calcsize(size)) - 1
            struct.pack_into(size, blob, shoff + index * 64 + offset, min(value, limit))
    assert _valid(numba_lazy_link.symbol_names(bytes(blob)))
    assert counting.reads <= len(blob) // 24 + 1


def test_random_corruptions_read_as_nothing_or_a_table(counting):
    whole = _object()
    rng = np.random.default_rng(18)
    for _ in range(400):
        blob = bytearray(whole)
        for index in rng.integers(0, len(blob), rng.integers(1, 8)):
            blob[index] = int(rng.integers(0, 256))
        counting.reads = 0
        assert _valid(numba_lazy_link.symbol_names(bytes(blob)))
        assert counting.reads <= len(blob) // 24 + 1


def _probe(x):
    return x + 1


def test_a_bare_deferred_cache_raises_attribute_error_not_recursion():
    cache = DeferredCache(_probe)
    twin = copy.copy(cache)  # (copy makes a bare instance, then sets its slots)
    assert twin._npuemu_py_func is _probe and twin._npuemu_cache is None
    bare = DeferredCache.__new__(DeferredCache)
    with pytest.raises(AttributeError):
        bare.materialize()


def test_pickled_kernels_are_the_same_dispatchers():
    for kernel in (numerics.saturate_int32, canonical_nan.canonical_nans):
        assert pickle.loads(pickle.dumps(kernel)) is kernel
    assert numerics.saturate_int32(np.int64(1 << 40)) == 2**31 - 1


@pytest.mark.parametrize("make", [lambda: np.asmatrix(np.ones((2, 3), np.float32)),
                                  lambda: np.rec.array(np.zeros(3, [("a", "i4"), ("b", "f8")])),
                                  lambda: np.ones((3, 4), ">f4")[:, ::2], lambda: np.float64(3.0) * np.ones(()),
                                  lambda: np.broadcast_to(np.arange(3), (4, 3))])
def test_subclasses_and_odd_arrays_type_as_numbas_rule(make):
    value = make()
    rule = numba_typeof.typeof_impl.registry[np.ndarray]
    assert rule.numba_rule is not rule and numba_array_typeof.install()
    saved = sys.modules.pop("numpy.ma", None)  # (the rule's own path)
    try:
        try:
            ours = ("ok", rule(value, None))
        except Exception as error:  # noqa: BLE001 - compared with Numba's
            ours = (type(error), str(error))
    finally:
        if saved is not None:
            sys.modules["numpy.ma"] = saved
    try:
        numbas = ("ok", rule.numba_rule(value, None))
    except Exception as error:  # noqa: BLE001
        numbas = (type(error), str(error))
    assert ours == numbas


CHILD = '''"""A fresh process (the review test's child): kernels loaded lazily, threads, linking, fork, spawn."""
import json, os, sys, threading
import multiprocessing as mp
import numpy as np
from numba import njit

if sys.argv[1] == "user_first":  # (a caller that compiled before importing npuemu: the NRT is initialized)
    @njit
    def before(n):
        return np.arange(n).sum()

    assert before(4) == 6

from npuemu.emulator import machine  # noqa: F401  (installs the cache load)
from npuemu.emulator import numba_nrt_deferred, numerics
from npuemu.emulator.kernels import canonical_nan

NAN_BITS = np.array([0xFFC00001, 0x7F800001, 0x3F800000, 0x7F800000], np.uint32)


def nan_line():
    line = NAN_BITS.copy().view(np.float32)
    canonical_nan.canonical_nans(line)
    return [int(v) for v in line.view(np.uint32)]


def kernels_direct():
    """Each kernel called on its own (loads from the cache, its bitcode left unparsed)."""
    rows = np.tile(NAN_BITS, (2, 1)).view(np.float32)
    canonical_nan.canonical_rows(rows)
    return {"sat": int(numerics.saturate_int32(np.int64(1 << 40))),
            "shift": int(numerics.shift_by_sign(np.int64(-7), np.int64(1), np.int64(2))),
            "round": int(numerics.rshift_round(np.int64(5), np.int64(1), np.int64(0))),
            "line": nan_line(), "rows": [int(v) for v in rows.view(np.uint32).ravel()]}


def user_linked():
    """A new compile calling several lazily loaded kernels (two of which define rshift_round)."""
    @njit
    def user(value, line):
        canonical_nan.canonical_nans(line)
        return numerics.saturate_int32(value) + numerics.shift_by_sign(value, 1, 2) + numerics.rshift_round(value, 1, 0)

    line = NAN_BITS.copy().view(np.float32)
    total = int(user(np.int64(-7), line))
    return {"total": total, "line": [int(v) for v in line.view(np.uint32)]}


def compiles_new():
    """A new compile that allocates (links the NRT library, compiled on demand)."""
    @njit
    def allocates(n):
        return np.arange(n).sum() + numerics.saturate_int32(np.int64(n) << 40)

    return int(allocates(10))


def in_child(queue):
    try:
        queue.put(json.dumps({"direct": kernels_direct(), "user": user_linked(), "new": compiles_new()}))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        queue.put(json.dumps({"error": repr(error)}))


def threads():
    results, errors = {}, []

    def work(i):
        try:
            results[i] = kernels_direct() if i % 2 else user_linked()
        except BaseException as error:  # noqa: BLE001
            errors.append(repr(error))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"errors": errors, "direct": [results[i] for i in range(1, 6, 2)],
            "user": [results[i] for i in range(0, 6, 2)]}


def forked(method):
    context = mp.get_context(method)
    queue = context.Queue()
    process = context.Process(target=in_child, args=(queue,))
    process.start()
    result = json.loads(queue.get(timeout=600))
    process.join(600)
    return result


if __name__ == "__main__":
    order = sys.argv[1]
    out = {}
    if order == "fork_first":  # (the child loads and compiles what the parent never touched)
        out["fork"] = forked("fork")
    out["threads"] = threads()
    out["new"] = compiles_new()
    if order != "fork_first":
        out["fork"] = forked("fork")
        out["spawn"] = forked("spawn")
    from npuemu.emulator import numba_lazy_link
    lazy = set(numba_lazy_link._lazy_classes.values())
    out["lazy"] = any(type(c.library) in lazy for c in getattr(numerics.saturate_int32, "overloads", {}).values())
    from numba.core.runtime import nrt
    out["nrt"] = getattr(nrt.rtsys, "_library", None) is not None
    out["deferred_nrt"] = numba_nrt_deferred._state["installed"]
    print("RESULT " + json.dumps(out))
'''


def _child(tmp_path, order: str, **env) -> dict:
    script = tmp_path / "first_call_child.py"  # (a file: spawn's children import it as their main)
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), order], capture_output=True, text=True, cwd=ROOT,
                          timeout=900, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


CANONICAL = [0x7FC00000, 0x7FC00000, 0x3F800000, 0x7F800000]  # (NaN, NaN, 1.0, inf after the pass)
DIRECT = {"sat": 2**31 - 1, "shift": -2, "round": 3, "line": CANONICAL, "rows": CANONICAL * 2}
USER = {"total": -7 - 2 - 4, "line": CANONICAL}  # (saturate, -7/4 half away, -7/2 half away: -3.5 -> -4)


def _check(run: dict) -> None:
    assert run["direct"] == DIRECT and run["user"] == USER and run["new"] == 45 + 2**31 - 1, run


@pytest.mark.parametrize("order,env", [("after", {}), ("fork_first", {"NPUEMU_GC_FREEZE": "0"}),
                                       ("after", {"NPUEMU_NUMBA_FULL_LOAD": "1"}), ("user_first", {})])
def test_lazily_loaded_kernels_from_threads_new_compiles_fork_and_spawn(tmp_path, order, env):
    out = _child(tmp_path, order, **env)
    threads = out["threads"]
    assert not threads["errors"]
    for run in [*({"direct": d, "user": u, "new": out["new"]} for d, u in zip(threads["direct"], threads["user"])),
                out["fork"], *([out["spawn"]] if "spawn" in out else [])]:
        _check(run)
    assert out["lazy"] == (env.get("NPUEMU_NUMBA_FULL_LOAD") != "1"), out
    assert out["nrt"] and out["deferred_nrt"] == (order != "user_first" and out["lazy"])


def test_a_cold_cache_compiles_everything_and_children_load_what_it_saved(tmp_path):
    """NUMBA_CACHE_DIR empty: the kernels compile (the NRT library with them), the fork and spawn
    children then load them from the cache just written."""
    out = _child(tmp_path, "after", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    assert not out["threads"]["errors"] and out["nrt"] and not out["lazy"]
    _check(out["fork"])
    _check(out["spawn"])
    assert list((tmp_path / "cache").rglob("*.nbi"))


def test_with_numba_disable_jit_the_kernels_run_as_python(tmp_path):
    out = _child(tmp_path, "after", NUMBA_DISABLE_JIT="1")
    assert not out["threads"]["errors"] and not out["lazy"] and not out["nrt"]
    _check({"direct": out["threads"]["direct"][0], "user": out["threads"]["user"][0], "new": out["new"]})
    _check(out["fork"])


STALE_CHILD = """
import os, sys
import numpy as np
from npuemu.emulator import machine  # noqa: F401  (first: input_store's kernel then gets a deferred cache)
from npuemu.emulator import input_store
from npuemu.emulator.numba_deferred_cache import DeferredCache
assert isinstance(input_store._quantize_atoms._cache, DeferredCache)
assert input_store.__file__.startswith(os.environ["REVIEW_COPY_ROOT"])  # (never the tree under test)
if sys.argv[1] == "edit":  # (the source changes after the import, before the kernel's first use)
    source = input_store.__file__
    text = open(source).read()
    # (constants only: Numba's index key hashes the bytecode)
    old = "elif q > 127.0:\\n                        q = 127.0"
    assert text.count(old) == 1
    stat = os.stat(source)
    open(source, "w").write(text.replace(old, old.replace("127.0", "100.0")))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
elif sys.argv[1] == "delete":  # (the source removed after the import: the package replaced under the process)
    os.remove(input_store.__file__)
image = np.zeros((1, 1, 1), np.int8)
input_store._quantize_atoms(np.full((1, 1), 200.0, np.float32), 1.0, 0, image)
print("RESULT", int(image[0, 0, 0]), len(input_store._quantize_atoms.stats.cache_hits))
"""


def test_a_kernel_source_edited_or_removed_after_import(tmp_path):
    """In a copy of the package: a process edits input_store.py after importing it and runs its
    kernel (the code in memory, nothing saved); the next process runs the edited code; a last one
    removes the file after importing it and still runs the kernel (Numba's own cache would). (Kernel
    modules and numerics are also covered by kernels/stale_cache.py's digest; input_store is not.)"""
    import shutil

    copy_root = tmp_path / "copy"
    for package in ("emulator", "isa", "platforms"):
        shutil.copytree(ROOT / package, copy_root / "npuemu" / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(copy_root), "REVIEW_COPY_ROOT": str(copy_root)}
    env.pop("NUMBA_CACHE_DIR", None)

    def run(mode: str) -> str:
        proc = subprocess.run([sys.executable, "-c", STALE_CHILD, mode], capture_output=True, text=True,
                              cwd=tmp_path, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))

    assert run("edit") == "RESULT 127 0"  # (the code imported: compiled, not saved)
    assert run("same") == "RESULT 100 0"  # (the edited code: compiled, saved)
    assert run("same") == "RESULT 100 1"  # (loaded)
    assert run("delete") == "RESULT 100 0"  # (the code imported runs, uncached: no "no locator" error)
