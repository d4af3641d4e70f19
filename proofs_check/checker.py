"""The checker: every lemma's constant against the true quantity, sampled and attacked.

For one :class:`~proofs_check.region.Region` and each lemma:

1. **random**: ``instances`` seeded random instances inside the region
   (vectorised with ``jax.vmap``); the true quantity is computed exactly
   (``eigvalsh`` of the dense Hessian, spectral norms, explicit softmax
   derivatives) and compared with the constant;
2. **adversarial**: projected gradient ascent (Adam) of the ratio
   true / bound over the instance (X, W, u, B, Gamma, and the direction V)
   from ``starts`` starts; Hessian quantities are attacked through their
   Rayleigh-quotient forms and re-evaluated exactly at the end points.

The ratio is ``quantity / bound`` for upper bounds. For the strong-convexity
lower bound ``lambda_min >= l = gamma^2 - H negcurv`` it is the observed
curvature deficit over the bounded one, ``(gamma^2 - lambda_min) / (gamma^2 - l)``;
either way a ratio above 1 is a counterexample. Violations are saved as npz.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from derivations.lemmas import LEMMAS, Lemma
from solver import _generated as gen
from solver.io import atomic_save_npz
from solver.problem import ATTENTION

from . import reference as ref
from .region import Region

RATIO_TOL = 1e-9  # float64 rounding in the quantities is far below this


# instances -------------------------------------------------------------------------


def _raw_instance(region: Region, key) -> dict:
    """Unconstrained parameters of one instance; :func:`_project` maps them into the region."""
    k = jax.random.split(key, 12)
    d, n, H = region.d, region.n, region.heads
    raw = {
        "X": jax.random.normal(k[0], (d, n)),
        "Y": jax.random.normal(k[1], (d, n)),
        "V": jax.random.normal(k[2], (d, n)),
        "W": jax.random.normal(k[3], (H, d, d)),
        "U": jax.random.normal(k[4], (H, d)),
        "Blog": 2.0 * jax.random.normal(k[5], (H, n, n)),
        "Graw": jax.random.uniform(k[6], (d, n)),
        "s": jax.random.normal(k[7], (n,)) * jax.random.uniform(k[8], (), minval=0.0, maxval=4.0),
        "a": jax.random.normal(k[9], (n,)),
        "xscale": jax.random.uniform(k[10], (), minval=0.5, maxval=1.5),
        "Bmix": jax.random.uniform(jax.random.fold_in(k[5], 7), ()),
    }
    if region.variant != ATTENTION:
        raw["Wv"] = jax.random.normal(k[11], (H, d, region.d_v))
        raw["Bout"] = jax.random.normal(jax.random.fold_in(k[11], 1), (H, n, region.d_v))
    return raw


def _ball(x, radius, axis=None):
    norm = jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=axis is not None) + 1e-300)
    return x * jnp.minimum(1.0, radius / norm)


def _spectral_ball(W, radius):
    norms = jax.vmap(lambda M: jnp.linalg.norm(M, 2))(W)
    return W * jnp.minimum(1.0, radius / (norms + 1e-300))[:, None, None]


def _project(region: Region, raw: dict) -> dict:
    """Map raw parameters into the region (columns of X, Y in the R-ball; ||W|| <= omega; ...)."""
    inst = dict(raw)
    # X columns are scaled up before the projection so many sit on the boundary ||x_j|| = R
    inst["X"] = _ball(raw["X"] * raw["xscale"] * region.R, region.R, axis=0)
    inst["Y"] = _ball(raw["Y"] * raw["xscale"] * region.R, region.R, axis=0)
    if region.sigma is not None:  # also ||X||_2 <= sigma
        for key in ("X", "Y"):
            nrm = jnp.linalg.norm(inst[key], 2)
            inst[key] = inst[key] * jnp.minimum(1.0, region.sigma_bound / (nrm + 1e-300))
    inst["W"] = _spectral_ball(raw["W"] * region.omega, region.omega) if region.omega > 0 else 0.0 * raw["W"]
    inst["U"] = _ball(raw["U"] * region.mu, region.mu, axis=1) if region.mu > 0 else 0.0 * raw["U"]
    inst["B"] = jax.nn.softmax(raw["Blog"], axis=-1)
    if region.rho is not None and region.variant == ATTENTION:
        # B = (1 - t) F(X) + t B_free with t <= rho / sqrt 2 keeps every ||f_i - b_i|| <= rho
        t = jnp.clip(raw["Bmix"], 0.0, 1.0) * min(1.0, region.rho_bound / np.sqrt(2.0))
        S = jnp.einsum("an,hab,bm->hnm", inst["X"], inst["W"], inst["X"]) + (inst["U"] @ inst["X"])[:, None, :]
        inst["B"] = (1 - t) * jax.nn.softmax(S, axis=-1) + t * inst["B"]
    g = jnp.clip(raw["Graw"], 0.0, 1.0)
    inst["Gamma"] = region.gamma + (region.gamma_max - region.gamma) * g
    if region.variant != ATTENTION:
        inst["Wv"] = _spectral_ball(raw["Wv"] * region.omega_V, region.omega_V) if region.omega_V > 0 else 0.0 * raw["Wv"]
        inst["Bout"] = _ball(raw["Bout"] * region.beta, region.beta, axis=-1) if region.beta > 0 else 0.0 * raw["Bout"]
    return inst


# quantities -------------------------------------------------------------------------


def _loss_args(region: Region, inst: dict, reg: bool = True):
    X0 = jnp.zeros_like(inst["X"])
    G = inst["Gamma"] if reg else jnp.zeros_like(inst["Gamma"])
    if region.variant == ATTENTION:
        return (inst["W"], inst["U"], inst["B"], G, X0)
    return (inst["W"], inst["U"], inst["Wv"], inst["Bout"], G, X0)


def _kernels(region):
    if region.variant == ATTENTION:
        return gen.attention_grad, gen.attention_hvp, gen.attention_hessian
    return gen.output_grad, gen.output_hvp, gen.output_hessian


def _S(inst, X):
    return X.T @ inst["W"][0] @ X + (inst["U"][0] @ X)[None, :]


def _softmax_derivs(s, a):
    f = lambda t: jax.nn.softmax(s + t * a)  # noqa: E731
    d1 = jax.jvp(f, (0.0,), (1.0,))[1]
    d2 = jax.jvp(lambda t: jax.jvp(f, (t,), (1.0,))[1], (0.0,), (1.0,))[1]
    d3 = jax.jvp(lambda t: jax.jvp(lambda r: jax.jvp(f, (r,), (1.0,))[1], (t,), (1.0,))[1], (0.0,), (1.0,))[1]
    return d1, d2, d3


def _third(region, inst, X, V):
    _, hvp, _ = _kernels(region)
    args = _loss_args(region, inst)
    return jax.jvp(lambda t: jnp.sum(V * hvp(X + t * V, V, *args)), (0.0,), (1.0,))[1]


def quantity(region: Region, name: str, inst: dict, exact: bool):
    """The true quantity a lemma bounds, at one instance. ``exact=False`` gives the
    differentiable form the adversary ascends (a lower bound of the exact one)."""
    X, V = inst["X"], inst["V"]
    vn = jnp.sqrt(jnp.sum(V * V))
    grad, hvp, hessian = _kernels(region)
    args = _loss_args(region, inst)
    base = name.removesuffix("_output")
    if base == "logit_bound":
        return jnp.max(jnp.abs(_S(inst, X)))
    if base == "logit_jacobian":
        if exact:
            J = jax.jacfwd(lambda Z: _S(inst, Z))(X).reshape(region.n**2, region.d * region.n)
            return jnp.linalg.norm(J, 2)
        return jnp.sqrt(jnp.sum(jax.jvp(lambda Z: _S(inst, Z), (X,), (V,))[1] ** 2)) / vn
    if base == "logit_curvature":
        return jnp.sqrt(jnp.sum((2 * V.T @ inst["W"][0] @ V) ** 2)) / vn**2
    if base in ("softmax_jacobian", "softmax_second", "softmax_third"):
        s, a = inst["s"], inst["a"]
        an = jnp.sqrt(jnp.sum(a * a))
        if base == "softmax_jacobian" and exact:
            f = jax.nn.softmax(s)
            return jnp.max(jnp.linalg.eigvalsh(jnp.diag(f) - jnp.outer(f, f)))
        d1, d2, d3 = _softmax_derivs(s, a)
        k = {"softmax_jacobian": 1, "softmax_second": 2, "softmax_third": 3}[base]
        return jnp.sqrt(jnp.sum((d1, d2, d3)[k - 1] ** 2)) / an**k
    if name == "output_map_curvature":
        def along(r):
            return ref.outputs(X + r * V, inst["W"], inst["U"], inst["Wv"])

        d2 = jax.jvp(lambda t: jax.jvp(along, (t,), (1.0,))[1], (0.0,), (1.0,))[1]
        return jnp.sqrt(jnp.sum(d2 * d2)) / vn**2
    if base == "gradient_bound":
        return jnp.sqrt(jnp.sum(grad(X, *_loss_args(region, inst, reg=False)) ** 2))
    if base in ("gradient_lipschitz", "strong_convexity"):
        if exact:
            ev = jnp.linalg.eigvalsh(hessian(X, *args))
            return jnp.max(jnp.abs(ev)) if base == "gradient_lipschitz" else ev[0]
        rq = jnp.sum(V * hvp(X, V, *args)) / vn**2
        return jnp.abs(rq) if base == "gradient_lipschitz" else rq
    if base == "hessian_lipschitz":
        if exact and region.rho is None:  # with rho set, B depends on X and Y may leave the region
            dH = hessian(X, *args) - hessian(inst["Y"], *args)
            third = jnp.abs(_third(region, inst, X, V)) / vn**3
            return jnp.maximum(jnp.linalg.norm(dH, 2) / jnp.sqrt(jnp.sum((X - inst["Y"]) ** 2)), third)
        return jnp.abs(_third(region, inst, X, V)) / vn**3
    raise KeyError(name)


def ratio(region: Region, lem: Lemma, bound: float, inst: dict, exact: bool):
    q = quantity(region, lem.name, inst, exact)
    if lem.kind == "upper":
        return q / bound
    deficit_bound = region.gamma**2 - bound  # = H * negcurv > 0
    return (region.gamma**2 - q) / deficit_bound


def lemmas_for(region: Region) -> list[Lemma]:
    return [lem for lem in LEMMAS if lem.variant in ("any", region.variant)]


# the check -------------------------------------------------------------------------


@dataclass
class LemmaResult:
    name: str
    statement: str
    constant: str
    kind: str
    bound: float
    worst_random_ratio: float
    worst_adversarial_ratio: float
    status: str
    counterexample: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Report:
    region: Region
    instances: int
    seed: int
    lemmas: list[LemmaResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.status == "OK" for r in self.lemmas)

    def as_dict(self) -> dict:
        return {"region": self.region.as_dict(), "instances": self.instances, "seed": self.seed,
                "ok": self.ok, "seconds": self.seconds, "lemmas": [r.as_dict() for r in self.lemmas]}

    def table(self) -> str:
        rows = [("lemma", "constant", "value", "worst random", "worst adversarial", "status")]
        for r in self.lemmas:
            const = r.constant if len(r.constant) <= 38 else r.constant[:35] + "..."
            rows.append((r.name, const, f"{r.bound:.4g}", f"{r.worst_random_ratio:.3f}",
                         f"{r.worst_adversarial_ratio:.3f}", r.status))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


class _Progress:
    """A one-line progress bar on stderr, shown once a run has taken a few seconds."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.t0, self.enabled = total, 0, time.perf_counter(), enabled

    def step(self, label: str):
        self.done += 1
        elapsed = time.perf_counter() - self.t0
        if self.enabled and elapsed > 2.0:
            bar = "#" * int(30 * self.done / self.total)
            print(f"\r[{bar:<30}] {self.done}/{self.total} {label:<28} {elapsed:5.1f} s", end="", file=sys.stderr, flush=True)
        if self.enabled and self.done == self.total and elapsed > 2.0:
            print(file=sys.stderr)


