"""An fp16 CNA step whose weights are fetched every run (issue 20, fixed cost per task).

A task program's CNA step (units/cna_core.py ``_cna_step``) whose weights the chain writes every run
(an fp16 MatMul's activation operand: ppocr_rec runs 144 a run, most of them 1x1 products of
8 x 40 planes) unpacks them from the bytes as they are now (``_weights_fetcher``) and ran
``fetch_padded_input`` then ``conv2d_fp16`` on them: per call its operand checks, the layout of the
products (``gemm_layout``: a function of the shapes alone), four fresh buffers and the zero rows
for kernels past the weights (``_pad_channels``) - most of each such task's ~10 us. Here all of
that is worked out once per step for the one weight shape it fetches; a run widens the weights,
packs them (``mac._pack_groups``) and runs ``gemm_products`` into the step's own accumulators, the
calls ``conv2d_fp16`` makes (the same bits: every sum is +0 then its products k after k, NUMERICS.md
3.3, whatever the buffers; rows past the weights stay 0).
Only the grouped GEMM form is taken (``_use_direct`` False); anything else, or a run whose
feature or weights are not the shapes prepared for, takes the plain calls.
The result is the step's own array, refilled by each run: the DPU step that follows reads it at
once and nothing keeps it (a CoreResult is never cached).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels import mac


def prepare_fetched_fp16(feature_shape: tuple, channels: int, weight_shape: tuple, geometry: mac.ConvGeometry,
                         pad_value: float, out_channels: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """``run(feature, weights) -> float32 [out_channels][OH][OW]``: ``fetch_padded_input`` then
    ``conv2d_fp16`` (rows past the weights' kernels 0) for float16 ``weights`` of ``weight_shape``
    and float16 atoms of ``feature_shape``, or None where the plain calls are taken (see the module
    docstring). ``run`` returns None for operands of other shapes or types (the caller's plain path)."""
    if len(weight_shape) != 4 or len(feature_shape) != 4 or not 0 < weight_shape[0] <= out_channels \
            or not 0 < channels <= feature_shape[0] * feature_shape[3]:
        return None
    probe = np.empty(weight_shape, np.float16)
    if mac._use_direct(probe, geometry, "auto"):
        return None
    planes_shape = (channels, geometry.padded_h, geometry.padded_w)
    if not mac.operands_fit(planes_shape, probe, geometry):
        return None
    groups, kernels = geometry.groups, weight_shape[0]
    layout = mac.gemm_layout(probe.reshape(groups, kernels // groups, -1), geometry, planes_shape)
    columns = None if layout.columns is None else np.empty(layout.columns, np.float32)
    wide = None if layout.wide is None else np.empty(layout.wide, np.float32)
    phases = None if layout.phases is None else np.empty(layout.phases, np.float32)
    out = np.zeros((out_channels, geometry.out_h, geometry.out_w), np.float32)
    acc = out.reshape(out_channels, -1)[:kernels]  # (_conv_gemm's accumulators: same shape and strides)

    def run(feature: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
        if weights.shape != weight_shape or weights.dtype != np.float16 or feature.shape != feature_shape \
                or feature.dtype != np.float16:
            return None
        padded = np.ascontiguousarray(mac.fetch_padded_input(feature, channels, geometry, pad_value))
        packed = mac._pack_groups(weights.reshape(groups, kernels // groups, -1).astype(np.float32), layout.narrow)
        mac.gemm_products(padded, geometry, packed, layout, acc, columns, wide, phases)
        return out

    return run
