"""Numerical side of unmask: problems, the certified Newton solver, results.

Importing this package turns on JAX's 64-bit mode: verification and
certificates are float64 work, and without the flag JAX would silently
compute float64 inputs in float32. float32 problems stay float32.
"""

import jax

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

__all__ = [
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
