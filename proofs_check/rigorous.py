"""Rigorous mode: a proof, in ball arithmetic, that lambda_min(hess L) >= l on a whole box.

The Hessian of the attention-matrix loss is evaluated with python-flint
``arb`` balls on the box ``{X : |X_ai - Xc_ai| <= radius}`` (every entry a
ball, so every operation returns a ball containing all values it can take on
the box). With ``Hc`` the matrix of midpoints and ``Hr`` that of radii,
every Hessian on the box lies in ``Hc + E`` with ``||E||_2 <= ||Hr||_F``; by
Weyl ``lambda_min(H) >= lambda_min(Hc) - ||Hr||_F``, and ``lambda_min(Hc)``
is enclosed rigorously by flint's eigenvalue enclosure (Rump's method).
This is not mpmath's ``iv.cholesky``, whose undecided comparisons pass
silently (tooling.md).
"""

from __future__ import annotations

import math

import flint
import numpy as np

from derivations.lemmas import lemma
from solver.rounding import hessian_allowance, inf_norm

from . import midrad
from .region import Region


def _arb_array(a, rad=0.0):
    a = np.asarray(a, dtype=np.float64)
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = flint.arb(float(a[idx]), rad) if rad else flint.arb(float(a[idx]))
    return out


def _arb_point(X, dX=None, radius: float = 0.0):
    """arb balls of ``X + dX`` widened by ``radius``: ``dX`` is None, one float64 correction (d, n), or
    several (m, d, n) whose sum is the correction (a double-double tail, `solver.certificate`'s
    polish); the sum is exact in arb at the working precision, or a ball around it."""
    Xa = _arb_array(X, radius)
    if dX is not None:
        for c in np.asarray(dX, np.float64).reshape(-1, *np.shape(X)):
            Xa = Xa + _arb_array(c)
    return Xa


def correction_stats(dX, shape) -> tuple[float, float]:
    """``(max |sum dX|, upper bound on ||sum dX||_2)`` of a correction as `_arb_point` takes it."""
    if dX is None or np.size(dX) == 0:
        return 0.0, 0.0
    total = _arb_point(np.zeros(shape), dX)
    return float(max(abs(float(v.mid())) for v in total.reshape(-1))), _norm_upper(total.reshape(-1))


def _norm_upper(entries) -> float:
    """Upper bound on ``sqrt(sum |x|^2)`` over arb balls ``x``, as a float (rounded up).

    Squares via ``u * u`` with ``u = |x|.upper()``: python-flint 0.9's ``x ** 2`` is nan for a
    ball centred at exactly 0.
    """
    total = flint.arb(0)
    for x in entries:
        u = abs(x).upper()
        total += u * u
    return float(flint.arb(total.upper()).sqrt().upper())


def _rowsum(A):
    s = A.sum(axis=1)
    return np.repeat(s[:, None], A.shape[1], axis=1)


def _attention(X, W, u, exp):
    """``(ones, F)``: the (n, 1) column of ones (object dtype for arb balls) and the row softmax
    ``F`` of ``X^T W X + 1 u^T X``, with +, *, @ and ``exp`` only."""
    ones = np.ones((X.shape[1], 1), dtype=object if X.dtype == object else float)
    E = exp(X.T @ W @ X + ones @ (u[None, :] @ X))
    return ones, E / _rowsum(E)


def hvp_generic(X, V, W, u, B, Gamma2, exp):
    """Hessian of ``1/2 ||softmax(X^T W X + 1 u^T X) - B||^2 + 1/2 ||Gamma o X||^2`` applied to V.

    Written with +, *, @ and ``exp`` only, so it runs on floats (checked against
    the generated kernel) and on arb balls alike. Gamma2 = Gamma o Gamma.
    """
    n = X.shape[1]
    ones, F = _attention(X, W, u, exp)
    R = F - B
    FR = F * R
    G = FR - F * _rowsum(FR)
    dS = V.T @ W @ X + X.T @ W @ V + ones @ (u[None, :] @ V)
    FdS = F * dS
    dF = FdS - F * _rowsum(FdS)
    dFR = dF * R + F * dF
    dG = dFR - dF * _rowsum(FR) - F * _rowsum(dFR)
    return (W @ V @ G.T + W.T @ V @ G + W @ X @ dG.T + W.T @ X @ dG
            + u[:, None] @ (np.ones((1, n), dtype=ones.dtype) @ dG) + Gamma2 * V)


def grad_generic(X, W, u, B, exp):
    """Gradient of ``1/2 ||softmax(X^T W X + 1 u^T X) - B||^2`` (one head) with +, *, @ and ``exp``
    only (floats or arb balls): ``W X G^T + W^T X G + u 1^T G``, ``G = F o R - F o rowsum(F o R)``."""
    _, F = _attention(X, W, u, exp)
    FR = F * (F - B)
    G = FR - F * _rowsum(FR)
    return _logit_pullback(X, W, u, G)


def _logit_pullback(X, W, u, G):
    """``W X G^T + W^T X G + u 1^T G``: a gradient G with respect to the logits, pulled back to X."""
    ones = np.ones((1, X.shape[1]), dtype=object if X.dtype == object else float)
    return W @ X @ G.T + W.T @ X @ G + u[:, None] @ (ones @ G)


def grad_output_generic(X, W, u, Wv, B, exp):
    """Gradient of ``1/2 ||F X^T Wv - B||^2`` (one head; F the row softmax of ``X^T W X + 1 u^T X``)
    with +, *, @ and ``exp`` only (floats or arb balls).

    With ``R = F X^T Wv - B`` and ``Phi = R (X^T Wv)^T`` (n, n): the softmax path is the attention
    gradient with ``F o R`` replaced by ``F o Phi`` (``G = F o Phi - F o rowsum(F o Phi)``, then
    ``W X G^T + W^T X G + u 1^T G``), and the direct path through ``X^T`` adds ``Wv R^T F``.
    """
    _, F = _attention(X, W, u, exp)
    Y = X.T @ Wv
    R = F @ Y - B
    FP = F * (R @ Y.T)
    G = FP - F * _rowsum(FP)
    return _logit_pullback(X, W, u, G) + Wv @ R.T @ F


def gradient_enclosure(problem, X, dX=None) -> tuple[np.ndarray, np.ndarray]:
    """Midpoints and radii (d, n) of arb balls containing every entry of the exact gradient of the
    loss (attention maps or attention outputs; all heads and the regulariser) at the float64 point
    X, or at the extended-precision point ``X + dX`` (``dX`` float64, one or several corrections,
    summed exactly in arb: `_arb_point`) when ``dX`` is given."""
    from solver.problem import ATTENTION

    output = problem.variant != ATTENTION
    prec = flint.ctx.prec
    # float64 data are exact in arb; 128 bits keep the balls far below float64's rounding, 320 bits
    # keep them far below the gradient of a double-double point (about 1e-30 after a polish)
    flint.ctx.prec = 128 if dX is None else 320
    try:
        Xa = _arb_point(X, dX)
        total = _arb_array(problem.Gamma**2) * (Xa - _arb_array(problem.X0))
        for h in range(problem.heads):
            W, u, B = _arb_array(problem.W[h]), _arb_array(problem.U[h]), _arb_array(problem.B[h])
            total = total + (grad_output_generic(Xa, W, u, _arb_array(problem.W_V[h]), B, _arb_exp) if output
                             else grad_generic(Xa, W, u, B, _arb_exp))
        mid = np.array([[float(v.mid()) for v in row] for row in total])
        rad = np.array([[float(v.rad()) for v in row] for row in total])
    finally:
        flint.ctx.prec = prec
    # the midpoint's conversion to float64 rounds: widen by one ulp of it
    return mid, rad + np.spacing(np.abs(mid))


def output_residual_enclosure(problem, X, dX=None) -> tuple[np.ndarray, float]:
    """The attention-output residual ``O(X + dX) - B`` (all heads, flattened ``(H n d_v,)``) in
    320-bit arb: the float64 midpoints, and a rigorous upper bound on its Frobenius norm.

    ``dX``: None, or float64 corrections summed exactly with X (`_arb_point`), so the point can
    be a double-double one; the Kantorovich test of :mod:`solver.roots` needs a residual far
    below float64's rounding at an ill-conditioned root.
    """
    prec = flint.ctx.prec
    flint.ctx.prec = 320
    try:
        Xa = _arb_point(X, dX)
        entries = []
        for h in range(problem.heads):
            W, u = _arb_array(problem.W[h]), _arb_array(problem.U[h])
            _, F = _attention(Xa, W, u, _arb_exp)
            R = F @ (Xa.T @ _arb_array(problem.W_V[h])) - _arb_array(problem.B[h])
            entries.extend(R.reshape(-1))
        mid = np.array([float(v.mid()) for v in entries])
        return mid, _norm_upper(entries)
    finally:
        flint.ctx.prec = prec


def gradient_norm_upper(problem, X, Q=None) -> float:
    """Rigorous upper bound on ``||(I - Q Q^T) grad L(X)||`` (Q: orthonormal columns, (dn, k), or None).

    ``||(I - QQ^T)(m + e)|| <= ||(I - QQ^T) m|| + ||e||`` for ``|e| <= rad`` entrywise (an orthogonal
    projector has norm 1); the float64 evaluation of the first term is widened by ``4 dn eps`` of
    ``||m||`` for its rounding and for Q being orthonormal only to rounding.
    """
    mid, rad = gradient_enclosure(problem, X)
    m = mid.reshape(-1)
    if Q is not None and Q.shape[1]:
        m = m - Q @ (Q.T @ m)
    eps = np.finfo(np.float64).eps
    return float(np.linalg.norm(m) + np.linalg.norm(rad) + 4 * m.size * eps * np.linalg.norm(mid))


def _arb_exp(A):
    out = np.empty(A.shape, dtype=object)
    for idx in np.ndindex(A.shape):
        out[idx] = A[idx].exp()
    return out


def hessian_on_box(Xc, radius, W, u, B, gamma, dX=None):
    """Ball Hessian (one head) on the box ``|X - Xc| <= radius``, or ``|X - (Xc + dX)| <= radius``
    (the double-double centre summed exactly: call at 128 bits or more, see `hessian_enclosure`)."""
    d, n = Xc.shape
    X = _arb_point(Xc, dX, radius)
    Wa, ua, Ba = _arb_array(W), _arb_array(u), _arb_array(B)
    G2 = _arb_array(np.full((d, n), gamma**2))
    cols = []
    for k in range(d * n):
        E = np.zeros(d * n)
        E[k] = 1.0
        cols.append(hvp_generic(X, _arb_array(E.reshape(d, n)), Wa, ua, Ba, G2, _arb_exp).reshape(-1))
    return np.array(cols).T


