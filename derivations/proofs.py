"""Exact proofs at small sizes that the closed forms equal explicit-entry derivatives.

For one size (d, n), heads H, with or without the key bias u and (output
variant) with W_V, every input entry becomes a SymPy symbol. The loss is
written entry by entry from its *definition* (sums of products, an opaque
exponential, row normalisation); SymPy differentiates it entry by entry
(``sp.diff``), giving the explicit gradient and Hessian. The closed forms of
:mod:`derivations.losses` are evaluated on the same symbolic matrices.

The exponential is the opaque function :class:`Exp` whose only property is
``d Exp(s) = Exp(s) ds`` (SymPy's ``exp`` would rewrite ``exp(a)**2`` as
``exp(2a)``). After differentiation every ``Exp(S_ij)`` is replaced by a new
independent symbol ``e_ij``. Both sides are then rational functions of
independent variables, and the identity ``closed - explicit = 0`` in these
variables implies the identity for the real exponential (it is the special
case ``e_ij = exp(S_ij)``).

Two ways to decide ``D = closed - explicit = 0``, both exact:

- ``method="symbolic"``: the numerator of ``together(D)`` expands to 0 (a
  deterministic proof; only feasible at the smallest sizes).
- ``method="schwartz-zippel"``: write ``D = P / Q`` with ``Q`` a product of
  powers of row sums ``sum_k e_ik`` (never 0 at points with e > 0). The
  total degree of ``P`` is bounded by :func:`degree_bound`. Evaluating in
  exact rational arithmetic at ``k`` independent uniformly random points of
  ``{1, ..., N}^m`` (e_ij drawn positive as well), the Schwartz-Zippel lemma
  bounds the chance that a non-zero ``P`` vanishes at all of them by
  ``(deg P / N)^k``. This is a randomised proof; the failure probability
  is reported with the result (with N = 2^64 and k = 2 it is below 1e-25
  for every size here).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from fractions import Fraction

import sympy as sp

from .calculus import FrobeniusSq, RowSoftmax
from .losses import B_att, B_out, Gamma, V, W, W_V, X, X0, all_derivations, d, dv, n, u

SZ_N = 2**64


class Exp(sp.Function):
    """Opaque exponential: its derivative is itself, nothing else is known about it."""

    def fdiff(self, argindex=1):
        return self


def _mat(name, r, c):
    return sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{name}_{i}_{j}"))


@dataclass
class ProofResult:
    variant: str
    d: int
    n: int
    heads: int
    bias: bool
    method: str
    proved: bool
    failure_probability: float  # 0 for symbolic proofs
    degree_bound: int
    seconds: float

    def line(self) -> str:
        how = "numerator of closed - explicit expands to 0" if self.method == "symbolic" else (
            f"Schwartz-Zippel, deg <= {self.degree_bound}, P(false pass) <= {self.failure_probability:.1e}")
        status = "PROVED" if self.proved else "FAILED"
        return (f"{self.variant:9s} d={self.d} n={self.n} H={self.heads} u={'yes' if self.bias else 'no '}"
                f"  {status}  ({how}; {self.seconds:.1f} s)")


def _explicit_softmax(S: sp.Matrix) -> sp.Matrix:
    E = S.applyfunc(lambda s: Exp(sp.expand(s)))  # canonical argument: same S_ij, same atom
    rows = [sum(E[i, :]) for i in range(S.rows)]
    return sp.Matrix(S.rows, S.cols, lambda i, j: E[i, j] / rows[i])


def _evaluate(expr, env: dict):
    """Closed-form matrix expression -> explicit SymPy Matrix over the symbols in env."""
    memo: dict = {}

    def ev(e):
        if e in memo:
            return memo[e]
        if isinstance(e, sp.MatrixSymbol):
            out = env[e]
        elif isinstance(e, sp.OneMatrix):
            out = sp.ones(*[int(s) for s in e.shape])
        elif isinstance(e, sp.ZeroMatrix):
            out = sp.zeros(*[int(s) for s in e.shape])
        elif isinstance(e, sp.MatAdd):
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = out + ev(a)
        elif isinstance(e, sp.MatMul):
            coeff, mats = e.as_coeff_matrices()
            out = ev(mats[0])
            for m in mats[1:]:
                out = out * ev(m)
            out = out * coeff if coeff != 1 else out
        elif isinstance(e, sp.Transpose):
            out = ev(e.arg).T
        elif isinstance(e, sp.HadamardProduct):
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = out.multiply_elementwise(ev(a))
        elif isinstance(e, RowSoftmax):
            out = _explicit_softmax(ev(e.arg))
        elif isinstance(e, FrobeniusSq):
            A = ev(e.arg)
            out = sum(a * a for a in A)
        elif isinstance(e, sp.Mul):
            out = sp.Mul(*[ev(a) for a in e.args])
        elif isinstance(e, sp.Number):
            out = e
        else:
            raise NotImplementedError(type(e).__name__)
        memo[e] = out
        return out

    return ev(expr)


def _explicit_loss(variant, Xs, Ws, Us, Bs, Wvs, Gs, X0s):
    """The definition, entry by entry (independent of the closed forms)."""
    dd, nn = Xs.shape
    total = sp.S.Zero
    for h in range(len(Ws)):
        S = sp.Matrix(nn, nn, lambda i, j: sum(Xs[a, i] * Ws[h][a, b] * Xs[b, j] for a in range(dd) for b in range(dd))
                      + sum(Us[h][a, 0] * Xs[a, j] for a in range(dd)))
        F = _explicit_softmax(S)
        if variant == "attention":
            total += sp.Rational(1, 2) * sum((F[i, j] - Bs[h][i, j]) ** 2 for i in range(nn) for j in range(nn))
        else:
            ncol = Wvs[h].shape[1]
            for i in range(nn):
                for c in range(ncol):
                    o = sum(F[i, j] * Xs[a, j] * Wvs[h][a, c] for j in range(nn) for a in range(dd))
                    total += sp.Rational(1, 2) * (o - Bs[h][i, c]) ** 2
    total += sp.Rational(1, 2) * sum((Gs[a, i] * (Xs[a, i] - X0s[a, i])) ** 2 for a in range(dd) for i in range(nn))
    return total


def degree_bound(expr) -> int:
    """Upper bound on the total degree of the numerator of ``expr`` as a rational function."""
    memo: dict = {}

    def walk(e):
        if e in memo:
            return memo[e]
        if e.is_Symbol:
            out = (1, 0)
        elif e.is_Number:
            out = (0, 0)
        elif e.is_Add:
            parts = [walk(a) for a in e.args]
            den = sum(p[1] for p in parts)
            out = (max(p[0] + den - p[1] for p in parts), den)
        elif e.is_Mul:
            parts = [walk(a) for a in e.args]
            out = (sum(p[0] for p in parts), sum(p[1] for p in parts))
        elif e.is_Pow and e.exp.is_Integer:
            nd, dd = walk(e.base)
            k = int(e.exp)
            out = (k * nd, k * dd) if k >= 0 else (-k * dd, -k * nd)
        else:
            raise NotImplementedError(f"degree_bound: {type(e).__name__}")
        memo[e] = out
        return out

    return walk(sp.sympify(expr))[0]


def prove(variant: str, dd: int, nn: int, heads: int = 1, bias: bool = True, method: str = "schwartz-zippel",
          points: int = 2, seed: int = 0, dv_size: int = 2) -> ProofResult:
    """Prove gradient and HVP closed forms equal explicit-entry differentiation at one size."""
    t0 = time.perf_counter()
    Xs, Vs, Gs, X0s = _mat("x", dd, nn), _mat("v", dd, nn), _mat("g", dd, nn), _mat("p", dd, nn)
    Ws = [_mat(f"w{h}", dd, dd) for h in range(heads)]
    Us = [_mat(f"u{h}", dd, 1) if bias else sp.zeros(dd, 1) for h in range(heads)]
    if variant == "attention":
        Bs = [_mat(f"b{h}", nn, nn) for h in range(heads)]
        Wvs = [None] * heads
    else:
        Bs = [_mat(f"b{h}", nn, dv_size) for h in range(heads)]
        Wvs = [_mat(f"wv{h}", dd, dv_size) for h in range(heads)]
    head_D, _, reg_D = all_derivations()
    if variant == "output":
        head_D = all_derivations()[1]
    sizes = {d: dd, n: nn, dv: dv_size}

    # closed forms: sum over heads of the head expressions plus the regulariser
    closed_g = sp.zeros(dd, nn)
    closed_h = sp.zeros(dd, nn)
    for h in range(heads):
        env = {X: Xs, V: Vs, W.subs(sizes): Ws[h], u.subs(sizes): Us[h]}
        env[(B_att if variant == "attention" else B_out).subs(sizes)] = Bs[h]
        if variant == "output":
            env[W_V.subs(sizes)] = Wvs[h]
        env = {k.subs(sizes) if hasattr(k, "subs") else k: v for k, v in env.items()}
        closed_g += _evaluate(head_D.grad.subs(sizes), env)
        closed_h += _evaluate(head_D.hvp.subs(sizes), env)
    renv = {X.subs(sizes): Xs, V.subs(sizes): Vs, Gamma.subs(sizes): Gs, X0.subs(sizes): X0s}
    closed_g += _evaluate(reg_D.grad.subs(sizes), renv)
    closed_h += _evaluate(reg_D.hvp.subs(sizes), renv)

    # explicit: differentiate the definition entry by entry
    L = _explicit_loss(variant, Xs, Ws, Us, Bs, Wvs, Gs, X0s)
    xs = list(Xs)
    grad = [sp.diff(L, x) for x in xs]
    # Hessian times v, entry by entry: d/dt grad_k(x + t v) at t = 0 (one derivative
    # per entry instead of dn; the same explicit-entry differentiation)
    t = sp.Symbol("t")
    shift = {x: x + t * v for x, v in zip(xs, list(Vs))}
    hvp = [sp.diff(g.xreplace(shift), t).xreplace({t: 0}) for g in grad]
    explicit_g = sp.Matrix(dd, nn, grad)
    explicit_h = sp.Matrix(dd, nn, hvp)

    diffs = list(closed_g - explicit_g) + list(closed_h - explicit_h)
    exps = set()
    for e in diffs:
        exps |= e.atoms(Exp)
    emap = {a: sp.Symbol(f"e_{k}") for k, a in enumerate(sorted(exps, key=sp.default_sort_key))}
    diffs = [e.xreplace(emap) for e in diffs]

    if method == "symbolic":
        proved = all(sp.expand(sp.together(e).as_numer_denom()[0]) == 0 for e in diffs)
        deg, prob = 0, 0.0
    elif method == "schwartz-zippel":
        deg = max(degree_bound(e) for e in diffs)
        rng = random.Random(seed)
        syms = sorted(set().union(*[e.free_symbols for e in diffs]), key=sp.default_sort_key)
        proved = True
        for _ in range(points):
            point = {s: sp.Integer(rng.randint(1, SZ_N)) for s in syms}
            if any(e.xreplace(point) != 0 for e in diffs):
                proved = False
                break
        prob = float(Fraction(deg, SZ_N) ** points) if proved else 1.0
    else:
        raise ValueError(f"method must be 'symbolic' or 'schwartz-zippel', got {method!r}")
    return ProofResult(variant, dd, nn, heads, bias, method, proved, prob, deg, time.perf_counter() - t0)


def sizes_up_to(max_dn: int):
    """All (d, n) with d * n <= max_dn."""
    return [(a, b) for a in range(1, max_dn + 1) for b in range(1, max_dn // a + 1)]
