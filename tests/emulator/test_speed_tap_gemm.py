"""Stride-1 convolutions as one accumulating BLAS product per tap (kernels/tap_gemm.py): the
path is taken with numpy's OpenBLAS. Its sums against the reference, worst case included, are
checked through the int8 kernel in tests/emulator/test_cna_conv_pixels.py."""

import numpy as np

from npuemu.emulator.kernels import tap_gemm


def test_the_cblas_entry_point_is_found_where_numpy_bundles_it():
    # numpy's Linux wheels bundle scipy-openblas64 (the CI's numpy): there the per-tap path must
    # run; another BLAS build (MKL, Accelerate) runs the im2col path with the same values
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    bundled = blas.get("name") == "scipy-openblas" and "USE64BITINT" in blas.get("openblas configuration", "")
    assert tap_gemm.available() or not bundled
