"""The groups of figures a platform YAML holds, one frozen dataclass each.

Every group carries ``source`` (where its figures come from) and an optional ``note``; YAML
keys are exactly the attribute names. Ranges sit on the fields (``figure(...)``); rules that
tie several figures of a group together are in its ``problems()``, which the validator calls
after building the object.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .dtypes import COMPUTE_DTYPES, MATMUL_DTYPES, STORAGE_DTYPES, normalize_dtype
from .spec import figure

REGISTER_MAP_FAMILIES = ("rk3588", "rk3576", "rk356x")
SPARSE_MODES = ("in_4_2", "out_4_2", "in_out_16_4", "out_in_16_4")
SRAM_KINDS = ("none", "system", "nbuf")

_OP_NAME = r"[A-Z][A-Za-z0-9]*"
_OP_HINT = "an operator name such as 'Conv'"
_MATMUL_TYPE = r"(int4|int8|fp16)x(int4|int8|fp16)->(int8|int16|int32|fp16|fp32)"


@dataclass(frozen=True, kw_only=True)
class Group:
    """A set of figures that share one source."""

    source: str = figure(pattern=r"(?s).*\S.*", hint="a non-empty citation")
    note: str = figure(default="")

    def problems(self) -> Iterator[tuple[str, str]]:
        """(key path relative to this group, message) for figures that contradict each other."""
        return iter(())


@dataclass(frozen=True, kw_only=True)
class RegisterMap(Group):
    family: str = figure(choices=REGISTER_MAP_FAMILIES)


@dataclass(frozen=True, kw_only=True)
class Cores(Group):
    count: int = figure(minimum=1, maximum=16)
    parallel_batch_contexts: int = figure(minimum=1, maximum=16)
    split_ops: tuple[str, ...] = figure(pattern=_OP_NAME, hint=_OP_HINT)


@dataclass(frozen=True, kw_only=True)
class Clock(Group):
    npu_mhz: float = figure(exclusive_minimum=0, maximum=10000)


@dataclass(frozen=True, kw_only=True)
class Macs(Group):
    """MACs per cycle per core for each compute dtype; int8 is required on every chip."""

    int4: int | None = figure(minimum=1, maximum=65536)
    int8: int = figure(minimum=1, maximum=65536)
    int16: int | None = figure(minimum=1, maximum=65536)
    fp16: int | None = figure(minimum=1, maximum=65536)
    bf16: int | None = figure(minimum=1, maximum=65536)
    tf32: int | None = figure(minimum=1, maximum=65536)


@dataclass(frozen=True, kw_only=True)
class Nc1hwc2(Group):
    """C2 (channels per pixel atom) of the native feature layout for each storage dtype."""

    int4: int | None = figure(minimum=1, maximum=128)
    int8: int | None = figure(minimum=1, maximum=128)
    int16: int | None = figure(minimum=1, maximum=128)
    fp16: int | None = figure(minimum=1, maximum=128)
    bf16: int | None = figure(minimum=1, maximum=128)
    tf32: int | None = figure(minimum=1, maximum=128)
    int32: int | None = figure(minimum=1, maximum=128)
    fp32: int | None = figure(minimum=1, maximum=128)


@dataclass(frozen=True, kw_only=True)
class AlignmentRow:
    """Channel counts that make DDR access efficient for one dtype."""

    conv_in: int = figure(minimum=1, maximum=1024)
    conv_out: int = figure(minimum=1, maximum=1024)
    depthwise: int = figure(minimum=1, maximum=1024)
    other: int = figure(minimum=1, maximum=1024)


@dataclass(frozen=True, kw_only=True)
class ChannelAlignment(Group):
    hw_multiple: int = figure(minimum=1, maximum=1024)  # H*W > 1 should be a multiple of this
    int4: AlignmentRow | None
    int8: AlignmentRow | None
    int16: AlignmentRow | None
    fp16: AlignmentRow | None
    bf16: AlignmentRow | None
    tf32: AlignmentRow | None


@dataclass(frozen=True, kw_only=True)
class Cbuf(Group):
    banks: int = figure(minimum=1, maximum=15)  # CNA CBUF_CON0 DATA_BANK is a 4-bit count
    bank_bytes: int = figure(minimum=1024, maximum=1 << 20)

    @property
    def size_bytes(self) -> int:
        return self.banks * self.bank_bytes


@dataclass(frozen=True, kw_only=True)
class Sram(Group):
    kind: str = figure(choices=SRAM_KINDS)
    size_bytes: int = figure(minimum=0, maximum=1 << 30)
    granule_bytes: int | None = figure(minimum=1, maximum=1 << 20)

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.kind == "none":
            if self.size_bytes:
                yield "size_bytes", f"expected 0 when kind is 'none', got {self.size_bytes}"
            if self.granule_bytes is not None:
                yield "granule_bytes", f"expected null when kind is 'none', got {self.granule_bytes}"
            return
        if self.size_bytes == 0:
            yield "size_bytes", f"expected a size > 0 when kind is {self.kind!r} (use kind 'none' for no SRAM)"
        if self.granule_bytes is None:
            yield "granule_bytes", f"expected an integer when kind is {self.kind!r}, got null"
        elif self.size_bytes % self.granule_bytes:
            yield "size_bytes", (f"expected a multiple of granule_bytes ({self.granule_bytes}), "
                                 f"got {self.size_bytes}")


@dataclass(frozen=True, kw_only=True)
class Ddr(Group):
    read_bytes_per_cycle: float = figure(exclusive_minimum=0, maximum=1024)
    write_bytes_per_cycle: float = figure(exclusive_minimum=0, maximum=1024)
    # share of the shorter of a task's compute and data DMA hidden under the longer (1: max)
    compute_overlap: float = figure(default=1.0, minimum=0, maximum=1)
    # bytes per NPU cycle the DDR gives all cores together when a layer is split across cores;
    # null: no limit beyond each core's own read/write rates (TIMING.md, multi-core)
    shared_bytes_per_cycle: float | None = figure(default=None, exclusive_minimum=0, maximum=4096)


@dataclass(frozen=True, kw_only=True)
class VendorEstimate(Group):
    """What the vendor's static estimator (librknnc) assumes, to reproduce its reports."""

    ddr_bytes_per_cycle: float | None = figure(exclusive_minimum=0, maximum=1024)
    depthwise_weight_bytes: str | None = figure(choices=("stored", "logical"))