def hessian_enclosure(problem, Xc, radius: float, dX=None) -> "flint.arb_mat":
    """(dn, dn) ball matrix containing the Hessian of the attention-matrix loss (all heads and the
    regulariser, row-major vec of X) at every X of the box ``|X - Xc| <= radius`` (entrywise),
    centred at the double-double point ``Xc + dX`` when ``dX`` is given (128-bit balls)."""
    from solver.problem import ATTENTION

    if problem.variant != ATTENTION:
        raise ValueError("hessian_enclosure is for the attention-matrix loss")
    prec = flint.ctx.prec
    flint.ctx.prec = max(prec, 128)
    try:
        total = None
        for h in range(problem.heads):
            Hh = hessian_on_box(Xc, radius, problem.W[h], problem.U[h], problem.B[h], 0.0, dX=dX)
            total = Hh if total is None else total + Hh
        total = total + np.diag(_arb_array(problem.Gamma.reshape(-1) ** 2))
        return flint.arb_mat(total.tolist())
    finally:
        flint.ctx.prec = prec


def _to_object(M: "flint.arb_mat") -> np.ndarray:
    out = np.empty((M.nrows(), M.ncols()), dtype=object)
    for i in range(M.nrows()):
        for j in range(M.ncols()):
            out[i, j] = M[i, j]
    return out


def slice_bounds(problem, X, dX, P, box_radius: float) -> dict:
    """Rigorous numbers for a critical point of L on the slice ``{X + dX + P z}`` (see `slice_theorem`).

    - ``g_up``: upper bound on ``||P^T grad L(X + dX)||`` (double-double point, 320-bit balls);
    - ``s_P``: upper bound on ``||P||_2`` (``sqrt(1 + ||P^T P - I||_F)``, Weyl);
    - ``l_lower``: lower bound on ``lambda_min(P^T hess L(Y) P)`` for every Y in the box
      ``|Y - (X + dX)| <= box_radius`` (`hessian_enclosure`, then `lambda_min_lower`);
    - ``dX_inf``, ``dX_2``: ``||dX||_inf`` and an upper bound on ``||dX||_2``.

    The box is centred at the polished point, not at X: its half-width then only has to hold
    the slice ball (about ``g_up / l_lower``, 1e-23 after a polish), and the ball Hessian's
    overestimation (about 3e8 times the box at (8, 32), one head: the softmax derivative's
    cancellations) stays far below ``lambda_min``.
    """
    P = np.asarray(P, np.float64)
    Pa = flint.arb_mat(P.tolist())
    mid, rad = gradient_enclosure(problem, X, dX)
    g = flint.arb_mat([[flint.arb(float(m), float(r))] for m, r in zip(mid.reshape(-1), rad.reshape(-1))])
    gz = Pa.transpose() * g
    g_up = _norm_upper(gz[i, 0] for i in range(gz.nrows()))
    PtP = Pa.transpose() * Pa
    k = PtP.nrows()
    dev = _norm_upper(PtP[i, j] - (1 if i == j else 0) for i in range(k) for j in range(k))
    s_P = float((1 + flint.arb(dev)).sqrt().upper())
    Hb = hessian_enclosure(problem, np.asarray(X, np.float64), float(box_radius), dX=np.asarray(dX, np.float64))
    l_lower = lambda_min_lower(_to_object(Pa.transpose() * Hb * Pa))
    dX_inf, dX_2 = correction_stats(dX, np.shape(X))
    return {"g_up": g_up, "s_P": s_P, "l_lower": l_lower, "dX_inf": dX_inf,
            "dX_2": dX_2, "box_radius": float(box_radius), "hessian_mid": Hb}


def slice_theorem(b: dict) -> dict:
    """What the `slice_bounds` numbers prove, or why not.

    phi(z) = L(X + dX + P z). If ``||z|| <= r`` then ``||P z||_inf <= ||P z||_2 <= s_P r``, so with
    ``r = box_radius / s_P`` every such point lies in the box around ``X + dX``, and phi is
    ``l_lower``-strongly convex on the ball ``||z|| <= r``. If moreover
    ``l_lower r > g_up >= ||grad phi(0)||``, the minimiser of phi on the closed ball is interior
    (on the sphere ``grad phi(z) . z >= -g_up r + l_lower r^2 > 0``), so phi has a critical point
    ``z*`` there, the only one in the ball (strict convexity), with ``||z*|| <= g_up / l_lower``;
    hence ``||X - X*||_2 <= dX_2 + s_P g_up / l_lower`` for ``X* = X + dX + P z*``.

    `tangent_slice_bounds` gives ``s_P = 1``: there z ranges over ``ker T^T`` itself (``P z`` is z), and
    ``g_up`` bounds the gradient's projection onto it, the gradient of phi on that subspace.
    """
    A = flint.arb
    r = float((A(b["box_radius"]) / A(b["s_P"])).lower())  # rounded down
    ok = bool(b["l_lower"] > 0 and r > 0 and (A(b["l_lower"]) * A(r) - A(b["g_up"])).lower() > 0)
    out = {"certified": ok, "slice_radius": r}
    if ok:
        out["error_bound"] = float((A(b["dX_2"]) + A(b["s_P"]) * A(b["g_up"]) / A(b["l_lower"])).upper())
    return out


def lambda_min_lower_symmetric(A: np.ndarray) -> float:
    """Rigorous lower bound on lambda_min of the symmetric float64 matrix ``A`` (entries exact).

    ``V`` from ``numpy.linalg.eigh`` (float, nearly orthogonal); in ball arithmetic
    ``C = V^T A V = D + E`` (D its diagonal) and ``F = V^T V - I``. Weyl: ``lambda_min(C) >=
    min D - ||E||_F =: c``. Ostrowski (``C = S A S^T``, ``S = V^T`` nonsingular since
    ``||F||_F < 1``): ``lambda_k(C) = theta_k lambda_k(A)`` with ``theta_k`` in
    ``[1 - ||F||_F, 1 + ||F||_F]``, so ``lambda_min(A) >= c / (1 + ||F||_F)`` if ``c > 0``, else
    ``>= c / (1 - ||F||_F)``. Two (N, N) products in C (arb_mat), against flint's ``eig(rump)``
    at about 200 s for N = 252; it gives away about ``N eps ||A||``.
    """
    A = np.asarray(A, np.float64)
    N = A.shape[0]
    V = np.linalg.eigh(A)[1]
    Am, Vm = flint.arb_mat(A.tolist()), flint.arb_mat(V.tolist())
    C = Vm.transpose() * Am * Vm
    G = Vm.transpose() * Vm
    diag_low = min(float(C[i, i].lower()) for i in range(N))
    off_norm = flint.arb(_norm_upper(C[i, j] for i in range(N) for j in range(N) if i != j))
    f_norm = flint.arb(_norm_upper(G[i, j] - (1 if i == j else 0) for i in range(N) for j in range(N)))
    if not float(f_norm) < 0.5:
        return -math.inf
    c = flint.arb(diag_low) - off_norm
    if c.lower() > 0:
        return float((flint.arb(c.lower()) / (1 + f_norm)).lower())
    return float((flint.arb(c.lower()) / (1 - f_norm)).lower())


def lambda_min_at_least(A: np.ndarray, t: float) -> float | None:
    """Prove ``lambda_min(A) >= t - c`` for the symmetric float64 matrix ``A`` (entries exact) by one
    Cholesky factorisation of ``fl(A - t I)``; ``None`` when the factorisation breaks down (no claim).

    Higham, *Accuracy and Stability of Numerical Algorithms*, Thm 10.3: when Cholesky runs to
    completion on a symmetric S, the computed R has ``R^T R = S + dS``, ``|dS| <= gamma_{N+1} |R^T| |R|``,
    for any order of the inner products (so for LAPACK's blocked ``potrf`` with conventional matrix
    products). Then ``||dS||_2 <= gamma_{N+1} ||R||_F^2`` and ``||R||_F^2 = tr(S + dS) <= tr S +
    gamma_{N+1} ||R||_F^2``, so ``lambda_min(S) >= -||dS||_2 >= -gamma / (1 - gamma) tr S``. ``S`` differs
    from ``A - t I`` by the rounding of the shifted diagonal, at most ``u max |S_ii|``. O(N^3 / 3) flops,
    against about 4 N^3 / 3 (and half of them memory-bound) for the eigenvalues: what makes the
    local-Newton recheck affordable at dn = 16384. The price is ``c ~ N u tr(A)``, far looser than
    eigh's backward error; it proves definiteness, it does not locate lambda_min.
    """
    A = np.asarray(A, np.float64)
    N = A.shape[0]
    if A.ndim != 2 or A.shape[1] != N:
        raise ValueError(f"lambda_min_at_least needs a square matrix, got shape {A.shape}")
    if not (np.isfinite(t) and np.all(np.isfinite(A))):
        return None
    return _lambda_min_at_least_in_place(np.array(A, order="F"), t)  # a copy, factorised in place


def _lambda_min_at_least_in_place(S: np.ndarray, t: float) -> float | None:
    """`lambda_min_at_least` for the symmetric matrix whose upper triangle is that of the
    Fortran-ordered, finite ``S``, which it overwrites (its strict lower triangle is never read)."""
    import scipy.linalg.lapack

    N = S.shape[0]
    diag = np.diag_indices(N)
    S[diag] -= t
    shifted = S[diag]  # (a copy)
    if np.any(shifted <= 0):
        return None
    c = _cholesky_rounding(shifted)
    _, info = scipy.linalg.lapack.dpotrf(S, lower=0, overwrite_a=1, clean=0)
    if info != 0:
        return None
    return float(np.nextafter(np.nextafter(t - c, -np.inf), -np.inf))  # two ulps: the difference's rounding


def shift_to_prove(A: np.ndarray, target: float) -> float:
    """The shift t at which :func:`lambda_min_at_least` returns at least ``target`` whenever its
    factorisation completes: ``target + 2 c``, c its rounding term at ``t = target``. At any larger t
    with a positive shifted diagonal the trace, hence the term, is smaller, so ``t - c(t) >= target
    + c``, which covers the final roundings."""
    diag = np.asarray(A, np.float64).diagonal() - target
    if not (np.isfinite(target) and np.all(diag > 0)):
        return math.inf
    return target + 2 * _cholesky_rounding(diag) + 8 * 2.0**-53 * abs(target)


