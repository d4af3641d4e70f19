"""Log-domain Gauss-Newton-CG: the fast uncertified phase for attention maps with positive entries.

Row-wise, ``log softmax(S) = S - logsumexp(S)`` differs from the logits ``S`` by a constant, so
an attention map B determines its logits up to one constant per row, and ``P log(B) P``-type
identities (problem.md) follow. The loss

    L_log(X) = 1/2 sum_h || (X^T W_h X + 1 u_h^T X - log B_h) C ||_F^2 + 1/2 ||Gamma o (X - X0)||_F^2

(``C = I - 1 1^T / n`` removes the row constants) vanishes exactly where ``softmax(X^T W_h X +
1 u_h^T X) = B_h`` for every head, the zeros of the problem's loss ``1/2 sum_h ||softmax(.) -
B_h||^2`` (with Gamma = 0). Its residual is a quadratic polynomial in X, without the softmax's
1/n scaling of the derivatives, so its linear systems are far better conditioned: conjugate
gradients need about 20 products per step (about 100 in all from a start 1e-3 away) at (d, n,
H) = (32, 64, 2), where Newton-CG on the problem's own loss needed 150-330 per step (measured
with a prototype). ``benchmarks/recover_bench.py peers``: 12 ms to ||grad L|| <= 1e-10 there,
jaxopt LBFGS on the problem's loss 79 ms.

The iteration is Levenberg-Marquardt on the residual: Gauss-Newton systems ``(J^T J + shift I)
s = -grad`` (the Hessian without its residual term ``W V R^T + W^T V R``, which vanishes at an
exact zero, so the rate there is still quadratic, and costs a third of the product), solved by
truncated CG, steps accepted when L_log decreases. The whole iteration is one compiled XLA
loop: no host round trip per product.

What it is not: a certificate, or the problem's minimiser when B is noisy (then the two losses
have different minimisers, and Gauss-Newton converges only linearly to L_log's).
:func:`solver.recover.recover` runs it as a first, uncertified phase (regime
``uncertified-log-gauss-newton`` in the history), then Levenberg-Marquardt on the problem's own
loss and the certificate there, which decide the answer.

Checks (tests/test_logdomain.py): the gradient against its closed form ``sum_h W_h X R_h^T +
W_h^T X R_h + u_h 1^T R_h`` (plus the regulariser's), the closed-form Hessian product against
autodiff, and against a central difference of the closed-form gradient.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from . import _generated as gen
from .problem import ATTENTION, Problem


def _residual(X, WX, U, B):
    """Row-centred ``X^T W_h X + 1 u_h^T X - log B_h`` for every head, given ``WX = W_h X`` (H, d, n)."""
    R = jnp.einsum("ia,hib->hab", X, WX) + (U @ X)[:, None, :] - jnp.log(B)
    return R - jnp.mean(R, axis=2, keepdims=True)


def log_loss(X, W, U, B, Gamma, X0):
    """``L_log`` of the module docstring; same arguments as the generated ``attention_loss``."""
    R = _residual(X, jnp.einsum("hij,jb->hib", W, X), U, B)
    return 0.5 * jnp.sum(R * R) + gen.regulariser_loss(X, Gamma, X0)


log_grad = jax.grad(log_loss)


def log_hvp(X, V, W, U, B, Gamma, X0):
    """Hessian of :func:`log_loss` applied to V (forward over reverse)."""
    return jax.jvp(lambda Y: log_grad(Y, W, U, B, Gamma, X0), (X,), (V,))[1]


def log_hvp_at(X, W, U, B, Gamma, X0, gauss_newton: bool = False):
    """``V -> hess L_log(X) V`` in closed form, with everything that depends on X alone formed once.

    Per head, with ``A = W X``, ``A' = W^T X`` and the row-centred residual R:
    ``H V = J^T J V + W V R^T + W^T V R``, ``J V = (V^T A + A'^T V + 1 u^T V) C`` and
    ``J^T Y = A Y^T + A' Y + u 1^T Y`` (plus ``Gamma^2 o V``): 6 d n^2 + 2 d^2 n multiply-adds per
    head and product, no forward pass redone per product (jvp of the gradient would redo it).
    ``gauss_newton=True``: ``J^T J V + Gamma^2 o V`` only (4 d n^2 per head). Checked against
    :func:`log_hvp` in the tests.
    """
    A = jnp.einsum("hij,jb->hib", W, X)
    At = jnp.einsum("hji,jb->hib", W, X)
    R = _residual(X, A, U, B)
    G2 = Gamma * Gamma

    def hvp(V):
        dS = jnp.einsum("ia,hib->hab", V, A) + jnp.einsum("hia,ib->hab", At, V) + (U @ V)[:, None, :]
        Y = dS - jnp.mean(dS, axis=2, keepdims=True)
        out = jnp.einsum("hia,hba->ib", A, Y) + jnp.einsum("hia,hab->ib", At, Y) + U.T @ jnp.sum(Y, axis=1)
        if gauss_newton:
            return out + G2 * V
        WV = jnp.einsum("hij,jb->hib", W, V)
        WtV = jnp.einsum("hji,jb->hib", W, V)
        out = out + jnp.einsum("hia,hba->ib", WV, R) + jnp.einsum("hia,hab->ib", WtV, R)
        return out + G2 * V

    return hvp


def applies(problem: Problem) -> bool:
    """The log-domain phase needs attention maps with every entry positive (finite logs)."""
    return problem.variant == ATTENTION and bool(np.all(problem.B > 0))


@dataclass
class LogGaussNewtonInfo:
    """Outcome of :func:`log_gauss_newton`: steps taken, of them accepted, Gauss-Newton products,
    the final L_log, the final gradient norm of the *problem's* loss, and per accepted step that
    gradient norm before it, the problem's loss after it and the Newton decrement of L_log."""

    iterations: int
    accepted: int
    hvps: int
    log_loss: float
    grad_norm: float
    steps: list = field(default_factory=list)  # accepted steps: the problem's ||grad|| before, loss after


@functools.lru_cache(maxsize=4)
def _compiled(max_iter: int, cg_iter: int):
    grad_o = jax.jit(gen.attention_grad)
    loss_o = jax.jit(gen.attention_loss)

    def cg(X, b, shift, rtol, args):
        """Truncated CG on ``(H + shift I) s = b``; stops (flag) at the first non-positive curvature."""

        hvp = log_hvp_at(X, *args, gauss_newton=True)

        def A(v):
            return hvp(v) + shift * v

        bn = jnp.sqrt(jnp.sum(b * b))

        def cond(c):
            k, s, r, p, rr, bad = c
            return (k < cg_iter) & (jnp.sqrt(rr) > rtol * bn) & ~bad

        def body(c):
            k, s, r, p, rr, bad = c
            Ap = A(p)
            pAp = jnp.sum(p * Ap)
            bad = pAp <= 0
            a = rr / jnp.where(bad, 1.0, pAp)
            s2, r2 = s + a * p, r - a * Ap
            rr2 = jnp.sum(r2 * r2)
            p2 = r2 + rr2 / rr * p
            keep = lambda old, new: jnp.where(bad, old, new)  # noqa: E731
            return k + 1, keep(s, s2), keep(r, r2), keep(p, p2), keep(rr, rr2), bad

        z = jnp.zeros_like(b)
        k, s, _, _, _, bad = jax.lax.while_loop(cond, body, (jnp.int32(0), z, b, b, jnp.sum(b * b), False))
        return s, bad, k

    def gnorm(g):
        return jnp.sqrt(jnp.sum(g * g))

    @jax.jit
    def run(X0, gtol, args):
        # the carry holds go = ||grad L(X)||, the problem's gradient norm: one evaluation per step
        def cond(c):
            X, f, g, go, mu, it, acc, rej, hv, tr = c
            # rejected steps only raise the shift, unless the log loss's gradient is at its floor
            floor = (rej >= 3) & (gnorm(g) <= 1e-8)
            return (go > gtol) & (it < max_iter) & ~floor & (mu < 1e12)

        def body(c):
            X, f, g, go, mu, it, acc, rej, hv, tr = c
            gn = gnorm(g)
            # LM shift proportional to ||grad|| near a non-degenerate minimiser
            # forcing 0.1 min(1, sqrt ||grad L_log||) (superlinear), but no tighter than the problem's
            # gradient needs: ||grad L|| / ||grad L_log|| is nearly constant near a zero, so a relative
            # residual 0.3 gtol / ||grad L|| suffices for the last step (measured: 30% fewer products)
            rtol = jnp.maximum(0.1 * jnp.minimum(1.0, jnp.sqrt(gn)), 0.3 * gtol / go)
            s, bad, k = cg(X, -g, mu * jnp.minimum(1.0, gn), jnp.clip(rtol, 1e-16, 0.5), args)
            Xn = X + s
            fn = log_loss(Xn, *args)
            ok = (~bad) & jnp.isfinite(fn) & (fn < f)
            # per step: ||grad L|| before it, L after it, the Newton decrement of L_log, accepted
            dec = jnp.sqrt(jnp.maximum(-jnp.sum(g * s), 0.0))
            tr = tr.at[it].set(jnp.stack([go, loss_o(Xn, *args), dec, ok.astype(go.dtype)]))
            X, f = jnp.where(ok, Xn, X), jnp.where(ok, fn, f)
            g = jnp.where(ok, log_grad(X, *args), g)
            go = jnp.where(ok, gnorm(grad_o(X, *args)), go)
            return (X, f, g, go,
                    jnp.where(ok, jnp.maximum(mu / 3, 1e-14), mu * 4), it + 1, acc + ok.astype(jnp.int32),
                    jnp.where(ok, jnp.int32(0), rej + 1),
                    hv + k, tr)

        f0 = log_loss(X0, *args)
        g0 = log_grad(X0, *args)
        zero = jnp.int32(0)
        init = (X0, f0, g0, gnorm(grad_o(X0, *args)), 1e-3 * jnp.maximum(1.0, jnp.abs(f0)), zero, zero, zero, zero,
                jnp.zeros((max_iter, 4), X0.dtype))
        X, f, _, go, _, it, acc, _, hv, tr = jax.lax.while_loop(cond, body, init)
        return X, f, it, acc, hv, go, tr

    return run


def log_gauss_newton(problem: Problem, X, *, gtol: float = 1e-10, max_iter: int = 50,
                     cg_iter: int = 500) -> tuple[np.ndarray, LogGaussNewtonInfo]:
    """Levenberg-Marquardt (Gauss-Newton systems, truncated CG) on :func:`log_loss`, from X (d, n).

    Stops when the gradient of the *problem's* loss is at most ``gtol``, after ``max_iter``
    Newton steps, when the shift exceeds 1e12, or after three rejected steps in a row with
    ``||grad L_log|| <= 1e-8`` (the log loss's rounding floor, or a minimiser of L_log that is
    not one of L when B is noisy). Returns ``(X, LogGaussNewtonInfo)``;
    X is never worse in L_log than the start, and always finite.
    """
    if not applies(problem):
        raise ValueError("log_gauss_newton needs the attention-map variant with every entry of B positive")
    args = tuple(jnp.asarray(a, jnp.float64) for a in problem._args)
    Xs, f, it, acc, hv, gn, tr = _compiled(int(max_iter), int(cg_iter))(jnp.asarray(X, jnp.float64), float(gtol), args)
    Xs = np.asarray(Xs, np.float64)
    if not np.all(np.isfinite(Xs)):  # every accepted step had a finite loss; kept as a guard
        Xs = np.asarray(X, np.float64)
    steps = [{"grad_norm": float(t[0]), "loss": float(t[1]), "newton_decrement": float(t[2])}
             for t in np.asarray(tr)[: int(it)] if t[3] > 0]
    return Xs, LogGaussNewtonInfo(iterations=int(it), accepted=int(acc), hvps=int(hv), log_loss=float(f),
                                  grad_norm=float(gn), steps=steps)


__all__ = ["log_loss", "log_grad", "log_hvp", "log_hvp_at", "applies", "log_gauss_newton", "LogGaussNewtonInfo"]
