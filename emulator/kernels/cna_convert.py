"""The CNA input converter (CVT_CON0..5): int8 features re-based and re-scaled on their way
into the CBUF, before the MAC array (REGISTER_SEMANTICS.md section 36).

Evidence: the vendor's exMatMul of two activations ([V] rknn-fixtures-ops matmul_act_int8 task
82: CVT_BYPASS=0, CVT_TYPE=1, DATA_SIGN=1, ROUND_TYPE=0, offset +3 = -zero point, scale 31932,
truncate 15, the same four groups, CVT_CON5 0xffff). The vendor picks scale / 2^truncate below 1
so that (x + offset) fits int8 again (31932/32768 = 0.9745 ~ 127/130 for a zero point of -3).
Modelled: y = sat_int8(round((x + OFFSET) * SCALE / 2^TRUNCATE)), only the form evidence shows
(see ``InputConvert``); anything else is refused by the decoder with a one-line error.

The image form (``ImageConvert``, REGISTER_SEMANTICS.md 47.1): the vendor's rk3576 image input (CVT_TYPE 0,
DATA_SIGN 0 on packed pixels) normalizes and quantizes raw uint8 pixels per channel,
y_c = sat_int8(round(x_c * SCALE_c / 2^TRUNCATE_c) + OFFSET_c) [V: register values, 45.1; rounding [C], 47.1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import EmulationError


@dataclass(frozen=True)
class InputConvert:
    """One converter setting applied to every channel (all four CVT_CON1..4 groups equal)."""

    offset: int  # CVT_OFFSETn, signed 16 bit
    scale: int  # CVT_SCALEn, unsigned 16 bit
    truncate: int  # CVT_TRUNCATE_n, right shift after the multiply


@dataclass(frozen=True)
class ImageConvert:
    """The converter on packed image pixels with unsigned input: one group per pixel channel (group c = the
    pixel's byte c [I: the vendor writes channel c's mean / std in group c])."""

    offsets: tuple[int, ...]  # CVT_OFFSETc, added after the scaling
    scales: tuple[int, ...]  # CVT_SCALEc
    truncates: tuple[int, ...]  # CVT_TRUNCATE_c


def convert_image_pixels(feature: np.ndarray, convert: ImageConvert) -> np.ndarray:
    """int8 atoms whose first channels hold raw pixel bytes -> those channels normalized and quantized (a new
    array; the other channels as they were). Rounding [C]: the product (never negative) to nearest, ties to
    even, then the offset - no vendor word or document gives it; ties are common (SCALE / 2^TRUNCATE 1/4,
    1/2 for std x scale 4, 2) and the simulator rounds them to even (REGISTER_SEMANTICS.md 47.1)."""
    groups = len(convert.offsets)
    pixels = feature[..., :groups].view(np.uint8).astype(np.int64)
    product = pixels * np.asarray(convert.scales, np.int64)
    shift = np.asarray(convert.truncates, np.int64)
    value, rest = product >> shift, product & ((np.int64(1) << shift) - 1)
    half = np.where(shift > 0, np.int64(1) << np.maximum(shift - 1, 0), 1)   # shift 0: no rest, never up
    value = value + ((rest > half) | ((rest == half) & (value & 1 == 1)))
    out = feature.copy()
    out[..., :groups] = np.clip(value + np.asarray(convert.offsets, np.int64), -128, 127)
    return out


def convert_int8_features(feature: np.ndarray, convert: InputConvert | ImageConvert) -> np.ndarray:
    """int8 feature atoms after the converter (same shape, int8)."""
    if isinstance(convert, ImageConvert):
        return convert_image_pixels(feature, convert)
    value = (feature.astype(np.int64) + np.int64(convert.offset)) * np.int64(convert.scale)
    shift = convert.truncate
    if shift > 0:
        # ROUND_TYPE=0: to nearest [V] section 36 (floor misses the simulator by 1-3 LSB on most
        # outputs); ties away from zero [C] like numerics.rshift_round's ROUND_HALF_AWAY (no
        # vendor build has a tie): floor((v + half) / 2^s), a negative tie kept on the floor side
        value = (value + (1 << (shift - 1)) + (value >> 63)) >> shift
    return np.clip(value, -128, 127).astype(np.int8)


#: ARGB_IN of a plain NC1HWC2 feature (on image input only the vendor rk3576 image form is modelled)
_NC1HWC2 = 0
_IMAGE_FORM = (0, 0, 0)  # CVT_TYPE, DATA_SIGN (unsigned pixels), ROUND_TYPE [V: REGISTER_SEMANTICS.md 45.1]
_GROUPS = 4
_ARGB_ONE = 8  # ARGB_IN of a 1-channel image (8..11: 1..4 channels, units/cna_core.py)
_INT8 = 0  # CNA IN_PRECISION code of int8 (units/state.py)


def decode_input_convert(cna, feature_precision: int, argb_in: int, where: str) -> InputConvert | ImageConvert:
    """The converter setting of a CNA register view (``.field``/``.show``) whose CVT_BYPASS is 0;
    EmulationError naming the field for any form the evidence does not pin (sections 36, 47.1)."""
    con0 = cna.fields("CVT_CON0")

    def refuse(detail: str) -> EmulationError:
        return EmulationError(f"{where}: {cna.show('CVT_CON0')} enables the CNA input converter, which is "
                              f"not modelled {detail}")
    if feature_precision == _INT8 and argb_in != _NC1HWC2 and \
            (con0["CVT_TYPE"], con0["DATA_SIGN"], con0["ROUND_TYPE"]) == _IMAGE_FORM:
        channels = min(_GROUPS, argb_in - _ARGB_ONE + 1)   # group c converts the pixel's byte c
        return ImageConvert(*zip(*((cna.field(f"CVT_CON{n + 1}", f"CVT_OFFSET{n}"),
                                    cna.field(f"CVT_CON{n + 1}", f"CVT_SCALE{n}"), con0[f"CVT_TRUNCATE_{n}"])
                                   for n in range(channels))))
    if feature_precision != _INT8 or argb_in != _NC1HWC2:
        raise refuse("on a non-int8 or image input (int8 NC1HWC2 features only)")
    for name, wanted in (("CVT_TYPE", 1), ("DATA_SIGN", 1), ("ROUND_TYPE", 0)):
        if con0[name] != wanted:
            raise refuse(f"with {cna.show('CVT_CON0', name)} (only {name}={wanted} is evidenced)")
    if cna.field("CVT_CON5", "PER_CHANNEL_CVT_EN") != 0xFFFF:
        raise refuse(f"with {cna.show('CVT_CON5')} (only 0xffff, every channel converted)")
    groups = {(cna.field(f"CVT_CON{n + 1}", f"CVT_OFFSET{n}"), cna.field(f"CVT_CON{n + 1}", f"CVT_SCALE{n}"),
               con0[f"CVT_TRUNCATE_{n}"]) for n in range(4)}
    if len(groups) != 1:
        raise refuse("with CVT_CON1..4 / CVT_TRUNCATE_0..3 differing between the four groups (their "
                     "channel mapping is unknown)")
    offset, scale, truncate = groups.pop()
    return InputConvert(offset=offset, scale=scale, truncate=truncate)


def check_convert_geometry(state, where: str) -> None:
    """Refuse padding with the converter on: whether PAD_VALUE is converted is not evidenced - but for the
    image form, whose PAD_VALUE is the converted input's zero point in every vendor build [V 45.1: 127 with
    zero point 127, -68 / -14 / -128 with theirs], so the pads are not converted [I]."""
    if isinstance(getattr(state, "input_convert", None), ImageConvert):
        return
    span_x = (state.out_width - 1) * state.stride_x + (state.kernel_w - 1) * state.dilation_x + 1
    span_y = (state.out_height - 1) * state.stride_y + (state.kernel_h - 1) * state.dilation_y + 1
    if state.pad_top or state.pad_left or span_x > state.in_width or span_y > state.in_height:
        raise EmulationError(f"{where}: the CNA input converter with padding is not modelled "
                             f"(whether the pad value is converted is not evidenced)")
