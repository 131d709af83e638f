"""``from npuemu.api import RKNN``: rknn-toolkit2's Python API on npuemu's compiler and emulated
NPU (tools/api/rknn.py; guide 3.1-3.2, 4.1, 6.3). README.md, "Coming from rknn-toolkit2", maps each vendor method
to what npuemu does and lists what differs."""

from .rknn import RKNN

__all__ = ["RKNN"]
