"""Dataclass methods made inside ``dataclass_code_cache.reused()`` (issue 20, first call;
emulator/dataclass_code_cache.py) are the functions ``dataclasses`` makes without it: the same
code objects, annotations, defaults and closures, whether their code was compiled in the block
(first import: the table is written) or read from the kept table (second import). The table
is ignored when its header is not this interpreter's, not written with bytecode writing off,
and ``dataclasses`` is left as it was after the block."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap

import pytest

from npuemu.emulator import dataclass_code_cache

#: a module of dataclasses of every shape the generated methods take; its own ``__future__``
#: import makes the field annotations strings, as in npuemu's modules
_SOURCE = textwrap.dedent('''
    from __future__ import annotations
    import dataclasses
    from dataclasses import InitVar, dataclass, field
    from typing import ClassVar

    @dataclass(frozen=True)
    class Frozen:
        a: int
        b: float = 1.5
        c: tuple = (1, 2)
        d: list = field(default_factory=list)

    @dataclass(order=True, unsafe_hash=True)
    class Ordered:
        x: int
        y: str = "y"
        k: ClassVar[int] = 3

    @dataclass(kw_only=True, slots=True)
    class KeywordsOnly:
        p: int
        q: int = field(default=2, repr=False, compare=False)

    @dataclass
    class WithInitVar:
        n: int
        scale: InitVar[int] = 2
        def __post_init__(self, scale):
            self.n *= scale

    @dataclass(frozen=True, eq=False)
    class Plain:
        pass
''')

_METHODS = ("__init__", "__repr__", "__eq__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__setattr__",
            "__delattr__")


def _import(tmp_path, name: str):
    (tmp_path / f"{name}.py").write_text(_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def _code_fingerprint(code) -> tuple:
    consts = tuple(_code_fingerprint(c) if hasattr(c, "co_code") else c for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            code.co_argcount, code.co_kwonlyargcount, code.co_flags, code.co_filename, code.co_name)


def _cell(value):
    if hasattr(value, "__code__"):  # (a wrapped function: by its code, not its address)
        return value.__qualname__, _code_fingerprint(value.__code__)
    if isinstance(value, type):  # (the class itself: each import's module has its own)
        return value.__qualname__
    return repr(value)


def _fingerprints(module) -> dict:
    out = {}
    for cls_name in ("Frozen", "Ordered", "KeywordsOnly", "WithInitVar", "Plain"):
        cls = getattr(module, cls_name)
        for method in _METHODS:
            fn = vars(cls).get(method)
            if fn is None or not hasattr(fn, "__code__"):
                continue
            cells = tuple(_cell(c.cell_contents) for c in fn.__closure__ or ())
            out[cls_name, method] = (_code_fingerprint(fn.__code__), repr(fn.__annotations__), repr(fn.__defaults__),
                                     repr(fn.__kwdefaults__), cells, fn.__qualname__)
    return out


@pytest.fixture
def table_path(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "npuemu-dataclass-code.test.marshal"
    monkeypatch.setattr(dataclass_code_cache, "cache_path", lambda: str(path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    return path


def test_methods_made_from_the_table_are_the_ones_dataclasses_makes(tmp_path, table_path):
    reference = _fingerprints(_import(tmp_path, "npuemu_dc_probe_plain"))
    with dataclass_code_cache.reused():
        compiled = _import(tmp_path, "npuemu_dc_probe_first")
    assert table_path.exists()
    with dataclass_code_cache.reused():
        with dataclass_code_cache.reused():  # (nested blocks: one table)
            loaded = _import(tmp_path, "npuemu_dc_probe_second")
    assert "exec" not in vars(dataclasses)
    assert _fingerprints(compiled) == reference
    assert _fingerprints(loaded) == reference
    assert len(reference) > 15
    # they behave the same too
    frozen = loaded.Frozen(3)
    assert frozen == loaded.Frozen(3, 1.5) and repr(frozen) == "Frozen(a=3, b=1.5, c=(1, 2), d=[])"
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.a = 4
    assert loaded.Ordered(1) < loaded.Ordered(2) and hash(loaded.Ordered(1)) == hash(loaded.Ordered(1))
    assert loaded.WithInitVar(4, 3).n == 12 and loaded.KeywordsOnly(p=1) == loaded.KeywordsOnly(p=1, q=5)


def test_the_second_import_compiles_nothing(tmp_path, table_path, monkeypatch):
    with dataclass_code_cache.reused():
        _import(tmp_path, "npuemu_dc_probe_warm")
    compiles = []
    real_compile = compile
    monkeypatch.setattr(dataclass_code_cache, "compile", lambda *a, **k: compiles.append(a) or real_compile(*a, **k),
                        raising=False)
    written = table_path.stat().st_mtime_ns
    with dataclass_code_cache.reused():
        _import(tmp_path, "npuemu_dc_probe_again")
    assert compiles == [] and table_path.stat().st_mtime_ns == written


def test_a_foreign_header_is_ignored_and_replaced(tmp_path, table_path):
    table_path.parent.mkdir(parents=True)
    table_path.write_bytes(b"\x00\x00\r\n\x00" + b"garbage")
    reference = _fingerprints(_import(tmp_path, "npuemu_dc_probe_ref"))
    with dataclass_code_cache.reused():
        module = _import(tmp_path, "npuemu_dc_probe_header")
    assert _fingerprints(module) == reference
    assert table_path.read_bytes().startswith(dataclass_code_cache._header())


def test_nothing_written_with_bytecode_writing_off(tmp_path, table_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with dataclass_code_cache.reused():
        _import(tmp_path, "npuemu_dc_probe_readonly")
    assert not table_path.exists()


def test_someone_elses_exec_is_left_alone(tmp_path, table_path, monkeypatch):
    calls = []

    def theirs(source, globals=None, locals=None):
        calls.append(source)
        return exec(source, globals, locals)

    monkeypatch.setattr(dataclasses, "exec", theirs, raising=False)
    with dataclass_code_cache.reused():
        with dataclass_code_cache.reused():  # (nested: no lock held across the block)
            _import(tmp_path, "npuemu_dc_probe_theirs")
    assert calls and dataclasses.exec is theirs and not table_path.exists()
