"""Numba's extension entry points initialised at the first compile, not at the first call of an
npuemu kernel (issue 20: first call in a fresh process).

Before typing a call's arguments, a dispatcher's first call runs
``numba.core.entrypoints.init_all``: it lists every installed distribution's entry points
(``importlib.metadata``) to run the ``numba_extensions`` ``init`` hooks, once per process: 15-20 ms
of CPU on the dev machine (130 installed distributions), more than the cache loads of a small
model's first run together. The hooks register types, typing and lowering for the compiler.
An npuemu kernel takes arrays, numbers and tuples (typed by Numba's own rules) and loads from the
cache as finished machine code, so nothing an extension registers is used unless a compile
follows; every compile runs ``init_all`` itself first (the pipeline's ``refresh`` of the target
context, ``CPUContext.load_additional_registries``), and so does every other package's
dispatcher's first call. :func:`install` makes npuemu's dispatchers skip the hook; everything
else keeps it. If Numba's dispatcher is not the expected shape, nothing is installed.
"""

from __future__ import annotations

_installed = False


def install() -> bool:
    """Skip the entry-point hook for npuemu's dispatchers (idempotent); False if not possible."""
    global _installed
    if _installed:
        return True
    try:
        from numba.core import dispatcher, entrypoints
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return False
    cls = dispatcher.Dispatcher
    hook = getattr(cls, "_compilation_chain_init_hook", None)
    if hook is None or not callable(getattr(entrypoints, "init_all", None)):
        return False

    def _compilation_chain_init_hook(self):
        if not str(getattr(getattr(self, "py_func", None), "__module__", "")).startswith("npuemu."):
            return hook(self)

    _compilation_chain_init_hook.npuemu_original = hook
    cls._compilation_chain_init_hook = _compilation_chain_init_hook
    _installed = True
    return True
