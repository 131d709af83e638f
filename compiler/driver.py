"""The compiler's table of contents: ONNX model -> model file, one stage per line.

    from npuemu.compiler.driver import CompileOptions, compile_model
    model = compile_model("net.onnx", "rk3588", CompileOptions(dataset="ds.txt"))
    model.write("net.npu")

Stages, each a module with one job:

1. import          ``onnx_import``      ONNX -> graph IR (shapes inferred, constants folded)
2. graph passes    ``passes``           folding, hardware fusions, clean-up, vendor rewrites
3. partition       ``passes.partition`` NPU or CPU for every layer, with the reason
4. quantization    ``quant``            int8 (calibrated, or a QDQ model's own), float16 or hybrid
5. layer records   ``layer_records``    fused nodes -> lowering records and host steps
6. memory plan     ``tensor_plan``      tensor shapes, sizes, lifetimes, views, DDR/SRAM addresses
7. lowering        ``lower``            records -> register-command tasks
8. scheduling      ``schedule``         tasks -> chains per core, host steps between them
9. packaging       ``package``          sections, tensor records, trailer -> ModelFile

Stages 1-4 are :func:`prepare` (a :class:`Front`: the quantized graph and what was decided on
the way), 5-9 :func:`build` (``build.build_model``). Tools that need the graph in between -
accuracy analysis, the testing kit, the matmul API - call the two halves and read or adjust the
graph between them; everything else calls :func:`compile_model`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npuemu.compiler.build import build_model
from npuemu.compiler.core_mask import parse_core_mask
from npuemu.compiler.gc_freeze import frozen_heap
from npuemu.compiler.ir import Graph
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import (CalibrationOptions, calibrate, float16_graph, preprocess_for_inputs,
                                   quantize_from_config, quantize_graph, quantize_with_dataset, read_config)
from npuemu.compiler.quant.auto_hybrid import calibrate_auto_hybrid
from npuemu.compiler.quant.dataset import CalibrationSamples, read_dataset
from npuemu.compiler.quant.qdq import quantize_prequantized, take_qdq_params
from npuemu.compiler import dynamic_shapes, sparse_weights
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import CompileError, ConfigError
from npuemu.platforms import Platform, apply_overrides, load_platform
from npuemu.platforms.loader import split_overrides
from npuemu.platforms.model import to_plain

#: Precisions of a build: int8 calibrated on ``dataset``, float16 throughout, the per-layer mix
#: of a quant config (hybrid, ``quant_config``), or none (the float graph, no model file).
PRECISIONS = ("int8", "fp16", "hybrid", "float")

Samples = Sequence[Mapping[str, np.ndarray]]

#: The platform figures only the timing model reads (emulator/timing: DDR rates and overlap, clock,
#: launch overheads, the cycle model's rate figures, the vendor estimate's figures): a ``--set`` key
#: equal to one of these or under one (``ddr`` or ``ddr.read_bytes_per_cycle``) never changes a
#: build. Every other key - cores, cbuf, sram, macs, nc1hwc2, channel_alignment, register_map, pc,
#: fusion, matmul, cycle_model.atom_k_int8 / input_channel_group, ... - is taken as read by the
#: compiler. ``npuemu sweep`` keys its build cache on the others only; tests/tools/
#: test_set_overrides.py builds a model under two values of each timing-only key and checks the
#: model bytes are identical.
TIMING_ONLY_KEYS = ("clock", "ddr", "launch", "vendor_estimate", "cycle_model.pixel_granule",
                    "cycle_model.dpu_bytes_per_cycle", "cycle_model.conv_write_bytes_per_cycle",
                    "cycle_model.depthwise_group", "cycle_model.min_taps_per_pass")


def timing_only(key: str) -> bool:
    """Whether the platform key (a ``--set`` key path) is one only the timing model reads."""
    return any(key == prefix or key.startswith(prefix + ".") for prefix in TIMING_ONLY_KEYS)


def override_map(overrides: Mapping[str, Any] | Sequence[str]) -> dict[str, Any]:
    """``--set`` texts ('KEY=VALUE') or a mapping as one KEY -> value dict (a later key wins, as
    the loader applies them in order)."""
    return {key: value for _, key, value in split_overrides(overrides)} if overrides else {}


def compiler_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides a build depends on: all but the timing-only keys."""
    return {key: value for key, value in overrides.items() if not timing_only(key)}


