"""The formulation of problem.md as SymPy expressions, and its derivation.

Convention: X is d x n, one column per token. For one head,

- logits       ``S = X^T W X + 1 u^T X``           (n x n; u = 0 is the paper's case)
- attention    ``F = softmax_rows(S)``
- matrix loss  ``L_att = 1/2 ||F - B||_F^2``         (B: n x n, rows in the simplex)
- output loss  ``L_out = 1/2 ||F X^T W_V - B||_F^2`` (W_V: d x d_v, B: n x d_v)
- regulariser  ``L_reg = 1/2 ||Gamma o (X - X0)||_F^2``

Several heads add their head losses. Each :class:`Derivation` is data: the
loss, its gradient and its Hessian-vector product as SymPy matrix
expressions valid for every n, d (and d_v), derived by the chain rule of
:mod:`derivations.calculus`. The dense (dn) x (dn) Hessian is the matrix of
the HVP operator in the basis ``E_ab`` of d x n matrices (row-major
``vec``), assembled from the HVP in the generated code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp
from sympy import MatrixSymbol, OneMatrix

from .calculus import FrobeniusSq, RowSoftmax, gradient, hadamard, tangent

n, d, dv = sp.symbols("n d d_v", integer=True, positive=True)

X = MatrixSymbol("X", d, n)
V = MatrixSymbol("V", d, n)  # the direction of a Hessian-vector product
W = MatrixSymbol("W", d, d)
u = MatrixSymbol("u", d, 1)
B_att = MatrixSymbol("B", n, n)
W_V = MatrixSymbol("W_V", d, dv)
B_out = MatrixSymbol("B", n, dv)
Gamma = MatrixSymbol("Gamma", d, n)
X0 = MatrixSymbol("X0", d, n)


def logits(X=X, W=W, u=u):
    """``S = X^T W X + 1 u^T X``."""
    return X.T * W * X + OneMatrix(X.shape[1], 1) * u.T * X


def attention(X=X, W=W, u=u):
    """``F = softmax_rows(S)``."""
    return RowSoftmax(logits(X, W, u))


@dataclass(frozen=True)
class Derivation:
    """One loss term and its derivatives, as expressions.

    **Fields**

    - `name`: identifier used for the generated functions (``<name>_loss`` ...).
    - `description`: the definition in words.
    - `params`: the leaves other than ``X`` in the order of the generated
      functions' arguments; vectors (``u``) are d x 1 leaves taking shape (d,).
    - `loss`, `grad`, `hvp`: SymPy expressions; ``hvp`` is linear in ``V``.
    """

    name: str
    description: str
    params: tuple
    loss: sp.Expr
    grad: sp.MatrixExpr = field(init=False)
    hvp: sp.MatrixExpr = field(init=False)

    def __post_init__(self):
        g = gradient(self.loss, X)
        object.__setattr__(self, "grad", g)
        object.__setattr__(self, "hvp", tangent(g, {X: V}))

    def formulas(self) -> dict[str, str]:
        return {"loss": sp.sstr(self.loss), "gradient": sp.sstr(self.grad), "hvp": sp.sstr(self.hvp)}


def attention_head() -> Derivation:
    F = attention()
    return Derivation(
        name="attention_head",
        description="1/2 ||softmax(X^T W X + 1 u^T X) - B||_F^2 (one head of the attention-matrix loss)",
        params=(W, u, B_att),
        loss=sp.Rational(1, 2) * FrobeniusSq(F - B_att),
    )


def output_head() -> Derivation:
    F = attention()
    return Derivation(
        name="output_head",
        description="1/2 ||softmax(X^T W X + 1 u^T X) X^T W_V - B||_F^2 (one head of the attention-output loss)",
        params=(W, u, W_V, B_out),
        loss=sp.Rational(1, 2) * FrobeniusSq(F * X.T * W_V - B_out),
    )


def regulariser() -> Derivation:
    return Derivation(
        name="regulariser",
        description="1/2 ||Gamma o (X - X0)||_F^2 (entrywise weights Gamma >= 0, prior X0)",
        params=(Gamma, X0),
        loss=sp.Rational(1, 2) * FrobeniusSq(hadamard(Gamma, X - X0)),
    )


def all_derivations() -> tuple[Derivation, ...]:
    return (attention_head(), output_head(), regulariser())
