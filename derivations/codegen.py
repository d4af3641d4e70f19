"""Generate JAX code from the derivations: ``solver/_generated.py``.

The emitter walks each expression DAG once (shared subexpressions become one
assignment), orders every matrix-product chain by dynamic programming, and
prints products with all-ones matrices as row / column sums and broadcasts
rather than as dense matrix products. The softmax is ``jax.nn.softmax``,
which subtracts the row maximum, so logits of any magnitude are safe.

The output is deterministic (no dict or set iteration over hashed SymPy
objects) so that ``unmask derive --check`` can compare it byte for byte.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import sympy as sp
from sympy import HadamardProduct, MatAdd, MatMul, MatrixSymbol, OneMatrix, Transpose, ZeroMatrix
from sympy.printing.numpy import JaxPrinter

from .calculus import FrobeniusSq, RowSoftmax
from .losses import Derivation, V, X, all_derivations, d, dv, n

GENERATED_PATH = Path(__file__).resolve().parent.parent / "solver" / "_generated.py"

# Nominal sizes used only to choose the association order of product chains.
_NOMINAL = {n: 128, d: 64, dv: 64}
_SIZE_NAMES = {n: "n", d: "d", dv: "dv"}


def _dim(s) -> str:
    s = sp.sympify(s)
    if s in _SIZE_NAMES:
        return _SIZE_NAMES[s]
    if s.is_Integer:
        return str(int(s))
    raise NotImplementedError(f"dimension {s}")


def _nominal(s) -> int:
    return int(sp.sympify(s).subs(_NOMINAL))


class _Ones:
    """A column (r x 1) or row (1 x c) of ones in a product chain."""

    def __init__(self, rows, cols):
        self.shape = (rows, cols)


class Emitter:
    """Prints one function body in static single assignment form."""

    def __init__(self, argnames: dict):
        self.argnames = argnames
        self.lines: list[str] = []
        self.memo: dict = {}
        self.codes: dict[str, str] = {}
        self.counter = itertools.count()

    def _new(self, code: str) -> str:
        if code in self.codes:  # same text, same value: reuse it
            return self.codes[code]
        name = f"t{next(self.counter)}"
        self.lines.append(f"    {name} = {code}")
        self.codes[code] = name
        return name

    def emit(self, e) -> str:
        if e in self.memo:
            return self.memo[e]
        out = self._emit(e)
        self.memo[e] = out
        return out

    def _emit(self, e) -> str:
        if isinstance(e, (MatAdd, HadamardProduct)):
            # (A^T o B^T) is computed as (A o B)^T so that it shares A o B
            flipped = Transpose(e).doit()
            if flipped.count(Transpose) < e.count(Transpose):
                return self._new(f"{self.emit(flipped)}.T")
        if isinstance(e, MatrixSymbol):
            return self.argnames[e]
        if isinstance(e, ZeroMatrix):
            return self._new(f"jnp.zeros(({_dim(e.shape[0])}, {_dim(e.shape[1])}), dtype)")
        if isinstance(e, OneMatrix):
            return self._new(f"jnp.ones(({_dim(e.shape[0])}, {_dim(e.shape[1])}), dtype)")
        if isinstance(e, MatAdd):
            parts = []
            for a in sorted(e.args, key=sp.default_sort_key):
                coeff, mats = a.as_coeff_matrices() if isinstance(a, MatMul) else (1, [a])
                if coeff == -1:
                    body = self.emit(MatMul(*mats) if len(mats) > 1 else mats[0])
                    parts.append(("-", body))
                else:
                    parts.append(("+", self.emit(a)))
            parts.sort(key=lambda p: p[0] == "-")  # a leading term must not be negated
            code = parts[0][1] if parts[0][0] == "+" else f"-{parts[0][1]}"
            for sign, body in parts[1:]:
                code += f" {sign} {body}"
            return self._new(code)
        if isinstance(e, MatMul):
            coeff, mats = e.as_coeff_matrices()
            body = self._chain(list(mats))
            if coeff == 1:
                return body
            return self._new(f"{_scalar(coeff)} * {body}")
        if isinstance(e, Transpose):
            return self._new(f"{self.emit(e.arg)}.T")
        if isinstance(e, HadamardProduct):
            args = [self.emit(a) for a in sorted(e.args, key=sp.default_sort_key)]
            return self._new(" * ".join(args))
        if isinstance(e, RowSoftmax):
            return self._new(f"jax.nn.softmax({self.emit(e.arg)}, axis=-1)")
        if isinstance(e, FrobeniusSq):
            a = self.emit(e.arg)
            return self._new(f"jnp.sum({a} * {a})")
        if isinstance(e, sp.Mul):
            coeff, rest = e.as_coeff_Mul()
            return self._new(f"{_scalar(coeff)} * {self.emit(rest)}")
        if isinstance(e, sp.Add):
            return self._new(" + ".join(self.emit(a) for a in sorted(e.args, key=sp.default_sort_key)))
        raise NotImplementedError(f"cannot print {type(e).__name__}: {e}")

    # products -------------------------------------------------------------------

    def _chain(self, mats) -> str:
        factors = []
        for m in mats:
            if isinstance(m, OneMatrix):
                r, c = m.shape
                if r != 1:
                    factors.append(_Ones(r, 1))
                if c != 1:
                    factors.append(_Ones(1, c))
                if r == 1 and c == 1:
                    factors.append(_Ones(1, 1))
            else:
                factors.append(m)
        dims = [factors[0].shape[0]] + [f.shape[1] for f in factors]
        k = len(factors)
        cost = {(i, i): 0 for i in range(k)}
        split = {}
        for length in range(2, k + 1):
            for i in range(k - length + 1):
                j = i + length - 1
                best = None
                for s in range(i, j):
                    c = cost[(i, s)] + cost[(s + 1, j)] + _nominal(dims[i] * dims[s + 1] * dims[j + 1])
                    if best is None or c < best:
                        best, split[(i, j)] = c, s
                cost[(i, j)] = best
        return self._product(factors, dims, 0, k - 1, split)[0]

    def _product(self, factors, dims, i, j, split):
        """Returns (code, kind) with kind 'ones' for an all-ones block."""
        if i == j:
            f = factors[i]
            if isinstance(f, _Ones):
                return None, "ones"
            return self.emit(f), "mat"
        s = split[(i, j)]
        left, lk = self._product(factors, dims, i, s, split)
        right, rk = self._product(factors, dims, s + 1, j, split)
        p, q, r = dims[i], dims[s + 1], dims[j + 1]
        shape = f"({_dim(p)}, {_dim(r)})"
        if lk == "ones" and rk == "ones":
            return None, "ones"  # (p x q)(q x r) of ones is q * ones; q is 1 here by construction
        if rk == "ones":
            if sp.sympify(q) == 1:
                return self._new(f"jnp.broadcast_to({left}, {shape})"), "mat"
            code = f"jnp.sum({left}, axis=1, keepdims=True)"
            return self._new(code if sp.sympify(r) == 1 else f"jnp.broadcast_to({code}, {shape})"), "mat"
        if lk == "ones":
            if sp.sympify(q) == 1:
                return self._new(f"jnp.broadcast_to({right}, {shape})"), "mat"
            code = f"jnp.sum({right}, axis=0, keepdims=True)"
            return self._new(code if sp.sympify(p) == 1 else f"jnp.broadcast_to({code}, {shape})"), "mat"
        return self._new(f"{left} @ {right}"), "mat"


def _scalar(c) -> str:
    c = sp.sympify(c)
    if c.is_Integer:
        return f"{int(c)}.0"
    return f"({float(c)!r})"


def _argname(leaf) -> str:
    return {"B": "B", "W_V": "Wv", "Gamma": "Gamma", "X0": "X0", "W": "W", "u": "u"}[leaf.name]


def _function(name: str, expr, args: list, doc: str) -> str:
    argnames = {leaf: _argname(leaf) for leaf in args}
    argnames[X] = "X"
    argnames[V] = "V"
    signature = ["X"] + (["V"] if expr.has(V) else []) + [_argname(a) for a in args]
    em = Emitter(argnames)
    result = em.emit(expr)
    body_text = "\n".join(em.lines)
    header = [f"def {name}({', '.join(signature)}):", f'    """{doc}"""', "    d, n = X.shape"]
    if "dtype" in body_text:
        header.append("    dtype = X.dtype")
    if any(a.name == "W_V" for a in args) and "dv" in body_text:
        header.append("    dv = Wv.shape[1]")
    if any(a.name == "u" for a in args):
        header.append("    u = jnp.reshape(u, (d, 1))")
    body = em.lines
    return "\n".join(header + body + [f"    return {result}", "", ""])


def _head_functions(D: Derivation) -> str:
    args = list(D.params)
    parts = [
        _function(f"{D.name}_loss", D.loss, args, f"Loss: {D.description}."),
        _function(f"{D.name}_grad", D.grad, args, f"Gradient of {D.name}_loss with respect to X (d x n)."),
        _function(f"{D.name}_hvp", D.hvp, args, f"Hessian of {D.name}_loss applied to V (d x n)."),
    ]
    return "".join(parts)


_TEMPLATE = '''
# Assembly: sum over heads (leading axis of W, U, B[, Wv]) plus the regulariser,
# and the dense Hessian as the matrix of the HVP operator (row-major vec).


def _sum_heads(fn, X, heads, in_axes):
    return jnp.sum(jax.vmap(fn, in_axes=in_axes)(X, *heads), axis=0)


def attention_loss(X, W, U, B, Gamma, X0):
    """sum_h attention_head_loss(X, W[h], U[h], B[h]) + regulariser_loss(X, Gamma, X0)."""
    return _sum_heads(attention_head_loss, X, (W, U, B), (None, 0, 0, 0)) + regulariser_loss(X, Gamma, X0)


def attention_grad(X, W, U, B, Gamma, X0):
    """Gradient of attention_loss with respect to X (d x n)."""
    return _sum_heads(attention_head_grad, X, (W, U, B), (None, 0, 0, 0)) + regulariser_grad(X, Gamma, X0)


def attention_hvp(X, V, W, U, B, Gamma, X0):
    """Hessian of attention_loss applied to V (d x n)."""
    head = jax.vmap(attention_head_hvp, in_axes=(None, None, 0, 0, 0))(X, V, W, U, B)
    return jnp.sum(head, axis=0) + regulariser_hvp(X, V, Gamma, X0)


def attention_hessian(X, W, U, B, Gamma, X0):
    """Dense (dn) x (dn) Hessian of attention_loss; column k is the HVP of basis matrix k."""
    d, n = X.shape
    basis = jnp.eye(d * n, dtype=X.dtype).reshape(d * n, d, n)
    cols = jax.vmap(lambda E: attention_hvp(X, E, W, U, B, Gamma, X0))(basis)
    return cols.reshape(d * n, d * n).T


def output_loss(X, W, U, Wv, B, Gamma, X0):
    """sum_h output_head_loss(X, W[h], U[h], Wv[h], B[h]) + regulariser_loss(X, Gamma, X0)."""
    return _sum_heads(output_head_loss, X, (W, U, Wv, B), (None, 0, 0, 0, 0)) + regulariser_loss(X, Gamma, X0)


def output_grad(X, W, U, Wv, B, Gamma, X0):
    """Gradient of output_loss with respect to X (d x n)."""
    return _sum_heads(output_head_grad, X, (W, U, Wv, B), (None, 0, 0, 0, 0)) + regulariser_grad(X, Gamma, X0)


def output_hvp(X, V, W, U, Wv, B, Gamma, X0):
    """Hessian of output_loss applied to V (d x n)."""
    head = jax.vmap(output_head_hvp, in_axes=(None, None, 0, 0, 0, 0))(X, V, W, U, Wv, B)
    return jnp.sum(head, axis=0) + regulariser_hvp(X, V, Gamma, X0)


def output_hessian(X, W, U, Wv, B, Gamma, X0):
    """Dense (dn) x (dn) Hessian of output_loss; column k is the HVP of basis matrix k."""
    d, n = X.shape
    basis = jnp.eye(d * n, dtype=X.dtype).reshape(d * n, d, n)
    cols = jax.vmap(lambda E: output_hvp(X, E, W, U, Wv, B, Gamma, X0))(basis)
    return cols.reshape(d * n, d * n).T
'''

_HEADER = '''# GENERATED FILE: DO NOT EDIT.
# Produced by `unmask derive` (python -m derivations) from the SymPy derivations in
# derivations/; `unmask derive --check` fails when this file is stale.
"""JAX kernels generated from the symbolic derivation of the unmask losses.

