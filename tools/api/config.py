"""``RKNN.config()`` (guide 3.1.2, 3.1.7, 6.2.4, 10.3): the arguments checked and kept.

Every argument of the vendor's ``config()`` is accepted by name. Those npuemu honours are
kept in :class:`ApiConfig`; one npuemu cannot honour yet is refused when given a value other
than its default, with an error naming it (never silently ignored).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from npuemu.isa.container_dynamic import MAX_SHAPE_SETS
from npuemu.isa.errors import ConfigError
from npuemu.platforms import resolve_name

#: quantized_dtype values meaning int8 weights and activations (the guide's default name and
#: toolkit2's short name); the vendor's w8a16/w16a16i/w4a16 have no npuemu build.
INT8_DTYPES = ("asymmetric_quantized-8", "w8a8")
ALGORITHMS = ("normal", "kl_divergence", "mmse")
METHODS = ("channel", "layer")
DEFAULT_PLATFORM = "rk3588"

#: config() arguments npuemu cannot honour yet: name -> (default, why). A value other than the
#: default is refused with this reason.
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "quantized_hybrid_level": (0, "automatic hybrid quantization is not done; use hybrid_quantization_step1/"
                                  "step2 (guide 6.3)"),
    "float_dtype": ("float16", "float layers run in float16 only"),
    "quantize_weight": (False, "weight-only quantization of float builds is not implemented"),
    "remove_weight": (False, "weight-less slave models (guide 10) are not built"),
    "compress_weight": (False, "weight compression is not implemented"),
    "inputs_yuv_fmt": (None, "YUV input conversion is not implemented"),
    "op_target": (None, "per-layer target assignment is not supported; the partition decides NPU or CPU"),
    "remove_reshape": (False, "the remove-reshape option is not implemented"),
    "enable_flash_attention": (False, "flash attention is not implemented"),
}


@dataclass(frozen=True)
class ApiConfig:
    """What ``config()`` set: per-input mean/std lists (None: not given) and the build choices."""

    mean_values: tuple[tuple[float, ...], ...] | None = None
    std_values: tuple[tuple[float, ...], ...] | None = None
    quant_img_RGB2BGR: bool = False
    target_platform: str = DEFAULT_PLATFORM
    platform_given: bool = False
    quantized_algorithm: str = "normal"
    quantized_method: str = "channel"
    optimization_level: int = 3
    custom_string: str | None = None
    single_core_mode: bool = False
    sparse_infer: bool = False  # RK3576 sparse weights (guide 5.11): the driver's --sparse
    # dynamic shapes (guide 5.4): the shape sets, each a list of shapes in input order (driver's dynamic_input)
    dynamic_input: tuple | None = None
    model_pruning: bool = False  # guide 5.8: the driver's --prune (compiler/passes/prune.py)

    def mean_std_texts(self, inputs: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The driver's ``--mean``/``--std`` option texts, one ``NAME=v0,v1,...`` per input."""
        return (_texts(self.mean_values, inputs, "mean_values"), _texts(self.std_values, inputs, "std_values"))


def _texts(values: tuple[tuple[float, ...], ...] | None, inputs: Sequence[str], what: str) -> tuple[str, ...]:
    if values is None:
        return ()
    if len(values) != len(inputs):
        raise ConfigError(f"{what} holds {len(values)} list(s); the model has {len(inputs)} input(s) "
                          f"({', '.join(inputs)}): give one list per input, e.g. [[0, 0, 0]]")
    return tuple(f"{name}={','.join(repr(float(v)) for v in per_input)}" for name, per_input in zip(inputs, values))


