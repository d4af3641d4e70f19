"""The certificate a recovery returns, and its JSON form.

A ``certified`` certificate states: on the ball ``B(X, radius)`` (Frobenius;
on the slice through X orthogonal to the symmetry orbit when the orbit has
positive dimension) the loss is m-strongly convex with an M-Lipschitz
Hessian (M from the lemma on the region holding the ball, validated by the
checker), so L has exactly one critical point X* there, it is a strict local
minimiser, and ``||X - X*||_F <= error_bound = ||grad L(X)|| / m``, with ||grad L(X)|| a
rigorous upper bound from ball arithmetic (attention maps, dn <= 20000; ``constants["gradient"]
== "arb"``), else ``2 ||grad L(X)|| / m`` with the float64 gradient (the factor 2 covers
rounding-level differences between gradient evaluations, so an independent recheck
reproduces the bound).

A ``kantorovich-root`` certificate (the square attention-output system, where the local
Newton certificate is out of reach: lambda_min = s_min(J)^2 is tiny) states instead: an exact
solution X* of ``O(X) = B`` lies within ``error_bound = t*`` of X and is the only one within
``radius`` (Kantorovich, :mod:`solver.roots`); X* is a global minimiser of the loss (L = 0).
At an ill-conditioned root the test runs at a double-double centre ``X + dX`` (``constants["dX"]``,
one float64 correction as a flat list, ``correction_norm >= ||dX||``), and both radii already
include ``||dX||``.

An ``interval-hessian`` certificate (attention maps, dn <= ``SLICE_CERT_MAX``; tried when the
local Newton one fails, as on one head at d >= 8, where lambda_min ~ 1e-6 against M ~ 1e5 asks for
a gradient below float64's rounding floor) needs no Hessian-Lipschitz constant: X is polished to
an extended-precision point ``X + dX`` (``constants["dX"]``: two float64 corrections, hi and lo, as
a flat list) by Newton steps whose gradients are
evaluated in 320-bit ball arithmetic, and the Hessian is enclosed in ball arithmetic on a whole
box around ``X + dX`` (:func:`proofs_check.rigorous.slice_bounds`, :func:`~proofs_check.rigorous.slice_theorem`):
strongly convex there on the slice, with a gradient at ``X + dX`` far below ``l_lower`` times the
slice radius, so L has exactly one critical point on that slice ball and
``||X - X*|| <= error_bound``. It is issued only for exact fits (X reproduces B to a relative
residual of ``FIT_RTOL`` = 1e-8, `exact_fit_tolerance`), where that critical point is a global
minimiser up to ``L(X*) <= L(X + dX)``: a strict local minimiser with a positive loss (found on an
underdetermined instance) is refused.

Above ``SLICE_CERT_MAX`` (up to ``JACOBIAN_CERT_MAX``) the same theorem is issued as an
``interval-jacobian`` certificate: ``l_lower`` comes from the Gauss-Newton split of the Hessian
(``(J P)^T (J P)`` minus a bound on the residual-weighted second-order term), with ``J P`` enclosed
in float64 midpoint-radius arithmetic with a-priori rounding bounds
(:func:`proofs_check.rigorous.jacobian_slice_bounds`): dn ball HVPs in arb would take hours at
dn = 2048. Where ``J P`` does not fit the memory budget whole (one head (64, 128): 1 GiB a copy,
about 12.8 GB for the whole path) it is streamed by blocks of attention rows and never held
(:func:`proofs_check.rigorous.jacobian_streaming_plan`; ``constants["rows_per_block"]``), and
``sigma_min(J P)^2`` is bounded by shifted Cholesky factorisations of its Gram matrix (one pass, one
(k, k) array), with the eigenvector bound as the fallback where that fits
(:func:`proofs_check.rigorous.jacobian_sigma_method`; ``constants["sigma_from"]``). Before either, the
streamed path tries the lifted bound (``sigma_from`` ``"lifted"``, ``slice`` ``"tangent"``,
:func:`proofs_check.rigorous.tangent_slice_bounds`): on the slice orthogonal to the orbit tangent
itself, with no basis P, the Gauss-Newton matrix ``J^T J`` enclosed from its closed form with the
orbit directions lifted, and no ``J P`` at all (at one head (64, 256) the lifted bound took 138 s where
the Gram pass took about 750 s); P is made only where it falls short. The streamed path's polish and
its estimate ``lambda_min`` come from the closed-form Hessian with the orbit lifted, in float64
(`_lifted_factor`), not from ``P^T H P`` by HVP blocks.

The numbers are float64 evaluations with stated rounding margins
(``lambda_min`` is lowered by ``10 dn eps ||H||``); the interval-arithmetic
proof on a box is ``unmask verify --rigorous``. Above ``solver.newton.DENSE_MAX`` the local Newton
certificate's lambda_min is a Lanczos Ritz value less its residual, and it is issued only once
:func:`prove_lambda_min` has proved that claim on the dense Hessian (:func:`attention_hessian`, in
closed form) by the test ``recheck`` applies: a shifted Cholesky factorisation, and every
eigenvalue up to dn = 4096 where that is too coarse. There ``L_g`` (an upper bound on the Hessian
over the ball, ``lambda_max + M r``) takes lambda_max from that Hessian's largest absolute row sum
(an induced norm bounds the spectral radius), not from eigsh's Ritz value, which bounds lambda_max
from below; ``constants["lambda_max"]`` stays the Ritz value, an estimate. ``recheck`` checks L_g,
m, ``eta = m^2 / M`` and ``self_concordance = M / (2 m^1.5)`` too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import platform
from dataclasses import MISSING, asdict, dataclass, field, replace

import numpy as np

from . import newton
from .newton import LocalConstants, _project_out, _restricted, extreme_eigenvalues, local_constants
from .problem import ATTENTION, Problem
from .rounding import hessian_allowance, inf_norm, symmetrise

POLISH_STEPS = 8  # most Newton steps towards the double-double point of the slice certificates
POLISH_MAX_REL = 1e-8  # largest ||dX|| / max(1, ||X||) of a slice certificate (issued and rechecked alike)
POLISH_MOVED = "the polish moved X"  # how slice_certificate's refusal for a larger ||dX|| begins
SLICE_RECENTRES = 2  # most times recover moves X to the slice polish after that refusal
SLICE_EIGVALSH_MAX = 1024  # slice dimension up to which the slice Hessian's lambda_min comes from eigvalsh
FIT_RTOL = 1e-8  # relative residual up to which a certified critical point is said to reproduce B
# dn up to which the interval-Hessian certificate is tried (dn HVPs in ball arithmetic); above it the
# interval-Jacobian one, 55-58x faster at (8, 32) and 70-74x at (16, 32) with lambda_min bounds within 0.3%
# (benchmarks/certificate_bench.py)
SLICE_CERT_MAX = 128
# dn up to which the interval-Jacobian certificate is tried (above SLICE_CERT_MAX); where J P does not fit
# the budget below whole it is streamed (proofs_check.rigorous.jacobian_streaming_plan): one head (64, 128),
# dn = 8192, seed 0: the certificate 7 of recover's 8.5 min (peak 5.7 GB), recheck 7.5 min (6.2 GB), with
# the eigenvector bound on sigma_min; 16384 (one head (64, 256), k = 16352) since the Cholesky bound fits 8 GiB there:
# seed 0 certified and rechecked, recover 17 min, recheck 10 min, peak 9.1 GB (whole process)
JACOBIAN_CERT_MAX = 16384
# and only when its float64 balls fit in this many bytes, whole or streamed (None: solver.memory's host
# budget, the smaller of 8 GiB and 3/4 of the free memory); the whole path's peak is about 10 arrays of
# H n^2 (dn - k) (measured at (32, 64), 644 MiB), estimated as 12
JACOBIAN_CERT_BYTES = None
DENSE_HESSIAN_MAX = 4096  # dn up to which the slice certificate's P^T H P comes from the dense Hessian
HVP_BLOCK = 256  # HVPs at a time above it
RIGOROUS_GRADIENT_MAX = 20000  # dn up to which the gradient norm is bounded in ball arithmetic (about 1 s at 2048)


def array_digest(X) -> str:
    a = np.ascontiguousarray(np.asarray(X, np.float64))
    return hashlib.sha256(f"{a.shape}|".encode() + a.tobytes()).hexdigest()


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("unmask", "jax", "jaxlib", "numpy", "scipy", "sympy"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass
class Certificate:
    status: str  # "certified" | "uncertified"
    fingerprint: str
    X_digest: str
    symmetry_dimension: int
    sign_flip: bool
    loss: float
    grad_norm: float
    error_bound: float | None
    radius: float | None
    constants: dict | None
    region: dict | None
    validation: dict | None
    iterations: int
    iteration_bound: int | None
    uniqueness: str
    reason: str = ""
    kind: str = "local-newton"  # or "kantorovich-root", "interval-hessian", "interval-jacobian" (module docstring)
    versions: dict = field(default_factory=versions)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def missing_fields(cls, data: dict) -> list[str]:
        """The fields without a default that ``data`` lacks (what :meth:`from_dict` needs)."""
        return [k for k, f in cls.__dataclass_fields__.items()
                if k not in data and f.default is MISSING and f.default_factory is MISSING]

    @classmethod
    def from_dict(cls, data: dict) -> "Certificate":
        """The certificate of :meth:`as_dict` (or its JSON); CertificateMismatchError when fields are missing."""
        from .errors import CertificateMismatchError

        if not isinstance(data, dict):
            raise CertificateMismatchError(f"a certificate is a dict of its fields, got {type(data).__name__}")
        missing = cls.missing_fields(data)
        if missing:
            raise CertificateMismatchError(f"not a certificate: missing {', '.join(missing)}")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def summary(self) -> str:
        if self.status != "certified":
            return f"uncertified: {self.reason}"
        c = self.constants
        if self.kind in ("interval-hessian", "interval-jacobian"):
            how = ("ball arithmetic" if self.kind == "interval-hessian" else
                   "Gauss-Newton split, float64 balls with a-priori rounding bounds")
            return (f"certified ({self.kind.replace('-', ' ')}): ||X - X*|| <= {self.error_bound:.2e}, X* the only "
                    f"critical point on the slice ball of radius {self.radius:.2e}; lambda_min >= {c['l_lower']:.3e} on a "
                    f"box of half-width {c['box_radius']:.1e} ({how}), ||grad|| at the polished point <= "
                    f"{c['g_up']:.1e}; symmetry dimension {self.symmetry_dimension}")
        if self.kind == "kantorovich-root":
            return (f"certified (Kantorovich): an exact solution of O(X) = B within {self.error_bound:.2e}, the only "
                    f"one within {self.radius:.2e}; s_min(J) = {c['sigma_min']:.3e}, K = {c['K']:.3e}, h = {c['h']:.2e}")
        return (f"certified: ||X - X*|| <= {self.error_bound:.2e} (unique critical point within radius "
                f"{self.radius:.2e}); m = {c['m']:.3e}, M = {c['M']:.3e}, L_g = {c['L_g']:.3e}; "
                f"{self.iterations} certified iterations (bound {self.iteration_bound}); "
                f"symmetry dimension {self.symmetry_dimension}")


def gradient_safety(problem: Problem) -> float:
    """1 where the final gradient norm is bounded in ball arithmetic (dn <= 20000), else 2.

    The output variant was on the float64 path until a planted (4, 8) instance (seed 27) showed
    why that is not enough: the solver's float64 gradient 8.9e-17 against the reference
    transcription's 2.1e-16, beyond the factor 2, and `recheck` rejected the certificate."""
    return 1.0 if problem.d * problem.n <= RIGOROUS_GRADIENT_MAX else 2.0


