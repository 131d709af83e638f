"""The vendor's own rk3576 sparse ``.rknn`` files along output channels and 16:4 run on the emulator
(compiler/LOWERING.md 44, emulator/REGISTER_SEMANTICS.md 44).

Fixtures in ``tests/data/sparse_vendor/`` (how they were made: the README there): rknn-toolkit2
2.5.0 int8 builds (``config(target_platform="rk3576", sparse_infer=True)``) of one ONNX Conv on
1 x C x 8 x 8, weights k / 127 with a 127 in every kernel (so the stored int8 values are k):

- ``out_4_2_64x32``: Conv 1x1 32 -> 64, 4:2 along output channels (build log "method 1", 50%(OC));
- ``16_4_32x32``: Conv 1x1 32 -> 32, 2 kernels x 2 channels per 4 x 4 tile ("method 3", 75%);
- ``*_dense``: the same ONNX built with the environment variable ``RKNN_CONV_WEIGHT_SPARSE=0`` as
  well, which gives a dense build ("0%") with the sparse build's quantization (BS record, weight
  scales and output words identical; a build with ``sparse_infer=False`` quantizes the weights
  differently, so it is no twin);
- ``runs.npz.xz``: the vendor simulator's output (``init_runtime(); inference``, after the sparse
  build) on ``2 * RandomState(0).randn(1, C, 8, 8)`` as int8 codes ``rint(y / scale) + zp``. The
  dense twins' simulator outputs are identical to these.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_pack import check_round_trip, vendor_writes
from npuemu.isa.rknn.rk3576_program import translate_task
from npuemu.isa.words import encode_write

DATA = Path(__file__).resolve().parents[1] / "data" / "sparse_vendor"
VENDOR, RK3576 = load_regmap("rk3576_vendor"), load_regmap("rk3576")
#: name -> (input channels, output channels, CORE 0x3018 mode, npuemu's DECOMP_CONTROL)
CASES = {"out_4_2_64x32": (32, 64, 2, 6), "16_4_32x32": (32, 32, 3, 7)}
SHIFT = b"\x0e\x0e"   # the BS shift word of every vendor int8 build (rk3576_layout.bs_shift)
with lzma.open(DATA / "runs.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    SIM = {name: _archive[name] for name in _archive.files}


def _bytes(name: str) -> bytes:
    return lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes())


def _run(data: bytes, channels: int) -> np.ndarray:
    x = (np.random.RandomState(0).randn(1, channels, 8, 8) * 2).astype(np.float32)
    (_, out), = RknnRunner(load_rknn(data, "sparse"), "rk3576", (0,)).run([x]).quantized.items()
    return np.asarray(out).astype(np.int64)


def _conv_task(name: str, data: bytes | None = None):
    model = load_rknn(data or _bytes(name), name)
    program = model.program
    record = program.tasks[program.chains[0].tasks[0]]
    words = program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]
    return words, read_task(words, VENDOR, name, record.enable_mask)


@pytest.mark.parametrize("name", CASES)
def test_vendor_sparse_file_runs_bit_identically_to_its_dense_twin(name):
    cin = CASES[name][0]
    sparse, dense = _run(_bytes(name), cin), _run(_bytes(f"{name}_dense"), cin)
    np.testing.assert_array_equal(sparse, dense)
    assert len(np.unique(sparse)) > 50   # a real output, not a constant


@pytest.mark.parametrize("name", CASES)
def test_vendor_sparse_file_against_the_simulator(name):
    """measured: 16:4 all identical; along output channels 99.8 % identical, 1 LSB otherwise - the
    dense twin's emulated output is the same (previous test), so that is the conv's requantization
    (REGISTER_SEMANTICS.md 10.3), not the weights."""
    ours = _run(_bytes(name), CASES[name][0]).ravel()
    sim = SIM[f"{name}.sim"].astype(np.int64).ravel()
    assert np.abs(ours - sim).max() <= 1
    assert np.mean(ours == sim) >= (1.0 if name.startswith("16_4") else 0.995)


@pytest.mark.parametrize("name", CASES)
def test_translation_names_the_mode_and_gives_the_dense_sizes(name):
    """npuemu's RK3588-position form: DECOMP_CONTROL 6 / 7, every kernel, half the dense sizes
    (isa/sparse_layout.py); the DPU in the dense conv's order (SIZE_E 1, SURF_ADD 2 surfaces)."""
    cin, cout, mode, control = CASES[name]
    _, task = _conv_task(name)
    assert task.field("CORE", "MISC_CFG", "SPARSE_MODE") == mode
    back = {(b, n): v for b, n, v in translate_task(task, RK3576, lambda address, size: SHIFT[:size])}

    def field(block, register, name_):
        return RK3576.register(block, register).field(name_).extract(back[(block, register)])

    assert field("CNA", "DCOMP_CTRL", "DECOMP_CONTROL") == control
    assert field("CNA", "WEIGHT_SIZE2", "WEIGHT_KERNELS") == cout
    assert field("CNA", "WEIGHT_SIZE1", "WEIGHT_BYTES_PER_KERNEL") == cin // 2          # 1x1 int8, halved
    assert field("CNA", "WEIGHT_SIZE0", "WEIGHT_BYTES") == cout * cin // 2
    assert [field("DPU", "BS_OW_CFG", f"SIZE_E_{i}") for i in range(3)] == [1, 1, 1]
    assert field("DPU", "SURFACE_ADD", "SURF_ADD") == 2 * field("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")


@pytest.mark.parametrize("name", CASES)
def test_repacking_the_translation_gives_the_vendors_words(name):
    """The inverse (rk3576_pack, what npuemu's own builds emit): the RK3588 form packs back into the
    vendor's 139 words, word for word in its order, and passes the round-trip proof."""
    words, task = _conv_task(name)
    back = {(b, n): v for b, n, v in translate_task(task, RK3576, lambda address, size: SHIFT[:size])}
    writes = vendor_writes(back, RK3576, shift_address=task.raw("DPU_RDMA", "BS_CFG_ADDR"), where=name)
    assert [encode_write(VENDOR, b, n, v) for b, n, v in writes] == [int(w) for w in words]
    check_round_trip(back, RK3576, VENDOR, writes, int.from_bytes(SHIFT, "little"), name)


def _patched(name: str, offset: int, change) -> bytes:
    """The file with the first conv task's word at ``offset`` rewritten by ``change(value)``."""
    data = bytearray(_bytes(name))
    words, _ = _conv_task(name)
    word = next(int(w) for w in words if int(w) & 0xFFFF == offset)
    position = data.find(word.to_bytes(8, "little"))
    assert position > 0
    value = change((word >> 16) & 0xFFFFFFFF)
    data[position + 2:position + 6] = value.to_bytes(4, "little")
    return bytes(data)


@pytest.mark.parametrize("offset, change, message", [
    (0x4030, lambda v: (v & ~0xFFFF) | 0x710, "DPU output order"),            # direct order with kept rows
    (0x3018, lambda v: (v & ~0x3000) | 0x1000, "sparse words disagree"),      # CORE says input channels
])
def test_inconsistent_sparse_words_are_refused_by_name(offset, change, message):
    data = _patched("out_4_2_64x32", offset, change)
    with pytest.raises(UnsupportedProgramError, match=message):
        RknnRunner(load_rknn(data, "patched"), "rk3576", (0,))
