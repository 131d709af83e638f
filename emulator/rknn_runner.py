"""Run a vendor ``.rknn`` model (rknn-toolkit2, format 6) on the emulator.

The flow follows the fixture README "Loading a .rknn in an emulator" and
``docs/rknn-relocation.md``; every fact used comes from the model file itself:

1. ``load_rknn`` -> vendor memory plan (``plan_memory``) at ``default_bases`` -> ``relocate``.
2. A DDR image holding the weight, misc and LUT region images, the internal region, and the
   relocated regcmd and task buffers.
3. Each float input is normalised with the file's mean/std (graph slot 8/9 values as read by
   the loader), quantised with the input tensor's scale and zero point
   (``clip(rint(x / scale) + zp)``), and written in its native layout: NC1HWC2 with the C2 of
   the tensor's native shape (``[1,1,H,W,3]`` is the packed 3-channel first-layer format, the
   same rule with C1 = 1, C2 = 3), or plain row-major for 2-D tensors.
   An fp16 build (``do_quantization=False``) marks its activations ONNX FLOAT16 (tensor slot 0,
   code 10) with no scale: those are normalised, rounded to float16 and written in the same
   layouts (C2 = 8 on rk3588), and read back as float16.
4. Chain 0 (the single-core program) runs on core 0; or, asked for with ``cores``, one of the
   file's multi-core programs: its pieces on their cores, barrier phase by barrier phase
   (isa/rknn/variants.py, emulator/rknn_multicore.py).
5. The CPU-side layers the file schedules after the NPU program run on the host:
   ``InputOperator`` / ``OutputOperator`` (layout conversion only) and ``Reshape`` (drop the
   channel blocking, reshape, requantise if the two tensors' quantisation differs). Any other
   CPU layer raises :class:`EmulationError` naming it.
6. Outputs are read in their native layout and dequantised (fp16: widened) to float32 in the
   graph's shape.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from npuemu.emulator.kernels.layout import nc1hwc2_to_nchw, nchw_to_nc1hwc2
from npuemu.emulator.machine import ChainRun, Machine
from npuemu.emulator.memory import Memory
from npuemu.emulator.rknn_multicore import PieceRun, place_pieces, run_pieces
from npuemu.isa.errors import EmulationError, InputError, ModelFileError, UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import (
    Region, RelocatedProgram, RknnLayer, RknnModel, RknnTensor, default_bases, load_rknn,
    plan_memory, region_image, relocate,
)
from npuemu.isa.rknn.variants import CoreProgram, core_programs, launches, single_core
from npuemu.platforms import load_platform

log = logging.getLogger(__name__)

INT8_DTYPE_CODE = 3                     # ONNX TensorProto.INT8: quantised activations
FLOAT16_DTYPE_CODE = 10                 # ONNX TensorProto.FLOAT16: a do_quantization=False build
_PAGE = 4096
_HOST_LAYOUT_ONLY = ("InputOperator", "OutputOperator")


@dataclass(frozen=True)
class RknnRun:
    """The result of one inference: outputs by graph-output name, plus what the NPU did."""

    outputs: dict[str, np.ndarray]              # float32, graph shape (NCHW for 4-D)
    quantized: dict[str, np.ndarray]            # int8 (float16 for an fp16 build), graph shape
    chain: ChainRun                             # per-task records (registers, DMA traffic); multi-core:
    #                                             every piece's records in run order (each names its core)
    host_layers: tuple[str, ...]                # CPU layers executed on the host, in order
    program: RelocatedProgram = field(repr=False)
    pieces: tuple[PieceRun, ...] = ()           # multi-core: each core's records between barriers
    cores: tuple[int, ...] = (0,)               # the cores of the program that ran

    @property
    def tasks(self):
        return self.chain.tasks


def run_rknn_file(path: str | os.PathLike[str], inputs: Sequence[np.ndarray], platform: str = "rk3588",
                  cores: Sequence[int] | None = None) -> RknnRun:
    """Load ``path`` and run it on ``inputs`` (one array per graph input, in graph order)."""
    return RknnRunner(load_rknn(path), platform, cores).run(inputs)


class RknnRunner:
    """A loaded ``.rknn`` model laid out for the emulator; :meth:`run` may be called repeatedly."""

    def __init__(self, model: RknnModel, platform: str = "rk3588", cores: Sequence[int] | None = None) -> None:
        self.model = model
        self.platform = platform
        if model.program.regcmd_tensor is None or not model.program.chains:
            raise ModelFileError(f"{model.source}: the file holds no NPU program (no regcmd/task blobs)")
        self._check_host_layers()
        _check_register_layout(model)
        self.core_program = _pick_program(model, cores)
        self.plan = plan_memory(model)
        self.program = relocate(model, self.plan, default_bases(model, self.plan))
        self.placed, self._piece_words = (), np.zeros(0, np.uint64)
        if self.core_program.chains != ((0,),):
            spec = load_platform(platform)
            self.placed, self._piece_words = place_pieces(
                model, self.program, launches(model, self.core_program), load_regmap(spec.register_map.family),
                spec.pc.data_amount_scale, self._pieces_base())
        self.image_size = self._image_size()

    # --- public ----------------------------------------------------------------------------

    @property
    def input_tensors(self) -> tuple[RknnTensor, ...]:
        return self.model.input_tensors

    @property
    def output_tensors(self) -> tuple[RknnTensor, ...]:
        return self.model.output_tensors

    def quantize_input(self, index: int, array: np.ndarray) -> np.ndarray:
        """Float (or already-int8) input ``index`` -> int8 in the graph shape (float16 for a
        float16 input tensor: an fp16 build takes its input unquantised)."""
        tensor = self.input_tensors[index]
        label = f"input {index} ({tensor.name!r})"
        array = np.asarray(array)
        if tuple(array.shape) != tuple(tensor.shape):
            raise InputError(f"{label}: expected shape {list(tensor.shape)}, got {list(array.shape)}")
        fp16 = _is_float16(tensor)
        if array.dtype == np.int8 and not fp16:
            return array
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise InputError(f"{label}: expected a numeric array, got dtype {array.dtype}")
        values = array.astype(np.float64)
        if not np.all(np.isfinite(values)):
            raise InputError(f"{label}: holds NaN or infinite values")
        values = self._normalize(index, values)
        if fp16:
            return values.astype(np.float16)
        scale, zero_point = _quantization(tensor, self.model)
        return np.clip(np.rint(values / scale) + zero_point, -128, 127).astype(np.int8)

    def run(self, inputs: Sequence[np.ndarray]) -> RknnRun:
        model = self.model
        if len(inputs) != len(self.input_tensors):
            names = ", ".join(repr(t.name) for t in self.input_tensors)
            raise InputError(f"{model.source}: the model takes {len(self.input_tensors)} input(s) ({names}), "
                             f"got {len(inputs)}")
        quantized_inputs = [self.quantize_input(i, x) for i, x in enumerate(inputs)]
        memory = self._memory_image()
        machine = Machine(memory, self.platform)
        for tensor, values in zip(self.input_tensors, quantized_inputs):
            memory.load(self._address(tensor), _to_native(tensor, values).tobytes())

        pieces: tuple[PieceRun, ...] = ()
        if self.placed:
            pieces = run_pieces(machine, self.placed)
            first = pieces[0].run
            chain = ChainRun(first.core, first.address, first.first_amount,
                             tuple(task for piece in pieces for task in piece.run.tasks))
        else:
            first = self.program.tasks[model.program.chains[0].first_task]
            scale = machine.platform.pc.data_amount_scale
            amount = -(-(first.regcfg_amount + 4) // scale) - 1   # (amount + 1) * scale >= block words
            chain = machine.run_chain(first.regcmd_addr, amount, core=0)

        host: dict[int, np.ndarray] = {}            # tensor index -> int8, graph shape
        done: list[str] = []
        for layer in model.layers:
            if layer.unit == "NPU" or layer.op_type in _HOST_LAYOUT_ONLY:
                continue
            self._run_host_layer(layer, memory, host)
            done.append(layer.name)

        quantized: dict[str, np.ndarray] = {}
        outputs: dict[str, np.ndarray] = {}
        for tensor in self.output_tensors:
            values = host[tensor.index] if tensor.index in host else self._read(tensor, memory)
            quantized[tensor.name] = values
            outputs[tensor.name] = _dequantize(tensor, values, model)
        return RknnRun(outputs, quantized, chain, tuple(done), self.program, pieces, self.core_program.list_cores)

    # --- layout and memory -------------------------------------------------------------------

    def _image_size(self) -> int:
        pieces = self._piece_words.size * 8
        return self._pieces_base() + -(-pieces // _PAGE) * _PAGE

    def _pieces_base(self) -> int:
        """The page after everything the file places, plus one: where a multi-core program's
        pieces go (rknn_multicore.py), and the end of the image without them."""
        bases, sizes = self.program.bases, self.plan.sizes
        ends = [bases.of(region) + sizes.get(region, 0) for region in (Region.WEIGHT, Region.INTERNAL,
                                                                     Region.MISC, Region.LUT)]
        ends += [bases.regcmd + self.program.regcmd.size * 8, bases.task + len(self.program.task_blob)]
        return -(-max(ends) // _PAGE) * _PAGE + _PAGE

    def _memory_image(self) -> Memory:
        memory = Memory(self.image_size)
        bases = self.program.bases
        for region in (Region.WEIGHT, Region.MISC, Region.LUT):
            image = region_image(self.model, self.plan, region)
            if len(image):
                memory.load(bases.of(region), bytes(image))
        memory.load(bases.regcmd, self.program.regcmd.astype("<u8").tobytes())
        memory.load(bases.task, self.program.task_blob)
        if len(self._piece_words):
            memory.load(self._pieces_base(), self._piece_words.astype("<u8").tobytes())
        return memory

    def _address(self, tensor: RknnTensor) -> int:
        try:
            return self.program.addresses[tensor.name]
        except KeyError:
            raise ModelFileError(f"{self.model.source}: tensor {tensor.name!r} has no place in the memory "
                                 f"plan (kind {tensor.kind_name})") from None

    def _read(self, tensor: RknnTensor, memory: Memory) -> np.ndarray:
        _check_activation_dtype(tensor, self.model)
        dtype = np.dtype("<f2") if _is_float16(tensor) else np.dtype(np.int8)
        nbytes = int(np.prod(tensor.native_shape)) * dtype.itemsize
        raw = memory.dump(self._address(tensor), nbytes).view(dtype)
        return _from_native(tensor, raw)

    def _normalize(self, index: int, values: np.ndarray) -> np.ndarray:
        """Apply the file's per-channel (x - mean) / std (and channel order) to input ``index``."""
        if index >= len(self.model.normalization):
            return values
        norm = self.model.normalization[index]
        trivial = all(m == 0 for m in norm.mean) and all(s == 1 for s in norm.std)
        channels = values.shape[1] if values.ndim == 4 else 0
        order = tuple(norm.channel_order[:channels])
        reordered = channels and sorted(order) == list(range(channels)) and order != tuple(range(channels))
        if trivial and not reordered:
            return values
        if values.ndim != 4 or len(norm.mean) < channels or len(norm.std) < channels:
            raise EmulationError(f"{self.model.source}: input {index} has mean {list(norm.mean)} / std "
                                 f"{list(norm.std)} but shape {list(values.shape)}; only NCHW inputs with "
                                 f"one mean/std value per channel are supported")
        if reordered:
            values = values[:, list(order)]
        mean = np.asarray(norm.mean[:channels], np.float64)[None, :, None, None]
        std = np.asarray(norm.std[:channels], np.float64)[None, :, None, None]
        if np.any(std == 0):
            raise ModelFileError(f"{self.model.source}: input {index} has a zero std value {list(norm.std)}")
        return (values - mean) / std

    # --- host (CPU) layers -----------------------------------------------------------------

    def _check_host_layers(self) -> None:
        """Refuse CPU layers we cannot execute, and CPU work the NPU program depends on."""
        produced_on_host: set[int] = set()
        for layer in self.model.layers:
            if layer.unit == "NPU":
                used = produced_on_host.intersection(layer.inputs)
                if used:
                    names = ", ".join(repr(self.model.tensors[i].name) for i in sorted(used))
                    raise EmulationError(f"{self.model.source}: NPU layer {layer.name!r} consumes {names}, made by a "
                                         f"CPU layer; CPU steps inside the NPU program are not supported yet")
            elif layer.op_type in _HOST_LAYOUT_ONLY:
                continue
            elif layer.op_type == "Reshape":
                produced_on_host.update(layer.outputs)
            else:
                raise EmulationError(f"{self.model.source}: CPU layer {layer.name!r} (op {layer.op_type}) "
                                     f"is not supported by the host-side runner")

    def _run_host_layer(self, layer: RknnLayer, memory: Memory, host: dict[int, np.ndarray]) -> None:
        model = self.model
        if not layer.inputs or len(layer.outputs) != 1:
            raise ModelFileError(f"{model.source}: CPU layer {layer.name!r} has {len(layer.inputs)} inputs and "
                                 f"{len(layer.outputs)} outputs; Reshape needs data in and one tensor out")
        source = model.tensors[layer.inputs[0]]
        target = model.tensors[layer.outputs[0]]
        values = host[source.index] if source.index in host else self._read(source, memory)
        if values.size != int(np.prod(target.shape)):
            raise ModelFileError(f"{model.source}: Reshape {layer.name!r} maps {list(source.shape)} to "
                                 f"{list(target.shape)}: element counts differ")
        values = values.reshape(target.shape)
        _check_activation_dtype(target, model)
        if _is_float16(source) or _is_float16(target):
            if not (_is_float16(source) and _is_float16(target)):
                raise EmulationError(f"{model.source}: Reshape {layer.name!r} maps {source.dtype_name} to "
                                     f"{target.dtype_name}; only same-type reshapes are supported")
            host[target.index] = values
            return
        in_scale, in_zero = _quantization(source, model)
        out_scale, out_zero = _quantization(target, model)
        if (in_scale, in_zero) != (out_scale, out_zero):
            real = (values.astype(np.float64) - in_zero) * in_scale
            values = np.clip(np.rint(real / out_scale) + out_zero, -128, 127).astype(np.int8)
        host[target.index] = values
        log.info("host %s: %s %s -> %s %s", layer.name, source.name, list(source.shape), target.name,
                 list(target.shape))


