"""Numba kernels the NPU units call: layouts, weight fetch, MAC array, DPU, LUT, PPU.

They take plain arrays in the hardware's layouts and decoded register values; the arithmetic
they apply is defined once in ``npuemu.emulator.numerics`` (see ``NUMERICS.md``).
"""

# before any kernel module (and numerics, which they import) decorates: their Numba caches are
# made at first use (emulator/numba_deferred_cache.py)
from npuemu.emulator import numba_deferred_cache

numba_deferred_cache.install()

from npuemu.emulator.kernels.dpu import (
    EwConfig,
    OutCvtConfig,
    XStageConfig,
    bn_stage,
    bn_stage_fp,
    bs_stage,
    bs_stage_fp,
    ew_stage,
    ew_stage_fp,
    out_cvt,
    out_cvt_fp16,
)
from npuemu.emulator.kernels.fp16 import fp16_to_fp32, fp32_to_fp16
from npuemu.emulator.kernels.layout import (
    DEPTHWISE_OUTPUT_CHANNEL_ALIGN,
    channel_groups,
    nc1hwc2_to_nchw,
    nc1hwc2_to_nhwc,
    nchw_to_nc1hwc2,
    nhwc_to_nc1hwc2,
)
from npuemu.emulator.kernels.lut import LutConfig, LutTableConfig, lut_stage, lut_stage_fp
from npuemu.emulator.kernels.mac import ConvGeometry, conv2d_fp16, fetch_padded_input
from npuemu.emulator.kernels.ppu import PoolConfig, pool_nc1hwc2
from npuemu.emulator.kernels.weights import (
    FP16_CONV_RK3588,
    FP16_DEPTHWISE_RK3588,
    INT8_CONV_RK3566,
    INT8_CONV_RK3588,
    INT8_DEPTHWISE_RK3588,
    ConvWeightLayout,
    DepthwiseWeightLayout,
    pack_conv_weights,
    pack_depthwise_weights,
    unpack_conv_weights,
    unpack_depthwise_weights,
)

from npuemu.emulator.kernels import conv_pixels, depthwise, dpu, fp16, layout, lut, mac, ppu, weights
from npuemu.emulator.kernels.scipy_blas import preload_before_numpy_support
from npuemu.emulator.kernels.stale_cache import drop_caches_built_on_old_sources

drop_caches_built_on_old_sources([conv_pixels, depthwise, dpu, fp16, layout, lut, mac, ppu, weights])
# before Numba's BLAS check (its NumPy support's import): it then skips scipy.linalg
preload_before_numpy_support()

__all__ = [
    "DEPTHWISE_OUTPUT_CHANNEL_ALIGN", "FP16_CONV_RK3588", "FP16_DEPTHWISE_RK3588",
    "INT8_CONV_RK3566", "INT8_CONV_RK3588", "INT8_DEPTHWISE_RK3588", "ConvGeometry",
    "ConvWeightLayout", "DepthwiseWeightLayout", "EwConfig", "LutConfig", "LutTableConfig",
    "OutCvtConfig", "PoolConfig", "XStageConfig", "bn_stage", "bn_stage_fp", "bs_stage",
    "bs_stage_fp", "channel_groups", "conv2d_fp16", "ew_stage", "ew_stage_fp",
    "fetch_padded_input", "fp16_to_fp32", "fp32_to_fp16", "lut_stage", "lut_stage_fp", "nc1hwc2_to_nchw",
    "nc1hwc2_to_nhwc", "nchw_to_nc1hwc2", "nhwc_to_nc1hwc2", "out_cvt", "out_cvt_fp16",
    "pack_conv_weights", "pack_depthwise_weights", "pool_nc1hwc2", "unpack_conv_weights",
    "unpack_depthwise_weights",
]
