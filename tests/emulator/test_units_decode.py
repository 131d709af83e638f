"""Register decoding of the units, the memory model and the model-file entry point."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from npuemu.emulator.memory import DEFAULT_SRAM_BASE, Memory, TaskDma, Traffic
from npuemu.emulator.regfile import RegisterView
from npuemu.emulator.units.cna_core import decode_conv
from npuemu.emulator.units.dpu import decode_dpu, decode_dpu_rdma
from npuemu.isa.chain import encode_chain
from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind
from npuemu.isa.errors import DmaError, EmulationError
from npuemu.isa.task import Chain
from tests.emulator.test_machine_support import (
    MASK_POOL, REGMAP, ConvSpec, bias_blob, conv_task, flying_task, pack_conv_weights, pool_reference,
    pool_task, read_cube, run_tasks, to_nc1hwc2,
)


def view(block: str, writes) -> RegisterView:
    values = {}
    for w in writes:
        if w.block == block:
            values[REGMAP.register(block, w.register).offset] = w.value
    return RegisterView(REGMAP.block(block), 0, values)


def conv_state(spec: ConvSpec, overrides: dict | None = None):
    t = conv_task(spec)
    for (block, register), fields in (overrides or {}).items():
        t.set(block, register, **fields) if isinstance(fields, dict) else t.set(block, register, fields)
    return decode_conv(view("CNA", t.writes), view("CORE", t.writes), 12, "task")


# ---------------------------------------------------------------------------------------------
# CNA strides, pad value, real channels
# ---------------------------------------------------------------------------------------------
def test_feature_strides_in_bytes_like_rep01():
    # rep01: W = H = 56, int8: LINE_STRIDE = 224, SURF_STRIDE = 2912 -> 896 B lines, 50176 B surfaces
    state = conv_state(ConvSpec(in_c=32, in_h=56, in_w=56, kernels=32),
                       {("CNA", "DMA_CON1"): {"LINE_STRIDE": 224},
                        ("CNA", "DMA_CON2"): {"SURF_STRIDE": 2912}})
    assert (state.line_stride, state.surface_stride) == (56 * 16, 56 * 56 * 16)


def test_negative_surface_stride_wraps_like_rep11():
    # rep11 (FC, W = H = 1): SURF_STRIDE = 2**28 - 3 with LINE_STRIDE 4 -> the next surface 16 bytes on
    state = conv_state(ConvSpec(in_c=512, in_h=1, in_w=1, kernels=32),
                       {("CNA", "DMA_CON1"): {"LINE_STRIDE": 4},
                        ("CNA", "DMA_CON2"): {"SURF_STRIDE": 2**28 - 3}})
    assert state.surface_stride == 16


def test_single_row_dma_lines_like_resnet18_shortcuts():
    # resnet18 fixture: 1x1 stride-2 conv on a 55x55 window of a 56x56 tensor, GROUP_LINE_OFF = 1
    spec = ConvSpec(in_c=64, in_h=55, in_w=55, kernels=32, kernel=1, stride=2, out_h=28, out_w=28)
    state = conv_state(spec, {("CNA", "CONV_CON1"): {"GROUP_LINE_OFF": 1},
                              ("CNA", "DMA_CON1"): {"LINE_STRIDE": 56},
                              ("CNA", "DMA_CON2"): {"SURF_STRIDE": 3081}})
    assert (state.line_stride, state.surface_stride) == (56 * 16, 56 * 56 * 16)


def test_image_mode_line_stride_counts_pixels_like_rep03():
    spec = ConvSpec(in_c=3, in_h=10, in_w=224, kernels=32, kernel=3, stride=2, out_h=4, out_w=111)
    state = conv_state(spec, {("CNA", "CONV_CON1"): {"ARGB_IN": 10, "NONALIGN_DMA": 1, "GROUP_LINE_OFF": 1},
                                ("CNA", "DMA_CON1"): {"LINE_STRIDE": 224}})
    assert (state.argb_channels, state.line_stride, state.surfaces, state.real_channels) == (3, 672, 1, 3)


@pytest.mark.parametrize("raw, expected", [(0xFFFFFFFE, -2), (0x0303, 3), (0x80, -128), (0xFFFFFF80, -128)])
def test_pad_value_is_the_low_byte_for_int8(raw, expected):
    state = conv_state(ConvSpec(in_c=16, in_h=4, in_w=4, kernels=32), {("CNA", "PAD_CON1"): raw})
    assert state.pad_value == expected


@pytest.mark.parametrize("channels, field, real", [(512, 63, 512), (96, 31, 96), (32, 23, 24), (48, 47, 48),
                                                   (448, 63, 448), (112, 99, 100)])
def test_real_channels_count_the_last_64_channel_slice(channels, field, real):
    spec = ConvSpec(in_c=channels, in_h=1, in_w=1, kernels=32)
    state = conv_state(spec, {("CNA", "DATA_SIZE1"): {"DATAIN_CHANNEL_REAL": field, "DATAIN_CHANNEL": channels},
                                ("CNA", "FC_DATA_SIZE1"): {"DMA_CHANNEL": channels}})
    assert state.real_channels == real


def test_channels_past_the_real_count_read_as_zero():
    # 20 real channels in a 32-channel cube whose padding lanes hold garbage in memory
    spec = ConvSpec(in_c=20, in_h=3, in_w=3, kernels=32, out_shift=0)
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    x = np.zeros((32, 3, 3), np.int8)
    x[20:] = 50  # garbage lanes
    m.memory.load(spec.feature, to_nc1hwc2(x).tobytes())
    w = np.ones((32, 32, 1, 1), np.int8)  # the blob's padded channels hold 1 as well
    m.memory.load(spec.weights, pack_conv_weights(w[:, :20], fill=1).tobytes())
    m.memory.load(spec.bias, bias_blob(np.zeros(32, int), np.zeros(32, int), np.ones(32, int)))
    run_tasks(m, [conv_task(spec).task(0x1D)])
    assert not read_cube(m, spec.output, 32, 3, 3).any()


# ---------------------------------------------------------------------------------------------
# DPU
# ---------------------------------------------------------------------------------------------
def test_dpu_writer_geometry_like_rep01():
    t = flying_task(56, 56, 32, src=0, dst=0x1000)
    t.set("DPU", "DST_SURF_STRIDE", 0xC400).set("DPU", "SURFACE_ADD", 0x18800)
    t.set("DPU", "BS_OW_CFG", SIZE_E_0=1, SIZE_E_1=1, SIZE_E_2=1, OD_BYPASS=1)
    state = decode_dpu(view("DPU", t.writes), "task")
    assert (state.dst_surface_stride, state.surface_add, state.size_e) == (50176, 100352, 1)


def test_rdma_surface_notch_gives_the_full_surface_stride():
    t = flying_task(56, 28, 64, src=0, dst=0)
    t.set("DPU_RDMA", "SURF_NOTCH", SURF_NOTCH_ADDR=1568)  # rep09 chain 1: 28 of 56 rows
    state = decode_dpu_rdma(view("DPU_RDMA", t.writes), "task")
    assert (state.line_stride, state.surface_stride) == (56 * 16, 3136 * 16)


def test_unequal_size_e_fields_are_refused():
    t = flying_task(4, 4, 16, src=0, dst=0)
    t.set("DPU", "BS_OW_CFG", SIZE_E_0=1, SIZE_E_1=0, SIZE_E_2=1, OD_BYPASS=1)
    with pytest.raises(EmulationError, match=r"DPU\.BS_OW_CFG=0x106 has different SIZE_E_0/1/2"):
        decode_dpu(view("DPU", t.writes), "task")


def test_wdma_size_must_match_the_cube():
    t = flying_task(4, 4, 16, src=0, dst=0)
    t.set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=31)
    with pytest.raises(EmulationError,
                       match=r"DATA_CUBE_WIDTH/HEIGHT/CHANNEL give 4x4x16 but WDMA_SIZE_0/1 give 4x4x32"):
        decode_dpu(view("DPU", t.writes), "task")


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------
def test_memory_regions_and_host_access():
    memory = Memory(1 << 20, sram_size=4096)
    assert [r.name for r in memory.regions] == ["ddr", "sram"]
    assert memory.region("sram").base == DEFAULT_SRAM_BASE
    memory.load(DEFAULT_SRAM_BASE + 8, b"\x01\x02")
    assert list(memory.dump(DEFAULT_SRAM_BASE + 7, 4)) == [0, 1, 2, 0]
    with pytest.raises(DmaError, match=r"host write of 4 bytes at 0x100000 is outside every memory region"):
        memory.load(1 << 20, b"abcd")


def test_memory_rejects_bad_regions():
    with pytest.raises(EmulationError, match=r"does not fit the NPU's 32-bit address space"):
        Memory(4096, ddr_base=0xFFFFF000 + 16)
    with pytest.raises(EmulationError, match=r"overlaps ddr"):
        Memory.from_regions([("ddr", 0, 8192), ("sram", 4096, 4096)])


def test_dma_rows_must_stay_in_one_region():
    memory = Memory.from_regions([("ddr", 0, 4096), ("sram", 4096, 4096)])
    dma = TaskDma(memory, "core 1 task 2")
    with pytest.raises(DmaError, match=r"core 1 task 2: ERDMA read: touches \[0xff0, 0x1010\)"):
        dma.read_rows(Traffic.EW_READ, np.array([4080]), 32, "ERDMA")
    assert dma.read_rows(Traffic.EW_READ, np.array([4096, 4112]), 16, "ERDMA").shape == (2, 16)
    assert dma.traffic().ew_read == 32


def test_addresses_wrap_at_32_bits():
    memory = Memory(4096)
    memory.load(0, b"\x07" * 16)
    dma = TaskDma(memory, "t")
    assert dma.read_rows(Traffic.FEATURE_READ, np.array([2**32]), 16, "wrapped")[0, 0] == 7


# ---------------------------------------------------------------------------------------------
# Model file entry point
# ---------------------------------------------------------------------------------------------
def test_machine_runs_the_npu_steps_of_a_model_file():
    ddr = 0x1000_0000
    x = np.random.default_rng(0).integers(-128, 128, (16, 8, 8)).astype(np.int8)
    pool = pool_task(8, 8, 16, method=1, kernel=2, stride=2, out_w=4, out_h=4, src=ddr + 0x1000,
                     dst=ddr + 0x4000)
    chain = encode_chain(Chain((pool.task(MASK_POOL),)), REGMAP, base_addr=ddr)
    model = ModelFile(
        (Section(SectionKind.REGCMD, "regcmd", chain.data, MemoryRegion.DDR, ddr),
         Section(SectionKind.IO, "input", to_nc1hwc2(x).tobytes(), MemoryRegion.DDR, ddr + 0x1000)),
        {"platform": {"chip": "rk3588"},
         "memory_map": {"regions": [{"name": "ddr", "base": ddr, "size": 0x10000}]},
         "schedule": [{"kind": "npu", "core": 1,
                       "chain": {"section": "regcmd", "offset": 0, "first_amount": chain.first_amount,
                                 "tasks": 1}}]})
    machine = Machine.from_model(model)
    (run,) = machine.run_model(model)
    assert run.core == 1 and run.tasks[0].core == 1
    expected = pool_reference(x, "max", 2, 2, 4, 4)
    np.testing.assert_array_equal(read_cube(machine, ddr + 0x4000, 16, 4, 4), expected)
