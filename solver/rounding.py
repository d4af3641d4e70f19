"""The float64 allowance for a dense Hessian's own rounding, shared by the issuer and ``recheck``.

A Hessian formed in float64 differs from the exact one by rounding, and a symmetric eigensolver adds
its backward error, ``c dn eps ||H||`` for a modest c. Every dense test of a claimed eigenvalue bound
(the issuer's and ``recheck``'s eigenvalues, one Cholesky factorisation, row sums bounding lambda_max)
takes the generous ``HESSIAN_ROUNDING dn eps`` of a norm of H as its margin. The issuer's own
lambda_max bound is widened by twice that (:func:`solver.certificate.prove_lambda_min`), so that
``recheck``'s row sums of its own Hessian confirm it. Keeping the factor in one place keeps the
issuer's bounds and the checks that confirm them in step.

:func:`symmetrise` is the float64 symmetric part both sides take of a Hessian formed by rows.
"""
from __future__ import annotations

import numpy as np

EPS = float(np.finfo(np.float64).eps)
HESSIAN_ROUNDING = 10  # c in c dn eps ||H||: generous for eigvalsh's backward error and H's own rounding


def inf_norm(H: np.ndarray) -> float:
    """``||H||_inf``, the largest absolute row sum: it bounds every |eigenvalue| of a symmetric H, and
    is the ``scale`` the dense tests give :func:`hessian_allowance` above the eigenvalue sizes."""
    return float(np.max(np.sum(np.abs(H), axis=1)))


def hessian_allowance(dn: int, scale: float) -> float:
    """``HESSIAN_ROUNDING dn eps scale``, scale a norm of the (dn, dn) Hessian (its largest absolute
    eigenvalue, or ``||H||_inf``, which bounds it)."""
    return HESSIAN_ROUNDING * dn * EPS * float(scale)


SYMMETRISE_TILE = 512


def symmetrise(H: np.ndarray, tile: int = SYMMETRISE_TILE) -> np.ndarray:
    """``H <- (H + H^T) / 2`` in place, tile by tile; returns H.

    Bitwise what ``H += H.T; H *= 0.5`` gives (each entry is ``(h_ij + h_ji) * 0.5`` in float64), with
    a (tile, tile) temporary instead of a transposed pass over the whole matrix: about 5x faster at
    dn = 16384 (2.9 s against 16 s, one thread), where the transpose's strided reads dominate.
    """
    N = H.shape[0]
    if H.ndim != 2 or H.shape[1] != N:
        raise ValueError(f"symmetrise needs a square matrix, got shape {H.shape}")
    for s in range(0, N, tile):
        e = min(s + tile, N)
        D = H[s:e, s:e]
        D += D.T.copy()
        D *= 0.5
        for s2 in range(e, N, tile):
            e2 = min(s2 + tile, N)
            upper, lower = H[s:e, s2:e2], H[s2:e2, s:e]
            mean = upper + lower.T
            mean *= 0.5
            upper[...] = mean
            lower[...] = mean.T
    return H