def final_constants(problem: Problem, X, T) -> tuple[LocalConstants | None, float, float, str]:
    """Local constants at X (fresh evaluation), the off-orbit gradient norm, lambda_min, and why the
    constants are None when a matrix-free lambda_min was not proved ("" otherwise).

    Above ``DENSE_MAX`` lambda_min is a Lanczos Ritz value less its residual: some eigenvalue lies
    that close, but that it is the smallest rests on the random start (two heads (64, 128), seed 7,
    once stopped at one that was not). Before such constants are returned, :func:`prove_lambda_min`
    proves the claim on the dense Hessian, as ``recheck`` does; where it cannot, they are not.
    """
    from .recover import hessian_lipschitz_on

    safety = gradient_safety(problem)
    if safety == 1.0:
        # a rigorous upper bound on the gradient (ball arithmetic) needs no safety factor: 4x less
        # demanding than twice a float64 value at the rounding floor, twice over
        from proofs_check.rigorous import gradient_norm_upper

        gn = gradient_norm_upper(problem, X, T)
    else:
        gn = float(np.linalg.norm(_project_out(np.asarray(problem.grad(X), np.float64).reshape(-1), T)))
    # local_constants needs lambda_min^2 > 4 s^2 M(r) ||grad|| >= 4 s^2 M(0) ||grad||: below that floor the
    # matrix-free lambda_min may stop early (it returns an upper bound, and the certificate fails as it must)
    floor = math.sqrt(4.0 * safety**2 * hessian_lipschitz_on(problem, X, 0.0) * gn)
    lam0, lam_max, margin = extreme_eigenvalues(problem, X, T, stop_below=floor)
    consts = local_constants(lam0, lam_max, margin, gn, lambda r: hessian_lipschitz_on(problem, X, r), safety=safety)
    why = ""
    if consts is not None and problem.d * problem.n > newton.DENSE_MAX:
        why, lam_max_up = prove_lambda_min(problem, X, T, consts.lambda0 - consts.margin)
        # L_g from a bound on lambda_max the dense Hessian proves (its row sums), not eigsh's Ritz value
        consts = None if why else replace(consts, L_g=lam_max_up + consts.M * consts.radius)
    return consts, gn, lam0, why


