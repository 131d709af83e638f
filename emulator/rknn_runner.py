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
   A vendor rk3576 image input is written as the raw pixels instead, which the first conv's CNA
   converter normalizes and quantizes (``image_pixels``, REGISTER_SEMANTICS.md 47.1).
   An fp16 build (``do_quantization=False``) marks its activations ONNX FLOAT16 (tensor slot 0,
   code 10) with no scale: those are normalised, rounded to float16 and written in the same
   layouts (C2 = 8 on rk3588), and read back as float16.
4. Chain 0 (the single-core program) runs on core 0; or, asked for with ``cores``, one of the
   file's multi-core programs: its pieces on their cores, barrier phase by barrier phase
   (isa/rknn/variants.py, emulator/rknn_multicore.py).
5. The CPU-side layers run on the host: ``InputOperator`` / ``OutputOperator`` (layout
   conversion only) and ``Reshape`` (drop the channel blocking, reshape, requantise if the two
   tensors' quantisation differs). Any other CPU layer raises :class:`EmulationError` naming it.
   A Reshape that an NPU layer reads runs where the table puts it, its output written in that
   tensor's native layout, the NPU tasks before it run as a submit of their own
   (emulator/rknn_cpu_layers.py); the others run after the NPU program.
6. Outputs are read in their native layout and dequantised (fp16: widened) to float32 in the
   graph's shape.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from npuemu.emulator.kernels.layout import nc1hwc2_to_nchw, nchw_to_nc1hwc2
from npuemu.emulator.machine import ChainRun, Machine
from npuemu.emulator.memory import Memory
from npuemu.emulator.rknn_cpu_layers import HostStep, feeds_npu, host_layers, host_steps, segments
from npuemu.emulator.rknn_multicore import PlacedPiece, PieceRun, place_pieces, run_pieces
from npuemu.emulator.rknn_recurrent_output import input_rows, read_sequence, sequence_buffer
from npuemu.emulator.rknn_self_modifying import Rebase, run_fetching_each_block, scratch_words
from npuemu.isa.errors import EmulationError, InputError, ModelFileError, UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import (
    Region, RelocatedProgram, RknnLayer, RknnModel, RknnTensor, default_bases, load_rknn,
    plan_memory, region_image, relocate,
)
from npuemu.isa.rknn import rk3576_program
from npuemu.isa.rknn.relocate import has_self_modifying_entries
from npuemu.isa.tensor_layout import surface_atoms
from npuemu.isa.rknn.variants import CoreProgram, Launch, Piece, core_programs, launches, single_core
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
    host_steps: tuple[HostStep, ...] = ()       # CPU layers the NPU program waited for (timed)

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
        self.core_program = _pick_program(model, cores)
        self.plan = plan_memory(model)
        # the exLSTM writes into its own regcmd buffer: run by rknn_self_modifying.py
        self.self_modifying = has_self_modifying_entries(model)
        program = relocate(model, self.plan, default_bases(model, self.plan), self_modifying=self.self_modifying)
        self.added = AddedMemory(_file_end(program, self.plan))   # rk3576: RK3588's blobs the translation adds
        self.program = _emulator_layout(model, program, platform, self.core_program, self.added)
        self.host_steps = host_steps(model)
        self._feeds_npu = feeds_npu(model)
        self.placed, self._piece_words = (), np.zeros(0, np.uint64)
        self._segments: tuple[tuple[tuple[int, int], PlacedPiece | None], ...] = ()
        spec = load_platform(platform)
        if self.core_program.chains != ((0,),):
            self._check_multicore_host_steps()
            self.placed, self._piece_words = place_pieces(
                model, self.program, launches(model, self.core_program), load_regmap(spec.register_map.family),
                spec.pc.data_amount_scale, self._pieces_base())
        else:
            self._place_segments(spec)
        if self.self_modifying:
            self._check_self_modifying()
            largest = max(model.program.tasks[i].regcfg_amount for i in model.program.chains[0].tasks)
            self._piece_words = np.zeros(scratch_words(largest), np.uint64)   # the PC's block copy
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
        if _is_vendor_image(tensor, self.model):
            raise InputError(f"{label}: the vendor rk3576 image input is not quantized on the host; its raw "
                             f"pixels go to the NPU (image_pixels)")
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

    def image_pixels(self, index: int, array: np.ndarray) -> np.ndarray:
        """Input ``index`` of a vendor rk3576 file read as a packed image (``_is_vendor_image``): the raw
        pixels as the CNA reads them, [H][align(W, 16)][C] uint8, the row's padding 0 [V: the input tensor's
        size and the conv's LINE_STRIDE, REGISTER_SEMANTICS.md 47.1]. The CNA's converter applies the file's
        mean / std and the input quantization, so ``array`` must hold the raw pixel values."""
        tensor = self.input_tensors[index]
        label = f"input {index} ({tensor.name!r})"
        array = np.asarray(array)
        if tuple(array.shape) != tuple(tensor.shape) or array.ndim != 4:
            raise InputError(f"{label}: expected shape {list(tensor.shape)}, got {list(array.shape)}")
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)) or \
                array.dtype == np.int8 or not np.all((array >= 0) & (array <= 255) & (array == np.rint(array))):
            raise InputError(f"{label}: the vendor rk3576 image input takes raw pixel values (integers 0..255, "
                             f"normalized by the NPU's input converter), got {array.dtype} values outside that")
        norm = self.model.normalization[index] if index < len(self.model.normalization) else None
        if norm is not None and tuple(norm.channel_order[:array.shape[1]]) != tuple(range(array.shape[1])):
            raise EmulationError(f"{self.model.source}: input {index} reorders its channels "
                                 f"{list(norm.channel_order)}; the vendor rk3576 image input is run in graph order "
                                 f"only (REGISTER_SEMANTICS.md 47.1)")
        _, channels, height, width = array.shape
        pixels = np.zeros((height, -(-width // IMAGE_ROW_ALIGN) * IMAGE_ROW_ALIGN, channels), np.uint8)
        if tensor.size is not None and tensor.size != pixels.size:
            raise ModelFileError(f"{self.model.source}: input {index} ({tensor.name!r}) holds {tensor.size} bytes, "
                                 f"not the {pixels.size} of {height} rows of {pixels.shape[1]} {channels}-byte pixels "
                                 f"the vendor's rk3576 image input has")
        pixels[:, :width] = array[0].transpose(1, 2, 0).astype(np.uint8)
        return pixels

    def run(self, inputs: Sequence[np.ndarray]) -> RknnRun:
        model = self.model
        if len(inputs) != len(self.input_tensors):
            names = ", ".join(repr(t.name) for t in self.input_tensors)
            raise InputError(f"{model.source}: the model takes {len(self.input_tensors)} input(s) ({names}), "
                             f"got {len(inputs)}")
        quantized_inputs = [None if _is_vendor_image(tensor, model) else self.quantize_input(i, x)
                            for i, (tensor, x) in enumerate(zip(self.input_tensors, inputs))]
        memory = self._memory_image()
        machine = Machine(memory, self.platform)
        for index, (tensor, values) in enumerate(zip(self.input_tensors, quantized_inputs)):
            if values is None:   # raw pixels, normalized and quantized by the CNA (REGISTER_SEMANTICS.md 47.1)
                memory.load(self._address(tensor), self.image_pixels(index, inputs[index]).tobytes())
                continue
            memory.load(self._address(tensor), _to_native(tensor, values).tobytes())
            copy = input_rows(self.model, tensor, values)  # exGRU / exLSTM's atom rows (rknn_recurrent_output.py)
            if copy is not None:
                memory.load(self._address(copy[0]), copy[1].tobytes())

        host: dict[int, np.ndarray] = {}            # tensor index -> int8, graph shape
        done: list[str] = []
        pieces: tuple[PieceRun, ...] = ()
        if self.placed:
            for step in self.host_steps:   # all before the first task (_check_multicore_host_steps)
                self._run_host_layer(step.layer, memory, host)
                done.append(step.layer.name)
            pieces = run_pieces(machine, self.placed)
            first = pieces[0].run
            chain = ChainRun(first.core, first.address, first.first_amount,
                             tuple(task for piece in pieces for task in piece.run.tasks))
        else:
            chain = self._run_segments(machine, memory, host, done)

        for layer in host_layers(model)[len(self.host_steps):]:   # after the NPU program
            self._run_host_layer(layer, memory, host)
            done.append(layer.name)

        quantized: dict[str, np.ndarray] = {}
        outputs: dict[str, np.ndarray] = {}
        for tensor in self.output_tensors:
            values = host[tensor.index] if tensor.index in host else self._read(tensor, memory)
            quantized[tensor.name] = values
            outputs[tensor.name] = _dequantize(tensor, values, model)
        return RknnRun(outputs, quantized, chain, tuple(done), self.program, pieces, self.core_program.list_cores,
                       self.host_steps)

    # --- NPU submits around the host steps (rknn_cpu_layers.py) -------------------------------

    def _place_segments(self, spec) -> None:
        """Chain 0 cut at the host steps: a range that stops before the chain's end (or starts
        after its beginning) is laid out as a piece (rknn_multicore.py); the whole chain runs in place."""
        chain = self.model.program.chains[0]
        ranges = segments(chain.task_count, self.host_steps)
        whole = ((0, chain.task_count),)
        if ranges == whole:
            self._segments = ((whole[0], None),)
            return
        cut = tuple(Launch(((Piece(0, tuple(chain.tasks[a:b]), True),),)) for a, b in ranges)
        placed, self._piece_words = place_pieces(self.model, self.program, cut, load_regmap(spec.register_map.family),
                                                 spec.pc.data_amount_scale, self._pieces_base())
        self._segments = tuple(zip(ranges, placed))

    def _run_segments(self, machine: Machine, memory: Memory, host: dict[int, np.ndarray], done: list[str]) -> ChainRun:
        """Chain 0 submit by submit, each host step once the tasks before it have run."""
        steps = list(self.host_steps)
        records, first = [], None
        for (start, _), placed in self._segments:
            while steps and steps[0].after_tasks <= start:
                step = steps.pop(0)
                self._run_host_layer(step.layer, memory, host)
                done.append(step.layer.name)
            if placed is None:
                chain = self.model.program.chains[0]
                task = self.program.tasks[chain.first_task]
                scale = machine.platform.pc.data_amount_scale
                amount = -(-(task.regcfg_amount + 4) // scale) - 1   # (amount + 1) * scale >= block words
                if self.self_modifying:
                    run = run_fetching_each_block(machine, task.regcmd_addr, amount, chain.task_count,
                                                  (self._pieces_base(), self._piece_words.size),
                                                  rebase=Rebase.of(self.model, self.program))
                else:
                    run = machine.run_chain(task.regcmd_addr, amount, core=0)
            else:
                run = run_pieces(machine, (placed,))[0].run
            first = first or run
            records.extend(run.tasks)
        return ChainRun(0, first.address, first.first_amount, tuple(records))

    def _check_self_modifying(self) -> None:
        if self.core_program.chains != ((0,),) or len(self._segments) != 1:
            raise UnsupportedProgramError(
                f"{self.model.source}: the program writes into its own regcmd buffer (isa/RKNN_TAILS.md 2); the "
                f"runner runs such a program only as chain 0 on core 0 in one submit")

    def _check_multicore_host_steps(self) -> None:
        inside = [step.layer.name for step in self.host_steps if step.after_tasks > 0]
        if inside:
            raise UnsupportedProgramError(
                f"{self.model.source}: CPU layer(s) {', '.join(map(repr, inside))} run between NPU layers; the "
                f"runner cuts only the single-core program (chain 0) at CPU layers, not a multi-core one")

    # --- layout and memory -------------------------------------------------------------------

    def _image_size(self) -> int:
        pieces = self._piece_words.size * 8
        return self._pieces_base() + -(-pieces // _PAGE) * _PAGE

    def _pieces_base(self) -> int:
        """The page after everything the file places, plus one, then the pages of the blobs the
        rk3576 translation adds (``AddedMemory``): where a multi-core program's pieces go
        (rknn_multicore.py), and the end of the image without them."""
        return self.added.end()

    def _memory_image(self) -> Memory:
        memory = Memory(self.image_size)
        bases = self.program.bases
        for region in (Region.WEIGHT, Region.MISC, Region.LUT):
            image = region_image(self.model, self.plan, region)
            if len(image):
                memory.load(bases.of(region), bytes(image))
        memory.load(bases.regcmd, self.program.regcmd.astype("<u8").tobytes())
        memory.load(bases.task, self.program.task_blob)
        if len(self.added.data):
            memory.load(self.added.base, bytes(self.added.data))
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
        buffer = sequence_buffer(self.model, tensor, dtype.itemsize)  # exGRU / exLSTM (rknn_recurrent_output.py)
        if buffer is not None:
            return read_sequence(self._address(buffer), tensor, dtype, memory.dump)
        nbytes = _native_elements(tensor, dtype.itemsize) * dtype.itemsize
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
        """Refuse CPU layers we cannot execute (NPU layers may read what a Reshape made:
        rknn_cpu_layers.py)."""
        for layer in self.model.layers:
            if layer.unit == "NPU" or layer.op_type in _HOST_LAYOUT_ONLY or layer.op_type == "Reshape":
                continue
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
            self._keep(layer, target, values, memory, host)
            return
        in_scale, in_zero = _quantization(source, model)
        out_scale, out_zero = _quantization(target, model)
        if (in_scale, in_zero) != (out_scale, out_zero):
            real = (values.astype(np.float64) - in_zero) * in_scale
            values = np.clip(np.rint(real / out_scale) + out_zero, -128, 127).astype(np.int8)
        self._keep(layer, target, values, memory, host)
        log.info("host %s: %s %s -> %s %s", layer.name, source.name, list(source.shape), target.name,
                 list(target.shape))


    def _keep(self, layer: RknnLayer, target: RknnTensor, values: np.ndarray, memory: Memory,
              host: dict[int, np.ndarray]) -> None:
        """A host layer's result: for later host layers, and in DDR in the tensor's native layout
        (the Feature Tensor table's NativeShape: NC1HWC2 or plain) when an NPU layer reads it."""
        host[target.index] = values
        if layer.index in self._feeds_npu:
            memory.load(self._address(target), _to_native(target, values).tobytes())


class AddedMemory:
    """Bytes the runner places past everything the file places (from ``base``, a page boundary): the
    RK3588 weight cube and BS record of each vendor rk3576 int8 depthwise task, for which the vendor's
    blobs leave no room (isa/rknn/rk3576_dw8.place_memory, REGISTER_SEMANTICS.md 47.2), and RK3588's cube
    of an image-input conv (rk3576_image, 47.1). Empty for every other file, which lays out as before."""

    ALIGN = 64   # [C] each blob on a 64-byte boundary, as the vendor's blobs in the weight region

    def __init__(self, base: int) -> None:
        self.base, self.data, self._at = base, bytearray(), {}

    def place(self, blob: bytes) -> int:
        """The device address of ``blob`` (equal blobs share one: a conv split by rows reads one cube)."""
        if blob not in self._at:
            self.data.extend(bytes(-len(self.data) % self.ALIGN))
            self._at[blob] = self.base + len(self.data)
            self.data.extend(blob)
        return self._at[blob]

    def end(self) -> int:
        return self.base + -(-len(self.data) // _PAGE) * _PAGE


def _file_end(program: RelocatedProgram, plan) -> int:
    """The page after everything the file places, plus one."""
    bases, sizes = program.bases, plan.sizes
    ends = [bases.of(region) + sizes.get(region, 0) for region in (Region.WEIGHT, Region.INTERNAL,
                                                                 Region.MISC, Region.LUT)]
    ends += [bases.regcmd + program.regcmd.size * 8, bases.task + len(program.task_blob)]
    return -(-max(ends) // _PAGE) * _PAGE + _PAGE


def _emulator_layout(model: RknnModel, program: RelocatedProgram, platform: str,
                     core_program: CoreProgram, added: AddedMemory) -> RelocatedProgram:
    """A vendor rk3576 stream writes the vendor's rk3576 layout (isa/regmaps/rk3576_vendor.yaml);
    its conv tasks are rewritten to the positions the emulator's units read (those of the
    platform's map: npuemu's own rk3576 builds keep RK3588 positions), REGISTER_SEMANTICS.md 10.3;
    RK3588's blobs of its int8 depthwise and image-input tasks go to ``added``.
    A task the translation does not cover raises UnsupportedProgramError naming it."""
    if not rk3576_program.is_vendor_layout(model.target):   # the file's own layout, whatever it runs on
        return program
    spec = load_platform(platform)
    lists = [[model.program.tasks[index] for index in tasks] for tasks in core_program.lists]
    words = rk3576_program.translate_regcmd(program.regcmd, lists, load_regmap(rk3576_program.VENDOR_FAMILY),
                                            load_regmap(spec.register_map.family),
                                            rk3576_program.region_reader(model, program), model.source,
                                            (spec.cbuf.banks, spec.cbuf.bank_bytes), added.place)
    return dataclasses.replace(program, regcmd=words)


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


#: pixels a row of the vendor's rk3576 image input is padded to [V ORC: widths 24, 20, 16 -> rows of 32, 32, 16
#: pixels (LINE_STRIDE, the tensor's size); REGISTER_SEMANTICS.md 47.1]
IMAGE_ROW_ALIGN = 16
IMAGE_CHANNELS = 4    # at most: ARGB_IN 8..11


def _is_vendor_image(tensor: RknnTensor, model: RknnModel) -> bool:
    """A graph input a vendor rk3576 file keeps as a packed image (native [1, 1, H, W, C], C <= 4): its first
    conv reads raw C-byte pixels and converts them itself (isa/rknn/rk3576_image.py) [V ORC image builds]."""
    native = tuple(tensor.native_shape)
    return (rk3576_program.is_vendor_layout(model.target) and tensor.kind_name == "input" and len(native) == 5
            and native[1] == 1 and native[4] <= IMAGE_CHANNELS and tensor.dtype == INT8_DTYPE_CODE)


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


def _surface_pixels(tensor: RknnTensor, itemsize: int) -> int:
    """Pixels from one NC1HWC2 surface to the next: align(H*W, 4), a 1x1 surface one atom
    (isa/tensor_layout.py, from the vendor corpus' DST_SURF_STRIDE) [V: a vendor int8 (1,24,1,10)
    tensor, native (1,2,1,10,16), is 384 bytes and written with DST_SURF_STRIDE 12, read with
    LINE_STRIDE 40 and SURF_STRIDE -28 (12 - 40): tests/emulator/vendor_builds/reshape_conv_int8].
    A graph input, which the runtime writes, is not padded: H*W pixels per surface [V: the int8
    (1,17,11,6) input of tests/emulator/vendor_dpu_transpose/nhwc_int8_17x11x6 is read with
    LINE_STRIDE 24 + SURF_STRIDE 42 = 66 pixels per surface, though its region holds 2 x 68]."""
    _, c1, height, width, c2 = tensor.native_shape
    if c1 == 1 or tensor.kind_name == "input":
        return height * width
    return surface_atoms(height, width, c2 * itemsize)


def _native_elements(tensor: RknnTensor, itemsize: int) -> int:
    """Elements the tensor spans in memory: every surface but the last padded to the surface stride."""
    native = tuple(tensor.native_shape)
    if not _is_blocked(tensor):
        return int(np.prod(native))
    _, c1, height, width, c2 = native
    return ((c1 - 1) * _surface_pixels(tensor, itemsize) + height * width) * c2


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
        _, c1, height, width, c2 = native
        surfaces = np.zeros((c1, _surface_pixels(tensor, values.dtype.itemsize), c2), values.dtype)
        surfaces[:, :height * width] = blocked.reshape(c1, height * width, c2)
        return surfaces.reshape(-1)[:_native_elements(tensor, values.dtype.itemsize)]
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
        _, c1, height, width, c2 = native
        surface = _surface_pixels(tensor, raw.dtype.itemsize)
        surfaces = np.zeros(c1 * surface * c2, raw.dtype)
        surfaces[:raw.size] = raw
        blocked = surfaces.reshape(c1, surface, c2)[:, :height * width].reshape(native)
        nchw = nc1hwc2_to_nchw(blocked, channels)
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

