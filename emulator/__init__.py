"""Runs a compiled register-command stream on a model of the NPU: memory, cores, units,
Numba kernels, timing. Imports ``isa`` and ``platforms``, never ``compiler``."""