def prove_claim_by_cholesky(H: np.ndarray, claim: float, dn: int,
                            h_inf: float | None = None) -> tuple[float | None, float, float]:
    """``(bound, t, margin)``: ``bound = lambda_min_at_least(H, t)`` when one Cholesky factorisation of
    ``H - t I`` proves ``bound - margin >= claim`` for the float64 Hessian H, else None. ``margin = 10 dn
    eps ||H||_inf`` is eigh's backward error, a float64 allowance for H's own rounding; t is
    :func:`shift_to_prove` at ``claim + margin``. The test ``proofs_check.recheck`` applies to a local
    Newton certificate above dn = 4096, and the one the issuer applies before it issues a Lanczos claim
    (:func:`solver.certificate.prove_lambda_min`). ``h_inf``: ``||H||_inf`` of this very H where the
    caller has it (one pass over the (dn, dn) array, with an |H| temporary, saved); computed otherwise."""
    margin = hessian_allowance(dn, inf_norm(H) if h_inf is None else h_inf)
    t = shift_to_prove(H, claim + margin)
    lam = lambda_min_at_least(H, t) if math.isfinite(t) else None
    if lam is None or not lam - margin >= claim:
        return None, t, margin
    return lam, t, margin


def _cholesky_rounding(diag: np.ndarray) -> float:
    """``gamma_{N+1} / (1 - gamma_{N+1}) tr S + u max |S_ii|``, rounded up, from S's diagonal (all > 0)."""
    N = diag.size
    u = 2.0**-53
    gamma = (N + 1) * u / (1 - (N + 1) * u)
    trace = math.fsum(diag.tolist()) * (1 + 2 * u)  # fsum is correctly rounded
    return (gamma / (1 - gamma) * trace + u * float(np.max(np.abs(diag)))) * (1 + 4 * u)


def lambda_min_lower(Hb, method: str = "ostrowski") -> float:
    """Rigorous lower bound on lambda_min over all symmetric matrices in the ball matrix Hb.

    ``method``: ``"ostrowski"`` (`lambda_min_lower_symmetric`, two matrix products) or
    ``"rump"`` (flint's eigenvalue enclosure; tighter, far slower above N ~ 100).
    """
    N = Hb.shape[0]
    mid = [[float(Hb[i, j].mid()) for j in range(N)] for i in range(N)]
    mid = [[(mid[i][j] + mid[j][i]) / 2 for j in range(N)] for i in range(N)]  # exact in float64? bound below
    # the symmetrisation error and every radius go into the perturbation matrix
    pert_norm = flint.arb(_norm_upper(Hb[i, j] - flint.arb(mid[i][j]) for i in range(N) for j in range(N)))
    if method == "rump":
        eig = flint.acb_mat(mid).eig(multiple=True, algorithm="rump")
        lam_lower = min(float(e.real.lower()) for e in eig)
    elif method == "ostrowski":
        lam_lower = lambda_min_lower_symmetric(np.array(mid))
        if not math.isfinite(lam_lower):
            return -math.inf
    else:
        raise ValueError(f"unknown method {method!r}; use 'ostrowski' or 'rump'")
    return float((flint.arb(lam_lower) - pert_norm).lower())


def certify_box(d: int = 2, n: int = 3, seed: int = 0, radius: float = 0.02) -> dict:
    """Prove lambda_min >= l (the strong-convexity lemma's constant) on a box inside its region."""
    rng = np.random.default_rng(seed)
    R, omega = 0.5, 1.0
    W = rng.normal(size=(d, d))
    W *= omega / np.linalg.norm(W, 2)
    u = np.zeros(d)
    Xc = rng.normal(size=(d, n))
    Xc *= (R - np.sqrt(d) * radius) / np.linalg.norm(Xc, axis=0).max()
    B = rng.dirichlet(np.ones(n), size=n)
    region = Region(d=d, n=n, heads=1, R=R, omega=omega, mu=0.0, gamma=0.0, gamma_max=0.0)
    negcurv = -region.bounds()["strong_convexity"]
    gamma = float(np.sqrt(negcurv + 1.0))  # weights that make the lemma's l = 1 on this region
    region = Region(d=d, n=n, heads=1, R=R, omega=omega, mu=0.0, gamma=gamma, gamma_max=gamma)
    l_bound = region.bounds()["strong_convexity"]
    Hb = hessian_on_box(Xc, radius, W, u, B, gamma)
    lam = lambda_min_lower(Hb)
    certified = lam >= l_bound
    return {"certified": bool(certified), "lambda_min_lower": lam, "l": l_bound, "box_radius": radius,
            "d": d, "n": n, "gamma": gamma, "lemma": lemma("strong_convexity").statement,
            "summary": (f"{'CERTIFIED' if certified else 'NOT certified'}: lambda_min >= {lam:.4f} "
                        f"{'>=' if certified else '<'} l = {l_bound:.4f} on every X of a box of half-width "
                        f"{radius} (d={d}, n={n}, gamma={gamma:.3f}), in ball arithmetic")}


def _softmax_jacobian_balls(F):
    """Balls ``(n, n, n)`` of the row softmax Jacobians ``diag(f_r) - f_r f_r^T`` from balls of F."""
    n = F[0].shape[0]
    eye = np.eye(n)[None, :, :]
    diag = (eye * F[0][:, :, None], eye * F[1][:, :, None])  # exact: products by 0 and 1
    outer = midrad.mul((F[0][:, :, None], F[1][:, :, None]), (F[0][:, None, :], F[1][:, None, :]))
    return midrad.add(diag, outer, -1.0)


def jacobian_slice_enclosure(problem, X, dX, P, box_radius: float):
    """Balls containing ``J(Y) P`` for every Y of the box ``|Y - (X + dX)| <= box_radius``, and a
    bound on the Hessian's second-order remainder there.

    ``J`` is the Jacobian of the stacked attention maps ``vec F_h`` (rows ``(h, r, c)``) with
    respect to ``vec X`` (row-major), ``P`` the (dn, k) slice basis. The loss ``1/2 sum ||F_h -
    B_h||^2 + 1/2 ||Gamma o (X - X0)||^2`` has Hessian ``J^T J + E + diag(Gamma^2)`` with
    ``E = sum_{h,r,c} R_rc hess F_rc`` (``R = F - B``). Returns ``(A, e2)``: the ball ``A`` of
    ``J P`` (float64 midpoint-radius, `proofs_check.midrad`) and ``e2 >= ||E||_2`` on the box.

    Structure used (one head; ``p_j = W x_j``, ``q_r = W^T x_r + u``, ``K_r = diag(f_r) - f_r
    f_r^T``): ``dS_rj = p_j^T dx_r + q_r^T dx_j``, so ``(J P)[(r, c), :] = (K_r P^T)[c, :] P_r +
    sum_k K_r[c, k] q_r^T P_k`` with ``P_k`` the rows ``(a, k)`` of P: batched products of size
    n^2 d k, no (n^2, dn) Jacobian. The exponential is taken in arb; everything else in float64
    balls.

    The remainder: ``hess F_rc = J_r^T hess f_c J_r + sum_j (df_c / ds_j) hess S_rj`` with
    ``hess f_c = f_c (e_c - f)(e_c - f)^T - f_c (diag f - f f^T)`` (2-norm at most ``3 f_c``),
    ``||J_r|| <= ||P||_2 + ||q_r||``, ``sum_j |df_c / ds_j| = 2 f_c (1 - f_c) <= 2 f_c`` and
    ``||hess S_rj||_2 <= 2 ||W||_2``; so ``||E||_2 <= sum |R_rc| f_rc (3 (||P||_2 + ||q_r||)^2 +
    4 ||W||_2)``, the 2-norms bounded by `midrad.two_norm_upper`. That row-by-row bound sums n^2
    terms; `remainder_bound` also bounds the same two parts by norms (``max_r ||A_r||_2 ||J_S||_2^2`` and
    ``2 ||W||_2 ||K_r R_r||_F``) and takes the smaller of each.
    """
    heads, e2, _ = _jacobian_slice_setup(problem, X, dX, P, box_radius)
    return _whole(heads, P, X.shape[1]), e2


def _whole(heads, P, n: int):
    """The ball of ``J P`` whole, from `_jacobian_slice_setup`'s heads."""
    blocks = [ball for _, ball in _jacobian_slice_rows(heads, P, n)]
    if len(blocks) == 1:
        return blocks[0]
    return np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks])


def _jacobian_slice_setup(problem, X, dX, P, box_radius: float):
    """`jacobian_slice_enclosure`'s per-head balls, from which the rows of ``J P`` are built:
    a list of ``(K, Pc, Qc)`` (softmax Jacobians ``(n, n, n)``, columns ``p_j`` and ``q_r``, each
    ``(d, n)``), the remainder bound ``e2`` and, for the record, the row-by-row bound alone (`remainder_bound`'s
    ``e1_rows + e2_rows``, which was ``e2`` until it). The arb part of the computation (n^2 entries)."""
    d, n = X.shape
    prec = flint.ctx.prec
    flint.ctx.prec = max(prec, 128)
    try:
        Xa = _arb_point(X, dX, box_radius)
        ones = np.ones((1, n), dtype=object)
        heads, e2, e2_rows = [], 0.0, 0.0
        for h in range(problem.heads):
            Wa, ua, Ba = _arb_array(problem.W[h]), _arb_array(problem.U[h]), _arb_array(problem.B[h])
            _, Fa = _attention(Xa, Wa, ua, _arb_exp)
            F = midrad.from_arb(Fa)
            R = midrad.from_arb(Fa - Ba)
            Pc = midrad.from_arb(Wa @ Xa)                       # columns p_j = W x_j
            Qc = midrad.from_arb(Wa.T @ Xa + ua[:, None] @ ones)  # columns q_r = W^T x_r + u
            heads.append((_softmax_jacobian_balls(F), Pc, Qc))
            wn = midrad.two_norm_upper((np.asarray(problem.W[h], np.float64), None))
            rb = remainder_bound(F, R, Pc, Qc, wn)
            e2 += rb["bound"]
            e2_rows += rb["e1_rows"] + rb["e2_rows"]
    finally:
        flint.ctx.prec = prec
    return heads, float(midrad.up(e2, problem.heads + 1)), float(midrad.up(e2_rows, 2 * problem.heads + 1))


