"""The quantization steps the command line runs, each one call: calibrate from a dataset file,
build from a quant config, or write a quant config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..ir import Graph
from .calibrate import CalibrationResult, calibrate
from .calibrate_workers import default_workers
from .config import QuantConfig, config_from_ranges
from .dataset import CalibrationSamples, read_dataset
from .preprocess import InputPreprocess, identity_preprocess
from .quantize import QuantizationResult, quantize_graph


@dataclass(frozen=True)
class CalibrationOptions:
    algorithm: str = "normal"
    per_channel: bool = True
    progress: bool = True
    #: calibration processes (calibrate_workers.py; the same ranges bit for bit with any count);
    #: None: NPUEMU_CALIBRATION_WORKERS, else the usable cores (at most 4)
    workers: int | None = None

    @property
    def weight_clipping(self) -> str:
        """mmse also clips the weights by squared error (clipping.py); the others use min/max."""
        return "mmse" if self.algorithm == "mmse" else "minmax"


def calibrate_dataset(graph: Graph, dataset: Path | str, preprocess: Mapping[str, InputPreprocess] | None,
                      options: CalibrationOptions) -> CalibrationResult:
    """Read the dataset file and calibrate ``graph`` (float, after the passes) on it."""
    samples = CalibrationSamples(read_dataset(dataset, list(graph.inputs)), graph, preprocess)
    workers = options.workers if options.workers is not None else default_workers()
    return calibrate(graph, samples, options.algorithm, progress=options.progress, workers=workers)


def quantize_with_dataset(graph: Graph, dataset: Path | str, preprocess: Mapping[str, InputPreprocess] | None = None,
                          options: CalibrationOptions = CalibrationOptions()) -> QuantizationResult:
    """The int8 build: calibrate, then quantize every layer to int8."""
    calibration = calibrate_dataset(graph, dataset, preprocess, options)
    result = quantize_graph(graph, calibration.ranges, per_channel=options.per_channel,
                            weight_clipping=options.weight_clipping)
    result.algorithm = calibration.algorithm
    result.observed = calibration.observed
    result.preprocess = dict(preprocess or identity_preprocess(graph))
    return result


def config_with_dataset(graph: Graph, dataset: Path | str, preprocess: Mapping[str, InputPreprocess] | None = None,
                        options: CalibrationOptions = CalibrationOptions(), *, model: str = "",
                        target: str = "") -> QuantConfig:
    """Hybrid step 1: calibrate and return the all-int8 config to write and edit."""
    calibration = calibrate_dataset(graph, dataset, preprocess, options)
    return config_from_ranges(graph, calibration.ranges, preprocess=preprocess or identity_preprocess(graph),
                              per_channel=options.per_channel, weight_clipping=options.weight_clipping,
                              algorithm=calibration.algorithm, model=model, target=target)


def quantize_from_config(graph: Graph, config: QuantConfig) -> QuantizationResult:
    """Hybrid step 2: quantize with the config's layer dtypes and ranges."""
    result = quantize_graph(graph, config.tensor_ranges(), layer_dtypes=config.layer_dtypes,
                            per_channel=config.per_channel, weight_clipping=config.weight_clipping)
    result.algorithm = config.algorithm
    result.preprocess = {name: config.preprocess.get(name, InputPreprocess()) for name in graph.inputs}
    return result
