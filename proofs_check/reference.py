"""Plain JAX transcriptions of the definitions in problem.md.

Written directly from the formulas, independently of the symbolic derivation
and the code generator, so that ``jax.grad`` / ``jax.jvp`` / ``jax.hessian`` of
these functions are an independent check of the generated kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def logits(X, W, u):
    """S = X^T W X + 1 u^T X for one head; X (d, n), W (d, d), u (d,)."""
    return X.T @ W @ X + (u @ X)[None, :]


def attention(X, W, u):
    S = logits(X, W, u)
    E = jnp.exp(S - jnp.max(S, axis=1, keepdims=True))
    return E / jnp.sum(E, axis=1, keepdims=True)


def regulariser_loss(X, Gamma, X0):
    return 0.5 * jnp.sum((Gamma * (X - X0)) ** 2)


def attention_loss(X, W, U, B, Gamma, X0):
    """sum_h 1/2 ||F_h(X) - B_h||_F^2 + 1/2 ||Gamma o (X - X0)||_F^2; W (H,d,d), U (H,d), B (H,n,n)."""
    total = regulariser_loss(X, Gamma, X0)
    for h in range(W.shape[0]):
        total = total + 0.5 * jnp.sum((attention(X, W[h], U[h]) - B[h]) ** 2)
    return total


def outputs(X, W, U, Wv):
    """Every head's attention output ``F_h(X) X^T Wv_h``, stacked: (H, n, dv)."""
    return jnp.stack([attention(X, W[h], U[h]) @ X.T @ Wv[h] for h in range(W.shape[0])])


def output_loss(X, W, U, Wv, B, Gamma, X0):
    """sum_h 1/2 ||F_h(X) X^T Wv_h - B_h||_F^2 + regulariser; Wv (H,d,dv), B (H,n,dv)."""
    total = regulariser_loss(X, Gamma, X0)
    for h in range(W.shape[0]):
        total = total + 0.5 * jnp.sum((attention(X, W[h], U[h]) @ X.T @ Wv[h] - B[h]) ** 2)
    return total


def hvp(loss, X, V, *args):
    """Forward-over-reverse Hessian-vector product of ``loss`` at X along V."""
    return jax.jvp(lambda Y: jax.grad(loss)(Y, *args), (X,), (V,))[1]
