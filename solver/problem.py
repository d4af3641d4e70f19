"""One instance of the recovery problem, validated, with its loss and derivatives.

Shapes (X is d x n, one column per token):

- ``W``: (d, d) or (H, d, d), the heads' ``W_h = W_q,h W_k,h^T / sqrt(d_head)``
- ``B``: attention-matrix variant (n, n) or (H, n, n), rows in the simplex;
  attention-output variant (n, d_v) or (H, n, d_v)
- ``u``: (d,) or (H, d), key-bias term (default 0)
- ``W_V``: (d, d_v) or (H, d, d_v); giving it selects the attention-output variant
- ``gamma``: scalar or (d, n) entrywise weights ``Gamma >= 0`` of the regulariser
- ``X0``: (d, n) prior of the regulariser (default 0)

The loss is ``sum_h L_h(X) + 1/2 ||Gamma o (X - X0)||_F^2`` with the head
losses of problem.md; its gradient, Hessian-vector product and dense Hessian
are the generated kernels of :mod:`solver._generated`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np

from . import _generated as gen
from .errors import InvalidProblemError

ATTENTION = "attention"
OUTPUT = "output"

_KERNELS = {
    ATTENTION: tuple(jax.jit(f) for f in (gen.attention_loss, gen.attention_grad, gen.attention_hvp, gen.attention_hessian)),
    OUTPUT: tuple(jax.jit(f) for f in (gen.output_loss, gen.output_grad, gen.output_hvp, gen.output_hessian)),
}


def row_sum_tolerance(n: int, dtype) -> float:
    """Tolerance for ``|sum_j B_ij - 1|``: 1e-6, or ``4 n eps`` when the dtype's rounding is larger."""
    return max(1e-6, 4.0 * n * float(np.finfo(dtype).eps))


def _array(name: str, value, dtype=None) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidProblemError(f"{name}: cannot be read as a numeric array ({exc})") from exc
    if arr.dtype.kind not in "fiu":
        raise InvalidProblemError(f"{name}: expected a real numeric array, got dtype {arr.dtype}")
    return arr


def check_finite(name: str, arr: np.ndarray) -> None:
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidProblemError(f"{name}{list(idx)} is {arr[idx]}; every entry must be finite (no NaN or Inf)")


def _stack(name: str, arr: np.ndarray, ndim: int, shape_doc: str) -> np.ndarray:
    if arr.ndim == ndim:
        return arr[None]
    if arr.ndim == ndim + 1:
        return arr
    raise InvalidProblemError(f"{name}: expected shape {shape_doc}, got {arr.shape}")


def check_attention_rows(B: np.ndarray, tol: float | None = None, name: str = "B") -> None:
    """Raise unless every row of every head of ``B`` (H, n, n) is a probability vector."""
    tol = row_sum_tolerance(B.shape[-1], B.dtype) if tol is None else tol
    neg = B < 0
    if neg.any():
        h, i, j = (int(k) for k in np.argwhere(neg)[0])
        raise InvalidProblemError(f"{name}[{h}] entry ({i}, {j}) is {B[h, i, j]:.3g}; attention entries must be >= 0")
    err = np.abs(B.sum(axis=-1) - 1.0)
    if (err > tol).any():
        h, i = (int(k) for k in np.argwhere(err > tol)[0])
        raise InvalidProblemError(
            f"{name}[{h}] row {i} sums to {B[h, i].sum():.6g}; attention rows must sum to 1 (tolerance {tol:.1e})"
        )