def hessian_by_hvp_blocks(problem: Problem, X) -> np.ndarray:
    """The (dn, dn) float64 Hessian of L at X, ``HVP_BLOCK`` generated HVPs against unit vectors at a
    time, not symmetrised (the attention-output variant's; attention maps have
    :func:`attention_hessian`). The generated dense kernel is far heavier: with it, recover's peak
    at two heads (32, 128) went from 0.9 GB to 8.3 GB (and it took 12.3 GB at one head (64, 128))."""
    dn = problem.d * problem.n

    def units(j, b):
        E = np.zeros((b, dn))
        E[np.arange(b), j + np.arange(b)] = 1.0
        return E

    return _hvp_rows(problem, X, dn, units)


def attention_hessian(problem: Problem, X) -> np.ndarray:
    """The (dn, dn) Hessian of the attention-map loss at X in closed form, by matrix products
    (row-major vec of X: index ``a n + i`` for feature a, token i); symmetric up to rounding.

    Per head, with ``S = X^T W X + 1 u^T X``, ``f_i`` the softmax of row i, ``r_i = f_i - b_i``,
    ``J_i = diag f_i - f_i f_i^T``, ``g_i = J_i r_i = f_i o (r_i - f_i^T r_i)`` (the gradient in S) and
    ``K_i = J_i^2 + diag g_i - f_i g_i^T - g_i f_i^T`` (the Hessian in row i of S: ``J_i^T J_i`` plus
    the residual-weighted softmax Hessians), ``dS_i = A^T e_i + E^T c_i`` with ``A = W X``,
    ``c_i = W^T x_i + u``, and ``d^2 S = 2 E^T W E``:

        d^2 L[E, E] = sum_i (e_i^T A K_i A^T e_i + 2 e_i^T A K_i E^T c_i + c_i^T E K_i E^T c_i)
                      + 2 sum_ij G_ij e_i^T W e_j + ||Gamma o E||^2.

    Token blocks (i, k) of H: ``delta_ik A K_i A^T + (A K_i e_k) c_i^T + c_k (A K_k e_i)^T +
    sum_j K_j[i, k] c_j c_j^T + G_ik W + G_ki W^T``. H is filled one feature row a at a time, as the
    (n, d, n) slab ``H[a n + i, b n + k]``: the sum over j is the (d, n) x (n, n^2) product
    ``(C o c^a) K``, O(n^3 d) flops, so O(n^3 d^2) per head in BLAS-3, where dn generated HVPs cost
    the same order elementwise (two heads (64, 256): 16384 HVPs took about 250 s); the other terms
    are outer products on the slab. Checked against the generated dense kernel and
    :func:`hessian_by_hvp_blocks` (``tests/test_interval_jacobian.py``). Memory: H, (dn)^2 floats,
    and per head K (n^3) and two (n, d, n) arrays; filling H by token blocks and reordering it
    took twice H (4.5 GB against 2.6 GB at two heads (64, 256), 38 s against 34 s).
    """
    X = np.asarray(X, np.float64)
    d, n = X.shape
    idx = np.arange(n)
    Hm = np.zeros((d * n, d * n))
    slabs = Hm.reshape(d, n, d, n)  # a view: slabs[a, i, b, k] = H[a n + i, b n + k]
    for h in range(problem.heads):
        W = np.asarray(problem.W[h], np.float64)
        u = np.asarray(problem.U[h], np.float64)
        B = np.asarray(problem.B[h], np.float64)
        S = X.T @ W @ X + (u @ X)[None, :]
        F = np.exp(S - S.max(axis=1, keepdims=True))
        F /= F.sum(axis=1, keepdims=True)
        R = F - B
        rho = np.sum(F * R, axis=1, keepdims=True)
        G = F * (R - rho)  # rows g_i
        f2 = F * F
        ff = np.sum(f2, axis=1)
        # K[i] = J_i^2 + diag g_i - f_i g_i^T - g_i f_i^T, J_i^2 = diag f^2 - f (f o f)^T - (f o f) f^T + (f.f) f f^T
        K = (-F[:, :, None] * f2[:, None, :] - f2[:, :, None] * F[:, None, :]
             + ff[:, None, None] * F[:, :, None] * F[:, None, :]
             - F[:, :, None] * G[:, None, :] - G[:, :, None] * F[:, None, :])
        K[:, idx, idx] += f2 + G
        A = W @ X  # columns a_j = W x_j
        C = W.T @ X + u[:, None]  # columns c_i = W^T x_i + u
        AK = np.matmul(A, K)  # AK[i, a, k] = (A K_i e_k)_a
        AKA = np.matmul(AK, A.T)  # AKA[i] = A K_i A^T
        AK_kbi = np.ascontiguousarray(AK.transpose(2, 1, 0))  # [k, b, i] = (A K_i e_k)_b
        Kflat = K.reshape(n, n * n)
        Ct = C.T
        for a in range(d):
            slab = slabs[a]  # [i, b, k]
            # sum_j K_j[i, k] c_j^a c_j^b
            slab += ((C * C[a][None, :]) @ Kflat).reshape(d, n, n).transpose(1, 0, 2)
            slab += Ct[:, :, None] * AK[:, a, :][:, None, :]  # (A K_i e_k) c_i^T at block (i, k)
            slab += AK_kbi * C[a][None, None, :]  # c_k (A K_k e_i)^T at block (i, k)
            slab += G[:, None, :] * W[a][None, :, None] + G.T[:, None, :] * W[:, a][None, :, None]
            slab[idx, :, idx] += AKA[:, a, :]  # delta_ik A K_i A^T
        del K, Kflat, AK, AKA, AK_kbi
    Hm[np.diag_indices(d * n)] += (np.asarray(problem.Gamma, np.float64) ** 2).reshape(-1)
    return Hm


