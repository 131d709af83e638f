"""int8 depthwise convs in the vendor's rk3576 layout: the weight cube with CPEND, the BS record without
(emulator/REGISTER_SEMANTICS.md 45.2, compiler/LOWERING.md 45.2).

The vendor's rk3576 int8 depthwise cube is RK3588's (64-channel blocks, taps in order, each block's
channels rounded up to 16) with every pair of channel bytes followed by the same two channels' CPEND:
per tap ``w[2p], w[2p+1], cpend[2p], cpend[2p+1]``, so the MAC adds CPEND x window sum itself; its
BS record is RK3588's without the CPEND operand: per 8 channels int32 ALU[8], int16 MUL[8] (48 bytes
for RK3588's 64) [V ORC dw, dw6 (32 channels 3x3), dw80 (80 channels: blocks 64 + 16), gap (a 7x7
GlobalAveragePool, CPEND 128) - the cube and the record of each rk3576 build equal these functions of its
rk3588 twin's, byte for byte; tests/data/rk3576_vendor/dw8_pairs.npz.xz].

Both directions here: :func:`vendor_cube` / :func:`vendor_record` for npuemu's builds, :func:`rk3588_memory`
for the translation, which rewrites a task's cube in place on load: the RK3588 cube in the first half
of the vendor's (it is twice the size), and the RK3588 record in the room an own build leaves after the vendor's
record (``spare_offset``), where the translated task's BS_BASE_ADDR points. A vendor ``.rknn`` leaves no room:
:func:`place_memory` puts both of RK3588's blobs in memory the runner adds (REGISTER_SEMANTICS.md 47.2).
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import UnsupportedProgramError

BLOCK = 64                     # channels per weight block (isa/weight_layout.INT8_DEPTHWISE)
GROUP = 8                      # BS record channels per group
RK3588_GROUP_BYTES, VENDOR_GROUP_BYTES = 64, 48


#: CPEND = -zp_w (compiler/quant_regs.py) lies in -127..128; its byte is the value mod 256, 0x80 read as +128
#: [V ORC gap: the GlobalAveragePool's CPEND 128 (rk3588 twin) stored as 0x80; dw: -2, -52 as 0xfe, 0xcc].
CPEND_MIN, CPEND_MAX = -127, 128


def _cpend(stored: np.ndarray) -> np.ndarray:
    values = stored.astype(np.int64)
    return np.where(values == -128, 128, values)


def _blocks(stored: int):
    """(first channel, channels) of each 64-channel block of a cube holding ``stored`` channels."""
    return [(start, min(BLOCK, stored - start)) for start in range(0, stored, BLOCK)]


def vendor_cube(cube: bytes, cpend: np.ndarray, taps: int) -> bytes:
    """The vendor's cube of RK3588's ``cube`` (taps x stored channels, blocked) with per-channel ``cpend``
    (int8 range; channels past its length get 0)."""
    stored = len(cube) // taps
    values = np.zeros(stored, np.int64)
    values[:min(stored, len(cpend))] = np.asarray(cpend, np.int64)[:stored]
    if values.min(initial=0) < CPEND_MIN or values.max(initial=0) > CPEND_MAX:
        raise UnsupportedProgramError(f"an int8 depthwise conv with a CPEND outside {CPEND_MIN}..{CPEND_MAX} has no "
                                      f"vendor rk3576 form (the vendor's cube stores it in one byte)")
    source = np.frombuffer(cube, np.int8)
    out = np.empty(2 * len(cube), np.int8)
    for start, count in _blocks(stored):
        weights = source[start * taps:(start + count) * taps].reshape(taps, count // 2, 2)
        pend = np.broadcast_to((values[start:start + count] & 0xFF).astype(np.uint8).view(np.int8)
                               .reshape(1, count // 2, 2), weights.shape)
        out[2 * start * taps:2 * (start + count) * taps] = np.concatenate([weights, pend], axis=2).reshape(-1)
    return out.tobytes()


def vendor_record(record: bytes) -> bytes:
    """RK3588's BS record (ALU[8] int32, CPEND[8] int16, MUL[8] int16 per group) without CPEND."""
    groups = np.frombuffer(record, np.uint8).reshape(-1, RK3588_GROUP_BYTES)
    return np.concatenate([groups[:, :32], groups[:, 48:]], axis=1).tobytes()


def rk3588_cpend(record: bytes) -> np.ndarray:
    """The CPEND operands of an RK3588 BS record, by channel."""
    groups = np.frombuffer(record, np.uint8).reshape(-1, RK3588_GROUP_BYTES)
    return np.ascontiguousarray(groups[:, 32:48]).view("<i2").reshape(-1).astype(np.int64)