@dataclass(frozen=True)
class CompileOptions:
    """Everything a build depends on besides the model and the chip (the flags of ``npuemu
    compile``). ``dataset`` is a dataset file in the vendor's format or samples in memory
    (dicts of float arrays by input name, already preprocessed)."""

    precision: str = "int8"
    dataset: str | Path | Samples | None = None
    quant_config: str | Path | None = None
    algorithm: str = "normal"
    per_channel: bool = True
    mean: Sequence[str] = ()  # the --mean option texts: [NAME=]V0,V1,... per input
    std: Sequence[str] = ()
    bgr: bool = False
    progress: bool = False
    # called with each phase's name (PHASES) as it starts: the CLI draws it on a terminal
    # (tools/progress_cli.py); library code never prints
    on_phase: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    input_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    optimization_level: int = 3
    core_mask: str = "auto"
    sram: bool = False
    batch_size: int = 1
    elide_copies: bool = True  # no-copy Concat/Split where the layout allows (LOWERING.md 10.1)
    pack_inputs: bool = True  # 1-4 channel first-layer inputs stored packed (C2 = C)
    prune: bool = False  # remove all-zero conv output channels (guide 5.8, passes/prune.py)
    sparse: bool = False  # RK3576 4:2 sparse conv weights (guide 5.11, compiler/sparse_weights.py)
    name: str | None = None
    # platform figures replaced for this build: KEY -> value or value text (`--set KEY=VALUE`, the
    # keys and checks of `npuemu platforms --set`); recorded in the model file when given
    platform_overrides: Mapping[str, Any] = field(default_factory=dict)
    # the user's Python ops ("module:Class", compiler/ops/custom.py; `--custom-op`): host steps
    custom_ops: Sequence[str] = ()
    # model surgery before import (passes/surgery.py): cut at tensors (`--inputs`/`--outputs`, None:
    # the model's own), inputs fixed to constants (`--freeze NAME=VALUE`: name -> value)
    inputs: Sequence[str] | None = None
    outputs: Sequence[str] | None = None
    freeze: Mapping[str, Any] = field(default_factory=dict)
    # input shape sets of a dynamic-shape build (guide 5.4, compiler/dynamic_shapes.py): each a
    # mapping NAME -> shape or the vendor's list of shapes in input order; () for a static build
    dynamic_input: Sequence[Any] = ()
    # int8 with the layers that cost the most accuracy moved to float16 until the outputs' cosine
    # to the float model reaches this on the calibration set (`--auto-hybrid`, quant/auto_hybrid.py)
    auto_hybrid: float | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        if (self.precision == "hybrid") != (self.quant_config is not None):
            raise ConfigError("a hybrid build takes its layer precisions from a quant config (quant_config=...), "
                              "and only a hybrid build takes one")
        if self.batch_size < 1:
            raise ConfigError(f"batch size {self.batch_size}: expected 1 or more")
        if self.batch_size != 1 and self.core_mask != "auto":
            raise ConfigError(f"--batch-size {self.batch_size} cannot be combined with --core-mask {self.core_mask}: "
                              "every batch context runs with core mask auto, one context per core (guide 5.6.1)")
        if self.auto_hybrid is not None and self.precision != "int8":
            raise ConfigError("--auto-hybrid moves layers of an int8 build to float16: it needs --dataset ds.txt and "
                              "cannot be combined with --fp16 or --quant-config")

    @property
    def calibration_given(self) -> bool:
        """Whether any calibration option departs from its default."""
        return (self.dataset is not None or bool(self.mean) or bool(self.std) or self.bgr
                or self.algorithm != "normal" or not self.per_channel)

    def record(self, preprocess: Mapping[str, Any] | None) -> dict[str, Any]:
        """The options a model file records (``compiler.options`` in its trailer)."""
        record = {"optimization_level": self.optimization_level, "algorithm": self.algorithm,
                  "per_channel": self.per_channel}
        if preprocess:  # what `npuemu run` applies to image inputs
            record["preprocess"] = dict(preprocess)
        return record | {"core_mask": self.core_mask, "sram": bool(self.sram), "batch_size": self.batch_size}


