"""The symmetries of an instance: what the data cannot tell apart.

Three kinds leave every logit matrix's softmax (hence B) unchanged:

- the stabiliser group ``G = {Q : Q^T W_h Q = W_h for all h, Q^T u_h = u_h}``
  acting as ``X -> Q X``; its Lie algebra is
  ``g = {A : A^T W_h + W_h A = 0, A^T u_h = 0}``, computed here as a null space.
  With ONE head and a key bias the group is larger than problem.md says: the
  bias only shifts column means, so all of Stab(W) acts, affinely,
  ``X -> Q (X - m 1^T) + m' 1^T`` with ``W^T m' + u = Q^{-T} (W^T m + u)``
  (checked: the loss is unchanged to 1e-31 while X moves by O(1));
- translations ``X -> X + v 1^T`` with ``W_h^T v = 0`` for every head (the
  extra logits ``X^T W_h v 1^T`` and ``(u_h^T v) 1 1^T`` are constant along
  rows and cancel in the softmax; for the output variant ``W_V,h^T v = 0``
  is needed too);
- the reflection ``X -> -X - 2 v 1^T`` when one v solves ``W_h^T v = u_h`` for
  every head: the sign flip ``X -> -X`` when every u_h = 0 (the logits are
  even in X), and with biases too whenever that system is consistent (always
  for one invertible head; real layers with a query bias have it, found on
  MiniLM). A finite symmetry, not counted in the dimension. The output
  variant has none.

Above d = LIE_DENSE_MAX_D the dense ``(H d^2, d^2)`` system for g is not built: heads whose
ranks split d (``W_h = W_q^T P_h W_k``, a BERT layer) go through :func:`factored_algebra`, two
generic invertible heads through the commutant of ``W_1^{-1} W_2`` (one head: of ``(W + W^T)^{-1}
(W - W^T)``). Above d = LIE_COMMUTANT_MIN_D the commutant is taken where it applies (the dense
system where it does not).

``symmetry_dimension`` is ``dim g + dim(translations)``: the dimension of the
orbit of a generic X, i.e. the number of directions the unregularised Hessian
is singular along at an exact solution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from .errors import InvalidProblemError
from .problem import OUTPUT, Problem


def _null_space(M: np.ndarray, rtol: float, scale: float = 0.0) -> np.ndarray:
    """Orthonormal basis (columns) of the null space of M, rank decided at ``rtol * max(s_max, scale)``."""
    if M.size == 0:
        return np.eye(M.shape[1])
    if M.shape[0] > M.shape[1]:  # same singular values and right vectors, at the cost of a square SVD
        M = np.linalg.qr(M, mode="r")
    _, s, vh = np.linalg.svd(M)
    smax = max(s[0] if s.size else 0.0, scale)
    rank = int(np.sum(s > rtol * max(smax, np.finfo(float).tiny)))
    return vh[rank:].T.conj()


@dataclass(frozen=True)
class Symmetry:
    """Symmetries of one instance.

    - `lie_algebra`: (k, d, d) basis of g (empty (0, d, d) when the group is finite)
    - `translations`: (d, t) orthonormal basis of admissible translation directions v
    - `sign_flip`: whether the reflection ``X -> -X - 2 v 1^T`` is a symmetry (v = `reflection_shift`)
    - `reflection_shift`: (d,) the v of the reflection (0 without bias), None when there is none
    """

    lie_algebra: np.ndarray
    translations: np.ndarray
    sign_flip: bool
    reflection_shift: np.ndarray | None = None
    # one head with a key bias: Stab(W) acts affinely, X -> Q (X - m 1^T) + m'(Q) 1^T with
    # W^T m' + u = Q^{-T} (W^T m + u) (m the mean column); (W, u) of that head, else None
    affine: tuple | None = None

    def act(self, Q: np.ndarray, X: np.ndarray) -> np.ndarray:
        """The group element Q (in Stab(W)) applied to X."""
        if self.affine is None:
            return Q @ X
        W, u = self.affine
        m = X.mean(axis=1)
        m2 = np.linalg.solve(W.T, np.linalg.solve(Q.T, W.T @ m + u) - u)
        return Q @ (X - m[:, None]) + m2[:, None]

    def act_derivative(self, Q: np.ndarray, A: np.ndarray, X: np.ndarray) -> np.ndarray:
        """d/ds of act(Q expm(s A), X) at s = 0."""
        if self.affine is None:
            return Q @ A @ X
        W, u = self.affine
        m = X.mean(axis=1)
        dm = np.linalg.solve(W.T, -np.linalg.solve(Q.T, A.T @ (W.T @ m + u)))
        return Q @ A @ (X - m[:, None]) + dm[:, None]

    @property
    def dimension(self) -> int:
        return int(self.lie_algebra.shape[0] + self.translations.shape[1])

    def orbit_tangent(self, X: np.ndarray) -> np.ndarray:
        """(dn, dimension) basis of the tangent space of the orbit at X (row-major vec)."""
        d, n = X.shape
        eye = np.eye(d)
        cols = [self.act_derivative(eye, A, X).reshape(-1) for A in self.lie_algebra]
        cols += [np.outer(v, np.ones(n)).reshape(-1) for v in self.translations.T]
        return np.array(cols).T if cols else np.zeros((d * n, 0))


def symmetries(problem: Problem, rtol: float = 1e-10, factors: tuple | None = None) -> Symmetry:
    """Compute the stabiliser algebra, translations and sign flip of ``problem``.

    **Arguments**
    - `problem`: the instance.
    - `rtol`: relative threshold of the rank decisions.
    - `factors`: optional ``(W_q, W_k, head_dim)``, (d, d), (d, d), int, with
      ``W_h = W_q,h^T W_k,h / sqrt(head_dim)`` (``W_q,h`` the h-th block of ``head_dim`` rows): the
      heads of a BERT-style layer (:func:`factored_algebra`). Above ``d = LIE_DENSE_MAX_D`` the
      factors are found from the heads themselves (:func:`head_factors`) when their ranks add up
      to d, so ``solver.recover`` needs no argument for such a layer.
    """
    d = problem.d
    W = np.asarray(problem.W, dtype=np.float64)
    if factors is not None:
        Wq, Wk, dh = factors
        Wq, Wk = np.asarray(Wq, np.float64), np.asarray(Wk, np.float64)
        sizes = _check_factors(W, Wq, Wk, int(dh))
        return _with_translations_and_reflection(
            problem, W, factored_algebra(problem, Wq / math.sqrt(dh), Wk, sizes, rtol), rtol)
    affine = None
    if problem.heads == 1 and problem.has_bias and problem.variant != OUTPUT and \
            np.linalg.cond(W[0]) < 1e12:
        # the bias shifts only column means, which the mean column m absorbs (see Symmetry.affine)
        affine = (W[0], np.asarray(problem.U[0], dtype=np.float64))
    if d > LIE_DENSE_MAX_D:  # the dense system below has H d^4 entries
        found = head_factors(W, rtol) if problem.heads >= 2 else None
        if found is not None:
            return _with_translations_and_reflection(problem, W, factored_algebra(problem, *found, rtol), rtol)
        return _symmetries_large(problem, W, rtol, affine)
    if d > LIE_COMMUTANT_MIN_D:
        from .errors import MemoryBudgetError

        try:
            return _symmetries_large(problem, W, rtol, affine)
        except MemoryBudgetError:
            pass  # the commutant reduction does not apply; the dense system below still fits
    rows = []
    eye = np.eye(d)
    for Wh in W:
        # vec_r(A^T W + W A) = (W^T (x) I) P vec_r(A) + (W (x) I) vec_r(A), P the transpose permutation
        rows.append(np.kron(eye, Wh.T)[:, _transpose_perm(d)] + np.kron(Wh, eye))
    if affine is None:
        for uh in np.asarray(problem.U, dtype=np.float64):
            if np.any(uh != 0):
                # A^T u = 0  <=>  sum_a A[a, b] u[a] = 0 for every b
                rows.append(np.kron(uh[None, :], eye))
    if problem.variant == OUTPUT:
        # X^T W_V must be unchanged too: A^T w = 0 for every column w of every W_V,h
        for Wv in np.asarray(problem.W_V, dtype=np.float64):
            for w in Wv.T:
                rows.append(np.kron(w[None, :], eye))
    M = np.vstack(rows)
    scale = max(1.0, float(np.max(np.abs(M))))
    basis = _null_space(M / scale, rtol)
    lie = basis.T.reshape(-1, d, d) if basis.size else np.zeros((0, d, d))

    return _with_translations_and_reflection(problem, W, lie, rtol, affine)


LIE_DENSE_MAX_D = 64  # above this d, the stabiliser algebra comes from the commutant (or the head factors)
# above this d, the commutant is tried first: the dense system's QR and SVDs (8192 x 4096 at d = 64, two
# heads) took 80 s of a 162 s recover at (64, 256), and recheck repeats them; one head's 4096 x 4096 SVD
# took 63 s of recover and 75 s of recheck at (64, 128) (profile, 3 runs on 2 cores)
LIE_COMMUTANT_MIN_D = 32


def _symmetries_large(problem: Problem, W: np.ndarray, rtol: float, affine: tuple | None = None) -> Symmetry:
    """:func:`symmetries` without the (H d^2) x d^2 system (above LIE_COMMUTANT_MIN_D).

    Every A in the algebra commutes with ``C = W_1^{-1} W_2`` (differentiate
    ``Q^{-1} C Q = C``, which follows from ``Q^T W_h Q = W_h``). One head pairs the symmetric and
    antisymmetric parts instead, ``W_1 = W + W^T`` and ``W_2 = W - W^T``: ``Q^T W Q = W`` preserves
    both (it preserves ``W^T`` too). When C has distinct
    eigenvalues, ``C = V diag(lambda) V^{-1}``, its real commutant is d-dimensional,
    spanned by ``v_k w_k^T`` (real eigenvalues) and the real and imaginary parts of
    that matrix (complex pairs), w_k the rows of V^{-1}; the constraints of the
    algebra are then a (H d^2 + ...) x d system. Otherwise (a singular W_1, repeated
    eigenvalues) it refuses with MemoryBudgetError. ``affine``: one head's bias, absorbed by the
    column mean (`Symmetry.affine`) instead of constraining A, as in :func:`symmetries`.
    """
    from .errors import MemoryBudgetError

    d = problem.d
    need = 8 * (problem.heads + 2) * d**4
    reason = None
    first, second = (W[0], W[1]) if problem.heads >= 2 else (W[0] + W[0].T, W[0] - W[0].T)
    if np.linalg.cond(first) > 1e12:
        reason = "W_1 is singular" if problem.heads >= 2 else "W + W^T is singular"
    if reason is None:
        lam, V = np.linalg.eig(np.linalg.solve(first, second))
        scale = max(1.0, float(np.max(np.abs(lam))))
        gaps = np.abs(lam[:, None] - lam[None, :]) + np.eye(d) * scale
        if float(gaps.min()) < 1e-8 * scale or np.linalg.cond(V) > 1e10:
            reason = ("W_1^{-1} W_2" if problem.heads >= 2 else "(W + W^T)^{-1} (W - W^T)") + \
                " has (nearly) repeated eigenvalues"
    if reason is not None:
        raise MemoryBudgetError(
            f"symmetry analysis at d = {d}: the commutant reduction does not apply ({reason}), and the dense "
            f"system needs about {need / 1024**3:.1f} GiB; use d <= {LIE_DENSE_MAX_D} or generic heads")
    Vinv = np.linalg.inv(V)
    basis = []
    for k in range(d):
        E = np.outer(V[:, k], Vinv[k])
        if abs(lam[k].imag) <= 1e-12 * scale:
            basis.append(E.real)
        elif lam[k].imag > 0:
            basis += [E.real, E.imag]
    basis = np.array([B / np.linalg.norm(B) for B in basis])

    def constraints(A):
        out = [A.T @ Wh + Wh @ A for Wh in W]
        if affine is None:
            out += [A.T @ uh for uh in np.asarray(problem.U, np.float64) if np.any(uh != 0)]
        if problem.variant == OUTPUT:
            out += [A.T @ Wv for Wv in np.asarray(problem.W_V, np.float64)]
        return np.concatenate([o.reshape(-1) for o in out])

    K = np.stack([constraints(B) for B in basis], axis=1)
    null = _null_space(K / max(1.0, float(np.max(np.abs(K)))), rtol)
    if null.shape[1]:
        q, _ = np.linalg.qr(np.tensordot(basis, null, axes=(0, 0)).reshape(d * d, -1))
        lie = q.T.reshape(-1, d, d)
    else:
        lie = np.zeros((0, d, d))
    return _with_translations_and_reflection(problem, W, lie, rtol, affine)


def head_factors(W: np.ndarray, rtol: float = 1e-10) -> tuple | None:
    """``(W_q, W_k, sizes)`` with ``W_h = W_q,h^T W_k,h`` (blocks of ``sizes[h]`` rows), or None.

    From the SVD ``W_h = U_h diag(s_h) V_h^T`` truncated at ``rtol * s_max``:
    ``W_q,h = diag(s_h)^(1/2) U_h^T``, ``W_k,h = diag(s_h)^(1/2) V_h^T``. None unless the ranks add
    up to d and both stacks are invertible (condition number below 1e12): the structure of a
    multi-head layer whose heads split the model dimension (all-MiniLM-L6-v2: 12 heads of rank 32,
    d = 384). The factors are unique up to ``W_q,h -> G_h W_q,h``, ``W_k,h -> G_h^{-T} W_k,h``,
    which does not change the algebra computed from them.
    """
    d = W.shape[-1]
    q_rows, k_rows, sizes = [], [], []
    for Wh in W:
        U, s, Vt = np.linalg.svd(Wh)
        r = int(np.sum(s > rtol * max(float(s[0]), np.finfo(float).tiny)))
        root = np.sqrt(s[:r])[:, None]
        q_rows.append(root * U[:, :r].T)
        k_rows.append(root * Vt[:r])
        sizes.append(r)
    if sum(sizes) != d:
        return None
    Wq, Wk = np.vstack(q_rows), np.vstack(k_rows)
    if max(np.linalg.cond(Wq), np.linalg.cond(Wk)) > 1e12:
        return None
    return Wq, Wk, sizes


def _check_factors(W: np.ndarray, Wq: np.ndarray, Wk: np.ndarray, dh: int) -> list[int]:
    H, d = W.shape[0], W.shape[-1]
    if Wq.shape != (d, d) or Wk.shape != (d, d) or H * dh != d:
        raise InvalidProblemError(
            f"factors: expected W_q, W_k of shape ({d}, {d}) and head_dim * heads = d, got {Wq.shape}, {Wk.shape}, "
            f"head_dim {dh} with {H} heads")
    for h in range(H):
        rows = slice(h * dh, (h + 1) * dh)
        err = float(np.max(np.abs(Wq[rows].T @ Wk[rows] / math.sqrt(dh) - W[h])))
        if err > 1e-8 * max(1.0, float(np.max(np.abs(W[h])))):
            raise InvalidProblemError(f"factors: W_q,h^T W_k,h / sqrt(head_dim) differs from W[{h}] by {err:.3g}; "
                                      f"pass the query and key weights of this very layer, heads in order")
    return [dh] * H


def factored_algebra(problem: Problem, Wq: np.ndarray, Wk: np.ndarray, sizes, rtol: float = 1e-10) -> np.ndarray:
    """Basis (k, d, d) of ``g = {A : A^T W_h + W_h A = 0, A^T u_h = 0}`` for heads ``W_h = W_q^T P_h W_k``.

    ``P_h`` projects onto the h-th block of coordinates (``sizes[h]`` of them); W_q and W_k are
    invertible. With ``Q_q = W_q Q W_q^{-1}`` and ``Q_k = W_k Q W_k^{-1}``, ``Q^T W_h Q = W_h`` reads
    ``Q_q^T P_h Q_k = P_h``. Summing over h gives ``Q_k = Q_q^{-T}``; then ``Q_q^T`` commutes with
    every P_h, so ``Q_q = a`` is block-diagonal, and ``N a N^{-1} = a^{-T}`` with
    ``N = W_k W_q^{-1}``. At the identity: ``A = W_q^{-1} alpha W_q`` with alpha block-diagonal and
    ``N alpha + alpha^T N = 0``, block by block ``N_gj alpha_j + alpha_g^T N_gj = 0``. The bias
    condition ``A^T u_h = 0`` is ``alpha^T c_h = 0`` with ``c_h = W_q^{-T} u_h`` (likewise the
    columns of W_V for the output variant), block by block too.

    Solved in two exact stages instead of the ``(H d^2, d^2)`` dense system:
    1. the diagonal blocks, ``N_hh alpha_h + alpha_h^T N_hh = 0`` with the constraint rows: an
       (r_h^2 + ..., r_h^2) null space per head (generic N_hh: floor(r_h / 2) dimensions);
    2. the off-diagonal blocks on the sum of those null spaces: a QR of ``d^2 - sum r_h^2``
       rows against k columns, streamed one block row at a time.
    At d = 384, 12 heads of 32: twelve 1024 x 1024 SVDs and at most 192 columns in stage 2.
    """
    d = Wq.shape[0]
    offsets = np.r_[0, np.cumsum(sizes)].astype(int)
    Wq_inv = np.linalg.inv(Wq)
    N = Wk @ Wq_inv
    N = N / max(1.0, float(np.max(np.abs(N))))  # the algebra is unchanged by a scale of N
    cons = [Wq_inv.T @ np.asarray(uh, np.float64) for uh in np.asarray(problem.U, np.float64) if np.any(uh != 0)]
    if problem.variant == OUTPUT:
        cons += list((Wq_inv.T @ np.hstack(list(np.asarray(problem.W_V, np.float64)))).T)
    basis = []  # (head, (r, r) matrix alpha_h)
    for h, r in enumerate(sizes):
        blk = slice(offsets[h], offsets[h + 1])
        Nh, eye = N[blk, blk], np.eye(r)
        rows = [np.kron(Nh, eye) + np.kron(eye, Nh.T)[:, _transpose_perm(r)]]
        rows += [np.kron(c[blk][None, :], eye) for c in cons]  # (alpha_h^T c)_b = sum_a alpha_h[a, b] c[a]
        M = np.vstack(rows)
        null = _null_space(M / max(1.0, float(np.max(np.abs(M)))), rtol)
        basis += [(h, a.reshape(r, r)) for a in null.T]
    k = len(basis)
    if k == 0:
        return np.zeros((0, d, d))
    R = np.zeros((0, k))
    for g in range(len(sizes)):
        # block row g of N alpha + alpha^T N off the diagonal: N_gh alpha_h (column block h) + alpha_g^T N_gj
        rg = slice(offsets[g], offsets[g + 1])
        chunk = np.zeros((sizes[g], d, k))
        for i, (h, a) in enumerate(basis):
            cols = slice(offsets[h], offsets[h + 1])
            if h != g:
                chunk[:, cols, i] = N[rg, cols] @ a
            else:
                chunk[:, :, i] = a.T @ N[rg]
                chunk[:, rg, i] = 0.0  # the diagonal block is stage 1's
        R = np.linalg.qr(np.vstack([R, chunk.reshape(-1, k)]), mode="r")
    # N is scaled to entries <= 1 and the basis is orthonormal: the operator's scale is 1, whatever is
    # left off the diagonal (a block-diagonal N leaves rounding only, which must not set the scale)
    coef = _null_space(R, rtol, scale=1.0)
    if coef.shape[1] == 0:
        return np.zeros((0, d, d))
    out = np.zeros((coef.shape[1], d, d))
    for i, (h, a) in enumerate(basis):
        blk = slice(offsets[h], offsets[h + 1])
        out[:, blk, blk] += coef[i][:, None, None] * a
    lie = np.einsum("ab,kbc,cd->kad", Wq_inv, out, Wq)  # A = W_q^{-1} alpha W_q
    q, _ = np.linalg.qr(lie.reshape(len(lie), -1).T)
    return q.T.reshape(-1, d, d)


def _with_translations_and_reflection(problem: Problem, W: np.ndarray, lie: np.ndarray, rtol: float,
                                      affine: tuple | None = None) -> Symmetry:
    """The Symmetry with stabiliser algebra ``lie``, plus the translations and the reflection of ``problem``."""
    trans_rows = [Wh.T for Wh in W]
    if problem.variant == OUTPUT:
        trans_rows += [Wv.T for Wv in np.asarray(problem.W_V, dtype=np.float64)]
    T = np.vstack(trans_rows)
    translations = _null_space(T / max(1.0, float(np.max(np.abs(T)))), rtol)
    v = _reflection_shift(problem, W)
    return Symmetry(lie_algebra=lie, translations=translations, sign_flip=v is not None, reflection_shift=v,
                    affine=affine)


def _reflection_shift(problem: Problem, W: np.ndarray, rtol: float = 1e-10) -> np.ndarray | None:
    """v with ``W_h^T v = u_h`` for every head, or None.

    ``X -> -X - 2 v 1^T`` changes each logit matrix by terms constant along rows
    (``2 X^T W_h v 1^T`` and multiples of ``1 1^T``) plus ``1 (2 W_h^T v - 2 u_h)^T X``,
    which vanishes exactly when ``W_h^T v = u_h``: then every B_h is unchanged. With u = 0 this is
    the sign flip (v = 0). The output variant has none (``X^T W_V`` changes sign).
    """
    if problem.variant == OUTPUT:
        return None
    d = problem.d
    if not problem.has_bias:
        return np.zeros(d)
    A = np.vstack([Wh.T for Wh in W])
    b = np.concatenate([np.asarray(uh, np.float64) for uh in problem.U])
    v = np.linalg.lstsq(A, b, rcond=None)[0]
    scale = max(1.0, float(np.max(np.abs(A))) * float(np.max(np.abs(v))), float(np.max(np.abs(b))))
    return v if float(np.max(np.abs(A @ v - b))) <= rtol * scale else None


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


def _translate_out(T: np.ndarray, R: np.ndarray) -> np.ndarray:
    """R without its best translation ``v 1^T``, v in span(T) (T orthonormal, (d, t)): ``v = T T^T`` mean column."""
    if T.shape[1] == 0:
        return R
    return R - np.outer(T @ (T.T @ R.mean(axis=1)), np.ones(R.shape[1]))


def balance(sym: Symmetry, X: np.ndarray, max_iter: int = 100) -> tuple[np.ndarray, float]:
    """A point of the orbit of X of (locally) smallest Frobenius norm, and that norm.

    The closed form returns X only up to the stabiliser, and that group is not compact for a
    generic W (real eigenvalue pairs of the cosquare give hyperbolic one-parameter subgroups):
    on a planted one-head (8, 16) instance (seed 79) it returned a representative of norm 4064
    for a planted X of norm 7.2, where the Hessian-Lipschitz bound is 2e12 and no certificate
    holds. Newton on ``phi(s) = 1/2 ||act(expm(sum_k s_k A_k), Y)||^2`` at s = 0, re-based at the
    new point after every accepted step (so each group element applied is small): gradient
    ``<Y, D_k>`` with ``D_k`` the orbit tangent, Hessian in closed form for the linear action
    (``<A_k Y, A_l Y> + <Y, (A_k A_l + A_l A_k) Y> / 2``; central differences of the gradient for
    the affine one), shifted past its most negative eigenvalue where it is not positive definite,
    halving until phi decreases.
    Admissible translations ``v 1^T`` are removed in closed form. Every step applies an exact
    group element, so the loss moves only by rounding (the caller re-polishes).
    """
    X = np.asarray(X, np.float64)
    T = sym.translations

    def translate_out(Z):
        return _translate_out(T, Z)

    Y = translate_out(X)
    basis = sym.lie_algebra
    k = basis.shape[0]
    eye = np.eye(X.shape[0])

    def moved(Z, c):
        return translate_out(sym.act(scipy.linalg.expm(np.tensordot(c, basis, axes=1)), Z))

    def grad(Z):
        return np.array([float(np.sum(Z * translate_out(sym.act_derivative(eye, A, Z)))) for A in basis])

    linear = sym.affine is None and T.shape[1] == 0
    if linear:
        d = X.shape[0]
        stacked = basis.reshape(k * d, d)  # rows (k, a): A_k Y is one (k d, d) x (d, n) product
        stacked_t = np.ascontiguousarray(basis.transpose(0, 2, 1)).reshape(k * d, d)
    for _ in range(max_iter if k else 0):
        f0 = 0.5 * float(np.sum(Y * Y))
        if linear:
            D = (stacked @ Y).reshape(k, -1)  # row k: A_k Y, flattened (the orbit tangent)
            g = D @ Y.reshape(-1)  # <Y, A_k Y>
        else:
            g = grad(Y)
        if np.linalg.norm(g) <= 1e-13 * 2 * f0:
            break
        if linear:
            # linear action: d2/ds_k ds_l 1/2 ||expm(sum s A) Y||^2 at 0 = <A_k Y, A_l Y> + <Y, (A_k A_l + A_l A_k) Y> / 2,
            # and <Y, A_k A_l Y> = <A_k^T Y, A_l Y>: three BLAS products (NumPy's einsum took 25% of a
            # one-head (64, 128) seed here, in its own loops)
            C = (stacked_t @ Y).reshape(k, -1) @ D.T  # [k, l] = <A_k^T Y, A_l Y>
            Hm = D @ D.T + 0.5 * (C + C.T)
        else:  # affine action or translations: central differences of the gradient
            h = 1e-6
            Hm = np.array([(grad(moved(Y, h * e)) - grad(moved(Y, -h * e))) / (2 * h) for e in np.eye(k)])
        Hm = (Hm + Hm.T) / 2
        try:
            np.linalg.cholesky(Hm)
            step = -np.linalg.solve(Hm, g)
        except np.linalg.LinAlgError:
            # shifted past its most negative eigenvalue (Levenberg): the gradient step scaled by
            # 1 / max |eigenvalue| that was here crawled and stopped far from the minimum (one head
            # (64, 128), seed 38: 311.8 after 3.8 s, where this reaches 229.3 in 0.6 s)
            ev = np.linalg.eigvalsh(Hm)
            shift = 1.1 * max(0.0, -float(ev[0])) + 1e-8 * float(np.abs(ev).max())
            step = -np.linalg.solve(Hm + shift * np.eye(k), g)
        for _ in range(60):
            with np.errstate(over="ignore", invalid="ignore"):  # a too-long step overflows: halve it
                Z = moved(Y, step)
                if np.all(np.isfinite(Z)) and 0.5 * float(np.sum(Z * Z)) < f0:
                    break
            step = step / 2
        else:
            break
        Y = Z
        if 0.5 * float(np.sum(Y * Y)) > f0 * (1 - 1e-12):  # no longer decreasing: at the minimum
            break
    return Y, float(np.linalg.norm(Y))


def component_flips(problem: Problem, rtol: float = 1e-9) -> list[np.ndarray]:
    """Elements of Stab(W) outside its identity component, one per real eigenvalue pair of the cosquare.

    One head: the cosquare ``C = W^-T W`` has its eigenvalues in pairs ``(lambda, 1/lambda)``; on
    each real pair (``lambda != +-1``) the stabiliser acts as a hyperbolic one-parameter group
    ``diag(e^t, e^-t)`` in the pair's eigenvectors, which never reaches ``-I`` on that plane. With
    V the eigenvectors, ``Q_i = V D_i V^-1`` (``D_i = -1`` on pair i, 1 elsewhere) is in the group
    and in another component (V a real basis of the invariant subspaces: complex-conjugate pairs
    contribute the real and imaginary parts of one eigenvector). Empty for several heads, or
    where that basis is ill-conditioned.
    """
    if problem.heads != 1:
        return []
    W = np.asarray(problem.W[0], np.float64)
    try:
        ev, V = np.linalg.eig(np.linalg.solve(W.T, W))
    except np.linalg.LinAlgError:
        return []
    real = [i for i in range(len(ev)) if abs(ev[i].imag) <= rtol * max(1.0, abs(ev[i])) and abs(abs(ev[i].real) - 1) > 1e-6]
    pairs, used = [], set()
    for i in real:
        if i in used:
            continue
        rest = [j for j in real if j != i and j not in used]
        if not rest:
            break
        j = min(rest, key=lambda j: abs(ev[i].real * ev[j].real - 1))
        if abs(ev[i].real * ev[j].real - 1) > 1e-6:
            continue
        pairs.append((i, j))
        used |= {i, j}
    # a real basis of the invariant subspaces: the eigenvector itself for a real eigenvalue, the real
    # and imaginary parts of one eigenvector for each complex-conjugate pair (V.real alone is singular)
    Vr = np.empty(V.shape)
    done = set()
    for i in range(len(ev)):
        if i in done:
            continue
        if abs(ev[i].imag) <= rtol * max(1.0, abs(ev[i])):
            Vr[:, i] = V[:, i].real
            done.add(i)
            continue
        k = min((k for k in range(len(ev)) if k != i and k not in done), key=lambda k: abs(ev[k] - np.conj(ev[i])),
                default=None)
        if k is None:
            return []
        Vr[:, i], Vr[:, k] = V[:, i].real, V[:, i].imag
        done |= {i, k}
    if not pairs or np.linalg.cond(Vr) > 1e8:
        return []
    Vinv = np.linalg.inv(Vr)
    flips = []
    for i, j in pairs:
        D = np.ones(len(ev))
        D[[i, j]] = -1
        Q = Vr @ np.diag(D) @ Vinv
        if _preserves(W, Q):  # in the group to rounding, or not used
            flips.append(Q)
    return flips


def _preserves(W: np.ndarray, Q: np.ndarray) -> bool:
    """``Q^T W Q = W`` to ``1e-8 max(1, ||W||_max)``: the test a computed element of Stab(W) passes
    before it is used (:func:`component_flips`, :func:`_real_group_element`)."""
    return bool(np.abs(Q.T @ W @ Q - W).max() <= 1e-8 * max(1.0, float(np.abs(W).max())))


def _cosquare_blocks(problem: Problem, rtol: float = 1e-9):
    """The one-head stabiliser in the eigenbasis of the cosquare ``C = W^-T W``: ``(ev, V, Vinv, L)``
    with ``Q = V diag(exp(L c)) V^-1`` for ``c`` in R^k, k the group's dimension, or None (several
    heads, an ill-conditioned eigenbasis, or eigenvalues that do not fall into the generic blocks).

    Any Q in the stabiliser commutes with C, so it acts by a scalar ``mu`` on each eigenvector, with
    ``mu_lambda mu_(1/lambda) = 1`` (Q preserves the pairing of lambda with 1/lambda that W defines)
    and ``mu_conj(lambda) = conj(mu_lambda)`` (Q real). The blocks, and L's columns:

    - a real pair ``(lambda, 1/lambda)``: ``mu = e^t`` and ``e^-t`` (one column, +1 and -1); ``mu < 0``
      is another component (:func:`component_flips`);
    - a complex pair on the unit circle ``(lambda, conj(lambda) = 1/lambda)``: ``e^(i phi)``,
      ``e^(-i phi)`` (one column, +i and -i): a circle;
    - a quadruple ``(lambda, conj, 1/lambda, 1/conj)``: ``mu = e^(a + i phi)`` on lambda (two columns).
    """
    if problem.heads != 1:
        return None
    W = np.asarray(problem.W[0], np.float64)
    try:
        ev, V = np.linalg.eig(np.linalg.solve(W.T, W))
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(ev)) or np.linalg.cond(V) > 1e8:
        return None
    d = len(ev)

    def nearest(z, exclude):
        rest = [j for j in range(d) if j not in exclude]
        return min(rest, key=lambda j: abs(ev[j] - z)) if rest else None

    def close(a, b):
        return abs(a - b) <= 1e-6 * max(1.0, abs(a))

    cols, used = [], set()
    for i in range(d):
        if i in used:
            continue
        col = np.zeros(d, complex)
        if abs(ev[i].imag) <= rtol * max(1.0, abs(ev[i])):  # real: its partner 1/lambda
            j = nearest(1 / ev[i].real, used | {i})
            if j is None or not close(ev[j], 1 / ev[i]) or abs(abs(ev[i].real) - 1) <= 1e-6:
                return None
            col[i], col[j] = 1, -1
            cols.append(col)
            used |= {i, j}
            continue
        ci = nearest(np.conj(ev[i]), used | {i})
        if ci is None or not close(ev[ci], np.conj(ev[i])):
            return None
        if abs(abs(ev[i]) - 1) <= 1e-6:  # on the unit circle: conj(lambda) = 1/lambda
            col[i], col[ci] = 1j, -1j
            cols.append(col)
            used |= {i, ci}
            continue
        pi_ = nearest(1 / ev[i], used | {i, ci})
        pc = None if pi_ is None else nearest(np.conj(1 / ev[i]), used | {i, ci, pi_})
        if pc is None or not close(ev[pi_], 1 / ev[i]) or not close(ev[pc], np.conj(1 / ev[i])):
            return None
        col[[i, ci, pi_, pc]] = 1j, -1j, -1j, 1j
        cols.append(col)
        col = np.zeros(d, complex)
        col[[i, ci, pi_, pc]] = 1, 1, -1, -1
        cols.append(col)
        used |= {i, ci, pi_, pc}
    return ev, V, np.linalg.inv(V), np.array(cols).T.reshape(d, len(cols))


def _real_group_element(problem: Problem, V, Vinv, delta) -> np.ndarray | None:
    """``V diag(delta) V^-1`` as a real matrix, or None where it is not real or fails :func:`_preserves`."""
    Qc = (V * delta) @ Vinv
    Q = Qc.real
    if not np.all(np.isfinite(Qc)) or np.abs(Qc.imag).max() > 1e-8 * max(1.0, float(np.abs(Q).max())):
        return None
    return Q if _preserves(np.asarray(problem.W[0], np.float64), Q) else None


def component_turns(problem: Problem, angles=(0.5 * math.pi, math.pi, 1.5 * math.pi)) -> list[np.ndarray]:
    """Far elements of the stabiliser's compact directions: for each circle of :func:`_cosquare_blocks`
    (a complex pair on the unit circle, or the ``phi`` of a quadruple), the element turning it by
    each angle in ``angles``, everything else fixed. In the identity component, but
    ``||act(Q, X)||`` is not convex in ``phi``, and :func:`balance` (a local method) stays in the
    basin it starts in. Elements that fail :func:`_real_group_element`'s test are left out."""
    blocks = _cosquare_blocks(problem)
    if blocks is None:
        return []
    _, V, Vinv, L = blocks
    turns = []
    for col in L.T:
        if not np.all(col.real == 0):  # a hyperbolic column
            continue
        for phi in angles:
            Q = _real_group_element(problem, V, Vinv, np.exp(col * phi))
            if Q is not None:
                turns.append(Q)
    return turns


