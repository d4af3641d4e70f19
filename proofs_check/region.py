"""The region a lemma's constant is claimed on, and evaluation of every constant there."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from solver import _generated as gen
from solver.errors import InvalidRegionError
from solver.problem import ATTENTION, OUTPUT, Problem


@dataclass(frozen=True)
class Region:
    """Assumptions of the lemmas (see derivations/lemmas.py).

    - `d`, `n`, `heads`: sizes; `variant`: ``"attention"`` or ``"output"``
    - `R`: bound on every column norm of X; `omega`: on every ||W_h||_2;
      `mu`: on every ||u_h||; `gamma`, `gamma_max`: min / max regulariser weight
    - output variant: `d_v`, `omega_V` (bound on ||W_V,h||_2), `beta` (bound on row norms of B)
    - `sigma`: bound on ||X||_2 (None: the implied sqrt(n) R); `rho`: bound on every
      row residual ||f_i - b_i|| of the attention maps (None: the implied sqrt 2)
    """

    d: int
    n: int
    heads: int = 2
    R: float = 1.0
    omega: float = 1.0
    mu: float = 0.0
    gamma: float = 0.0
    gamma_max: float = 0.0
    variant: str = ATTENTION
    d_v: int = 0
    omega_V: float = 0.0
    beta: float = 0.0
    sigma: float | None = None
    rho: float | None = None

    def __post_init__(self):
        for name in ("d", "n", "heads"):
            if int(getattr(self, name)) < 1:
                raise InvalidRegionError(f"region: {name} = {getattr(self, name)}; must be >= 1")
        if not self.R > 0:
            raise InvalidRegionError(f"region: R = {self.R}; the column-norm radius must be > 0")
        for name in ("omega", "mu", "gamma", "omega_V", "beta"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v >= 0):
                raise InvalidRegionError(f"region: {name} = {v}; must be finite and >= 0")
        for name in ("sigma", "rho"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v >= 0):
                raise InvalidRegionError(f"region: {name} = {v}; must be finite and >= 0 (or None)")
        if self.gamma_max < self.gamma:
            raise InvalidRegionError(f"region: gamma_max = {self.gamma_max} < gamma = {self.gamma}")
        if self.variant not in (ATTENTION, OUTPUT):
            raise InvalidRegionError(f"region: variant {self.variant!r}; expected 'attention' or 'output'")
        if self.variant == OUTPUT and self.d_v < 1:
            raise InvalidRegionError("region: the output variant needs d_v >= 1")

    @property
    def sigma_bound(self) -> float:
        implied = float(np.sqrt(self.n) * self.R)
        return implied if self.sigma is None else min(float(self.sigma), implied)

    @property
    def rho_bound(self) -> float:
        return float(np.sqrt(2.0)) if self.rho is None else min(float(self.rho), float(np.sqrt(2.0)))

    def as_dict(self) -> dict:
        return asdict(self)

    def bounds(self) -> dict[str, float]:
        """Every lemma constant on this region (the generated evaluators)."""
        raw = gen.bounds(float(self.n), float(self.heads), self.R, self.omega, self.mu, self.gamma,
                         self.gamma_max, self.omega_V, self.beta, sigma=self.sigma_bound, rho=self.rho_bound,
                         variant=self.variant)
        return {k: float(v) for k, v in raw.items()}

    @classmethod
    def around(cls, problem: Problem, X, radius: float = 0.0, local: bool = True) -> "Region":
        """The smallest region of this family holding the instance and the ball ``||Y - X||_F <= radius``.

        With ``local``, sigma and rho are the bounds that hold on the ball:
        ``sigma = ||X||_2 + radius`` and, for attention maps, ``rho = max_i ||f_i(X) - b_i||
        + c1 J_S radius`` (softmax rows move at most c1 ||ds_i|| <= c1 J_S ||Y - X||).
        """
        X = np.asarray(X, dtype=np.float64)
        R = float(np.max(np.linalg.norm(X, axis=0))) + float(radius)
        kw = dict(
            d=problem.d, n=problem.n, heads=problem.heads, R=max(R, np.finfo(float).tiny),
            omega=float(max(np.linalg.norm(W, 2) for W in problem.W)),
            mu=float(max(np.linalg.norm(u) for u in problem.U)),
            gamma=float(problem.Gamma.min()), gamma_max=float(problem.Gamma.max()), variant=problem.variant,
        )
        if problem.variant == OUTPUT:
            kw.update(d_v=problem.W_V.shape[-1], omega_V=float(max(np.linalg.norm(Wv, 2) for Wv in problem.W_V)),
                      beta=float(np.max(np.linalg.norm(problem.B, axis=-1))))
        if local:
            sigma = float(np.linalg.norm(X, 2)) + float(radius)
            kw["sigma"] = sigma
            if problem.variant == ATTENTION:
                S = problem.logits(X)
                F = np.exp(S - S.max(axis=-1, keepdims=True))
                F /= F.sum(axis=-1, keepdims=True)
                res = float(np.max(np.linalg.norm(F - problem.B, axis=-1)))
                J_S = 2 * kw["omega"] * sigma + np.sqrt(problem.n) * kw["mu"]
                kw["rho"] = min(float(np.sqrt(2.0)), res + 0.5 * J_S * float(radius))
        return cls(**kw)

    def require_contains(self, problem: Problem, X=None) -> None:
        """Raise :class:`InvalidRegionError` naming the first assumption the instance breaks."""
        actual = Region.around(problem, X if X is not None else np.zeros((problem.d, problem.n)))
        tol = 1e-12
        if (problem.d, problem.n, problem.heads, problem.variant) != (self.d, self.n, self.heads, self.variant):
            raise InvalidRegionError(
                f"instance has (d, n, heads, variant) = {(problem.d, problem.n, problem.heads, problem.variant)}, "
                f"region is for {(self.d, self.n, self.heads, self.variant)}")
        checks = [("omega", actual.omega, self.omega, "max_h ||W_h||_2"), ("mu", actual.mu, self.mu, "max_h ||u_h||")]
        if X is not None:
            checks.append(("R", actual.R, self.R, "max column norm of X"))
        if self.variant == OUTPUT:
            checks += [("omega_V", actual.omega_V, self.omega_V, "max_h ||W_V,h||_2"),
                       ("beta", actual.beta, self.beta, "max row norm of B")]
        for name, value, bound, what in checks:
            if value > bound * (1 + tol) + tol:
                raise InvalidRegionError(f"instance outside the region: {what} = {value:.6g} > {name} = {bound:.6g}")
        if actual.gamma < self.gamma * (1 - tol) - tol:
            raise InvalidRegionError(f"instance outside the region: min Gamma = {actual.gamma:.6g} < gamma = {self.gamma:.6g}")
        if actual.gamma_max > self.gamma_max * (1 + tol) + tol:
            raise InvalidRegionError(f"instance outside the region: max Gamma = {actual.gamma_max:.6g} > gamma_max = {self.gamma_max:.6g}")