@dataclass(frozen=True, kw_only=True)
class Launch(Group):
    task_overhead_cycles: int = figure(minimum=0, maximum=10**9)
    host_submit_overhead_us: float = figure(minimum=0, maximum=10**6)
    # host model of a CPU step: fixed cost + input elements x cost per element
    cpu_op_overhead_us: float = figure(default=0.0, minimum=0, maximum=10**6)
    cpu_op_us_per_element: float = figure(default=0.0, minimum=0, maximum=10**3)


@dataclass(frozen=True, kw_only=True)
class CycleModel(Group):
    """Geometry of the NPU cycle model H1 (vendor-corpus README §4.1)."""

    pixel_granule: int = figure(minimum=1, maximum=1024)
    # DPU/PPU-only tasks (no MAC work): bytes of their data cube streamed per cycle
    dpu_bytes_per_cycle: int = figure(default=16, minimum=1, maximum=1024)
    # conv tasks: bytes the DPU writes out per cycle at most (null: never the limit); fitted
    # where board rows show DDR-bound convs timed by their output (emulator/TIMING.md)
    conv_write_bytes_per_cycle: float | None = figure(default=None, exclusive_minimum=0, maximum=1024)
    input_channel_group: int = figure(minimum=1, maximum=1024)
    atom_k_int8: int = figure(minimum=1, maximum=1024)
    depthwise_group: int = figure(minimum=1, maximum=1024)
    min_taps_per_pass: int = figure(minimum=1, maximum=1024)


@dataclass(frozen=True, kw_only=True)
class MatmulLayout:
    """Native matmul layouts: A [K/a_k, M, a_k], B [N/b_n, K/b_k, b_n, b_k], C [N/c_n, M, c_n]."""

    a_k: int = figure(minimum=1, maximum=1024)
    b_n: int = figure(minimum=1, maximum=1024)
    b_k: int = figure(minimum=1, maximum=1024)
    c_n: int = figure(minimum=1, maximum=1024)
    c_dtype: str = figure(choices=STORAGE_DTYPES)


@dataclass(frozen=True, kw_only=True)
class MatmulLimits:
    """K and N limits of one input dtype; a null maximum means none is documented."""

    k_max: int | None = figure(minimum=1, maximum=1 << 30)
    k_align: int = figure(minimum=1, maximum=1024)
    n_max: int | None = figure(minimum=1, maximum=1 << 30)
    n_align: int = figure(minimum=1, maximum=1024)


