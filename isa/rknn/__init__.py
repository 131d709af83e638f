"""Vendor ``.rknn`` models (rknn-toolkit2, format 6): a validating reader, the vendor memory
plan, relocation of the register-command stream, and the ``inspect`` summary.

``load_rknn`` -> :class:`RknnModel`; ``plan_memory`` / ``relocate`` -> a runnable program for
chosen base addresses; ``describe_rknn`` / ``format_rknn`` -> what ``npuemu inspect`` shows.
"""

from npuemu.isa.rknn.describe import describe_rknn, format_rknn
from npuemu.isa.rknn.loader import load_rknn
from npuemu.isa.rknn.model import (
    Chain, InputNormalization, Region, RegionSizes, RelocationEntry, RknnContainer, RknnLayer, RknnModel,
    RknnProgram, RknnTensor, TaskRecord, TaskTail, TensorKind,
)
from npuemu.isa.rknn.relocate import (
    Bases, MemoryPlan, Placement, RelocatedProgram, default_bases, plan_memory, region_image, relocate,
    tensor_addresses,
)

__all__ = [
    "Bases", "Chain", "InputNormalization", "MemoryPlan", "Placement", "Region", "RegionSizes", "RelocatedProgram",
    "RelocationEntry", "RknnContainer", "RknnLayer", "RknnModel", "RknnProgram", "RknnTensor", "TaskRecord",
    "TaskTail", "TensorKind", "default_bases", "describe_rknn", "format_rknn", "load_rknn", "plan_memory",
    "region_image", "relocate", "tensor_addresses",
]