def prove_lambda_min(problem: Problem, X, T, claim: float) -> tuple[str, float]:
    """Prove ``lambda_min >= claim`` for the Hessian at X on the complement of span T (T orthonormal or
    None): ``(why, lambda_max_bound)``, why "" when proved, else why not, and ``lambda_max_bound =
    ||H||_inf + 2 hessian_allowance(dn, ||H||_inf)``, an upper bound on every eigenvalue of H (an induced norm
    bounds the spectral radius), widened by twice the float64 allowance for H's own rounding that
    ``recheck`` gives its own Hessian (inf where nothing was proved). The test ``proofs_check.recheck`` applies to a local Newton
    certificate, on this code's Hessian (:func:`attention_hessian` for attention maps, else
    :func:`hessian_by_hvp_blocks`): every eigenvalue up to dn = 4096 (with eigh's backward error,
    10 dn eps ||H||, as margin) where one Cholesky factorisation of ``H - t I``
    (:func:`proofs_check.rigorous.lambda_min_at_least`, with the same margin for H's own rounding),
    tried first, does not prove it; above dn = 4096 the factorisation alone.
    The orbit directions get curvature ``||H||_inf >= lambda_max``, above any valid claim. Memory
    about three (dn, dn) arrays (6 GiB at dn = 16384), four with orbit directions; refused, not
    allocated, above the host budget."""
    from proofs_check.recheck import RECHECK_EIGH_MAX
    from proofs_check.rigorous import prove_claim_by_cholesky

    from .memory import GIB, host_budget, operation_bytes

    dn = problem.d * problem.n
    attention = problem.variant == ATTENTION
    # forming H: H, K (n^3) and a few (n, d, n) slabs (attention maps) or one block of HVPs in flight;
    # then H, the symmetrisation's (or the orbit restriction's) temporaries and the factorised copy
    d, n = problem.d, problem.n
    if attention:
        forming = 8 * (dn * dn + 4 * n**3 + 4 * n * dn)  # K and the temporaries of its expression
    else:
        forming = 8 * dn * dn + HVP_BLOCK * operation_bytes("hvp", d, n, problem.heads)
    need = max(forming, (3 if T is None or not T.shape[1] else 4) * 8 * dn * dn)
    budget = host_budget()
    if need > budget:
        return (f"lambda_min >= {claim:.3e} (Lanczos) was not proved: the dense Hessian and its factorisation "
                f"need about {need / GIB:.1f} GiB at dn = {dn}, over the host budget of {budget / GIB:.1f} GiB"), math.inf
    if not (math.isfinite(claim) and claim > 0):
        return f"lambda_min >= {claim:.3e} (Lanczos) is no positive bound", math.inf
    H = attention_hessian(problem, X) if attention else hessian_by_hvp_blocks(problem, X)
    if not np.all(np.isfinite(H)):
        return "the dense Hessian has non-finite entries", math.inf
    symmetrise(H)
    h_inf = inf_norm(H)
    # twice recheck's allowance for its own Hessian's rounding, so that its row sums confirm the bound; the
    # row sums here round at most dn + 1 times (a factor 1 + (dn + 3) eps covers them), inside the slack
    lam_max_up = h_inf + 2 * hessian_allowance(dn, h_inf)
    restricted = T is not None and T.shape[1]
    if restricted:
        H = _restricted(H, T, h_inf)
    # one Cholesky factorisation first (about 10x cheaper than the eigenvalues at dn = 4096); where its
    # rounding term is too coarse for the claim, every eigenvalue, as recheck takes them, up to 4096
    lam, t, margin = prove_claim_by_cholesky(H, claim, dn, h_inf=None if restricted else h_inf)
    if lam is not None:
        return "", lam_max_up
    if dn <= RECHECK_EIGH_MAX:
        ev = np.linalg.eigvalsh(H)
        margin = hessian_allowance(dn, np.max(np.abs(ev)))
        if ev[0] - margin >= claim:
            return "", lam_max_up
        return (f"lambda_min >= {claim:.3e} (Lanczos) was not proved: the dense Hessian's smallest eigenvalue "
                f"is {ev[0]:.3e} (less its rounding margin {margin:.1e})"), math.inf
    return (f"lambda_min >= {claim:.3e} (Lanczos) was not proved: the Cholesky factorisation of H - {t:.3e} I "
            f"breaks down (it proves lambda_min >= t - {margin:.1e} - a rounding term of about dn u tr H)"), math.inf


