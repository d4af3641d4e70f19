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

import flint
import numpy as np

from derivations.lemmas import lemma

from .region import Region


def _arb_array(a, rad=0.0):
    a = np.asarray(a, dtype=np.float64)
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = flint.arb(float(a[idx]), rad) if rad else flint.arb(float(a[idx]))
    return out


def _rowsum(A):
    s = A.sum(axis=1)
    return np.repeat(s[:, None], A.shape[1], axis=1)


def hvp_generic(X, V, W, u, B, Gamma2, exp):
    """Hessian of ``1/2 ||softmax(X^T W X + 1 u^T X) - B||^2 + 1/2 ||Gamma o X||^2`` applied to V.

    Written with +, *, @ and ``exp`` only, so it runs on floats (checked against
    the generated kernel) and on arb balls alike. Gamma2 = Gamma o Gamma.
    """
    n = X.shape[1]
    ones = np.ones((n, 1), dtype=object if X.dtype == object else float)
    S = X.T @ W @ X + ones @ (u[None, :] @ X)
    E = exp(S)
    F = E / _rowsum(E)
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


def _arb_exp(A):
    out = np.empty(A.shape, dtype=object)
    for idx in np.ndindex(A.shape):
        out[idx] = A[idx].exp()
    return out


def hessian_on_box(Xc, radius, W, u, B, gamma):
    d, n = Xc.shape
    X = _arb_array(Xc, radius)
    Wa, ua, Ba = _arb_array(W), _arb_array(u), _arb_array(B)
    G2 = _arb_array(np.full((d, n), gamma**2))
    cols = []
    for k in range(d * n):
        E = np.zeros(d * n)
        E[k] = 1.0
        cols.append(hvp_generic(X, _arb_array(E.reshape(d, n)), Wa, ua, Ba, G2, _arb_exp).reshape(-1))
    return np.array(cols).T


def lambda_min_lower(Hb) -> float:
    """Rigorous lower bound on lambda_min over all symmetric matrices in the ball matrix Hb."""
    N = Hb.shape[0]
    mid = [[float(Hb[i, j].mid()) for j in range(N)] for i in range(N)]
    mid = [[(mid[i][j] + mid[j][i]) / 2 for j in range(N)] for i in range(N)]  # exact in float64? bound below
    # the symmetrisation error and every radius go into the perturbation matrix
    pert = flint.arb(0)
    for i in range(N):
        for j in range(N):
            dev = abs(Hb[i, j] - flint.arb(mid[i][j]))  # ball containing |H_ij - mid_ij|
            pert += dev.upper() ** 2
    pert_norm = pert.sqrt().upper()
    eig = flint.acb_mat(mid).eig(multiple=True, algorithm="rump")
    lam_lower = min(float(e.real.lower()) for e in eig)
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