def softmax_residual_hessians(F, R):
    """``(a, w)``: ``a_r >= ||A_r||_2`` for ``A_r = sum_c R_rc hess f_c(s_r)`` (the residual-weighted
    Hessians of the row softmaxes with respect to their logits) and the ball ``w`` of ``w_r = K_r R_r``,
    from balls of F and R (n, n). With ``rho_r = R_r o f_r`` and ``s_r = sum_c rho_rc``: ``w_r = rho_r -
    s_r f_r`` and ``A_r = diag(w_r) - rho_r f_r^T - f_r rho_r^T + 2 s_r f_r f_r^T``, so ``||A_r||_2 <=
    max_c |w_rc| + 2 ||rho_r|| ||f_r|| + 2 |s_r| ||f_r||^2``."""
    n = F[0].shape[0]
    rho = midrad.mul(R, F)
    rho_mag = midrad.magnitude(rho)
    s = midrad.matmul(rho, (np.ones((n, 1)), None))               # (n, 1): s_r
    w = midrad.add(rho, midrad.mul(s, F), -1.0)                   # w_r = rho_r - s_r f_r
    w_max = np.max(midrad.magnitude(w), axis=1)
    rho_n = midrad.up(np.sqrt(midrad.up(np.sum(rho_mag * rho_mag, axis=1), n + 1)), 2)
    f_mag = midrad.magnitude(F)
    f_sq = midrad.up(np.sum(f_mag * f_mag, axis=1), n + 1)       # ||f_r||^2
    f_n = midrad.up(np.sqrt(f_sq), 2)
    a = midrad.up(w_max + 2.0 * rho_n * f_n + 2.0 * midrad.magnitude(s)[:, 0] * f_sq, 6)
    # and the smaller of the Frobenius and infinity norms of the ball A_r itself (n^3 entries)
    def at(ball, idx):
        return ball[0][idx], (None if ball[1] is None else ball[1][idx])

    col, row = (slice(None), slice(None), None), (slice(None), None, slice(None))
    eye = np.eye(n)[None, :, :]
    A = (eye * w[0][col], eye * w[1][col])  # exact: products by 0 and 1
    outer = midrad.mul(at(rho, col), at(F, row))                  # rho_r f_r^T
    A = midrad.add(A, outer, -1.0)
    A = midrad.add(A, midrad.transpose(outer, (0, 2, 1)), -1.0)
    del outer
    ff = midrad.mul(at(F, col), at(F, row))
    A = midrad.add(A, midrad.mul(ff, (2.0 * s[0][:, :, None], 2.0 * s[1][:, :, None])))  # (2 s: exact)
    del ff
    mag = midrad.magnitude(A)
    del A
    inf = np.max(midrad.up(np.sum(mag, axis=2), n + 1), axis=1)
    mag *= mag
    fro = midrad.up(np.sqrt(midrad.up(np.sum(mag, axis=(1, 2)), n * n + 1)), 2)
    return np.minimum(a, np.minimum(inf, fro)), w


def remainder_bound(F, R, Pc, Qc, w_norm: float) -> dict:
    """Upper bound on ``||E||_2``, ``E = sum_{r,c} R_rc hess F_rc`` for one head (the second-order
    remainder of `jacobian_slice_enclosure`), from balls of the maps F, the residual R (both (n, n)),
    the columns ``p_j = W x_j`` (Pc) and ``q_r = W^T x_r + u`` (Qc), each (d, n), and ``w_norm >=
    ||W||_2``. With ``rho_r = R_r o f_r``, ``s_r = sum_c rho_rc`` and ``w_r = K_r R_r = rho_r - s_r f_r``
    (``K_r = diag(f_r) - f_r f_r^T``), ``E = E1 + E2``:

    - ``E1 = J_S^T blockdiag(A_r) J_S``, ``J_S`` the Jacobian of the logits ``S = X^T W X + 1 u^T X``
      (``dS = dX^T Pc + Qc^T dX``, so ``||J_S||_2 <= ||Pc||_2 + ||Qc||_2``) and ``A_r = sum_c R_rc
      hess f_c = diag(w_r) - rho_r f_r^T - f_r rho_r^T + 2 s_r f_r f_r^T``, so ``||E1|| <= max_r (max_c
      |w_rc| + 2 ||rho_r|| ||f_r|| + 2 |s_r| ||f_r||^2) (||Pc||_2 + ||Qc||_2)^2``; or, row by row with
      ``||hess f_c|| <= 3 f_c`` and ``||J_r|| <= ||Pc||_2 + ||q_r||``: ``sum_r 3 sum_c |rho_rc| (||Pc||_2
      + ||q_r||)^2`` (``e1_rows``, smaller where the residual sits in a few rows);
    - ``E2``: ``d2 E2 [dX, dX] = 2 <w, dX^T W dX>`` (``d2 S_rj [dX, dX] = 2 dx_r^T W dx_j``), so ``||E2||
      <= 2 ||W||_2 ||w||_F``; or ``4 ||W||_2 sum |rho|`` (``sum_j |w_rj| <= 2 sum_c |rho_rc|``, ``e2_rows``).

    Returns the four bounds and ``bound``, the smaller of each pair summed. At an exact fit, where R
    is rounding noise of random sign, the norms replace sums over n^2 entries: one head (32, 128),
    seed 102, on a box of half-width 1.5e-20, ``||E|| <= 1.3e-15`` against 5.7e-13 row by row, where
    ``sigma_min(J P)^2 >= 4.7e-13``; with the row-by-row pair alone (the bound until this function)
    lambda_min >= -1.0e-13 and no certificate. At (4, 16) and (8, 32) 35-99x smaller at rounding-noise
    residuals, 3-5x where the residual sits in one row (ad hoc; the test runs (4, 16) and asserts 5x)."""
    d, n = Pc[0].shape
    pn, qn2 = midrad.two_norm_upper(Pc), midrad.two_norm_upper(Qc)
    rho = midrad.mul(R, F)
    rho_mag = midrad.magnitude(rho)
    # the row-by-row bounds
    qmag = midrad.magnitude(Qc)
    qn = midrad.up(np.sqrt(midrad.up(np.sum(qmag * qmag, axis=0), d + 1)), 2)
    row_abs = midrad.up(np.sum(rho_mag, axis=1), n + 1)  # sum_c |rho_rc|
    e1_rows = float(midrad.up(np.sum(row_abs * midrad.up(3.0 * (pn + qn) ** 2, 4)), n + 2))
    e2_rows = float(midrad.up(4.0 * w_norm * float(midrad.up(np.sum(row_abs), n + 1)), 2))
    # the norm bounds
    a_r, w = softmax_residual_hessians(F, R)
    e1_norms = float(midrad.up(float(np.max(a_r)) * (pn + qn2) ** 2, 4))
    e2_norms = float(midrad.up(2.0 * w_norm * midrad.norm_upper(w), 2))
    bound = float(midrad.up(min(e1_rows, e1_norms) + min(e2_rows, e2_norms), 1))
    return {"e1_rows": e1_rows, "e1_norms": e1_norms, "e2_rows": e2_rows, "e2_norms": e2_norms, "bound": bound}


def _jacobian_slice_rows(heads, P, n: int, rows_per_block: int | None = None):
    """The balls of ``J P`` by blocks of attention rows: yields ``(rows, ball)``, ``rows`` the
    slice of stacked rows ``(h, r, c)`` that ``ball`` (``(len(rows), k)``) holds; ``rows_per_block``
    attention rows r at a time (None: all n). Each block is the same ball arithmetic as the whole
    (`midrad.matmul`'s rounding bound depends on the inner dimension only). ``q_r^T P``, which reads
    all of P for each block, bounds its radius by Cauchy-Schwarz (`midrad.matmul_exact_cs`): at one
    head (64, 256) `midrad.matmul` took 4.5 s a block of 2 rows there, most of it ``|P|``."""
    d = P.shape[0] // n
    k = P.shape[1]
    P = np.ascontiguousarray(P, np.float64)  # (a copy only where the caller's P is a strided view)
    P3 = P.reshape(d, n, k)  # [:, r]: the rows (a, r) of P
    Pflat = P.reshape(d, n * k)  # (views: no (dn, k) copy beside P, which at (64, 256) is 2 GiB)
    Pflat_norms = midrad.column_norms_upper(Pflat)
    step = n if rows_per_block is None else max(1, int(rows_per_block))
    for h, (K, Pc, Qc) in enumerate(heads):
        PcT, QcT = midrad.transpose(Pc), midrad.transpose(Qc)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            Kb = (K[0][r0:r1], K[1][r0:r1])
            T = midrad.matmul(Kb, PcT)                                  # (rb, n, d): K_r P^T
            A1 = midrad.matmul(T, (np.ascontiguousarray(P3[:, r0:r1].transpose(1, 0, 2)), None))  # (rb, n, k)
            Z = midrad.matmul_exact_cs((QcT[0][r0:r1], QcT[1][r0:r1]), Pflat, Pflat_norms)
            Z = (Z[0].reshape(r1 - r0, n, k), Z[1].reshape(r1 - r0, n, k))  # [r, k', :] = q_r^T P_k'
            A2 = midrad.matmul(Kb, Z)
            del T, Z
            Ah = midrad.add(A1, A2)
            del A1, A2  # the (rb, n, k) temporaries: the memory peak is a handful of them
            base = h * n * n
            yield slice(base + r0 * n, base + r1 * n), (Ah[0].reshape(-1, k), Ah[1].reshape(-1, k))


