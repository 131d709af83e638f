"""Host runtime: load a model file, set inputs, run its schedule, read outputs.

    outputs = run_model_file("model.npu", {"x": x_float})      # {name: float32 array (NCHW)}

    runtime = Runtime(ModelFile.read("model.npu"))
    runtime.set_input("x", x)            # float -> quantized with the tensor's scale/zero point;
                                         # int8 arrays are taken as stored values
    runtime.run()
    q = runtime.output("y", dequantize=False)   # int8 NCHW

Everything comes from the model file (isa/CONTAINER.md): the memory image (sections), the
tensors' addresses, NC1HWC2 geometry and quantization, and the schedule. NPU steps run on
:class:`npuemu.emulator.machine.Machine`; CPU steps through :mod:`npuemu.emulator.cpu_ops`.

Quantizing a float input rounds half to even and saturates to int8:
``q = clamp(round(x / s) + z, -128, 127)``; dequantizing is ``s * (q - z)``. ``set_input`` writes
an NC1HWC2 input straight into its bytes in memory in one pass (emulator/input_store.py; issue 20),
byte for byte what the reference path (``write_native``) stores, which it falls back to for the
rest (ND and image-form inputs, NaN, other float types). ``output`` reads only the real channels'
lanes from memory and widens / dequantizes in compiled loops (emulator/output_read.py), the bits of
the numpy operations they replace.

From a Runtime's second run on, the process heap is kept out of the cycle collector's walks
(``gc.freeze``; emulator/gc_steady.py: no 0.2-0.5 s full collection every few dozen runs), given
back when a Runtime alive at a freeze is dropped; ``NPUEMU_GC_FREEZE=0`` or
``Runtime(..., gc_freeze=False)`` opts out.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from npuemu.emulator import dataclass_code_cache, gc_import, gc_steady

# (emulator/gc_import.py: no cycle collection walks the heap while the runtime's modules load;
# emulator/dataclass_code_cache.py: their dataclasses' methods are not compiled from source again)
with gc_import.paused(), dataclass_code_cache.reused():
    from npuemu.emulator.machine import Machine
    from npuemu.emulator.memo import Memo
    from npuemu.isa import tensor_layout
    from npuemu.isa.container import CpuStep, ModelFile, NpuStep
    from npuemu.isa.container_trailer import ND_LAYOUT
    from npuemu.isa.container_views import tensor_cube
    from npuemu.isa.errors import EmulationError, InputError, ModelFileError


#: element types a tensor may be stored in (the model file's tensor "dtype")
STORED_DTYPES = {"int8": np.dtype(np.int8), "float16": np.dtype(np.float16)}


class Runtime:
    """One loaded model: a machine with its memory image, ready to run."""

    def __init__(self, model: ModelFile, platform=None, *, gc_freeze: bool | None = None) -> None:
        """``gc_freeze``: move the heap into the collector's permanent generation once this
        Runtime is steady (emulator/gc_steady.py; None: unless ``NPUEMU_GC_FREEZE=0``)."""
        self.model = model
        self.machine = _machine(model, platform)
        graph = model.graph()
        self.inputs = tuple(graph.inputs)
        self.outputs = tuple(graph.outputs)
        self.runs: tuple = ()
        self._gc = gc_steady.Tracker(self, gc_steady.enabled_by_environment() if gc_freeze is None else gc_freeze)
        # trailer records by name, indexed once: host steps look tensors up on every run
        self._tensors = {tensor["name"]: tensor for tensor in model.trailer.get("tensors", ())}
        self._schedule: tuple | None = None  # parsed on the first run, then kept (same assumption)
        # what the runtime derives from a tensor's record (geometry, quantization), by (kind, name)
        self._per_tensor: Memo = Memo()
        self._readers: dict[tuple[str, bool], Any] = {}  # ``output``'s per (tensor, dequantize)
        self._storers: dict[str, Any] = {}  # ``set_input``'s per tensor (``_storer``)
        # host steps' per-tensor read/store plans (emulator/cpu_ops_io.py), by name
        self.host_io: dict[str, Any] = {}
        # inputs an rk3576 own build stores in the vendor's image form (compiler/LOWERING.md 52), by name
        self._images = _image_inputs(model.trailer, self._tensors)
        _check_atoms(self._tensors.values(), self.machine.atom_bytes, self.machine.platform.name)
        for name in self.inputs + self.outputs:
            info = self._tensors.get(name)
            if info is not None and "address" not in info:
                raise ModelFileError(f"graph input/output tensor {name!r} has no address in the model file")

    # --- layout ---------------------------------------------------------------------------

    def geometry(self, name: str) -> tuple[dict[str, Any], tuple[int, int, int], int, int, int]:
        """An NC1HWC2 tensor's record, (C, H, W), C1, C2 and surface stride in pixels."""
        return self._geometry(name)

    def _geometry(self, name: str) -> tuple[dict[str, Any], tuple[int, int, int], int, int, int]:
        # a pure function of the tensor's trailer record: worked out once per tensor (host
        # steps ask on every run)
        geometry = self._per_tensor.get("geometry", name)
        if geometry is None:
            geometry = self._per_tensor.put(self._work_out_geometry(name), "geometry", name)
        return geometry

    def _work_out_geometry(self, name: str) -> tuple[dict[str, Any], tuple[int, int, int], int, int, int]:
        info = self.tensor_info(name)
        if info.get("layout") != "NC1HWC2" or info.get("dtype") not in STORED_DTYPES:
            raise EmulationError(f"tensor {name!r}: layout {info.get('layout')} / dtype {info.get('dtype')} is not "
                                 "handled by the runtime (expected int8 or float16 NC1HWC2)")
        shape = info["shape"]
        _, c1, height, width, c2 = info["native_shape"]
        chw = tensor_cube(shape)
        if chw is None:
            raise EmulationError(f"tensor {name!r}: shape {shape} is not [1, C, H, W] (or [1, C] of a 1x1 map, or "
                                 "a tensor of fewer dimensions)")
        if chw[1:] != (height, width) or chw[0] > c1 * c2:
            raise EmulationError(f"tensor {name!r}: shape {shape} does not fit native shape {info['native_shape']}")
        surface = int(info.get("surface_stride", height * width))
        return info, chw, int(c1), int(c2), surface

    def tensor_info(self, name: str) -> dict[str, Any]:
        """The tensor's trailer record (isa/CONTAINER.md 3.3)."""
        info = self._tensors.get(name)
        if info is None:
            raise InputError(f"the model file has no tensor named {name!r}")
        return info

    def dtype(self, name: str) -> str:
        """How the tensor is stored: "int8" or "float16"."""
        return str(self.tensor_info(name).get("dtype"))

    def write_native(self, name: str, values: np.ndarray) -> None:
        """Store int8 (or float16) [C, H, W] (or [1, C, H, W]) values at the tensor's address in NC1HWC2
        (an ND host tensor: its values row-major, cpu_ops_tensors)."""
        if is_nd(self.tensor_info(name)):
            _nd_tensors().write_nd(self.machine.memory, self.tensor_info(name), values)
            return
        info, shape, c1, c2, surface = self._geometry(name)
        values = np.asarray(values)
        logical = tuple(info["shape"])
        if values.shape != shape and values.shape != logical:
            raise InputError(f"input {name!r}: expected shape {list(logical)}, got {list(values.shape)}")
        dtype = STORED_DTYPES[info["dtype"]]
        values = values.reshape(shape).astype(dtype)
        if name in self._images:
            self.machine.memory.load(int(info["address"]), image_bytes(values, self._images[name]))
            return
        image = tensor_layout.to_native(values, c1, c2, surface)
        self.machine.memory.load(int(info["address"]), image.reshape(-1).view(np.uint8))

    def read_native(self, name: str) -> np.ndarray:
        """The int8 values of a tensor (its logical shape, e.g. [1, C, H, W]), read from its NC1HWC2 bytes."""
        if is_nd(self.tensor_info(name)):
            return _nd_tensors().read_nd(self.machine.memory, self.tensor_info(name))
        info, shape, c1, c2, surface = self._geometry(name)
        channels, height, width = shape
        if name in self._images:   # the vendor rk3576 image form (image_bytes): the int8 values back
            form = self._images[name]
            rows = self.machine.memory.dump(int(info["address"]), height * int(form["row_pixels"]) * channels)
            pixels = rows.reshape(height, -1, channels)[:, :width].astype(np.int16) - int(form["value_bias"])
            return pixels.transpose(2, 0, 1).astype(np.int8).reshape(info["shape"])
        image = self._output_image(name)
        if image is None:  # (outside every region: the host read's error)
            self.machine.memory.dump(int(info["address"]), c1 * surface * c2 * STORED_DTYPES[info["dtype"]].itemsize)
        # (the real channels' lanes straight from memory, one copy: emulator/output_read.py)
        return _output_read().channels_of(image, channels, height * width).reshape(info["shape"])

    def _output_image(self, name: str) -> np.ndarray | None:
        """An NC1HWC2 tensor's image in memory as a [C1, surface, C2] view (None: not inside one region),
        worked out once per tensor (memory regions never move)."""
        known = self._per_tensor.get("output_image", name)
        if known is None:
            info, _, c1, c2, surface = self._geometry(name)
            dtype = STORED_DTYPES[info["dtype"]]
            address, nbytes = int(info["address"]), c1 * surface * c2 * dtype.itemsize
            region = self.machine.memory.region_at(address, nbytes)
            image = None if region is None else \
                region.data[address - region.base:address - region.base + nbytes].view(dtype).reshape(c1, surface, c2)
            known = self._per_tensor.put((image,), "output_image", name)
        return known[0]

    # --- quantization ---------------------------------------------------------------------

    def quantization(self, name: str) -> tuple[float, int]:
        known = self._per_tensor.get("quantization", name)
        if known is None:
            known = self._per_tensor.put(self._read_quantization(name), "quantization", name)
        return known

    def _read_quantization(self, name: str) -> tuple[float, int]:
        quant = self.tensor_info(name).get("quantization")
        if quant is None:
            raise EmulationError(f"tensor {name!r} has no quantization in the model file")
        scale, zero_point = quant.get("scale", 1.0), quant.get("zero_point", 0)
        if isinstance(scale, list) or isinstance(zero_point, list):  # graph I/O is quantized per tensor
            raise EmulationError(f"tensor {name!r}: the runtime quantizes inputs and outputs per tensor; the model "
                                 "file gives per-channel arrays")
        return float(scale), int(zero_point)

    def zero_input(self, name: str) -> np.ndarray:
        """Zeros of input ``name``'s shape in the type it is stored in (perf and trace without
        --input): at most the bytes the model file places the tensor in, which the reader bounds."""
        info = self.tensor_info(name) if name in self._tensors else None
        if info is None or info.get("shape") is None:
            raise ModelFileError(f"input tensor {name!r} has no shape in the model file")
        if is_nd(info) and "quantization" not in info:
            dtype = _nd_tensors().nd_dtype(info)
        else:
            dtype = STORED_DTYPES.get(str(info.get("dtype")), np.dtype(np.int8))
        return np.zeros(self.input_shape(name), dtype)

    def input_shape(self, name: str) -> tuple[int, ...]:
        """The shape the caller gives input ``name`` in: its ``readin`` shape where the model
        permutes it as it stores it (isa/CONTAINER.md 3.3), else its shape."""
        info = self.tensor_info(name)
        if info.get("readin") is None:
            return tuple(info["shape"])
        given = tuple(info["readin"]["shape"])  # a multi-batch input: each slice's record carries it
        return (info["batch"]["size"], *given[1:]) if "batch" in info else given

    def _slices(self, name: str) -> list[str] | None:
        """The per-slice tensor names of a multi-batch input/output (compiler/batch.py), else None."""
        batch = self.tensor_info(name).get("batch")
        return list(batch["tensors"]) if batch else None

    def set_input(self, name: str, values: np.ndarray) -> None:
        store = self._storers.get(name)
        if store is not None and store(values):
            return
        if name not in self.inputs:
            raise InputError(f"{name!r} is not an input of the model (inputs: {', '.join(self.inputs)})")
        if name not in self._tensors:
            return  # an input no step reads (e.g. an inference Dropout's ratio): nothing to store
        values = np.asarray(values)
        slices = self._slices(name)
        if slices is not None:  # [N, ...]: slice i goes to its own address
            if values.ndim == 0 or values.shape[0] != len(slices):
                raise InputError(f"input {name!r}: the model has batch size {len(slices)}, got shape "
                                 f"{list(values.shape)} (expected [{len(slices)}, ...])")
            for part, slice_name in zip(values, slices):
                self._store_input(slice_name, part[None])
            return
        self._store_input(name, values)
        if name not in self._storers:
            self._storers[name] = self._storer(name)

    def _storer(self, name: str):
        """``store(values) -> bool``: ``set_input(name, values)`` in one call for the common case - an NC1HWC2
        tensor ``_store_direct`` stores, without batch slices or a readin record that moves axes (one whose
        ``perm`` keeps the order only reshapes: silero-vad's state), given an ndarray it takes as it is (float
        for a float16 tensor, int8 or float for an int8 one with its quantization) -, its lookups done once
        (issue 20: ~2.5 of silero-vad's ~6 us an input); False where it does not store (``set_input``'s own
        path then, from the start). None for another tensor."""
        info = self.tensor_info(name)
        readin = info.get("readin")
        reshaped = readin is not None and list(readin["perm"]) == list(range(len(readin["shape"])))
        target = None if self._slices(name) is not None or readin is not None and not reshaped or is_nd(info) \
            else self._input_image(name)
        if target is None:
            return None
        from npuemu.emulator import input_store

        image, shapes, address, nbytes, cube = target
        if reshaped:  # (the caller's shape, as ``_read_in`` checks it; its elements in the same order)
            shapes = {tuple(readin["shape"])}
        memory, floats, into = self.machine.memory, input_store.QUANTIZE_DTYPES, input_store.store_into
        fp16 = self.dtype(name) == "float16"
        try:  # (float values of an int8 tensor: its quantization; one the runtime refuses takes the own path)
            quantization = None if fp16 else self.quantization(name)
        except EmulationError:
            quantization = None

        def store(values) -> bool:
            if type(values) is not np.ndarray or values.shape not in shapes:
                return False
            if values.dtype in floats:  # (float values: halved, or quantized where the tensor has a quantization)
                if not fp16 and quantization is None or not into(image, values.reshape(cube), quantization, fp16):
                    return False
            elif values.dtype != np.int8 or fp16 or not into(image, values.reshape(cube)):
                return False
            memory.derived.invalidate(address, address + nbytes)  # (as Memory.load does)
            return True

        return store

    def _store_input(self, name: str, values: np.ndarray) -> None:
        values = self._read_in(name, values)
        if is_nd(self.tensor_info(name)) and "quantization" not in self.tensor_info(name):
            self.write_native(name, values)  # a host tensor of its own element type (int64, bool, float32...)
            return
        if self.dtype(name) == "float16":  # fp16 inputs take real values as they are
            if values.dtype.kind != "f":  # (np.issubdtype(..., np.floating), without its ~1.5 us)
                raise InputError(f"input {name!r} is float16: expected float values, got {values.dtype}")
            if self._store_direct(name, values, halve=True):  # (float32 / float64: converted in the store)
                return
            values = values.astype(np.float16)  # (numpy's contiguous cast: faster than a strided one)
            if not self._store_direct(name, values):
                self.write_native(name, values)
            return
        if values.dtype == np.int8:
            if not self._store_direct(name, values):
                self.write_native(name, values)
            return
        if values.dtype.kind != "f":
            raise InputError(f"input {name!r}: expected float values or int8 stored values, got {values.dtype}")
        scale, zero_point = self.quantization(name)
        if self._store_direct(name, values, (scale, zero_point)):
            return
        stored = np.clip(np.rint(values.astype(np.float64) / scale) + zero_point, -128, 127)
        self.write_native(name, stored.astype(np.int8))

    def _store_direct(self, name: str, values: np.ndarray, quantization: tuple[float, int] | None = None, *,
                      halve: bool = False) -> bool:
        """The one-pass store of an input (emulator/input_store.py): ``values`` (quantized with
        ``quantization`` if given, converted to float16 if ``halve``, else converted to the stored type)
        straight into the tensor's NC1HWC2 bytes, byte for byte what ``write_native`` stores. False where
        it does not apply (an ND or image-form tensor, a shape ``write_native`` refuses, values only the
        reference path converts or a NaN): the caller then takes that path."""
        target = self._input_image(name)
        if target is None or values.shape not in target[1]:
            return False
        image, _, address, nbytes, cube = target
        from npuemu.emulator import input_store

        # ([C, H, W], as write_native reshapes)
        if not input_store.store_into(image, values.reshape(cube), quantization, halve):
            return False
        self.machine.memory.derived.invalidate(address, address + nbytes)  # (as Memory.load does)
        return True

    def _input_image(self, name: str):
        """(the tensor's NC1HWC2 image in memory as a [C1, surface, C2] view, the value shapes
        ``write_native`` takes, address, bytes, [C, H, W]), or None for a tensor the one-pass store does not
        handle; worked out once per tensor (memory regions never move)."""
        known = self._per_tensor.get("input_image", name)
        if known is None:
            known = self._per_tensor.put((self._work_out_input_image(name),), "input_image", name)
        return known[0]

    def _work_out_input_image(self, name: str):
        info = self.tensor_info(name)
        if is_nd(info) or name in self._images:
            return None
        info, shape, c1, c2, surface = self._geometry(name)
        dtype = STORED_DTYPES[info["dtype"]]
        address, nbytes = int(info["address"]), c1 * surface * c2 * dtype.itemsize
        region = self.machine.memory.region_at(address, nbytes)
        if region is None:  # (write_native reports it)
            return None
        offset = address - region.base
        image = region.data[offset:offset + nbytes].view(dtype).reshape(c1, surface, c2)
        return image, {shape, tuple(info["shape"])}, address, nbytes, shape

    def _read_in(self, name: str, values: np.ndarray) -> np.ndarray:
        """An input with a ``readin`` record (isa/CONTAINER.md 3.3) as the model stores it: the
        caller's array transposed by ``perm`` and reshaped, on the host like the NCHW -> NC1HWC2
        conversion after it (the vendor's runtime takes NCHW or NHWC the same way)."""
        readin = self.tensor_info(name).get("readin")
        if readin is None:
            return values
        if tuple(values.shape) != tuple(readin["shape"]):
            raise InputError(f"input {name!r}: expected shape {list(readin['shape'])}, got {list(values.shape)}")
        return np.ascontiguousarray(np.transpose(values, readin["perm"])).reshape(self.tensor_info(name)["shape"])

    def output(self, name: str, dequantize: bool = True) -> np.ndarray:
        read = self._readers.get((name, dequantize))
        if read is None:
            read = self._readers[name, dequantize] = self._reader(name, dequantize) or \
                functools.partial(self._output, name, dequantize)
        return read()

    def _reader(self, name: str, dequantize: bool):
        """``output(name, dequantize)`` as a call of its own for the common case - an NC1HWC2 tensor inside one
        memory region, without batch slices, a readout or the image form, of float16 or int8 with a per-tensor
        quantization -: the same copies and conversions, its per-tensor lookups done once (issue 20: ~8 -> ~3 us
        for silero-vad's small outputs); None for every other tensor (``_output``)."""
        info = self.tensor_info(name)
        if self._slices(name) is not None or is_nd(info) or name in self._images or info.get("readout") is not None:
            return None
        image = self._output_image(name)
        if image is None or image.dtype not in (np.dtype(np.int8), np.dtype(np.float16)):
            return None
        _, (channels, height, width), _, _, _ = self._geometry(name)
        shape, pixels, reading = tuple(info["shape"]), height * width, _output_read()
        if not dequantize:
            return lambda: reading.channels_of(image, channels, pixels).reshape(shape)
        if image.dtype == np.float16:
            return lambda: reading.widen(reading.channels_of(image, channels, pixels).reshape(shape))
        if "quantization" not in info:
            return None
        scale, zero_point = self.quantization(name)
        return lambda: reading.dequantize(reading.channels_of(image, channels, pixels).reshape(shape), scale,
                                          zero_point)

    def _output(self, name: str, dequantize: bool) -> np.ndarray:
        slices = self._slices(name)
        if slices is not None:  # a multi-batch output: the slices stacked along axis 0
            return np.concatenate([self.output(part, dequantize) for part in slices])
        stored = self._read_out(name, self.read_native(name))
        if not dequantize:
            return stored
        if stored.dtype == np.float16:
            return _output_read().widen(stored)  # (astype(np.float32)'s bits, compiled)
        if "quantization" not in self.tensor_info(name) and is_nd(self.tensor_info(name)):
            return stored
        scale, zero_point = self.quantization(name)
        if stored.dtype == np.int8:  # (the float64 operations below in one compiled pass)
            return _output_read().dequantize(stored, scale, zero_point)
        # scale * (stored - zero point) in float64 with one temporary (the product commutes exactly)
        values = np.subtract(stored, zero_point, dtype=np.float64)
        values *= scale
        return values.astype(np.float32)

    def _read_out(self, name: str, values: np.ndarray) -> np.ndarray:
        """An output with a ``readout`` record (isa/CONTAINER.md 3.3) as its model gives it: the
        stored map transposed by ``perm`` and reshaped, on the host like the NC1HWC2 -> NCHW
        conversion before it (the vendor's runtime offers NCHW or NHWC the same way)."""
        readout = self.tensor_info(name).get("readout")
        if readout is None:
            return values
        return np.ascontiguousarray(np.transpose(values, readout["perm"])).reshape(readout["shape"])

    # --- running --------------------------------------------------------------------------

    def run(self) -> None:
        runs = []
        if self._schedule is None:
            self._schedule = self.model.schedule()
        run_step = None  # (the host-step runner, looked up once per run: issue 20, per-step cost)
        for index, step in enumerate(self._schedule):
            if isinstance(step, NpuStep):
                runs.append(self._run_chain(index, step))
            elif isinstance(step, CpuStep):
                run_step = run_step or _cpu_ops().run_step
                run_step(self, step)
            else:  # pragma: no cover - the container knows two step kinds
                raise EmulationError(f"schedule step {index}: unknown kind")
        self.runs = tuple(runs)
        self._gc.after_run()  # after its first runs, the heap leaves the collector's walks

    def _run_chain(self, index: int, step: NpuStep):
        """One NPU step; the PC must walk as many tasks as the file declares, else the chain in
        the file is not the one its schedule describes and the outputs would be garbage."""
        section = self.model.section(step.chain.section)
        run = self.machine.run_chain(section.load_address + step.chain.offset, step.chain.first_amount, step.core)
        if len(run.tasks) != step.chain.tasks:
            raise EmulationError(f"schedule step {index}: the chain in section {section.name!r} at offset "
                                 f"{step.chain.offset:#x} ran {len(run.tasks)} task(s); the model file declares "
                                 f"{step.chain.tasks} (trailer.schedule[{index}].chain.tasks)")
        return run