@dataclass(frozen=True, eq=False)
class Problem:
    """A validated instance. Build it with :meth:`Problem.create`.

    **Fields** (all NumPy arrays of one floating dtype, heads stacked on axis 0)

    - `W` (H, d, d), `B` (H, n, n) or (H, n, d_v), `U` (H, d),
      `W_V` (H, d, d_v) or None, `Gamma` (d, n), `X0` (d, n)
    - `variant`: ``"attention"`` or ``"output"``
    - `has_bias`: whether a non-zero key bias u was given
    """

    W: np.ndarray
    B: np.ndarray
    U: np.ndarray
    W_V: np.ndarray | None
    Gamma: np.ndarray
    X0: np.ndarray
    variant: str
    has_bias: bool

    # construction -------------------------------------------------------------

    @classmethod
    def create(cls, W, B, *, u=None, W_V=None, gamma=0.0, X0=None, dtype=None) -> "Problem":
        """Validate the inputs and build a Problem.

        **Arguments**

        - `W`: (d, d) or (H, d, d).
        - `B`: (n, n) / (H, n, n) attention maps, or (n, d_v) / (H, n, d_v)
          attention outputs when `W_V` is given.
        - `u`: key bias, (d,) or (H, d); default 0.
        - `W_V`: value matrices, (d, d_v) or (H, d, d_v); selects the output variant.
        - `gamma`: regulariser weights, scalar or (d, n), all >= 0.
        - `X0`: regulariser prior, (d, n); default 0.
        - `dtype`: ``float64`` (default when any input is float64 or not float)
          or ``float32`` (only when asked for, or when every float input is float32).

        Raises :class:`~solver.errors.InvalidProblemError` naming the argument,
        the offending index and the rule.
        """
        Wa = _array("W", W)
        Ba = _array("B", B)
        if dtype is None:
            floats = [a for a in (Wa, Ba) if a.dtype.kind == "f"]
            dtype = np.float32 if floats and all(a.dtype == np.float32 for a in floats) else np.float64
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise InvalidProblemError(f"dtype: expected float32 or float64, got {dtype}")
        Wa = _stack("W", Wa.astype(dtype), 2, "(d, d) or (H, d, d)")
        if Wa.shape[-1] != Wa.shape[-2]:
            raise InvalidProblemError(f"W: each head must be square (d, d), got {Wa.shape[-2:]}")
        H, d = Wa.shape[0], Wa.shape[-1]
        if H == 0 or d == 0:
            raise InvalidProblemError(f"W: needs at least one head and d >= 1, got shape {Wa.shape}")
        check_finite("W", Wa)

        variant = ATTENTION if W_V is None else OUTPUT
        Ba = Ba.astype(dtype)
        if variant == ATTENTION:
            Ba = _stack("B", Ba, 2, "(n, n) or (H, n, n)")
            if Ba.shape[-1] != Ba.shape[-2]:
                raise InvalidProblemError(f"B: attention maps must be square (n, n), got {Ba.shape[-2:]}")
            Va = None
        else:
            Va = _stack("W_V", _array("W_V", W_V).astype(dtype), 2, "(d, d_v) or (H, d, d_v)")
            if Va.shape[1] != d:
                raise InvalidProblemError(f"W_V: expected {d} rows (d of W), got shape {Va.shape}")
            if Va.shape[0] != H:
                raise InvalidProblemError(f"W_V: {Va.shape[0]} heads but W has {H}")
            check_finite("W_V", Va)
            Ba = _stack("B", Ba, 2, "(n, d_v) or (H, n, d_v)")
            if Ba.shape[-1] != Va.shape[-1]:
                raise InvalidProblemError(f"B: expected d_v = {Va.shape[-1]} columns (from W_V), got {Ba.shape[-1]}")
        if Ba.shape[0] != H:
            raise InvalidProblemError(f"B: {Ba.shape[0]} heads but W has {H}; give one B per head")
        n = Ba.shape[1]
        if n == 0:
            raise InvalidProblemError("B: needs n >= 1 positions")
        check_finite("B", Ba)
        if variant == ATTENTION:
            check_attention_rows(Ba)

        if u is None:
            Ua, has_bias = np.zeros((H, d), dtype), False
        else:
            Ua = _array("u", u).astype(dtype)
            Ua = _stack("u", Ua, 1, "(d,) or (H, d)")
            if Ua.shape != (H, d):
                raise InvalidProblemError(f"u: expected shape ({d},) or ({H}, {d}), got {np.shape(u)}")
            check_finite("u", Ua)
            has_bias = bool(np.any(Ua != 0))

        Ga = _array("gamma", gamma).astype(dtype)
        if Ga.ndim == 0:
            Ga = np.full((d, n), Ga, dtype)
        elif Ga.shape != (d, n):
            raise InvalidProblemError(f"gamma: expected a scalar or shape ({d}, {n}), got {Ga.shape}")
        check_finite("gamma", Ga)
        if (Ga < 0).any():
            idx = tuple(int(k) for k in np.argwhere(Ga < 0)[0])
            raise InvalidProblemError(f"gamma{list(idx)} is {Ga[idx]:.3g}; regulariser weights must be >= 0")

        if X0 is None:
            X0a = np.zeros((d, n), dtype)
        else:
            X0a = _array("X0", X0).astype(dtype)
            if X0a.shape != (d, n):
                raise InvalidProblemError(f"X0: expected shape ({d}, {n}), got {X0a.shape}")
            check_finite("X0", X0a)

        return cls(W=Wa, B=Ba, U=Ua, W_V=Va, Gamma=Ga, X0=X0a, variant=variant, has_bias=has_bias)

    def with_regulariser(self, gamma, X0=None) -> "Problem":
        """The same data with another regulariser (weights ``gamma``, prior ``X0``)."""
        return Problem.create(
            self.W, self.B, u=self.U if self.has_bias else None, W_V=self.W_V, gamma=gamma,
            X0=self.X0 if X0 is None else X0, dtype=self.dtype,
        )

    def in_float64(self) -> "Problem":
        """This instance in float64 (itself when it is already): what `solver.recover.recover` solves
        and certifies, so a certificate's fingerprint is that of this promotion (float32 values are
        exact in float64)."""
        if self.dtype == np.float64:
            return self
        return Problem.create(self.W, self.B, u=self.U if self.has_bias else None, W_V=self.W_V, gamma=self.Gamma,
                              X0=self.X0, dtype=np.float64)

    # sizes ------------------------------------------------------------------------

    @property
    def dtype(self):
        return self.W.dtype

    @property
    def heads(self) -> int:
        return self.W.shape[0]

    @property
    def d(self) -> int:
        return self.W.shape[-1]

    @property
    def n(self) -> int:
        return self.B.shape[1]

    @property
    def gamma_min(self) -> float:
        return float(self.Gamma.min())

    # loss and derivatives ---------------------------------------------------------------

    @cached_property
    def _args(self) -> tuple:
        data = (self.W, self.U, self.B) if self.variant == ATTENTION else (self.W, self.U, self.W_V, self.B)
        # concrete arrays even when first reached inside a jax.jit trace (a cached tracer would leak)
        with jax.ensure_compile_time_eval():
            return tuple(jnp.asarray(a) for a in data + (self.Gamma, self.X0))

    def check_X(self, X, name: str = "X") -> jnp.ndarray:
        """Validate a (d, n) iterate and return it as a JAX array of the problem's dtype."""
        Xa = _array(name, X)
        if Xa.shape != (self.d, self.n):
            raise InvalidProblemError(f"{name}: expected shape ({self.d}, {self.n}), got {Xa.shape}")
        check_finite(name, Xa)
        return jnp.asarray(Xa, dtype=self.dtype)

    def loss(self, X) -> jnp.ndarray:
        return _KERNELS[self.variant][0](jnp.asarray(X, self.dtype), *self._args)

    def grad(self, X) -> jnp.ndarray:
        return _KERNELS[self.variant][1](jnp.asarray(X, self.dtype), *self._args)

    def hvp(self, X, V) -> jnp.ndarray:
        return _KERNELS[self.variant][2](jnp.asarray(X, self.dtype), jnp.asarray(V, self.dtype), *self._args)

    def hessian(self, X) -> jnp.ndarray:
        """Dense (dn, dn) Hessian, row-major vec. Small problems only: memory is 8 (dn)^2 bytes."""
        return _KERNELS[self.variant][3](jnp.asarray(X, self.dtype), *self._args)

    # identity ------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """SHA-256 over the variant, dtype, shapes and bytes of every array."""
        h = hashlib.sha256()
        h.update(f"{self.variant}|{self.dtype}|".encode())
        for name in ("W", "B", "U", "W_V", "Gamma", "X0"):
            a = getattr(self, name)
            if a is None:
                h.update(f"{name}:none|".encode())
                continue
            a = np.ascontiguousarray(a)
            h.update(f"{name}:{a.shape}|".encode())
            h.update(a.tobytes())
        return h.hexdigest()

    def logits(self, X) -> np.ndarray:
        """S_h = X^T W_h X + 1 u_h^T X for every head, (H, n, n)."""
        X = np.asarray(X, dtype=self.dtype)
        return np.einsum("an,hab,bm->hnm", X, self.W, X) + (self.U @ X)[:, None, :]


