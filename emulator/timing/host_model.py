"""Host (CPU) time of a CPU step of a compiled model: a documented model, not a measurement.

``time_us = launch.cpu_op_overhead_us + input elements * launch.cpu_op_us_per_element``
(platform YAML; the figures come from the CPU-side rows of calibration.md Table B: the
OutputOperator's 13 us as the fixed part, ReduceMax over 83x60x80 elements for the per-element
cost). Input elements are those of the step's input tensors; the op kind does not enter.
"""

from __future__ import annotations

import math


def cpu_step_us(input_shapes, platform) -> float:
    elements = sum(int(math.prod(shape)) for shape in input_shapes if shape is not None)
    launch = platform.launch
    return launch.cpu_op_overhead_us + elements * launch.cpu_op_us_per_element