def rk3588_memory(vendor: bytes, record: bytes, taps: int, channels: int) -> tuple[bytes, bytes]:
    """(RK3588's cube, RK3588's BS record of ``channels`` channels) from the vendor's cube (``vendor``, 2 x taps
    x stored bytes) and its ``record`` (48 bytes a group of 8 channels): the inverse of :func:`vendor_cube`
    and :func:`vendor_record`."""
    stored = len(vendor) // (2 * taps)
    cube = np.frombuffer(vendor, np.int8)
    weights, cpend = np.empty(taps * stored, np.int8), np.zeros(stored, np.int64)
    for start, count in _blocks(stored):
        block = cube[2 * start * taps:2 * (start + count) * taps].reshape(taps, count // 2, 4)
        weights[start * taps:(start + count) * taps] = block[:, :, :2].reshape(-1)
        cpend[start:start + count] = _cpend(block[0, :, 2:].reshape(-1))
    groups = -(-channels // GROUP)
    source = np.frombuffer(record, np.uint8).reshape(groups, VENDOR_GROUP_BYTES)
    pend = np.zeros(groups * GROUP, "<i2")
    pend[:min(stored, groups * GROUP)] = cpend[:groups * GROUP]
    out = np.concatenate([source[:, :32], pend.view(np.uint8).reshape(groups, 16), source[:, 32:]], axis=1)
    return weights.tobytes(), out.tobytes()


def vendor_record_blob(record: bytes) -> bytes:
    """An own build's BS constant of an int8 depthwise layer (RK3588's ``record``): the vendor's record, then
    room for RK3588's, which the translation writes there on load (:func:`spare_offset`) [C: LOWERING.md 45.2]."""
    return vendor_record(record) + bytes(len(record))


# --- the task words ---------------------------------------------------------------------------



def record_channels(values) -> int:
    """The channels a task's BS records cover: its output channels rounded up to 64, as RK3588's DPU reads
    them (npuemu's and the vendor's rk3588 int8 depthwise: 32 -> 64, 80 -> 128) [V ORC twins]."""
    return -(-((values[("CORE", "DATAOUT_SIZE_1")] & 0xFFFF) + 1) // BLOCK) * BLOCK


def spare_offset(values) -> int:
    """Where past a task's BS address (``values``: its vendor words) an own build keeps room for the RK3588
    record: right after the vendor record of the same channels, 6 bytes a channel [C: LOWERING.md 45.2]."""
    return record_channels(values) // GROUP * VENDOR_GROUP_BYTES
QD_EN, OW_CPEND = 0x1, 1 << 31           # CORE MISC_CFG bit 0; DPU BS_OW_CFG bit 31 (the DPU adds CPEND)
USE_SHIFT = 8                            # DPU_RDMA BRDMA_CFG: BRDMA_DATA_USE at bits 11:8
USE_RK3588, USE_VENDOR = 0x7, 0x5        # ALU | CPEND | MUL; ALU | MUL [V ORC dw twins]


def _signed8(value: int) -> int:
    value &= 0xFF
    return value - 0x100 if value & 0x80 else value


def _pad_twin(value: int) -> int:
    """npuemu's RK3588 depthwise PAD_CON1 (the zero point in two bytes, compiler/lower/conv_geometry.py)."""
    zero = _signed8(value)
    return ((zero << 8) | (zero & 0xFF)) & 0xFFFFFFFF


def to_vendor(writes: list[tuple[str, str, int]], where: str) -> list[tuple[str, str, int]]:
    """The vendor words of an int8 depthwise task from the ones ``rk3576_pack`` writes for its RK3588 form
    (which are the fp16 depthwise form's): twice the weight bytes (0x1020 unchanged) and 2 "kernels" (the cube with CPEND),
    the zero point once in PAD_VALUE, QD_EN 0, the DPU without CPEND, the BS record without it
    [V ORC dw, dw6, dw80, gap: the only words that differ]."""
    out = []
    for block, name, value in writes:
        key = (block, name)
        if key == ("CNA", "WEIGHT_BYTES"):
            value *= 2
        elif key == ("CNA", "WEIGHT_KERNELS"):
            value += 1
        elif key == ("CNA", "DATA_OUT_WIDTH"):
            value = (value >> 16) * 2 << 16 | value & 0xFFFF
        elif key == ("CNA", "PAD_VALUE"):
            if _pad_twin(value) != value & 0xFFFFFFFF:
                raise UnsupportedProgramError(f"{where}: an int8 depthwise PAD_CON1 {value:#x} other than the zero "
                                              f"point in two bytes has no vendor rk3576 form")
            value = _signed8(value) & 0xFFFFFFFF
        elif key == ("CORE", "MISC_CFG"):
            value &= ~QD_EN
        elif key == ("DPU", "BS_OW_CFG"):
            value &= ~OW_CPEND
        elif key == ("DPU_RDMA", "BRDMA_CFG"):
            if value >> USE_SHIFT & 0xF != USE_RK3588:
                raise UnsupportedProgramError(f"{where}: an int8 depthwise conv whose BS stage is not bias, CPEND and "
                                              f"multiplier has no vendor rk3576 form")
            value = value & ~(0xF << USE_SHIFT) | USE_VENDOR << USE_SHIFT
        out.append((block, name, value))
    return out


def is_int8_depthwise(values, vendor_depthwise: int) -> bool:
    """A vendor task (``values``: (block, register) -> raw, vendor map) that is an int8 depthwise conv."""
    con1 = values.get(("CNA", "CONV_CON1"), 0)
    return con1 & 0xF == vendor_depthwise and not con1 >> 4 & 0x3F     # CONV_MODE; IN / PROC_PRECISION int8


def to_rk3588_words(values: dict, where: str) -> dict:
    """The inverse of :func:`to_vendor` on a vendor task's values ((block, register) -> raw): the words the
    fp16-style depthwise translation then reads; refuses words no own build writes."""
    checks = {("CNA", "WEIGHT_KERNELS"): values.get(("CNA", "WEIGHT_KERNELS"), 0) & 0xFFFF == 1,
              ("DPU", "BS_OW_CFG"): not values.get(("DPU", "BS_OW_CFG"), 0) & OW_CPEND,
              ("DPU_RDMA", "BRDMA_CFG"): values.get(("DPU_RDMA", "BRDMA_CFG"), 0) >> USE_SHIFT & 0xF == USE_VENDOR}
    for (block, name), ok in checks.items():
        if not ok:
            raise UnsupportedProgramError(f"{where}: vendor rk3576 int8 depthwise {block}.{name} = "
                                          f"{values.get((block, name), 0):#x} is not the form decoded "
                                          f"(emulator/REGISTER_SEMANTICS.md 45.2)")
    out = dict(values)
    out[("CNA", "WEIGHT_BYTES")] = values[("CNA", "WEIGHT_BYTES")] // 2
    out[("CNA", "WEIGHT_KERNELS")] = values[("CNA", "WEIGHT_KERNELS")] - 1
    width = values[("CNA", "DATA_OUT_WIDTH")]
    out[("CNA", "DATA_OUT_WIDTH")] = (width >> 16) // 2 << 16 | width & 0xFFFF
    out[("CNA", "PAD_VALUE")] = _pad_twin(values[("CNA", "PAD_VALUE")])
    out[("CORE", "MISC_CFG")] = values[("CORE", "MISC_CFG")] | QD_EN
    out[("DPU", "BS_OW_CFG")] = values[("DPU", "BS_OW_CFG")] | OW_CPEND
    brdma = values[("DPU_RDMA", "BRDMA_CFG")]
    out[("DPU_RDMA", "BRDMA_CFG")] = brdma & ~(0xF << USE_SHIFT) | USE_RK3588 << USE_SHIFT
    return out


def _task_memory(values, read) -> tuple[bytes, bytes]:
    """(RK3588's cube, RK3588's record) of a vendor-layout int8 depthwise task (``values``: its vendor words),
    from the vendor's blobs at its weight and BS addresses (``read``: the file as stored)."""
    kernels = values[("CNA", "WEIGHT_KERNELS")]
    taps = ((kernels >> 24 & 0x1F) + 1) * ((kernels >> 16 & 0x1F) + 1)
    weights, record = values[("CNA", "DCOMP_ADDR0")], values[("DPU_RDMA", "BS_BASE_ADDR")]
    return rk3588_memory(read(weights, values[("CNA", "WEIGHT_BYTES")]), read(record, spare_offset(values)), taps,
                         record_channels(values))


def rewrite_memory(values, read, write, where: str) -> None:
    """An own build's int8 depthwise task (``values``: its vendor words) made readable at RK3588 positions:
    RK3588's cube over the vendor's (at the weight address) and RK3588's record at the BS address +
    spare_offset. ``read`` sees the file as stored, ``write`` the image the emulator loads."""
    cube, rk_record = _task_memory(values, read)
    write(values[("CNA", "DCOMP_ADDR0")], cube)
    write(values[("DPU_RDMA", "BS_BASE_ADDR")] + spare_offset(values), rk_record)


def place_memory(values, read, place) -> dict[tuple[str, str], int]:
    """A vendor file's int8 depthwise task (``values``: its vendor words), which leaves no room for RK3588's
    record: RK3588's cube and record each in a buffer of its own (``place(data)`` -> its device address, the
    runner's area past the file's regions); {(block, register): address} for the translated task's weight and
    BS addresses [C: emulator/REGISTER_SEMANTICS.md 47.2]. The file's bytes stay as stored."""
    cube, record = _task_memory(values, read)
    return {("CNA", "DCOMP_ADDR0"): place(cube), ("DPU_RDMA", "BS_BASE_ADDR"): place(record)}
