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
    from proofs_check.region import Region

    r = 0.5 * cert["grad_norm"] / cert["constants"]["m"]
    # the region with it (recheck compares the region first, and it depends on the radius)
    bad = dict(cert, radius=r, region=Region.around(p, res.X, r).as_dict())
    with pytest.raises(CertificateMismatchError, match="radius inequality"):
        recheck(bad, p, res.X)


def test_output_gradient_enclosure_against_the_reference_and_mpmath():
    """The attention-output gradient in ball arithmetic (two heads, bias, d_v != d) against jax.grad
    of the plain transcription, and one entry against mpmath central differences at 40 digits."""
    import jax
    import mpmath

    from proofs_check import reference as ref
    from proofs_check.rigorous import gradient_enclosure
    from solver import planted_instance

    p, Xt = planted_instance(3, 5, heads=2, variant="output", bias=True, d_v=2, seed=5)
    X = Xt + 1e-2 * np.random.default_rng(1).normal(size=Xt.shape)
    mid, rad = gradient_enclosure(p, X)
    g_ref = np.asarray(jax.grad(ref.output_loss)(X, p.W, p.U, p.W_V, p.B, p.Gamma, p.X0))
    np.testing.assert_allclose(mid, g_ref, atol=1e-14)
    assert np.all(rad <= 2 * np.spacing(np.abs(mid)) + 1e-30)
    with mpmath.workdps(40):
        def loss(Z):
            total = mpmath.mpf(0)
            for h in range(p.heads):
                W, u, Wv = (np.asarray(a[h], np.float64) for a in (p.W, p.U, p.W_V))
                for i in range(p.n):
                    s = [sum(Z[a][i] * W[a, b] * Z[b][j] for a in range(p.d) for b in range(p.d))
                         + sum(u[a] * Z[a][j] for a in range(p.d)) for j in range(p.n)]
                    e = [mpmath.exp(v) for v in s]
                    f = [v / mpmath.fsum(e) for v in e]
                    for v in range(Wv.shape[1]):
                        o = mpmath.fsum(f[j] * Z[a][j] * Wv[a, v] for j in range(p.n) for a in range(p.d))
                        total += (o - float(p.B[h, i, v])) ** 2 / 2
            return total
        Z = [[mpmath.mpf(float(v)) for v in row] for row in X]
        hstep = mpmath.mpf("1e-15")
        Zp, Zm = [row[:] for row in Z], [row[:] for row in Z]
        Zp[2][1] += hstep
        Zm[2][1] -= hstep
        g = (loss(Zp) - loss(Zm)) / (2 * hstep)
    assert abs(float(g) - mid[2, 1]) <= rad[2, 1] + 1e-20 + 1e-12 * abs(mid[2, 1])


def test_output_certificate_bounds_the_gradient_in_ball_arithmetic():
    """Output variant, (4, 8), seed 27: with a float64 gradient and a factor-2 allowance the solver
    certified ||grad|| = 8.9e-17 where the reference transcription gives 2.1e-16, and recheck
    rejected its radius. The gradient is now a ball bound, and the certificate rechecks."""
    from solver import planted_instance
    from solver.recover import recover

    p, _ = planted_instance(4, 8, heads=1, variant="output", seed=27)
    res = recover(p, certify=False, validate=False, max_iter=60)
    assert res.status == "certified"
    if res.certificate.kind == "local-newton":
        assert res.certificate.constants["gradient"] == "arb"
    assert recheck(res.certificate, p, res.X)["status"] == "certified"