def per_input_values(values: Any, what: str) -> tuple[tuple[float, ...], ...] | None:
    """``[[a, b, c], [d]]`` (one list per input) or ``[a, b, c]`` (the guide's single-input
    form, section 5.4) -> a tuple of per-input tuples."""
    if values is None:
        return None
    try:
        items = list(values)
        if items and all(_is_number(item) for item in items):
            return (tuple(float(v) for v in items),)
        lists = tuple(tuple(float(v) for v in item) for item in items)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} {values!r}: expected one list of numbers per input, e.g. [[123.7, 116.3, "
                          "103.5]]") from None
    if not lists or any(not item for item in lists):
        raise ConfigError(f"{what} {values!r}: expected one non-empty list of numbers per input")
    return lists


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_unsupported(given: dict[str, Any]) -> None:
    """Refuse, by name, the first argument npuemu cannot honour that differs from its default."""
    for name, value in given.items():
        default, why = UNSUPPORTED[name]
        if value != default:
            raise ConfigError(f"{name}={value!r} is not supported by npuemu: {why}")


def make_config(mean_values: Any, std_values: Any, quant_img_RGB2BGR: bool, target_platform: str | None,
                quantized_dtype: str, quantized_algorithm: str, quantized_method: str,
                optimization_level: int, custom_string: str | None, single_core_mode: bool,
                sparse_infer: bool = False, dynamic_input: Any = None, model_pruning: bool = False) -> ApiConfig:
    """Check the honoured arguments (guide 3.1.2) and return them as an :class:`ApiConfig`."""
    if quantized_dtype not in INT8_DTYPES:
        raise ConfigError(f"quantized_dtype={quantized_dtype!r} is not supported by npuemu: only int8 "
                          f"(w8a8, {INT8_DTYPES[0]!r}) builds are made")
    if quantized_algorithm not in ALGORITHMS:
        raise ConfigError(f"quantized_algorithm={quantized_algorithm!r}: expected one of {', '.join(ALGORITHMS)}")
    if quantized_method not in METHODS:
        raise ConfigError(f"quantized_method={quantized_method!r}: expected one of {', '.join(METHODS)}")
    if optimization_level not in (0, 1, 2, 3) or isinstance(optimization_level, bool):
        raise ConfigError(f"optimization_level={optimization_level!r}: expected 0, 1, 2 or 3")
    if custom_string is not None and not isinstance(custom_string, str):
        raise ConfigError(f"custom_string={custom_string!r}: expected a string")
    platform = resolve_name(str(target_platform)) if target_platform is not None else DEFAULT_PLATFORM
    return ApiConfig(per_input_values(mean_values, "mean_values"), per_input_values(std_values, "std_values"),
                     bool(quant_img_RGB2BGR), platform, target_platform is not None, quantized_algorithm,
                     quantized_method, int(optimization_level), custom_string, bool(single_core_mode),
                     bool(sparse_infer), _shape_sets(dynamic_input), bool(model_pruning))


def _shape_sets(value: Any) -> tuple | None:
    """dynamic_input (guide 5.4): a list of shape sets, each a list of shapes (one per input, in
    input order); the counts are checked against the model by the build (compiler/dynamic_shapes.py)."""
    if value is None:
        return None
    try:
        sets = tuple(tuple(tuple(int(d) for d in shape) for shape in entry) for entry in value)
    except (TypeError, ValueError):
        raise ConfigError("dynamic_input: expected a list of shape sets, each a list of shapes (one per input), "
                          "e.g. [[[1,3,224,224]], [[1,3,160,160]]]") from None
    if not 2 <= len(sets) <= MAX_SHAPE_SETS:  # as compiler/dynamic_shapes.py
        raise ConfigError(f"dynamic_input: {len(sets)} shape set(s); a dynamic-shape model has 2 to {MAX_SHAPE_SETS} (one shape "
                          "set is a static build: give it with load_onnx's input_size_list)")
    if any(not entry or any(not shape or min(shape) < 1 for shape in entry) for entry in sets):
        raise ConfigError("dynamic_input: every set needs one shape per input, of positive dimensions")
    return sets


#: init_runtime core_mask values, as RKNN.NPU_CORE_* (guide table 5-8) -> npuemu's --core-mask
CORE_MASKS = {0: "auto", 1: "0", 2: "1", 4: "2", 3: "0_1", 7: "0_1_2", 0xFFFF: "all"}


def core_mask_text(core_mask: Any) -> str:
    """RKNN.NPU_CORE_* (or npuemu's text form) -> the driver's core-mask text."""
    if isinstance(core_mask, str) and core_mask in CORE_MASKS.values():
        return core_mask
    if isinstance(core_mask, int) and core_mask in CORE_MASKS:
        return CORE_MASKS[core_mask]
    raise ConfigError(f"core_mask={core_mask!r}: expected RKNN.NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_1, NPU_CORE_2, "
                      "NPU_CORE_0_1, NPU_CORE_0_1_2 or NPU_CORE_ALL")
