"""Generated gradient, HVP and dense Hessian against autodiff of a plain transcription.

Tolerance (float64): 1e-10 relative to the size of the quantity, plus the
rounding floor of the quantity itself. The floor is measured, not guessed:
the reference evaluated at inputs perturbed by a relative 4 eps (what one
rounding of each input does) differs from the unperturbed one by the
amount any backward-stable evaluation may differ; saturated softmaxes
(large logits) and cancellation in ``F o R - F o rowsum(F o R)`` make it
exceed 1e-10 relative, so the test allows 100 times that floor.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs_check import reference as ref
from solver import Problem
from tests.helpers import instances, random_instance

RTOL = 1e-10


def _compiled(loss):
    """``loss``, its gradient, HVP and Hessian under ``jax.jit``: one XLA compilation per shape instead of
    one per primitive (eager autodiff of the transcription took about 6 s per hypothesis example); the
    transcription differentiated is the same, and the perturbed reference shares the compilation."""
    return jax.jit(loss), jax.jit(jax.grad(loss)), jax.jit(functools.partial(ref.hvp, loss)), jax.jit(jax.hessian(loss))


COMPILED = {loss: _compiled(loss) for loss in (ref.attention_loss, ref.output_loss)}


def _reference(problem: Problem):
    p = problem
    if p.variant == "attention":
        return ref.attention_loss, (p.W, p.U, p.B, p.Gamma, p.X0)
    return ref.output_loss, (p.W, p.U, p.W_V, p.B, p.Gamma, p.X0)


def _perturbed(problem: Problem, seed: int = 0):
    """The reference's arguments with every input rounded once more (relative 4 eps)."""
    loss, args = _reference(problem)
    rng = np.random.default_rng(seed)
    eps = np.finfo(np.float64).eps
    return tuple(np.asarray(a) * (1 + 4 * eps * rng.choice([-1.0, 1.0], size=np.shape(a))) for a in args)


def _natural_scale(problem: Problem, *arrays) -> float:
    """Magnitude of the terms that cancel in the formulas: a bound on the absolute rounding floor."""
    m = lambda a: 1.0 + float(np.max(np.abs(a))) if a is not None else 1.0  # noqa: E731
    scale = problem.d * problem.n * m(problem.W) * m(problem.U) * m(problem.W_V) * m(problem.B) * m(problem.Gamma) ** 2
    for a in arrays:
        scale *= m(a) ** 2
    return scale


def _close(actual, expected, perturbed=None, rtol=RTOL, scale=0.0):
    actual, expected = np.asarray(actual), np.asarray(expected)
    floor = 0.0 if perturbed is None else 100 * float(np.max(np.abs(np.asarray(perturbed) - expected)))
    floor += 16 * np.finfo(np.float64).eps * scale
    err = float(np.max(np.abs(actual - expected)))
    allowed = rtol * float(np.max(np.abs(expected))) + floor + 1e-300
    assert err <= allowed, f"error {err:.2e} > allowed {allowed:.2e} (rounding floor {floor:.2e})"


@given(instances)
def test_gradient_and_hvp_match_autodiff(inst):
    problem, X, V = inst
    loss, args = _reference(problem)
    pargs = _perturbed(problem)
    scale = _natural_scale(problem, X, V)
    f, grad, hvp, _ = COMPILED[loss]
    _close(problem.loss(X), f(X, *args), f(X, *pargs), scale=scale)
    _close(problem.grad(X), grad(X, *args), grad(X, *pargs), scale=scale)
    _close(problem.hvp(X, V), hvp(X, V, *args), hvp(X, V, *pargs), scale=scale)


@given(instances.filter(lambda i: i[0].d * i[0].n <= 48))
@settings(max_examples=12)
def test_dense_hessian_matches_autodiff_and_is_symmetric(inst):
    problem, X, _ = inst
    loss, args = _reference(problem)
    dn = problem.d * problem.n
    H = np.asarray(problem.hessian(X))
    hessian = COMPILED[loss][3]
    perturbed = hessian(X, *_perturbed(problem)).reshape(dn, dn)
    _close(H, hessian(X, *args).reshape(dn, dn), perturbed, scale=_natural_scale(problem, X))
    assert np.max(np.abs(H - H.T)) <= 1e-12 * max(1.0, np.max(np.abs(H)))


@given(seed=st.integers(0, 2**31 - 1), bias=st.booleans(), output=st.booleans())
@settings(max_examples=10)
def test_central_finite_differences(seed, bias, output):
    problem, X, V = random_instance(seed, 3, 4, 2, bias=bias, output=output, reg=True)
    h = 1e-5  # central differences: error O(h^2 f''') + O(eps f / h) ~ 1e-10 .. 1e-11
    fd_dir = (problem.loss(X + h * V) - problem.loss(X - h * V)) / (2 * h)
    assert abs(float(fd_dir) - float(jnp.sum(problem.grad(X) * V))) <= 1e-7 * max(1.0, abs(float(fd_dir)))
    fd_hvp = (problem.grad(X + h * V) - problem.grad(X - h * V)) / (2 * h)
    hv = problem.hvp(X, V)
    assert np.max(np.abs(fd_hvp - hv)) <= 1e-6 * max(1.0, float(np.max(np.abs(hv))))


def test_kernels_are_jittable_and_vmappable():
    from solver import _generated as g

    problem, X, V = random_instance(0, 4, 6, 2, bias=True, output=False, reg=True)
    Xs = jnp.stack([X, 2 * X, -X])
    args = (problem.W, problem.U, problem.B, problem.Gamma, problem.X0)
    batched = jax.jit(jax.vmap(g.attention_grad, in_axes=(0,) + (None,) * 5))(Xs, *args)
    for k in range(3):
        np.testing.assert_allclose(batched[k], problem.grad(Xs[k]), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("scale", [1e2, 1e4])
def test_softmax_is_stable_for_huge_logits(scale):
    # logits up to `scale` in magnitude: no overflow, no NaN, derivatives finite
    rng = np.random.default_rng(3)
    d, n = 3, 5
    X = rng.normal(size=(d, n))
    X /= np.linalg.norm(X, axis=0)
    W = np.eye(d) * scale
    B = rng.dirichlet(np.ones(n), size=(1, n))
    problem = Problem.create(W, B, u=np.ones(d) * scale / 10, gamma=1.0)
    S = problem.logits(X)
    assert np.max(np.abs(S)) >= 0.5 * scale
    for value in (problem.loss(X), problem.grad(X), problem.hvp(X, X), problem.hessian(X)):
        assert np.all(np.isfinite(value))


def test_dtype_follows_inputs():
    problem, X, V = random_instance(1, 3, 4, 1, bias=True, output=False, reg=False)
    p32 = Problem.create(problem.W.astype(np.float32), problem.B.astype(np.float32),
                         u=problem.U.astype(np.float32))
    assert p32.dtype == np.float32
    for value in (p32.loss(X), p32.grad(X), p32.hvp(X, V)):
        assert value.dtype == jnp.float32
    # float32 agrees with float64 to float32 precision (relative 1e-5 for O(1) data)
    np.testing.assert_allclose(p32.grad(X), problem.grad(X), rtol=1e-4, atol=1e-5)
