"""The loss is invariant under the symmetries of problem.md; their dimensions match it."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver import Problem
from solver.symmetry import group_element, symmetries
from tests.helpers import random_instance


def _loss(problem, X):
    return float(problem.loss(X))


@given(seed=st.integers(0, 2**31 - 1), d=st.integers(1, 8), n=st.integers(1, 12), heads=st.integers(1, 3))
def test_sign_flip_when_no_bias(seed, d, n, heads):
    problem, X, _ = random_instance(seed, d, n, heads, bias=False, output=False, reg=False)
    assert symmetries(problem).sign_flip
    assert abs(_loss(problem, -X) - _loss(problem, X)) <= 1e-12 * max(1.0, _loss(problem, X))


@given(seed=st.integers(0, 2**31 - 1), d=st.integers(1, 8), n=st.integers(1, 12))
def test_reflection_with_one_biased_head(seed, d, n):
    # W^T v = u is solvable for one invertible head: X -> -X - 2 v 1^T leaves B unchanged, -X does not
    problem, X, _ = random_instance(seed, d, n, 1, bias=True, output=False, reg=False)
    sym = symmetries(problem)
    assert sym.sign_flip
    Xr = -X - 2 * np.outer(sym.reflection_shift, np.ones(n))
    assert abs(_loss(problem, Xr) - _loss(problem, X)) <= 1e-10 * max(1.0, _loss(problem, X))


def test_no_reflection_with_generic_biased_heads_or_output():
    problem, X, _ = random_instance(0, 4, 6, 2, bias=True, output=False, reg=False)
    sym = symmetries(problem)
    assert not sym.sign_flip and sym.reflection_shift is None
    v = np.linalg.lstsq(np.vstack([W.T for W in problem.W]), problem.U.reshape(-1), rcond=None)[0]
    for Xr in (-X, -X - 2 * np.outer(v, np.ones(6))):  # neither candidate is a symmetry
        assert abs(_loss(problem, Xr) - _loss(problem, X)) > 1e-6
    problem, X, _ = random_instance(0, 4, 6, 1, bias=False, output=True, reg=False)
    assert not symmetries(problem).sign_flip


@given(seed=st.integers(0, 2**31 - 1), d=st.integers(2, 8), n=st.integers(1, 10), bias=st.booleans())
def test_stabiliser_orbit_leaves_loss_unchanged(seed, d, n, bias):
    problem, X, _ = random_instance(seed, d, n, 1, bias=bias, output=False, reg=False)
    sym = symmetries(problem)
    if sym.lie_algebra.shape[0] == 0:
        return
    rng = np.random.default_rng(seed)
    Q = group_element(sym, rng.normal(size=sym.lie_algebra.shape[0]))
    for Wh, uh in zip(problem.W, problem.U):
        np.testing.assert_allclose(Q.T @ Wh @ Q, Wh, atol=1e-10 * max(1.0, np.abs(Wh).max()))
        if sym.affine is None:
            np.testing.assert_allclose(Q.T @ uh, uh, atol=1e-10)
    moved = sym.act(Q, X)
    assert abs(_loss(problem, moved) - _loss(problem, X)) <= 1e-10 * max(1.0, _loss(problem, X))


def test_one_head_with_bias_has_the_affine_group():
    # problem.md's group (Q^T u = u) is too small for one head: all of Stab(W) acts affinely
    from tests.helpers import random_instance

    problem, X, _ = random_instance(5, 6, 9, 1, bias=True, output=False, reg=False)
    sym = symmetries(problem)
    assert sym.affine is not None and sym.lie_algebra.shape[0] == 3  # floor(6 / 2)
    Q = group_element(sym, np.array([0.5, -0.3, 0.8]))
    moved = sym.act(Q, X)
    assert np.linalg.norm(moved - X) > 0.1
    assert abs(_loss(problem, moved) - _loss(problem, X)) <= 1e-10 * max(1.0, _loss(problem, X))
    assert abs(_loss(problem, Q @ X) - _loss(problem, X)) > 1e-6  # the linear action alone is not a symmetry


@pytest.mark.parametrize("d,expected", [(2, 1), (3, 1), (4, 2), (5, 2), (8, 4)])
def test_generic_single_head_dimension(d, expected):
    rng = np.random.default_rng(d)
    problem = Problem.create(rng.normal(size=(d, d)), np.full((3, 3), 1 / 3))
    assert symmetries(problem).lie_algebra.shape[0] == expected


def test_special_heads_dimensions():
    rng = np.random.default_rng(0)
    d = 5
    A = rng.normal(size=(d, d))
    flat = np.full((1, 3, 3), 1 / 3)
    assert symmetries(Problem.create(A + A.T, flat)).lie_algebra.shape[0] == d * (d - 1) // 2
    assert symmetries(Problem.create(np.outer(rng.normal(size=d), rng.normal(size=d)), flat)).lie_algebra.shape[0] == (d - 1) ** 2
    assert symmetries(Problem.create(rng.normal(size=(2, d, d)), np.full((2, 3, 3), 1 / 3))).dimension == 0


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 10), bias=st.booleans())
def test_null_space_translations_leave_loss_unchanged(seed, n, bias):
    rng = np.random.default_rng(seed)
    d, rank = 5, 2  # a head of rank 2 < d leaves d - 2 translation directions
    W = rng.normal(size=(d, rank)) @ rng.normal(size=(rank, d))
    U = rng.normal(size=d) if bias else None
    problem = Problem.create(W, rng.dirichlet(np.ones(n), size=n), u=U)
    sym = symmetries(problem)
    assert sym.translations.shape[1] == d - rank
    X = rng.normal(size=(d, n))
    v = sym.translations @ rng.normal(size=d - rank)
    moved = X + 3.0 * np.outer(v, np.ones(n))
    assert abs(_loss(problem, moved) - _loss(problem, X)) <= 1e-10 * max(1.0, _loss(problem, X))
    # and a direction outside the null space changes it
    w = rng.normal(size=d)
    w -= sym.translations @ (sym.translations.T @ w)
    assert abs(_loss(problem, X + 3.0 * np.outer(w, np.ones(n))) - _loss(problem, X)) > 1e-8 or n == 1
