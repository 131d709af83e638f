"""Input data as the vendor's API takes it, turned into what npuemu's runtime takes.

``RKNN.inference`` (guide 3.2.1, 10.3): one array per input; 4-D inputs in NHWC unless
``data_format`` says NCHW; an image may come without its batch axis ([H, W, C]); any numeric
dtype (uint8 pixels typically). The vendor then subtracts ``mean_values`` and divides by
``std_values`` per channel - never a channel swap at inference (``quant_img_RGB2BGR`` only
affects calibration images, guide 10.3). npuemu's graph is the ONNX model's, NCHW.

Calibration and analysis files (``build(dataset=...)``, ``accuracy_analysis(inputs=...)``):
``.npy`` samples of a 4-D input may be NHWC as the vendor's examples store them, or of the
ONNX (NCHW) shape; npuemu's dataset reader takes the ONNX shape only, so NHWC samples are
transposed into a dataset of its own (:func:`nchw_dataset`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npuemu.compiler.quant.dataset import load_input_file
from npuemu.compiler.quant.preprocess import preprocess_from_plain
from npuemu.isa.errors import InputError

FORMATS = ("nhwc", "nchw")


def formats_for(data_format: Any, count: int) -> list[str]:
    """``data_format`` (None, one text, or one per input) -> one lower-case layout per input."""
    if data_format is None:
        return ["nhwc"] * count
    items = [data_format] * count if isinstance(data_format, str) else list(data_format)
    if len(items) != count:
        raise InputError(f"data_format lists {len(items)} layout(s) for {count} input(s)")
    lowered = [str(item).lower() for item in items]
    bad = [item for item in lowered if item not in FORMATS]
    if bad:
        raise InputError(f"data_format {bad[0]!r}: expected 'nhwc' or 'nchw'")
    return lowered


def to_model_layout(array: Any, shape: Sequence[int], layout: str, label: str) -> np.ndarray:
    """One inference input -> float32 in the model's (ONNX, NCHW) shape ``shape``."""
    values = np.asarray(array)
    if values.dtype.kind not in "biuf":
        raise InputError(f"{label}: expected a numeric array, got dtype {values.dtype}")
    shape = tuple(int(v) for v in shape)
    if len(shape) == 4:
        if values.ndim == 3:  # an image without its batch axis (cv2.imread's [H, W, C])
            values = values[None]
        if values.ndim == 4 and layout == "nhwc":
            values = values.transpose(0, 3, 1, 2)
    elif values.shape != shape and shape[:1] == (1,) and values.shape == shape[1:]:
        values = values[None]
    if values.ndim != len(shape) or values.shape[1:] != shape[1:]:  # the batch axis: the runtime checks it
        expected = [shape[0], shape[2], shape[3], shape[1]] if len(shape) == 4 and layout == "nhwc" else list(shape)
        raise InputError(f"{label}: shape {list(np.shape(array))} does not fit the model's input {expected} "
                         f"({layout.upper() if len(shape) == 4 else 'as the model'}; a batch axis of 1 may be left out)")
    return np.ascontiguousarray(values, dtype=np.float32)


def apply_mean_std(values: np.ndarray, plain: Mapping[str, Any] | None, label: str) -> np.ndarray:
    """``(x - mean) / std`` per channel as the vendor's inference does; no channel swap."""
    if not plain:
        return values
    preprocess = preprocess_from_plain({**plain, "bgr": False}, label)
    return preprocess.apply(values, is_image=False)


def load_sample_files(paths: Sequence[str | Path], shapes: Mapping[str, Sequence[int]],
                      preprocess: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """One sample (a file per input, in input order) as the dataset would load it,
    preprocessed with the build's mean/std (and RGB2BGR for images); NHWC ``.npy`` taken too."""
    names = list(shapes)
    if len(paths) != len(names):
        raise InputError(f"{len(paths)} input file(s) given; the model has {len(names)} input(s) ({', '.join(names)})")
    sample = {}
    for name, path in zip(names, paths):
        shape = tuple(shapes[name])
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        if path.suffix.lower() == ".npy":
            array, is_image = _npy(path, shape, name), False
        else:
            array, is_image = load_input_file(path, shape, name)
        plain = preprocess.get(name)
        sample[name] = preprocess_from_plain(plain, f"preprocess of {name}").apply(array, is_image=is_image) \
            if plain else np.asarray(array, np.float32)
    return sample


def _npy(path: Path, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A ``.npy`` of the ONNX shape (with or without the batch axis of 1), or its NHWC form."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{path}: not a readable .npy array: {error}") from None
    if array.shape == shape or (shape[:1] == (1,) and array.shape == shape[1:]):
        return array.reshape(shape)
    if len(shape) == 4:
        nhwc = (shape[0], shape[2], shape[3], shape[1])
        if array.shape == nhwc or (shape[0] == 1 and array.shape == nhwc[1:]):
            return array.reshape(nhwc).transpose(0, 3, 1, 2)
    raise InputError(f"{path}: shape {list(array.shape)} fits neither input {name!r} {list(shape)} nor its NHWC form")


def nchw_dataset(dataset: str | Path, shapes: Mapping[str, Sequence[int]], folder: Path) -> Path:
    """``dataset`` itself when every ``.npy`` has the ONNX shape; else a copy in ``folder`` whose
    NHWC ``.npy`` samples are stored transposed to NCHW (images and other lines unchanged)."""
    from npuemu.compiler.quant import read_dataset

    parsed = read_dataset(dataset, list(shapes))
    folder.mkdir(parents=True, exist_ok=True)
    lines, converted = [], False
    for number, entry in enumerate(parsed.entries):
        words = []
        for index, (name, file) in enumerate(zip(shapes, entry.files)):
            shape = tuple(shapes[name])
            if file.suffix.lower() == ".npy" and _stored_shape(file) not in (shape, shape[1:]):
                target = folder / f"sample{number}_{index}.npy"
                np.save(target, _npy(file, shape, name))
                file, converted = target, True
            words.append(str(file.resolve()))
        lines.append(" ".join(words))
    if not converted:
        return Path(dataset)
    path = folder / "dataset_nchw.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _stored_shape(path: Path) -> tuple[int, ...] | None:
    try:
        return tuple(np.load(path, mmap_mode="r", allow_pickle=False).shape)
    except (OSError, ValueError, EOFError):
        return None  # unreadable: the dataset reader reports it with its line
