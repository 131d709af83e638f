"""An NPU: N cores sharing one memory, each running the task chains the host launches on it.

This is the machine a loader drives: put a memory image in place (weights, inputs, regcmd
buffers), then launch chains by address and first fetch amount, as the vendor driver does
with PC_DATA_ADDR / PC_DATA_AMOUNT (rknpu-isa.md 2.3). It works the same for a model file of
our own (:meth:`Machine.from_model`) and for any other producer of register streams.

Cores that run in parallel on the hardware run one after the other here; results are the
same as long as concurrently running chains do not write memory another one reads, which
the compiler's schedule guarantees (isa/CONTAINER.md 3.5: steps on different cores).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

# before any module below decorates a kernel (memory.py's, ahead of the kernels package's own
# install): Numba caches made at first use (emulator/numba_deferred_cache.py)
from npuemu.emulator import numba_deferred_cache

numba_deferred_cache.install()

from npuemu.emulator.core import NpuCore, TaskRecord
from npuemu.emulator import numba_array_typeof, numba_cache_load
from npuemu.emulator.memory import Memory
from npuemu.emulator.units.state import (
    FP16, INT8, PRECISION_DTYPES, PRECISION_NAMES, c2_of,
)
from npuemu.isa.container import ModelFile, NpuStep
from npuemu.isa.errors import EmulationError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform

log = logging.getLogger(__name__)

# kernels of a machine's first run load from Numba's cache without Numba's one-time registry
# refresh (emulator/numba_cache_load.py: ~0.12 s of a fresh process's first call)
numba_cache_load.install()
# a kernel's first call types its arrays without importing numpy.ma (emulator/numba_array_typeof.py)
numba_array_typeof.install()


@dataclass(frozen=True)
class ChainRun:
    """The records of one chain run on one core."""

    core: int
    address: int
    first_amount: int
    tasks: tuple[TaskRecord, ...]

    @property
    def read_bytes(self) -> int:
        return sum(t.traffic.read_bytes for t in self.tasks)

    @property
    def write_bytes(self) -> int:
        return sum(t.traffic.write_bytes for t in self.tasks)


@dataclass(frozen=True)
class Launch:
    """One chain the host starts on one core (address and fetch amount as in PC_DATA_ADDR/AMOUNT)."""

    core: int
    address: int
    first_amount: int


class Machine:
    """The NPU of a platform: its cores (each with PC, register groups, CBUF, LUT RAM) and memory."""

    def __init__(self, memory: Memory, platform="rk3588", regmap: RegisterMap | None = None,
                 cores: int | None = None) -> None:
        self.platform = load_platform(platform) if isinstance(platform, str) else platform
        self.regmap = regmap or load_regmap(self.platform.register_map.family)
        count = self.platform.cores.count if cores is None else cores
        if not 1 <= count <= self.platform.cores.count:
            raise EmulationError(f"{self.platform.name} has {self.platform.cores.count} cores; "
                                 f"cannot build a machine with {count}")
        # the NC1HWC2 atom: C2 int8 x 1 byte (16; 8 on RK356x, hardware.md 2); every stride
        # register counts it (REGISTER_SEMANTICS.md 9)
        self.atom_bytes = self.platform.c2("int8")
        _check_atoms(self.platform, self.atom_bytes)
        self.memory = memory
        # kernels per MAC pass: the same figure the compiler groups output channels by
        atoms = {code: self.platform.atom_k(name) for code, name in ((INT8, "int8"), (FP16, "fp16"))
                 if getattr(self.platform.macs, name)}  # RV1106 has no fp16 MAC path
        self.cores = tuple(NpuCore(i, self.regmap, memory, self.platform.cbuf.banks,
                                   self.platform.pc.data_amount_scale, atoms, self.atom_bytes) for i in range(count))

    @classmethod
    def for_platform(cls, platform="rk3588", ddr_size: int = 64 << 20, ddr_base: int = 0,
                     with_sram: bool = False, sram_base: int | None = None) -> Machine:
        """A machine with a DDR image of ``ddr_size`` bytes (and the platform's SRAM if asked)."""
        spec = load_platform(platform) if isinstance(platform, str) else platform
        sram = spec.sram.size_bytes if with_sram else 0
        return cls(Memory(ddr_size, ddr_base, sram, sram_base), spec)

    @classmethod
    def from_model(cls, model: ModelFile, platform=None) -> Machine:
        """Memory sized by the model's memory map, every placed section copied in."""
        chip = platform or model.platform().chip or "rk3588"
        regions = [(r.name, r.base, r.size) for r in model.memory_map().regions]
        if not regions:
            raise EmulationError("the model has no memory_map regions: nothing says how big the "
                                 "DDR image must be (isa/CONTAINER.md 3.4)")
        machine = cls(Memory.from_regions(regions), chip)
        translated = _vendor_layout_sections(model, machine)
        for section in model.sections:
            if section.region.name.lower() == "none":
                continue
            region = machine.memory.region(section.region.name.lower())
            if not region.contains(section.load_address, len(section.data)):
                raise EmulationError(
                    f"section {section.name!r} ({len(section.data)} bytes at {section.load_address:#x}) "
                    f"does not fit memory region {region.describe()}")
            machine.memory.load(section.load_address, translated.get(section.name, section.data))
        return machine

    def run_chain(self, address: int, first_amount: int, core: int = 0) -> ChainRun:
        if not 0 <= core < len(self.cores):
            raise EmulationError(f"core {core} does not exist ({len(self.cores)} cores)")
        run = ChainRun(core, address, first_amount, self.cores[core].run_chain(address, first_amount))
        if log.isEnabledFor(logging.INFO):  # the byte sums walk every task: only when logged
            log.info("core %d ran %d tasks from %#x: %d bytes read, %d written", core, len(run.tasks),
                     address, run.read_bytes, run.write_bytes)
        return run

    def run(self, launches: Iterable[Launch]) -> tuple[ChainRun, ...]:
        """Run chains in the order the host issues them (see the module note on parallel cores)."""
        return tuple(self.run_chain(l.address, l.first_amount, l.core) for l in launches)

    def run_model(self, model: ModelFile) -> tuple[ChainRun, ...]:
        """Run the NPU steps of a model's schedule; CPU steps are not this machine's job."""
        runs = []
        for step in model.schedule():
            if not isinstance(step, NpuStep):
                raise EmulationError(f"schedule step {step.op!r} is a CPU step; run the model through "
                                     f"the runtime that also executes host operators")
            section = model.section(step.chain.section)
            runs.append(self.run_chain(section.load_address + step.chain.offset,
                                       step.chain.first_amount, step.core))
        return tuple(runs)


def _vendor_layout_sections(model: ModelFile, machine: Machine) -> dict[str, bytes]:
    """A model file whose trailer says its tasks are in a vendor register layout (LOWERING.md 39:
    npuemu's own rk3576 builds) runs on the units' RK3588 positions: its chains are translated as
    vendor .rknn programs are (isa/rknn/rk3576_program.py). Files without the key run as stored."""
    layout = model.trailer.get("platform", {}).get("register_layout")
    if layout is None or layout == machine.regmap.family:
        return {}
    # imported here: the vendor reader costs a fresh process tens of ms (issue 20's first call)
    from npuemu.isa.rknn import rk3576_program

    if layout != rk3576_program.VENDOR_FAMILY:
        raise EmulationError(f"the model file's tasks are in register layout {layout!r}, which the emulator "
                             f"cannot translate to {machine.regmap.family!r}")
    chains = [(step.chain.section, step.chain.offset, step.chain.first_amount)
              for step in model.schedule() if isinstance(step, NpuStep)]
    return rk3576_program.translate_model_sections(model.sections, chains, load_regmap(layout), machine.regmap,
                                                   machine.platform.pc.data_amount_scale)


def _check_atoms(platform, atom_bytes: int) -> None:
    """The units derive every precision's C2 from the int8 atom (state.c2_of); a platform whose
    table says otherwise would be computed with the wrong layout, so it is refused."""
    for code in PRECISION_DTYPES:
        name = PRECISION_NAMES[code]
        listed = getattr(platform.nc1hwc2, name, None)
        if listed is not None and listed != c2_of(code, atom_bytes):
            raise EmulationError(
                f"{platform.name}: nc1hwc2.{name} = {listed} but the emulator's units store {name} "
                f"{c2_of(code, atom_bytes)} per pixel with {atom_bytes}-byte int8 atoms "
                f"(C2 int8 = {atom_bytes}); such a layout is not modelled")