def _check_register_layout(model: RknnModel) -> None:
    """A vendor rk3576 stream writes the RK3576 register layout (CNA 0x1018 CBUF banks, 0x101C
    weight bytes, ...; DPU per-channel operands in 8-channel records and a BS-config tensor at
    DPU_RDMA 0x5024): the emulator's units read the RK3588 positions that npuemu's own rk3576
    builds use (isa/REGISTERS.md), so the file is refused by name (REGISTER_SEMANTICS.md 10.2)."""
    if model.target == "rk3576":   # the file's own layout, whatever platform it is run on
        configs = [t.name for t in model.tensors if t.name.endswith("BScfgTensor")]
        held = f"; DPU BS-config tensors {', '.join(repr(n) for n in configs)}" if configs else ""
        raise UnsupportedProgramError(
            f"{model.source}: a vendor rk3576 register stream (re-packed CNA/CORE/DPU geometry: CNA 0x1018 CBUF "
            f"banks, 0x101C weight bytes, 0x1028/0x102C input sizes{held}) is not decoded by the emulator, whose "
            f"rk3576 units read the RK3588 positions of npuemu's own builds; emulator/REGISTER_SEMANTICS.md 10 "
            f"lists the layout read so far")


def _pick_program(model: RknnModel, cores: Sequence[int] | None) -> CoreProgram:
    """The program of the file that runs on exactly ``cores`` (None: chain 0 on core 0)."""
    wanted = tuple(sorted(set(cores))) if cores is not None else (0,)
    if wanted == (0,):   # chain 0 needs no reading of the other chains
        return single_core(model)
    programs = core_programs(model)
    for program in programs:
        if tuple(program.list_cores) == wanted:
            return program
    held = "; ".join(f"{p.label} (cores {'_'.join(map(str, p.list_cores))})" for p in programs)
    raise InputError(f"{model.source}: no program of the file runs on core(s) {'_'.join(map(str, wanted))}; "
                     f"it holds: {held}")


