"""The log-domain Newton-CG phase: its derivatives against closed forms, its zeros, its use in recover."""

import jax.numpy as jnp
import numpy as np
import pytest

from solver import planted_instance
from solver.logdomain import applies, log_grad, log_hvp, log_loss, log_gauss_newton
from solver.problem import Problem
from solver.recover import recover
from solver.symmetry import distance_to_orbit


def _instance(seed=0, d=3, n=5, heads=2):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(heads, d, d))
    U = rng.normal(size=(heads, d))
    X = rng.normal(size=(d, n)) / d**0.5
    S = np.einsum("ia,hij,jb->hab", X, W, X) + (U @ X)[:, None, :]
    B = np.exp(S - S.max(axis=2, keepdims=True))
    B /= B.sum(axis=2, keepdims=True)
    Gamma = 0.3 * rng.random(size=(d, n))
    X0 = rng.normal(size=(d, n))
    return W, U, B, Gamma, X0, X


def _closed_form_grad(Y, W, U, B, Gamma, X0):
    """sum_h W_h Y R_h^T + W_h^T Y R_h + u_h 1^T R_h + Gamma^2 o (Y - X0), R_h the row-centred residual."""
    n = Y.shape[1]
    C = np.eye(n) - np.ones((n, n)) / n
    g = Gamma**2 * (Y - X0)
    for Wh, uh, Bh in zip(W, U, B):
        R = (Y.T @ Wh @ Y + np.outer(np.ones(n), uh @ Y) - np.log(Bh)) @ C
        g = g + Wh @ Y @ R.T + Wh.T @ Y @ R + np.outer(uh, R.sum(axis=0))
    return g


def test_gradient_matches_its_closed_form():
    W, U, B, Gamma, X0, _ = _instance()
    Y = np.random.default_rng(1).normal(size=X0.shape)
    got = np.asarray(log_grad(jnp.asarray(Y), W, U, B, Gamma, X0))
    want = _closed_form_grad(Y, W, U, B, Gamma, X0)
    # float64: both sides are O(10) sums of O(10) products, agreement to ~1e-13 relative
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


def test_hvp_matches_a_central_difference_of_the_closed_form_gradient():
    W, U, B, Gamma, X0, _ = _instance(seed=2)
    rng = np.random.default_rng(3)
    Y, V = rng.normal(size=X0.shape), rng.normal(size=X0.shape)
    h = 1e-5  # the gradient is a cubic polynomial: central difference error h^2 * O(|W| |V|^3), ~1e-9
    fd = (_closed_form_grad(Y + h * V, W, U, B, Gamma, X0) - _closed_form_grad(Y - h * V, W, U, B, Gamma, X0)) / (2 * h)
    got = np.asarray(log_hvp(jnp.asarray(Y), jnp.asarray(V), W, U, B, Gamma, X0))
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max())


def test_log_loss_vanishes_exactly_at_the_generating_input():
    W, U, B, _, _, X = _instance(seed=4)
    zero = np.zeros_like(X)
    at_truth = float(log_loss(jnp.asarray(X), W, U, B, zero, zero))
    moved = float(log_loss(jnp.asarray(X + 1e-3), W, U, B, zero, zero))
    assert at_truth <= 1e-24  # log(B) recomputed from B: residuals at the rounding of log, ~1e-15 each
    assert moved > 1e6 * at_truth + 1e-12


@pytest.mark.parametrize("d", [4, 8])
def test_log_gauss_newton_reaches_the_planted_input(d):
    problem, X = planted_instance(d, 2 * d, 2, seed=d)
    start = X + 1e-2 * np.random.default_rng(d).normal(size=X.shape)
    Xr, info = log_gauss_newton(problem, start, gtol=1e-10)
    assert np.all(np.isfinite(Xr))
    assert info.grad_norm <= 1e-10
    assert float(np.linalg.norm(problem.grad(Xr))) == pytest.approx(info.grad_norm, rel=1e-6, abs=1e-14)
    assert distance_to_orbit(problem, Xr, X) <= 1e-8
    assert info.accepted <= info.iterations and info.hvps > 0


