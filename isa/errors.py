"""The project's one family of user-facing errors.

Every mistake a user can make (bad ONNX, unsupported op, malformed model file, bad YAML,
wrong input shape) raises a subclass of :class:`NpuemuError` whose message names the
file / node / key / offset and what was expected. The CLI prints the message without a
traceback and exits non-zero. It lives in ``isa`` because ``isa`` is the lowest layer every
other package may import.
"""


class NpuemuError(Exception):
    """Base class: an error caused by the user's input, reported without a traceback."""


class ConfigError(NpuemuError):
    """A platform YAML, register-map YAML, override or quantization config is invalid."""


class EncodingError(NpuemuError):
    """A register field value does not fit, or a command word / stream is malformed."""


class ModelFileError(NpuemuError):
    """A model container (.npu or .rknn) is truncated, corrupted or of an unknown version."""


class CompileError(NpuemuError):
    """The compiler cannot build the given model (shape, limit or graph problem)."""


class UnsupportedOpError(CompileError):
    """One or more ONNX nodes have no NPU or CPU implementation."""


class EmulationError(NpuemuError):
    """The emulated NPU cannot run the command stream (a real NPU would hang or fault)."""


class DmaError(EmulationError):
    """A DMA access falls outside the memory it targets (the hardware's DMA error IRQ)."""


class UnsupportedProgramError(ModelFileError, EmulationError):
    """A model file in a form the reader recognises but the emulator cannot run (e.g. a vendor
    program that rewrites its own commands): a file error for the readers, an emulation limit
    for the runtime."""


class InputError(NpuemuError):
    """Inputs given to ``run`` do not match the model (name, shape, dtype, file)."""
