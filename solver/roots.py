"""Exact preimages of attention outputs, each certified by the Kantorovich theorem.

The attention-output variant observes ``O_h(X) = F_h(X) X^T W_V,h`` (``F_h`` the row-softmax of
``X^T W_h X + 1 u_h^T X``). With one head and ``d_v = d`` these are ``d n`` equations in the
``d n`` unknowns of X: a *square* nonlinear system, and square systems generically have several
isolated solutions. Where two of them exist the observed outputs do not determine X, whatever
the solver: no method can tell the planted input from the other preimage. This module finds
preimages and proves each one:

- :func:`polish`: Newton on the residual ``r(X) = O(X) - B`` (the Gauss-Newton step, exact for
  a square system), damped by halving until ||r|| falls, from any start.
- :func:`kantorovich`: with ``J = Dr(X^)`` (dense, float64), ``beta >= ||J^-1||_2``,
  ``eta >= ||J^-1 r(X^)||`` and ``K`` the generated bound of the lemma ``output_map_curvature``
  (``Dr`` is K-Lipschitz on the ball of radius ``rho`` around ``X^``), ``h = beta K eta <= 1/2``
  proves an exact root within ``t* = (1 - sqrt(1 - 2h)) / (beta K)`` of ``X^``, and the only
  root in the ball of radius ``min(rho, t**)``, ``t** = (1 + sqrt(1 - 2h)) / (beta K)``
  (Kantorovich; Ortega and Rheinboldt, 12.6.2).
- :func:`find_roots`: random starts, LM on the loss then :func:`polish`, every root certified
  and kept once (two certified roots are *distinct* when their distance exceeds the sum of
  their radii ``t*``).

Floating point, not interval arithmetic: r is evaluated in x87 extended precision with an
a-priori bound on its rounding (:func:`residual_extended`), and the smallest singular value
of the float64 Jacobian is lowered by an a-priori allowance for its rounding; both are stated
in the certificate. tests/test_roots.py checks the extended residual against an mpmath
evaluation at 50 digits.

**Ill-conditioned roots: a double-double centre.** ``h = beta^2 K ||r||`` and a float64 point
cannot bring ||r|| below about ``eps ||J|| ||X||`` (1e-15 at (8, 32)), so a root with
``s_min(J)`` near 1e-6 fails the test at every float64 point (25 of 200 planted roots at
(8, 32)). Where the float64 test fails at a float64 root (a Newton step below
``REFINE_MAX_REL``), :func:`kantorovich` refines to a centre ``X + dX`` (``dX`` a float64
correction, the sum exact): Newton steps with the residual in 320-bit ball arithmetic
(:func:`proofs_check.rigorous.output_residual_enclosure`, a rigorous bound on ||r||) and
the float64 Jacobian, renormalised so X is the float64 point nearest the centre. The test
then runs at the centre, with ``K ||dX||`` taken off ``s_min`` (the Jacobian at the centre
is within that of the one at X) and ``K`` on the region around X widened by ``||dX||``;
the radii are stated for the returned X (``t* + ||dX||``, uniqueness ``min(rho, t**) - ||dX||``),
and ``dX`` is stored in the certificate for `proofs_check.recheck`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from .errors import InvalidProblemError
from .problem import OUTPUT, Problem

EPS = float(np.finfo(np.float64).eps)
POLISH_HALVINGS = 20  # smallest damped Newton step of polish(): 2^-20 of the full one
POLISH_WINDOW, POLISH_WINDOW_GAIN = 10, 0.99  # polish() stops when 10 steps lowered ||r|| by less than 1%
REFINE_MAX_REL = 1e-6  # largest float64 Newton step, relative to max(1, ||X||), at which a failed test is refined
REFINE_STEPS = 6  # most Newton steps of the refinement (each multiplies the error by about cond(J) eps)


def _check(problem: Problem) -> None:
    if problem.variant != OUTPUT:
        raise InvalidProblemError("exact preimages are defined for the attention-output variant (give W_V)")
    if np.any(problem.Gamma != 0):
        raise InvalidProblemError("the root test is for the unregularised equations O(X) = B; use gamma = 0")
    m, dn = problem.heads * problem.n * problem.W_V.shape[-1], problem.d * problem.n
    if m != dn:
        raise InvalidProblemError(
            f"the Kantorovich root test needs a square system: H n d_v = {m} equations against d n = {dn} unknowns "
            f"(one head with d_v = d); over-determined instances are certified as least-squares minimisers by "
            f"solver.recover instead")


def _outputs(X, W, U, Wv):
    S = jnp.einsum("an,hab,bm->hnm", X, W, X) + (U @ X)[:, None, :]
    return jnp.einsum("hnm,am,hav->hnv", jax.nn.softmax(S, axis=-1), X, Wv)


@jax.jit
def _residual(X, W, U, Wv, B):
    return (_outputs(X, W, U, Wv) - B).reshape(-1)


@jax.jit
def _jacobian(X, W, U, Wv, B):
    return jax.jacfwd(lambda Z: _residual(Z, W, U, Wv, B))(X).reshape(-1, X.size)


def _data(problem: Problem):
    return tuple(jnp.asarray(a, jnp.float64) for a in (problem.W, problem.U, problem.W_V, problem.B))


def residual(problem: Problem, X) -> np.ndarray:
    """``r(X) = O(X) - B`` flattened (H n d_v,), float64."""
    return np.asarray(_residual(jnp.asarray(X, jnp.float64), *_data(problem)))


def jacobian(problem: Problem, X) -> np.ndarray:
    """Dense Jacobian of :func:`residual` with respect to vec(X) (row-major), (H n d_v, d n)."""
    return np.asarray(_jacobian(jnp.asarray(X, jnp.float64), *_data(problem)))


def polish(problem: Problem, X, *, max_iter: int = 100) -> np.ndarray:
    """Newton on the square system ``r(X) = 0``, damped: each step is the largest of 1, 1/2, ...,
    2^-POLISH_HALVINGS times the Newton step that lowers ||r||.

    Stops when no such step lowers ||r|| (the rounding floor), when ``POLISH_WINDOW`` steps together
    lowered it by less than ``1 - POLISH_WINDOW_GAIN`` (not converging to a root: a positive-loss
    minimum), or after `max_iter` steps. The damping matters at an ill-conditioned root: there the
    full step overshoots from as close as 5e-4 (relative), where LM on the loss has already stopped
    at its gradient floor ((8, 32) seed 181: 48 damped steps, 1/32 to 1/2, then full quadratic ones).
    Raises :class:`InvalidProblemError` where the system is not square. Returns the last accepted
    iterate, the best seen (never a NaN: a singular or non-finite step ends the iteration).
    """
    _check(problem)
    X = np.asarray(X, np.float64)
    r = residual(problem, X)
    rn = float(np.linalg.norm(r))
    if not np.isfinite(rn):
        return X
    window = [rn]
    for _ in range(max_iter):
        step = np.linalg.lstsq(jacobian(problem, X), r, rcond=None)[0]
        if not np.all(np.isfinite(step)):
            break
        step = step.reshape(X.shape)
        t = 1.0
        for _ in range(POLISH_HALVINGS + 1):
            Y = X - t * step
            ry = residual(problem, Y)
            ryn = float(np.linalg.norm(ry))
            if ryn < rn:  # (a NaN compares False: halved, then refused)
                break
            t *= 0.5
        else:
            break
        X, r, rn = Y, ry, ryn
        window.append(rn)
        if len(window) > POLISH_WINDOW:
            if rn > POLISH_WINDOW_GAIN * window[-POLISH_WINDOW - 1]:
                break
    return X


@dataclass(frozen=True)
class RootCertificate:
    """Kantorovich's test at one point ``X`` (d, n).

    - `exists`: True when ``h <= 1/2`` and ``t* <= rho``: an exact root lies within `radius`
    - `radius`: ``t*``; `unique_radius`: ``min(rho, t**)``, no other root within it
    - `beta`, `eta`, `K`, `h`, `rho`: the theorem's quantities (``beta``, ``eta`` include the rounding allowances)
    - `sigma_min`: smallest singular value of the computed Jacobian; `residual_norm`: ||r(X)|| computed
    - `rounding`: the bound on the extended-precision rounding of ||r|| (added to it); 0 where the
      centre is refined, `residual_norm` then being the ball arithmetic's rigorous bound
    - `dX`: None, or the (1, d, n) float64 correction of the double-double centre ``X + dX`` the
      test ran at (module docstring); then `correction_norm` is an upper bound on ``||dX||``
    """

    X: np.ndarray = field(repr=False)
    exists: bool
    radius: float
    unique_radius: float
    beta: float
    eta: float
    K: float
    h: float
    rho: float
    sigma_min: float
    residual_norm: float
    rounding: float
    dX: np.ndarray | None = field(default=None, repr=False)
    correction_norm: float = 0.0

    def as_dict(self) -> dict:
        skip = ("X", "dX") if self.dX is not None else ("X", "dX", "correction_norm")
        out = {k: (bool(v) if k == "exists" else float(v)) for k, v in self.__dict__.items() if k not in skip}
        if self.dX is not None:
            out["dX"] = np.asarray(self.dX, np.float64).reshape(-1).tolist()
        return out


def residual_extended(problem: Problem, X) -> tuple[np.ndarray, float]:
    """``r(X)`` in x87 extended precision (``np.longdouble``) and an a-priori bound on its rounding.

    The bound is ``(n + 8 d + 32) eps_ext (||M|| (1 + 2 max|S|) + ||B||)`` with ``M = |F| |X^T| |W_V|``
    and ``S`` the logits: the dot products of S (length d, twice), the softmax (whose relative
    error is at most twice the absolute error of its arguments) and the products with X^T
    (length n) and W_V (length d), each at most its length times the unit roundoff.
    """
    ld = np.longdouble
    eps = float(np.finfo(ld).eps)
    Xl = np.asarray(X, np.float64).astype(ld)
    W, U, Wv, B = (np.asarray(a, np.float64).astype(ld) for a in (problem.W, problem.U, problem.W_V, problem.B))
    S = np.einsum("an,hab,bm->hnm", Xl, W, Xl) + (U @ Xl)[:, None, :]
    F = np.exp(S - S.max(axis=-1, keepdims=True))
    F /= F.sum(axis=-1, keepdims=True)
    r = np.einsum("hnm,am,hav->hnv", F, Xl, Wv) - B
    mag = float(np.linalg.norm(np.einsum("hnm,am,hav->hnv", F, np.abs(Xl), np.abs(Wv)).astype(np.float64)))
    smax = float(np.max(np.abs(np.einsum("an,hab,bm->hnm", np.abs(Xl), np.abs(W), np.abs(Xl)))
                        + (np.abs(U) @ np.abs(Xl))[:, None, :]))
    bound = (problem.n + 8 * problem.d + 32) * eps * (mag * (1 + 2 * smax) + float(np.linalg.norm(problem.B)))
    return r.reshape(-1), bound


def kantorovich(problem: Problem, X, *, rhos=(1e-3, 1e-2, 1e-1, 1.0), refine: bool = True) -> RootCertificate:
    """Kantorovich's test at ``X``; see the module docstring.

    ``beta = 1 / (s_min(J^) - delta_J)`` with ``J^`` the float64 Jacobian and
    ``delta_J = (n + 8 d + 32) eps ||J^||_F`` (a-priori allowance for its rounding);
    ``eta = beta (||r_ext|| + bound)`` from :func:`residual_extended`, so ``eta >= ||J^-1 r||``.
    `rhos`: region radii tried, relative to ``||X||_F``; the certificate reports the largest one
    on which a root is proved (the largest uniqueness ball), or the smallest one tried.
    `refine`: where that fails at a float64 root, retry at a double-double centre (module
    docstring); the certificate's X is then the float64 point nearest that centre, which can
    differ from the given X by the float64 solution's error (about ``||J^-1|| eps ||J|| ||X||``).
    """
    _check(problem)
    X = np.asarray(problem.check_X(X), np.float64)
    J = jacobian(problem, X)
    s = np.linalg.svd(J, compute_uv=False)
    r_ext, bound = residual_extended(problem, X)
    rn = float(np.linalg.norm(r_ext.astype(np.float64)))
    best = _test(problem, X, J, float(s[-1]), rn, bound, rhos)
    if best.exists or not refine or not (best.sigma_min > 0 and np.isfinite(rn)):
        return best
    step = np.linalg.lstsq(J, r_ext.astype(np.float64), rcond=None)[0]
    if not (np.all(np.isfinite(step)) and np.linalg.norm(step) <= REFINE_MAX_REL * max(1.0, float(np.linalg.norm(X)))):
        return best  # not a float64 root: nothing to refine
    refined = _refine(problem, X)
    if refined is None:
        return best
    Xr, dX, up, Jr = refined
    sr = float(np.linalg.svd(Jr, compute_uv=False)[-1])
    # the ball bound itself (not the midpoints' float64 norm, which can be an ulp below it), no allowance
    refined = _test(problem, Xr, Jr, sr, up, 0.0, rhos, dX)
    return refined if refined.exists else best


def _test(problem: Problem, X, J, s_min: float, rn: float, rounding: float, rhos, dX=None) -> RootCertificate:
    """Kantorovich's test with centre ``X`` (or ``X + dX``): ``||r(centre)|| <= rn + rounding``.

    With ``dX``, ``c >= ||dX||``: the Jacobian at the centre is within ``K c`` of the one at X
    (K on the region around X of radius ``rho + c``, which holds the ball of radius rho around the
    centre), and the radii are moved to X by c.
    """
    from proofs_check.region import Region

    c = 0.0
    if dX is not None:
        c = float(np.linalg.norm(np.asarray(dX, np.float64).sum(axis=0))) * (1 + 4 * EPS)
    none = RootCertificate(X, False, np.inf, 0.0, np.inf, np.inf, np.nan, np.inf, 0.0, s_min, rn, rounding, dX, c)
    delta_J = (problem.n + 8 * problem.d + 32) * EPS * float(np.linalg.norm(J))
    if not (s_min - delta_J > 0 and np.isfinite(rn)):
        return none
    best = None
    scale = float(np.linalg.norm(X))
    for rel in sorted(rhos):
        rho = rel * scale
        K = Region.around(problem, X, rho + c).bounds()["output_map_curvature"]
        sig = s_min - delta_J - K * c
        if not sig > 0:
            cert = RootCertificate(X, False, np.inf, 0.0, np.inf, np.inf, K, np.inf, rho, s_min, rn, rounding, dX, c)
        else:
            beta = 1.0 / sig
            eta = beta * (rn + rounding)
            h = beta * K * eta
            ok = False
            if h <= 0.5:
                root = np.sqrt(1.0 - 2.0 * h)
                t1, t2 = (1.0 - root) / (beta * K), (1.0 + root) / (beta * K)
                ok = t1 <= rho and min(rho, t2) > c
            if ok:
                cert = RootCertificate(X, True, (t1 + c) * (1 + 4 * EPS) if c else t1, min(rho, t2) - c, beta, eta, K, h,
                                       rho, s_min, rn, rounding, dX, c)
            else:
                cert = RootCertificate(X, False, np.inf, 0.0, beta, eta, K, h, rho, s_min, rn, rounding, dX, c)
        if best is None or cert.exists:  # the smallest rho, or the largest one that proves a root
            best = cert
    return best


def _refine(problem: Problem, X) -> tuple[np.ndarray, np.ndarray, float, np.ndarray] | None:
    """Newton from X with the residual in 320-bit balls: ``(Xr, dX, up, J)``, the float64 point nearest
    the centre, the (1, d, n) correction to it, the ball bound on ||r(Xr + dX)|| and the Jacobian at
    Xr; or None where ||r|| does not fall.

    The pair is renormalised after each step (TwoSum), so Xr is the float64 rounding of the centre
    and the Jacobian is taken at Xr, within an ulp of it; each step multiplies the error by about
    ``cond(J) eps``.
    """
    from proofs_check.midrad import two_sum
    from proofs_check.rigorous import output_residual_enclosure

    hi, lo = X.copy(), np.zeros_like(X)
    best = None
    for _ in range(REFINE_STEPS):
        mid, up = output_residual_enclosure(problem, hi, lo[None])
        if not up < 0.5 * (best[2] if best else np.inf):  # no longer converging (or not finite): keep the best
            break
        J = jacobian(problem, hi)
        best = (hi.copy(), lo[None].copy(), up, J)
        try:
            step = -np.linalg.solve(J, mid).reshape(X.shape)
        except np.linalg.LinAlgError:
            break
        if not np.all(np.isfinite(step)):
            break
        hi, lo = two_sum(hi, lo + step)
    if best is None or (np.array_equal(best[0], X) and not best[1].any()):
        return None  # no step lowered ||r||: not a root (a positive-loss minimum has J^+ r = 0 too)
    return best


@dataclass
class RootSet:
    """Distinct certified roots found by :func:`find_roots`.

    - `roots`: one :class:`RootCertificate` per distinct root, in the order found
    - `starts`: starts tried; `converged`: starts whose polished end point certified;
      `seconds`: wall time
    """

    roots: list[RootCertificate]
    starts: int
    converged: int
    seconds: float

    @property
    def count(self) -> int:
        return len(self.roots)

    def nearest(self, X) -> tuple[int, float]:
        """Index of the root nearest to ``X`` and the relative distance ``||X* - X|| / ||X||``."""
        X = np.asarray(X, np.float64)
        dist = [float(np.linalg.norm(c.X - X)) for c in self.roots]
        i = int(np.argmin(dist))
        return i, dist[i] / float(np.linalg.norm(X))

    def as_dict(self) -> dict:
        return {"count": self.count, "starts": self.starts, "converged": self.converged, "seconds": self.seconds,
                "roots": [c.as_dict() for c in self.roots]}


def add_root(roots: list[RootCertificate], cert: RootCertificate) -> bool:
    """Append ``cert`` unless it is a root already in ``roots``; True when it was new.

    Two certified roots are the same when they lie within each other's uniqueness ball, and
    distinct when their centres are further apart than the sum of their radii; anything in
    between is ambiguous and counted as the same (never an overcount).
    """
    for c in roots:
        if np.linalg.norm(c.X - cert.X) <= c.radius + cert.radius + max(c.unique_radius, cert.unique_radius):
            return False
    roots.append(cert)
    return True


def find_roots(problem: Problem, *, starts: int = 16, seed: int = 0, include=(), lm_iter: int = 60,
               progress=None) -> RootSet:
    """Certified distinct exact solutions of ``O(X) = B`` from random starts.

    - `starts`: random starts (``N(0, d^-1/2)`` entries, the planted instances' scale), drawn from
      ``np.random.default_rng(seed)``
    - `include`: extra starts tried first (for example the solver's answer)
    - `progress`: optional callable ``progress(i, starts, found)`` after each start
    """
    from .newton import History, levenberg_marquardt

    _check(problem)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    points = [np.asarray(problem.check_X(X), np.float64) for X in include]
    points += [rng.normal(scale=problem.d**-0.25, size=(problem.d, problem.n)) for _ in range(starts)]
    roots: list[RootCertificate] = []
    converged = 0
    for i, X0 in enumerate(points):
        X = levenberg_marquardt(problem, X0, History(), lm_iter, 1e-12)
        X = polish(problem, X)
        cert = kantorovich(problem, X)
        if cert.exists:
            converged += 1
            add_root(roots, cert)
        if progress is not None:
            progress(i + 1, len(points), len(roots))
    return RootSet(roots, len(points), converged, time.perf_counter() - t0)


__all__ = ["RootCertificate", "RootSet", "residual", "jacobian", "polish", "kantorovich", "find_roots", "add_root",
           "residual_extended"]
