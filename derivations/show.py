"""Readable forms of the derivations for ``unmask derive --show``.

Intermediate quantities get their names from problem.md (S, F, R, G, dS, dF)
by substituting symbols for the subexpressions they stand for.
"""

from __future__ import annotations

import sympy as sp
from sympy import MatrixSymbol

from .calculus import tangent
from .losses import V, X, all_derivations, attention, logits, n


def _named(expr):
    S_expr = logits()
    F_expr = attention()
    S, F, dS = MatrixSymbol("S", n, n), MatrixSymbol("F", n, n), MatrixSymbol("dS", n, n)
    dS_expr = tangent(S_expr, {X: V})
    out = expr.xreplace({F_expr: F}).xreplace({dS_expr: dS, S_expr: S})
    out = out.xreplace({sp.Transpose(F_expr): sp.Transpose(F)})
    return out


def describe() -> str:
    lines = [
        "Definitions: S = X^T W X + 1 u^T X (n x n), F = softmax_rows(S), J = all-ones (n x n),",
        "dS = V^T W X + X^T W V + 1 u^T V (the tangent of S along V). '1' is a ones matrix, 'o' = Hadamard.",
        "",
    ]
    for D in all_derivations():
        lines.append(f"[{D.name}] {D.description}")
        for label, expr in (("loss", D.loss), ("gradient", D.grad), ("hvp (V)", D.hvp)):
            text = sp.sstr(_named(expr)).replace("HadamardProduct", "hadamard")
            lines.append(f"  {label:9s} = {text}")
        lines.append("")
    lines.append("dense Hessian: the (dn) x (dn) matrix of the hvp operator, column k = hvp(E_k), row-major vec.")
    return "\n".join(lines)


__all__ = ["describe"]
