"""Matrix calculus over SymPy expression trees: a chain rule over primitives.

SymPy's own ``MatrixExpr.diff`` returns wrong results for Hadamard and
elementwise forms (tooling.md: sympy#21983, #17972, #17229), so this module
does not call it. Instead each node type has two rules written out here:

* a *tangent* rule (forward mode): the directional derivative ``dE[V]``;
* an *adjoint* rule (reverse mode): given ``Ebar = dL/dE`` for a scalar ``L``,
  the contribution ``dL/dA`` of each argument ``A``.

The node types are exactly those the losses use: ``MatAdd``, ``MatMul``
(with a scalar coefficient), ``Transpose``, ``HadamardProduct``, leaves
(``MatrixSymbol``, ``OneMatrix``, ``ZeroMatrix``) and the one non-linear
primitive :class:`RowSoftmax`. Scalars are built with :class:`FrobeniusSq`.
Anything else raises ``NotImplementedError``: no silent fallbacks.

Every rule is checked independently: exactly against explicit-entry
differentiation at small sizes (:mod:`derivations.proofs`) and numerically
against ``jax.grad`` / ``jax.jvp`` at all sizes (``tests/``).
"""

from __future__ import annotations


import sympy as sp
from sympy import (
    HadamardProduct,
    MatAdd,
    MatMul,
    MatrixExpr,
    MatrixSymbol,
    OneMatrix,
    Transpose,
    ZeroMatrix,
)

__all__ = ["RowSoftmax", "FrobeniusSq", "tangent", "gradient", "row_sums", "hadamard"]


class RowSoftmax(MatrixExpr):
    """Row-wise softmax ``F = D^{-1} exp(S)``, ``D = diag(exp(S) 1)``.

    Tangent: ``dF = F o dS - F o ((F o dS) J)``, adjoint:
    ``Sbar = F o Fbar - F o ((F o Fbar) J)``, with ``J`` the all-ones n x n
    matrix (``A J`` broadcasts the row sums of ``A``). Printed as a
    max-shifted softmax, so it is stable for logits of any size.
    """

    def __new__(cls, arg):
        arg = sp.sympify(arg)
        return super().__new__(cls, arg)

    @property
    def arg(self):
        return self.args[0]

    @property
    def shape(self):
        return self.arg.shape

    def _sympystr(self, printer):
        return f"softmax({printer._print(self.arg)})"

    def _latex(self, printer):
        return r"\operatorname{softmax}\left(%s\right)" % printer._print(self.arg)

    def _pretty(self, printer):
        from sympy.printing.pretty.stringpict import prettyForm

        return prettyForm(f"softmax({printer._print(self.arg)})")


class FrobeniusSq(sp.Expr):
    """The scalar ``||A||_F^2 = sum_ij A_ij^2`` of a matrix expression ``A``."""

    is_commutative = True
    is_real = True

    def __new__(cls, arg):
        return super().__new__(cls, sp.sympify(arg))

    @property
    def arg(self):
        return self.args[0]

    def _sympystr(self, printer):
        return f"||{printer._print(self.arg)}||_F^2"

    def _latex(self, printer):
        return r"\left\|%s\right\|_F^2" % printer._print(self.arg)


def hadamard(*factors):
    """Hadamard product that drops zero matrices and keeps single factors bare."""
    factors = [f for f in factors]
    if any(isinstance(f, ZeroMatrix) for f in factors):
        return ZeroMatrix(*factors[0].shape)
    if len(factors) == 1:
        return factors[0]
    return HadamardProduct(*factors)


def row_sums(A):
    """``A J``: every entry of row i is the i-th row sum of A."""
    return MatMul(A, OneMatrix(A.shape[1], A.shape[1]))


def _add(terms, shape):
    terms = [t for t in terms if not isinstance(t, ZeroMatrix)]
    if not terms:
        return ZeroMatrix(*shape)
    return MatAdd(*terms) if len(terms) > 1 else terms[0]


def _mul(*factors):
    if any(isinstance(f, ZeroMatrix) for f in factors if isinstance(f, MatrixExpr)):
        mats = [f for f in factors if isinstance(f, MatrixExpr)]
        return ZeroMatrix(mats[0].shape[0], mats[-1].shape[1])
    return MatMul(*factors)


def _softmax_tangent(F, dS):
    FdS = hadamard(F, dS)
    return MatAdd(FdS, -hadamard(F, row_sums(FdS)))


# Forward mode -------------------------------------------------------------------


def tangent(expr, directions: dict):
    """Directional derivative of ``expr`` when each leaf ``X`` moves along ``directions[X]``.

    **Arguments**

    - `expr`: a matrix expression built from the supported node types, or a
      scalar built from :class:`FrobeniusSq`, numbers and matrix-free symbols.
    - `directions`: maps ``MatrixSymbol`` leaves to direction expressions of
      the same shape; leaves not in the map are constants.
    """
    memo: dict = {}

    def d(e):
        if e in memo:
            return memo[e]
        out = _tangent_rule(e, d, directions)
        memo[e] = out
        return out

    return d(expr)


