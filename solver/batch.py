"""Many independent instances of one shape, evaluated and solved as one batch.

A :class:`ProblemBatch` stacks N :class:`~solver.problem.Problem` objects of one
shape (all heads of a layer as separate problems, many prompts, the checker's
random instances) on a new leading axis. Every operation is the generated
kernel under ``jax.vmap``, split over the devices with ``jax.shard_map`` on a
one-axis mesh ``("batch",)``: each device runs its own slice, with no
communication between devices, so the sharded result equals the one-device
result to float64 rounding (tested in ``tests/test_scale.py``).

**Padding.** When the device count D does not divide N, the batch is padded
to the next multiple of D with copies of its last instance (and of the last
iterate); the padded rows are computed and dropped, so every function returns
exactly N rows. The memory estimate counts the padded rows.

**Memory.** Before anything is placed on a device, the per-device estimate of
:mod:`solver.memory` is compared with the budget; over it,
:class:`~solver.errors.MemoryBudgetError` names the sizes and the estimate.

**Several processes.** ``devices`` defaults to ``jax.devices()``, which after
``jax.distributed.initialize`` lists every process's devices; inputs are placed
with ``jax.make_array_from_callback`` (each process fills only its own shards;
every process must pass the same batch) and results are gathered with
``process_allgather``. See ``examples/distributed.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import _generated as gen
from .errors import InvalidProblemError
from .memory import require_within_budget
from .problem import ATTENTION, Problem

_AXIS = "batch"
_KERNELS = {
    ATTENTION: (gen.attention_loss, gen.attention_grad, gen.attention_hvp),
    "output": (gen.output_loss, gen.output_grad, gen.output_hvp),
}


@dataclass(frozen=True, eq=False)
class ProblemBatch:
    """N instances of one shape, stacked on axis 0. Build it with :meth:`from_problems`.

    - `data`: the kernels' data arguments, each with a leading axis of length N:
      ``(W, U, B, Gamma, X0)`` (attention maps) or ``(W, U, W_V, B, Gamma, X0)`` (outputs)
    - `variant`, `dtype`, `d`, `n`, `heads`, `d_v` (0 for attention maps)
    """

    data: tuple
    variant: str
    dtype: np.dtype
    d: int
    n: int
    heads: int
    d_v: int = 0

    @classmethod
    def from_problems(cls, problems) -> "ProblemBatch":
        """Stack problems of one (variant, dtype, d, n, heads, d_v); otherwise
        :class:`~solver.errors.InvalidProblemError` names the first one that differs."""
        problems = list(problems)
        if not problems:
            raise InvalidProblemError("batch: needs at least one problem, got none")
        for i, p in enumerate(problems):
            if not isinstance(p, Problem):
                raise InvalidProblemError(f"batch: item {i} is a {type(p).__name__}, expected a solver.Problem")
        shape = lambda p: (p.variant, np.dtype(p.dtype).name, p.d, p.n, p.heads,  # noqa: E731
                           0 if p.W_V is None else p.W_V.shape[-1])
        ref = shape(problems[0])
        for i, p in enumerate(problems[1:], start=1):
            if shape(p) != ref:
                raise InvalidProblemError(
                    f"batch: problem {i} has (variant, dtype, d, n, heads, d_v) = {shape(p)} but problem 0 has {ref}; "
                    f"a batch holds one shape: group the problems by shape and make one batch per group")
        names = ("W", "U", "B", "Gamma", "X0") if ref[0] == ATTENTION else ("W", "U", "W_V", "B", "Gamma", "X0")
        data = tuple(np.stack([getattr(p, k) for p in problems]) for k in names)
        return cls(data=data, variant=ref[0], dtype=np.dtype(ref[1]), d=ref[2], n=ref[3], heads=ref[4], d_v=ref[5])

    def __len__(self) -> int:
        return self.data[0].shape[0]

    def problem(self, i: int) -> Problem:
        """Instance ``i`` as a :class:`~solver.problem.Problem`."""
        a = [x[i] for x in self.data]
        if self.variant == ATTENTION:
            W, U, B, G, X0 = a
            Wv = None
        else:
            W, U, Wv, B, G, X0 = a
        return Problem.create(W, B, u=U if np.any(U != 0) else None, W_V=Wv, gamma=G, X0=X0, dtype=self.dtype)

    def check_X(self, X, name: str = "X") -> np.ndarray:
        Xa = np.asarray(X, dtype=self.dtype)
        if Xa.shape != (len(self), self.d, self.n):
            raise InvalidProblemError(f"{name}: expected shape ({len(self)}, {self.d}, {self.n}), got {Xa.shape}")
        if not np.all(np.isfinite(Xa)):
            raise InvalidProblemError(f"{name}: every entry must be finite (no NaN or Inf)")
        return Xa


# placement -----------------------------------------------------------------------------


def _devices(devices) -> tuple:
    devices = tuple(jax.devices() if devices is None else devices)
    if not devices:
        raise InvalidProblemError("batch: no devices given")
    return devices


def _pad(a: np.ndarray, to: int) -> np.ndarray:
    extra = to - a.shape[0]
    return a if extra == 0 else np.concatenate([a, np.repeat(a[-1:], extra, axis=0)])


def _place(arrays, devices) -> list:
    """Pad every array to a multiple of the device count and shard axis 0 over the mesh."""
    n_dev = len(devices)
    size = arrays[0].shape[0]
    total = -(-size // n_dev) * n_dev
    sharding = NamedSharding(Mesh(np.asarray(devices), (_AXIS,)), P(_AXIS))
    out = []
    for a in arrays:
        a = _pad(np.asarray(a), total)
        out.append(jax.make_array_from_callback(a.shape, sharding, lambda idx, a=a: a[idx]))
    return out


def _gather(x, size: int) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)[:size]


@lru_cache(maxsize=64)
def _compiled(body, devices: tuple, n_in: int, n_out: int):
    mesh = Mesh(np.asarray(devices), (_AXIS,))
    spec = P(_AXIS)
    out_specs = spec if n_out == 1 else (spec,) * n_out
    return jax.jit(jax.shard_map(jax.vmap(body), mesh=mesh, in_specs=(spec,) * n_in, out_specs=out_specs))


def _run(batch: ProblemBatch, op: str, body, inputs, devices, budget, n_out: int = 1):
    devices = _devices(devices)
    require_within_budget(op, batch.d, batch.n, batch.heads, dtype=batch.dtype, d_v=batch.d_v,
                          batch=len(batch), devices=len(devices), budget=budget)
    arrays = list(inputs) + list(batch.data)
    out = _compiled(body, devices, len(arrays), n_out)(*_place(arrays, devices))
    if n_out == 1:
        return _gather(out, len(batch))
    return tuple(_gather(o, len(batch)) for o in out)


# evaluation ----------------------------------------------------------------------------


def _kernel(batch: ProblemBatch, i: int):
    return _KERNELS[batch.variant][i]


def batch_loss(batch: ProblemBatch, X, *, devices=None, budget: int | None = None) -> np.ndarray:
    """Loss of every instance at its iterate: X (N, d, n) -> (N,)."""
    return _run(batch, "loss", _kernel(batch, 0), [batch.check_X(X)], devices, budget)


def batch_grad(batch: ProblemBatch, X, *, devices=None, budget: int | None = None) -> np.ndarray:
    """Gradient of every instance: X (N, d, n) -> (N, d, n)."""
    return _run(batch, "grad", _kernel(batch, 1), [batch.check_X(X)], devices, budget)


def batch_hvp(batch: ProblemBatch, X, V, *, devices=None, budget: int | None = None) -> np.ndarray:
    """Hessian-vector product of every instance: X, V (N, d, n) -> (N, d, n)."""
    return _run(batch, "hvp", _kernel(batch, 2), [batch.check_X(X), batch.check_X(V, "V")], devices, budget)


@lru_cache(maxsize=16)
def _gradient_check_body(variant: str):
    loss, grad, hvp = _KERNELS[variant]

    def body(X, V, *data):
        # central differences with step eps^(1/3) ||X|| / ||V||: error O(h^2) + O(eps / h)
        eps = jnp.finfo(X.dtype).eps
        h = eps ** (1 / 3) * (1 + jnp.linalg.norm(X)) / jnp.linalg.norm(V)
        dl = (loss(X + h * V, *data) - loss(X - h * V, *data)) / (2 * h)
        g = grad(X, *data)
        dg = (grad(X + h * V, *data) - grad(X - h * V, *data)) / (2 * h)
        hv = hvp(X, V, *data)
        scale_g = jnp.linalg.norm(g) * jnp.linalg.norm(V) + eps
        scale_h = jnp.linalg.norm(hv) + jnp.linalg.norm(dg) + eps
        return jnp.abs(dl - jnp.sum(g * V)) / scale_g, jnp.linalg.norm(dg - hv) / scale_h

    return body


def batch_gradient_check(batch: ProblemBatch, X, V, *, devices=None, budget: int | None = None):
    """Check the generated gradient and HVP of every instance against central differences.

    Returns ``(grad_error, hvp_error)``, each (N,): the relative error of
    ``<grad L(X), V>`` against the difference quotient of L, and of ``hess L(X) V``
    against the difference quotient of the gradient, with step
    ``eps^(1/3) (1 + ||X||) / ||V||``; both are O(eps^(2/3)) when the kernels agree.
    """
    return _run(batch, "hvp", _gradient_check_body(batch.variant), [batch.check_X(X), batch.check_X(V, "V")],
                devices, budget, n_out=2)


@lru_cache(maxsize=16)
def _newton_body(variant: str, iterations: int, cg_iterations: int):
    loss, grad, hvp = _KERNELS[variant]

    def body(X, *data):
        f0 = loss(X, *data)
        shift0 = 1e-3 * jnp.maximum(1.0, jnp.abs(f0))

        def step(_, state):
            X, f, shift = state
            g = grad(X, *data)
            s, _ = jax.scipy.sparse.linalg.cg(lambda V: hvp(X, V, *data) + shift * V, -g, maxiter=cg_iterations)
            Xn = X + s
            fn = loss(Xn, *data)
            accept = jnp.isfinite(fn) & (fn < f)
            X = jnp.where(accept, Xn, X)
            f = jnp.where(accept, fn, f)
            shift = jnp.where(accept, jnp.maximum(shift / 3, 1e-14), jnp.minimum(shift * 4, 1e12))
            return X, f, shift

        X, f, _ = jax.lax.fori_loop(0, iterations, step, (X, f0, shift0))
        return X, f, jnp.linalg.norm(grad(X, *data))

    return body


def batch_newton(batch: ProblemBatch, X, *, iterations: int = 20, cg_iterations: int = 50, devices=None,
                 budget: int | None = None):
    """A fixed number of Levenberg-Marquardt Newton iterations on every instance at once.

    Each iteration solves ``(hess L + shift I) s = -grad L`` with at most
    ``cg_iterations`` conjugate-gradient steps on the generated HVP, accepts the
    step when the loss decreases (then shift / 3, else shift * 4). This is the
    uncertified globalisation of :func:`solver.recover.recover`, batched; certify
    a returned iterate with ``recover(batch.problem(i), X_init=X[i])``.

    Returns ``(X, loss, grad_norm)`` with shapes (N, d, n), (N,), (N,).
    """
    if iterations < 0 or cg_iterations < 1:
        raise InvalidProblemError(f"batch_newton: iterations = {iterations} (>= 0) and cg_iterations = "
                                  f"{cg_iterations} (>= 1) required")
    return _run(batch, "newton", _newton_body(batch.variant, int(iterations), int(cg_iterations)),
                [batch.check_X(X)], devices, budget, n_out=3)


__all__ = ["ProblemBatch", "batch_loss", "batch_grad", "batch_hvp", "batch_gradient_check", "batch_newton"]
