"""A model file's schedule, tensors and layers, indexed once per trailer: the timeline and the
perf report both read them for every run."""

from __future__ import annotations

from npuemu.emulator.memo import Memo


def shape_text(shape) -> str:
    """A shape as the vendor's layer table prints it: (1,3,224,224); ``?`` when unknown."""
    return "(" + ",".join(str(int(d)) for d in shape) + ")" if shape is not None else "?"


#: trailer -> (schedule, tensors by name, layers, shapes): see model_index (a trailer dict cannot be
#: weakly referenced, so its entry holds it: its id is not reused while the entry lives)
_INDEX: Memo[tuple] = Memo(identity=1, limit=16)


def model_index(model) -> tuple[tuple, dict, tuple, list]:
    """The schedule, tensors by name, layers and each layer's (input, output) shape texts of a
    model file, worked out once per trailer (a loaded model's trailer is not edited, as the
    Runtime's tensor index also assumes)."""
    entry = _INDEX.get(model.trailer)
    if entry is None:
        tensors = {t.name: t for t in model.tensors()}
        layers = model.layers()
        shapes = [tuple(",".join(shape_text(tensors[n].shape if n in tensors else None) for n in names)
                        for names in (info.inputs, info.outputs)) for info in layers]
        entry = _INDEX.put((model.schedule(), tensors, layers, shapes), model.trailer)
    return entry