def is_nd(info: Mapping[str, Any]) -> bool:
    """Whether a tensor is an ND host tensor (cpu_ops_tensors.is_nd, without importing it)."""
    return info.get("layout") == ND_LAYOUT


def _nd_tensors():
    """ND host tensors' reads and writes, imported when a model first has one (issue 20: its
    ml_dtypes import is ~5 ms of a fresh process's first call)."""
    from npuemu.emulator import cpu_ops_tensors

    return cpu_ops_tensors


def _output_read():
    """Output reads (emulator/output_read.py), imported at a process's first ``output``."""
    from npuemu.emulator import output_read

    return output_read


def _cpu_ops():
    """The host-step operators, imported when a model first runs one (issue 20: a model without
    host steps does not pay for importing every op module at start-up)."""
    from npuemu.emulator import cpu_ops

    return cpu_ops


def _machine(model: ModelFile, platform) -> Machine:
    """The machine with the model's memory image; a memory map larger than this host can
    allocate is reported, not a MemoryError (regions are bounded by the reader, CONTAINER.md 3.6)."""
    try:
        return Machine.from_model(model, platform)
    except MemoryError:
        total = sum(region.size for region in model.memory_map().regions)
        raise EmulationError(f"cannot allocate the model's memory image: its memory_map regions total {total} "
                             "bytes, more than this host can give") from None


