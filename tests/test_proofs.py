"""Exact proofs: closed forms equal explicit-entry differentiation (derivations.proofs).

Default run: every (d, n) with d*n <= 4 for the attention-matrix loss (2 heads,
with u) and the output loss (W_V, with u), plus one deterministic symbolic
proof. ``-m slow``: every (d, n) with d*n <= 12.
"""

import pytest

from derivations.proofs import prove, sizes_up_to

SMALL = sizes_up_to(4)
LARGE = [s for s in sizes_up_to(12) if s[0] * s[1] > 4]


@pytest.mark.parametrize("d,n", SMALL)
@pytest.mark.parametrize("variant,heads", [("attention", 2), ("output", 1)])
def test_small_sizes(variant, heads, d, n):
    r = prove(variant, d, n, heads=heads, bias=True)
    assert r.proved, r.line()
    assert r.failure_probability < 1e-25


def test_symbolic_proof_smallest():
    r = prove("attention", 1, 2, heads=1, bias=True, method="symbolic")
    assert r.proved and r.failure_probability == 0.0


def test_proof_detects_a_wrong_closed_form(monkeypatch):
    # corrupt the softmax adjoint rule (drop the row-sum term): the proof must fail
    from derivations import calculus

    original = calculus._softmax_tangent
    monkeypatch.setattr(calculus, "_softmax_tangent", lambda F, dS: calculus.hadamard(F, dS))
    try:
        r = prove("attention", 1, 2, heads=1, bias=True)
    finally:
        monkeypatch.setattr(calculus, "_softmax_tangent", original)
    assert not r.proved


@pytest.mark.slow
@pytest.mark.parametrize("d,n", LARGE)
@pytest.mark.parametrize("variant,heads", [("attention", 2), ("output", 1)])
def test_all_sizes_up_to_12(variant, heads, d, n):
    r = prove(variant, d, n, heads=heads, bias=True)
    assert r.proved, r.line()