def sigma_min_sq_lower(A) -> tuple[float, dict]:
    """Rigorous lower bound on ``sigma_min(M)^2`` for every matrix M of the float ball ``A`` (m, k),
    m >= k, without forming ``M^T M`` in a way that squares the rounding.

    ``V`` approximate right singular vectors of the midpoint, ``C = M V`` as a ball ``(Cm, Cr)``
    (``Cr_ij = ||Z_i|| ||v_j||`` with ``Z = gamma |Am| + Ar``, by Cauchy-Schwarz: never formed, only
    its column sums of squares enter),
    and ``Gm = Cm^T Cm`` in float64 with ``D = diag(Gm)``. Every Gram matrix ``G = C^T C`` of a
    member is ``D^(1/2) (I + E) D^(1/2)`` with ``|E| <= D^(-1/2) (|Gm - D| + gamma_m |Cm|^T |Cm| +
    |Cm|^T Cr + Cr^T |Cm| + Cr^T Cr) D^(-1/2)`` entrywise (``gamma_m``: the rounding of ``Gm``),
    so, with ``c = ||Cm D^(-1/2)||_F`` and ``r = ||Cr D^(-1/2)||_F`` and ``||X^T Y||_F <= ||X||_F
    ||Y||_F``: ``||E||_F <= ||D^(-1/2) off(Gm) D^(-1/2)||_F + gamma_m c^2 + 2 c r + r^2``, and
    ``lambda_min(G) >= min D (1 - ||E||_F)``. The rounding counts relative to the columns' own
    norms, not to ``||M||^2``, and only ``Gm`` is formed (one syrk, where a ball product for G
    took one product for its midpoint and two or three for its radius). Then ``sigma_min(M)^2 >= lambda_min(G) / ||V||_2^2`` with ``||V||_2^2 <= 1
    + ||V^T V - I||_F``.

    Any V gives a valid bound; V only decides how tight. It is first taken from ``eigh`` of the
    float Gram matrix of the midpoint (4x faster than its SVD at (4096, 2040)); its columns for
    singular values near ``sqrt(eps) ||M||`` are inaccurate, which shows as a large ``||E||``,
    and then V is recomputed from the SVD (``info["V_from"]`` says which).
    """
    Am = A[0]
    s2, info = sigma_min_sq_lower_streamed(lambda: iter([(slice(0, Am.shape[0]), A)]), Am.shape[1])
    if not info.get("gram_offdiag_rel", math.inf) <= SIGMA_GRAM_EPRIME_MAX:
        s2, info = _sigma_min_sq_with(A, np.linalg.svd(Am, full_matrices=False)[2].T)
        info.update({"V_from": "svd", "sigma_from": "eigenvectors"})
    return s2, info


SIGMA_GRAM_EPRIME_MAX = 1e-3  # ||E||_F above which V from the Gram matrix is replaced by the SVD's


def _sigma_min_sq_with(A, V) -> tuple[float, dict]:
    """`sigma_min_sq_lower`'s bound for a given (k, k) V."""
    return _sigma_min_sq_with_blocks(lambda: iter([(slice(0, A[0].shape[0]), A)]), V)


def _sigma_min_sq_with_blocks(blocks, V, on_block=None) -> tuple[float, dict]:
    """`_sigma_min_sq_with` for a ball A given by row blocks: ``blocks()`` returns a fresh iterator
    over ``(rows, ball)`` pairs, ``ball`` the rows ``rows`` of A (``on_block(rows, ball)``, where
    given, is called on each). ``Gm`` and the column sums of ``Cm^2`` and ``Cr^2`` are accumulated block by
    block: sums of the same m terms in another order, so the same a-priori rounding bounds hold
    (Higham's ``gamma_m`` holds for any summation order). Memory: a few (k, k) arrays and one block."""
    k = V.shape[0]
    if not k * midrad.U < 0.01:
        raise ValueError(f"inner dimension {k} too large for the a-priori rounding bound")
    Gm = np.zeros((k, k))
    c_cols = np.zeros(k)
    rad_sq = flint.arb(0)
    m = 0
    for rows, blk in blocks():
        if on_block is not None:
            on_block(rows, blk)
        Cm = blk[0] @ V
        np.add(Gm, Cm.T @ Cm, out=Gm)  # (NumPy calls BLAS syrk here: half a product's flops)
        Cm *= Cm  # (not used again: squared in place)
        c_cols += np.sum(Cm, axis=0)
        rad_sq += flint.arb(_radius_rows_sq(blk, k))
        m += Cm.shape[0]
        del Cm
    # the radius of C = M V by Cauchy-Schwarz, row by column: |C - fl(Am V)|_ij <= (Z |V|)_ij <= ||Z_i|| ||v_j||
    # with Z = gamma_k |Am| + Ar, so the column sums of its squares are at most ||v_j||^2 ||Z||_F^2 (one
    # product fewer than Z |V|, which was half of this bound's time; measured 1.3-3x wider, and the bound
    # is insensitive to it: on one head (64, 128) the radius term was 2.8e-5 of the diagonal)
    r_cols = midrad.up(np.einsum("ij,ij->j", V, V), k + 1) * float(rad_sq.upper())
    D = np.diag(Gm).copy()
    info = {"gram_diag_min": float(D.min())}
    if not np.all(D > 0):
        return -math.inf, info
    off = np.abs(Gm)
    del Gm
    np.fill_diagonal(off, 0.0)
    s_lo = np.sqrt(D) * (1.0 - 4.0 * midrad.U)  # <= sqrt(D): sqrt and the product each round by <= u
    d_lo = s_lo * s_lo * (1.0 - 4.0 * midrad.U)  # <= D
    off /= s_lo[:, None]
    off /= s_lo[None, :]
    e_off = midrad.norm_upper((midrad.up_in_place(off, 4), None))
    del off

    def scaled_sq_norm(col_sums):  # upper bound on ||M D^(-1/2)||_F^2 from M's column sums of squares
        return float(midrad.up(np.sum(midrad.up(col_sums, m + 1) / d_lo), k + 4))

    c2, r2 = scaled_sq_norm(c_cols), scaled_sq_norm(r_cols)
    gamma = 1.03 * (m + 1) * midrad.U  # >= gamma_m, as in midrad.matmul
    e_rad = flint.arb(gamma) * c2 + 2 * (flint.arb(c2) * r2).sqrt() + r2
    e = float((flint.arb(e_off) + e_rad).upper())
    fV = midrad.orthonormality_defect(V)
    info.update({"gram_offdiag_rel": e, "gram_offdiag_mid": e_off, "gram_radius_rel": float(e_rad.upper()),
                 "V_orth_dev": fV})
    if not e < 1:
        return -math.inf, info
    lo = flint.arb(float(D.min())) * (1 - flint.arb(e)) / (1 + flint.arb(fV))
    return float(lo.lower()), info


def _radius_rows_sq(blk, k: int) -> float:
    """Upper bound on ``||gamma_k |Am| + Ar||_F^2`` for the ball block ``(Am, Ar)`` (``Ar`` None: exact),
    ``gamma_k`` the a-priori rounding of an inner product of length k (as in `midrad.matmul`)."""
    Am, Ar = blk
    gamma = 1.03 * (k + 1) * midrad.U
    Z = np.abs(Am)
    Z *= gamma
    if Ar is not None:
        Z += Ar
    return midrad.norm_upper((midrad.up_in_place(Z, 2), None)) ** 2 * (1 + 4 * midrad.U)


def sigma_min_sq_lower_streamed(blocks, k: int, on_block=None) -> tuple[float, dict]:
    """`sigma_min_sq_lower` for a ball A too large to hold: ``blocks()`` returns a fresh iterator over
    ``(rows, ball)`` row blocks of A (called twice: once for the midpoint's Gram matrix, whose ``eigh``
    gives V, once for the bound; ``on_block`` sees each block of the second pass). V comes from
    ``eigh`` only: the SVD fallback of `sigma_min_sq_lower` needs A whole, so where the Gram
    matrix's V is too inaccurate the bound is ``-inf`` (``info["V_from"]`` says ``eigh``)."""
    G = np.zeros((k, k))
    for _, (Am, _) in blocks():
        np.add(G, Am.T @ Am, out=G)
    V = np.linalg.eigh(G)[1]
    del G
    s2, info = _sigma_min_sq_with_blocks(blocks, V, on_block)
    info.update({"V_from": "eigh", "sigma_from": "eigenvectors"})
    return s2, info


GRAM_SHIFTS = (0.95, 0.8, 0.5, 0.1)  # fractions of the Gram matrix's estimated lambda_min tried as Cholesky shifts
CHOLESKY_ACCEPT = 0.5  # jacobian_slice_bounds(sigma="auto") keeps the Cholesky bound from this fraction of its estimate
GRAM_INVERSE_ITERATIONS = 40  # most inverse-iteration steps for that estimate (stops at a 1e-3 relative change)
GRAM_GROUP_ROWS = 2048  # rows of J P summed by one syrk before the partial sum is added (`_gram_lower_grouped`)


GRAM_PANEL = 256  # tile width when `_gram_lower_grouped` adds a group or `_mirror_gram` mirrors (a transposing copy:
# (256, 256) tiles took half the CPU of (256, k) panels, measured at k = 8160)


def _diagonal_tiles(k: int):
    """Slices of the (GRAM_PANEL, GRAM_PANEL) tiles on the diagonal (the last one may be smaller)."""
    for j0 in range(0, k, GRAM_PANEL):
        yield slice(j0, min(k, j0 + GRAM_PANEL))


def _below_diagonal_tiles(k: int):
    """``(rows, cols)`` slices of the (GRAM_PANEL, GRAM_PANEL) tiles strictly below the diagonal tiles."""
    for rows in _diagonal_tiles(k):
        for i0 in range(0, rows.start, GRAM_PANEL):
            yield rows, slice(i0, i0 + GRAM_PANEL)


def _add_to_lower(S: np.ndarray, g_diag: np.ndarray, addend) -> None:
    """Adds a symmetric matrix to the one held in ``S``'s strict lower triangle and ``g_diag``, by
    (GRAM_PANEL, GRAM_PANEL) tiles: ``addend(rows, cols)`` gives its tile ``[rows, cols]`` on and below
    the diagonal (one addition per entry; a diagonal tile's upper triangle is not used)."""
    for rows, cols in _below_diagonal_tiles(S.shape[0]):
        S[rows, cols] += addend(rows, cols)
    for tile in _diagonal_tiles(S.shape[0]):
        D = S[tile, tile]
        L = addend(tile, tile)
        low = np.tril_indices(D.shape[0], -1)
        D[low] += L[low]
        g_diag[tile] += L.diagonal()