def _image_inputs(trailer: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    """{tensor: its image form} of the inputs in the trailer's platform.image_inputs, a batched input's slices
    (compiler/batch.py) too."""
    forms = trailer.get("platform", {}).get("image_inputs", {})
    if not isinstance(forms, Mapping):
        raise ModelFileError("trailer.platform.image_inputs is not an object")
    forms = dict(forms)
    for name, form in forms.items():
        _check_image_form(name, form, tensors.get(name))
    for name, form in list(forms.items()):
        for part in (tensors.get(name, {}).get("batch") or {}).get("tensors", ()):
            _check_image_form(name, form, tensors.get(part), part)  # (each slice's rows land in its own bytes)
            forms[part] = form
    return forms


def _check_image_form(name: str, form: Any, info: Mapping[str, Any] | None, part: str | None = None) -> None:
    """A recorded image form fits its tensor (``info``; a batched input's slice ``part``): 3-byte pixels, rows
    of at least the width, inside the bytes the tensor reserves (a hostile record must not make the runtime
    allocate or write past them)."""
    key = f"trailer.platform.image_inputs[{name!r}]"
    if info is None or not isinstance(form, Mapping):
        raise ModelFileError(f"{key}: no such tensor, or the form is not an object")
    values = {field: form.get(field) for field in ("pixel_bytes", "row_pixels", "value_bias")}
    for field, value in values.items():
        if type(value) is not int:
            raise ModelFileError(f"{key}.{field}: expected an integer, got {value!r}")
    shape, size = info.get("shape"), info.get("size")
    if not (isinstance(shape, list) and len(shape) >= 3 and all(type(d) is int for d in shape)) or type(size) is not int:
        raise ModelFileError(f"{key}: the tensor's shape or size is not recorded")
    channels, height, width = shape[-3:]
    if values["pixel_bytes"] != 3 or channels != 3 or not 0 <= values["value_bias"] <= 255:
        raise ModelFileError(f"{key}: pixel_bytes {values['pixel_bytes']} / value_bias {values['value_bias']} "
                             f"for a {channels}-channel tensor (3 and 0..255 expected)")
    if not width <= values["row_pixels"] < width + 16 or values["row_pixels"] * height * 3 > size:
        held = f"the tensor's {size} bytes" if part is None else f"the {size} bytes of batch slice {part!r}"
        raise ModelFileError(f"{key}.row_pixels: {values['row_pixels']} does not fit width {width}, height "
                             f"{height} in {held}")


def image_bytes(values: np.ndarray, form: Mapping[str, Any]) -> np.ndarray:
    """int8 [C, H, W] values of an input stored in the vendor rk3576 image form (trailer platform.image_inputs,
    compiler/LOWERING.md 52) as its bytes: per pixel its C channels as u = value + value_bias (uint8), rows of
    row_pixels pixels (the padding 0): what the first conv's CNA converter turns back into the values."""
    channels, height, width = values.shape
    if channels != int(form["pixel_bytes"]) or width > int(form["row_pixels"]):
        raise ModelFileError(f"image input form {dict(form)} does not fit values of shape {list(values.shape)}")
    rows = np.zeros((height, int(form["row_pixels"]), channels), np.uint8)
    rows[:, :width] = (values.transpose(1, 2, 0).astype(np.int16) + int(form["value_bias"])).astype(np.uint8)
    return rows.reshape(-1)


def _check_atoms(tensors, atom_bytes: int, chip: str) -> None:
    """An NC1HWC2 tensor's C2 fills the chip's atom (C2 x element bytes = atom), except a packed
    input of C <= C2 channels (C2 = C, the vendor's format for 1-4 channel inputs)."""
    for info in tensors:
        dtype = STORED_DTYPES.get(str(info.get("dtype")))
        if info.get("layout") != "NC1HWC2" or dtype is None or "native_shape" not in info:
            continue
        c2 = info["native_shape"][4]
        channels = (tensor_cube([1, *info["shape"][1:]]) or (0,))[0] if info.get("shape") else 0
        if c2 * dtype.itemsize != atom_bytes and not (c2 == channels and c2 * dtype.itemsize < atom_bytes):
            raise ModelFileError(f"tensor {info['name']!r}: c2 {c2} of {info['dtype']} does not fill the {chip} "
                                 f"atom of {atom_bytes} bytes (nor equals the tensor's {channels} channels)")


def run_model_file(path: str | os.PathLike[str], inputs: Mapping[str, np.ndarray], *,
                   dequantize: bool = True) -> dict[str, np.ndarray]:
    """Load ``path``, set ``inputs`` (float, or int8 stored values), run, return the outputs
    by name (float32 when ``dequantize``, else int8), shaped [1, C, H, W] ([N, ...] for a model
    built with ``--batch-size N``)."""
    model = ModelFile.read(path)  # a dynamic-shape file: the set of the inputs' shapes (isa/CONTAINER.md 3.7)
    runtime = Runtime(model.for_input_shapes({name: np.shape(value) for name, value in inputs.items()}))
    missing = [name for name in runtime.inputs if name not in inputs]
    if missing:
        raise InputError(f"{path}: no value given for input(s) {', '.join(missing)}")
    unknown = [name for name in inputs if name not in runtime.inputs]
    if unknown:
        raise InputError(f"{path}: {', '.join(map(repr, unknown))} not input(s) of the model "
                         f"(inputs: {', '.join(runtime.inputs)})")
    for name, value in inputs.items():
        runtime.set_input(name, value)
    runtime.run()
    return {name: runtime.output(name, dequantize) for name in runtime.outputs}
