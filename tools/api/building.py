"""``load_onnx``, ``build``, ``hybrid_quantization_step1/2`` and ``export_rknn`` (guide 3.1.3-3.1.5,
6.3) on npuemu's compiler driver (``compiler/driver.py``: prepare, quantize, build).

``build(do_quantization=True)`` is the int8 build calibrated on the dataset, ``False`` the
float16 build (guide 8: the vendor's unquantized model is FP16). The config's mean/std go into
the build: for int8 as calibration preprocessing (recorded in the model file), for float16
recorded the same way; ``inference`` applies them from the model file, as the vendor's model
carries them.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuemu.compiler.driver import CompileOptions, Front, build, prepare, quantize
from npuemu.isa.errors import CompileError, ConfigError, InputError, ModelFileError

from .config import ApiConfig
from .inputs import nchw_dataset


@dataclass
class Source:
    """The ONNX model ``load_onnx`` loaded: the (possibly cut) ModelProto, its name, and the
    input shapes ``input_size_list`` fixed."""

    model: Any
    name: str
    input_shapes: dict[str, list[int]] = field(default_factory=dict)


def load_source(path: str | Path, inputs: list[str] | None, input_size_list: list | None,
                outputs: list[str] | None, input_initial_val: list | None = None) -> Source:
    """load_onnx (guide 3.1.3): read the model; ``inputs``/``outputs`` naming other tensors
    than the model's own cut it there (onnx.utils.Extractor); ``input_size_list`` fixes shapes;
    ``input_initial_val`` (one value or None per input) fixes inputs to constants (compile
    --freeze: what depends on them folds)."""
    from npuemu.compiler.onnx_import import onnx_input_names

    path = Path(path)
    model = _read_onnx(path, "no such ONNX model file", "not a readable ONNX model")
    own_inputs = onnx_input_names(model)
    own_outputs = [value.name for value in model.graph.output]
    wanted_inputs = list(inputs) if inputs is not None else own_inputs
    wanted_outputs = list(outputs) if outputs is not None else own_outputs
    if wanted_inputs != own_inputs or wanted_outputs != own_outputs:
        model = _cut(model, wanted_inputs, wanted_outputs, path)
    shapes = _sizes(input_size_list, wanted_inputs)
    frozen = _initial_values(input_initial_val, wanted_inputs)
    if frozen:
        from npuemu.compiler.passes.surgery import freeze_inputs

        freeze_inputs(model, frozen, str(path))
    return Source(model, path.stem, {name: shape for name, shape in shapes.items() if name not in frozen})


def _initial_values(values: list | None, inputs: list[str]) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, (list, tuple)) or len(values) != len(inputs):
        raise ConfigError(f"input_initial_val: expected a list of one value (or None) per input ({', '.join(inputs)})")
    return {name: value for name, value in zip(inputs, values) if value is not None}


def _read_onnx(path: Path, missing: str, unreadable: str) -> Any:
    """The ONNX model at ``path``; ``missing`` / ``unreadable`` say what the file should have been."""
    import onnx

    if not path.is_file():
        raise InputError(f"{path}: {missing}")
    try:
        return onnx.load(str(path))
    except Exception as error:  # noqa: BLE001 - protobuf raises several kinds for a damaged file
        raise ModelFileError(f"{path}: {unreadable}: {error}") from None


def _cut(model: Any, inputs: list[str], outputs: list[str], path: Path) -> Any:
    import onnx
    from onnx.utils import Extractor

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        return Extractor(inferred).extract_model(inputs, outputs)
    except Exception as error:  # noqa: BLE001 - onnx reports a bad cut as various errors
        raise CompileError(f"{path}: cannot cut the model at inputs {inputs} / outputs {outputs}: {error}") from None


def _sizes(input_size_list: list | None, inputs: list[str]) -> dict[str, list[int]]:
    if input_size_list is None:
        return {}
    sizes = list(input_size_list)
    if len(sizes) != len(inputs):
        raise ConfigError(f"input_size_list holds {len(sizes)} shape(s); the model has {len(inputs)} input(s) "
                          f"({', '.join(inputs)})")
    try:
        return {name: [int(v) for v in shape] for name, shape in zip(inputs, sizes)}
    except (TypeError, ValueError):
        raise ConfigError(f"input_size_list {input_size_list!r}: expected one list of integers per input") from None


def _base_options(source: Source, config: ApiConfig, precision: str, batch_size: int = 1) -> CompileOptions:
    per_channel = config.quantized_method == "channel"
    return CompileOptions(precision=precision, input_shapes=source.input_shapes, name=source.name,
                          optimization_level=config.optimization_level, batch_size=batch_size,
                          sparse=config.sparse_infer, dynamic_input=config.dynamic_input or (),
                          prune=config.model_pruning,
                          algorithm=config.quantized_algorithm if precision == "int8" else "normal",
                          per_channel=per_channel if precision == "int8" else True)


def input_shapes(front: Front) -> dict[str, list[int]]:
    return {name: list(front.graph.tensors[name].shape) for name in front.graph.inputs}


def build_front(source: Source, config: ApiConfig, do_quantization: bool, dataset: str | None,
                batch_size: int) -> Front:
    """build() up to the quantized graph (the driver's prepare + quantize)."""
    if not do_quantization:
        return _float16_front(source, config, batch_size)
    if dataset is None:
        raise ConfigError("do_quantization=True needs a calibration dataset: build(do_quantization=True, "
                          "dataset='./dataset.txt')")
    front = prepare(source.model, config.target_platform, _base_options(source, config, "float", batch_size))
    means, stds = config.mean_std_texts(list(front.graph.inputs))
    with tempfile.TemporaryDirectory(prefix="npuemu-api-") as folder:  # NHWC .npy samples, transposed
        samples = nchw_dataset(dataset, input_shapes(front), Path(folder))
        front.options = dataclasses.replace(_base_options(source, config, "int8", batch_size), dataset=samples,
                                            mean=means, std=stds, bgr=config.quant_img_RGB2BGR)
        quantize(front)  # reads the samples: inside the with
    front.options = dataclasses.replace(front.options, dataset=str(dataset))
    return front


def _float16_front(source: Source, config: ApiConfig, batch_size: int) -> Front:
    """The vendor's unquantized build is float16; its mean/std are recorded in the model file
    (the driver's fp16 build takes none, so they are set on the Front here)."""
    from npuemu.compiler.quant import preprocess_for_inputs

    front = prepare(source.model, config.target_platform, _base_options(source, config, "fp16", batch_size))
    means, stds = config.mean_std_texts(list(front.graph.inputs))
    preprocess = preprocess_for_inputs(front.graph, means, stds)
    front.preprocess = {name: value.to_plain() for name, value in preprocess.items() if not value.is_identity}
    return front


def build_model_file(front: Front, config: ApiConfig, core_mask: str = "auto") -> Any:
    """The driver's build (stages 5-9) with ``core_mask``; custom_string goes into the file's
    free-form ``extra`` record (isa/CONTAINER.md), as the vendor stores it in the .rknn."""
    from npuemu.isa.container import ModelFile

    if front.options.core_mask != core_mask:
        front.options = dataclasses.replace(front.options, core_mask=core_mask)
    model = build(front)
    if config.custom_string is None:
        return model
    extra = {**model.trailer.get("extra", {}), "custom_string": config.custom_string}
    return ModelFile(model.sections, {**model.trailer, "extra": extra})


# --- hybrid quantization (guide 6.3) ---------------------------------------------------------

DATA_FORMAT = "npuemu hybrid quantization data 1"


def hybrid_step1(source: Source, config: ApiConfig, dataset: str | None, batch_size: int,
                 folder: Path, proposal_samples: int | None = None) -> list[Path]:
    """Calibrate and write ``{name}.model`` (the ONNX model as loaded), ``{name}.data`` (the
    build settings, JSON) and ``{name}.quantization.cfg`` (npuemu's per-layer config,
    compiler/quant/config.py) in ``folder``, as the vendor's step 1 writes its three files."""
    from npuemu.compiler.quant import CalibrationOptions, config_with_dataset, preprocess_for_inputs, write_config

    if dataset is None:
        raise ConfigError("hybrid_quantization_step1 calibrates the model: give dataset='./dataset.txt'")
    front = prepare(source.model, config.target_platform, _base_options(source, config, "float", batch_size))
    means, stds = config.mean_std_texts(list(front.graph.inputs))
    preprocess = preprocess_for_inputs(front.graph, means, stds, config.quant_img_RGB2BGR)
    options = CalibrationOptions(config.quantized_algorithm, config.quantized_method == "channel")
    with tempfile.TemporaryDirectory(prefix="npuemu-api-") as work:
        samples = nchw_dataset(dataset, input_shapes(front), Path(work))
        if proposal_samples is not None:  # proposal=True: the auto-hybrid choice as the config's dtypes
            quant_config = _proposal(front, samples, preprocess, options, proposal_samples, f"{source.name}.model")
        else:
            quant_config = config_with_dataset(front.graph, samples, preprocess, options,
                                               model=f"{source.name}.model", target=front.platform.name)
    paths = [folder / f"{source.name}.{suffix}" for suffix in ("model", "data", "quantization.cfg")]
    paths[0].write_bytes(source.model.SerializeToString())
    data = {"format": DATA_FORMAT, "name": source.name, "target_platform": front.platform.name,
            "input_shapes": source.input_shapes, "optimization_level": config.optimization_level,
            "batch_size": batch_size, "custom_string": config.custom_string}
    paths[1].write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    write_config(quant_config, front.graph, paths[2])
    return paths


def _proposal(front: Front, dataset: Path, preprocess, options, count: int, model: str):
    """The config with the float16 layers ``--auto-hybrid`` would choose (compiler/quant/
    auto_hybrid.py, default target), checked on the dataset's first ``count`` samples."""
    from npuemu.compiler.quant import CalibrationSamples, read_dataset
    from npuemu.compiler.quant.auto_hybrid import proposed_config

    samples = CalibrationSamples(read_dataset(dataset, list(front.graph.inputs)), front.graph, preprocess)
    config, _ = proposed_config(front.graph, samples, options, preprocess, check_samples=count, model=model,
                                chip=front.platform.name, platform=front.platform)
    return config


def hybrid_step2(model_input: str | Path, data_input: str | Path, cfg: str | Path) -> tuple[Source, Front, dict]:
    """Build from the three files of step 1 (the edited config's layer dtypes and ranges)."""
    data = _read_data(Path(data_input))
    for path in (Path(model_input), Path(cfg)):
        if not path.is_file():
            raise InputError(f"{path}: no such file")
    model = _read_onnx(Path(model_input), "no such file", "not the .model file of hybrid_quantization_step1")
    source = Source(model, str(data["name"]), {k: list(v) for k, v in (data.get("input_shapes") or {}).items()})
    options = CompileOptions(precision="hybrid", quant_config=str(cfg), input_shapes=source.input_shapes,
                             optimization_level=int(data["optimization_level"]), name=source.name,
                             batch_size=int(data.get("batch_size") or 1))
    return source, prepare(model, data["target_platform"], options), data


def _read_data(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not the .data file of npuemu's hybrid_quantization_step1: {error}") from None
    if not isinstance(data, dict) or data.get("format") != DATA_FORMAT:
        raise InputError(f"{path}: not the .data file of npuemu's hybrid_quantization_step1 (a vendor .data file "
                         "holds the vendor's own build and cannot be read)")
    return data