@dataclass
class Front:
    """Stages 1-4: the fused, partitioned, quantized graph and what was decided on the way."""

    graph: Graph
    platform: Platform
    options: CompileOptions
    pass_log: Any = None
    partition: Any = None
    quantization: Any = None  # quant.QuantizationResult; None for precision "float"
    preprocess: dict[str, Any] = field(default_factory=dict)  # per input, as plain values
    model: ModelFile | None = None  # the model file, once :func:`build` made it
    sparse_note: str | None = None  # why --sparse does nothing in this build (fp16), for the log
    source: Any = None  # the ONNX model (path or ModelProto): a dynamic-shape build imports it per set
    auto_hybrid: Any = None  # quant.auto_hybrid.AutoHybridResult of an --auto-hybrid build


#: What ``CompileOptions.on_phase`` is called with, in order: :func:`prepare` reports the first three
#: (quantization only when the build quantizes), :func:`build` / :func:`build_graph` the last, which
#: covers stages 5-9 (layer records, memory plan, lowering, scheduling, packaging).
PHASES = ("import", "graph passes", "quantization", "lowering")


def _phase(options: CompileOptions, name: str) -> None:
    if options.on_phase is not None:
        options.on_phase(name)


def compile_model(model: str | Path | Any, target: str | Platform = "rk3588",
                  options: CompileOptions | None = None) -> ModelFile:
    """The model file of an ONNX model (path or ModelProto) for ``target``."""
    return build(prepare(model, target, options))


def prepare(model: str | Path | Any, target: str | Platform = "rk3588",
            options: CompileOptions | None = None) -> Front:
    """Stages 1-4: import, graph passes and partition, quantization."""
    options = options or CompileOptions()
    if isinstance(model, (str, Path)) and str(model).lower().endswith(".mnn"):  # mnn_import.is_mnn_path
        from npuemu.compiler.mnn_import import mnn_to_onnx  # here: an ONNX build skips its ~20-50 ms import

        model = mnn_to_onnx(model)  # an .mnn file is read into the ONNX graph it holds
    if options.dynamic_input:  # set 0 is prepared as a static build is (compiler/dynamic_shapes.py)
        options = dynamic_shapes.first_set_options(model, options)
    platform = target_platform(target, options.platform_overrides)  # a typo fails first
    sparse_note = None
    if options.sparse:  # a chip without it fails before the import (compiler/sparse_weights.py)
        platform, sparse_note = sparse_weights.build_platform(platform, options.precision)
    _phase(options, "import")
    graph = import_onnx(model, options.input_shapes, options.custom_ops, inputs=options.inputs,
                        outputs=options.outputs, freeze=options.freeze)
    front = Front(graph, platform, options, sparse_note=sparse_note, source=model)
    with frozen_heap():  # the collector leaves the imported modules and graph alone (gc_freeze.py)
        _phase(options, "graph passes")
        run_passes(front)
        if options.precision != "float":
            _phase(options, "quantization")
        quantize(front)
    return front


def run_passes(front: Front) -> None:
    """Stages 2-3: the optimization level's passes, then the NPU/CPU partition (in place)."""
    element_bytes = 2 if front.options.precision == "fp16" else 1  # fp16 CBUF tiling sizes its parts
    context = PassContext(front.platform, front.options.optimization_level, element_bytes=element_bytes,
                          prune=front.options.prune)
    front.pass_log, front.partition = optimize(front.graph, context)


