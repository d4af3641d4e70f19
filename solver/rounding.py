"""The float64 allowance for a dense Hessian's own rounding, shared by the issuer and ``recheck``.

A Hessian formed in float64 differs from the exact one by rounding, and a symmetric eigensolver adds
its backward error, ``c dn eps ||H||`` for a modest c. Every dense test of a claimed eigenvalue bound
(the issuer's and ``recheck``'s eigenvalues, one Cholesky factorisation, row sums bounding lambda_max)
takes the generous ``HESSIAN_ROUNDING dn eps`` of a norm of H as its margin. The issuer's own
lambda_max bound is widened by twice that (:func:`solver.certificate.prove_lambda_min`), so that
``recheck``'s row sums of its own Hessian confirm it. Keeping the factor in one place keeps the
issuer's bounds and the checks that confirm them in step.
"""
from __future__ import annotations

import numpy as np

EPS = float(np.finfo(np.float64).eps)
HESSIAN_ROUNDING = 10  # c in c dn eps ||H||: generous for eigvalsh's backward error and H's own rounding


def hessian_allowance(dn: int, scale: float) -> float:
    """``HESSIAN_ROUNDING dn eps scale``, scale a norm of the (dn, dn) Hessian (its largest absolute
    eigenvalue, or ``||H||_inf``, which bounds it)."""
    return HESSIAN_ROUNDING * dn * EPS * float(scale)
