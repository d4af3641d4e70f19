"""``recover``: X from (W, B), with certified Newton steps and a re-checkable certificate.

Pipeline (one way, in order):

1. **initialise**: the closed form of :mod:`solver.algebraic` (attention maps,
   n > d, positive B, two heads); otherwise ``restarts`` seeded random starts.
2. **globalise** (uncertified): for attention maps with positive entries and no continuous
   symmetry, first Levenberg-Marquardt (Gauss-Newton-CG) on the log-domain loss (:mod:`solver.logdomain`, one compiled
   loop, labelled ``uncertified-log-gauss-newton``; kept only when it lowers the problem's loss),
   then Levenberg-Marquardt Newton on the problem's loss (``uncertified-lm``) until the local
   certificate can be set up.
3. **certify the region**: lambda_min / lambda_max of the Hessian at the
   iterate (on the complement of the symmetry orbit), the Hessian-Lipschitz
   constant M of the lemma on the region, validated by the checker on random
   and adversarial instances of a slightly larger region (cached); then the
   radius of :func:`solver.newton.local_constants`. Refuses (raises
   :class:`~solver.errors.CertificationError`) when ``certify=True`` and this fails (after
   the interval-Hessian certificate (interval-Jacobian above ``SLICE_CERT_MAX``, up to
   ``JACOBIAN_CERT_MAX``), and, where the symmetry group is continuous, one more try
   at the orbit's smallest-norm point, :func:`solver.symmetry.balance_orbit`; above
   ``BALANCE_UP_FRONT_MIN`` X is moved there up front instead).
4. **certified Newton** with the fixed step sizes of :mod:`solver.newton`.
5. **final certificate** at the returned X: ``||X - X*|| <= ||grad|| / m`` with X*
   the unique critical point of L in the certified ball (modulo the
   symmetry group: on the slice through X orthogonal to the orbit).

The regulariser of the problem is part of L. With gamma = 0 (the default)
the returned X is a certified critical point of the unregularised loss, and
when its loss is 0 to rounding it reproduces B: exact recovery modulo the group.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .certificate import Certificate, build_certificate, final_constants, gradient_safety
from .errors import CertificationError, InvalidProblemError
from .newton import DENSE_MAX, History, certified_newton, levenberg_marquardt
from .problem import ATTENTION, OUTPUT, Problem
from .symmetry import symmetries

_VALIDATED: dict = {}


@dataclass
class Result:
    """What :func:`recover` returns.

    - `X`: (d, n) recovered input, float64
    - `status`: ``"certified"`` or ``"uncertified"``
    - `certificate`: :class:`~solver.certificate.Certificate` (its status says the same)
    - `history`: per-iteration records (loss, grad_norm, newton_decrement, step_size, regime)
    - `init`: how the start was obtained (``"algebraic"`` or ``"random-restarts"``)
    - `symmetry_dimension`: dimension of the instance's symmetry group (orbit)
    - `seconds`: wall time
    - `starts`: random starts tried (0 when the start was given or from the closed form)
    - `balanced`: True when X was moved along its orbit to the smallest-norm point
      (:func:`solver.symmetry.balance_orbit`): after a refused first attempt, which is then
      retried (dn <= ``BALANCE_UP_FRONT_MIN``), or up front (dn > ``BALANCE_UP_FRONT_MIN``, on the
      matrix-free sizes too); only for a continuous group of dimension at most ``BALANCE_MAX_DIM``
    """

    X: np.ndarray
    status: str
    certificate: Certificate
    history: list = field(default_factory=list)
    init: str = ""
    symmetry_dimension: int = 0
    seconds: float = 0.0
    starts: int = 0
    balanced: bool = False


def _rounded_region(region):
    """Round R, omega, mu up to a grid of 2^(1/4) so validations are shared between nearby instances."""
    from dataclasses import replace

    up = lambda x: 0.0 if x <= 0 else 2.0 ** (math.ceil(4 * math.log2(x)) / 4)  # noqa: E731
    opt = lambda x: None if x is None else up(x)  # noqa: E731
    return replace(region, R=up(region.R), omega=up(region.omega), mu=up(region.mu), omega_V=up(region.omega_V),
                   beta=up(region.beta), gamma=0.0, gamma_max=up(region.gamma_max), sigma=opt(region.sigma),
                   rho=opt(region.rho))


def validate_region(region, instances: int = 8, seed: int = 0) -> dict:
    """The checker's fast validation of the Hessian-Lipschitz lemma on ``region`` (cached)."""
    from proofs_check.checker import check

    key = _rounded_region(region)
    if key not in _VALIDATED:
        name = "hessian_lipschitz" if region.variant == ATTENTION else "hessian_lipschitz_output"
        rep = check(key, instances=instances, seed=seed, starts=2, steps=20, names=[name], progress=False)
        row = rep.lemmas[0]
        _VALIDATED[key] = {"lemma": name, "region": key.as_dict(), "instances": instances, "seed": seed,
                           "worst_random_ratio": row.worst_random_ratio,
                           "worst_adversarial_ratio": row.worst_adversarial_ratio, "status": row.status}
    return _VALIDATED[key]


