"""The symmetries of an instance: what the data cannot tell apart.

Three kinds leave every logit matrix's softmax (hence B) unchanged:

- the stabiliser group ``G = {Q : Q^T W_h Q = W_h for all h, Q^T u_h = u_h}``
  acting as ``X -> Q X``; its Lie algebra is
  ``g = {A : A^T W_h + W_h A = 0, A^T u_h = 0}``, computed here as a null space;
- translations ``X -> X + v 1^T`` with ``W_h^T v = 0`` for every head (the
  extra logits ``X^T W_h v 1^T`` and ``(u_h^T v) 1 1^T`` are constant along
  rows and cancel in the softmax; for the output variant ``W_V,h^T v = 0``
  is needed too);
- the sign flip ``X -> -X`` when every u_h = 0 (the logits are even in X; a
  finite symmetry, not counted in the dimension). The output variant is
  not even, so it has no sign flip.

``symmetry_dimension`` is ``dim g + dim(translations)``: the dimension of the
orbit of a generic X, i.e. the number of directions the unregularised Hessian
is singular along at an exact solution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from .problem import OUTPUT, Problem


def _null_space(M: np.ndarray, rtol: float) -> np.ndarray:
    """Orthonormal basis (columns) of the null space of M, rank decided at ``rtol * s_max``."""
    if M.size == 0:
        return np.eye(M.shape[1])
    _, s, vh = np.linalg.svd(M)
    smax = s[0] if s.size else 0.0
    rank = int(np.sum(s > rtol * max(smax, np.finfo(float).tiny)))
    return vh[rank:].T.conj()


@dataclass(frozen=True)
class Symmetry:
    """Symmetries of one instance.

    - `lie_algebra`: (k, d, d) basis of g (empty (0, d, d) when the group is finite)
    - `translations`: (d, t) orthonormal basis of admissible translation directions v
    - `sign_flip`: whether X -> -X is a symmetry
    """

    lie_algebra: np.ndarray
    translations: np.ndarray
    sign_flip: bool

    @property
    def dimension(self) -> int:
        return int(self.lie_algebra.shape[0] + self.translations.shape[1])

    def orbit_tangent(self, X: np.ndarray) -> np.ndarray:
        """(dn, dimension) basis of the tangent space of the orbit at X (row-major vec)."""
        d, n = X.shape
        cols = [(A @ X).reshape(-1) for A in self.lie_algebra]
        cols += [np.outer(v, np.ones(n)).reshape(-1) for v in self.translations.T]
        return np.array(cols).T if cols else np.zeros((d * n, 0))


def symmetries(problem: Problem, rtol: float = 1e-10) -> Symmetry:
    """Compute the stabiliser algebra, translations and sign flip of ``problem``."""
    d = problem.d
    W = np.asarray(problem.W, dtype=np.float64)
    rows = []
    eye = np.eye(d)
    for Wh in W:
        # vec_r(A^T W + W A) = (W^T (x) I) P vec_r(A) + (W (x) I) vec_r(A), P the transpose permutation
        rows.append(np.kron(eye, Wh.T)[:, _transpose_perm(d)] + np.kron(Wh, eye))
    for uh in np.asarray(problem.U, dtype=np.float64):
        if np.any(uh != 0):
            # A^T u = 0  <=>  sum_a A[a, b] u[a] = 0 for every b
            rows.append(np.kron(uh[None, :], eye))
    M = np.vstack(rows)
    scale = max(1.0, float(np.max(np.abs(M))))
    basis = _null_space(M / scale, rtol)
    lie = basis.T.reshape(-1, d, d) if basis.size else np.zeros((0, d, d))

    trans_rows = [Wh.T for Wh in W]
    if problem.variant == OUTPUT:
        trans_rows += [Wv.T for Wv in np.asarray(problem.W_V, dtype=np.float64)]
    T = np.vstack(trans_rows)
    translations = _null_space(T / max(1.0, float(np.max(np.abs(T)))), rtol)
    sign_flip = (not problem.has_bias) and problem.variant != OUTPUT
    return Symmetry(lie_algebra=lie, translations=translations, sign_flip=sign_flip)


def _transpose_perm(d: int) -> np.ndarray:
    """Permutation p with vec_r(A^T) = vec_r(A)[p]."""
    return np.arange(d * d).reshape(d, d).T.reshape(-1)


def group_element(sym: Symmetry, coefficients: np.ndarray) -> np.ndarray:
    """``Q = expm(sum_k c_k A_k)``: an element of the identity component of the stabiliser."""
    d = sym.lie_algebra.shape[-1] if sym.lie_algebra.size else 0
    if sym.lie_algebra.shape[0] == 0:
        raise ValueError("the stabiliser group of this instance is finite: no continuous elements")
    A = np.tensordot(np.asarray(coefficients, float), sym.lie_algebra, axes=1)
    return scipy.linalg.expm(A) if d else A


def distance_to_orbit(problem: Problem, X: np.ndarray, X_true: np.ndarray, sym: Symmetry | None = None,
                      iterations: int = 50) -> float:
    """Relative Frobenius distance from X to the orbit of X_true, ``min ||X - g X_true|| / ||X_true||``.

    Minimises over the sign flip (when it is a symmetry), translations (closed
    form, they are linear) and the identity component of the stabiliser
    (Gauss-Newton on the group coordinates from the identity: exact when the
    group is finite, a local minimum otherwise).
    """
    sym = symmetries(problem) if sym is None else sym
    X = np.asarray(X, float)
    X_true = np.asarray(X_true, float)
    norm = max(np.linalg.norm(X_true), np.finfo(float).tiny)
    candidates = [X_true, -X_true] if sym.sign_flip else [X_true]
    best = np.inf
    for Y in candidates:
        best = min(best, _orbit_fit(sym, X, Y, iterations) / norm)
    return float(best)


def _orbit_fit(sym: Symmetry, X, Y, iterations):
    d, n = X.shape
    T = sym.translations
    k = sym.lie_algebra.shape[0]

    def translate_out(R):
        # remove the best translation v 1^T, v in span(T): v = T T^T mean-column of R
        if T.shape[1] == 0:
            return R
        m = R.mean(axis=1)
        return R - np.outer(T @ (T.T @ m), np.ones(n))

    if k == 0:
        return np.linalg.norm(translate_out(X - Y))
    Q = np.eye(d)
    for _ in range(iterations):
        # Gauss-Newton on Q -> Q expm(sum_k s_k A_k); the Jacobian at s = 0 is exact
        R = translate_out(X - Q @ Y)
        J = np.stack([translate_out(-(Q @ A @ Y)).reshape(-1) for A in sym.lie_algebra], axis=1)
        step, *_ = np.linalg.lstsq(J, -R.reshape(-1), rcond=None)
        Q = Q @ scipy.linalg.expm(np.tensordot(step, sym.lie_algebra, axes=1))
        if np.linalg.norm(step) < 1e-15:
            break
    return np.linalg.norm(translate_out(X - Q @ Y))
