"""Cross-checks of a model file's trailer beyond its JSON types (CONTAINER.md 3.6, "Bounds").

``container_trailer`` checks that every known key has the right type; this module checks that
the numbers make sense together, so that nothing the emulator or a tool later sizes, allocates
or loops over from the trailer can exceed the memory the file itself describes:

- memory regions fit the NPU's 32-bit address space and are at most 2 GiB each;
- a placed tensor lies inside its region, and its ``size`` holds the bytes its shape,
  ``native_shape``, ``c2`` and ``surface_stride`` need;
- quantization scales are positive and zero points fit the element type;
- batch records agree with each other; graph outputs exist, graph inputs are where the data
  enters;
- a chain declares at least one task and no more than its section could hold.

Every refusal is a :class:`SchemaViolation` naming the JSON path and the bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from npuemu.isa.container_section import Section
from npuemu.isa.container_trailer import ND_LAYOUT, SchemaViolation

#: every address register of the NPU is 32-bit: no region or tensor may reach beyond
ADDRESS_SPACE = 1 << 32
#: the largest memory region a model may ask the emulator to allocate (emulator/memory.py)
MAX_REGION_BYTES = 1 << 31
#: the largest dimension of any shape and element count of any tensor (a 32-bit count)
MAX_DIM = (1 << 31) - 1
MAX_ELEMENTS = 1 << 32
#: slices of a multi-batch build
MAX_BATCH = 1 << 16
#: bytes of one regcmd word; a task is at least one word, which bounds a chain's task count
WORD_BYTES = 8
NC1HWC2 = "NC1HWC2"
#: bytes per element of the element types the format names (int4/uint4: one byte, not packed)
ITEM_BYTES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
              "uint64": 8, "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2, "int4": 1, "uint4": 1}
#: zero points a quantized integer tensor can represent
ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
                    "int4": (-8, 7), "uint4": (0, 15)}


def check_semantics(sections: Sequence[Section], trailer: Mapping[str, Any]) -> None:
    """Raise :class:`SchemaViolation` for the first value out of its bound (trailer already typed)."""
    regions = _check_regions(trailer.get("memory_map", {}))
    tensors = {tensor["name"]: tensor for tensor in trailer.get("tensors", ())}
    for index, tensor in enumerate(trailer.get("tensors", ())):
        _check_tensor(tensor, f"trailer.tensors[{index}]", regions, tensors)
    _check_batch(trailer, tensors)
    _check_graph_names(trailer, tensors, sections)
    _check_readouts(trailer)
    _check_readins(trailer)
    _check_schedule(sections, trailer.get("schedule", ()))


def _fail(path: str, message: str) -> SchemaViolation:
    return SchemaViolation(f"{path}: {message}")


# --- memory map -----------------------------------------------------------------------------


def _check_regions(memory_map: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Regions by name as (base, end); areas inside the region they name."""
    regions: dict[str, tuple[int, int]] = {}
    for index, region in enumerate(memory_map.get("regions", ())):
        path, base, size = f"trailer.memory_map.regions[{index}]", region["base"], region["size"]
        if not 1 <= size <= MAX_REGION_BYTES:
            raise _fail(f"{path}.size", f"{size} is outside 1..{MAX_REGION_BYTES} bytes (2 GiB)")
        if base + size > ADDRESS_SPACE:
            raise _fail(path, f"[{base:#x}, {base + size:#x}) does not fit the NPU's 32-bit address space")
        regions[region["name"]] = (base, base + size)
    for index, area in enumerate(memory_map.get("areas", ())):
        path = f"trailer.memory_map.areas[{index}]"
        if area["size"] > MAX_REGION_BYTES:
            raise _fail(f"{path}.size", f"{area['size']} exceeds {MAX_REGION_BYTES} bytes")
        if "region" in area and regions and area["region"] not in regions:
            raise _fail(f"{path}.region", f"{area['region']!r} names no memory_map region ({', '.join(regions)})")
    return regions


# --- tensors --------------------------------------------------------------------------------


def _check_shape(shape: Sequence[int] | None, path: str) -> int | None:
    """The element count of a shape, after bounding each dimension and the count."""
    if shape is None:
        return None
    for axis, dim in enumerate(shape):
        if dim > MAX_DIM:
            raise _fail(f"{path}[{axis}]", f"{dim} exceeds the largest dimension, {MAX_DIM}")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise _fail(path, f"{list(shape)} has {count} elements, more than {MAX_ELEMENTS}")
    return count


