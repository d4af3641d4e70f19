"""Numerical side of unmask: problems, the certified Newton solver, results.

Importing this package turns on JAX's 64-bit mode: verification and
certificates are float64 work, and without the flag JAX would silently
compute float64 inputs in float32. float32 problems stay float32.
"""

import os

# XLA's multi-threaded Eigen on the CPU deadlocks in the checker's vmapped adversarial ascent at
# dn = 2048 (every thread in futex_wait, 0% CPU for 30 minutes, reproduced; with the flag off the
# same validation finishes in 32 s). It is read when the CPU backend starts, so it is set here,
# before any computation; a flag the user already set is kept.
if "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

from .errors import (  # noqa: E402
    CertificateMismatchError,
    CertificationError,
    InputFileError,
    InvalidProblemError,
    InvalidRegionError,
    LinearSolveError,
    MemoryBudgetError,
    ModelUnavailableError,
    UnmaskError,
)
from .problem import ATTENTION, OUTPUT, Problem, planted_instance  # noqa: E402

# the solver's entry points (the name `recover` is both the submodule and its function: importing the
# function here, after the submodule, makes `from solver import recover` give the function; the module
# stays `sys.modules["solver.recover"]`, and `from solver.recover import ...` works as before)
from .certificate import Certificate  # noqa: E402
from .recover import Result, recover, recover_attention  # noqa: E402

__all__ = [
    "recover",
    "recover_attention",
    "Result",
    "Certificate",
    "ATTENTION",
    "OUTPUT",
    "Problem",
    "planted_instance",
    "UnmaskError",
    "InvalidProblemError",
    "InvalidRegionError",
    "CertificationError",
    "CertificateMismatchError",
    "LinearSolveError",
    "MemoryBudgetError",
    "ModelUnavailableError",
    "InputFileError",
]
