"""Exact preimages of attention outputs (solver.roots): the Kantorovich certificate and its inputs."""

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs_check.checker import check
from proofs_check.region import Region
from solver import InvalidProblemError, Problem, planted_instance
from solver.roots import add_root, find_roots, jacobian, kantorovich, polish, residual, residual_extended


def _outputs_mp(problem, X, digits=50):
    """O(X) - B evaluated in mpmath at ``digits`` digits, independently of the JAX and numpy code."""
    with mpmath.workdps(digits):
        W, U, Wv, B = problem.W[0], problem.U[0], problem.W_V[0], problem.B[0]
        d, n = X.shape
        Xm = mpmath.matrix(X.tolist())
        S = Xm.T * mpmath.matrix(W.tolist()) * Xm
        ux = mpmath.matrix(U.tolist()).T * Xm
        out = []
        for i in range(n):
            s = [S[i, j] + ux[0, j] for j in range(n)]
            m = max(s)
            e = [mpmath.exp(v - m) for v in s]
            tot = mpmath.fsum(e)
            x_mix = [mpmath.fsum(e[j] / tot * Xm[a, j] for j in range(n)) for a in range(d)]
            for v in range(Wv.shape[1]):
                out.append(mpmath.fsum(x_mix[a] * mpmath.mpf(float(Wv[a, v])) for a in range(d)) - mpmath.mpf(float(B[i, v])))
        return out


def _residual_norm_mp(problem, X, dX=None, digits=60):
    """||O(X + dX) - B|| from `_outputs_mp`, the centre summed in mpmath at `digits` digits."""
    with mpmath.workdps(digits):
        mp = np.vectorize(mpmath.mpf, otypes=[object])
        Z = mp(X) if dX is None else mp(X) + mp(dX)
        return float(mpmath.sqrt(mpmath.fsum(v * v for v in _outputs_mp(problem, Z, digits))))


@pytest.fixture(scope="module")
def two_roots():
    # seed 4 at (d, n) = (4, 8): the random starts land on three distinct certified roots
    p, Xt = planted_instance(4, 8, heads=1, variant="output", seed=4)
    return p, Xt, find_roots(p, starts=16, seed=104, include=[Xt], lm_iter=200)


def test_extended_residual_within_its_bound_against_mpmath():
    p, Xt = planted_instance(4, 8, heads=1, variant="output", seed=1)
    X = Xt + 1e-3 * np.random.default_rng(0).normal(size=Xt.shape)  # a point with a visible residual too
    for Y in (Xt, X):
        r, bound = residual_extended(p, Y)
        exact = np.array([float(v) for v in _outputs_mp(p, Y)])
        err = float(np.linalg.norm(r.astype(np.float64) - exact))
        assert err <= bound, (err, bound)
        assert bound < 1e-14  # the allowance is an extended-precision one, not a float64 one
        np.testing.assert_allclose(residual(p, Y), exact, atol=1e-13)


def test_jacobian_matches_finite_differences():
    p, Xt = planted_instance(4, 8, heads=1, variant="output", seed=2)
    J = jacobian(p, Xt)
    V = np.random.default_rng(1).normal(size=Xt.shape)
    h = 1e-6
    fd = (residual(p, Xt + h * V) - residual(p, Xt - h * V)) / (2 * h)
    np.testing.assert_allclose(J @ V.reshape(-1), fd, atol=1e-8)


def test_planted_root_certified_and_perturbed_point_refused():
    p, Xt = planted_instance(4, 8, heads=1, variant="output", seed=1)
    cert = kantorovich(p, polish(p, Xt))
    assert cert.exists and cert.h <= 0.5
    assert cert.radius < 1e-10 < cert.unique_radius
    far = kantorovich(p, Xt + 1e-2 * np.random.default_rng(2).normal(size=Xt.shape))
    assert not far.exists and far.h > 0.5


