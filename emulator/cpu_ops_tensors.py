"""Host-only tensors in the ``ND`` layout (isa/CONTAINER.md 3.3): row-major in their logical
shape, any rank, any of the trailer's ND element types. The runtime reads and writes them
here; NC1HWC2 feature maps stay in runtime.py."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16, int4 and uint4 with numpy (ND host tensors)
import numpy as np

from npuemu.isa.container_trailer import ND_LAYOUT
from npuemu.isa.errors import EmulationError, InputError


def is_nd(info: dict[str, Any]) -> bool:
    return info.get("layout") == ND_LAYOUT


def nd_dtype(info: dict[str, Any]) -> np.dtype:
    try:
        return np.dtype(str(info["dtype"]))
    except TypeError:
        raise EmulationError(f"tensor {info['name']!r}: dtype {info.get('dtype')!r} is not an element type") from None


def write_nd(memory, info: dict[str, Any], values: np.ndarray) -> None:
    """Store ``values`` (the tensor's shape, any castable type) at its address, row-major."""
    shape, dtype = tuple(int(d) for d in info["shape"]), nd_dtype(info)
    values = np.asarray(values)
    if values.shape != shape:
        raise InputError(f"tensor {info['name']!r}: expected shape {list(shape)}, got {list(values.shape)}")
    # (copy=False: one copy at most where the values already have the stored type)
    data = np.ascontiguousarray(values.astype(dtype, copy=False).astype(dtype.newbyteorder("<"), copy=False))
    if data.nbytes > int(info["size"]):
        raise EmulationError(f"tensor {info['name']!r}: {data.nbytes} bytes do not fit its {info['size']} bytes")
    if data.nbytes:
        memory.load(int(info["address"]), data.reshape(-1).view(np.uint8))


def read_nd(memory, info: dict[str, Any]) -> np.ndarray:
    """The tensor's values in its shape and element type."""
    shape, dtype = tuple(int(d) for d in info["shape"]), nd_dtype(info)
    count = math.prod(shape)
    if count == 0:
        return np.zeros(shape, dtype)
    raw = memory.dump(int(info["address"]), count * dtype.itemsize)  # already a copy: no more needed
    return raw.view(dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
