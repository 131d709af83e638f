"""Independent references for the emulator's numeric core.

Written from ``emulator/NUMERICS.md`` and the hardware docs, never from the kernels: plain
Python integers, fractions and obvious numpy expressions, slow on purpose.
"""