def test_two_distinct_exact_preimages_checked_in_mpmath(two_roots):
    """The output variant is not identifiable here: two inputs far apart give the same outputs."""
    p, Xt, roots = two_roots
    assert roots.count >= 2
    i, rel = roots.nearest(Xt)
    assert rel < 1e-10  # the planted X is one of them
    scale = float(np.linalg.norm(p.B))
    for c in roots.roots:
        assert c.exists
        exact = np.array([float(v) for v in _outputs_mp(p, c.X)])
        assert np.linalg.norm(exact) <= 1e-14 * scale  # independent of the certificate's own arithmetic
    others = [c for j, c in enumerate(roots.roots) if j != i]
    assert min(np.linalg.norm(c.X - Xt) / np.linalg.norm(Xt) for c in others) > 0.1


def test_add_root_keeps_one_copy(two_roots):
    _, _, roots = two_roots
    kept = list(roots.roots)
    assert not add_root(kept, roots.roots[0])
    assert len(kept) == roots.count


def test_curvature_lemma_is_checked_and_a_wrong_constant_fails():
    region = Region(d=3, n=6, heads=1, R=0.8, omega=1.2, mu=0.3, variant="output", d_v=3, omega_V=1.1, beta=1.0)
    assert check(region, instances=4, names=["output_map_curvature"], progress=False).ok
    assert not check(region, instances=4, names=["output_map_curvature"],
                     bound_scale={"output_map_curvature": 0.01}, progress=False).ok


def test_output_residual_ball_bound_contains_the_mpmath_residual():
    """320-bit ball residual at a float64 point and at a double-double one (X + dX, dX ~ 1e-17):
    its norm bound is above the 50-digit mpmath norm, and within 1e-40 of it."""
    from proofs_check.rigorous import output_residual_enclosure

    p, Xt = planted_instance(4, 8, heads=1, variant="output", bias=True, seed=3)
    dX = 1e-17 * np.random.default_rng(5).normal(size=(1, *Xt.shape))
    for Y, corr in ((Xt, None), (Xt + 1e-3, None), (Xt, dX)):
        mid, up = output_residual_enclosure(p, Y, corr)
        exact = _residual_norm_mp(p, Y, None if corr is None else corr[0])
        assert exact <= up <= exact + 1e-40, (exact, up)
        np.testing.assert_allclose(np.linalg.norm(mid), exact, rtol=1e-15)


@pytest.fixture(scope="module")
def ill_conditioned_root():
    # (8, 16), seed 37: s_min(J) = 6e-7 at the planted root, h = 10 at every float64 point
    p, Xt = planted_instance(8, 16, heads=1, variant="output", seed=37)
    Xp = polish(p, Xt)
    return p, Xp, kantorovich(p, Xp, refine=False), kantorovich(p, Xp)


def test_ill_conditioned_root_proved_at_a_double_double_centre(ill_conditioned_root):
    p, Xp, plain, cert = ill_conditioned_root
    assert not plain.exists and plain.h > 0.5 and plain.dX is None
    assert cert.exists and cert.dX is not None and cert.h <= 0.5
    # the centre's residual, recomputed in mpmath at 60 digits, is within the bound the test used
    r = _residual_norm_mp(p, cert.X, cert.dX[0])
    assert r <= cert.residual_norm < 1e-25
    dn = float(np.linalg.norm(cert.dX))
    assert dn <= cert.correction_norm and cert.radius >= dn  # radii moved to the returned X by ||dX||
    assert cert.radius < 1e-14 < cert.unique_radius
    # the returned X is the float64 point nearest the centre: |dX| at most half an ulp of X
    assert np.all(np.abs(cert.dX[0]) <= 0.5 * np.spacing(np.abs(cert.X)))
    assert np.linalg.norm(cert.X - Xp) < 1e-9  # and near the polished point the test was given