def _quantization(tensor: RknnTensor, model: RknnModel) -> tuple[float, int]:
    if len(tensor.scales) != 1 or len(tensor.zero_points) != 1:
        raise EmulationError(f"{model.source}: tensor {tensor.name!r} has {len(tensor.scales)} scales; "
                             f"only per-tensor quantised activations are supported")
    scale = float(np.float32(tensor.scales[0]))
    if not scale > 0:
        raise ModelFileError(f"{model.source}: tensor {tensor.name!r} has scale {scale}")
    return scale, int(tensor.zero_points[0])


def _check_activation_dtype(tensor: RknnTensor, model: RknnModel) -> None:
    if tensor.dtype not in (INT8_DTYPE_CODE, FLOAT16_DTYPE_CODE):
        raise EmulationError(f"{model.source}: tensor {tensor.name!r} has dtype {tensor.dtype_name}; only int8 "
                             f"and float16 activations are supported")


def _is_float16(tensor: RknnTensor) -> bool:
    """An fp16 build's activation: tensor slot 0 is ONNX FLOAT16 (and it carries no scale)
    [V] conv_hardswish_fp16 model.rknn, `npuemu inspect`: x/y float16, no scale or zero point."""
    return tensor.dtype == FLOAT16_DTYPE_CODE


def _dequantize(tensor: RknnTensor, values: np.ndarray, model: RknnModel) -> np.ndarray:
    """Graph-shape int8 (or float16) values -> float32."""
    if _is_float16(tensor):
        return values.astype(np.float32)
    scale, zero_point = _quantization(tensor, model)
    return ((values.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


def _is_blocked(tensor: RknnTensor) -> bool:
    return len(tensor.native_shape) == 5


def _to_native(tensor: RknnTensor, values: np.ndarray) -> np.ndarray:
    """int8 (or float16) graph-shape values -> the tensor's native layout."""
    native = tuple(tensor.native_shape)
    if _is_blocked(tensor):
        if values.ndim != 4:
            raise EmulationError(f"tensor {tensor.name!r}: native shape {list(native)} needs a 4-D graph shape, "
                                 f"has {list(values.shape)}")
        blocked = nchw_to_nc1hwc2(np.ascontiguousarray(values), native[4], native[1])
        if blocked.shape != native:
            raise EmulationError(f"tensor {tensor.name!r}: graph shape {list(values.shape)} does not fit native "
                                 f"shape {list(native)}")
        return np.ascontiguousarray(blocked)
    if int(np.prod(native)) != values.size:
        raise EmulationError(f"tensor {tensor.name!r}: native shape {list(native)} does not hold graph shape "
                             f"{list(values.shape)}")
    return np.ascontiguousarray(values).reshape(-1)


def _from_native(tensor: RknnTensor, raw: np.ndarray) -> np.ndarray:
    """int8 (or float16) values in the native layout -> graph-shape values (channel padding dropped)."""
    native = tuple(tensor.native_shape)
    shape = tuple(tensor.shape)
    if _is_blocked(tensor):
        channels = shape[1] if len(shape) >= 2 else native[1] * native[4]
        nchw = nc1hwc2_to_nchw(np.ascontiguousarray(raw.reshape(native)), channels)
        if int(np.prod(shape)) != nchw.size:
            raise EmulationError(f"tensor {tensor.name!r}: native shape {list(native)} does not give graph shape "
                                 f"{list(shape)}")
        return nchw.reshape(shape)
    return raw.reshape(shape).copy()


def dynamic_graph(model: RknnModel, shapes: Sequence[Sequence[int] | None], index: int | None = None) -> int:
    """The graph of a dynamic-shape ``.rknn`` (guide 5.4: one graph per input shape set) to run:
    ``index`` when given, else the one whose input shapes equal ``shapes`` (NCHW, one per input;
    None matches any). An InputError names the file's shape sets when none matches; a static
    file is its graph 0."""
    sets = model.graph_shapes or (tuple(tuple(t.shape) for t in model.input_tensors),)
    listed = "; ".join(" ".join(",".join(map(str, shape)) for shape in entry) for entry in sets)
    if index is not None:
        if not 0 <= index < len(sets):
            raise InputError(f"{model.source}: shape set {index} asked; the file has {len(sets)} (0..{len(sets) - 1}): "
                             f"{listed}")
        return index
    for found, entry in enumerate(sets):
        if len(entry) == len(shapes) and all(s is None or tuple(s) == tuple(e) for s, e in zip(shapes, entry)):
            return found
    given = " ".join(",".join(map(str, s)) for s in shapes if s is not None)
    raise InputError(f"{model.source}: input shape(s) {given} match none of the file's shape sets: {listed}")


def load_input_arrays(paths: Sequence[str | os.PathLike[str]]) -> list[np.ndarray]:
    """Read ``.npy`` files (a user error if unreadable or not a plain numeric array)."""
    arrays = []
    for path in paths:
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as error:
            raise InputError(f"input file {str(path)!r} cannot be read as .npy: {error}") from None
        if not isinstance(array, np.ndarray):
            raise InputError(f"input file {str(path)!r} is a .npz archive, expected one .npy array")
        arrays.append(array)
    return arrays