#: keys a placed tensor (one with an ``address``) needs before the runtime can read or write it
PLACED_KEYS = {NC1HWC2: ("shape", "dtype", "native_shape", "size"), ND_LAYOUT: ("shape", "dtype", "size")}


def _check_tensor(tensor: Mapping[str, Any], path: str, regions: Mapping[str, tuple[int, int]],
                  tensors: Mapping[str, Any]) -> None:
    if "address" in tensor:
        for key in PLACED_KEYS.get(tensor.get("layout"), ("size",)):
            if key not in tensor:
                raise _fail(path, f"a placed {tensor.get('layout', '')} tensor (it has an address) needs {key!r}")
    count = _check_shape(tensor.get("shape"), f"{path}.shape")
    _check_shape(tensor.get("native_shape"), f"{path}.native_shape")
    needed = None
    if tensor.get("layout") == NC1HWC2:
        needed = _native_bytes(tensor, path)
    elif tensor.get("layout") == ND_LAYOUT and count is not None:
        needed = max(1, count * ITEM_BYTES[tensor["dtype"]])
    if needed is not None and "size" in tensor:
        slices = tensor["batch"]["size"] if "batch" in tensor else 1
        if needed * max(1, slices) > tensor["size"]:
            raise _fail(f"{path}.size", f"{tensor['size']} bytes cannot hold the {needed * max(1, slices)} bytes its "
                        "shape and layout need")
    _check_placement(tensor, path, regions)
    if "quantization" in tensor:
        _check_quantization(tensor, f"{path}.quantization")
    if "batch" in tensor:
        _check_tensor_batch(tensor, f"{path}.batch", tensors)


def _native_bytes(tensor: Mapping[str, Any], path: str) -> int | None:
    """Bytes of an NC1HWC2 tensor: C1 surfaces of ``surface_stride`` atoms of C2 elements."""
    native = tensor.get("native_shape")
    if native is None:
        return None
    if len(native) != 5 or native[0] != 1 or min(native) < 1:
        raise _fail(f"{path}.native_shape", f"expected [1, C1, H, W, C2] with every entry >= 1, got {native}")
    _, c1, height, width, c2 = native
    if tensor.get("c2", c2) != c2:
        raise _fail(f"{path}.c2", f"{tensor['c2']} differs from native_shape's C2, {c2}")
    surface = tensor.get("surface_stride", height * width)
    if not height * width <= surface <= MAX_REGION_BYTES:
        raise _fail(f"{path}.surface_stride", f"{surface} is outside H*W = {height * width} .. {MAX_REGION_BYTES}")
    _check_cube(tensor, path, c1 * c2, height, width)
    item = ITEM_BYTES.get(tensor.get("dtype", "int8"))
    return None if item is None else c1 * surface * c2 * item


def _check_cube(tensor: Mapping[str, Any], path: str, channels: int, height: int, width: int) -> None:
    """A [1, C, H, W]-like shape must fit the native geometry (multi-batch: each [1, ...] slice)."""
    from npuemu.isa.container_views import tensor_cube

    shape = tensor.get("shape")
    if shape is None:
        return
    cube = tensor_cube([1, *shape[1:]] if "batch" in tensor and shape else shape)
    if cube is not None and (cube[1:] != (height, width) or cube[0] > channels):
        raise _fail(f"{path}.shape", f"{list(shape)} does not fit native_shape {tensor['native_shape']} "
                    f"(C <= C1*C2 = {channels}, H = {height}, W = {width})")


def _check_placement(tensor: Mapping[str, Any], path: str, regions: Mapping[str, tuple[int, int]]) -> None:
    """A placed tensor lies inside the memory region it names."""
    if not regions or "address" not in tensor:
        return
    name = tensor.get("region", "ddr")
    if name not in regions:
        raise _fail(f"{path}.region", f"{name!r} names no memory_map region ({', '.join(regions)})")
    base, end = regions[name]
    start, size = tensor["address"], tensor.get("size", 0)
    if not base <= start <= start + size <= end:
        raise _fail(f"{path}.address", f"[{start:#x}, {start + size:#x}) is outside region {name!r} "
                    f"[{base:#x}, {end:#x})")
    for index, address in enumerate(tensor.get("batch", {}).get("addresses", ())):
        if not base <= address < end:
            raise _fail(f"{path}.batch.addresses[{index}]", f"{address:#x} is outside region {name!r}")


