"""The vendor's calibration dataset format (SDK guide 6.2.4, 10.3; hardware.md 5).

A UTF-8 text file with one sample per line; a sample of a model with several inputs lists one
file per input, separated by spaces, in the model's input order::

    images/a.png
    images/b.jpg
    tensors/c.npy

Paths are relative to the dataset file's folder (absolute paths work too); paths with spaces
are not possible in this format. Blank lines and lines starting with ``#`` are skipped.

- ``.npy``: a real numeric array of exactly the input's shape, or of that shape without its
  leading batch dimension of 1 (no other reshaping, no NHWC guessing).
- ``.png`` / ``.jpg`` / ``.jpeg`` (images.py): for inputs of shape [1, C, H, W]. The image
  must be H x W: there is **no resizing** (the vendor resizes with OpenCV; a silent resize
  changes the statistics, so we ask the user to do it). Channels: gray feeds a 1-channel
  input and is replicated for 3 channels; RGBA feeds 4 channels and drops alpha for 3; gray
  + alpha drops alpha. HWC pixels become NCHW float32, then the input's preprocessing runs.

Problems are :class:`InputError` naming the dataset file, the line and the sample file. The
file list is checked when the dataset is read (missing files, wrong count per line, empty
dataset, unknown suffix); contents are read lazily while calibrating, so a bad file is
reported when its line is reached.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npuemu.isa.errors import InputError

from ..ir import Graph
from .images import IMAGE_SUFFIXES, ImageError, read_image
from .preprocess import InputPreprocess, identity_preprocess

log = logging.getLogger(__name__)

NPY_SUFFIX = ".npy"
SUFFIXES = (NPY_SUFFIX, *IMAGE_SUFFIXES)
MAX_DATASET_BYTES = 64 * 1024 * 1024  # a list of paths; anything larger is not a dataset file


@dataclass(frozen=True)
class DatasetEntry:
    """One sample: the line it is on (1-based) and one file per model input."""

    line: int
    files: tuple[Path, ...]


@dataclass(frozen=True)
class Dataset:
    path: Path
    entries: tuple[DatasetEntry, ...]

    def __len__(self) -> int:
        return len(self.entries)


def read_dataset(path: Path | str, input_names: list[str]) -> Dataset:
    """Parse and check a dataset file for a model with inputs ``input_names``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such dataset file")
    if path.stat().st_size > MAX_DATASET_BYTES:
        raise InputError(f"{path}: {path.stat().st_size} bytes is too large for a dataset list "
                         "(expected a text file of sample paths)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: expected a UTF-8 text file of sample paths, found byte {error.start}: "
                         f"{error.reason}") from None
    folder = path.parent
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"{path}: line {number}"
        if len(words) != len(input_names):
            raise InputError(f"{where}: {len(words)} file(s) for a model with {len(input_names)} input(s) "
                             f"({', '.join(input_names)}); expected one file per input, separated by spaces")
        entries.append(DatasetEntry(number, tuple(_checked_file(folder, word, where) for word in words)))
    if not entries:
        raise InputError(f"{path}: the dataset has no samples; expected one line per sample listing one "
                         ".npy/.png/.jpg file per model input")
    return Dataset(path, tuple(entries))


def _checked_file(folder: Path, word: str, where: str) -> Path:
    file = Path(word)
    file = file if file.is_absolute() else folder / file
    if file.suffix.lower() not in SUFFIXES:
        raise InputError(f"{where}: {word}: unsupported file type; expected {', '.join(SUFFIXES)}")
    if not file.is_file():
        raise InputError(f"{where}: {word}: no such file (paths are relative to the dataset's folder {folder})")
    return file


class CalibrationSamples:
    """The dataset's samples as ``{input name: float32 array}``, preprocessed, read lazily.

    Iterable more than once (calibration makes two passes for histogram algorithms).
    """

    def __init__(self, dataset: Dataset, graph: Graph, preprocess: Mapping[str, InputPreprocess] | None = None):
        self.dataset = dataset
        self.names = list(graph.inputs)
        self.shapes = {name: graph.tensors[name].shape for name in self.names}
        self.preprocess = dict(preprocess or identity_preprocess(graph))
        self.float_inputs = {name for name in self.names if np.dtype(graph.tensors[name].dtype).kind == "f"}
        if len(self.names) != len(dataset.entries[0].files):
            raise InputError(f"{dataset.path}: samples have {len(dataset.entries[0].files)} file(s); the model has "
                             f"{len(self.names)} input(s) ({', '.join(self.names)})")

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for entry in self.dataset.entries:
            yield self.load(entry)

    def load(self, entry: DatasetEntry) -> dict[str, np.ndarray]:
        sample = {}
        for name, file in zip(self.names, entry.files):
            where = f"{self.dataset.path}: line {entry.line}: {file.name}"
            is_image = file.suffix.lower() != NPY_SUFFIX
            raw = _load_image(file, self.shapes[name], name, where) if is_image else _load_npy(file, self.shapes[name], name, where)
            if name in self.float_inputs:
                sample[name] = self.preprocess[name].apply(raw, is_image=is_image)
            else:  # index inputs are fed as they are (the evaluator checks the dtype)
                sample[name] = raw
        return sample


