"""A minimal decoded conv state for timing tests; tests replace the fields they vary."""

from npuemu.emulator.units.state import INT8, ConvState

BASE = ConvState(
    depthwise=False, precision=INT8, argb_channels=0, in_width=1, in_height=1, in_channels=16,
    real_channels=16, feature_address=0, line_stride=16, surface_stride=16, pad_top=0, pad_left=0,
    pad_value=0, stride_x=1, stride_y=1, dilation_x=1, dilation_y=1, kernel_w=1, kernel_h=1, kernels=1,
    weight_address=0, weight_bytes=0, weight_bytes_per_kernel=0, data_bank=1, weight_bank=1,
    data_reuse=False, weight_reuse=False, out_width=1, out_height=1, out_channels=16,
    clip_truncate=0, round_type=0)