def _check_quantization(tensor: Mapping[str, Any], path: str) -> None:
    quant = tensor["quantization"]
    scales = quant.get("scale", 1.0)
    zero_points = quant.get("zero_point", 0)
    if tensor.get("layout") == NC1HWC2 and (isinstance(scales, list) or isinstance(zero_points, list)):
        raise _fail(path, "an NC1HWC2 tensor takes one scale and one zero point (per-tensor), not arrays")
    for index, scale in enumerate(scales if isinstance(scales, list) else [scales]):
        if not scale > 0:
            raise _fail(f"{path}.scale", f"{scale!r} (entry {index}) must be a positive number")
    low, high = ZERO_POINT_RANGE.get(tensor.get("dtype", ""), (-(1 << 63), (1 << 63) - 1))
    for index, zero_point in enumerate(zero_points if isinstance(zero_points, list) else [zero_points]):
        if not low <= zero_point <= high:
            raise _fail(f"{path}.zero_point", f"{zero_point} (entry {index}) is outside the {tensor.get('dtype')} "
                        f"range {low}..{high}")


def _check_tensor_batch(tensor: Mapping[str, Any], path: str, tensors: Mapping[str, Any]) -> None:
    batch = tensor["batch"]
    if not 1 <= batch["size"] <= MAX_BATCH:
        raise _fail(f"{path}.size", f"{batch['size']} is outside 1..{MAX_BATCH}")
    for key in ("addresses", "tensors"):
        if key in batch and len(batch[key]) != batch["size"]:
            raise _fail(f"{path}.{key}", f"{len(batch[key])} entries for a batch of {batch['size']}")
    for index, name in enumerate(batch.get("tensors", ())):
        if name not in tensors:
            raise _fail(f"{path}.tensors[{index}]", f"{name!r} names no tensor of the file")


# --- batch, graph and schedule --------------------------------------------------------------