def build_certificate(problem: Problem, X, consts_run: LocalConstants | None, sym, validation, iterations: int,
                      status: str | None = None, reason: str = "", final: tuple | None = None) -> Certificate:
    """The certificate at X. ``final``: the :func:`final_constants` tuple already evaluated at this
    very X (the certified phase took no step), so the O((dn)^3) eigenvalues are not paid twice."""
    from proofs_check.region import Region

    from .newton import _orthonormal

    T = _orthonormal(sym.orbit_tangent(X)) if sym.dimension else None
    loss = float(problem.loss(X))
    if status == "uncertified":
        g = np.asarray(problem.grad(X), np.float64)
        return Certificate(status="uncertified", fingerprint=problem.fingerprint(), X_digest=array_digest(X),
                           symmetry_dimension=sym.dimension, sign_flip=sym.sign_flip, loss=loss,
                           grad_norm=float(np.linalg.norm(g)), error_bound=None, radius=None, constants=None,
                           region=None, validation=validation, iterations=iterations, iteration_bound=None,
                           uniqueness="none claimed", reason=reason)
    consts, gn, lam0, why = final if final is not None else final_constants(problem, X, T)
    if consts is None:
        return build_certificate(problem, X, None, sym, validation, iterations, status="uncertified",
                                 reason=f"the final local certificate failed: lambda_min = {lam0:.3e}, ||grad|| = {gn:.3e}"
                                 + (f"; {why}" if why else ""))
    region = Region.around(problem, X, consts.radius)
    bound = consts_run.iteration_bound if consts_run is not None else None
    return Certificate(
        status="certified", fingerprint=problem.fingerprint(), X_digest=array_digest(X),
        symmetry_dimension=sym.dimension, sign_flip=sym.sign_flip, loss=loss, grad_norm=gn,
        error_bound=consts.safety * gn / consts.m, radius=consts.radius,
        constants={"lambda_min": consts.lambda0, "lambda_max": consts.lambda_max, "margin": consts.margin,
                   "M": consts.M, "m": consts.m, "L_g": consts.L_g, "eta": consts.eta,
                   "gradient": "arb" if consts.safety == 1.0 else "float64",
                   "self_concordance": consts.M / (2 * consts.m**1.5)},
        region=region.as_dict(), validation=validation, iterations=iterations, iteration_bound=bound,
        uniqueness=("unique critical point of L in the ball B(X, radius)" if not sym.dimension else
                    "unique critical point of L on the slice through X orthogonal to the symmetry orbit, within radius")
        + _fit_clause(problem, loss),
    )


def fit_verdict(problem: Problem, loss: float) -> str:
    """What the loss at X says about that critical point (unregularised problems), as the relative
    residual ``sqrt(2 L) / max(1, ||B||)``: at most ``FIT_RTOL`` (the accuracy benchmark's 1e-8) it
    reproduces B, so it is a global minimiser; above, it is only a local minimiser, and the
    certificate says so instead of implying a recovery. ``unmask recover`` prints it next to the
    certificate's summary, so that a B no X produces is reported with its residual."""
    if np.any(problem.Gamma != 0):
        return "a minimiser of the regularised loss"
    rel = math.sqrt(2 * max(loss, 0.0)) / max(1.0, float(np.linalg.norm(problem.B)))
    if loss <= exact_fit_tolerance(problem):  # 1/2 (FIT_RTOL max(1, ||B||))^2, the same test
        return f"it reproduces B to a relative residual of {rel:.1e}: a global minimiser (L = 0 up to that)"
    return (f"relative residual {rel:.1e} > {FIT_RTOL:g}: a strict local minimiser that does NOT reproduce B "
            "(not an exact recovery)")


def _fit_clause(problem: Problem, loss: float) -> str:
    """:func:`fit_verdict` as the last clause of a certificate's ``uniqueness``."""
    return "; " + fit_verdict(problem, loss)


def root_certificate(problem: Problem, X, root, sym, validation, iterations: int) -> Certificate:
    """The ``kantorovich-root`` certificate at X from a :class:`solver.roots.RootCertificate` that exists."""
    from proofs_check.region import Region

    if not root.exists:
        raise ValueError("root_certificate needs a RootCertificate whose test passed")
    return Certificate(
        status="certified", fingerprint=problem.fingerprint(), X_digest=array_digest(X),
        symmetry_dimension=sym.dimension, sign_flip=sym.sign_flip, loss=float(problem.loss(X)),
        grad_norm=float(np.linalg.norm(np.asarray(problem.grad(X), np.float64))), error_bound=root.radius,
        radius=root.unique_radius, constants=root.as_dict(),
        region=Region.around(problem, X, root.rho + root.correction_norm).as_dict(),
        validation=validation, iterations=iterations, iteration_bound=None,
        uniqueness="the only solution of O(X) = B in the ball B(X, radius); it is a global minimiser (L = 0)",
        kind="kantorovich-root",
    )


def exact_fit_tolerance(problem: Problem) -> float:
    """Loss up to which X is said to reproduce B: ``1/2 (FIT_RTOL max(1, ||B||_F))^2``, a relative
    residual of at most ``FIT_RTOL`` = 1e-8 (the accuracy benchmark's "exact").

    Not "float64 rounding": ``recover`` stops at ``||grad|| <= gtol``, where planted instances have
    relative residuals of 3e-16 to 5e-13 (two heads, (8, 16)), and a threshold at 64 eps refused
    some of them. A spurious local minimiser of an underdetermined instance (6 x 4, two heads) sat
    at a loss of 8e-7, a relative residual near 1e-3.
    """
    return float(0.5 * (FIT_RTOL * max(1.0, float(np.linalg.norm(problem.B)))) ** 2)


def slice_basis(problem: Problem, X, sym) -> np.ndarray:
    """(dn, dn - k) orthonormal basis of the complement of the orbit tangent at X (identity if k = 0)."""
    from .newton import _orthonormal

    dn = problem.d * problem.n
    T = _orthonormal(sym.orbit_tangent(X)) if sym.dimension else None
    if T is None:
        return np.eye(dn)
    # the last dn - k columns of T's complete (Householder) QR: O((dn)^2 k), where an SVD of
    # I - T T^T costs O((dn)^3) (9.6 s against 0.2 s at dn = 2048, k = 12)
    return complement_basis(T)


def complement_basis(T: np.ndarray) -> np.ndarray:
    """The last ``dn - t`` columns of the complete Householder QR of ``T`` (dn, t), an orthonormal
    basis of the orthogonal complement of its columns, C-contiguous (the interval-Jacobian bound
    reshapes it without a copy), and formed without the (dn, dn) Q: ``P^T = [0 | I] Q^T``, the t
    reflectors of ``T``'s QR applied from the right to the last ``dn - t`` rows of the identity
    (LAPACK dgeqrf, dormqr), which is P^T in Fortran order and P in C order. The same reflectors as
    ``np.linalg.qr(T, "complete")[0][:, t:]``, which held Q and then copied P out of it: twice the
    memory (peak 4.2 GiB against 2.2 GiB at one head (64, 256), where it was `recheck`'s peak;
    benchmarks/complement_basis_bench.py)."""
    import scipy.linalg.lapack as lapack

    T = np.asarray(T, np.float64)
    if T.ndim != 2 or T.shape[1] > T.shape[0] or not np.all(np.isfinite(T)):
        raise ValueError(f"complement_basis needs a finite (dn, t) array with t <= dn, got shape {T.shape}")
    dn, t = T.shape
    k = dn - t
    if t == 0:
        return np.eye(dn)
    if k == 0:
        return np.zeros((dn, 0))
    reflectors, tau, _, info = lapack.dgeqrf(np.asfortranarray(T))
    if info != 0:
        raise ValueError(f"dgeqrf failed (info {info})")
    C = np.zeros((k, dn), order="F")
    C[np.arange(k), t + np.arange(k)] = 1.0
    # (the workspace query too passes overwrite_c: without it f2py copies C, 2 GiB at (64, 256))
    lwork = int(lapack.dormqr("R", "T", reflectors, tau, C, lwork=-1, overwrite_c=1)[1][0])
    PT, _, info = lapack.dormqr("R", "T", reflectors, tau, C, lwork=max(1, lwork), overwrite_c=1)
    if info != 0:
        raise ValueError(f"dormqr failed (info {info})")
    return PT.T


