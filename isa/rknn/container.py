"""The outer layout of a vendor ``.rknn`` file (format 6), checked before anything is parsed.

::

    0   "RKNN"      4 bytes magic
    4   u32         0
    8   u64         format version (6 for the rk35xx targets)
    16  u64         length of the model data (the FlatBuffer) that starts at byte 64
    24  40 bytes    0 (format 6 only; older formats had a 24-byte header)
    64  FlatBuffer  file identifier "RKNN"
        u64         JSON length
        JSON        a small description of the graph (no quantisation data)

Sources: the fixtures README ("Loading a .rknn"), rknn-relocation.md §8 step 1 and
seeds/rknn_file_format_zh.md. RV1106/RV1103 builds (format 0x1004) carry a binary preamble
before their FlatBuffer (rknn-relocation.md §7) and are refused with a clear message.
"""

from __future__ import annotations

import json
import logging
import struct
from typing import Any

from npuemu.isa.errors import ModelFileError
from npuemu.isa.rknn.model import RknnContainer

logger = logging.getLogger(__name__)

MAGIC = b"RKNN"
HEADER_SIZE = 64
SUPPORTED_FORMAT = 6
RV1106_FORMAT = 0x1004
_HEADER = struct.Struct("<4sIQQ")
_U64 = struct.Struct("<Q")


def read_container(data: memoryview, source: str) -> tuple[RknnContainer, memoryview, dict[str, Any]]:
    """Split a whole file into its container description, FlatBuffer view and decoded JSON."""
    size = len(data)
    if size < _HEADER.size:
        raise ModelFileError(f"{source}: {size} bytes is too short for an .rknn header ({HEADER_SIZE} bytes)")
    magic, padding, version, length = _HEADER.unpack_from(data, 0)
    _check_magic(magic, source)
    _check_version(version, source)
    if size < HEADER_SIZE:
        raise ModelFileError(f"{source}: {size} bytes is too short for the format-6 header ({HEADER_SIZE} bytes)")
    if padding or any(data[_HEADER.size:HEADER_SIZE]):
        logger.warning("%s: reserved header bytes 4..7 / 24..63 are not zero; ignoring them", source)
    json_length_at = HEADER_SIZE + length
    if length < 8 or json_length_at + 8 > size:
        raise ModelFileError(
            f"{source}: header at offset 16 claims {length} bytes of model data; a {size}-byte file has room for "
            f"at most {max(size - HEADER_SIZE - 8, 0)} (plus the 8-byte JSON length), and at least 8 are needed")
    json_length = _U64.unpack_from(data, json_length_at)[0]
    json_at = json_length_at + 8
    if json_at + json_length != size:
        raise ModelFileError(
            f"{source}: JSON length at offset {json_length_at:#x} is {json_length}, but {size - json_at} bytes "
            f"follow it up to the end of the file")
    trailer = _decode_json(data[json_at:], source, json_at)
    container = RknnContainer(version, size, HEADER_SIZE, HEADER_SIZE, length, json_at, json_length)
    return container, data[HEADER_SIZE:json_length_at], trailer


def _check_magic(magic: bytes, source: str) -> None:
    if magic == MAGIC:
        return
    hint = " (an npuemu .npu file? open it with npuemu.isa.container)" if magic == b"NPUE" else ""
    raise ModelFileError(f"{source}: offset 0: magic is {magic!r}, expected {MAGIC!r} for an .rknn file{hint}")


def _check_version(version: int, source: str) -> None:
    if version == SUPPORTED_FORMAT:
        return
    if version & 0xFFFF_FFFF == RV1106_FORMAT:   # however the upper half of the field is used there
        raise ModelFileError(
            f"{source}: offset 8: format {version:#x} (RV1106/RV1103 builds) is not supported: its binary "
            f"preamble and graph tables are undecoded; only format {SUPPORTED_FORMAT} "
            f"(RK3588/RK3576/RK3568/RK3566/RK3562 builds) can be loaded")
    raise ModelFileError(f"{source}: offset 8: unsupported .rknn format version {version:#x}; "
                         f"only format {SUPPORTED_FORMAT} can be loaded")


def _decode_json(raw: memoryview, source: str, offset: int) -> dict[str, Any]:
    try:
        value = json.loads(bytes(raw).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{source}: JSON trailer at offset {offset:#x}: not UTF-8 "
                             f"({exc.reason} at byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise ModelFileError(f"{source}: JSON trailer at offset {offset:#x}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ModelFileError(f"{source}: JSON trailer at offset {offset:#x}: expected an object, "
                             f"found {type(value).__name__}")
    return value
