"""How host steps read and store int8 and float16 tensors, worked out once per tensor (issue 20).

A host step reads each input as float64 and stores each result in its tensor's type
(cpu_ops.py). For an int8 tensor with per-tensor quantization, or an unquantized float16 one,
the general path (runtime.output, runtime.write_native) looks the tensor's record, geometry,
quantization and memory region up on every access; here they are looked up once per tensor and
kept in a :class:`TensorIO`:

- reading: the stored bytes (in the memory region found once) go through a 256-entry table,
  entry ``q`` = ``float64(float32(scale * (q - zero point)))`` computed with the very operations
  of ``Runtime.output`` followed by ``cpu_ops._read``'s float64 conversion, so every value is the
  one the general path gives (an element-wise function of the stored byte); the table is applied
  to every byte of the region slice at once (padding too), then the NC1HWC2 view is taken;
- storing: the same quantization arithmetic as ``cpu_ops._store`` (max then min as one clip
  ufunc; no zero point added when it is 0, which only turns -0.0 into 0.0), written straight
  into the region (an ND int8 tensor: cast into its bytes; an NC1HWC2 map: through a kept,
  zero-padded memory image, as ``tensor_layout.to_native`` lays it out), dropping the memory's
  derived values over the tensor's bytes as ``Memory.load`` does;
- float16: the general path's conversions (an NC1HWC2 map to float32, then float64; an ND
  tensor straight to float64; a result rounded to float16 when stored).

Any other tensor (ND tensors of other types, batch slices, readout records, per-channel
quantization, a tensor outside every memory region) has no plan (None): the caller takes the
general path, which also raises that path's errors.
"""

from __future__ import annotations

import math

import numpy as np

from npuemu.emulator.cpu_ops_tensors import ND_LAYOUT
from npuemu.isa import tensor_layout
from npuemu.isa.errors import EmulationError

try:
    from numpy._core.umath import clip as _clip  # numpy 2
except ImportError:  # pragma: no cover - numpy 1
    from numpy.core.umath import clip as _clip

_INT8 = np.dtype(np.int8)
_FLOAT16 = np.dtype(np.float16)
_LOWEST, _HIGHEST = np.array(-128.0), np.array(127.0)  # int8's range, as float64 0-d arrays
#: an NC1HWC2 map up to this size keeps its memory image between stores (the per-step cost of
#: small maps, issue 20); a larger one is laid out afresh each time, holding no memory after
_KEPT_IMAGE_BYTES = 1 << 20