def _gram_lower_grouped(blocks, k: int, on_block=None, group_rows: int = GRAM_GROUP_ROWS):
    """``(S, g_diag, stats)``: ``fl(Am^T Am)`` of the midpoint of the ball given by row blocks
    (``blocks()``, ``on_block`` as in `sigma_min_sq_lower_cholesky`) in one (k, k) Fortran array:
    its strict lower triangle in the strict lower triangle of ``S``, its diagonal in ``g_diag``.
    ``S``'s upper triangle and diagonal are a work area (their contents are spent): here the groups'
    partial sums, in `sigma_min_sq_lower_cholesky` the Cholesky factors (`_mirror_gram`). One
    (k, k) array where a separate work array made two (2.1 GB less at one head (64, 256)).

    Summed in groups: each group of at least ``group_rows`` rows (whole blocks) is accumulated by BLAS
    syrk into ``S``'s upper triangle, and the groups' partial sums are added into the lower one, one
    after another (the same additions, in the same order, as into a separate array).

    Rounding (Higham, any summation order inside a group): with M the most rows in a group and N
    the number of groups, ``|G - Am^T Am| <= (gamma_M + gamma_(N-1) (1 + gamma_M)) |Am|^T |Am|``
    entrywise; ``stats["gamma"]`` is an upper bound on that factor. Summed in one syrk (M = m,
    the bound before the groups) the factor is gamma_m: at one head (64, 128), m = 16384, about
    6x the grouped one (2560 rows a group, 7 groups); at (64, 256) 30x.

    ``stats`` also holds ``a_sq`` and ``r_sq``, upper bounds (arb) on ``||Am||_F^2`` and
    ``||Ar||_F^2``, ``m``, ``groups`` and ``group_max_rows``."""
    import scipy.linalg.blas

    S = np.zeros((k, k), order="F")
    g_diag = np.zeros(k)
    a_sq, r_sq = flint.arb(0), flint.arb(0)
    m = in_group = groups = most = 0

    def add_group():  # lower triangle += the group's upper triangle, transposed, by tiles
        nonlocal in_group, groups, most
        _add_to_lower(S, g_diag, lambda rows, cols: S[cols, rows].T)
        groups, most, in_group = groups + 1, max(most, in_group), 0

    for rows, blk in blocks():
        if on_block is not None:
            on_block(rows, blk)
        Am, Ar = blk
        # the first block of a group overwrites the upper triangle (beta = 0 reads nothing of it);
        # syrk with lower=0 never writes the strict lower triangle
        scipy.linalg.blas.dsyrk(1.0, np.asarray(Am, np.float64).T, beta=1.0 if in_group else 0.0, c=S, trans=0,
                                lower=0, overwrite_c=1)
        a_sq += flint.arb(midrad.norm_upper((Am, None))) ** 2
        if Ar is not None:
            r_sq += flint.arb(midrad.norm_upper((Ar, None))) ** 2
        m += Am.shape[0]
        in_group += Am.shape[0]
        if in_group >= group_rows:
            add_group()
    if in_group:
        add_group()
    if not (most + 1) * midrad.U < 0.01 or not (groups + 1) * midrad.U < 0.01:
        raise ValueError(f"{most} rows in a group or {groups} groups: too many for the a-priori rounding bound")
    g_in = flint.arb(1.03 * (most + 1) * midrad.U)  # >= gamma_M, as in midrad.matmul
    g_across = flint.arb(1.03 * (groups + 1) * midrad.U)  # >= gamma_(N-1)
    gamma = float((g_in + g_across * (1 + g_in)).upper())
    return S, g_diag, {"gamma": gamma, "a_sq": flint.arb(a_sq.upper()), "r_sq": flint.arb(r_sq.upper()), "m": m,
                       "groups": groups, "group_max_rows": most}


def _mirror_gram(S: np.ndarray, g_diag: np.ndarray) -> np.ndarray:
    """Copies the Gram matrix of `_gram_lower_grouped` (``S``'s strict lower triangle, ``g_diag``)
    into ``S``'s upper triangle and diagonal, exactly (copies, no arithmetic), by tiles; the
    strict lower triangle is left as it is. Returns ``S``."""
    k = S.shape[0]
    for rows, cols in _below_diagonal_tiles(k):
        S[cols, rows] = S[rows, cols].T
    for tile in _diagonal_tiles(k):
        D = S[tile, tile]
        up = np.triu_indices(D.shape[0], 1)
        D[up] = D.T[up]
    S[np.diag_indices(k)] = g_diag
    return S


def _gram_rayleigh(S: np.ndarray, g_diag: np.ndarray, y: np.ndarray) -> float:
    """``y^T G y`` for the Gram matrix of `_gram_lower_grouped` (an estimate: float64, no bound):
    ``2 y^T L y + sum(g_diag y^2)`` with L its strict lower triangle, from one unit-diagonal trmv
    (``(L + I) y``; S's diagonal, the work area's, is not read)."""
    import scipy.linalg.blas

    Ly = scipy.linalg.blas.dtrmv(S, y, lower=1, diag=1) - y
    return float(2.0 * (y @ Ly) + g_diag @ (y * y))


def sigma_min_sq_lower_cholesky(blocks, k: int, on_block=None, shifts=GRAM_SHIFTS,
                                group_rows: int = GRAM_GROUP_ROWS) -> tuple[float, dict]:
    """Rigorous lower bound on ``sigma_min(M)^2`` for every M of a float ball A given by row blocks,
    from one pass over the blocks and Cholesky factorisations, with no eigenvectors: one (k, k) array
    (the Gram matrix in its lower triangle, the factors in its upper one) where
    `sigma_min_sq_lower_streamed` needs about seven and a second pass.

    ``blocks()``, ``on_block``: as in `sigma_min_sq_lower_streamed` (one pass here). The pass
    accumulates ``Gm = fl(Am^T Am)`` (`_gram_lower_grouped`: BLAS syrk by groups of about
    ``group_rows`` rows, the groups' sums added) and upper bounds ``a^2 >= ||Am||_F^2`` and ``r^2 >=
    ||Ar||_F^2``. For every member ``M = Am + D``, ``|D| <= Ar``: ``M^T M = Am^T Am + Am^T D + D^T Am +
    D^T D`` and ``|Gm - Am^T Am| <= gamma |Am|^T |Am|`` entrywise (gamma from the rows in a group and
    the number of groups, see `_gram_lower_grouped`), so by Weyl ``lambda_min(M^T M) >=
    lambda_min(Gm) - (gamma a^2 + 2 a r + r^2)``, using ``|| |Am|^T |Am| ||_2 = || |Am| ||_2^2 <=
    ||Am||_F^2`` and ``||D||_2 <= ||Ar||_F``. Then ``lambda_min(Gm) >= t - c`` is proved by
    `lambda_min_at_least`'s shifted Cholesky, with ``t`` a fraction (``shifts``, tried in turn) of an
    estimate of ``lambda_min(Gm)`` (the Rayleigh quotient of inverse iteration with Gm's own
    Cholesky factor, from a seeded random start; an estimate only chooses t, it proves nothing).

    Its rounding terms are relative to ``||Am||_F^2`` (about ``(M + N + k) u`` of it, M the rows in a
    group and N the groups), not to ``sigma_min^2``: so it is close to the eigenvector bound where
    ``||Am||_F^2 / sigma_min^2`` is far below ``1 / ((M + N + k) u)``, and ``-inf`` where not (then
    ``info["cholesky"]`` says why), where the eigenvector bound still holds to ``sigma_min^2 ~
    sqrt(u) ||M||^2``. Summed in one syrk (before the groups) it was 0.95x the eigenvector bound at
    one head (32, 64) and 0.83x at (64, 128), seed 0 (benchmarks/sigma_bench.py). At one head
    (64, 256), k = 16352, it is what fits the 8 GiB budget at all.
    """
    if not (k + 1) * midrad.U < 0.01:
        raise ValueError(f"inner dimension {k} too large for the a-priori rounding bound")
    S, g_diag, stats = _gram_lower_grouped(blocks, k, on_block, group_rows)
    a_sq, r_sq = stats["a_sq"], stats["r_sq"]
    rounding = float((flint.arb(stats["gamma"]) * a_sq + 2 * (a_sq * r_sq).sqrt() + r_sq).upper())
    info = {"sigma_from": "cholesky", "gram_rounding": rounding, "gram_frobenius_sq": float(a_sq.upper()),
            "gram_groups": stats["groups"], "gram_group_max_rows": stats["group_max_rows"]}
    return _shifted_cholesky_bound(S, g_diag, rounding, info, shifts, "Gram matrix"), info


def _shifted_cholesky_bound(S: np.ndarray, g_diag: np.ndarray, rounding: float, info: dict, shifts, what: str) -> float:
    """``lambda_min(G) - rounding`` bounded below for the symmetric float64 matrix G held in the
    Fortran array ``S`` (its strict lower triangle) and ``g_diag`` (its diagonal), by
    `_lambda_min_at_least_in_place` at shifts ``t = f * estimate`` for ``f`` in ``shifts``, in turn;
    ``-inf`` where none proves a positive value (``info["cholesky"]`` says why). The estimate of
    ``lambda_min(G)`` is the Rayleigh quotient of inverse iteration with G's own Cholesky factor, from a
    seeded random start: it only chooses t, it proves nothing. S's upper triangle and diagonal are
    the work area (`_mirror_gram` restores G there before each factorisation); ``what`` names G in
    the reasons. Updates ``info`` with ``gram_lambda_estimate``, ``inverse_iterations`` and, on success,
    ``gram_shift`` and ``gram_lambda_lower``."""
    import scipy.linalg.lapack

    k = S.shape[0]
    if not math.isfinite(float(_mirror_gram(S, g_diag).sum())):  # (a NaN or inf propagates; an overflow only refuses)
        info["cholesky"] = f"the midpoint {what} is not finite"
        return -math.inf
    # G's own factor in S's upper triangle (dpotrf with lower=0 reads and writes nothing else)
    R, fail = scipy.linalg.lapack.dpotrf(S, lower=0, overwrite_a=1, clean=0)
    if fail != 0:
        info["cholesky"] = f"the midpoint {what} is not positive definite in float64"
        return -math.inf
    y = np.random.default_rng(0).standard_normal(k)
    estimate, steps = math.inf, 0
    for steps in range(1, GRAM_INVERSE_ITERATIONS + 1):
        y = scipy.linalg.lapack.dpotrs(R, y, lower=0)[0]
        y /= np.linalg.norm(y)
        previous, estimate = estimate, _gram_rayleigh(S, g_diag, y)
        if abs(previous - estimate) <= 1e-3 * estimate:
            break
    del R
    info.update({"gram_lambda_estimate": estimate, "inverse_iterations": steps})
    if not (math.isfinite(estimate) and estimate > rounding):
        info["cholesky"] = (f"the estimated lambda_min of the {what} ({estimate:.3e}) is not above its "
                            f"rounding and radius term ({rounding:.3e})")
        return -math.inf
    for f in shifts:
        t = f * estimate
        lam = _lambda_min_at_least_in_place(_mirror_gram(S, g_diag), t)
        if lam is None:
            continue
        s2 = float((flint.arb(lam) - flint.arb(rounding)).lower())
        info.update({"gram_shift": t, "gram_lambda_lower": lam})
        if s2 > 0:
            return s2
    info["cholesky"] = (f"no shift of {list(shifts)} x {estimate:.3e} proved lambda_min above the rounding and "
                        f"radius term {rounding:.3e}")
    return -math.inf