Shapes: X, V, Gamma, X0 are (d, n); per head W is (d, d), u is (d,), B is (n, n)
(attention-matrix loss) or (n, d_v) (attention-output loss), Wv is (d, d_v).
The assembled functions take stacked heads: W (H, d, d), U (H, d), B (H, ...).
All functions are pure, jit-able and vmap-able, and compute in the dtype of
their inputs (pass arrays of one dtype).
"""

import jax
import jax.numpy as jnp

'''


@functools.lru_cache(maxsize=1)
def generate_source() -> str:
    """The full text of ``solver/_generated.py`` (derived once per process)."""
    from .lemmas import bounds_source  # lemma constants share the generator

    parts = [_HEADER]
    for D in all_derivations():
        parts.append("\n")
        parts.append(_head_functions(D))
    parts.append(_TEMPLATE)
    parts.append(bounds_source())
    text = "".join(parts)
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip() + "\n"


def scalar_function(name: str, expr, args: list[sp.Symbol], doc: str) -> str:
    """Print a scalar SymPy expression as a JAX function of ``args``."""
    code = JaxPrinter().doprint(expr).replace("jax.numpy.", "jnp.")
    if "functools" in code or "numpy." in code.replace("jnp.", ""):
        raise NotImplementedError(f"scalar_function: unsupported construct in {code}")
    return f'def {name}({", ".join(str(a) for a in args)}):\n    """{doc}"""\n    return {code}\n'


def check(path: Path = GENERATED_PATH) -> tuple[bool, str]:
    """Whether ``path`` equals what the derivations generate now."""
    expected = generate_source()
    try:
        actual = Path(path).read_text()
    except FileNotFoundError:
        return False, f"{path} does not exist; run `unmask derive`"
    if actual == expected:
        return True, f"{path} is up to date"
    import difflib

    diff = list(difflib.unified_diff(actual.splitlines(), expected.splitlines(), "on disk", "generated", lineterm="", n=1))
    return False, f"{path} is stale ({len(diff)} diff lines); run `unmask derive`\n" + "\n".join(diff[:40])