def planted_instance(d: int, n: int, heads: int = 2, *, variant: str = ATTENTION, bias: bool = False,
                     d_v: int | None = None, seed: int = 0, logit_scale: float = 1.0):
    """A random instance with a known answer: ``(problem, X_true)``.

    W_h ~ N(0, 1/d) (full rank with probability 1), X ~ N(0, 1) scaled so the
    logits are O(logit_scale), u_h ~ N(0, 1/d) when ``bias``; B is computed
    from X_true exactly (float64). The regulariser is off (gamma = 0).
    """
    if d < 1 or n < 1 or heads < 1:
        raise InvalidProblemError(f"planted_instance: need d, n, heads >= 1, got {d}, {n}, {heads}")
    rng = np.random.default_rng(seed)
    W = rng.normal(scale=1.0 / np.sqrt(d), size=(heads, d, d))
    X = rng.normal(size=(d, n)) * np.sqrt(logit_scale) / d**0.25
    U = rng.normal(scale=1.0 / np.sqrt(d), size=(heads, d)) if bias else None
    S = np.einsum("an,hab,bm->hnm", X, W, X) + (np.zeros((heads, n)) if U is None else U @ X)[:, None, :]
    F = np.exp(S - S.max(axis=-1, keepdims=True))
    F /= F.sum(axis=-1, keepdims=True)
    if variant == ATTENTION:
        return Problem.create(W, F, u=U), X
    d_v = d if d_v is None else d_v
    Wv = rng.normal(scale=1.0 / np.sqrt(d), size=(heads, d, d_v))
    Bout = np.einsum("hnm,am,hav->hnv", F, X, Wv)
    return Problem.create(W, Bout, u=U, W_V=Wv), X