def quantize(front: Front) -> None:
    """Stage 4: annotate the graph with the build's precision (in place)."""
    options, graph = front.options, front.graph
    _check_calibration_options(options)
    qdq = take_qdq_params(graph)  # a pre-quantized model's own parameters (guide 6.4)
    if qdq and options.precision == "int8":
        front.quantization = _prequantized(graph, options, qdq)
    elif options.precision == "hybrid":
        config = read_config(options.quant_config, graph)
        front.preprocess = {name: value.to_plain() for name, value in config.preprocess.items()}
        front.quantization = quantize_from_config(graph, config)
    elif options.precision == "fp16":
        front.quantization = _float16(graph, options)
    elif options.precision == "int8":
        front.quantization = _int8(front)
    if front.platform.sparse.enabled and front.quantization is not None:
        sparse_weights.symmetric_weights(graph, front.platform)  # pruned weights stay 0 (LOWERING.md 23)


def _in_memory(dataset) -> bool:
    return dataset is not None and not isinstance(dataset, (str, Path))


def _check_calibration_options(options: CompileOptions) -> None:
    """Calibration options given to a build that does not calibrate are a mistake, not ignored."""
    if not options.calibration_given or options.precision == "int8":
        return
    if options.precision == "hybrid":
        raise ConfigError("--quant-config already holds the ranges, preprocessing and weight method: leave out "
                          "--dataset, --algorithm, --mean, --std, --bgr and --per-layer (edit the config instead)")
    if options.precision == "fp16":
        plain = dataclasses.replace(options, dataset=None)
        if not (_in_memory(options.dataset) and not plain.calibration_given):  # samples ranging untyped tensors
            raise ConfigError("--fp16 does not calibrate: leave out --dataset, --algorithm, --mean, --std, --bgr and "
                              "--per-layer")
        return
    raise ConfigError("--algorithm, --mean, --std, --bgr and --per-layer apply to calibration: add --quantize "
                      "--dataset ds.txt")


def _prequantized(graph: Graph, options: CompileOptions, params):
    """int8 with a QDQ model's own scales and zero points: no calibration, so no dataset."""
    if options.calibration_given:
        raise ConfigError("the model is pre-quantized (QuantizeLinear/DequantizeLinear nodes): its own scales and "
                          "zero points are used; leave out --dataset, --algorithm, --mean, --std, --bgr and "
                          "--per-layer")
    return quantize_prequantized(graph, params)


def _float16(graph: Graph, options: CompileOptions):
    """float16 throughout; samples given in memory still range the tensors no layer types (a
    graph input only a Shape reads)."""
    if options.dataset is None:
        return float16_graph(graph)
    ranges = calibrate(graph, options.dataset, options.algorithm, progress=options.progress).ranges
    return quantize_graph(graph, ranges, default_dtype="float16")


def _int8(front: Front):
    """int8, calibrated on a dataset file (with its preprocessing) or on samples in memory."""
    options, graph = front.options, front.graph
    calibration = CalibrationOptions(options.algorithm, options.per_channel, progress=options.progress)
    if options.dataset is None:
        raise ConfigError("--quantize needs a calibration dataset: --dataset ds.txt")
    if _in_memory(options.dataset):
        if options.mean or options.std or options.bgr:
            raise ConfigError("samples given in memory are used as they are: leave out mean, std and bgr")
        if options.auto_hybrid is not None:
            return _auto_hybrid(front, options.dataset, calibration)
        ranges = calibrate(graph, options.dataset, options.algorithm, progress=options.progress).ranges
        return quantize_graph(graph, ranges, per_channel=options.per_channel,
                              weight_clipping=calibration.weight_clipping)
    preprocess = preprocess_for_inputs(graph, options.mean, options.std, options.bgr)
    front.preprocess = {name: value.to_plain() for name, value in preprocess.items()}
    if options.auto_hybrid is not None:
        samples = CalibrationSamples(read_dataset(options.dataset, list(graph.inputs)), graph, preprocess)
        result = _auto_hybrid(front, samples, calibration)
        result.preprocess = dict(preprocess)
        return result
    return quantize_with_dataset(graph, options.dataset, preprocess, calibration)


