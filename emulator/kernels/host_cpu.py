"""What the CPU Numba compiles for offers, for kernels written in LLVM IR (issue 20).

The IR kernels (``gemm_int8``, ``depthwise_vnni``, ``gemm_fp32_seq``) use instructions only some
x86-64 hosts have. Numba compiles for the host unless NUMBA_CPU_NAME / NUMBA_CPU_FEATURES name
another target (then the host's features say nothing about the code's target), and its on-disk
cache is keyed by the CPU name and features, so a cache written here never loads elsewhere.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """The host CPU's features as LLVM names them ("+avx512vnni", "+fma", ...); empty where LLVM
    cannot tell on this platform."""
    import llvmlite.binding as ll
    try:
        return frozenset(ll.get_host_cpu_features().flatten().split(","))
    except RuntimeError:
        return frozenset()


def compiles_for_host(*features: str) -> bool:
    """Whether Numba compiles for this host (no NUMBA_CPU_NAME / NUMBA_CPU_FEATURES) and the host
    has every one of ``features``."""
    from numba.core import config
    return config.CPU_NAME is None and config.CPU_FEATURES is None \
        and all(feature in host_features() for feature in features)
