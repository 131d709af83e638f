"""Deep copies of the graph IR without ``copy.deepcopy``'s generic path (issue 20: compile time).

Passes that try a rewrite on a copy of the graph (tokens_as_channels, matmul_act_npu,
attention_npu, output_readout) deep-copy whole graphs: about 300,000 objects for PP-OCRv4 rec,
2.0 s of a profiled compile. ``copy.deepcopy`` reaches each IR dataclass through
``__reduce_ex__`` and ``_reconstruct``; :func:`copy_object` builds the same object directly.
The result is the one ``copy.deepcopy`` gives: every list, dict, array and IR object fresh;
strings, numbers and tuples of them shared; what the original shares (the same array in two
tensors) shared in the copy too (the ``memo``); any other value copied by ``copy.deepcopy``.
"""

from __future__ import annotations

import copy
from typing import Any

#: types ``copy.deepcopy`` returns as they are
_ATOMIC = frozenset({str, int, float, bool, type(None), complex, bytes})
#: IR classes copied by :func:`copy_object` (filled by :func:`register`)
_OBJECTS: set[type] = set()
_NIL = object()


def register(cls: type) -> type:
    """Class decorator: deep copies of ``cls`` (plain ``__dict__`` instances) go through
    :func:`copy_object`."""
    _OBJECTS.add(cls)
    cls.__deepcopy__ = copy_object
    return cls


def copy_object(obj: Any, memo: dict) -> Any:
    """A deep copy of an instance of a registered class: a new instance (no ``__init__``, as
    ``copy.deepcopy`` makes it) whose ``__dict__`` holds deep copies of the original's."""
    new = object.__new__(type(obj))
    memo[id(obj)] = new
    _keep_alive(obj, memo)
    new.__dict__.update({key: value if type(value) in _ATOMIC else copy_value(value, memo)
                         for key, value in obj.__dict__.items()})
    return new


def copy_value(value: Any, memo: dict) -> Any:
    """``copy.deepcopy(value, memo)``, with lists, dicts, tuples of atoms and IR objects done here."""
    cls = type(value)
    if cls in _ATOMIC:
        return value
    found = memo.get(id(value), _NIL)
    if found is not _NIL:
        return found
    if cls is list:
        new_list: list = []
        memo[id(value)] = new_list
        _keep_alive(value, memo)
        new_list.extend([item if type(item) in _ATOMIC else copy_value(item, memo) for item in value])
        return new_list
    if cls is dict:
        new_dict: dict = {}
        memo[id(value)] = new_dict
        _keep_alive(value, memo)
        for key, item in value.items():
            key = key if type(key) in _ATOMIC else copy_value(key, memo)
            new_dict[key] = item if type(item) in _ATOMIC else copy_value(item, memo)
        return new_dict
    if cls is tuple and all(type(item) in _ATOMIC for item in value):
        return value  # copy.deepcopy returns such a tuple itself
    if cls in _OBJECTS:
        return copy_object(value, memo)
    return copy.deepcopy(value, memo)


def _keep_alive(value: Any, memo: dict) -> None:
    """What ``copy.deepcopy`` does: the memo holds the originals, so no id is reused meanwhile."""
    try:
        memo[id(memo)].append(value)
    except KeyError:
        memo[id(memo)] = [value]
