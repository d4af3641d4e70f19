"""Closed-form recovery from the log-domain identity (problem.md).

With ``P = I - 1 1^T / n``, every head satisfies ``P log(B_h) P = (X P)^T W_h (X P)``
exactly (softmax normalisers and row-only terms cancel). From two generic
heads the centred X follows by a pencil argument (from one head, by the
cosquare of :func:`_cosquare`, up to the stabiliser), and the mean column
from a linear system:

1. U = top-d left singular vectors of ``[G_1 G_2 G_1^T G_2^T]`` (``G_h = P log B_h P``),
   so ``(XP)^T = U A`` with A unknown (d x d);
2. ``K_h = U^T G_h U = A W_h A^T``;
3. ``K_2 K_1^{-1} = A (W_2 W_1^{-1}) A^{-1}``: eigenvectors give ``A = V' D V^{-1}``;
4. ``V'^{-1} K_1 V'^{-T} = D (V^{-1} W_1 V^{-T}) D`` fixes D up to one global sign;
5. the mean column m solves ``m^T W_h (XP) = (1/n) 1^T log(B_h) P - u_h^T (XP)``.

It needs n > d, positive B entries and generic heads (distinct eigenvalues); otherwise :func:`algebraic_init` returns None and the solver
falls back (see :mod:`solver.recover`).
"""

from __future__ import annotations

import numpy as np

from .problem import ATTENTION, Problem


def centred_log(B: np.ndarray) -> np.ndarray:
    """``P log(B) P`` for each head (H, n, n); B must be positive."""
    L = np.log(B)
    L = L - L.mean(axis=-1, keepdims=True)
    return L - L.mean(axis=-2, keepdims=True)


def _match(lam_a: np.ndarray, lam_b: np.ndarray) -> np.ndarray:
    """Permutation p with lam_b[p[i]] ~ lam_a[i] (greedy nearest, distinct)."""
    from scipy.optimize import linear_sum_assignment

    cost = np.abs(lam_a[:, None] - lam_b[None, :])
    _, cols = linear_sum_assignment(cost)
    return cols


def _pencil(W1, W2, K1, K2):
    """Solve ``K_h = A W_h A^T`` (h = 1, 2) for A, up to a global sign. Returns A or None."""
    try:
        lam, Vw = np.linalg.eig(W2 @ np.linalg.inv(W1))
        lam_k, Vk = np.linalg.eig(K2 @ np.linalg.inv(K1))
    except np.linalg.LinAlgError:
        return None
    Vk = Vk[:, _match(lam, lam_k)]
    T = np.linalg.solve(Vw, np.linalg.solve(Vw, W1.T).T)  # V^{-1} W1 V^{-T}
    Tp = np.linalg.solve(Vk, np.linalg.solve(Vk, K1.T).T)
    diag = np.diag(Tp) / np.diag(T)
    d = len(lam)
    D = np.zeros(d, dtype=complex)
    k0 = int(np.argmax(np.abs(np.diag(T))))
    D[k0] = np.sqrt(diag[k0])
    for j in range(d):
        if j != k0:
            D[j] = (Tp[k0, j] / T[k0, j]) / D[k0] if abs(T[k0, j]) > 1e-300 else np.sqrt(diag[j])
    A = Vk @ np.diag(D) @ np.linalg.inv(Vw)
    return np.real(A)


