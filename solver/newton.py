"""Newton iterations: an uncertified globalisation and the certified local phase.

Certified phase (tooling.md). Let ``g0 = ||grad L(X_c)||`` at the start point
and ``lambda0 = lambda_min(hess L(X_c))`` (restricted to the complement of the
symmetry orbit), M the Hessian-Lipschitz constant of the lemma on the region
``{max column norm <= R_c + r}``. On the ball ``B(X_c, r)``
``lambda_min >= m = lambda0 - M r``; choosing the smallest r with
``r >= 2 g0 / m`` (possible iff ``lambda0^2 >= 8 M g0``) makes L m-strongly
convex on the ball with its minimiser inside and every monotone iterate
inside. With ``L_g = lambda_max + M r``:

- damped phase, fixed step ``t = m / L_g`` (no line search): each step
  decreases L by at least ``gamma = m eta^2 / (2 L_g^2)``;
- quadratic phase once ``||grad|| < eta = m^2 / M``: full steps, and
  ``q_{k+1} <= q_k^2`` for ``q = (M / 2 m^2) ||grad||``.

Iteration bound printed in the certificate:
``ceil((L(X_c) - p*) / gamma) + ceil(log2(log2(q_tol) / log2(q_0)))`` with
``L(X_c) - p* <= g0^2 / (2 m)``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np
import scipy.linalg
import scipy.sparse.linalg as spla

from .errors import LinearSolveError
from .problem import Problem
from .rounding import hessian_allowance

DENSE_MAX = 2048  # dn up to which the dense Hessian and Cholesky are used
CG_MAX_ITER = 500  # matrix-free: most HVPs in one Newton linear solve (an inexact step is still a descent step)
LANCZOS_MAX_STEPS = 1000  # matrix-free lambda_min: most Lanczos steps (each keeps one dn-vector); 300 left
# two heads (64, 128), seed 7, with a Ritz residual (5.2e-5) above its Ritz value (4.2e-5), refused; 480
# converge it (2.4 s), to a smaller eigenvalue (3.70e-5)
LANCZOS_MAX_BYTES = 2**29  # and at most this much Krylov basis (1000 steps up to dn = 65536)


@dataclass
class Step:
    """One iteration record."""

    iteration: int
    regime: str  # "uncertified-lm", "uncertified-log-gauss-newton", "slice-polish", "certified-damped", "certified-quadratic"
    loss: float
    grad_norm: float
    newton_decrement: float
    step_size: float

    def as_dict(self):
        return dict(self.__dict__)


@dataclass
class History:
    steps: list[Step] = field(default_factory=list)

    def add(self, **kw):
        self.steps.append(Step(iteration=len(self.steps), **kw))

    def as_list(self):
        return [s.as_dict() for s in self.steps]


def _project_out(v: np.ndarray, T: np.ndarray | None) -> np.ndarray:
    if T is None or T.shape[1] == 0:
        return v
    return v - T @ (T.T @ v)


def _orthonormal(T: np.ndarray | None) -> np.ndarray | None:
    if T is None or T.shape[1] == 0:
        return None
    q, r = np.linalg.qr(T)
    keep = np.abs(np.diag(r)) > 1e-12 * max(1.0, np.abs(np.diag(r)).max())
    return q[:, keep]


def _restricted(Hm: np.ndarray, T: np.ndarray | None, curvature: float) -> np.ndarray:
    """``P Hm P + curvature T T^T`` with ``P = I - T T^T`` (T orthonormal), in O((dn)^2 k)."""
    if T is None or T.shape[1] == 0:
        return Hm
    HT = Hm @ T
    THT = T.T @ HT
    return Hm - HT @ T.T - T @ HT.T + T @ (THT + curvature * np.eye(T.shape[1])) @ T.T


def restricted_hessian(problem: Problem, X, T=None) -> np.ndarray:
    """Dense Hessian with the orbit directions (span T) given curvature 1 (dn <= DENSE_MAX)."""
    return _restricted(np.array(problem.hessian(X), np.float64), T, 1.0)


def newton_direction(problem: Problem, X, g, shift: float = 0.0, T=None, forcing: float = 1e-12,
                     hessian: np.ndarray | None = None):
    """Solve ``(hess L(X) + shift I) s = -g`` (restricted to the complement of span T).

    Dense Cholesky (finiteness checked) for dn <= DENSE_MAX, else conjugate
    gradients on the generated HVP with relative tolerance ``forcing``.
    ``hessian``: the dense :func:`restricted_hessian` at (X, T) when the caller has it.
    Returns (s, newton_decrement).
    """
    d, n = problem.d, problem.n
    gv = _project_out(np.asarray(g, np.float64).reshape(-1), T)
    if d * n <= DENSE_MAX:
        Hm = (restricted_hessian(problem, X, T) if hessian is None else hessian).copy()
        Hm[np.diag_indices_from(Hm)] += shift
        try:
            factor = scipy.linalg.cho_factor(Hm, check_finite=True)
        except (np.linalg.LinAlgError, ValueError) as exc:
            raise LinearSolveError(f"Newton system not positive definite at dn = {d * n} (shift {shift:.2e})") from exc
        s = -scipy.linalg.cho_solve(factor, gv, check_finite=False)
    else:
        # the orbit directions get curvature 1 and zero gradient, as in the dense branch; CG_MAX_ITER
        # reached leaves an inexact direction, which LM accepts only if L decreases
        s = np.asarray(_conjugate_gradients(problem, X, -gv, T, shift, forcing, min(10 * d * n, CG_MAX_ITER)))
    if not np.all(np.isfinite(s)):
        raise LinearSolveError("Newton step has non-finite entries; the Hessian is singular or the data overflow")
    dec = float(np.sqrt(max(-float(gv @ s), 0.0)))
    return s.reshape(d, n), dec


def extreme_eigenvalues(problem: Problem, X, T=None, stop_below: float | None = None) -> tuple[float, float, float]:
    """(lambda_min, lambda_max, margin) of the Hessian on the complement of span T.

    Dense ``eigh`` for dn <= DENSE_MAX (margin: its backward error). Matrix-free above:
    ``eigsh`` for lambda_max and :func:`lanczos_smallest` for lambda_min, margin = the larger
    Ritz residual plus the HVP's rounding. With ``stop_below``, the matrix-free lambda_min
    stops as soon as a Ritz value (an upper bound on lambda_min) falls below it and returns
    that Ritz value: enough for a caller that only needs to know lambda_min < stop_below.
    """
    d, n = problem.d, problem.n
    eps = np.finfo(np.float64).eps
    if d * n <= DENSE_MAX:
        Hm = np.asarray(problem.hessian(X), np.float64)
        Hm = (Hm + Hm.T) / 2
        k = 0 if T is None else T.shape[1]
        if k:
            # orbit directions get curvature c > ||H||_2 >= every restricted eigenvalue: the k largest
            # eigenvalues are exactly c, the others those of H on the complement of span T
            Hm = _restricted(Hm, T, 2.0 * np.linalg.norm(Hm, "fro") + 1.0)
        if stop_below is not None:
            # a few dense products settle lambda_min < stop_below (a Ritz value bounds it from above)
            # before the O((dn)^3) eigh is paid for
            theta, _, _ = lanczos_smallest(lambda v: Hm @ v, np.random.default_rng(0).normal(size=d * n),
                                           max_steps=60, stop_below=stop_below)
            if theta < stop_below:
                return theta, theta, 0.0
        ev = scipy.linalg.eigh(Hm, eigvals_only=True, check_finite=True)[: d * n - k]
        # eigvalsh is backward stable: |error| <= c dn eps ||H||_2 (solver.rounding)
        margin = hessian_allowance(d * n, np.max(np.abs(ev)))
        return float(ev[0]), float(ev[-1]), margin
    # matrix-free (d n > DENSE_MAX): Krylov methods on the generated HVP, restricted to the complement of
    # span T (projected start, projected products, so the orbit's zero curvature never enters)
    mv = hessian_operator(problem, X, T)
    op = spla.LinearOperator((d * n, d * n), matvec=mv, dtype=np.float64)
    v0 = _project_out(np.random.default_rng(0).normal(size=d * n), T)
    w, vec = spla.eigsh(op, k=1, which="LA", tol=1e-8, v0=v0)
    lmax, y = float(w[0]), vec[:, 0]
    res_max = float(np.linalg.norm(mv(y) - lmax * y))
    rounding = 10 * math.sqrt(d * n) * eps * abs(lmax)  # of one HVP, relative to ||H||_2, generous
    lmin, res_min, _ = lanczos_smallest(mv, v0, stop_below=stop_below, rounding=rounding)
    return lmin, lmax, max(res_min, res_max) + rounding


def _conjugate_gradients(problem: Problem, X, b: np.ndarray, T, shift: float, rtol: float, maxiter: int):
    """CG on ``(P H P + shift I + T T^T) s = b`` as one compiled XLA loop (jax.scipy's cg): no
    host round trip per product, and no NumPy BLAS level-1 calls, whose threads spin for
    milliseconds per call on an oversubscribed CPU."""
    d, n = problem.d, problem.n
    Tj = jnp.zeros((d * n, 0)) if T is None else jnp.asarray(T, jnp.float64)
    return _cg_compiled(problem.variant, int(maxiter))(jnp.asarray(X, jnp.float64), jnp.asarray(b, jnp.float64), Tj,
                                                       float(shift), float(rtol), problem._args)


@functools.lru_cache(maxsize=8)
def _cg_compiled(variant: str, maxiter: int):
    import jax

    from .problem import _KERNELS

    hvp = _KERNELS[variant][2]

    @jax.jit
    def solve(X, b, T, shift, rtol, args):
        d, n = X.shape

        def op(v):
            vp = v - T @ (T.T @ v)
            hv = hvp(X, vp.reshape(d, n), *args).reshape(-1)
            return hv - T @ (T.T @ hv) + shift * vp + T @ (T.T @ v)

        return jax.scipy.sparse.linalg.cg(op, b, tol=rtol, atol=0.0, maxiter=maxiter)[0]

    return solve


def hessian_operator(problem: Problem, X, T=None, shift: float = 0.0, orbit_curvature: float = 0.0):
    """``v -> (P H P + shift I + c T T^T) v`` on vec'd (row-major) directions, H the Hessian at X,
    ``P = I - T T^T``, ``c = orbit_curvature``: one generated HVP per product, never a dense matrix."""
    d, n = problem.d, problem.n
    Xj = jnp.asarray(X)

    def mv(v):
        v = np.asarray(v, np.float64).reshape(-1)
        vp = _project_out(v, T)
        hv = _project_out(np.asarray(problem.hvp(Xj, jnp.asarray(vp.reshape(d, n))), np.float64).reshape(-1), T)
        if shift:
            hv = hv + shift * vp
        if orbit_curvature and T is not None:
            hv = hv + orbit_curvature * (T @ (T.T @ v))
        return hv

    return mv


def lanczos_smallest(mv, v0: np.ndarray, *, max_steps: int = LANCZOS_MAX_STEPS, rtol: float = 1e-2,
                     stop_below: float | None = None, rounding: float = 0.0) -> tuple[float, float, int]:
    """Smallest Ritz value of the symmetric operator ``mv`` on the Krylov space of ``v0``.

    Lanczos with full reorthogonalisation (so the basis stays orthonormal and the
    Ritz value is a Rayleigh quotient). Returns ``(theta, residual, steps)`` with
    ``residual = ||H y - theta y||`` recomputed with one more product at the Ritz vector y.

    What is rigorous: ``theta >= lambda_min`` (up to the HVP's rounding), always, so
    ``theta < stop_below`` settles ``lambda_min < stop_below`` and the iteration stops
    there. Some eigenvalue lies in ``[theta - residual, theta + residual]``; that it is
    the smallest one rests on the random start having a component along the bottom
    eigenvector (a Krylov method can miss an eigenvalue only from a start
    orthogonal to it). Stops when ``residual <= rtol |theta| + rounding`` or after
    ``max_steps`` products (memory ``max_steps`` vectors of length dn, at most
    ``LANCZOS_MAX_BYTES``).
    """
    from scipy.linalg import eigh_tridiagonal

    dim = v0.shape[0]
    max_steps = max(1, min(max_steps, dim, LANCZOS_MAX_BYTES // (8 * dim)))
    Q = np.empty((max_steps + 1, dim))
    Q[0] = v0 / np.linalg.norm(v0)
    alpha: list[float] = []
    beta: list[float] = []
    theta, s = np.inf, np.ones(1)
    k = 0
    for k in range(max_steps):
        w = mv(Q[k])
        alpha.append(float(np.sum(Q[k] * w)))  # not BLAS ddot: see _conjugate_gradients
        for _ in range(2):  # twice is enough (Kahan)
            w = w - Q[: k + 1].T @ (Q[: k + 1] @ w)
        b = math.sqrt(float(np.sum(w * w)))
        last = k + 1 == max_steps or b <= 1e-14 * max(1.0, abs(alpha[0]))
        if (k + 1) % 10 == 0 or last:
            evals, evecs = eigh_tridiagonal(np.array(alpha), np.array(beta), select="i",
                                                         select_range=(0, 0))
            theta, s = float(evals[0]), evecs[:, 0]
            estimate = b * abs(s[-1])  # ||H y - theta y|| in exact arithmetic
            if (stop_below is not None and theta < stop_below) or estimate <= rtol * abs(theta) + rounding or last:
                break
        beta.append(b)
        Q[k + 1] = w / b
    y = Q[: len(s)].T @ s
    y /= np.linalg.norm(y)
    residual = float(np.linalg.norm(mv(y) - theta * y))
    return theta, residual, k + 1


def levenberg_marquardt(problem: Problem, X, history: History, max_iter: int, gtol: float, T_fn=None):
    """Uncertified globalisation: Newton with an adaptive shift, accepted only when L decreases."""
    X = np.asarray(X, np.float64)
    f = float(problem.loss(X))
    # shift = mu * min(1, ||grad||): adaptive far away, and proportional to the gradient near a
    # non-degenerate minimiser, which keeps the local convergence quadratic
    mu = 1e-3 * max(1.0, abs(f))
    Xh = Hm = None  # the dense Hessian is reused while rejected steps only change the shift
    rejected, g_start = 0, None
    for _ in range(max_iter):
        g = np.asarray(problem.grad(X), np.float64)
        gn = float(np.linalg.norm(g))
        if gn <= gtol:
            break
        g_start = gn if g_start is None else g_start
        T = T_fn(X) if T_fn else None
        shift = max(mu * min(1.0, gn), 1e-300)
        if problem.d * problem.n <= DENSE_MAX and Xh is not X:
            Xh, Hm = X, restricted_hessian(problem, X, T)
        try:
            s, dec = newton_direction(problem, X, g, shift=shift, T=T, hessian=Hm if Xh is X else None)
        except LinearSolveError:
            mu *= 10
            if mu > 1e12:
                break
            continue
        Xn = X + s
        fn = float(problem.loss(Xn))
        if np.isfinite(fn) and fn < f:
            history.add(regime="uncertified-lm", loss=fn, grad_norm=gn, newton_decrement=dec, step_size=1.0)
            X, f = Xn, fn
            mu = max(mu / 3, 1e-14)
            rejected = 0
        else:
            mu *= 4
            rejected += 1
            # two rejections in a row with the gradient at 1000 eps of its scale: the rounding floor
            if mu > 1e12 or (rejected >= 2 and gn <= 1e3 * np.finfo(np.float64).eps * max(1.0, g_start)):
                break
    return X


@dataclass
class LocalConstants:
    """Constants certified on the ball B(center, radius)."""

    lambda0: float
    lambda_max: float
    M: float
    radius: float
    m: float
    L_g: float
    grad_norm: float
    margin: float
    safety: float = 2.0  # r >= safety * g / m with g = safety * ||grad||; 1 when ||grad|| is a rigorous bound

    @property
    def eta(self) -> float:
        return self.m**2 / self.M

    @property
    def iteration_bound(self) -> int:
        gamma = self.m * self.eta**2 / (2 * self.L_g**2)
        gap = self.grad_norm**2 / (2 * self.m)
        damped = math.ceil(gap / gamma) if self.grad_norm >= self.eta else 0
        return damped + quadratic_bound(self, 1e-300)


def quadratic_bound(c: LocalConstants, gtol: float) -> int:
    """Full-step iterations until ``||grad|| <= gtol`` once ``||grad|| < eta`` (q_0 <= 1/2)."""
    q_tol = max(c.M / (2 * c.m**2) * gtol, 1e-300)
    if q_tol >= 0.5:
        return 1
    return max(1, math.ceil(math.log2(math.log2(q_tol) / math.log2(0.5))))


def local_constants(lambda0, lambda_max, margin, grad_norm, M_of_radius, safety: float = 2.0) -> LocalConstants | None:
    """Smallest radius r with r >= s g / (lambda0 - M(r) r), g = s ||grad||; None when impossible.

    ``M_of_radius(r)`` is the Hessian-Lipschitz constant on the region of radius r
    (non-decreasing in r). Solved by fixed-point iteration on r. The theorem needs only
    ``m r > ||grad||`` (m-strong convexity on the ball puts the unique critical point within
    ||grad|| / m); the safety factor s = 2 (twice, on g and on the radius) covers a float64
    gradient at the rounding floor, which another code path evaluates differently. With a
    rigorous upper bound on ||grad|| (ball arithmetic) s = 1.
    """
    lam = lambda0 - margin
    if lam <= 0:
        return None
    g = safety * grad_norm + 1e-300
    r = safety * g / lam
    for _ in range(100):
        M = M_of_radius(r)
        disc = lam * lam - 4 * safety * M * g
        if disc < 0:
            return None
        r_new = (lam - math.sqrt(disc)) / (2 * M) if M > 0 else safety * g / lam
        r_new = max(r_new, safety * g / lam)
        if abs(r_new - r) <= 1e-12 * r:
            r = r_new
            break
        r = r_new
    # step just past the smallest root of M r^2 - lam r + 2 g = 0, where the inequality is strict
    r *= 1 + 1e-6
    M = M_of_radius(r)
    m = lam - M * r
    if m <= 0 or r < safety * g / m:
        return None
    return LocalConstants(lambda0=lambda0, lambda_max=lambda_max, M=M, radius=r, m=m,
                          L_g=lambda_max + margin + M * r, grad_norm=grad_norm, margin=margin, safety=safety)


def certified_newton(problem: Problem, X, consts: LocalConstants, history: History, gtol: float, T=None,
                     max_iter: int | None = None):
    """Newton with the certified step sizes; returns (X, iterations)."""
    X = np.asarray(X, np.float64)
    limit = max_iter or consts.iteration_bound + 5
    it = 0
    best = float(np.linalg.norm(_project_out(np.asarray(problem.grad(X), np.float64).reshape(-1), T)))
    stalls = 0
    while it < limit:
        g = np.asarray(problem.grad(X), np.float64)
        gn = float(np.linalg.norm(_project_out(g.reshape(-1), T)))
        if gn <= gtol:
            break
        s, dec = newton_direction(problem, X, g, T=T, forcing=min(0.5, math.sqrt(gn)) * 1e-6)
        quadratic = gn < consts.eta
        t = 1.0 if quadratic else consts.m / consts.L_g
        X = X + t * s
        it += 1
        f = float(problem.loss(X))
        history.add(regime="certified-quadratic" if quadratic else "certified-damped", loss=f, grad_norm=gn,
                    newton_decrement=dec, step_size=t)
        if gn >= best * 0.5:  # no progress: rounding floor reached
            stalls += 1
            if stalls >= 2:
                break
        best = min(best, gn)
    return X, it
