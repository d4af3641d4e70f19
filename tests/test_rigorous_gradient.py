"""Certificates with a ball-arithmetic gradient bound: the enclosure and recheck's use of it."""

import numpy as np
import pytest

from proofs_check.recheck import recheck


def test_gradient_enclosure_contains_float64_gradient_and_mpmath_value():
    """The ball-arithmetic gradient (certificates' ||grad||) against the generated kernel and mpmath."""
    import mpmath

    from proofs_check.rigorous import gradient_enclosure, gradient_norm_upper
    from solver import planted_instance

    p, Xt = planted_instance(3, 6, heads=2, bias=True, seed=3)
    X = Xt + 1e-2 * np.random.default_rng(0).normal(size=Xt.shape)
    mid, rad = gradient_enclosure(p, X)
    np.testing.assert_allclose(mid, np.asarray(p.grad(X)), atol=1e-14)
    assert np.all(rad <= 2 * np.spacing(np.abs(mid)) + 1e-30)  # 128-bit balls: only the final float64 rounding
    # one entry by mpmath central differences of the loss at 40 digits (independent of both)
    with mpmath.workdps(40):
        def loss(Z):
            total = mpmath.mpf(0)
            for h in range(p.heads):
                for i in range(p.n):
                    s = [sum(mpmath.mpf(Z[a][i]) * mpmath.mpf(float(p.W[h][a, b])) * mpmath.mpf(Z[b][j])
                             for a in range(p.d) for b in range(p.d))
                         + sum(mpmath.mpf(float(p.U[h][a])) * mpmath.mpf(Z[a][j]) for a in range(p.d)) for j in range(p.n)]
                    e = [mpmath.exp(v) for v in s]
                    tot = mpmath.fsum(e)
                    total += mpmath.fsum((e[j] / tot - mpmath.mpf(float(p.B[h, i, j]))) ** 2 for j in range(p.n)) / 2
            return total
        Z = [[mpmath.mpf(float(v)) for v in row] for row in X]
        hstep = mpmath.mpf("1e-15")
        Zp = [row[:] for row in Z]
        Zm = [row[:] for row in Z]
        Zp[1][2] += hstep
        Zm[1][2] -= hstep
        g12 = (loss(Zp) - loss(Zm)) / (2 * hstep)
    assert abs(float(g12) - mid[1, 2]) <= rad[1, 2] + 1e-20 + 1e-12 * abs(mid[1, 2])
    assert gradient_norm_upper(p, X) >= np.linalg.norm(mid)


def test_arb_gradient_certificate_rejects_a_radius_below_the_theorem():
    """A certificate whose radius no longer satisfies m r > ||grad|| (ball bound) is refused by recheck."""
    from solver import planted_instance
    from solver.errors import CertificateMismatchError
    from solver.recover import recover

    p, _ = planted_instance(4, 8, heads=2, seed=2)
    res = recover(p, validate=False)
    cert = res.certificate.as_dict()
    assert cert["constants"]["gradient"] == "arb"
    assert recheck(cert, p, res.X)["gradient"] == "arb"
    bad = dict(cert, radius=0.5 * cert["grad_norm"] / cert["constants"]["m"])
    with pytest.raises(CertificateMismatchError, match="radius inequality"):
        recheck(bad, p, res.X)