def _tangent_rule(e, d, directions):
    if isinstance(e, MatrixSymbol):
        return directions.get(e, ZeroMatrix(*e.shape))
    if isinstance(e, (OneMatrix, ZeroMatrix, sp.Identity)):
        return ZeroMatrix(*e.shape)
    if isinstance(e, MatAdd):
        return _add([d(a) for a in e.args], e.shape)
    if isinstance(e, MatMul):
        coeff, mats = e.as_coeff_matrices()
        terms = []
        for i, m in enumerate(mats):
            dm = d(m)
            if isinstance(dm, ZeroMatrix):
                continue
            terms.append(_mul(coeff, *mats[:i], dm, *mats[i + 1 :]))
        return _add(terms, e.shape)
    if isinstance(e, Transpose):
        da = d(e.arg)
        return ZeroMatrix(*e.shape) if isinstance(da, ZeroMatrix) else Transpose(da).doit(deep=False)
    if isinstance(e, HadamardProduct):
        terms = []
        for i, a in enumerate(e.args):
            da = d(a)
            if isinstance(da, ZeroMatrix):
                continue
            terms.append(hadamard(*e.args[:i], da, *e.args[i + 1 :]))
        return _add(terms, e.shape)
    if isinstance(e, RowSoftmax):
        dS = d(e.arg)
        if isinstance(dS, ZeroMatrix):
            return ZeroMatrix(*e.shape)
        return _softmax_tangent(e, dS)
    # scalars
    if isinstance(e, FrobeniusSq):
        A = e.arg
        dA = d(A)
        if isinstance(dA, ZeroMatrix):
            return sp.S.Zero
        # d ||A||^2 = 2 <A, dA>: kept as a scalar node family
        return 2 * FrobeniusInner(A, dA)
    if isinstance(e, FrobeniusInner):
        A, Bm = e.args
        return _scalar_add([FrobeniusInner(d(A), Bm), FrobeniusInner(A, d(Bm))])
    if isinstance(e, sp.Add):
        return sp.Add(*[d(a) for a in e.args])
    if isinstance(e, sp.Mul):
        terms = []
        for i, a in enumerate(e.args):
            terms.append(sp.Mul(*e.args[:i], d(a), *e.args[i + 1 :]))
        return sp.Add(*terms)
    if isinstance(e, (sp.Number, sp.Symbol)):
        return sp.S.Zero
    raise NotImplementedError(f"no tangent rule for {type(e).__name__}: {e}")


class FrobeniusInner(sp.Expr):
    """The scalar ``<A, B> = sum_ij A_ij B_ij``; zero when either side is a zero matrix."""

    is_commutative = True
    is_real = True

    def __new__(cls, A, B):
        if isinstance(A, ZeroMatrix) or isinstance(B, ZeroMatrix):
            return sp.S.Zero
        return super().__new__(cls, A, B)

    def _sympystr(self, printer):
        return f"<{printer._print(self.args[0])}, {printer._print(self.args[1])}>"


def _scalar_add(terms):
    return sp.Add(*terms)


# Reverse mode -------------------------------------------------------------------


def gradient(loss, wrt: MatrixSymbol):
    """Gradient of a scalar loss with respect to the matrix leaf ``wrt``.

    The loss must be a sum of terms ``c * FrobeniusSq(A)``. Each term seeds
    ``Abar = 2 c A`` and the adjoint rules carry it down to ``wrt``.
    """
    loss = sp.expand(loss)
    terms = loss.args if isinstance(loss, sp.Add) else (loss,)
    contributions = []
    for term in terms:
        coeff, rest = term.as_coeff_Mul()
        if not isinstance(rest, FrobeniusSq):
            raise NotImplementedError(f"gradient: loss term {term} is not c * ||A||_F^2")
        A = rest.arg
        seed = _mul(2 * coeff, A) if 2 * coeff != 1 else A
        contributions.extend(_pullback(A, seed, wrt))
    return _add(contributions, wrt.shape)


def _pullback(e, bar, wrt):
    """Contributions to dL/d(wrt) from node ``e`` receiving adjoint ``bar``."""
    if isinstance(e, MatrixSymbol):
        return [bar] if e == wrt else []
    if isinstance(e, (OneMatrix, ZeroMatrix, sp.Identity)):
        return []
    if not e.has(wrt):
        return []
    if isinstance(e, MatAdd):
        return [c for a in e.args for c in _pullback(a, bar, wrt)]
    if isinstance(e, MatMul):
        coeff, mats = e.as_coeff_matrices()
        out = []
        for i, m in enumerate(mats):
            if not m.has(wrt):
                continue
            left = [Transpose(a).doit(deep=False) for a in reversed(mats[:i])]
            right = [Transpose(a).doit(deep=False) for a in reversed(mats[i + 1 :])]
            factors = ([coeff] if coeff != 1 else []) + left + [bar] + right
            out.extend(_pullback(m, MatMul(*factors) if len(factors) > 1 else bar, wrt))
        return out
    if isinstance(e, Transpose):
        return _pullback(e.arg, Transpose(bar).doit(deep=False), wrt)
    if isinstance(e, HadamardProduct):
        out = []
        for i, a in enumerate(e.args):
            if a.has(wrt):
                out.extend(_pullback(a, hadamard(bar, *e.args[:i], *e.args[i + 1 :]), wrt))
        return out
    if isinstance(e, RowSoftmax):
        return _pullback(e.arg, _softmax_tangent(e, bar), wrt)
    raise NotImplementedError(f"no adjoint rule for {type(e).__name__}: {e}")
