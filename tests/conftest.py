"""Test configuration: float64 everywhere by default, strict dtype promotion,
and hypothesis profiles.

Profiles: ``default`` (CI, bounded examples), ``thorough`` (many more examples;
select with ``--hypothesis-profile=thorough``).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

# glibc malloc as it comes (no solver.memory.keep_freed_memory): with it, each pytest process would hold
# its largest test's peak to the end (the default suite's process peaked at 8.25 GB with it, 7.57 GB
# without), and `-m slow -n 2` runs two such processes on CI's 24 GiB

settings.register_profile(
    "default",
    max_examples=25,
    deadline=None,  # JIT compilation makes first calls slow
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile(
    "thorough",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