def gauss_newton_rows(heads, d: int, n: int):
    """Balls of the Gauss-Newton matrix ``J^T J`` (dn, dn) for every Y of the box of
    `_jacobian_slice_setup` (whose ``heads`` it takes), by blocks of n rows, without J: yields
    ``(rows, (Hm, Hr))``, ``rows = slice(a n, (a + 1) n)`` (the rows ``(a, j)``, j = 0 .. n - 1, of vec X
    row-major, as P's rows) and Hm, Hr of shape (n, dn), columns ``(b, l)`` the same way.

    ``J_r = K_r D_r`` for attention row r, with ``D_r V = Pc^T v_r + V^T q_r`` (``dS_rj = p_j^T v_r +
    q_r^T v_j``, see `jacobian_slice_enclosure`) and ``K_r`` symmetric, so ``J^T J = sum_r D_r^T Q_r D_r``
    with ``Q_r = K_r K_r`` and, entry ``[(a, j), (b, l)]``:

        delta_jl (Pc Q_j Pc^T)_ab + (Pc Q_j)_al q_jb + (Pc Q_l)_bj q_la + sum_r Q_r[j, l] q_ra q_rb,

    summed over heads. Every quantity is a float64 ball (`midrad`), so the exact ``J(Y)^T J(Y)`` of every
    Y of the box lies in each block entrywise. Costs about ``6 H n^3 d^2`` flops (the last term's
    products, three per ball product), against ``2 H n^2 k^2`` for the Gram matrix of ``J P``: at one
    head (64, 256) 4e11 against 3.5e13."""
    pre = []
    for K, Pc, Qc in heads:
        Q = midrad.matmul(K, K)  # (n, n, n): [r] = K_r K_r = K_r^T K_r
        PQ = midrad.matmul((Pc[0][None], Pc[1][None]), Q)  # (n, d, n): [j] = Pc Q_j
        PcT = midrad.transpose(Pc)
        M1 = midrad.matmul(PQ, (PcT[0][None], PcT[1][None]))  # (n, d, d): [j] = Pc Q_j Pc^T
        Q2T = (Q[0].reshape(n, n * n).T, Q[1].reshape(n, n * n).T)  # (n^2, n): [(j, l), r] = Q_r[j, l]
        del Q
        q = midrad.transpose(Qc)  # (n, d): [r, b] = q_rb
        pre.append((Q2T, PQ, M1, q, Qc))
    jj = np.arange(n)
    for a in range(d):
        H = None
        for Q2T, PQ, M1, q, Qc in pre:
            Ra = midrad.mul((q[0][:, a:a + 1], q[1][:, a:a + 1]), q)  # (n, d): q_ra q_rb
            T3 = midrad.matmul(Q2T, Ra)  # (n^2, d): sum_r Q_r[j, l] q_ra q_rb
            T3 = (T3[0].reshape(n, n, d).transpose(0, 2, 1), T3[1].reshape(n, n, d).transpose(0, 2, 1))  # [j, b, l]
            T2 = midrad.mul((PQ[0][:, a, None, :], PQ[1][:, a, None, :]),
                            (Qc[0].T[:, :, None], Qc[1].T[:, :, None]))  # [j, b, l] = (Pc Q_j)_al q_jb
            T2t = midrad.mul((PQ[0].transpose(2, 1, 0), PQ[1].transpose(2, 1, 0)),
                             (Qc[0][a][None, None, :], Qc[1][a][None, None, :]))  # (Pc Q_l)_bj q_la
            Hh = midrad.add(midrad.add(T3, T2), T2t)
            del T3, T2, T2t
            dm, dr = midrad.add((Hh[0][jj, :, jj], Hh[1][jj, :, jj]), (M1[0][:, a, :], M1[1][:, a, :]))
            Hh[0][jj, :, jj] = dm  # the diagonal blocks l = j: (Pc Q_j Pc^T)_ab
            Hh[1][jj, :, jj] = dr
            H = Hh if H is None else midrad.add(H, Hh)
        yield slice(a * n, (a + 1) * n), (H[0].reshape(n, d * n), H[1].reshape(n, d * n))


def sigma_min_sq_lower_lifted(blocks, tangent, on_block=None, shifts=GRAM_SHIFTS) -> tuple[float, dict]:
    """Rigorous lower bound on ``min |J v|^2 / |v|^2`` over the nonzero v orthogonal to the columns of
    ``tangent`` (T, (dn, t): the orbit tangent, exactly as given), for every J whose Gauss-Newton matrix
    ``J^T J`` lies in the ball given by row blocks (``blocks()``, as `gauss_newton_rows` yields them;
    ``on_block(rows, ball)`` sees each): the smallest eigenvalue of the Gauss-Newton matrix on the slice
    ``ker T^T``, with no slice basis, no ``J P`` and no (k, k) Gram matrix. The orbit directions are
    lifted in the whole space instead of projected out.

    With ``Ms`` the symmetric matrix of the midpoints' lower triangle, ``A = T C T^T`` for a symmetric
    float64 C (``c fl((T^T T)^+)``, symmetrised; c the mean diagonal, so that the lifted directions sit at
    the mean eigenvalue, above the slice's smallest) and ``M = fl(Ms + A)`` as stored: ``v^T A v = 0`` for
    every v in ``ker T^T`` whatever C is, so

        |J v|^2 = v^T J^T J v >= v^T Ms v - rho_H |v|^2 = v^T (M - E) v - rho_H |v|^2
                >= (lambda_min(M) - rho_lift - rho_H) |v|^2,

    ``rho_H >= ||J^T J - Ms||_2`` (the symmetric radius matrix: its largest row sum, or its Frobenius
    norm) and ``rho_lift >= ||E||_2``, E the rounding of M's entries: ``fl(fl(T C) T^T)`` added to Ms, a
    triple product and a sum, ``|E| <= gamma_(2t+1) (|Ms| + |T| |C| |T|^T)`` entrywise, so ``||E||_2 <=
    gamma_(2t+1) (||Ms||_F + ||T||_F^2 ||C||_F)``. ``lambda_min(M)`` is proved by
    `_shifted_cholesky_bound`. One (dn, dn) array (M in its strict lower triangle and a diagonal vector,
    the factors in its upper one, as `sigma_min_sq_lower_cholesky`); its rounding terms are the same
    ``(dn + 1) u tr(M)``, so it proves about as much as that bound on ``J P`` with P spanning ``ker
    T^T``, without the Gram pass (``2 H n^2 k^2`` flops) or P."""
    T = np.asarray(tangent, np.float64)
    dn = T.shape[0]
    t = T.shape[1] if T.ndim == 2 else -1
    if t < 0 or t >= dn or not np.all(np.isfinite(T)):
        raise ValueError(f"the tangent must be a finite (dn, t) array with t < dn, got shape {T.shape}")
    if not (dn + 1) * midrad.U < 0.01:
        raise ValueError(f"dimension {dn} too large for the a-priori rounding bound")
    S = np.zeros((dn, dn), order="F")
    g_diag = np.zeros(dn)
    row_low = np.zeros(dn)  # sum_{j <= i} Hr[i, j]
    col_low = np.zeros(dn)  # sum_{i > j} Hr[i, j]
    rad_fro_sq, mid_fro_sq = flint.arb(0), flint.arb(0)
    for rows, (Hm, Hr) in blocks():
        if on_block is not None:
            on_block(rows, (Hm, Hr))
        i0, i1 = rows.start, rows.stop
        b = i1 - i0
        low = np.tril_indices(b, -1)
        S[i0:i1, :i0] = Hm[:, :i0]
        Dm = Hm[:, i0:i1]
        S[i0:i1, i0:i1][low] = Dm[low]
        g_diag[i0:i1] = Dm.diagonal()
        Rf, Rd = Hr[:, :i0], np.tril(Hr[:, i0:i1], -1)
        r_diag = Hr[:, i0:i1].diagonal()
        row_low[i0:i1] = np.sum(Rf, axis=1) + np.sum(Rd, axis=1) + r_diag
        col_low[:i0] += np.sum(Rf, axis=0)
        col_low[i0:i1] += np.sum(Rd, axis=0)
        count = b * i1
        rad_fro_sq += flint.arb(float(midrad.up(2.0 * (np.sum(Rf * Rf) + np.sum(Rd * Rd)) + np.sum(r_diag * r_diag),
                                                count + 2)))
        Md = np.tril(Dm, -1)
        mid_fro_sq += flint.arb(float(midrad.up(2.0 * (np.sum(Hm[:, :i0] ** 2) + np.sum(Md * Md))
                                                + np.sum(Dm.diagonal() ** 2), count + 2)))
        del Rf, Rd, Md
    # the symmetric radius matrix's row sums: each sum has at most dn terms, added over at most dn blocks
    rows_sum = midrad.up(midrad.up(row_low, dn + 1) + midrad.up(col_low, 2 * dn + 1), 1)
    rho_h = min(float(np.max(rows_sum)), float(rad_fro_sq.sqrt().upper()))
    c = math.fsum(g_diag.tolist()) / dn
    info = {"sigma_from": "lifted", "lift_weight": c, "gauss_newton_radius_norm": rho_h, "lift_dimension": t}
    if not (math.isfinite(c) and c > 0 and math.isfinite(rho_h)):
        info["cholesky"] = "the Gauss-Newton matrix's midpoint trace or radius is not finite and positive"
        return -math.inf, info
    rho_lift = flint.arb(0)
    if t:
        C = c * np.linalg.pinv(T.T @ T, hermitian=True)  # (dependent columns too: the lift covers their span)
        C = (C + C.T) / 2  # (any symmetric C is valid: it only decides how tight)
        if not np.all(np.isfinite(C)):
            info["cholesky"] = "the tangent's Gram matrix has no finite pseudo-inverse in float64"
            return -math.inf, info
        B = np.ascontiguousarray(T @ C)
        _add_to_lower(S, g_diag, lambda rows, cols: B[rows] @ T[cols].T)
        del B
        t_sq = flint.arb(float(midrad.up(np.sum(T * T), T.size + 1)))
        c_fro = flint.arb(midrad.norm_upper((C, None)))
        gamma = flint.arb(1.03 * (2 * t + 2) * midrad.U)  # >= gamma_(2t+1)
        rho_lift = gamma * (mid_fro_sq.sqrt() + t_sq * c_fro)
    rounding = float((flint.arb(rho_h) + rho_lift).upper())
    info["lift_rounding"] = float(rho_lift.upper())
    s = _shifted_cholesky_bound(S, g_diag, rounding, info, shifts, "lifted Gauss-Newton matrix")
    del S
    return (s if s > 0 else -math.inf), info


