"""Where a tensor lives: its NPU address and NC1HWC2 geometry, as the registers see it.

Feature maps are NC1HWC2 with the atom, surface stride, native shape and address rules of
``npuemu.isa.tensor_layout`` (the layout the emulator's runtime reads back by), C2 from the
platform. Every stride register counts the chip's atom, C2 int8 bytes
(emulator/REGISTER_SEMANTICS.md 9), so a shape gets the same register values on every chip:
``line_stride_atoms`` / ``surface_stride_atoms`` give them. The surface-stride rule is the
vendor's for internal tensors; RKNN keeps graph *inputs* compact (H*W), but our model writer
converts inputs into the placement's layout, so one rule serves every tensor.
A 1-4 channel int8 image may be stored packed with C2 = C, i.e. 3 bytes per pixel
(vendor-corpus 5, rep03; hardware.md 2); the CNA reads it in ARGB mode.

Channel groups beyond ceil(C / C2) may be allocated: a convolution's DPU writes its output
channels rounded up to 32 (64 for depthwise; vendor-corpus 4.3 and tasks.csv DATA_CUBE_CHANNEL),
so its output placement must hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa import tensor_layout
from npuemu.isa.errors import CompileError
from npuemu.isa.tensor_layout import ADDRESS_ALIGN, ATOM_BYTES, surface_atoms
from npuemu.platforms.model import Platform

__all__ = [
    "ADDRESS_ALIGN", "ADDRESS_LIMIT", "ATOM_BYTES", "ConstPlacement", "ELEMENT_BYTES", "PLATFORM_DTYPE", "Placement",
    "TensorPlacement", "align", "check_address", "feature_bytes", "feature_placement", "surface_atoms",
]

ADDRESS_LIMIT = tensor_layout.ADDRESS_SPACE
ELEMENT_BYTES = {"int8": 1, "float16": 2, "int32": 4, "float32": 4}
PLATFORM_DTYPE = {"int8": "int8", "float16": "fp16", "int32": "int32", "float32": "fp32"}


def align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class TensorPlacement:
    """A feature map at ``address``: logical (C, H, W), C2 channels per atom, C1 groups."""

    name: str
    address: int
    shape: tuple[int, int, int]
    dtype: str
    c2: int
    c1: int
    surface_stride: int  # in pixels (atoms) between consecutive C1 groups
    atom_bytes: int = ATOM_BYTES  # the chip's NC1HWC2 atom (C2 int8 bytes): what stride registers count

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(v) for v in self.shape))
        check_address(self.address, f"tensor {self.name}", self.size)
        if self.dtype not in ELEMENT_BYTES:
            raise CompileError(f"tensor {self.name}: dtype {self.dtype!r} has no NPU layout")
        if self.c1 * self.c2 < self.shape[0]:
            raise CompileError(f"tensor {self.name}: C1 {self.c1} x C2 {self.c2} cannot hold {self.shape[0]} channels")

    @property
    def channels(self) -> int:
        return self.shape[0]

    @property
    def height(self) -> int:
        return self.shape[1]

    @property
    def width(self) -> int:
        return self.shape[2]

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def pixel_bytes(self) -> int:
        return self.c2 * self.element_bytes

    @property
    def packed(self) -> bool:
        """True for a first-layer image stored with fewer bytes per pixel than the chip's atom."""
        return self.pixel_bytes < self.atom_bytes

    @property
    def line_bytes(self) -> int:
        return self.width * self.pixel_bytes

    @property
    def surface_bytes(self) -> int:
        return self.surface_stride * self.pixel_bytes

    @property
    def line_stride_atoms(self) -> int:
        """One row in the chip's atoms (the unit of line-stride registers)."""
        return self.line_bytes // self.atom_bytes

    @property
    def surface_stride_atoms(self) -> int:
        """One surface in the chip's atoms (the unit of surface-stride registers)."""
        return self.surface_bytes // self.atom_bytes

    @property
    def size(self) -> int:
        """Bytes reserved, surface padding included."""
        return self.c1 * self.surface_bytes

    @property
    def native_shape(self) -> tuple[int, int, int, int, int]:
        return tensor_layout.native_shape(self.c1, self.height, self.width, self.c2)


@dataclass(frozen=True)
class ConstPlacement:
    """A constant blob (packed weights, bias/requant operands) at ``address``."""

    name: str
    address: int
    size: int

    def __post_init__(self) -> None:
        check_address(self.address, f"constant {self.name}", self.size)


Placement = TensorPlacement | ConstPlacement


def check_address(address: int, what: str, size: int = 0) -> None:
    if isinstance(address, bool) or not isinstance(address, int):
        raise CompileError(f"{what}: address must be an integer, got {address!r}")
    if address % ADDRESS_ALIGN:
        raise CompileError(f"{what}: address {address:#x} is not {ADDRESS_ALIGN}-byte aligned (registers hold bits 31:4)")
    if not 0 <= address or address + size > ADDRESS_LIMIT:
        raise CompileError(f"{what}: [{address:#x}, {address + size:#x}) does not fit the 32-bit NPU address space")


def feature_placement(name: str, address: int, shape: tuple[int, int, int], dtype: str, platform: Platform,
                      *, channel_align: int = 1, packed: bool = False) -> TensorPlacement:
    """The placement of a (C, H, W) feature map on ``platform``.

    ``channel_align`` rounds C up before grouping (a conv output: 32, depthwise: 64, see
    :func:`npuemu.compiler.lower.conv_geometry.output_channel_align`); ``packed`` stores a
    1-4 channel int8 image with C2 = C (first-layer ARGB input).
    """
    channels, height, width = (int(v) for v in shape)
    atom = platform.c2("int8")  # bytes: int8 elements are 1 byte
    if packed:
        if dtype != "int8" or not 1 <= channels <= 4:
            raise CompileError(f"tensor {name}: only 1-4 channel int8 images can be stored packed, got {channels} {dtype}")
        return TensorPlacement(name, address, (channels, height, width), dtype, channels, 1, height * width,
                               atom)
    c2 = platform.c2(PLATFORM_DTYPE[dtype])
    c1 = -(-align(channels, channel_align) // c2)
    surface = surface_atoms(height, width, c2 * ELEMENT_BYTES[dtype])
    return TensorPlacement(name, address, (channels, height, width), dtype, c2, c1, surface, atom)


def feature_bytes(shape: tuple[int, int, int], dtype: str, platform: Platform, *, channel_align: int = 1,
                  packed: bool = False) -> int:
    """Bytes a feature map needs (for the memory plan, before it has an address)."""
    return feature_placement("size", 0, shape, dtype, platform, channel_align=channel_align, packed=packed).size
