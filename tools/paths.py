"""Output paths of the commands: never one of their inputs, always written whole.

Every command that writes a file checks its output against its inputs first
(:func:`refuse_input_as_output`: ``compile a.onnx -o a.onnx`` would otherwise destroy the model
it reads) and writes through :func:`write_output` (a temporary file in the same folder renamed
over the target, so a killed process leaves the old file, never a truncated one).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from npuemu.isa.container_writer import write_atomically
from npuemu.isa.errors import InputError, NpuemuError

PathLike = str | os.PathLike[str]


def same_file(first: PathLike, second: PathLike) -> bool:
    """Whether two paths name one file (links and relative spellings included)."""
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist: compare where they would be
        return Path(first).resolve() == Path(second).resolve()


def refuse_input_as_output(output: PathLike | None, inputs: Iterable[PathLike | None], option: str = "-o") -> None:
    """Raise :class:`InputError` when ``output`` is the same file as one of ``inputs``."""
    if output is None or str(output) == "-":
        return
    for source in inputs:
        if source is not None and str(source) != "-" and same_file(output, source):
            raise InputError(f"{output}: {option} names the input file {source}; writing there would destroy "
                             "the input: choose another output path")


def write_output(path: PathLike, data: bytes | str, what: str = "the output") -> None:
    """Write a whole file atomically; an OS error becomes a one-line :class:`NpuemuError`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        write_atomically(path, raw)
    except OSError as error:
        raise NpuemuError(f"{path}: cannot write {what}: {error.strerror or error}") from None


def output_directory(path: PathLike) -> Path:
    """``path`` as a directory to write into, created if missing; an existing file is refused
    before the run, so its outputs are not lost after it."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: --output-dir names a file, not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"{folder}: cannot create the output directory: {error.strerror or error}") from None
    return folder
