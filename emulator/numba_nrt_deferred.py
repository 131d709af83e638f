"""Numba's NRT library compiled when something needs it, not at the runtime's initialization
(issue 20: first call in a fresh process).

``rtsys.initialize`` (run before the first cache load or compile) registers the NRT's C helpers
with LLVM and compiles a small LLVM library (atomic increment, decrement and compare-and-swap,
``NRT_incref``/``NRT_decref``, ``NRT_MemInfo_data_fast``, ``nrt_unresolved_abort``): 15-20 ms of CPU
on the dev machine, the LLVM compiler's one use in a process whose kernels all load from the
cache. The library is consumed in two ways only, both through ``rtsys.library``: every compile
links it into the new code (``CPUContext.post_lowering``; a cached kernel therefore carries its
own copies), and a compile with unresolved recursive calls asks it for ``nrt_unresolved_abort``.

:func:`install` makes ``rtsys.initialize`` do everything but that compile, and ``rtsys.library``
compile it (the same function, the same context, under Numba's compiler lock) at its first use.
A cached kernel's machine code could still name one of the library's symbols: :func:`ensure_for`
(called with the kernel's undefined symbols before it is loaded) compiles the library first
when a symbol is neither in the process's symbol table (``llvmlite.binding.address_of_symbol``:
the C helpers, the C API, libc and libm) nor defined in the JIT engine, and ``ensure`` does so
for any load this module cannot inspect (other packages' kernels, other serializations). If
the runtime is initialized already, or Numba's runtime is not the expected shape, nothing is
installed.
"""

from __future__ import annotations

_state = {"installed": False, "context": None}
_resolvable: set[str] = set()


def install() -> bool:
    """Defer the NRT library's compile (idempotent); False if not possible (module docstring)."""
    if _state["installed"]:
        return True
    try:
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.runtime import nrt, nrtdynmod
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return False
    runtime = nrt.rtsys
    cls = type(runtime)
    if getattr(runtime, "_init", True) or not isinstance(getattr(cls, "library", None), property) \
            or not callable(getattr(nrtdynmod, "compile_nrt_functions", None)):
        return False

    class DeferredLibraryRuntime(cls):
        @global_compiler_lock
        def initialize(self, ctx):
            if self._init:
                return
            compile_now = nrtdynmod.compile_nrt_functions
            nrtdynmod.compile_nrt_functions = lambda context: None  # (the rest of Numba's initialize runs)
            try:
                cls.initialize(self, ctx)
            finally:
                nrtdynmod.compile_nrt_functions = compile_now
            _state["context"] = ctx

        @property
        def library(self):
            self._init_guard()
            if self._library is None:
                with global_compiler_lock:
                    if self._library is None:
                        self._library = nrtdynmod.compile_nrt_functions(_state["context"])
            return self._library

    DeferredLibraryRuntime.__name__ = DeferredLibraryRuntime.__qualname__ = cls.__name__
    runtime.__class__ = DeferredLibraryRuntime
    _state["installed"] = True
    return True


def ensure() -> None:
    """The library compiled now, if the runtime is initialized and it is not yet."""
    from numba.core.runtime import nrt

    if _state["installed"] and getattr(nrt.rtsys, "_init", False):
        nrt.rtsys.library  # noqa: B018 - the property compiles it


def ensure_for(undefined: set[str], engine) -> None:
    """Compile the library first if machine code about to be loaded names a symbol nothing
    defines yet (module docstring)."""
    import llvmlite.binding as ll

    for name in undefined:
        if name in _resolvable:
            continue
        if ll.address_of_symbol(name):
            _resolvable.add(name)  # (a registered or loaded C symbol: stays resolvable)
        elif not engine.is_symbol_defined(name):
            ensure()
            return
