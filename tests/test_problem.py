"""Bad input gets a typed error naming the argument, the index and the rule."""

import numpy as np
import pytest

from solver import InvalidProblemError, Problem


def _good(n=4, d=3, H=2):
    rng = np.random.default_rng(0)
    return rng.normal(size=(H, d, d)), rng.dirichlet(np.ones(n), size=(H, n))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda W, B: (W[..., :2], B), r"W: each head must be square"),
        (lambda W, B: (W[0, 0], B), r"W: expected shape"),
        (lambda W, B: (W, B[:, :, :3]), r"B: attention maps must be square"),
        (lambda W, B: (W, B[:1]), r"B: 1 heads but W has 2"),
        (lambda W, B: (np.where(np.arange(9).reshape(3, 3) == 4, np.nan, W), B), r"W\[0, 1, 1\] is nan"),
        (lambda W, B: (W, np.where(np.arange(16).reshape(4, 4) == 5, np.inf, B)), r"B\[0, 1, 1\] is inf"),
        (lambda W, B: (W, B * np.array([1, 1, 0.7, 1])[None, :, None]), r"B\[0\] row 2 sums to .*must sum to 1 \(tolerance"),
        (lambda W, B: (W, B - 0.3 * (np.arange(4) == 1)[None, None, :] + 0.1), r"entry .* attention entries must be >= 0"),
        (lambda W, B: (W, "abc"), r"B: "),
    ],
)
def test_bad_attention_inputs(mutate, match):
    W, B = mutate(*_good())
    with pytest.raises(InvalidProblemError, match=match):
        Problem.create(W, B)


def test_bad_regulariser_and_bias():
    W, B = _good()
    with pytest.raises(InvalidProblemError, match=r"gamma\[1, 2\] is -1; regulariser weights must be >= 0"):
        Problem.create(W, B, gamma=np.where(np.arange(12).reshape(3, 4) == 6, -1.0, 1.0))
    with pytest.raises(InvalidProblemError, match=r"gamma: expected a scalar or shape \(3, 4\)"):
        Problem.create(W, B, gamma=np.ones(4))  # no silent broadcasting
    with pytest.raises(InvalidProblemError, match=r"X0: expected shape \(3, 4\)"):
        Problem.create(W, B, X0=np.zeros((4, 3)))
    with pytest.raises(InvalidProblemError, match=r"u: expected shape"):
        Problem.create(W, B, u=np.ones(4))


def test_bad_output_inputs():
    rng = np.random.default_rng(1)
    W = rng.normal(size=(3, 3))
    with pytest.raises(InvalidProblemError, match=r"W_V: expected 3 rows"):
        Problem.create(W, rng.normal(size=(4, 2)), W_V=rng.normal(size=(2, 2)))
    with pytest.raises(InvalidProblemError, match=r"B: expected d_v = 2 columns"):
        Problem.create(W, rng.normal(size=(4, 5)), W_V=rng.normal(size=(3, 2)))
    # output B need not be stochastic
    p = Problem.create(W, rng.normal(size=(4, 2)), W_V=rng.normal(size=(3, 2)))
    assert p.variant == "output" and p.n == 4


def test_check_X_and_fingerprint():
    W, B = _good()
    p = Problem.create(W, B)
    with pytest.raises(InvalidProblemError, match=r"X: expected shape \(3, 4\)"):
        p.check_X(np.zeros((4, 3)))
    with pytest.raises(InvalidProblemError, match=r"X\[0, 0\] is nan"):
        p.check_X(np.full((3, 4), np.nan))
    B2 = B.copy()
    B2[0, 0, [0, 1]] += [1e-9, -1e-9]
    assert Problem.create(W, B2).fingerprint() != p.fingerprint()
    assert Problem.create(W.copy(), B.copy()).fingerprint() == p.fingerprint()
