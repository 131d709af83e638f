"""Chip descriptions: one YAML file per chip, loaded into frozen, validated objects.

    from npuemu.platforms import load_platform
    p = load_platform("rk3566", overrides=["clock.npu_mhz=800"])   # alias of rk3568
    p.macs_per_cycle("int8"), p.c2("fp16"), p.cbuf.banks, p.source_of("cbuf.banks")

Modules: ``model.py`` (the Platform), ``groups.py`` (its groups of figures, with ranges),
``dtypes.py``, ``spec.py`` (field constraints), ``schema.py`` (validation), ``loader.py``
(files, aliases, overrides). Nothing else in npuemu hard-codes a chip figure.
"""

from .loader import (
    MAX_YAML_BYTES,
    aliases,
    apply_overrides,
    list_platforms,
    load_platform,
    platform_from_dict,
    resolve_name,
)
from .dtypes import COMPUTE_DTYPES, MATMUL_DTYPES, STORAGE_DTYPES, UnsupportedDtypeError, normalize_dtype
from .groups import AlignmentRow, MatmulLayout, MatmulLimits
from .model import Platform
from .schema import Leaf, iter_leaves

__all__ = [
    "COMPUTE_DTYPES", "MATMUL_DTYPES", "MAX_YAML_BYTES", "STORAGE_DTYPES", "AlignmentRow", "Leaf",
    "MatmulLayout", "MatmulLimits", "Platform", "UnsupportedDtypeError", "aliases", "apply_overrides",
    "iter_leaves", "list_platforms", "load_platform", "normalize_dtype", "platform_from_dict",
    "resolve_name",
]
