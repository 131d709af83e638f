"""The frozen Platform: one chip's figures (what a ``platforms/*.yaml`` file holds).

A key path such as ``ddr.read_bytes_per_cycle`` names both a YAML entry and
``platform.ddr.read_bytes_per_cycle``. Per-dtype tables list every dtype: ``None`` (YAML
``null``) means the chip has no such path, and the convenience lookups raise
:class:`UnsupportedDtypeError` for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from npuemu.isa.errors import ConfigError

from .dtypes import COMPUTE_DTYPES, UnsupportedDtypeError, normalize_dtype
from .groups import (
    AlignmentRow,
    Cbuf,
    ChannelAlignment,
    Clock,
    Cores,
    CycleModel,
    Ddr,
    Fusion,
    Group,
    Launch,
    Macs,
    Matmul,
    Nc1hwc2,
    Pc,
    RegisterMap,
    Sparse,
    Sram,
    VendorEstimate,
)
from .spec import figure

def _dtype_row(table: Any, dtype: str, what: str, chip: str) -> Any:
    name = normalize_dtype(dtype)
    value = getattr(table, name, None)
    if value is None:
        raise UnsupportedDtypeError(f"{chip} has no {name} {what} (platform YAML lists it as null)")
    return value


@dataclass(frozen=True, kw_only=True)
class Platform(Group):
    """One chip. Convenience lookups raise :class:`UnsupportedDtypeError` for null dtypes."""

    name: str = figure(pattern=r"[a-z0-9][a-z0-9_.-]*", hint="lower-case letters, digits, '_', '-', '.'")
    aliases: tuple[str, ...] = figure(pattern=r"[a-z0-9][a-z0-9_.-]*", hint="lower-case names")
    description: str
    register_map: RegisterMap
    cores: Cores
    clock: Clock
    macs: Macs
    nc1hwc2: Nc1hwc2
    channel_alignment: ChannelAlignment
    cbuf: Cbuf
    sram: Sram
    ddr: Ddr
    vendor_estimate: VendorEstimate
    launch: Launch
    cycle_model: CycleModel
    matmul: Matmul
    fusion: Fusion
    sparse: Sparse
    pc: Pc

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.name in self.aliases:
            yield "aliases", f"expected names other than the platform's own name {self.name!r}"
        if self.cores.parallel_batch_contexts > self.cores.count:
            yield "cores.parallel_batch_contexts", (f"expected at most cores.count ({self.cores.count}), "
                                                    f"got {self.cores.parallel_batch_contexts}")
        for dtype in COMPUTE_DTYPES:
            if getattr(self.macs, dtype) is not None and getattr(self.nc1hwc2, dtype) is None:
                yield f"nc1hwc2.{dtype}", f"expected a C2: macs.{dtype} says the chip computes in {dtype}"

    # ---- convenience lookups -------------------------------------------------------------
    def macs_per_cycle(self, dtype: str) -> int:
        """MACs per cycle per core."""
        return _dtype_row(self.macs, dtype, "MAC path", self.name)

    def c2(self, dtype: str) -> int:
        """Channels per pixel atom of the NC1HWC2 layout."""
        return _dtype_row(self.nc1hwc2, dtype, "native layout (C2)", self.name)

    def alignment(self, dtype: str) -> AlignmentRow:
        """Efficient channel alignments (hardware.md §3)."""
        return _dtype_row(self.channel_alignment, dtype, "channel alignment row", self.name)

    def supports(self, dtype: str) -> bool:
        """True if the MAC array computes in ``dtype``."""
        name = normalize_dtype(dtype)
        return name in COMPUTE_DTYPES and getattr(self.macs, name) is not None

    def atom_k(self, dtype: str) -> int:
        """Conv kernels per pass of cycle model H1: ATOM_K for int8, scaled by the dtype's MAC rate.

        vendor-corpus README §4.1 shows it halved for fp16, matching fp16's halved MAC rate;
        the same scaling for the other dtypes is our inference.
        """
        return max(1, self.cycle_model.atom_k_int8 * self.macs_per_cycle(dtype) // self.macs.int8)

    def peak_tops(self, dtype: str = "int8") -> float:
        """Peak tera-operations per second (2 ops per MAC, all cores, nominal clock)."""
        return self.cores.count * self.macs_per_cycle(dtype) * 2 * self.clock.npu_mhz * 1e6 / 1e12

    def get(self, path: str) -> Any:
        """The value at a dotted key path, e.g. ``get('ddr.read_bytes_per_cycle')``; '' is the platform."""
        value: Any = self
        for value in self._walk(path):  # noqa: B007 - the last value is the answer
            pass
        return value

    def source_of(self, path: str = "") -> str:
        """The source of the figure at ``path``: that of the innermost group holding it."""
        groups = [value for value in self._walk(path) if isinstance(value, Group)]
        return groups[-1].source if groups else self.source

    def _walk(self, path: str) -> Iterator[Any]:
        """Each value along a key path (an empty path yields nothing)."""
        value: Any = self
        for part in path.split(".") if path else ():
            if not dataclasses.is_dataclass(value) or part not in {f.name for f in dataclasses.fields(value)}:
                raise ConfigError(f"{self.name}: unknown key path {path!r} (no key {part!r})")
            value = getattr(value, part)
            yield value

    def to_dict(self) -> dict[str, Any]:
        """Plain nested data in YAML order; loading it back gives an equal Platform."""
        data = to_plain(self)
        head = {key: data.pop(key) for key in ("name", "aliases", "description")}
        return {**head, **data}


def to_plain(value: Any) -> Any:
    """Dataclasses -> dicts (empty notes left out), tuples -> lists: the YAML shape."""
    if dataclasses.is_dataclass(value):
        out = {}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if field.name == "note" and item == "":
                continue
            out[field.name] = to_plain(item)
        return out
    if isinstance(value, tuple):
        return [to_plain(item) for item in value]
    return value
