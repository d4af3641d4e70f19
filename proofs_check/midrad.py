"""Rigorous midpoint-radius (ball) arithmetic on float64 NumPy arrays, for matrices too large for arb.

A ball is a pair ``(m, r)`` of arrays: every value it stands for lies in ``[m - r, m + r]``
entrywise (``r = None``: the midpoint is exact). Operations run in float64 with the default
rounding to nearest and return balls that contain every result of the exact operation on
members of the input balls. The radii account for the rounding of the midpoint with the
standard a-priori bounds (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
Lemma 3.1 and eq. 3.5): a sum or product rounds with relative error at most ``u = 2^-53``, and a
dot product of length ``K`` in ANY summation order, with or without fused multiply-adds (what
a BLAS matmul may do), errs by at most ``gamma_K |a|^T |b|``, ``gamma_K = K u / (1 - K u)``.
Underflow adds at most ``2^-1074`` per operation, covered by the ``TINY`` added to every radius.
Radii are themselves computed in floating point from non-negative terms, so each is inflated
by `up` to an upper bound of its exact value.

This assumes IEEE binary64 arithmetic in round-to-nearest (NumPy's default; no x87 extended
precision) and a BLAS without Strassen-like fast multiplication (OpenBLAS, MKL, Accelerate
use the classical algorithm). Everything transcendental (the exponential) is done in arb.
"""

from __future__ import annotations

import math

import numpy as np

U = 2.0**-53
TINY = np.finfo(np.float64).tiny


def two_sum(a, b):
    """Knuth's TwoSum, elementwise: ``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly
    (float64, round to nearest, no overflow): the renormalisation of a double-double sum."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def up(x, ops: int):
    """Upper bound on the exact value of a non-negative quantity that float64 computed as ``x``
    with at most ``ops`` roundings of sums and products of non-negative terms.

    Each rounding loses at most a factor ``1 - u``, so the exact value is at most
    ``x (1 - u)^-ops <= x (1 + 1.01 ops u)`` (``ops u < 0.01``); the factor used,
    ``1 + 2 (ops + 2) u``, also covers the rounding of this product, and ``TINY`` the underflow.
    """
    if not ops * U < 0.01:
        raise ValueError(f"too many roundings ({ops}) for the a-priori bound")
    return np.asarray(x, np.float64) * (1.0 + 2.0 * (ops + 2) * U) + TINY


def up_in_place(x: np.ndarray, ops: int) -> np.ndarray:
    """:func:`up` written into ``x``, a float64 array the caller owns (a fresh temporary): the same
    two operations in the same order, so bitwise the same bound, without another array of x's size
    (at one head (32, 128) the radii are (16384, 4000) arrays, half a GB each)."""
    if not ops * U < 0.01:
        raise ValueError(f"too many roundings ({ops}) for the a-priori bound")
    x *= 1.0 + 2.0 * (ops + 2) * U
    x += TINY
    return x


def add(a, b, sign: float = 1.0):
    """``a + b`` (``sign=1``) or ``a - b`` (``sign=-1``) of balls."""
    (am, ar), (bm, br) = a, b
    cm = am + sign * bm
    cr = np.abs(cm)
    cr *= U
    for r in (ar, br):  # a missing radius is zero
        if r is not None:
            cr += r
    return cm, up_in_place(cr, 4)


def mul(a, b):
    """Entrywise product of balls (broadcasting)."""
    (am, ar), (bm, br) = a, b
    cm = am * bm
    cr = np.abs(cm)
    cr *= U
    if br is not None:
        cr += np.abs(am) * br
    if ar is not None:
        cr += ar * (np.abs(bm) + (0.0 if br is None else br))
    return cm, up_in_place(cr, 8)


def matmul(a, b):
    """Matrix product of balls, ``np.matmul`` semantics (batched over leading axes).

    For ``A`` in ``am +- ar`` and ``B`` in ``bm +- br``: ``AB - am bm = am (B - bm) + (A - am) bm +
    (A - am)(B - bm)``, bounded by ``|am| br + ar |bm| + ar br``; the rounding of ``am @ bm`` is at
    most ``gamma_K |am| |bm|`` with ``K`` the inner dimension.
    """
    (am, ar), (bm, br) = a, b
    K = am.shape[-1]
    if not K * U < 0.01:
        raise ValueError(f"inner dimension {K} too large for the a-priori rounding bound")
    cm = am @ bm
    aa, ab = np.abs(am), np.abs(bm)
    gamma = 1.03 * (K + 1) * U  # >= gamma_K (1 + 1.01 K u): gamma_K times the rounding of |am| @ |bm|
    # gamma |am||bm| + |am| br + ar (|bm| + br), grouped into as few products as the radii allow
    # (one or two besides the midpoint's); each term of each is rounded at most K + 3 times
    if ar is None and br is None:
        cr = gamma * (aa @ ab)
    elif br is None:
        cr = (gamma * aa + ar) @ ab
    elif ar is None:
        cr = aa @ (gamma * ab + br)
    else:
        cr = aa @ (gamma * ab + br) + ar @ (ab + br)
    return cm, up_in_place(cr, K + 6)


def column_norms_upper(bm: np.ndarray) -> np.ndarray:
    """Upper bounds on the 2-norms of the columns of the exact (K, N) float64 matrix ``bm``."""
    K = bm.shape[0]
    if not (K + 1) * U < 0.01:
        raise ValueError(f"inner dimension {K} too large for the a-priori rounding bound")
    return up(np.sqrt(up(np.einsum("kj,kj->j", bm, bm), K + 1)), 2)


def matmul_exact_cs(a, bm: np.ndarray, b_norms: np.ndarray):
    """``matmul(a, (bm, None))`` for an exact (K, N) ``bm`` with the radius bounded by Cauchy-Schwarz,
    row by column: ``(gamma |am| + ar) |bm| <= ||w_i|| ||b_j||`` entrywise, ``w = gamma |am| + ar``;
    ``b_norms`` (`column_norms_upper` of bm) is computed once by the caller.

    One product, the midpoint's, where `matmul` takes a second one and an ``|bm|`` the size of bm:
    for ``q_r^T P`` at one head (64, 256), bm is P, 2 GiB, read once per block of rows instead of
    three times, with no 2 GiB temporary. The radius is never below `matmul`'s, and above it where w
    and bm's columns are far from parallel."""
    am, ar = a
    K = am.shape[-1]
    if not (K + 1) * U < 0.01:
        raise ValueError(f"inner dimension {K} too large for the a-priori rounding bound")
    cm = am @ bm
    w = np.abs(am)
    w *= 1.03 * (K + 1) * U  # >= gamma_K, as in matmul
    if ar is not None:
        w += ar
    up_in_place(w, 2)
    w_norms = up(np.sqrt(up(np.einsum("...k,...k->...", w, w), K + 1)), 2)
    return cm, up_in_place(w_norms[..., None] * b_norms, 1)