def _check_batch(trailer: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    batch = trailer.get("batch")
    if batch is None:
        return
    size, contexts = batch.get("size", 1), batch.get("contexts", 1)
    if not 1 <= size <= MAX_BATCH:
        raise _fail("trailer.batch.size", f"{size} is outside 1..{MAX_BATCH}")
    if not 1 <= contexts <= size:
        raise _fail("trailer.batch.contexts", f"{contexts} is outside 1..batch.size ({size})")
    for name, tensor in tensors.items():
        if "batch" in tensor and tensor["batch"]["size"] != size:
            raise _fail("trailer.batch.size", f"{size} differs from tensor {name!r}'s batch.size "
                        f"{tensor['batch']['size']}")


def _check_graph_names(trailer: Mapping[str, Any], tensors: Mapping[str, Any], sections: Sequence[Section]) -> None:
    """Graph outputs are tensors of the file; an input is one too unless nothing reads it (an
    ONNX input only a folded Shape or a bypassed Dropout ratio used). Every tensor the layers or
    host steps read before any of them writes it, and that no section preloads, is a graph
    input: else the user's --input would land nowhere and the model would read zeroed memory."""
    graph = trailer.get("graph", {})
    if not tensors:
        return  # a file without tensor records (a bare chain): nothing to name
    for index, name in enumerate(graph.get("outputs", ())):
        if name not in tensors:
            raise _fail(f"trailer.graph.outputs[{index}]", f"{name!r} names no tensor of the file")
    reads, writes = _dataflow(trailer)
    for index, name in enumerate(graph.get("inputs", ())):
        if name not in tensors and name in reads:
            raise _fail(f"trailer.graph.inputs[{index}]", f"{name!r} is read by the model but names no tensor")
    npu_steps = any(step["kind"] == "npu" for step in trailer.get("schedule", ()))
    if npu_steps and not graph.get("layers"):
        return  # only the layer records say what the NPU chains write
    loaded = [(section.load_address, section.load_address + section.size) for section in sections if section.size]
    inputs = set(graph.get("inputs", ()))
    for name in sorted(reads - writes - inputs):
        if _slice_of(name) in writes | inputs:
            continue  # slice i of a multi-batch build (``name#b<i>``) runs the layers of its base name
        address = tensors.get(name, {}).get("address")
        if name in tensors and not any(start <= (address or -1) < end for start, end in loaded):
            raise _fail("trailer.graph.inputs", f"tensor {name!r} is read before anything writes it, no section "
                        "preloads it, and it is not a graph input")


def _check_readouts(trailer: Mapping[str, Any]) -> None:
    """A ``readout`` belongs to a graph output (or a slice of one); ``perm`` orders the axes of
    its ``shape`` and the readout ``shape`` holds as many elements (one slice's, on a multi-batch
    tensor)."""
    outputs = set(trailer.get("graph", {}).get("outputs", ()))
    for index, tensor in enumerate(trailer.get("tensors", ())):
        readout = tensor.get("readout")
        if readout is None:
            continue
        path = f"trailer.tensors[{index}].readout"
        if tensor["name"] not in outputs and _slice_of(tensor["name"]) not in outputs:
            raise _fail(path, f"{tensor['name']!r} is not a graph output")
        shape = tensor.get("shape")
        if shape is None or sorted(readout["perm"]) != list(range(len(shape))):
            raise _fail(f"{path}.perm", f"{readout['perm']} does not order the axes of shape {shape}")
        _check_shape(readout["shape"], f"{path}.shape")
        slices = tensor["batch"]["size"] if "batch" in tensor else 1  # a multi-batch tensor: per slice
        if math.prod(readout["shape"]) * slices != math.prod(shape):
            raise _fail(f"{path}.shape", f"{readout['shape']} does not hold the {math.prod(shape) // max(1, slices)} "
                        f"elements of a slice of {shape}")


def _check_readins(trailer: Mapping[str, Any]) -> None:
    """A ``readin`` belongs to a graph input (or a slice of one); ``perm`` orders the axes of the
    readin ``shape`` (the caller's), which holds as many elements as the stored ``shape`` (a slice's)."""
    inputs = set(trailer.get("graph", {}).get("inputs", ()))
    for index, tensor in enumerate(trailer.get("tensors", ())):
        readin = tensor.get("readin")
        if readin is None:
            continue
        path = f"trailer.tensors[{index}].readin"
        if tensor["name"] not in inputs and _slice_of(tensor["name"]) not in inputs:
            raise _fail(path, f"{tensor['name']!r} is not a graph input")
        _check_shape(readin["shape"], f"{path}.shape")
        if sorted(readin["perm"]) != list(range(len(readin["shape"]))):
            raise _fail(f"{path}.perm", f"{readin['perm']} does not order the axes of shape {readin['shape']}")
        shape = tensor.get("shape")
        slices = tensor["batch"]["size"] if "batch" in tensor else 1
        if shape is None or math.prod(readin["shape"]) * slices != math.prod(shape):
            raise _fail(f"{path}.shape", f"{readin['shape']} does not hold the elements of a slice of {shape}")


def _slice_of(name: str) -> str:
    """``t`` for a batch slice's ``t#b<i>`` (compiler/batch.py), else the name itself."""
    base, mark, index = name.rpartition("#b")
    return base if mark and index.isdigit() else name


def _dataflow(trailer: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Tensor names the layers and host steps read, and those they write."""
    reads: set[str] = set()
    writes: set[str] = set()
    for layer in trailer.get("graph", {}).get("layers", ()):
        reads.update(layer.get("inputs", ()))
        writes.update(layer.get("outputs", ()))
    for step in trailer.get("schedule", ()):
        if step["kind"] == "cpu":
            reads.update(step["inputs"])
            writes.update(step["outputs"])
    return reads, writes


def _check_schedule(sections: Sequence[Section], schedule: Sequence[Mapping[str, Any]]) -> None:
    """A chain declares 1.. as many tasks as its section has words from its offset: the count is
    checked against the PC's walk when it runs (emulator/runtime.py), this bound comes first."""
    sizes = {section.name: section.size for section in sections}
    for index, step in enumerate(schedule):
        if step["kind"] != "npu":
            continue  # host-step tensor names are looked up (and refused) when the step runs
        chain = step["chain"]
        room = max(1, (sizes.get(chain["section"], 0) - chain["offset"]) // WORD_BYTES)
        if not 1 <= chain["tasks"] <= room:
            raise _fail(f"trailer.schedule[{index}].chain.tasks", f"{chain['tasks']} is outside 1..{room} (a task is "
                        "at least one 8-byte word of the section from the chain's offset)")