def test_zeros_in_B_refuse_the_log_phase_and_recover_still_runs():
    problem, _ = planted_instance(3, 6, 2, seed=5)
    B = np.array(problem.B)
    B[:, 0, 1] = 0.0
    B[:, 0] /= B[:, 0].sum(axis=1, keepdims=True)
    zeros = Problem.create(problem.W, B)
    assert not applies(zeros)
    with pytest.raises(ValueError, match="positive"):
        log_gauss_newton(zeros, np.zeros((3, 6)))
    result = recover(zeros, certify=False, validate=False, restarts=2)
    assert all(s["regime"] != "uncertified-log-gauss-newton" for s in result.history)


def test_recover_runs_the_log_phase_and_still_certifies():
    from proofs_check.recheck import recheck

    problem, X = planted_instance(4, 8, 2, seed=6)
    result = recover(problem, X_init=X + 1e-2, validate=False)
    regimes = [s["regime"] for s in result.history]
    assert regimes[0] == "uncertified-log-gauss-newton"
    assert result.status == "certified"
    assert distance_to_orbit(problem, result.X, X) <= 1e-8
    assert recheck(result.certificate, problem, result.X)["status"] == "certified"


def test_closed_form_hvp_matches_autodiff():
    from solver.logdomain import log_hvp_at

    W, U, B, Gamma, X0, _ = _instance(seed=7, d=4, n=6, heads=3)
    rng = np.random.default_rng(8)
    Y, V = rng.normal(size=X0.shape), rng.normal(size=X0.shape)
    want = np.asarray(log_hvp(jnp.asarray(Y), jnp.asarray(V), W, U, B, Gamma, X0))
    got = np.asarray(log_hvp_at(jnp.asarray(Y), W, U, B, Gamma, X0)(jnp.asarray(V)))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


def test_gauss_newton_product_equals_the_hessian_product_at_an_exact_zero():
    from solver.logdomain import log_hvp_at

    W, U, B, Gamma, X0, X = _instance(seed=9, d=4, n=7, heads=2)
    V = np.random.default_rng(10).normal(size=X.shape)
    full = np.asarray(log_hvp(jnp.asarray(X), jnp.asarray(V), W, U, B, Gamma, X0))
    gn = np.asarray(log_hvp_at(jnp.asarray(X), W, U, B, Gamma, X0, gauss_newton=True)(jnp.asarray(V)))
    # the dropped term is linear in the residual, ~1e-15 at the generating X
    np.testing.assert_allclose(gn, full, rtol=1e-10, atol=1e-10 * np.abs(full).max())
    Y = X + 0.3 * np.random.default_rng(11).normal(size=X.shape)  # away from the zero the term is there
    far = np.asarray(log_hvp(jnp.asarray(Y), jnp.asarray(V), W, U, B, Gamma, X0))
    gn_far = np.asarray(log_hvp_at(jnp.asarray(Y), W, U, B, Gamma, X0, gauss_newton=True)(jnp.asarray(V)))
    assert np.abs(far - gn_far).max() > 1e-6 * np.abs(far).max()


def test_the_step_records_are_the_accepted_steps_and_the_gradient_falls():
    problem, X = planted_instance(8, 16, 2, seed=12)
    start = X + 1e-2 * np.random.default_rng(12).normal(size=X.shape)
    Xr, info = log_gauss_newton(problem, start, gtol=1e-10)
    assert len(info.steps) == info.accepted >= 2
    first = info.steps[0]
    assert first["grad_norm"] == pytest.approx(float(np.linalg.norm(problem.grad(start))), rel=1e-10)
    assert info.steps[-1]["loss"] == pytest.approx(float(problem.loss(Xr)), rel=1e-8, abs=1e-30)
    assert info.steps[-1]["grad_norm"] > info.grad_norm