def _adam_ascent(objective, raw, steps: int, lr: float):
    """Maximise ``objective(raw)`` with Adam; returns the final raw parameters."""
    g_fn = jax.grad(objective)
    m = jax.tree.map(jnp.zeros_like, raw)
    v = jax.tree.map(jnp.zeros_like, raw)

    def body(k, state):
        p, m, v = state
        g = g_fn(p)
        g = jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), x, 0.0), g)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        t = k + 1.0
        p = jax.tree.map(lambda x, a, b: x + lr * (a / (1 - 0.9**t)) / (jnp.sqrt(b / (1 - 0.999**t)) + 1e-12), p, m, v)
        return p, m, v

    p, _, _ = jax.lax.fori_loop(0, steps, body, (raw, m, v))
    return p


@functools.lru_cache(maxsize=16)
def _sampler(d: int, n: int, heads: int, variant: str, d_v: int):
    """``jax.jit`` of the vmapped :func:`_raw_instance` for one shape (one key per instance).

    Drawn eagerly, each random primitive compiled on its own (about 20 s per check); jitted,
    the sampler compiles once per shape and key count and is shared by every lemma and every
    region of that shape.
    """
    shape = Region(d=d, n=n, heads=heads, variant=variant, d_v=d_v)
    return jax.jit(jax.vmap(lambda k: _raw_instance(shape, k)))