@dataclass(frozen=True, kw_only=True)
class MatmulLayouts(Group):
    int4: MatmulLayout | None
    int8: MatmulLayout | None
    fp16: MatmulLayout | None


@dataclass(frozen=True, kw_only=True)
class MatmulLimitTable(Group):
    int4: MatmulLimits | None
    int8: MatmulLimits | None
    fp16: MatmulLimits | None


@dataclass(frozen=True, kw_only=True)
class Matmul(Group):
    supported: bool
    b_segment_k: int | None = figure(minimum=1, maximum=1 << 30)
    type_combinations: tuple[str, ...] = figure(pattern=_MATMUL_TYPE, hint="like 'int8xint8->int32'")
    layouts: MatmulLayouts
    limits: MatmulLimitTable

    def problems(self) -> Iterator[tuple[str, str]]:
        if not self.supported:
            if self.type_combinations:
                yield "type_combinations", "expected [] when supported is false"
            if self.b_segment_k is not None:
                yield "b_segment_k", "expected null when supported is false"
            for dtype in MATMUL_DTYPES:
                if getattr(self.layouts, dtype) or getattr(self.limits, dtype):
                    yield f"layouts.{dtype}", "expected null layouts and limits when supported is false"
            return
        if not self.type_combinations:
            yield "type_combinations", "expected at least one combination when supported is true"
        for combination in self.type_combinations:
            for dtype in combination.split("->")[0].split("x"):
                for table in ("layouts", "limits"):
                    if getattr(getattr(self, table), dtype) is None:
                        yield f"{table}.{dtype}", f"expected a row: type_combinations uses {dtype} ({combination})"

    def supports(self, a: str, b: str, c: str) -> bool:
        """True if A(a) x B(b) -> C(c) is an available matmul type."""
        key = f"{normalize_dtype(a)}x{normalize_dtype(b)}->{normalize_dtype(c)}"
        return self.supported and key in self.type_combinations


@dataclass(frozen=True, kw_only=True)
class Fusion(Group):
    """Fusions the hardware runs as one layer; 'Act' in a pattern stands for any activation."""

    activations: tuple[str, ...] = figure(pattern=_OP_NAME, hint=_OP_HINT)
    patterns: tuple[str, ...] = figure(pattern=rf"{_OP_NAME}(\+{_OP_NAME})+", hint="like 'Conv+Act+Add'")
    subgraphs: tuple[str, ...] = figure(pattern=_OP_NAME, hint="a fused subgraph name such as 'GLU'")


@dataclass(frozen=True, kw_only=True)
class Sparse(Group):
    modes: tuple[str, ...] = figure(choices=SPARSE_MODES)
    dtypes: tuple[str, ...] = figure(choices=COMPUTE_DTYPES)
    channel_align: int | None = figure(minimum=1, maximum=1024)
    #: Not a chip figure: the build's switch (`npuemu compile --sparse`, compiler/driver.py sets it
    #: on the build's copy of the platform; no YAML holds it). Off: weights stay dense.
    enabled: bool = figure(default=False)

    def problems(self) -> Iterator[tuple[str, str]]:
        if bool(self.modes) != bool(self.dtypes) or bool(self.modes) != (self.channel_align is not None):
            yield "modes", "expected modes, dtypes and channel_align all set or all empty/null"
        if self.enabled and not self.modes:
            yield "enabled", "expected sparse modes: the chip has no sparse inference"


@dataclass(frozen=True, kw_only=True)
class Pc(Group):
    """Frontend (PC) figures from the vendor driver's per-SoC configuration."""

    data_amount_scale: int = figure(minimum=1, maximum=8)
    task_number_bits: int = figure(minimum=1, maximum=32)
    max_tasks_per_submit: int = figure(minimum=1, maximum=(1 << 32) - 1)
    dma_address_bits: int = figure(minimum=32, maximum=64)
    register_address_bits: int = figure(choices=(32,))

    def problems(self) -> Iterator[tuple[str, str]]:
        limit = (1 << self.task_number_bits) - 1
        if self.max_tasks_per_submit > limit:
            yield "max_tasks_per_submit", (f"expected at most 2**task_number_bits - 1 = {limit}, "
                                           f"got {self.max_tasks_per_submit}")
