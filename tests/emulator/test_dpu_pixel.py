"""The pixel-major DPU pass (``kernels.dpu_pixel.stages_to_atoms``: stages, then the WDMA's
NC1HWC2 atoms stored in memory words) against the per-element reference chain
(tests/emulator/reference, NUMERICS.md 4) and an independent atom layout: every input layout,
window-sum layout, output type and surface count, both the int64 stages and the float64
chain (NUMERICS.md 4.9) with operands at their extremes, and the bytes around the atoms left
as they were."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, OutCvtConfig, XStageConfig
from npuemu.emulator.kernels import dpu_pixel
from npuemu.emulator.kernels.dpu_pixel import stages_to_atoms
from npuemu.emulator.memory import Memory, TaskDma, Traffic
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import arithmetic as ref
from tests.emulator.test_kernels_dpu import MODE_NAMES, as_dict, ew_configs, x_stage_configs

SENTINEL = 0x5A  # bytes the pass must not touch
GAP_WORDS = 3  # words between surfaces in the test layout


def expected_cube(data, sums, alu, cpend, mul, bn_operands, operand, stages, out_dtype):
    """[C][H][W] through the reference chain (``operand`` broadcast to [C][H][W])."""
    bs, bn, ew, cvt = (stages.get(name) for name in ("bs", "bn", "ew", "cvt"))
    per_group = data.shape[0] // sums.shape[0]
    bounds = (int(np.iinfo(out_dtype).min), int(np.iinfo(out_dtype).max))
    out = np.empty(data.shape, np.int64)
    for (c, y, x), value in np.ndenumerate(data):
        value = int(value)
        if bs is not None:
            value = ref.bs(value, int(sums[c // per_group, y, x]), int(alu[c]), int(cpend[c]),
                           int(mul[c]), as_dict(bs))
        if bn is not None:
            value = ref.bn(value, bn_operands[0], bn_operands[1], as_dict(bn))
        if ew is not None:
            cfg = as_dict(ew) | {"cvt_round": MODE_NAMES[ew.cvt_round]}
            value = ref.ew(value, int(operand[c, y, x]), cfg)
        if cvt is not None:
            value = ref.out_cvt(value, cvt.scale, cvt.shift, cvt.offset, MODE_NAMES[cvt.round_mode], bounds)
        out[c, y, x] = value
    return out


def channel_blocks(cube: np.ndarray, kind: str, lanes: int) -> np.ndarray:
    """[C][H][W] as the kernel's [S][P][L] input: pixel-major, planes or atoms of ``lanes``."""
    channels = cube.shape[0]
    planes = cube.reshape(channels, -1)
    if kind == "hwc":
        return np.ascontiguousarray(planes.T)[None]
    if kind == "chw":
        return planes[:, :, None].copy()
    surfaces = -(-channels // lanes)
    padded = np.zeros((surfaces * lanes, planes.shape[1]), cube.dtype)
    padded[:channels] = planes
    return np.ascontiguousarray(padded.reshape(surfaces, lanes, -1).transpose(0, 2, 1))


def run(data, kind, lanes, out_dtype, c2, surfaces, **stages):
    """Run the pass into a word buffer; returns the atoms read back [S][H][W][C2] and the
    buffer with the atoms blanked out (for the untouched-bytes check)."""
    channels, height, width = data.shape
    atom_words = c2 * np.dtype(out_dtype).itemsize // 8
    surface_words = height * width * atom_words + GAP_WORDS
    words = np.full(surfaces * surface_words + GAP_WORDS, SENTINEL * 0x0101010101010101, np.uint64)
    offsets = (GAP_WORDS + np.arange(surfaces)[:, None] * surface_words
               + np.arange(height)[None, :] * width * atom_words).reshape(-1)
    stages_to_atoms(channel_blocks(data, kind, lanes), channels, width, words, offsets, out_dtype, c2,
                    surfaces, **stages)
    atoms = np.empty((surfaces, height, width, c2), out_dtype)
    rest = words.copy()
    for s in range(surfaces):
        for y in range(height):
            start = offsets[s * height + y]
            stop = start + width * atom_words
            atoms[s, y] = words[start:stop].view(out_dtype).reshape(width, c2)
            rest[start:stop] = SENTINEL * 0x0101010101010101
    return atoms, rest


def as_atoms(cube: np.ndarray, c2: int, surfaces: int, out_dtype) -> np.ndarray:
    lanes = np.zeros((surfaces * c2,) + cube.shape[1:], out_dtype)
    kept = min(cube.shape[0], surfaces * c2)
    lanes[:kept] = cube[:kept]
    return lanes.reshape(surfaces, c2, *cube.shape[1:]).transpose(0, 2, 3, 1)


def window_sums(rng, groups, shape, magnitude, layout):
    sums = rng.integers(-magnitude, magnitude + 1, (groups,) + shape)
    if layout == "pixel":  # a pixel-major buffer seen as [G][H][W], as the depthwise path gives
        return np.ascontiguousarray(sums.transpose(1, 2, 0)).transpose(2, 0, 1)
    return sums.astype(np.int64 if layout == "int64" else np.int32)


@st.composite
def cases(draw, chain):
    """A cube, its layout and the per-channel operands; ``chain``: the operands the vendor
    streams use, at their extremes, in the float64 chain's domain (and just past its bound)."""
    channels = draw(st.integers(1, 20))
    height, width = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = draw(st.sampled_from([2**3, 2**7, 2**15, 2**31]))
    data = np.clip(rng.integers(-magnitude, magnitude + 1, (channels, height, width)),
                   -(2**31), 2**31 - 1).astype(np.int32)
    if draw(st.booleans()):  # extremes
        data.flat[rng.integers(0, data.size)] = draw(st.sampled_from([-(2**31), 2**31 - 1, 0]))
    out_dtype = draw(st.sampled_from([np.int8, np.int16, np.int32]))
    c2 = 16 // np.dtype(out_dtype).itemsize
    full = -(-channels // c2)
    surfaces = draw(st.integers(1, full))  # fewer when ORIG_CHANNEL leaves padding surfaces out
    groups = draw(st.sampled_from([g for g in (1, 2, channels) if channels % g == 0]))
    # past 2**22 the chain refuses the largest operands; 2**30 keeps |v * MUL| < 2**62, the
    # int64 stages' domain (numerics.rshift_round)
    window_magnitude = draw(st.sampled_from([2**10, 2**20] + ([2**22, 2**30] if chain else [])))
    sums = window_sums(rng, groups, (height, width), window_magnitude,
                       draw(st.sampled_from(["int32", "int64", "pixel"])))
    limit = 2**15
    alu = rng.integers(-(2**31), 2**31, channels)
    cpend = rng.integers(-limit, limit, channels)
    mul = rng.integers(-limit, limit, channels)
    for operand in (alu, cpend, mul):
        if draw(st.booleans()):
            operand[rng.integers(0, channels)] = draw(st.sampled_from([-limit, limit - 1, 0]))
    kind = draw(st.sampled_from(["hwc", "chw", "atoms"]))
    lanes = draw(st.sampled_from([4, 8, 16]))
    return data, sums, alu, cpend, mul, out_dtype, c2, surfaces, kind, lanes, rng


SHIFTS = st.sampled_from([0, 1, 2, 3, 14, 20, 31, 52, 53, 60])


@st.composite
def chain_stages(draw):
    """BS ALU add (or off), BN ReLU/RELUX, EW add with its converter, OUT_CVT: the chain's domain,
    with sometimes one setting outside it (then the int64 stages run)."""
    shift = draw(SHIFTS)
    bs = XStageConfig(alu_enable=draw(st.booleans()), alu_algo=nm.ALU_ADD,
                      mul_enable=draw(st.booleans()), shift_positive=shift,
                      shift_negative=shift if draw(st.integers(0, 5)) else draw(SHIFTS),
                      relu=draw(st.booleans()), relux=draw(st.booleans()),
                      relux_value=draw(st.integers(-(2**31), 2**31 - 1)),
                      cpend_enable=draw(st.booleans()))
    bn = XStageConfig(relu=draw(st.booleans()), relux=draw(st.booleans()),
                      relux_value=draw(st.sampled_from([-5, 0, 127, 14037, 2**31 - 1])))
    ew = EwConfig(cvt_enable=draw(st.booleans()), cvt_offset=draw(st.sampled_from([-128, 0, 7, 2**31 - 1])),
                  cvt_scale=draw(st.sampled_from([-(2**15), 1, 23062, 2**15 - 1])), cvt_shift=draw(SHIFTS),
                  cvt_round=draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])),
                  op_enable=draw(st.booleans()), alu_algo=nm.ALU_ADD, relu=draw(st.booleans()))
    cvt = OutCvtConfig(draw(st.sampled_from([-(2**15), -3, 1, 19049, 2**15 - 1])), draw(SHIFTS),
                       draw(st.sampled_from([-(2**31), -128, 0, 12, 2**31 - 1])),
                       draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])))
    return {"bs": draw(st.none() | st.just(bs)), "bn": draw(st.none() | st.just(bn)),
            "ew": draw(st.none() | st.just(ew)), "cvt": cvt}