def transpose(a, axes=None):
    m, r = a
    return np.transpose(m, axes), (None if r is None else np.transpose(r, axes))


def magnitude(a):
    """Upper bound on ``|x|`` entrywise over the ball."""
    m, r = a
    mag = np.abs(m)
    if r is not None:
        mag += r
    return up_in_place(mag, 1)


def norm_upper(a) -> float:
    """Upper bound on the Frobenius norm of every member of the ball (a Python float)."""
    mag = magnitude(a).reshape(-1)
    mag *= mag  # (a fresh array: squared in place)
    s = float(up(np.sum(mag), mag.size + 1))
    return float(up(math.sqrt(s), 2))


def orthonormality_defect(Q) -> float:
    """Upper bound on ``||Q^T Q - I||_F`` for a float64 matrix Q (exact entries), so that
    ``||Q||_2^2 <= 1 + ||Q^T Q - I||_F`` (Weyl).

    ``fl(Q^T Q)`` errs by at most ``gamma_K |Q|^T |Q|`` (K the rows of Q), whose Frobenius norm is at
    most ``gamma_K ||Q||_F^2`` (Cauchy-Schwarz on each entry, ``|q_i|^T |q_j| <= ||q_i|| ||q_j||``):
    one product (a syrk) where the ball product took two; for a nearly orthonormal (k, k) Q the
    term is about ``k^2 u``, 2e-9 at k = 4096."""
    Q = np.asarray(Q, np.float64)
    K, k = Q.shape
    if not K * U < 0.01:
        raise ValueError(f"inner dimension {K} too large for the a-priori rounding bound")
    G = Q.T @ Q  # (NumPy calls syrk for this product)
    G[np.diag_indices(k)] -= 1.0  # each diagonal entry rounds once more: a relative u, below
    off = norm_upper((G, None))
    del G
    gamma = 1.03 * (K + 1) * U
    q_sq = float(up(np.einsum("ij,ij->", Q, Q), Q.size + 1))  # (no (K, k) temporary)
    return float(up(off * (1 + 2 * U) + gamma * q_sq + 2 * U * k, 4))


def two_norm_upper(a) -> float:
    """Upper bound on the spectral norm of every member of the (m, k) ball: ``||A||_2^2 =
    lambda_max(A A^T) <= ||A A^T||_inf`` (an induced norm bounds the spectral radius), the smaller
    of that and the Frobenius norm."""
    m = a[0]
    if m.shape[0] > m.shape[1]:
        a = transpose(a)
    G = magnitude(matmul(a, transpose(a)))
    rows = up(np.sum(G, axis=1), G.shape[1] + 1)
    return min(float(up(math.sqrt(float(np.max(rows))), 2)), norm_upper(a))


def from_arb(obj: np.ndarray):
    """Ball of float64 arrays containing an object array of python-flint ``arb`` balls: the midpoint
    rounded to nearest, the radius widened by one ulp of it (the midpoint's rounding) and one ulp
    of itself (the radius's conversion)."""
    flat = obj.reshape(-1)
    m = np.array([float(v.mid()) for v in flat]).reshape(obj.shape)
    r = np.array([float(v.rad()) for v in flat]).reshape(obj.shape)
    r = np.nextafter(r, np.inf) + np.spacing(np.abs(m))
    return m, r
