import os

from hypothesis import HealthCheck, settings

# CI runs derandomized so a red run is reproducible; locally hypothesis explores freely.
# Deadlines are off: the first call of a Numba kernel compiles it.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))
