"""Convs that read one weight constant store its packed blob once (LOWERING.md 30.1).

An unrolled LSTM (passes/lstm_npu.py) has every step's gate conv read the same graph constant;
packed separately, T steps would store T copies. Two convs share a stored blob only when they
read the same graph weight tensor *and* their packed bytes are equal (so layout, precision and
tiling match too); their bias blobs are shared the same way. Convs reading different tensors
never share, even when the bytes happen to be equal, so builds without shared weight tensors
are unchanged. The weights area is read-only at run time, so one copy serves every reader.
"""

from __future__ import annotations

from npuemu.compiler.lower import ConvLayer
from npuemu.compiler.lower.driver import as_conv


def weight_readers(records) -> dict[str, list]:
    """Graph weight tensor -> the conv layers (with constant weight blobs) that read it."""
    readers: dict[str, list] = {}
    for node, record in zip(records.nodes, records.records):
        layer = as_conv(record)
        if not isinstance(layer, ConvLayer) or layer.weight_source or len(node.inputs) < 2:
            continue
        tensor = records.graph.tensors.get(node.inputs[1])
        if tensor is not None and tensor.is_const:
            readers.setdefault(tensor.name, []).append(layer)
    return readers


def share_constants(records, constants: dict[str, bytes]) -> dict[str, str]:
    """Drop from ``constants`` the blobs an earlier reader of the same weight tensor already
    stores with equal bytes; the answer maps each dropped name to the name that stores it."""
    shared: dict[str, str] = {}
    for layers in weight_readers(records).values():
        if len(layers) < 2:
            continue
        stored: dict[bytes, str] = {}
        for layer in layers:
            for name in (layer.weight_tensor, layer.bias_tensor):
                blob = constants.get(name)
                if blob is None or name in shared:
                    continue
                keep = stored.setdefault(blob, name)
                if keep != name:
                    shared[name] = keep
                    del constants[name]
    return shared


__all__ = ["share_constants", "weight_readers"]