def load_input_file(file: Path | str, shape: tuple[int, ...], name: str) -> tuple[np.ndarray, bool]:
    """(array, is_image) of one input file as the dataset reads it: a .npy array of the input's
    shape (or without its batch dimension), or an image (PNG; JPEG with the ``images`` extra)
    of the input's height and width as float32 NCHW pixel values."""
    file = Path(file)
    if file.suffix.lower() == NPY_SUFFIX:
        return _load_npy(file, tuple(shape), name, str(file)), False
    return _load_image(file, tuple(shape), name, str(file)), True


def _load_npy(file: Path, shape: tuple[int, ...], name: str, where: str) -> np.ndarray:
    try:
        array = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{where}: not a readable .npy array: {error}") from None
    if not isinstance(array, np.ndarray):  # an .npz archive saved under .npy
        raise InputError(f"{where}: holds an archive, expected one array")
    if array.dtype.kind not in "fiu":
        raise InputError(f"{where}: dtype {array.dtype} is not a real number type; expected float or integer values")
    if array.shape == shape:
        return array
    if shape and shape[0] == 1 and array.shape == shape[1:]:
        return array.reshape(shape)
    raise InputError(f"{where}: shape {list(array.shape)} does not match input '{name}' {list(shape)} "
                     f"(or that shape without the leading batch dimension of 1); try: {_shape_way_out(array.shape, shape, name)}")


def _shape_way_out(have: tuple[int, ...], want: tuple[int, ...], name: str) -> str:
    """An NHWC array (the vendor's order) is named as such with its transpose; else the shape to save."""
    if len(want) == 4:
        nhwc = (want[0], want[2], want[3], want[1])
        if have in (nhwc, nhwc[1:]):
            axes = "(0, 3, 1, 2)" if len(have) == 4 else "(2, 0, 1)"
            return f"the array is in NHWC order: save np.transpose(array, {axes}) (NCHW)"
    given = ",".join(str(d) for d in ((1, *have) if len(have) == len(want) - 1 else have))
    return (f"save each array with shape {list(want)}; or, if the model's input dims are dynamic, compile with "
            f"--input-shape {name}={given}")


def _load_image(file: Path, shape: tuple[int, ...], name: str, where: str) -> np.ndarray:
    if len(shape) != 4 or shape[0] != 1:
        raise InputError(f"{where}: an image can only feed an input of shape [1, C, H, W]; input '{name}' is "
                         f"{list(shape)} - give a .npy file")
    try:
        image = read_image(file)
    except ImageError as error:
        raise InputError(f"{where}: {error}") from None
    except OSError as error:
        raise InputError(f"{where}: cannot read the image: {error.strerror or error}") from None
    _, channels, height, width = shape
    if image.shape[:2] != (height, width):
        raise InputError(f"{where}: image is {image.shape[0]}x{image.shape[1]} (HxW), input '{name}' expects "
                         f"{height}x{width} (shape {list(shape)}); images are not resized - resize it or give a .npy")
    image = _match_channels(image, channels, name, where)
    return np.ascontiguousarray(image.transpose(2, 0, 1)[None]).astype(np.float32)


def _match_channels(image: np.ndarray, channels: int, name: str, where: str) -> np.ndarray:
    have = image.shape[2]
    if have == 2:  # gray + alpha: the alpha plane is not data
        image, have = image[:, :, :1], 1
    if have == channels:
        return image
    if have == 1 and channels == 3:
        return np.repeat(image, 3, axis=2)
    if have == 4 and channels == 3:
        return image[:, :, :3]
    kinds = {1: "gray", 3: "RGB", 4: "RGBA"}
    raise InputError(f"{where}: a {kinds.get(have, have)} image cannot feed input '{name}' with {channels} channel(s)")