def _cosquare(W, K):
    """Solve ``K = A W A^T`` for A (one head), up to the stabiliser of W.

    Congruence ``W -> A W A^T`` acts on the cosquare ``W^{-T} W`` by similarity
    (``K^{-T} K = A^{-T} (W^{-T} W) A^T``), so eigenvectors give
    ``A^T = V D^{-1} V'^{-1}``. ``T = V^T W V`` is non-zero only between
    eigenvalues with ``lambda_i lambda_j = 1``, and ``V'^T K V' = D^{-1} T D^{-1}``
    fixes only the products ``D_i D_j`` of such pairs: one free factor per pair,
    which is the stabiliser (dimension floor(d/2)); it is set to 1, keeping
    complex-conjugate eigenvectors conjugate so that A is real.
    """
    from scipy.optimize import linear_sum_assignment

    try:
        lam, V = np.linalg.eig(np.linalg.solve(W.T, W))
        lam_k, Vk = np.linalg.eig(np.linalg.solve(K.T, K))
    except np.linalg.LinAlgError:
        return None
    Vk = Vk[:, _match(lam, lam_k)]
    T = V.T @ W @ V
    Tp = Vk.T @ K @ Vk
    d = len(lam)
    _, partner = linear_sum_assignment(np.abs(lam[:, None] * lam[None, :] - 1.0))
    conj = _match(lam, np.conj(lam))
    D = np.zeros(d, dtype=complex)
    for i in range(d):
        if D[i] != 0:
            continue
        j = partner[i]
        ratio = T[i, j] / Tp[i, j]  # = D_i D_j
        if j == i or j == conj[i]:  # self-paired, or unit-circle pair: D_i = D_j (conjugates) = sqrt(ratio)
            D[i] = np.sqrt(ratio)
            D[j] = D[i] if j == i else np.conj(D[i])
        else:
            D[i], D[j] = 1.0, ratio
            ci, cj = conj[i], conj[j]
            if D[ci] == 0 and ci not in (i, j):
                D[ci], D[cj] = 1.0, np.conj(ratio)
    At = V @ np.diag(1.0 / D) @ np.linalg.inv(Vk)
    return np.real(At.T)


def algebraic_init(problem: Problem) -> np.ndarray | None:
    """Closed-form X (d, n) from the attention maps, or None where the algebra does not apply."""
    if problem.variant != ATTENTION or problem.n <= problem.d:
        return None
    B = np.asarray(problem.B, dtype=np.float64)
    if np.any(B <= 0):
        return None
    W = np.asarray(problem.W, dtype=np.float64)
    d, n = problem.d, problem.n
    G = centred_log(B)
    if problem.heads >= 2:
        stack = np.concatenate([G[0], G[1], G[0].T, G[1].T] + [g for g in G[2:]], axis=1)
        U = np.linalg.svd(stack, full_matrices=False)[0][:, :d]
        A = _pencil(W[0], W[1], U.T @ G[0] @ U, U.T @ G[1] @ U)
    else:
        U = np.linalg.svd(np.concatenate([G[0], G[0].T], axis=1), full_matrices=False)[0][:, :d]
        A = _cosquare(W[0], U.T @ G[0] @ U)
    if A is None or not np.all(np.isfinite(A)):
        return None
    Y = (U @ A).T  # centred X, d x n
    # mean column: stack m^T W_h Y = (1/n) 1^T log(B_h) P - u_h^T Y over heads
    logB = np.log(B)
    rows, rhs = [], []
    U_bias = np.asarray(problem.U, dtype=np.float64)
    for h in range(problem.heads):
        r = logB[h].mean(axis=0)
        r = r - r.mean()
        rows.append((W[h] @ Y).T)  # (n, d): (m^T W_h Y)_j = (W_h Y)[:, j] . m
        rhs.append(r - U_bias[h] @ Y)
    m, *_ = np.linalg.lstsq(np.concatenate(rows), np.concatenate(rhs), rcond=None)
    candidates = [Y + np.outer(m, np.ones(n))]
    if problem.has_bias:  # the global sign of A is fixed by u: try both
        Ym = -Y
        rhs_m = [(logB[h].mean(axis=0) - logB[h].mean()) - U_bias[h] @ Ym for h in range(problem.heads)]
        mm, *_ = np.linalg.lstsq(np.concatenate([(W[h] @ Ym).T for h in range(problem.heads)]),
                                 np.concatenate(rhs_m), rcond=None)
        candidates.append(Ym + np.outer(mm, np.ones(n)))
    best = min(candidates, key=lambda Xc: float(problem.loss(Xc)))
    return best if np.all(np.isfinite(best)) else None