def _hvp_blocks(problem: Problem, X, count: int, directions):
    """Yield ``(j, b, HV)`` for j = 0, ``HVP_BLOCK``, ...: HV the (b, dn) rows ``H v`` for the directions
    ``directions(j, b)`` (a (b, dn) array: rows j .. j + b - 1), ``HVP_BLOCK`` generated HVPs at a time;
    a short last block is padded with zeros, so there is one compilation."""
    import jax

    d, n = problem.d, problem.n
    dn = d * n
    hvps = jax.jit(jax.vmap(lambda V: problem.hvp(X, V)))
    for j in range(0, count, HVP_BLOCK):
        b = min(HVP_BLOCK, count - j)
        V = np.zeros((HVP_BLOCK, dn))
        V[:b] = directions(j, b)
        yield j, b, np.asarray(hvps(V.reshape(HVP_BLOCK, d, n)), np.float64).reshape(HVP_BLOCK, dn)[:b]


def _hvp_rows(problem: Problem, X, count: int, directions) -> np.ndarray:
    """``(count, dn)`` rows ``H v`` for the directions ``directions(j, b)``, by `_hvp_blocks`."""
    out = np.empty((count, problem.d * problem.n))
    for j, b, HV in _hvp_blocks(problem, X, count, directions):
        out[j:j + b] = HV
    return out


def _slice_hessian(problem: Problem, X, P) -> np.ndarray:
    """``P^T hess L(X) P`` in float64: from the dense Hessian up to dn = ``DENSE_HESSIAN_MAX``, above
    it from blocks of ``HVP_BLOCK`` generated HVPs against P's columns (the dense kernel peaked at
    12.3 GB at dn = 8192, one head (64, 128)).

    By blocks, only the upper triangle is multiplied out: columns j .. j + b - 1 are
    ``P[:, :j + b]^T (H P[:, j:j + b])``, and the rows below the block are their transpose. That is
    half the flops of ``P^T (H P)`` and holds one (b, dn) block of ``H P``, not all of it. Each
    diagonal (b, b) block is computed whole, so it is symmetric only to rounding: callers symmetrise.
    """
    dn, k = P.shape
    if dn <= DENSE_HESSIAN_MAX:
        return P.T @ np.asarray(problem.hessian(X), np.float64).reshape(dn, dn) @ P
    Hs = np.empty((k, k))
    for j, b, HPb in _hvp_blocks(problem, X, k, lambda j, b: P[:, j:j + b].T):
        Hs[:j + b, j:j + b] = P[:, :j + b].T @ HPb.T
        Hs[j:j + b, :j] = Hs[:j, j:j + b].T
    return Hs


def _slice_factor(Hs: np.ndarray) -> tuple[object | None, float, str]:
    """``(factor, lam, why)``: the Cholesky factor (`scipy.linalg.cho_factor`) of the symmetric float64
    slice Hessian ``Hs = P^T H P`` and ``lam``, a float64 estimate of its smallest eigenvalue; ``factor``
    None, with ``why``, where Hs is not positive definite.

    Up to ``SLICE_EIGVALSH_MAX`` columns lam is ``eigvalsh``'s; above, Lanczos (ARPACK) on ``Hs^-1``
    through the factor: at one head (64, 128), k = 8150, ``eigvalsh`` took 76 s of `slice_certificate`
    and each polish step's ``solve`` 12 s (measured, 3 runs on 2 cores), against 4.5x less for the
    factorisation at k = 2500 and a back-substitution per step."""
    import scipy.linalg as sl

    k = Hs.shape[0]
    if k <= SLICE_EIGVALSH_MAX:
        lam = float(np.linalg.eigvalsh(Hs)[0])
        if not lam > 0:
            return None, lam, f"the Hessian on the slice is not positive definite at X (lambda_min {lam:.3e})"
    try:
        factor = sl.cho_factor(Hs, lower=True)
    except np.linalg.LinAlgError:
        lam = float(np.linalg.eigvalsh(Hs)[0])
        return None, lam, (f"the Hessian on the slice is not positive definite at X to float64 accuracy (its Cholesky "
                           f"factorisation fails; lambda_min {lam:.3e})")
    if k > SLICE_EIGVALSH_MAX:
        from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, LinearOperator, eigsh

        inverse = LinearOperator((k, k), matvec=lambda v: sl.cho_solve(factor, v), dtype=np.float64)
        try:
            lam = 1.0 / float(eigsh(inverse, k=1, which="LA", v0=np.ones(k), tol=1e-10, return_eigenvectors=False)[0])
        except (ArpackNoConvergence, ArpackError):
            lam = float(np.linalg.eigvalsh(Hs)[0])  # (the slow way, not seen to be needed)
    return factor, lam, ""


@dataclass(frozen=True)
class _LiftedFactor:
    """The upper Cholesky factor (`scipy.linalg.cho_solve` form) of `_lifted_factor`'s whole-space matrix,
    and the orbit tangent it lifted (the slice is its orthogonal complement)."""
    cho: tuple
    tangent: np.ndarray