class TensorIO:
    """One int8 or float16 tensor's read and store, bound to the memory it was worked out for."""

    __slots__ = ("memory", "region", "offset", "address", "nbytes", "shape", "count", "scale",
                 "zero_point", "table", "native", "image", "parts", "scale_array", "zero_array",
                 "target")

    def __init__(self, memory, region, address: int, nbytes: int, shape: tuple, scale: float | None,
                 zero_point: int, native: tuple | None) -> None:
        self.memory, self.region, self.address, self.nbytes = memory, region, address, nbytes
        self.offset = address - region.base
        self.shape, self.count = shape, math.prod(shape)
        self.scale, self.zero_point = scale, float(zero_point)
        self.native = native  # NC1HWC2: (channels, height, width, c1, c2, surface); ND: None
        # NC1HWC2: the memory image, padding zero, and its views the values go to, made at the
        # first store (_native_parts)
        self.image, self.parts = None, ()
        self.table = self.target = None  # float16 (no scale)
        if scale is None:
            return
        if native is None and nbytes:  # an ND int8 tensor's bytes: quantized values are cast straight in
            self.target = region.data[self.offset:self.offset + nbytes].view(_INT8).reshape(shape)
        # (0-d arrays: numpy converts a Python float operand on every call; the same float64 values)
        self.scale_array, self.zero_array = np.array(scale, np.float64), np.array(self.zero_point, np.float64)
        # Runtime.output's dequantization of every stored value, then cpu_ops._read's float64;
        # indexed by the stored byte (uint8 indices: numpy's take is ~3x faster than with int8)
        stored = np.arange(256, dtype=np.uint8).view(np.int8)
        values = np.subtract(stored, zero_point, dtype=np.float64)
        values *= scale
        self.table = values.astype(np.float32).astype(np.float64)

    def read(self) -> np.ndarray:
        """The tensor as float64 in its logical shape."""
        raw = self.region.data[self.offset:self.offset + self.nbytes]
        if self.table is None:
            raw = raw.view(_FLOAT16)
            if self.native is None:
                return raw.astype(np.float64).reshape(self.shape)
            cube = tensor_layout.from_native(raw.astype(np.float32), *self.native)  # (contiguous: faster)
            return cube.astype(np.float64).reshape(self.shape)
        values = self.table.take(raw)  # every stored byte, padding too: one contiguous lookup
        if self.native is not None:
            values = tensor_layout.from_native(values, *self.native)
        return values.reshape(self.shape)

    def store(self, value: np.ndarray, name: str, op: str) -> None:
        """Quantize ``value`` (round half to even, saturate) or round it to float16, and write it."""
        value = np.asarray(value)
        if value.size != self.count:
            raise EmulationError(f"CPU step {op!r}: result of shape {list(value.shape)} does not fit output "
                                 f"{name!r} of shape {list(self.shape)}")
        if self.table is None:
            self._write(value.reshape(self.shape).astype(_FLOAT16, copy=False))
            return
        quantized = np.asarray(np.divide(value.reshape(self.shape), self.scale_array, dtype=np.float64))
        np.rint(quantized, out=quantized)
        if self.zero_point:  # (adding 0.0 only turns -0.0 into 0.0: the same int8)
            quantized += self.zero_array  # (a float: the value numpy converts the int zero point to)
        # clip's ufunc is max(.., -128) then min(.., 127), NaN kept, in one call (np.clip's
        # wrapper costs more than both ufuncs)
        _clip(quantized, _LOWEST, _HIGHEST, out=quantized)
        if self.target is None:
            self._write(quantized.astype(_INT8))
            return
        # (contiguous to contiguous: the cast astype makes, without the temporary and its copy)
        np.copyto(self.target, quantized, casting="unsafe")
        self.memory.derived.invalidate(self.address, self.address + self.nbytes)

    def _write(self, stored: np.ndarray) -> None:
        if self.native is not None and self.nbytes > _KEPT_IMAGE_BYTES:  # (large: compute dominates)
            channels, height, width, c1, c2, surface = self.native
            stored = tensor_layout.to_native(stored.reshape(channels, height, width), c1, c2, surface)
        elif self.native is not None:  # tensor_layout.to_native into the kept image (its padding stays 0)
            if self.image is None:
                self.image, self.parts = _native_parts(self.native, stored.dtype)
            channels = self.native[0]
            stored = stored.reshape(channels, -1)
            for part, first, last in self.parts:
                groups, pixels, lanes = part.shape
                part[...] = stored[first:last].reshape(groups, lanes, pixels).transpose(0, 2, 1)
            stored = self.image
        if self.nbytes:
            self.region.data[self.offset:self.offset + self.nbytes] = stored.reshape(-1).view(np.uint8)
            self.memory.derived.invalidate(self.address, self.address + self.nbytes)


def _native_parts(native: tuple, dtype: np.dtype) -> tuple:
    """An NC1HWC2 tensor's zeroed memory image [C1][surface][C2] and the views of it that take
    channels [first, last): [groups][pixels][lanes], the whole C2 groups, then the last, partly
    filled one. Only these views are ever written: the padding stays 0."""
    channels, height, width, c1, c2, surface = native
    pixels = height * width
    image = np.zeros((c1, surface, c2), dtype)
    groups, rest = divmod(channels, c2)
    parts = []
    if groups:
        parts.append((image[:groups, :pixels, :], 0, groups * c2))
    if rest:
        parts.append((image[groups:groups + 1, :pixels, :rest], groups * c2, channels))
    return image, tuple(parts)


def tensor_io(runtime, name: str) -> TensorIO | None:
    """The tensor's plan, worked out on first use (None: take the general path)."""
    plans = runtime.host_io
    plan = plans.get(name, False)
    if plan is False or (plan is not None and plan.memory is not runtime.machine.memory):
        plan = plans[name] = _plan(runtime, name)
    return plan


def _plan(runtime, name: str) -> TensorIO | None:
    info = runtime.tensor_info(name)
    quant = info.get("quantization")
    if info.get("batch") or info.get("readout") or "address" not in info:
        return None
    if info.get("dtype") == "float16" and quant is None:
        scale, zero_point, itemsize = None, 0, 2
    elif info.get("dtype") == "int8" and isinstance(quant, dict):
        scale, zero_point, itemsize = quant.get("scale", 1.0), quant.get("zero_point", 0), 1
        if isinstance(scale, list) or isinstance(zero_point, list):
            return None
        scale = float(scale)
    else:
        return None
    shape = tuple(int(d) for d in info["shape"])
    if info.get("layout") == ND_LAYOUT:
        native, nbytes = None, math.prod(shape) * itemsize
        if nbytes > int(info["size"]):
            return None  # write_nd refuses it
    elif info.get("layout") == "NC1HWC2":
        _, chw, c1, c2, surface = runtime.geometry(name)
        native, nbytes = (*chw, c1, c2, surface), c1 * surface * c2 * itemsize
    else:
        return None
    address = int(info["address"])
    memory = runtime.machine.memory
    region = memory.region_at(address, nbytes)
    if region is None:
        return None
    return TensorIO(memory, region, address, nbytes, shape, scale, int(zero_point), native)
