"""A kernel loaded from Numba's cache without parsing its linking bitcode until something links
against it (issue 20: first call in a fresh process).

A cached kernel (Numba's "object" serialization) holds the machine code and, for inlining into
functions compiled later, the LLVM bitcode of its module. Numba's load parses that bitcode
(``llvmlite.binding.parse_bitcode``: the kernels inline their helpers, 30-430 kB each) and walks
it to record the symbols the library defines in the JIT engine's table, which
``get_pointer_to_function`` consults: ~3 ms of CPU per kernel on the dev machine, ~20 ms of a
small model's first run. A process that only calls cached kernels never links against them.

:func:`unserialize` (used by numba_cache_load for npuemu's kernels) builds the library as
Numba's load does (create, object caching, the compiled object, finalize: the engine loads the
same machine code) but keeps the bitcode unparsed. The engine's table gets the symbols the
machine code itself defines (global and weak symbols of the ELF object's symbol table: the
library's external functions, each also defined in the bitcode), and the library's class
becomes a subclass whose ``_get_module_for_linking`` parses the bitcode when a later compile
links against it. The engine's ``is_symbol_defined`` answers from its table; on a name not
there it first adds every pending library's bitcode symbols (Numba's eager set) and asks again,
so every answer is the one Numba's own load gives. Anything else (bitcode serialization, an
object file that is not 64-bit little-endian ELF, an engine of another shape) loads as Numba
does.
"""

from __future__ import annotations

import struct

from npuemu.emulator import numba_nrt_deferred

_ELF_HEADER = struct.Struct("<16xHHIQQQIHHHHHH")  # e_type .. e_shstrndx after e_ident
_SECTION = struct.Struct("<IIQQQQIIQQ")  # sh_name, sh_type, flags, addr, offset, size, link, info, align, entsize
_SYMBOL = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
_SHT_SYMTAB, _STB_GLOBAL, _STB_WEAK = 2, 1, 2

#: engine id -> libraries loaded here whose bitcode symbols are not in the engine's table yet
_pending: dict[int, list] = {}
_lazy_classes: dict[type, type] = {}


def symbol_names(object_code: bytes) -> tuple[set[str], set[str]] | None:
    """The global and weak symbols an ELF64 little-endian object defines, and the symbols it
    leaves undefined; None for anything else (then the caller loads as Numba does)."""
    if object_code[:6] != b"\x7fELF\x02\x01" or len(object_code) < 64:
        return None
    try:
        fields = _ELF_HEADER.unpack_from(object_code, 0)
        shoff, shentsize, shnum = fields[5], fields[10], fields[11]
        if shentsize != _SECTION.size:
            return None
        sections = [_SECTION.unpack_from(object_code, shoff + i * shentsize) for i in range(shnum)]
        defined: set[str] = set()
        undefined: set[str] = set()
        for section in sections:
            if section[1] != _SHT_SYMTAB:
                continue
            strings = sections[section[6]]
            str_start, str_end = strings[4], strings[4] + strings[5]
            for offset in range(section[4], section[4] + section[5], _SYMBOL.size):
                name, info, _, shndx, _, _ = _SYMBOL.unpack_from(object_code, offset)
                if not name:
                    continue
                into = undefined if shndx == 0 else defined if info >> 4 in (_STB_GLOBAL, _STB_WEAK) else None
                if into is not None:
                    end = object_code.index(b"\0", str_start + name, str_end)
                    into.add(object_code[str_start + name:end].decode())
            break  # (an object has one symbol table: more, pointing at one big table, would cost quadratic time)
        return defined, undefined
    except (struct.error, IndexError, ValueError, UnicodeDecodeError, OverflowError):  # (offsets >= 2**63)
        return None


def defined_symbols(object_code: bytes) -> set[str] | None:
    """The defined half of :func:`symbol_names`."""
    table = symbol_names(object_code)
    return None if table is None else table[0]


def rebuild(impl, target_context, data):
    """``impl.rebuild(target_context, data)`` (a cached kernel's CompileResult) with its library
    unserialized by :func:`unserialize`; callers hold Numba's compiler lock, as a cache load does."""
    codegen = target_context.codegen()
    if "unserialize_library" in vars(codegen):  # (someone else's override: theirs)
        numba_nrt_deferred.ensure()
        return impl.rebuild(target_context, data)
    codegen.unserialize_library = lambda state: unserialize(codegen, state)
    try:
        return impl.rebuild(target_context, data)
    finally:
        del codegen.unserialize_library


def unserialize(codegen, state):
    """``codegen.unserialize_library(state)`` with the bitcode parsed on demand (module docstring)."""
    name, kind, data = state
    engine = getattr(codegen, "_engine", None)
    table = symbol_names(data[0]) if kind == "object" and isinstance(data, tuple) else None
    if not table or not table[0] or not _engine_fits(engine):
        numba_nrt_deferred.ensure()  # (code not inspected here may name the NRT library's symbols)
        return type(codegen).unserialize_library(codegen, state)
    object_code, bitcode = data
    symbols, undefined = table
    _install_lookup(engine)
    numba_nrt_deferred.ensure_for(undefined, engine)
    library = codegen.create_library(name)
    library.__class__ = _lazy_class(type(library))
    library.npuemu_bitcode = bitcode
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._finalize_final_module()
    _pending[id(engine)].append(library)
    engine._defined_symbols |= symbols
    return library


def _engine_fits(engine) -> bool:
    return isinstance(getattr(engine, "_defined_symbols", None), set) and hasattr(engine, "_load_defined_symbols")


def _lazy_class(cls: type) -> type:
    lazy = _lazy_classes.get(cls)
    if lazy is None:
        def _get_module_for_linking(self):
            if self._shared_module is None and self.npuemu_bitcode is not None:
                import llvmlite.binding as ll

                self._shared_module = ll.parse_bitcode(self.npuemu_bitcode)
                self.npuemu_bitcode = None
            return cls._get_module_for_linking(self)

        lazy = type(cls.__name__, (cls,), {"_get_module_for_linking": _get_module_for_linking,
                                           "npuemu_bitcode": None, "__module__": cls.__module__})
        _lazy_classes[cls] = lazy
    return lazy


def _install_lookup(engine) -> None:
    """The engine's ``is_symbol_defined``: its table, completed from the pending bitcode on a miss."""
    if id(engine) in _pending:
        return
    _pending[id(engine)] = pending = []

    def is_symbol_defined(name):
        if name in engine._defined_symbols:
            return True
        while pending:
            engine._load_defined_symbols(pending.pop()._get_module_for_linking())
        return name in engine._defined_symbols

    engine.is_symbol_defined = is_symbol_defined