def _auto_hybrid(front: Front, samples, calibration: CalibrationOptions):
    """int8 with its most harmful layers in float16 (quant/auto_hybrid.py); the choice is kept
    on the Front for the compile summary."""
    result, front.auto_hybrid = calibrate_auto_hybrid(front.graph, samples, calibration, front.options.auto_hybrid,
                                                      front.platform)
    return result


def build(front: Front) -> ModelFile:
    """Stages 5-9 (build.build_model): layer records, memory plan, lowering, scheduling, packaging."""
    if front.quantization is None:
        raise CompileError("a model file needs a quantized graph: add --quantize --dataset ds.txt, --fp16 or "
                           "--quant-config")
    _phase(front.options, "lowering")
    if front.options.dynamic_input:  # one static build per shape set, merged (compiler/dynamic_shapes.py)
        front.model = dynamic_shapes.build_dynamic(front, front.source, front.options.dynamic_input, run_passes,
                                                   _build_graph)
        return front.model
    front.model = _build_graph(front.graph, front.platform, front.options, front.preprocess)
    return front.model


def target_platform(target: str | Platform, overrides: Mapping[str, Any] | Sequence[str] = ()) -> Platform:
    """The platform of a build: a name, alias, YAML path or Platform, with the overrides applied
    (validated as ``npuemu platforms --set`` validates them)."""
    overrides = override_map(overrides)
    if isinstance(target, Platform):
        return apply_overrides(target, overrides) if overrides else target
    return load_platform(target, overrides)


def overrides_record(platform: Platform, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overridden figures as the platform holds them (parsed and typed), by key."""
    return {key: to_plain(platform.get(key)) for key in override_map(overrides)}


def build_graph(graph: Graph, target: str | Platform = "rk3588", options: CompileOptions | None = None,
                preprocess: Mapping[str, Any] | None = None) -> ModelFile:
    """Stages 5-9 on a graph already fused and quantized (by :func:`prepare` or by hand)."""
    options = options or CompileOptions()
    platform = target_platform(target, options.platform_overrides)
    _phase(options, "lowering")
    return _build_graph(graph, platform, options, preprocess)


def _build_graph(graph: Graph, platform: Platform, options: CompileOptions,
                 preprocess: Mapping[str, Any] | None) -> ModelFile:
    """Stages 5-9 for a platform that already carries ``options.platform_overrides``."""
    cores = parse_core_mask(options.core_mask, platform.cores.count, platform.name)
    if options.sparse and not platform.sparse.enabled:  # build_graph callers: prepare did not set it
        platform, _ = sparse_weights.build_platform(platform, options.precision)
    record = options.record(preprocess)
    overridden = overrides_record(platform, options.platform_overrides)
    if overridden:  # only then: a build without --set stays byte-identical to one before overrides existed
        record["platform_overrides"] = overridden
    with frozen_heap():  # lowering keeps many objects alive: no full walks of the rest (gc_freeze.py)
        model = build_model(graph, platform, name=options.name, options=record, cores=cores,
                            sram=options.sram, batch=options.batch_size, elide_copies=options.elide_copies,
                            pack_inputs=options.pack_inputs)
    if not overridden:
        return model
    # the trailer's platform record names them too (isa/CONTAINER.md: platform.overrides): a model
    # file runs on the platform it was compiled for, `npuemu perf` applies them
    trailer = dict(model.trailer)
    trailer["platform"] = {**trailer.get("platform", {}), "overrides": overridden}
    return dataclasses.replace(model, trailer=trailer)


__all__ = ["PHASES", "PRECISIONS", "TIMING_ONLY_KEYS", "CompileOptions", "Front", "build", "build_graph", "compile_model",
           "compiler_overrides", "override_map", "overrides_record", "prepare", "quantize", "run_passes",
           "target_platform", "timing_only"]
