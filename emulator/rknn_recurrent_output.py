"""Where the vendor's exGRU / exLSTM leave their output (REGISTER_SEMANTICS.md 38).

The layer's output tensor y (NC1HWC2, e.g. gru native [16, 1, 1, 64, 8]) is named by no
relocation entry: no task writes it. The tasks copy each step's h_t, one NONALIGN row of
hidden-size values, into the layer's internal tensor ``x_exSecondary2`` at 128-byte steps (gru task
19 and its 15 repeats: DST relocated to x_exSecondary2 + 0, 128, ..., 1920), so that buffer holds
the whole Y sequence in graph order, [seq][hidden] - exactly y's elements, in its dtype [V: the
buffer's bytes equal y's element count x itemsize in gru_int8/_fp16 (fp16) and lstm_int8 (int8);
its contents match the vendor simulator's y within the NUMERICS 28 tolerance]. [C] The runner
therefore reads such an output from that buffer, as plain graph-order values, the vendor runtime's
copy out of it being invisible to the program. The buffer is found structurally: among the layer's
internal inputs, the one tensor some relocation entry names whose byte size equals y's (several: the
vendor's ``_exSecondary2``); none is refused by name. The input's atom-row copy: :func:`input_rows`.
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import ModelFileError
from npuemu.isa.rknn.model import Region, RknnModel, RknnTensor

#: the vendor's recurrent layers whose output is left in a sequence buffer
RECURRENT_OPS = frozenset({"exGRU", "exLSTM"})
#: the vendor's names of the layer's internal copies of its input x: "<x>_exSecondary1" (x in atom rows)
#: and "<x>_exSecondary2" (the output sequence) [V: all six gru / lstm builds, fixtures and chosen]
INPUT_SUFFIX, SEQUENCE_SUFFIX = "_exSecondary1", "_exSecondary2"
ATOM_BYTES = 16


def sequence_buffer(model: RknnModel, tensor: RknnTensor, itemsize: int) -> RknnTensor | None:
    """The tensor holding output ``tensor``'s values in graph order (module note), or None when
    ``tensor`` is written by the program itself (any other layer's output)."""
    named = {entry.tensor_name for entry in model.relocations}
    if tensor.name in named:
        return None
    layers = [layer for layer in model.layers if tensor.index in layer.outputs and layer.op_type in RECURRENT_OPS]
    if not layers:
        return None
    by_index = {t.index: t for t in model.tensors}
    wanted = int(np.prod(tensor.shape)) * itemsize
    found = [by_index[i] for i in layers[0].inputs
             if i in by_index and by_index[i].name in named and by_index[i].size == wanted
             and by_index[i].region is Region.INTERNAL and by_index[i].name != tensor.name]
    if len(found) > 1:  # same sizes (lstm int8, hidden 16): the vendor's name for the sequence buffer
        found = [t for t in found if t.name.endswith(SEQUENCE_SUFFIX)]
    if len(found) != 1:
        names = ", ".join(t.name for t in found) or "none"
        raise ModelFileError(f"{model.source}: output {tensor.name!r} of {layers[0].name} is written by no task and "
                             f"its sequence buffer is ambiguous ({names} of {wanted} bytes; rknn_recurrent_output.py)")
    return found[0]


def read_sequence(buffer_address: int, tensor: RknnTensor, dtype: np.dtype, dump) -> np.ndarray:
    """The output's values from its sequence buffer: ``dump(address, nbytes)`` -> uint8 bytes."""
    count = int(np.prod(tensor.shape))
    return dump(buffer_address, count * dtype.itemsize).view(dtype).reshape(tensor.shape).copy()


def input_rows(model: RknnModel, tensor: RknnTensor, values: np.ndarray) -> tuple[RknnTensor, np.ndarray] | None:
    """The recurrent layer's atom-row copy of graph input ``tensor`` and its bytes, or None.

    [V: a chosen lstm int8 build, hidden 16, input 8, 4 steps (tests/data/vendor_recurrent): its gate convs
    read the feature from ``x_exSecondary1`` (64 bytes = 4 rows x one 16-byte atom, DATAIN_CHANNEL 16, REAL 8),
    which no task writes; with it left 0 the run's h was far off, with x's rows there it is the simulator's
    within the fixtures' tolerance.] [I] The runtime writes x there as rows of one atom each, the channels
    padded with 0 - the native form of a [rows][C] tensor with C <= the atom's lanes. In the fixtures (input 32)
    the copy is 1 byte and unused: the convs read x itself."""
    copy = next((t for t in model.tensors if t.name == tensor.name + INPUT_SUFFIX), None)
    if copy is None or not any(copy.index in layer.inputs and layer.op_type in RECURRENT_OPS
                               for layer in model.layers):
        return None
    rows = values.reshape(-1, values.shape[-1])
    lanes = ATOM_BYTES // values.dtype.itemsize
    if copy.size != rows.shape[0] * ATOM_BYTES or rows.shape[1] > lanes:
        return None
    padded = np.zeros((rows.shape[0], lanes), values.dtype)
    padded[:, :rows.shape[1]] = rows
    return copy, padded