def test_recheck_of_a_double_double_root_certificate(ill_conditioned_root):
    import copy

    from proofs_check.recheck import recheck
    from solver.certificate import root_certificate
    from solver.errors import CertificateMismatchError
    from solver.symmetry import symmetries

    p, _, _, root = ill_conditioned_root
    cert = root_certificate(p, root.X, root, symmetries(p), None, iterations=0).as_dict()
    out = recheck(cert, p, root.X)
    assert out["status"] == "certified" and out["correction_norm"] > 0
    assert out["error_bound"] <= cert["error_bound"] * (1 + 1e-6)
    dX = np.asarray(cert["constants"]["dX"])
    for what, value, match in (("without its correction", np.zeros_like(dX), "h = "),
                               ("a correction 1e4 times too large", 1e4 * dX, "h = "),
                               ("a correction of the wrong size", dX[:-1], "entries")):
        forged = copy.deepcopy(cert)
        forged["constants"]["dX"] = value.tolist()
        with pytest.raises(CertificateMismatchError, match=match):
            recheck(forged, p, root.X)
    forged = copy.deepcopy(cert)
    forged["error_bound"] = 0.5 * cert["constants"]["correction_norm"]  # the distance to the centre is not covered
    with pytest.raises(CertificateMismatchError, match="error bound"):
        recheck(forged, p, root.X)


def test_damped_polish_reaches_an_ill_conditioned_root(monkeypatch):
    """(8, 16), seed 37 (s_min(J) = 6e-7 at the planted root): from 1e-4 (relative) along the
    Jacobian's smallest singular direction the full Newton step overshoots and never lowers ||r||;
    the damped steps reach the root, which Kantorovich's test then proves."""
    import solver.roots as roots

    p, Xt = planted_instance(8, 16, heads=1, variant="output", seed=37)
    v = np.linalg.svd(jacobian(p, Xt))[2][-1].reshape(Xt.shape)
    X0 = Xt + 1e-4 * np.linalg.norm(Xt) * v
    X = polish(p, X0)
    assert np.linalg.norm(X - Xt) <= 1e-10 * np.linalg.norm(Xt)
    assert kantorovich(p, X).exists
    monkeypatch.setattr(roots, "POLISH_HALVINGS", 0)  # full steps only: stuck where it started
    assert np.linalg.norm(polish(p, X0) - Xt) > 1e-5 * np.linalg.norm(Xt)


def test_polish_gives_up_on_a_positive_loss_minimum(monkeypatch):
    """Where ||r|| stalls (LM's end point from a random start, ||r|| ~ 1e-2) polish stops after one
    window of POLISH_WINDOW steps instead of running to max_iter, and never raises ||r||."""
    import solver.roots as roots
    from solver.newton import History, levenberg_marquardt

    # (8, 32), seed 3: from here damped steps keep lowering ||r|| by about 0.002% each, for 99 steps
    p, _ = planted_instance(8, 32, heads=1, variant="output", seed=3)
    X0 = levenberg_marquardt(p, np.random.default_rng(1).normal(scale=8**-0.25, size=(8, 32)), History(), 200, 1e-10)
    r0 = np.linalg.norm(residual(p, X0))
    assert r0 > 1e-6  # not a root
    calls = []
    real = roots.jacobian
    monkeypatch.setattr(roots, "jacobian", lambda *a: calls.append(1) or real(*a))
    X = polish(p, X0)
    assert len(calls) <= roots.POLISH_WINDOW + 1
    assert np.linalg.norm(residual(p, X)) <= r0


def test_bad_input():
    pa, _ = planted_instance(4, 8, heads=1, seed=0)
    with pytest.raises(InvalidProblemError, match="output variant"):
        kantorovich(pa, np.zeros((4, 8)))
    p2, X2 = planted_instance(4, 8, heads=2, variant="output", seed=0)
    with pytest.raises(InvalidProblemError, match="square"):
        polish(p2, X2)
    p, Xt = planted_instance(4, 8, heads=1, variant="output", seed=0)
    reg = Problem.create(p.W, p.B, W_V=p.W_V, gamma=0.1)
    with pytest.raises(InvalidProblemError, match="gamma = 0"):
        find_roots(reg, starts=1)
    with pytest.raises(InvalidProblemError, match="shape"):
        kantorovich(p, np.zeros((4, 7)))
    with pytest.raises(InvalidProblemError, match="finite"):
        kantorovich(p, np.full((4, 8), np.nan))


