"""Shared strategies and instance builders for the property tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from solver import Problem


def random_instance(seed: int, d: int, n: int, heads: int, *, bias: bool, output: bool, reg: bool,
                    x_scale: float = 1.0, w_scale: float = 1.0, d_v: int = 3):
    """A problem with random (not planted) data and a random point X, direction V."""
    rng = np.random.default_rng(seed)
    W = rng.normal(scale=w_scale / np.sqrt(d), size=(heads, d, d))
    U = rng.normal(size=(heads, d)) / np.sqrt(d) if bias else None
    X = rng.normal(scale=x_scale, size=(d, n))
    V = rng.normal(size=(d, n))
    gamma = rng.uniform(0.1, 2.0, size=(d, n)) if reg else 0.0
    X0 = rng.normal(size=(d, n)) if reg else None
    if output:
        Wv = rng.normal(size=(heads, d, d_v)) / np.sqrt(d)
        B = rng.normal(size=(heads, n, d_v))
        return Problem.create(W, B, u=U, W_V=Wv, gamma=gamma, X0=X0), X, V
    B = rng.dirichlet(np.ones(n), size=(heads, n))
    return Problem.create(W, B, u=U, gamma=gamma, X0=X0), X, V


instances = st.builds(
    random_instance,
    seed=st.integers(0, 2**31 - 1),
    # sizes from a fixed menu spanning 1..16 and 1..32, so JIT compilations are reused
    d=st.sampled_from([1, 2, 3, 5, 8, 16]),
    n=st.sampled_from([1, 2, 4, 7, 16, 32]),
    heads=st.integers(1, 3),
    bias=st.booleans(),
    output=st.booleans(),
    reg=st.booleans(),
    x_scale=st.sampled_from([0.03, 0.3, 1.0, 3.0]),
    w_scale=st.sampled_from([0.1, 1.0, 10.0]),
)