def hessian_lipschitz_on(problem: Problem, X, radius: float) -> float:
    """M of the lemma on the region holding the ball B(X, radius) (generated evaluator)."""
    from proofs_check.region import Region

    reg = Region.around(problem, X, radius)
    name = "hessian_lipschitz" if problem.variant == ATTENTION else "hessian_lipschitz_output"
    return reg.bounds()[name]


def square_output(problem: Problem) -> bool:
    """The attention-output equations form a square system (H d_v = d), unregularised, dense-sized."""
    return (problem.variant == OUTPUT and problem.heads * problem.W_V.shape[-1] == problem.d
            and not np.any(problem.Gamma != 0) and problem.d * problem.n <= DENSE_MAX)


def _unwhitened(problem: Problem) -> Problem:
    """One head with square invertible W_V: the problem with outputs ``B W_V^-1`` and W_V = I."""
    Wv = problem.W_V[0]
    if np.linalg.cond(Wv) > 1e8:
        return problem
    return Problem.create(problem.W, problem.B[0] @ np.linalg.inv(Wv), u=problem.U if problem.has_bias else None,
                          W_V=np.eye(problem.d))


def _log_phase(problem: Problem, X: np.ndarray, sym, gtol: float, history: History | None,
               max_iter: int = 200) -> np.ndarray:
    """The log-domain Gauss-Newton phase where it applies; its X only if it lowers the problem's loss.

    Not run with a continuous symmetry group (one head): the log loss is flat along the orbit and
    its iterates drift along it, which the orbit-projected LM does not.
    """
    from .logdomain import applies, log_gauss_newton

    if sym.dimension or not applies(problem):
        return X
    Xl, info = log_gauss_newton(problem, X, gtol=gtol, max_iter=max_iter)
    f0, fl = float(problem.loss(X)), float(problem.loss(Xl))
    if not fl < f0:
        return X
    if history is not None:  # accepted steps, as LM records them (full steps, accepted on decrease)
        for st in info.steps:
            history.add(regime="uncertified-log-gauss-newton", loss=st["loss"], grad_norm=st["grad_norm"],
                        newton_decrement=st["newton_decrement"], step_size=1.0)
    return Xl


def _starts(problem: Problem, restarts: int, seed: int):
    rng = np.random.default_rng(seed)
    scale = 1.0 / problem.d**0.25
    return [rng.normal(scale=scale, size=(problem.d, problem.n)) for _ in range(restarts)]