def test_recover_returns_a_rechecked_root_certificate():
    from proofs_check.recheck import recheck
    from solver.errors import CertificateMismatchError
    from solver.recover import recover

    # seed 2: Kantorovich's certificate, the local one failing by 6 orders (test_cli's Kantorovich test;
    # seed 4, used before, was on the edge of the local one and got it on some machines)
    p, Xt = planted_instance(4, 8, heads=1, variant="output", seed=2)
    res = recover(p, validate=False)
    assert res.status == "certified" and res.certificate.kind == "kantorovich-root"
    assert np.linalg.norm(residual(p, res.X)) < 1e-13
    out = recheck(res.certificate, p, res.X)
    assert out["kind"] == "kantorovich-root" and out["error_bound"] <= res.certificate.error_bound * (1 + 1e-6)
    forged = res.certificate.as_dict()
    forged["radius"] = 10 * forged["radius"]  # claims uniqueness on a larger ball than proved
    with pytest.raises(CertificateMismatchError, match="uniqueness radius"):
        recheck(forged, p, res.X)
    for key, factor in (("K", 0.99), ("h", 0.99 * out["h"] / res.certificate.constants["h"])):
        forged = res.certificate.as_dict()  # a smaller curvature, or a more comfortable h, than recomputed
        forged["constants"] = {**forged["constants"], key: factor * forged["constants"][key]}
        with pytest.raises(CertificateMismatchError, match=f"{key}: the certificate says"):
            recheck(forged, p, res.X)
    moved = res.X + 1e-3  # another X: the digest check fires first
    with pytest.raises(CertificateMismatchError):
        recheck(res.certificate, p, moved)


@given(d=st.sampled_from([2, 3, 4]), mult=st.sampled_from([2, 4]), bias=st.booleans(), seed=st.integers(0, 10**6))
@settings(max_examples=3)
def test_property_output_certificates_always_recheck(d, mult, bias, seed):
    """A square output system: every certified answer is accepted by recheck; otherwise labelled uncertified."""
    from proofs_check.recheck import recheck
    from solver.recover import recover

    p, _ = planted_instance(d, mult * d, heads=1, variant="output", bias=bias, seed=seed)
    res = recover(p, certify=False, validate=False, restarts=3)
    if res.status == "certified":  # by the local Newton certificate where lambda_min allows it (small d), else Kantorovich
        assert recheck(res.certificate, p, res.X)["status"] == "certified"
        if res.certificate.kind == "kantorovich-root":
            assert np.linalg.norm(residual(p, res.X)) <= 1e-12 * (1 + np.linalg.norm(p.B))
    else:
        assert res.certificate.status == "uncertified" and res.certificate.error_bound is None


def test_square_output_restarts_stop_at_the_first_proved_root():
    """Default restarts on a square output system: as many starts as it took to reach a proved root
    (at most SQUARE_OUTPUT_RESTARTS), and the answer is that root; restarts < 1 is refused."""
    from solver.errors import InvalidProblemError
    from solver.recover import SQUARE_OUTPUT_RESTARTS, recover

    p, _ = planted_instance(3, 6, heads=1, variant="output", seed=0)
    res = recover(p, certify=False, validate=False)
    assert res.init == "random-restarts" and 1 <= res.starts <= SQUARE_OUTPUT_RESTARTS
    if res.status == "certified":  # a start ended on a proved root (certified locally or by Kantorovich)
        # it stopped there: a later start would only have been tried had this one failed
        again = recover(p, certify=False, validate=False, restarts=res.starts)
        assert again.starts == res.starts and np.array_equal(again.X, res.X)
        assert np.linalg.norm(residual(p, res.X)) <= 1e-12 * (1 + np.linalg.norm(p.B))
    else:
        assert res.starts == SQUARE_OUTPUT_RESTARTS
    for bad in (0, 2.5, True):
        with pytest.raises(InvalidProblemError, match="restarts must be an integer >= 1"):
            recover(p, certify=False, validate=False, restarts=bad)
    for bad in (-1, 1.5, True):  # np.random.default_rng would raise a bare ValueError, or accept True as 1
        with pytest.raises(InvalidProblemError, match="seed must be a non-negative integer"):
            recover(p, certify=False, validate=False, seed=bad)
