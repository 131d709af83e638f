"""NPU (MAC array) cycles of one task from its decoded CNA/CORE state: model H1.

Source: ../shared/docs/vendor-corpus/README.md §4.1 (exact on all 1240 conv-type rows of
librknnc's static estimates)::

    P = ceil(OH*OW / 16) * 16
    normal conv (Cin > 1):  P * ceil(Cout / K) * max(kh*kw*ceil(Cin / 32), F)
    Cin == 1:               P * kh*kw
    depthwise:              P * ceil(C / G) * kh*kw

The figures 16, 32, K (int8), G and 4 come from the platform's ``cycle_model`` group; K scales
with the dtype's MAC rate (``macs`` group: fp16 has half the int8 rate, so K = 16 on rk3588,
README §4.1 "halved for FLOAT16 layers").

The floor F (issue 24) scales with K: ``F = min_taps_per_pass * K / K_int8`` - 4 in int8, 2 in
fp16 on rk3588. The floor is not a MAC limit but an output-side one: a pass over 16 pixels x K
kernels yields 16*K partial sums, and the floor holds that block for at least F cycles, i.e. at
most 16*32/4 = 128 sums per cycle in int8 and 16*16/2 = 128 in fp16 - the same drain rate
(both precisions accumulate in 32 bits) [inferred]. Source: the 89 fp16 conv rows of
../shared/docs/vendor-fp16/ (MobileNetV2 54, ResNet-18 35), the 31 conv rows of the fp16
fixtures of ../shared/rknn-fixtures-ops/ and the corpus's 4 rk3576 FLOAT16 rows are exact with
it (tests/emulator/test_timing_fp16.py); with F = 4
every fp16 1x1 conv with Cin <= 96 came out 2x (16->96 at 112x112: 301056 vs the vendor's
150528). In int8 K = K_int8, so F = min_taps_per_pass and nothing changes.

Everything is read from the task's registers:
OH/OW = CORE DATAOUT_WIDTH/HEIGHT, Cin = CNA DATAIN_CHANNEL_REAL, Cout = CNA WEIGHT_KERNELS,
kh/kw = CNA WEIGHT_WIDTH/HEIGHT, depthwise = CNA CONV_MODE 3, precision = CNA PROC_PRECISION.

Tasks with no CNA/CORE (DPU-only element-wise, PPU pooling) get 0 NPU cycles here, as in the
vendor's estimator (README §4.1: those layers report 0/0/0); their time is their DDR time.
"""

from __future__ import annotations

from npuemu.emulator.units.state import PRECISION_NAMES, ConvState
from npuemu.isa.errors import EmulationError


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def atom_k(precision: int, platform) -> int:
    """Kernels per MAC pass (ATOM_K) for a precision: the int8 figure scaled by the MAC rate."""
    name = PRECISION_NAMES.get(precision)
    rate = getattr(platform.macs, name, None) if name else None
    if not rate:
        raise EmulationError(f"{platform.name}: no MAC rate for conv precision {name or precision} "
                             f"(platform YAML group 'macs')")
    k = platform.cycle_model.atom_k_int8 * rate // platform.macs.int8
    return max(1, k)


def min_passes(k: int, platform) -> int:
    """The floor F of cycles per 16-pixel x K-kernel pass: ``min_taps_per_pass`` scaled with K
    (a fixed output drain rate of 16*K_int8/min_taps sums per cycle; module docstring)."""
    model = platform.cycle_model
    return max(1, _ceil_div(model.min_taps_per_pass * k, model.atom_k_int8))


def conv_npu_cycles(conv: ConvState, platform) -> int:
    """Model H1 for one CNA/CORE task."""
    model = platform.cycle_model
    pixels = _ceil_div(conv.out_height * conv.out_width, model.pixel_granule) * model.pixel_granule
    taps = conv.kernel_h * conv.kernel_w
    if conv.depthwise:
        return pixels * _ceil_div(conv.out_channels, model.depthwise_group) * taps
    cin = conv.real_channels if conv.real_channels > 0 else conv.in_channels
    if cin == 1:
        return pixels * taps
    k = atom_k(conv.precision, platform)
    passes = max(taps * _ceil_div(cin, model.input_channel_group), min_passes(k, platform))
    return pixels * _ceil_div(conv.kernels, k) * passes


def task_npu_cycles(record, platform) -> int:
    """NPU cycles of a :class:`~npuemu.emulator.core.TaskRecord` (0 without a conv)."""
    return conv_npu_cycles(record.conv, platform) if record.conv is not None else 0