def _integer_at_least(value, lowest: int) -> bool:
    """An int or NumPy integer (not a bool) of at least `lowest`."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lowest


RESTARTS = 8  # random starts where the closed form does not apply
BALANCE_MAX_DIM = 64  # group dimension up to which a refused X is moved along its orbit and retried
BALANCE_UP_FRONT_MIN = 512  # dn above which X is balanced before the first attempt instead of after a refusal
SQUARE_OUTPUT_RESTARTS = 1024  # the square output system: 1 start in 20 to 1 in several hundred reaches a root (recover's docstring)


def recover(problem: Problem, *, X_init=None, certify: bool = True, validate: bool = True, gtol: float = 1e-10,
            max_iter: int = 200, restarts: int | None = None, seed: int = 0, progress=None) -> Result:
    """Recover X from a :class:`~solver.problem.Problem`.

    **Arguments**

    - `problem`: the instance (attention maps or outputs, heads, bias, regulariser)
    - `X_init`: optional (d, n) start; default: the closed form, else random restarts
    - `certify`: True (default) refuses with :class:`CertificationError` when the local
      constants cannot be certified; False returns an ``uncertified`` result instead
    - `validate`: run the checker's fast validation of the M lemma on the region
    - `gtol`: stop when the gradient norm (off the orbit) is at most this (or the
      float64 rounding floor is reached)
    - `restarts`, `seed`: random starts when the closed form does not apply (default
      ``RESTARTS`` = 8; ``SQUARE_OUTPUT_RESTARTS`` = 1024 for the square output system, where
      the search stops at the first start that ends on a proved root)
    - `progress`: optional callable ``progress(message: str)``, called at each stage (start,
      solver pass, certificate tried and its outcome), or True to print those messages to
      stderr (False or None: silent): the large certificates take minutes (one head (32, 128): about 3.5) and say
      nothing otherwise

    The square attention-output system (one head, d_v = d, no regulariser): each random start
    runs LM, then Newton on ``O(X) = B`` (:func:`solver.roots.polish`), and the first one that
    ends on a root proved by Kantorovich's test is returned with a ``kantorovich-root``
    certificate. Its least-squares landscape has many positive-loss local minima (losses 1e-9
    to 1e-4 at (8, 16)): about one start in twenty reaches a root there, and on the hardest
    instances one in several hundred. On 200 seeded instances per (d, n) at d = 4, 8 (n = 2d,
    4d), every instance has a proved root within 1024 starts: 32 starts left 72 of the 800
    without one and 256 left 5, whose first proved roots came at starts 284-636, hence 1024. A
    start costs about 0.3 s at (8, 16) and 2 s at (8, 32) on one core, so an instance where every
    start fails takes long (1024 starts: about 12 min at (8, 16), 30-50 min at (8, 32), hours at
    d = 16): `progress` reports each start, and `restarts` sets how many.
    Such a system can have several exact solutions; :func:`solver.roots.find_roots` counts them,
    and where there are two the outputs do not determine X.

    Returns a :class:`Result`.
    """
    t0 = time.perf_counter()
    if not _integer_at_least(seed, 0):
        raise InvalidProblemError(f"recover: seed must be a non-negative integer, got {seed!r}")
    if progress is True:
        import sys

        def progress(message: str) -> None:
            print(f"recover: {message}", file=sys.stderr, flush=True)
    elif progress is False:
        progress = None
    elif progress is not None and not callable(progress):
        raise InvalidProblemError(f"recover: progress must be a callable, True, False or None, got {progress!r}")

    def say(message: str) -> None:
        if progress is not None:
            progress(message)

    problem = problem.in_float64()
    sym = symmetries(problem)
    history = History()
    init = "given"
    starts = 0
    if X_init is not None:
        X = np.asarray(problem.check_X(X_init, "X_init"), np.float64)
    else:
        from .algebraic import algebraic_init

        X = algebraic_init(problem)
        init = "algebraic"
        say("closed-form start (log-domain identity)" if X is not None else "no closed form here: random starts")
        if X is None:
            init = "random-restarts"
            best = None
            square = square_output(problem)
            if restarts is None:
                restarts = SQUARE_OUTPUT_RESTARTS if square else RESTARTS
            if not _integer_at_least(restarts, 1):
                raise InvalidProblemError(f"recover: restarts must be an integer >= 1 where the closed form does not "
                                          f"apply, got {restarts!r}")
            # one square head: LM on 1/2 ||F X^T - B W_V^-1||^2, the same roots without W_V's distortion
            # of the landscape (twice the starts reach a root at (4, 16)); roots are then polished on B
            start_problem = _unwhitened(problem) if square and problem.heads == 1 else problem
            for X0 in _starts(problem, restarts, seed):
                starts += 1
                say(f"start {starts} of {restarts}")
                X0 = _log_phase(start_problem, X0, sym, gtol, None)
                Xc = levenberg_marquardt(start_problem, X0, History(), 200 if square else 60, gtol)
                if square:  # Newton on O(X) = B, and stop at the first start that ends on a proved root
                    from .roots import kantorovich, polish

                    Xc = polish(problem, Xc)
                    root = kantorovich(problem, Xc)
                    if root.exists:  # root.X: the float64 point nearest a refined centre, if refined
                        best = (float(problem.loss(root.X)), root.X)
                        break
                f = float(problem.loss(Xc))
                if best is None or f < best[0]:
                    best = (f, Xc)
            X = best[1]

    # as far as LM's first pass goes below: the certified phase takes over where it can
    X = _log_phase(problem, X, sym, max(gtol, 1e-6), history)

    def orbit(Xc):
        from .newton import _orthonormal

        return _orthonormal(sym.orbit_tangent(Xc)) if sym.dimension else None

    # globalise only until the local certificate can be tried; if it fails, go on to gtol and retry
    # second pass: to the rounding floor (5 iterations when matrix-free: each is up to CG_MAX_ITER HVPs)
    floor_iters = 30 if problem.d * problem.n <= DENSE_MAX else 5
    balanced = False
    k_group = sym.lie_algebra.shape[0]
    # at every dn: balancing acts on d x n arrays and a k-dimensional group only. Above DENSE_MAX it was
    # not tried until one head (32, 128) showed the cost: the closed form's far representatives (M
    # 1.5e9, seed 1) failed the interval-Jacobian certificate on 3 of 5 seeds
    can_balance = 0 < k_group <= BALANCE_MAX_DIM

    def balanced_point(Z):
        """The orbit's smallest-norm point, or None where it is not 1% smaller than Z."""
        from .symmetry import balance_orbit

        Zb, nb = balance_orbit(problem, sym, Z)
        return Zb if nb < 0.99 * float(np.linalg.norm(Z)) else None

    if can_balance and problem.d * problem.n > BALANCE_UP_FRONT_MIN:
        # at this size a second attempt after a refusal costs more than balancing up front (one
        # head (32, 64): 39 s against 4.5 s)
        Xb = balanced_point(X)
        if Xb is not None:
            X, balanced = Xb, True
    for attempt in range(2):
        for lm_tol, iters in ((max(gtol, 1e-6), max_iter), (0.0, floor_iters)):
            X = levenberg_marquardt(problem, X, history, iters, lm_tol, T_fn=orbit)
            T = orbit(X)
            consts, gn, lam0, why = final_constants(problem, X, T)
            if progress is not None:  # (the loss is evaluated for the message only)
                say(f"LM to {'the rounding floor' if lm_tol == 0.0 else f'gtol {lm_tol:.0e}'}: loss {float(problem.loss(X)):.2e}, "
                    f"||grad|| {gn:.2e}, lambda_min {lam0:.2e}; local Newton certificate "
                    + ("holds" if consts is not None else "does not hold"))
            if consts is not None:
                break
        validation = None
        if consts is not None and validate:
            from proofs_check.region import Region

            say("the checker's validation of the M lemma on the region")
            validation = validate_region(Region.around(problem, X, consts.radius))
            if validation["status"] != "OK":
                consts = None
        if consts is None and square_output(problem):
            # the square output system: lambda_min = s_min(J)^2 is far below what the local Newton
            # certificate needs, but Kantorovich on O(X) = B can still prove an exact solution
            from .certificate import root_certificate
            from .roots import kantorovich, polish

            Xp = polish(problem, X)
            root = kantorovich(problem, Xp)
            say(f"Kantorovich root test: {'an exact root is proved' if root.exists else 'no root proved'}")
            if root.exists:
                Xp = root.X  # where the test refined its centre, the float64 point nearest it
                cert = root_certificate(problem, Xp, root, sym, None, iterations=0)
                return Result(X=Xp, status="certified", certificate=cert, history=history.as_list(), init=init,
                              symmetry_dimension=sym.dimension, seconds=time.perf_counter() - t0, starts=starts,
                              balanced=balanced)
        slice_reason = ""
        moved = False  # whether X was moved to a slice polish after the local Newton test ran
        if consts is None and problem.variant == ATTENTION and problem.Gamma.max() == 0:
            # no M needed: polish to a double-double point and enclose the Hessian on a whole box
            from .certificate import SLICE_CERT_MAX, SLICE_RECENTRES, slice_certificate

            say(f"interval-{'Jacobian' if problem.d * problem.n > SLICE_CERT_MAX else 'Hessian'} certificate "
                f"(dn = {problem.d * problem.n})")
            polished = []  # where the certificate refused because its polish moved X too far: that point
            cert, slice_reason = slice_certificate(problem, X, sym, None, iterations=0, polished=polished)
            say("certified" if cert is not None else f"refused: {slice_reason}")
            for _ in range(SLICE_RECENTRES):
                if cert is not None or not polished:
                    break
                # LM stopped short of the critical point (its CG steps stall on an ill-conditioned slice):
                # move X to the slice polish, Newton steps with the dense slice Hessian, and try again
                X_moved = polished.pop()
                # recorded like an LM step: the gradient norm before it, the loss after it, and the Newton
                # decrement sqrt(<s, H s>) of the step s at the X it started from
                step = X_moved - X
                history.add(regime="slice-polish", loss=float(problem.loss(X_moved)),
                            grad_norm=float(np.linalg.norm(np.asarray(problem.grad(X)))),
                            newton_decrement=math.sqrt(abs(float(np.vdot(step, np.asarray(problem.hvp(X, step)))))),
                            step_size=1.0)
                X, moved = X_moved, True
                say(f"moved X to its slice polish (loss {history.steps[-1].loss:.2e}); interval certificate again")
                cert, raw = slice_certificate(problem, X, sym, None, iterations=0, polished=polished)
                slice_reason = raw and f"after moving X to its slice polish: {raw}"
                say("certified" if cert is not None else f"refused: {slice_reason}")
            if cert is not None:
                return Result(X=X, status="certified", certificate=cert, history=history.as_list(), init=init,
                              symmetry_dimension=sym.dimension, seconds=time.perf_counter() - t0, starts=starts,
                              balanced=balanced)
        if consts is not None or attempt or balanced or not can_balance:
            break
        # the closed form gives X only up to the stabiliser, which is not compact for a generic W: a far
        # representative (norm 4064 against 7.2 planted, one head (8, 16), seed 79: M = 2e12) defeats
        # both certificates. Retry once at the orbit's smallest-norm point (solver.symmetry.balance_orbit).
        Xb = balanced_point(X)
        if Xb is None:
            break
        X, balanced = Xb, True
        say("retrying at the orbit's smallest-norm point")
    if consts is None:
        M0 = hessian_lipschitz_on(problem, X, 0.0)  # the lemma's M at radius 0: a lower bound of the M used
        k = 4 * gradient_safety(problem) ** 2  # lambda_min^2 > 4 s^2 M ||grad|| (solver.newton.local_constants)
        reason = (f"lambda_min <= {lam0:.3e} at the iterate (off the {sym.dimension}-dimensional orbit), "
                  f"gradient norm {gn:.3e}, Hessian-Lipschitz bound M >= {M0:.3e}: lambda_min^2 < {k:g} M ||grad|| or "
                  # lam0 bounds lambda_min from above (the matrix-free estimate stops early below the floor:
                  # one head (64, 128), seed 0, 1.2e-4 against 1.03e-9 on the slice) and M0 bounds M from below,
                  # so these are the least it would take
                  f"lambda_min <= 0; it would take ||grad|| <= lambda_min^2 / ({k:g} M) <= {max(lam0, 0.0)**2 / (k * M0):.1e}, "
                  + (f"or an M at least {k * M0 * gn / lam0**2:.1e} times smaller" if lam0 > 1e-150 else
                     "and no M can help while lambda_min <= 0"))
        if why:  # Lanczos' lambda_min met the condition, but the dense Hessian did not prove it
            reason = f"the local Newton certificate's {why}"
        if moved:  # lam0, gn and why are those of the LM point; the X returned is the slice polish
            reason = f"at the LM point, before the move to its slice polish: {reason}"
        if validation is not None and validation["status"] != "OK":
            reason = f"the checker's validation of the M lemma failed on the region: {validation}"
        if slice_reason:
            reason += f"; {slice_reason}"
        if certify:
            raise CertificationError(
                f"cannot certify the Newton region: {reason}. The instance may be unidentifiable here "
                f"(n <= d, one head, zeros in B) or not yet near a minimiser; pass certify=False for an uncertified answer")
        cert = build_certificate(problem, X, None, sym, validation, iterations=0, status="uncertified", reason=reason)
        return Result(X=X, status="uncertified", certificate=cert, history=history.as_list(), init=init,
                      symmetry_dimension=sym.dimension, seconds=time.perf_counter() - t0, starts=starts,
                      balanced=balanced)

    say("certified Newton phase")
    X, iters = certified_newton(problem, X, consts, history, gtol, T=T)
    cert = build_certificate(problem, X, consts, sym, validation, iterations=iters,
                             final=(consts, gn, lam0, why) if iters == 0 else None)
    return Result(X=X, status=cert.status, certificate=cert, history=history.as_list(), init=init,
                  symmetry_dimension=sym.dimension, seconds=time.perf_counter() - t0, starts=starts,
                  balanced=balanced)


def recover_attention(W, B, *, u=None, gamma=0.0, X0=None, **kwargs) -> Result:
    """Convenience: ``recover(Problem.create(W, B, u=u, gamma=gamma, X0=X0), **kwargs)``.

    W: (d, d) or (H, d, d); B: (n, n) or (H, n, n) attention maps; u: (d,) or (H, d).
    """
    return recover(Problem.create(W, B, u=u, gamma=gamma, X0=X0), **kwargs)


__all__ = ["Result", "recover", "recover_attention", "validate_region", "hessian_lipschitz_on"]
