"""The MAC kernel chooses numpy's BLAS thread count once (kernels.mac.choose_blas_threads)."""

import pytest

from npuemu.emulator.kernels import mac
from npuemu.isa.errors import EmulationError


@pytest.fixture
def unchosen(monkeypatch):
    monkeypatch.setattr(mac, "_blas_threads_chosen", False)
    for name in ("NPUEMU_BLAS_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("value", ["0", "two", "-1", ""])
def test_a_bad_thread_count_names_the_variable(unchosen, value):
    unchosen.setenv("NPUEMU_BLAS_THREADS", value)
    with pytest.raises(EmulationError, match="NPUEMU_BLAS_THREADS"):
        mac.choose_blas_threads()


def test_the_users_openblas_setting_is_left_alone_and_the_choice_is_made_once(unchosen):
    unchosen.setenv("OPENBLAS_NUM_THREADS", "1")
    assert mac.choose_blas_threads() is None and mac._blas_threads_chosen
    unchosen.setenv("NPUEMU_BLAS_THREADS", "1")
    assert mac.choose_blas_threads() is None  # already chosen in this process


def test_the_default_is_one_thread_when_openblas_is_loaded(unchosen):
    import numpy as np  # numpy's OpenBLAS is what the kernel's products use

    np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)
    with open("/proc/self/maps") as maps:
        loaded = any("openblas" in line.lower() for line in maps)
    assert mac.choose_blas_threads() == (mac.DEFAULT_BLAS_THREADS if loaded else None)