def tangent_projection_upper(g, tangent) -> float:
    """Upper bound on ``||Pi g||_2`` for every g of the ball ``g`` (flat (dn,) midpoint and radius), Pi the
    orthogonal projector onto ``ker T^T``: ``||Pi g|| = min_y ||g - T y||``, so the ball norm of ``g - T y``
    for the float64 least-squares y bounds it (any y does; y only decides how tight)."""
    T = np.asarray(tangent, np.float64)
    gm, gr = g
    if T.shape[1] == 0:
        return midrad.norm_upper((gm, gr))
    y = np.linalg.lstsq(T, gm, rcond=None)[0]
    Ty = midrad.matmul((T, None), (y.reshape(-1, 1), None))
    return midrad.norm_upper(midrad.add((gm.reshape(-1, 1), gr.reshape(-1, 1)), Ty, -1.0))


def tangent_slice_bounds(problem, X, dX, tangent, box_radius: float, *, on_block=None) -> dict:
    """`jacobian_slice_bounds` on the slice ``ker T^T`` (``tangent`` T, the orbit tangent at X) with no
    basis of it: the same keys, with ``s_P = 1`` (the slice's own coordinates are isometric), ``l_lower``
    from the Gauss-Newton split with `sigma_min_sq_lower_lifted` (``sigma_from`` ``"lifted"``) and
    ``g_up`` from `tangent_projection_upper` of the ball gradient at ``X + dX``; ``slice`` is
    ``"tangent"``. `slice_theorem` then proves a unique critical point of ``v -> L(X + dX + v)`` on
    ``ker T^T`` within ``box_radius``. ``on_block`` sees the row blocks of ``J^T J``.

    Saves, against `jacobian_slice_bounds` streamed with the Cholesky bound, the Gram pass over ``J P``
    and P itself (its QR complement and its orthonormality defect, a (k, k) product): at one head
    (64, 256) about 750 s, 20 s and 100 s of a seed."""
    X = np.asarray(X, np.float64)
    dX = np.asarray(dX, np.float64)
    d, n = X.shape
    T = np.asarray(tangent, np.float64)
    heads, e2, e2_rows = _jacobian_slice_setup(problem, X, dX, None, float(box_radius))
    s2, info = sigma_min_sq_lower_lifted(lambda: gauss_newton_rows(heads, d, n), T, on_block)
    mid, rad = gradient_enclosure(problem, X, dX)
    g_up = tangent_projection_upper((mid.reshape(-1), rad.reshape(-1)), T)
    l_lower = float((flint.arb(s2) - flint.arb(e2)).lower()) if math.isfinite(s2) else -math.inf
    dX_inf, dX_2 = correction_stats(dX, X.shape)
    return {"g_up": g_up, "s_P": 1.0, "l_lower": l_lower, "dX_inf": dX_inf, "dX_2": dX_2,
            "box_radius": float(box_radius), "sigma_min_sq_lower": s2, "hessian_remainder": e2,
            "hessian_remainder_rows": e2_rows, "slice": "tangent", **info}


JACOBIAN_BLOCK_BYTES = 1 << 30  # per row block of J P when it is streamed (about 12 (rb n, k) float64 arrays)


def jacobian_streaming_plan(problem, k: int, budget: float) -> tuple[int | None, float]:
    """How `jacobian_slice_bounds` holds ``J P`` (``H n^2`` rows, k columns) in ``budget`` bytes:
    ``(None, bytes)`` whole (about 12 arrays of its size: measured 10 at (32, 64)), or
    ``(rows_per_block, bytes)`` streamed by blocks of attention rows (a block of about
    ``JACOBIAN_BLOCK_BYTES``, the (dn, k) basis P the caller holds, and the one (k, k) array of
    `sigma_min_sq_lower_cholesky`), or ``(0, bytes)`` when neither fits (the streamed need).
    Whether the streamed path may fall back to `sigma_min_sq_lower_streamed` (about seven (k, k)
    arrays) is `jacobian_sigma_method`'s answer."""
    n = problem.n
    whole = 12 * 8 * problem.heads * n * n * k
    if whole <= budget:
        return None, float(whole)
    rows = max(1, min(n, JACOBIAN_BLOCK_BYTES // (12 * 8 * n * k)))
    streamed = _streamed_bytes(problem, k, rows, 1)
    return (rows if streamed <= budget else 0), streamed


def _streamed_bytes(problem, k: int, rows_per_block: int, kk_arrays: int) -> float:
    """A streamed block of ``J P``, the (dn, k) basis P and ``kk_arrays`` (k, k) arrays, in bytes."""
    return float(rows_per_block * 12 * 8 * problem.n * k + 8 * problem.d * problem.n * k + kk_arrays * 8 * k * k)


def jacobian_sigma_method(problem, k: int, rows_per_block: int | None, budget: float) -> str:
    """``sigma`` for `jacobian_slice_bounds` under ``budget``: ``"auto"`` (the Cholesky bound, then the
    eigenvector bound where that proves less than ``CHOLESKY_ACCEPT`` of its estimate) where the
    eigenvector bound's about seven (k, k) arrays fit beside a block and P, else ``"cholesky"`` (one
    head (64, 256): 15 GB against 8 GiB)."""
    if rows_per_block is None:
        return "auto"
    return "auto" if jacobian_eigh_bytes(problem, k, rows_per_block) <= budget else "cholesky"


def jacobian_eigh_bytes(problem, k: int, rows_per_block: int) -> float:
    """The streamed eigenvector bound's need: a block, P and about seven (k, k) arrays."""
    return _streamed_bytes(problem, k, rows_per_block, 7)


def jacobian_slice_bounds(problem, X, dX, P, box_radius: float, *, rows_per_block: int | None = None,
                          on_block=None, sigma: str = "auto") -> dict:
    """`slice_bounds` for large dn, without a ball Hessian: the same keys (``g_up``, ``s_P``,
    ``l_lower``, ``dX_inf``, ``dX_2``, ``box_radius``), with ``l_lower`` from the Gauss-Newton
    split ``P^T hess L P >= (J P)^T (J P) - ||E||_2 ||P||^2`` (the regulariser's ``P^T diag(Gamma^2)
    P`` is positive semidefinite and dropped): `jacobian_slice_enclosure` and `sigma_min_sq_lower`.

    Costs a few (n^2 H, k) x (k, k) float64 products instead of dn ball HVPs: at exact fits, where
    ``||E||`` is at the rounding level of B, this is as tight as the ball Hessian.

    ``rows_per_block`` (see `jacobian_streaming_plan`): None holds ``J P`` whole (returned as
    ``jacobian_mid``); an integer streams it by that many attention rows at a time and never holds
    it (no ``jacobian_mid``, no SVD fallback; ``sigma`` below), for one head at
    (64, 128), where it is 1 GiB a copy. ``on_block(rows, ball)``, where given, sees every block of
    ``J P`` once (the whole as one block when it is held), for an independent check.

    ``sigma`` (streamed only; the whole path keeps `sigma_min_sq_lower`): ``"cholesky"``
    (`sigma_min_sq_lower_cholesky`: one pass, one (k, k) array), ``"eigh"``
    (`sigma_min_sq_lower_streamed`: two passes and ``eigh``, about seven), or ``"auto"``: the Cholesky
    bound, and the eigenvector one where that is below ``CHOLESKY_ACCEPT`` times its estimate of
    ``lambda_min(Gm)``, an upper bound on the eigenvector bound up to rounding (an ill-conditioned
    slice: its rounding terms are relative to ``||J P||_F^2``, not ``sigma_min^2``); the fallback's passes recompute the same
    blocks and do not call ``on_block`` again. ``info["sigma_from"]`` says which bound was used (``"cholesky"`` or
    ``"eigenvectors"``; after a fallback ``info["cholesky"]`` says why).

    Where the streamed path would run, `tangent_slice_bounds` (no P, no ``J P``) is the faster bound
    on the tangent's own slice; `solver.certificate.slice_certificate` tries it first.
    """
    if sigma not in ("auto", "cholesky", "eigh"):
        raise ValueError(f"sigma must be 'auto', 'cholesky' or 'eigh', got {sigma!r}")
    P = np.asarray(P, np.float64)
    X = np.asarray(X, np.float64)
    dX = np.asarray(dX, np.float64)
    k = P.shape[1]
    heads, e2, e2_rows = _jacobian_slice_setup(problem, X, dX, P, float(box_radius))
    if rows_per_block is None:
        A = _whole(heads, P, X.shape[1])
        del heads
        if on_block is not None:
            on_block(slice(0, A[0].shape[0]), A)
        s2, info = sigma_min_sq_lower(A)
        out = {"jacobian_mid": A[0], "jacobian_rad_norm": midrad.norm_upper((A[1], None))}
        del A
    else:
        rad_sq = flint.arb(0)

        def seen(rows, ball):
            nonlocal rad_sq
            rad_sq += flint.arb(midrad.norm_upper((ball[1], None))) ** 2
            if on_block is not None:
                on_block(rows, ball)

        blocks = lambda: _jacobian_slice_rows(heads, P, X.shape[1], rows_per_block)  # noqa: E731
        if sigma == "eigh":
            s2, info = sigma_min_sq_lower_streamed(blocks, k, seen)
        else:
            s2, info = sigma_min_sq_lower_cholesky(blocks, k, seen)
            if sigma == "auto" and not s2 >= CHOLESKY_ACCEPT * info.get("gram_lambda_estimate", math.inf):
                why = info.get("cholesky", "")
                s2, info = sigma_min_sq_lower_streamed(blocks, k)
                info["cholesky"] = why
        out = {"jacobian_rad_norm": float(rad_sq.sqrt().upper()), "rows_per_block": int(rows_per_block)}
    dn = P.shape[0]
    s_P = float((1 + flint.arb(midrad.orthonormality_defect(P))).sqrt().upper())
    mid, rad = gradient_enclosure(problem, X, dX)
    gz = midrad.matmul((P.T, None), (mid.reshape(dn, 1), rad.reshape(dn, 1)))
    g_up = midrad.norm_upper(gz)
    l_lower = float((flint.arb(s2) - flint.arb(e2) * flint.arb(s_P) ** 2).lower()) if math.isfinite(s2) else -math.inf
    dX_inf, dX_2 = correction_stats(dX, X.shape)
    return {"g_up": g_up, "s_P": s_P, "l_lower": l_lower, "dX_inf": dX_inf,
            "dX_2": dX_2, "box_radius": float(box_radius), "sigma_min_sq_lower": s2,
            "hessian_remainder": e2, "hessian_remainder_rows": e2_rows, **info, **out}