@st.composite
def any_stages(draw):
    return {"bs": draw(st.none() | x_stage_configs()), "bn": draw(st.none() | x_stage_configs()),
            "ew": draw(st.none() | ew_configs()),
            "cvt": draw(st.none() | st.builds(OutCvtConfig, st.integers(-(2**15), 2**15 - 1),
                                                st.integers(0, 40), st.integers(-(2**31), 2**31 - 1),
                                                st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])))}


def check(case, stages, operand_kind, operand_dtype):
    data, sums, alu, cpend, mul, out_dtype, c2, surfaces, kind, lanes, rng = case
    if stages["cvt"] is None:
        out_dtype, c2 = np.int32, 4
        surfaces = min(surfaces, -(-data.shape[0] // c2))
    bn_operands = (int(rng.integers(-(2**31), 2**31)), int(rng.integers(-(2**15), 2**15)))
    info = np.iinfo(operand_dtype)
    if operand_kind == "pixel":
        operand = rng.integers(int(info.min), int(info.max) + 1, data.shape).astype(operand_dtype)
        passed = channel_blocks(operand, kind if kind != "chw" else "atoms", lanes)
    else:
        operand = np.full(data.shape, rng.integers(-(2**31), 2**31), np.int64)
        passed = np.array(operand.flat[0], np.int32).reshape(1, 1, 1)
    atoms, rest = run(data, kind, lanes, out_dtype, c2, surfaces, bs=stages["bs"], bs_alu=alu,
                      bs_cpend=cpend, bs_mul=mul, window_sum=sums, bn=stages["bn"],
                      bn_alu=bn_operands[0], bn_mul=bn_operands[1], ew=stages["ew"],
                      ew_operand=passed, cvt=stages["cvt"])
    expected = expected_cube(data, sums, alu, cpend, mul, bn_operands, operand, stages, out_dtype)
    assert np.array_equal(atoms, as_atoms(expected, c2, surfaces, out_dtype))
    assert np.all(rest.view(np.uint8) == SENTINEL)


@settings(max_examples=40, deadline=None)
@given(cases(chain=False), any_stages(), st.sampled_from(["pixel", "tensor"]),
       st.sampled_from([np.int8, np.int16, np.int32]))
def test_pixel_pass_matches_the_reference_chain(case, stages, operand_kind, operand_dtype):
    check(case, stages, operand_kind, operand_dtype)


@settings(max_examples=50, deadline=None)
@given(cases(chain=True), chain_stages(), st.sampled_from(["pixel", "tensor"]),
       st.sampled_from([np.int8, np.int32]))
def test_float64_chain_matches_the_reference_chain(case, stages, operand_kind, operand_dtype):
    check(case, stages, operand_kind, operand_dtype)


@pytest.mark.parametrize("kind", ["hwc", "chw", "atoms"])
@pytest.mark.parametrize("channels", [17, 32, 40])
def test_only_the_written_surfaces_are_computed(kind, channels):
    """ORIG_CHANNEL below CHANNEL: one surface of 16 lanes written from a wider cube (vendor
    depthwise and conv passes), for every input layout."""
    rng = np.random.default_rng(channels)
    data = rng.integers(-(2**20), 2**20, (channels, 2, 3)).astype(np.int32)
    sums = window_sums(rng, 1, (2, 3), 2**10, "int64")
    operands = [rng.integers(-(2**15), 2**15, channels) for _ in range(3)]
    bs, bn, cvt = vendor_settings()
    case = (data, sums, *operands, np.int8, 16, 1, kind, 16, rng)
    check(case, {"bs": bs, "bn": bn, "ew": None, "cvt": cvt}, "tensor", np.int32)


def vendor_settings(shift=14):
    """MobileNetV2's common task: BS CPEND + ALU add + MUL >> 14, BN ReLU6, OUT_CVT to int8."""
    return (XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=shift,
                         shift_negative=shift, cpend_enable=True),
            XStageConfig(relu=True, relux=True, relux_value=14037),
            OutCvtConfig(19049, 20, -128, nm.ROUND_HALF_EVEN))


@pytest.mark.parametrize("mul_top", [1, 2**15])
def test_chain_takes_the_vendor_task_up_to_its_bound(mul_top):
    """At the largest window sum the bound allows, the chain runs and is exact; one more and
    the int64 stages run, exact too."""
    bs, bn, cvt = vendor_settings()
    channels, width = 16, 3
    alu = np.full(channels, 2**31 - 1)
    cpend = np.full(channels, -(2**15))
    mul = np.full(channels, mul_top)
    chain, limit = dpu_pixel.chain_settings(bs, bn, None, cvt, np.dtype(np.int8), (2**31 - 1, 2**15, mul_top),
                                            np.dtype(np.int32), np.dtype(np.int32))
    assert chain is not None
    assert (2**31 + 2**31 - 1 + 2**15 * limit) * mul_top < dpu_pixel.CHAIN_BOUND
    assert (2**31 + 2**31 - 1 + 2**15 * (limit + 1)) * mul_top >= dpu_pixel.CHAIN_BOUND
    data = np.array([[[-(2**31), 2**31 - 1, 1]]] * channels, np.int32)
    for window in (limit, limit + 1):
        sums = np.array([[[window, -window, 1]]], np.int64)
        case = (data, sums, alu, cpend, mul, np.int8, 16, 1, "hwc", 16, np.random.default_rng(0))
        check(case, {"bs": bs, "bn": bn, "ew": None, "cvt": cvt}, "tensor", np.int32)


@pytest.mark.parametrize("change", [
    {"shift_negative": 13}, {"prelu": True}, {"alu_algo": nm.ALU_MAX},
    {"shift_positive": 53, "shift_negative": 53}])
def test_chain_refuses_what_it_does_not_compute(change):
    bs, bn, cvt = vendor_settings()
    fields = as_dict(bs) | change
    assert dpu_pixel.chain_settings(XStageConfig(**fields), bn, None, cvt, np.dtype(np.int8), (1, 1, 1),
                                    np.dtype(np.int32), np.dtype(np.int32)) is None


def test_chain_refuses_ew_multiply_and_bn_multiply():
    bs, bn, cvt = vendor_settings()
    settings_ = (bs, bn, None, cvt, np.dtype(np.int8), (1, 1, 1), np.dtype(np.int32), np.dtype(np.int32))
    assert dpu_pixel.chain_settings(*settings_) is not None
    assert dpu_pixel.chain_settings(bs, XStageConfig(mul_enable=True), *settings_[2:]) is None
    multiply = EwConfig(op_enable=True, op_type=nm.EW_OP_MUL)
    assert dpu_pixel.chain_settings(bs, bn, multiply, *settings_[3:]) is None


def test_claim_rows_counts_invalidates_and_refuses_overlaps():
    memory = Memory(1 << 16)
    memory.derived.put("value", 0x100, 0x140, 1)
    memory.derived.put("elsewhere", 0x8000, 0x8040, 2)
    dma = TaskDma(memory, "task")
    claimed = dma.claim_rows(Traffic.DPU_WRITE, np.array([0x100, 0x200]), 0x40, np.uint64, "WDMA")
    assert claimed is not None
    words, offsets = claimed
    assert words.dtype == np.uint64 and list(offsets) == [0x20, 0x40]
    assert dma.traffic().dpu_write == 0x80
    assert memory.derived.get("value") is None and memory.derived.get("elsewhere") == 2
    assert dma.claim_rows(Traffic.DPU_WRITE, np.array([0x100, 0x120]), 0x40, np.uint64, "WDMA") is None
    assert dma.claim_rows(Traffic.DPU_WRITE, np.array([0x104]), 0x40, np.uint64, "WDMA") is None
    assert dma.traffic().dpu_write == 0x80  # nothing counted for a refused claim
    with pytest.raises(EmulationError, match="WDMA write"):
        dma.claim_rows(Traffic.DPU_WRITE, np.array([0xFFF0]), 0x40, np.uint64, "WDMA")


def test_bad_offsets_and_types_are_refused():
    data = np.zeros((1, 4, 16), np.int32)
    words = np.zeros(64, np.uint64)
    with pytest.raises(EmulationError, match="row offsets"):
        stages_to_atoms(data, 16, 4, words, np.zeros(3, np.int64), np.int8, 16, 1, cvt=OutCvtConfig())
    with pytest.raises(EmulationError, match="int8, int16 or int32"):
        stages_to_atoms(data, 16, 4, words, np.zeros(1, np.int64), np.int8, 16, 1)
    with pytest.raises(EmulationError, match="channel-block"):
        stages_to_atoms(data, 17, 4, words, np.zeros(1, np.int64), np.int8, 16, 1, cvt=OutCvtConfig())


def test_two_clamps_are_one():
    """NUMERICS.md 4.9: clamp then clamp is the clamp between the images of -inf and +inf (also
    when a lower bound exceeds its upper one: min(max(v, low), high) is then high)."""
    values = range(-6, 7)
    for low1, high1, low2, high2 in np.ndindex(7, 7, 7, 7):
        first, second = (low1 - 3, high1 - 3), (low2 - 3, high2 - 3)
        low, high = dpu_pixel._then(dpu_pixel._then((-(2**62), 2**62), *first), *second)
        for v in values:
            twice = min(max(min(max(v, first[0]), first[1]), second[0]), second[1])
            assert twice == min(max(v, low), high)
