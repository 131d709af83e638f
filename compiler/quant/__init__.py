"""Quantization: calibration datasets, range selection, int8 / float16 / hybrid annotation of
the fused IR, fake-quant evaluation and the per-layer quantization config (QUANTIZATION.md).

Modules, in pipeline order: ``dataset`` / ``images`` / ``preprocess`` (samples), ``observers``
/ ``clipping`` / ``calibrate`` (ranges), ``roles`` / ``sharing`` / ``quantize`` /
``convert_op`` (the IR annotation), ``fake_quant`` / ``accuracy`` (evaluation), ``config``
(hybrid YAML), ``pipeline`` (what the command line calls); ``affine`` holds the arithmetic,
``synthetic`` test images, ``progress`` the terminal progress bar.
"""

from .accuracy import LayerAccuracy, cosine, layer_accuracy, output_cosines
from .affine import Range, affine_params, dequantize, fake_quantize, quantize
from .calibrate import CalibrationResult, calibrate
from .clipping import ALGORITHMS
from .config import QuantConfig, config_from_ranges, dump_config, read_config, write_config
from .dataset import CalibrationSamples, Dataset, read_dataset
from .fake_quant import fake_quant_evaluate, storage_hook
from .pipeline import (CalibrationOptions, calibrate_dataset, config_with_dataset, quantize_from_config,
                       quantize_with_dataset)
from .preprocess import InputPreprocess, preprocess_for_inputs
from .quantize import QuantizationResult, float16_graph, layer_dtype, quantize_graph, stored_values

__all__ = [
    "ALGORITHMS", "CalibrationOptions", "CalibrationResult", "CalibrationSamples", "Dataset", "InputPreprocess",
    "LayerAccuracy", "QuantConfig", "QuantizationResult", "Range", "affine_params", "calibrate", "calibrate_dataset",
    "config_from_ranges", "config_with_dataset", "cosine", "dequantize", "dump_config", "fake_quant_evaluate",
    "fake_quantize", "float16_graph", "layer_accuracy", "layer_dtype", "output_cosines", "preprocess_for_inputs",
    "quantize", "quantize_from_config", "quantize_graph", "quantize_with_dataset", "read_config", "read_dataset",
    "storage_hook", "stored_values", "write_config",
]