def _lifted_factor(problem: Problem, X, tangent) -> tuple[_LiftedFactor | None, float, str]:
    """``(factor, lam, why)`` as `_slice_factor` gives for ``P^T H P``, for the streamed path, from the
    float64 whole-space matrix ``M = H + Tc Tc^T`` at X instead: H the closed-form Hessian
    (`attention_hessian`, Gamma^2 included), the orbit tangent lifted (``Tc = sqrt(c) Q_T``, c the mean
    diagonal). The orbit directions are (nearly) in H's kernel, so M's smallest eigenvalue is about the
    slice Hessian's: ``lam`` is its inverse-iteration estimate, and `_slice_polish` steps by ``-M^-1
    grad``. No P, no HVPs, one (dn, dn) array factorised in place: at one head (64, 256) the slice
    Hessian from HVP blocks took about 265 s and its factorisation and Lanczos about 60 s of a seed."""
    import scipy.linalg.blas
    import scipy.linalg.lapack

    from proofs_check.rigorous import GRAM_INVERSE_ITERATIONS

    X = np.asarray(X, np.float64)
    dn = X.size
    M = attention_hessian(problem, X).T  # (Fortran order, for LAPACK: H's transpose, the same matrix to rounding)
    c = float(np.trace(M)) / dn
    T = np.asarray(tangent, np.float64).reshape(dn, -1)
    if T.shape[1]:
        Tc = np.asfortranarray(np.linalg.qr(T)[0] * math.sqrt(max(c, 0.0)))
        scipy.linalg.blas.dsyrk(1.0, Tc, beta=1.0, c=M, lower=0, overwrite_c=1)  # upper triangle += Tc Tc^T
    if not np.all(np.isfinite(M)):
        return None, math.nan, "the Hessian at X is not finite"
    R, info = scipy.linalg.lapack.dpotrf(M, lower=0, overwrite_a=1, clean=0)
    if info != 0:
        return None, -math.inf, ("the Hessian with the orbit lifted is not positive definite at X to float64 "
                                 "accuracy (its Cholesky factorisation fails)")
    y = np.random.default_rng(0).standard_normal(dn)
    lam = math.inf
    for _ in range(GRAM_INVERSE_ITERATIONS):
        y = scipy.linalg.lapack.dpotrs(R, y, lower=0)[0]
        y /= np.linalg.norm(y)
        Ry = scipy.linalg.blas.dtrmv(R, y, lower=0)
        previous, lam = lam, float(Ry @ Ry)  # y^T M y = ||R y||^2
        if abs(previous - lam) <= 1e-3 * lam:
            break
    return _LiftedFactor((R, False), T), lam, ""


def _slice_polish(problem: Problem, X, P, factor, g_target: float) -> np.ndarray:
    """The double-double correction ``dX`` (``(2, d, n)``: hi and lo) of up to ``POLISH_STEPS`` Newton
    steps on the slice from X: the float64 slice Hessian ``Hs = P^T H P`` (its Cholesky ``factor``; or,
    where ``factor`` is `_lifted_factor`'s, the whole-space step ``-M^-1 grad``), the
    gradient at ``X + dX`` from 320-bit ball arithmetic. Stops once ``||P^T grad|| <= g_target`` (with the
    lifted factor, P None: the gradient's component orthogonal to the lifted tangent, the slice
    `proofs_check.rigorous.tangent_slice_bounds` bounds) or a step gains less than 2x."""
    import scipy.linalg as sl

    from proofs_check.midrad import two_sum
    from proofs_check.rigorous import gradient_enclosure

    d, n = problem.d, problem.n
    dX = np.zeros((2, d, n))
    g_prev = math.inf
    lifted = isinstance(factor, _LiftedFactor)  # the whole-space matrix of `_lifted_factor`
    for _ in range(POLISH_STEPS):
        mid, _ = gradient_enclosure(problem, X, dX)
        if lifted:
            g_flat = mid.reshape(-1)
            T = factor.tangent
            gz = g_flat - T @ np.linalg.lstsq(T, g_flat, rcond=None)[0] if T.shape[1] else g_flat
        else:
            gz = P.T @ mid.reshape(-1)
        g = float(np.linalg.norm(gz))
        if g <= g_target or not g < g_prev / 2:
            break
        g_prev = g
        if lifted:
            step = -sl.cho_solve(factor.cho, mid.reshape(-1)).reshape(d, n)
        else:
            step = -(P @ sl.cho_solve(factor, gz)).reshape(d, n)
        hi, err = two_sum(dX[0], step)
        dX = np.stack([hi, dX[1] + err])
    return dX


