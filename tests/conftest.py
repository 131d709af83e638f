import os

from hypothesis import HealthCheck, settings

# CI runs derandomized so a red run is reproducible; locally hypothesis explores freely.
# Deadlines are off: the first call of a Numba kernel compiles it.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# --- shared data: skip, do not fail, where ../shared is absent (tests/shared_data.py) -----------

import types
from pathlib import PurePath

import pytest

from tests import shared_data


#: the shared_data folders a test may name
SHARED_NAMES = ("SHARED", "RKNN_FIXTURES", "VENDOR_CORPUS", "RKNN_FIXTURES_OPS")


def _code_names(code: types.CodeType) -> set[str]:
    """Global names a function's code (nested functions and comprehensions included) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _missing_in(value, depth: int = 0):
    """The absent shared folder a module-level value (a path, or a list/dict of them) points into."""
    if isinstance(value, PurePath) or (isinstance(value, str) and "/" in value):  # a path, not a plain name
        return shared_data.missing_root(value)
    if depth < 2 and isinstance(value, (list, tuple, set, frozenset, dict)):
        items = value.values() if isinstance(value, dict) else value
        return next((root for item in items if (root := _missing_in(item, depth + 1)) is not None), None)
    return None


def _missing_globals(module: types.ModuleType) -> dict[str, object]:
    """Module globals that lead into an absent shared folder: the paths themselves, then every
    module function using one of them (to a fixpoint: helpers of helpers)."""
    cached = module.__dict__.get("__shared_missing__")
    if cached is not None:
        return cached
    found = {name: root for name, value in vars(module).items()
             if not name.startswith("__") and (root := _missing_in(value)) is not None}
    for name in SHARED_NAMES:  # also read through a function-local `from tests.shared_data import ...`
        if name not in found and (root := shared_data.missing_root(getattr(shared_data, name))) is not None:
            found[name] = root
    functions = {name: _code_names(value.__code__) for name, value in vars(module).items()
                 if isinstance(value, types.FunctionType) and value.__module__ == module.__name__}
    functions.update(_assignments(module))  # FIXTURES = sorted(RKNN_FIXTURES.glob(...)): [] when absent
    grew = bool(found)
    while grew:
        grew = False
        for name, used in functions.items():
            if name not in found and (hit := next((found[n] for n in used if n in found), None)) is not None:
                found[name], grew = hit, True
    module.__shared_missing__ = found
    return found


def _assignments(module: types.ModuleType) -> dict[str, set[str]]:
    """Module-level ``NAME = expression``: the names each expression reads."""
    import ast
    import inspect

    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            used = {sub.id for sub in ast.walk(node.value) if isinstance(sub, ast.Name)}
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in (sub.id for sub in ast.walk(target) if isinstance(sub, ast.Name)):
                    out[name] = out.get(name, set()) | used
    return out


def _missing_for(item: pytest.Item):
    module = getattr(item, "module", None)
    function = getattr(item, "function", None)
    if module is None or function is None:
        return None
    missing = _missing_globals(module)
    codes = [function.__code__] + [getattr(definition.func, "__code__", None)
                                   for definitions in item._fixtureinfo.name2fixturedefs.values()
                                   for definition in definitions]
    for code in filter(None, codes):
        if (hit := next((missing[n] for n in _code_names(code) if n in missing), None)) is not None:
            return hit
    params = getattr(getattr(item, "callspec", None), "params", {})
    return next((root for value in params.values() if (root := _missing_in(value)) is not None), None)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        root = _missing_for(item)
        if root is not None:
            item.add_marker(pytest.mark.skip(reason=f"{shared_data.MISSING_REASON}: {root} is absent"))