@functools.lru_cache(maxsize=64)
def _compiled(region: Region, name: str, steps: int, lr: float):
    """The jitted ratio (exact and surrogate) and adversary for one region and lemma, with
    the bound as an argument: a second check of the same region (another seed, a scaled
    bound) compiles nothing."""
    lem = next(lem for lem in LEMMAS if lem.name == name)

    def surrogate_one(raw, bound):
        return ratio(region, lem, bound, _project(region, raw), exact=False)

    exact_ratio = jax.jit(jax.vmap(lambda r, b: ratio(region, lem, b, _project(region, r), exact=True),
                                   in_axes=(0, None)))
    ascend = jax.jit(jax.vmap(lambda r, b: _adam_ascent(lambda q: surrogate_one(q, b), r, steps, lr),
                              in_axes=(0, None)))
    surrogate = jax.jit(jax.vmap(surrogate_one, in_axes=(0, None)))
    return exact_ratio, ascend, surrogate


def _rows(tree, start, stop):
    return jax.tree.map(lambda x: x[start:stop], tree)


def _stacked(a, b):
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y]), a, b)


def check(region: Region, *, instances: int = 32, seed: int = 0, starts: int = 8, steps: int = 60,
          lr: float = 0.05, names: list[str] | None = None, bound_scale: dict[str, float] | None = None,
          counterexample_dir: str | Path | None = None, progress: bool = True) -> Report:
    """Run the random and adversarial checks of every lemma that applies to ``region``.

    **Arguments**

    - `instances`: random instances per lemma; `starts`, `steps`, `lr`: the adversary
    - `names`: restrict to these lemmas
    - `bound_scale`: multiply a lemma's constant (used by the mutation test to
      weaken a bound on purpose; never used by the solver)
    - `counterexample_dir`: where a violating instance is saved (npz)
    """
    t0 = time.perf_counter()
    bounds = region.bounds()
    selected = [lem for lem in lemmas_for(region) if names is None or lem.name in names]
    report = Report(region=region, instances=instances, seed=seed)
    bar = _Progress(len(selected), progress)
    key = jax.random.PRNGKey(seed)
    for lem in selected:
        bound = bounds[lem.name] * (bound_scale or {}).get(lem.name, 1.0)
        key, k_rand, k_adv = jax.random.split(key, 3)
        exact_ratio, ascend, surrogate = _compiled(region, lem.name, steps, lr)
        sample = _sampler(region.d, region.n, region.heads, region.variant, region.d_v)
        b = jnp.float64(bound)
        # one draw and one exact evaluation for the random instances and the adversary's
        # starts / end points together: the same keys as drawing them apart, one compilation
        both = sample(jnp.concatenate([jax.random.split(k_rand, instances), jax.random.split(k_adv, starts)]))
        raws = _rows(both, 0, instances)
        final = ascend(_rows(both, instances, instances + starts), b)
        exact = np.asarray(exact_ratio(_stacked(raws, final), b))
        rand, adv_exact = exact[:instances], exact[instances:]
        adv_surr = np.asarray(surrogate(final, b))
        adv = np.maximum(adv_exact, adv_surr)
        worst_r = float(np.nanmax(rand)) if np.isfinite(rand).any() else float("nan")
        worst_a = float(np.nanmax(adv)) if np.isfinite(adv).any() else float("nan")
        violated = max(worst_r, worst_a) > 1 + RATIO_TOL or not (np.isfinite(worst_r) and np.isfinite(worst_a))
        res = LemmaResult(name=lem.name, statement=lem.statement, constant=str(lem.constant.simplify()), kind=lem.kind,
                          bound=float(bound), worst_random_ratio=worst_r, worst_adversarial_ratio=worst_a,
                          status="VIOLATED" if violated else "OK")
        if violated:
            res.counterexample = _save_counterexample(region, lem, raws, rand, final, adv, counterexample_dir)
        report.lemmas.append(res)
        bar.step(lem.name)
    report.seconds = time.perf_counter() - t0
    return report


def _save_counterexample(region, lem, raws, rand, final, adv, directory):
    use_adv = np.nanmax(adv) >= np.nanmax(rand)
    batch, values = (final, adv) if use_adv else (raws, rand)
    idx = int(np.nanargmax(values))
    inst = _project(region, jax.tree.map(lambda x: x[idx], batch))
    directory = Path(directory or ".")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"counterexample_{lem.name}.npz"
    atomic_save_npz(path, ratio=np.float64(values[idx]), **{k: np.asarray(v) for k, v in inst.items()})
    return str(path)
