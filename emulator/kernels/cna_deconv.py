"""The CNA's deconvolution mode (CONV_CON1.DECONV = 1): a transposed convolution as one task.

What it computes (REGISTER_SEMANTICS.md 40): the CNA spreads the input cube it fetched,
DECONV_Y/X_STRIDE + 1 pixels apart, the pixels in between holding the pad value
(PAD_CON1, the input's zero point) like the border; the CORE then runs an ordinary direct
convolution over the spread cube with the task's PAD_CON0 (k - 1 - p), its CONV stride (1)
and the weights as stored (the toolkit stores the ONNX kernel already flipped, so there is
no flip here). [V] rknn-toolkit2 2.5.0 rk3588 builds of ConvTranspose k4 s2 p1 and k2 s2 p0
(int8 and fp16): bit-identical to the vendor's simulator with this reading
(tests/emulator/test_vendor_deconv.py).
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import EmulationError

#: CNA precisions the mode is modelled for: int8 (0) and fp16 (2), the forms seen [V]
DECONV_PRECISIONS = (0, 2)


def decode_deconv(cna, where: str) -> tuple[int, int] | None:
    """(stride_y, stride_x) the input is spread by, or None when CONV_CON1.DECONV is 0.

    The fields hold stride - 1 [I]: every vendor stride-2 ConvTranspose writes 1 with
    DATAIN 8x8 and DATAOUT 16x16, which only a stride of 2 fits (the vendor lowers stride 3
    without this mode, so no other value has been seen)."""
    if not cna.field("CONV_CON1", "DECONV"):
        return None
    return cna.field("CONV_CON3", "DECONV_Y_STRIDE") + 1, cna.field("CONV_CON3", "DECONV_X_STRIDE") + 1


def check_deconv(state, cna, where: str) -> None:
    """Refuse, by name, the deconvolution forms not modelled (none of them seen in a vendor build)."""
    refused = []
    if state.depthwise:
        refused.append(cna.show("CONV_CON1", "CONV_MODE") + " (depthwise)")
    if state.argb_channels:
        refused.append(cna.show("CONV_CON1", "ARGB_IN") + " (image input)")
    if state.feature_type not in DECONV_PRECISIONS or state.weight_type != state.feature_type:
        refused.append(f"{cna.show('CONV_CON1', 'IN_PRECISION')}, {cna.show('CONV_CON1', 'PROC_PRECISION')} "
                       f"(int8 or fp16 only)")
    if state.decompress is not None:
        refused.append(cna.show("DCOMP_CTRL", "DECOMP_CONTROL") + " (sparse weights)")
    if state.input_convert is not None:
        refused.append(cna.show("CVT_CON0", "CVT_BYPASS") + " (input converter)")
    if (state.stride_y, state.stride_x) != (1, 1):
        refused.append(f"{cna.show('CONV_CON3', 'CONV_Y_STRIDE')}, {cna.show('CONV_CON3', 'CONV_X_STRIDE')} "
                       f"(the vendor's deconvolutions convolve at stride 1)")
    if (state.dilation_y, state.dilation_x) != (1, 1):
        refused.append(cna.show("CONV_CON3", "ATROUS_Y_DILATION") + " / ATROUS_X_DILATION (dilation)")
    if refused:
        raise EmulationError(f"{where}: CNA.CONV_CON1.DECONV=1 with {'; '.join(refused)} is not modelled")


def spread_size(height: int, width: int, strides: tuple[int, int]) -> tuple[int, int]:
    """Rows and columns of the spread cube the CORE convolves."""
    return (height - 1) * strides[0] + 1, (width - 1) * strides[1] + 1


def spread(feature: np.ndarray, strides: tuple[int, int], pad_value) -> np.ndarray:
    """The fetched atoms [S][H][W][C2] spread to [S][(H-1)*sy+1][(W-1)*sx+1][C2], the new
    pixels holding the pad value (every lane, as the border padding)."""
    surfaces, height, width, c2 = feature.shape
    rows, columns = spread_size(height, width, strides)
    out = np.full((surfaces, rows, columns, c2), pad_value, feature.dtype)
    out[:, ::strides[0], ::strides[1]] = feature
    return out