def _orbit_norm_f(M, L, signs, C) -> np.ndarray:
    """``f_s = Re(delta_s^H M delta_s)``, ``delta_s = signs_s o exp(L c_s)``, for every row s of C."""
    D = signs * np.exp(C @ L.T)
    return np.real(np.sum(D.conj() * (D @ M.T), axis=1))


def _orbit_norm_derivatives(M, L, signs, C) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(f, g, H)`` of :func:`_orbit_norm_f` for every row of C (M Hermitian): with ``w = conj(delta) o
    M delta`` and ``B = diag(delta) L``, ``g_p = 2 Re sum_i conj(L_ip) w_i`` and ``H = 2 Re(L^H diag(w)
    conj(L) + B^H M B)`` (d/dc_q of g: ``conj(delta_i)`` gains ``conj(L_iq)``, ``M delta`` gains ``M B``)."""
    D = signs * np.exp(C @ L.T)  # (S, d)
    w = D.conj() * (D @ M.T)
    Lc = L.conj()
    f = np.real(np.sum(w, axis=1))
    g = 2.0 * np.real(w @ Lc)
    B = D[:, :, None] * L[None]  # (S, d, k)
    H = 2.0 * np.real((Lc.T[None] * w[:, None, :]) @ Lc + np.conj(np.swapaxes(B, 1, 2)) @ (M @ B))
    return f, g, 0.5 * (H + np.swapaxes(H, 1, 2))


def orbit_norm_newton(M, L, signs, C0, max_iter: int = 200, gtol: float = 1e-10) -> np.ndarray:
    """Local minimisers of :func:`_orbit_norm_f` from every row of C0 at once (S starts, k
    coordinates): Newton with the closed-form Hessian, shifted past its most negative eigenvalue
    where it is not positive definite (as :func:`balance`), halving each start's step until its f
    decreases. A start stops at ``max |g| <= gtol``, when no halving decreases f, or when it gains
    less than a relative 1e-15. Replaces one BFGS run per start (scipy): at one head (64, 128),
    seed 109, 1024 runs took 48.6 s of Python overhead."""
    C = np.array(C0, np.float64)
    active = np.arange(C.shape[0])
    for _ in range(max_iter):
        if not active.size:
            break
        with np.errstate(over="ignore", invalid="ignore"):
            f, g, H = _orbit_norm_derivatives(M, L, signs[active], C[active])
        ok = np.isfinite(f) & np.all(np.isfinite(g), axis=1) & np.all(np.isfinite(H), axis=(1, 2))
        ok &= np.max(np.abs(g), axis=1, initial=0.0) > gtol
        active, f, g, H = active[ok], f[ok], g[ok], H[ok]
        if not active.size:
            break
        ev = np.linalg.eigvalsh(H)
        shift = np.where(ev[:, 0] > 0, 0.0, 1.1 * np.maximum(0.0, -ev[:, 0]) + 1e-8 * np.abs(ev).max(axis=1))
        k = H.shape[1]
        try:
            step = -np.linalg.solve(H + shift[:, None, None] * np.eye(k), g[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:  # (one exactly singular system stops the batched solve: least squares)
            step = -(np.linalg.pinv(H + shift[:, None, None] * np.eye(k)) @ g[:, :, None])[:, :, 0]
        moved = np.zeros(active.size, bool)
        gained = np.zeros(active.size, bool)
        trial = np.arange(active.size)
        for _ in range(60):
            with np.errstate(over="ignore", invalid="ignore"):
                Ct = C[active[trial]] + step[trial]
                ft = _orbit_norm_f(M, L, signs[active[trial]], Ct)
            better = np.isfinite(ft) & (ft < f[trial]) & np.all(np.isfinite(Ct), axis=1)
            C[active[trial[better]]] = Ct[better]
            moved[trial[better]] = True
            gained[trial[better]] = ft[better] < f[trial[better]] * (1 - 1e-15)
            trial = trial[~better]
            if not trial.size:
                break
            step[trial] *= 0.5
        active = active[moved & gained]
    return C


TORUS_STARTS = 64  # random starts of `orbit_norm_search`, besides the flip products and half-turns


def orbit_norm_search(problem: Problem, sym: Symmetry, X: np.ndarray, starts: int = TORUS_STARTS,
                      seed: int = 0, max_local: int = 2048, method: str = "newton") -> np.ndarray | None:
    """A group element Q with ``||Q X||`` small over the whole stabiliser (every component, every
    turn), or None where the search does not apply (several heads, an affine action or translations,
    blocks that :func:`_cosquare_blocks` cannot form).

    In the eigenbasis, ``||V diag(delta) Y||_F^2 = delta^H M delta`` with ``Y = V^-1 X`` and ``M =
    (V^H V) o conj(Y Y^H)`` (d x d), so the orbit's norm costs O(d^2) per point instead of a d x n
    product and a matrix exponential: local minimisations (:func:`orbit_norm_newton` on ``c``,
    ``delta = s exp(L c)``, s the signs of a flip product, every start at once) from every product of
    flips times every single half-turn (at most `max_local`, the rest drawn), plus `starts` random
    ones (uniform angles, random flips; `seed`).
    The best Q is returned as a real matrix tested to be in the group; the caller balances
    ``act(Q, X)`` with exact group elements (:func:`balance`). ``method="bfgs"``: one scipy BFGS run
    per start instead (the search before `orbit_norm_newton`; kept as the benchmark's baseline,
    ``benchmarks/orbit_bench.py``).
    """
    if method not in ("newton", "bfgs"):
        raise ValueError(f"method must be 'newton' or 'bfgs', got {method!r}")
    if sym.affine is not None or sym.translations.shape[1] or not sym.lie_algebra.shape[0]:
        return None
    blocks = _cosquare_blocks(problem)
    if blocks is None:
        return None
    ev, V, Vinv, L = blocks
    if L.shape[1] != sym.lie_algebra.shape[0]:
        return None
    Y = Vinv @ np.asarray(X, np.float64)
    M = (V.conj().T @ V) * (Y @ Y.conj().T).conj()
    scale = float(np.real(np.trace(M)))  # ||X||^2: f is minimised relative to it
    if not scale > 0 or not np.isfinite(scale):
        return None
    M = M / scale
    real_cols = [p for p in range(L.shape[1]) if np.all(L[:, p].imag == 0) and np.count_nonzero(L[:, p]) == 2]
    circle_cols = [p for p in range(L.shape[1]) if np.all(L[:, p].real == 0)]
    flip_sets = [np.nonzero(L[:, p])[0] for p in real_cols]

    def signs(mask):
        sg = np.ones(len(ev))
        for b, idx in enumerate(flip_sets):
            if mask >> b & 1:
                sg[idx] = -1.0
        return sg

    rng = np.random.default_rng(seed)
    k = L.shape[1]
    plan = [(mask, p) for mask in range(2 ** len(flip_sets)) for p in [None] + circle_cols]
    if len(plan) > max_local:
        plan = [plan[i] for i in rng.choice(len(plan), max_local, replace=False)]
    inits = []
    for mask, p in plan:
        c0 = np.zeros(k)
        if p is not None:
            c0[p] = math.pi
        inits.append((signs(mask), c0))
    for _ in range(starts):
        c0 = np.zeros(k)
        c0[circle_cols] = rng.uniform(0, 2 * math.pi, len(circle_cols))
        inits.append((signs(int(rng.integers(2 ** len(flip_sets)))), c0))
    signs_all = np.array([sg for sg, _ in inits])
    C = np.array([c0 for _, c0 in inits])
    if method == "newton":
        C = orbit_norm_newton(M, L, signs_all, C)
    else:
        import scipy.optimize

        def fg(c, sign):
            delta = sign * np.exp(L @ c)
            Md = M @ delta
            return float(np.real(np.vdot(delta, Md))), 2.0 * np.real(L.conj().T @ (delta.conj() * Md))

        for i, sign in enumerate(signs_all):
            with np.errstate(over="ignore", invalid="ignore"):  # a too-long trial step overflows: the line search backs off
                C[i] = scipy.optimize.minimize(fg, C[i], args=(sign,), jac=True, method="BFGS",
                                               options={"gtol": 1e-10}).x
    with np.errstate(over="ignore", invalid="ignore"):
        f = _orbit_norm_f(M, L, signs_all, C)
    f[~(np.isfinite(f) & np.all(np.isfinite(C), axis=1))] = np.inf  # (argmin would pick a NaN)
    if not np.any(np.isfinite(f)):
        return None
    b = int(np.argmin(f))
    return _real_group_element(problem, V, Vinv, signs_all[b] * np.exp(L @ C[b]))


def balance_orbit(problem: Problem, sym: Symmetry, X: np.ndarray, sweeps: int = 3,
                  exhaustive_max: int = 6) -> tuple[np.ndarray, float]:
    """:func:`balance` over the components of the stabiliser too (:func:`component_flips`), and
    across the barriers of its compact directions: every product of flips when there are at most
    `exhaustive_max` of them (2^6 = 64 balances), else a greedy sweep (at most `sweeps`) that keeps a
    flip when it lowers the balanced norm; then :func:`orbit_norm_search` over the whole group, whose
    element is balanced in turn, and the lower of the two is kept.

    Planted one-head (8, 16) instances: seed 79, norm 4064 from the closed form, 20.9 after
    :func:`balance` (a minimum of its component), 7.04 in another one (planted: 7.18); seed 156,
    337 balanced, and the greedy sweep stops at 12.4 where two flips at once reach 6.15 (planted: 6.38).
    One head (64, 128), seed 38 (5 flips, the greedy sweep then): 104, where the 32 products of
    flips reach 32.0 (planted: 32.0) in 14 s; at 4 flips or fewer that search was exhaustive already.
    Seed 48 (3 flips, 16 circles): 62.7 after every product of flips, no single flip or half-turn
    lowers it, and a flip and a half-turn together reach 31.9 (planted: 32.0, 31.9 balanced); the
    orbit search finds that point (0.7 s for all of this function since `orbit_norm_newton`). Still
    a search, not a proof of the global minimum: the norm on the orbit is not convex.
    """
    Y, best = balance(sym, X)
    k = sym.lie_algebra.shape[0]
    flips = component_flips(problem) if k else []
    if flips and len(flips) <= exhaustive_max:
        start = Y
        for mask in range(1, 2 ** len(flips)):
            Q = np.eye(X.shape[0])
            for b, F in enumerate(flips):
                if mask >> b & 1:
                    Q = F @ Q
            Z, nz = balance(sym, sym.act(Q, start))
            if nz < best * (1 - 1e-9):
                Y, best = Z, nz
    else:
        for _ in range(sweeps if flips else 0):
            improved = False
            for Q in flips:
                Z, nz = balance(sym, sym.act(Q, Y))
                if nz < best * (1 - 1e-9):
                    Y, best, improved = Z, nz, True
            if not improved:
                break
    Q = orbit_norm_search(problem, sym, X) if k else None
    if Q is not None:
        Z, nz = balance(sym, sym.act(Q, X))
        if nz < best * (1 - 1e-9):
            Y, best = Z, nz
    return Y, best


def distance_to_orbit(problem: Problem, X: np.ndarray, X_true: np.ndarray, sym: Symmetry | None = None,
                      iterations: int = 50) -> float:
    """Relative Frobenius distance from X to the orbit of X_true, ``min ||X - g X_true|| / ||X_true||``.

    Minimises over the sign flip (when it is a symmetry), translations (closed
    form, they are linear) and the stabiliser (Gauss-Newton on the group
    coordinates from the identity, and from the least-squares Q with
    ``X ~ Q X_true`` when that Q is in the group, which reaches the other
    components: exact when the group is finite, a local minimum otherwise).
    """
    sym = symmetries(problem) if sym is None else sym
    X = np.asarray(X, float)
    X_true = np.asarray(X_true, float)
    norm = max(np.linalg.norm(X_true), np.finfo(float).tiny)
    candidates = [X_true, -X_true - 2 * np.outer(sym.reflection_shift, np.ones(X_true.shape[1]))] \
        if sym.sign_flip else [X_true]
    best = np.inf
    for Y in candidates:
        best = min(best, _orbit_fit(sym, X, Y, iterations) / norm)
    # the stabiliser can have components the identity component does not reach (a real
    # eigenvalue pair of the cosquare contributes t -> -t): try the least-squares Q with
    # X ~ Q X_true when it lies in the group
    centre = (lambda Z: Z - Z.mean(axis=1, keepdims=True)) if sym.affine is not None else (lambda Z: Z)
    Q = centre(X) @ np.linalg.pinv(centre(X_true))
    W = np.asarray(problem.W, np.float64)
    scale = max(1.0, float(np.max(np.abs(W))))

    def in_group(Q):
        return all(np.max(np.abs(Q.T @ Wh @ Q - Wh)) <= 1e-8 * scale for Wh in W) and (sym.affine is not None or all(
            np.max(np.abs(Q.T @ uh - uh)) <= 1e-8 * max(1.0, float(np.max(np.abs(uh)))) for uh in np.asarray(problem.U)))

    if problem.variant != OUTPUT and not in_group(Q) and best > 1e-8 and sym.affine is None:
        # the least-squares Q of a far representative (one head (64, 128), seed 38: singular values 14
        # and 0.054) errs by its conditioning times X's own error, above the 1e-8 test; project it onto
        # the group first (Gauss-Newton, minimum-norm steps) and test the projection instead
        Q = _project_to_group(problem, Q)
    if in_group(Q) and problem.variant != OUTPUT:
        best = min(best, _orbit_fit(sym, X, sym.act(Q, X_true), iterations) / norm)
    return float(best)


PROJECT_MAX_BYTES = 1 << 30  # largest Jacobian _project_to_group forms (else Q is returned unprojected)


def _project_to_group(problem: Problem, Q: np.ndarray, steps: int = 3, max_move: float = 1e-6) -> np.ndarray:
    """A point of ``{Q : Q^T W_h Q = W_h, Q^T u_h = u_h}`` near Q (the linear action): Gauss-Newton on
    those equations with minimum-norm steps (``lstsq`` on the (H (d^2 + d), d^2) Jacobian, O(d^6):
    about a minute at d = 64), from a Q that is already nearly in the group (relative defect at most
    ``max_move``); Q unchanged when it is not, when the steps move it by more than ``max_move ||Q||``,
    or when the Jacobian would exceed ``PROJECT_MAX_BYTES`` (d above about 107 with one head).
    The caller still tests membership, with the same tolerance as for any other Q."""
    d = Q.shape[0]
    W = np.asarray(problem.W, np.float64)
    U = np.asarray(problem.U, np.float64)
    if 8 * W.shape[0] * (d * d + d) * d * d > PROJECT_MAX_BYTES:  # the Jacobian: 136 MB at d = 64, 170 GB at 384
        return Q
    eye = np.eye(d)
    qn = float(np.linalg.norm(Q, 2))

    def residual(Z):
        return np.concatenate([(Z.T @ Wh @ Z - Wh).ravel() for Wh in W] + [Z.T @ uh - uh for uh in U])

    r = residual(Q)
    if not np.max(np.abs(r)) <= max_move * qn**2 * max(1.0, float(np.max(np.abs(W)))):
        return Q
    Z = Q.copy()
    for _ in range(steps):
        # d(Z^T W Z)_ab / dZ_ij = [j = a] (W Z)_ib + [j = b] (Z^T W)_ai ; d(Z^T u)_a / dZ_ij = [j = a] u_i
        J = np.concatenate([(np.einsum("ja,ib->abij", eye, Wh @ Z) + np.einsum("jb,ai->abij", eye, Z.T @ Wh))
                            .reshape(d * d, d * d) for Wh in W]
                           + [np.einsum("ja,i->aij", eye, uh).reshape(d, d * d) for uh in U])
        step = np.linalg.lstsq(J, -r, rcond=None)[0].reshape(d, d)
        Z = Z + step
        r = residual(Z)
        if np.linalg.norm(step) <= 1e-15 * qn:
            break
    return Z if np.linalg.norm(Z - Q) <= max_move * qn else Q


def _orbit_fit(sym: Symmetry, X, Y, iterations):
    d, n = X.shape
    T = sym.translations
    k = sym.lie_algebra.shape[0]

    def translate_out(R):
        return _translate_out(T, R)

    if k == 0:
        return np.linalg.norm(translate_out(X - Y))
    Q = np.eye(d)
    for _ in range(iterations):
        # Gauss-Newton on Q -> Q expm(sum_k s_k A_k); the Jacobian at s = 0 is exact
        R = translate_out(X - sym.act(Q, Y))
        J = np.stack([translate_out(-sym.act_derivative(Q, A, Y)).reshape(-1) for A in sym.lie_algebra], axis=1)
        step, *_ = np.linalg.lstsq(J, -R.reshape(-1), rcond=None)
        Q = Q @ scipy.linalg.expm(np.tensordot(step, sym.lie_algebra, axes=1))
        if np.linalg.norm(step) < 1e-15:
            break
    return np.linalg.norm(translate_out(X - sym.act(Q, Y)))