def slice_certificate(problem: Problem, X, sym, validation, iterations: int, *,
                      box_scales=(1e-20, 1e-19, 1e-18, 1e-16, 1e-12),
                      polished: list | None = None) -> tuple[Certificate | None, str]:
    """The ``interval-hessian`` certificate at X (``interval-jacobian`` above ``SLICE_CERT_MAX``; see the
    module docstring), or ``(None, why not)``.

    Polishes X to ``X + dX`` (up to ``POLISH_STEPS`` Newton steps on the slice: float64 Hessian, 320-bit ball
    gradient) until the slice gradient is 8x below ``lam`` times the smallest box (and below
    1e-30 max(1, ||X||_max)), then tries boxes around ``X + dX`` of half-width ``s max(1, ||X||_max)``
    for ``s`` in ``box_scales`` (a larger box allows a larger gradient, a smaller one a tighter
    Hessian enclosure) until :func:`proofs_check.rigorous.slice_theorem` holds. One head (32, 64),
    seed 102 (lambda_min 2.3e-13 on the slice) shows both limits: its enclosure is not positive
    definite at 1e-18, and with the polish stopped at 1e-30 its gradient (2.8e-32) was above
    ``l r`` at 1e-20 and 1e-19 on one machine and below it at 1e-20 on another. Polished to 2.6e-37
    it certifies at 1e-20.

    Refuses where the polish moves X by more than ``POLISH_MAX_REL`` max(1, ||X||) (recheck's own test),
    and then appends the float64 point of ``X + dX`` to ``polished`` where that list is given: `recover`
    moves X there and tries again. Levenberg-Marquardt's matrix-free CG steps can stall on an
    ill-conditioned slice: one head (32, 128), seed 102 stopped at ``||grad|| = 3e-14``, 6.7e-7 from the
    critical point (2.5e-8 relative from the planted orbit).
    """
    from proofs_check.region import Region
    from proofs_check.rigorous import (
        CHOLESKY_ACCEPT,
        jacobian_slice_bounds,
        slice_bounds,
        slice_theorem,
        tangent_slice_bounds,
    )

    if problem.variant != ATTENTION:
        return None, "the interval-Hessian certificate is for attention maps"
    d, n = problem.d, problem.n
    jacobian = d * n > SLICE_CERT_MAX
    if d * n > JACOBIAN_CERT_MAX:
        return None, f"the interval-Hessian / -Jacobian certificates are not tried above dn = {JACOBIAN_CERT_MAX} (dn = {d * n})"
    rows_per_block, sigma = None, "auto"
    if jacobian:
        from proofs_check.rigorous import jacobian_sigma_method, jacobian_streaming_plan

        from .memory import GIB, host_budget

        budget = JACOBIAN_CERT_BYTES if JACOBIAN_CERT_BYTES is not None else host_budget()
        rows_per_block, need = jacobian_streaming_plan(problem, d * n, budget)
        if rows_per_block == 0:
            return None, (f"the interval-Jacobian certificate would need about {need / GIB:.1f} GiB, even streamed "
                          f"(more than the {budget / GIB:.1f} GiB budget)")
        sigma = jacobian_sigma_method(problem, d * n, rows_per_block, budget)
    X = np.asarray(X, np.float64)
    fit_tol = exact_fit_tolerance(problem)
    loss = float(problem.loss(X))
    if not loss <= fit_tol:
        return None, (f"the interval-Hessian certificate is for exact fits: the loss at X is {loss:.3e} > {fit_tol:.1e} "
                      "(a strict local minimiser that does not reproduce the maps is not a recovery)")
    # streamed: the whole-space Gauss-Newton matrix with the orbit lifted, for the polish and the estimate lam, and
    # the bound on the tangent's own slice first (no P, no J P); P and the Gram bounds only where that falls short
    tangent = sym.orbit_tangent(X) if rows_per_block is not None else None
    if tangent is not None:
        P = None
        factor, lam, why = _lifted_factor(problem, X, tangent)
    else:
        P = slice_basis(problem, X, sym)
        factor, lam, why = _slice_factor(symmetrise(_slice_hessian(problem, X, P)))
    if factor is None:
        return None, why
    # dX is itself a double-double (hi, lo), summed with TwoSum: a float64 dX put a floor of about
    # ||H|| ulp(dX) under the gradient (one head (16, 32), seed 128: 5e-27, against the 1.6e-27 its
    # box allows, and no certificate). Each step gains about cond(Hs) eps; stop when one gains < 2x,
    # or once the gradient is 8x below what the smallest box allows (l r > ||grad||, with l ~ lam) and
    # below 1e-30 max(1, ||X||_max). The 1e-30 alone was not enough where lam is tiny: one head
    # (32, 64), seed 102 (lam 2.3e-13) stopped at 2.8e-32, above the 1.4e-33 of its smallest box and
    # the 1.0e-32 of the next; certified or refused depended on the machine's rounding.
    scale = max(1.0, float(np.abs(X).max()))
    dX = _slice_polish(problem, X, P, factor, min(1e-30, lam * box_scales[0] / 8) * scale)
    del factor
    moved = float(np.linalg.norm(dX.sum(axis=0)))
    if moved > POLISH_MAX_REL * max(1.0, float(np.linalg.norm(X))):
        # recheck holds a certificate to X + dX being a polish of X (the same test): refuse, never
        # issue what it would reject (a 4-head MiniLM-like layer, dn = 2880: ||dX|| = 1.8e-6);
        # recover then moves X there (the float64 point of X + dX, appended to `polished` where given)
        # and tries again (that layer: certified)
        if polished is not None:
            polished.append(X + (dX[0] + dX[1]))
        return None, (f"{POLISH_MOVED} by ||dX|| = {moved:.1e} > {POLISH_MAX_REL:g} max(1, ||X||): X is not at the "
                      "critical point to float64 accuracy")
    tried, lifted_why = [], None
    for s in box_scales:
        if tangent is not None and lifted_why is None:
            b = tangent_slice_bounds(problem, X, dX, tangent, s * scale)
            if not b["sigma_min_sq_lower"] >= CHOLESKY_ACCEPT * b.get("gram_lambda_estimate", math.inf):
                lifted_why = b.get("cholesky") or (f"{b['sigma_min_sq_lower']:.3e} proved, below {CHOLESKY_ACCEPT} x "
                                                   f"its estimate {b.get('gram_lambda_estimate', math.nan):.3e}")
        if jacobian and (tangent is None or lifted_why is not None):
            if P is None:
                P = slice_basis(problem, X, sym)
            b = jacobian_slice_bounds(problem, X, dX, P, s * scale, rows_per_block=rows_per_block, sigma=sigma)
            b.pop("jacobian_mid", None)
            if lifted_why is not None:
                b["lifted"] = lifted_why
        elif not jacobian:
            b = slice_bounds(problem, X, dX, P, s * scale)
            b.pop("hessian_mid")
        th = slice_theorem(b)
        tried.append(f"box {b['box_radius']:.1e}: lambda_min >= {b['l_lower']:.2e}, ||grad|| <= {b['g_up']:.1e}")
        if not th["certified"] and not (b["l_lower"] > 0 and b["l_lower"] * th["slice_radius"] <= b["g_up"]):
            break  # the enclosure is not positive definite: a larger box only widens it
        if th["certified"]:
            consts = {**b, "lambda_min": lam, "dX": dX.reshape(-1).tolist()}
            cert = Certificate(
                status="certified", fingerprint=problem.fingerprint(), X_digest=array_digest(X),
                symmetry_dimension=sym.dimension, sign_flip=sym.sign_flip, loss=loss,
                grad_norm=b["g_up"], error_bound=th["error_bound"], radius=th["slice_radius"], constants=consts,
                region=Region.around(problem, X, b["box_radius"] * math.sqrt(d * n)).as_dict(),
                validation=validation, iterations=iterations, iteration_bound=None,
                uniqueness=("unique critical point of L on the slice through X + dX orthogonal to the symmetry orbit "
                            "(the whole space when the orbit is a point), within radius; it is a global minimiser up to "
                            f"L(X*) <= L(X + dX), and L(X) = {loss:.2e} <= {fit_tol:.1e}"
                            + _fit_clause(problem, loss)),
                kind="interval-jacobian" if jacobian else "interval-hessian",
            )
            return cert, ""
    return None, f"interval-{'Jacobian' if jacobian else 'Hessian'} certificate failed: " + "; ".join(tried)
