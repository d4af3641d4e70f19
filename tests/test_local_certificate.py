"""The local-Newton recheck at scale: the dense reference Hessian by blocks and, above
``RECHECK_EIGH_MAX``, the certificate's lambda_min proved by one shifted Cholesky factorisation
(checked here against exact eigenvalues at small size)."""

import json
import math

import jax
import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proofs_check.recheck as recheck_module
from proofs_check import reference as ref
from proofs_check.recheck import recheck
from proofs_check.rigorous import lambda_min_at_least, shift_to_prove
from solver import CertificateMismatchError, CertificationError, planted_instance
from solver.recover import recover


def _exact_lambda_min(A: np.ndarray) -> float:
    """lambda_min of the float64 matrix A (its entries taken exactly), in mpmath at 50 digits."""
    with mpmath.workdps(50):
        ev = mpmath.eigsy(mpmath.matrix(A.tolist()), eigvals_only=True)
        return float(min(ev))


def _symmetric_with_spectrum(rng, eigenvalues) -> np.ndarray:
    N = len(eigenvalues)
    Q = np.linalg.qr(rng.normal(size=(N, N)))[0]
    A = (Q * np.asarray(eigenvalues)) @ Q.T
    return (A + A.T) / 2  # exactly symmetric; its eigenvalues are near, not at, the ones asked for


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), N=st.integers(1, 12), decades=st.integers(0, 12),
       fraction=st.floats(-2.0, 1.5))
def test_shifted_cholesky_bound_never_exceeds_the_exact_lambda_min(seed, N, decades, fraction):
    """Whatever the shift, a returned bound is at most the exact lambda_min (mpmath, 50 digits),
    and a shift above lambda_min (by more than the rounding term) is refused, not bounded."""
    rng = np.random.default_rng(seed)
    A = _symmetric_with_spectrum(rng, np.logspace(-decades, 1, N) * rng.choice([-1.0, 1.0], p=[0.2, 0.8]))
    exact = _exact_lambda_min(A)
    t = fraction * abs(exact)
    bound = lambda_min_at_least(A, t)
    if bound is not None:
        assert bound <= exact
        assert bound <= t
    slack = 4 * (N + 2) * np.finfo(float).eps * float(np.abs(np.diag(A)).sum() + N * abs(t)) + 1e-300
    if t > exact + slack:
        assert bound is None


def test_shifted_cholesky_bound_covers_a_factorisation_that_succeeds_by_rounding():
    """Rank-deficient G G^T in float64: Cholesky often completes although the exact lambda_min of the
    stored matrix is negative (about -1e-16). Only the rounding term keeps the bound below it."""
    fooled = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        N = int(rng.integers(3, 9))
        G = rng.normal(size=(N, N - 1))
        A = G @ G.T
        A = (A + A.T) / 2
        exact = _exact_lambda_min(A)
        bound = lambda_min_at_least(A, 0.0)
        if bound is not None:
            assert bound <= exact
            fooled += exact < 0
    assert fooled >= 3  # the case this test is for did occur


def test_shifted_cholesky_bound_is_tight_for_a_well_scaled_matrix():
    rng = np.random.default_rng(3)
    A = _symmetric_with_spectrum(rng, np.logspace(-6, 0, 200))
    exact = float(np.linalg.eigvalsh(A)[0])  # within 1e-13 of the exact value: far inside the 1e-9 tested
    bound = lambda_min_at_least(A, 0.999 * exact)
    # the rounding term is about N u tr(A) = 200 * 1.1e-16 * 30: far below lambda_min = 1e-6
    assert bound is not None and 0.999 * exact - 1e-11 <= bound <= 0.999 * exact
    assert lambda_min_at_least(A, 1.001 * exact) is None


def test_shifted_cholesky_bound_refuses_bad_input():
    assert lambda_min_at_least(np.array([[1.0, np.nan], [np.nan, 1.0]]), 0.0) is None
    assert lambda_min_at_least(np.eye(2), math.inf) is None
    with pytest.raises(ValueError, match="square"):
        lambda_min_at_least(np.ones((2, 3)), 0.0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), N=st.integers(1, 12), decades=st.integers(0, 10), fraction=st.floats(0.0, 0.99))
def test_the_shift_to_prove_a_target_proves_it(seed, N, decades, fraction):
    """At ``shift_to_prove(A, target)`` a completed factorisation proves lambda_min >= target (and the
    exact lambda_min is indeed above the bound); for a target well below lambda_min it completes."""
    rng = np.random.default_rng(seed)
    A = _symmetric_with_spectrum(rng, np.logspace(-decades, 1, N))
    exact = _exact_lambda_min(A)
    target = fraction * exact
    t = shift_to_prove(A, target)
    bound = lambda_min_at_least(A, t)
    if bound is not None:
        assert target <= bound <= exact
    if exact - t > 4 * (N + 2) * np.finfo(float).eps * float(np.trace(A)):
        assert bound is not None


def test_blocked_reference_hessian_equals_jax_hessian(monkeypatch):
    problem, X = planted_instance(4, 8, 2, seed=5)
    X = X + 0.01 * np.random.default_rng(0).normal(size=X.shape)  # off the minimiser: a full Hessian
    loss, args = recheck_module._loss_and_args(problem)
    monkeypatch.setattr(recheck_module, "HESSIAN_BLOCK", 5)  # 32 = 6 blocks of 5 and a padded one
    H = recheck_module._reference_hessian(loss, X, args)
    full = np.asarray(jax.hessian(ref.attention_loss)(X, *args)).reshape(32, 32)
    assert np.allclose(H, (full + full.T) / 2, rtol=0, atol=1e-13 * np.abs(full).max())
    assert np.array_equal(H, H.T)


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 70), tile=st.integers(1, 32), seed=st.integers(0, 2**32 - 1))
def test_tiled_symmetrise_is_bitwise_the_whole_matrix_one(N, tile, seed):
    """``symmetrise`` by tiles (any tile size, N not a multiple of it) against ``(H + H^T) * 0.5`` taken
    over the whole matrix: the same float64 numbers, so issuer and recheck certificates do not move."""
    from solver.rounding import symmetrise

    H = np.random.default_rng(seed).normal(size=(N, N)) * 10.0 ** np.random.default_rng(seed + 1).integers(-8, 8, (N, N))
    expected = (H + H.T) * 0.5
    out = symmetrise(H, tile=tile)
    assert out is H
    assert np.array_equal(H, expected)
    with pytest.raises(ValueError, match="square"):
        symmetrise(np.zeros((3, 4)))


@pytest.fixture(scope="module")
def matrix_free_certificate():
    """A certificate issued as at dn = 16384: lambda_min by Lanczos, with its Ritz residual as margin
    (forced at (4, 8)). An eigh-based claim sits within eigh's rounding of lambda_min, closer than the
    Cholesky proof's rounding term: that claim is rechecked by eigenvalues, which dn <= 4096 allows."""
    import solver.newton

    mp = pytest.MonkeyPatch()
    mp.setattr(solver.newton, "DENSE_MAX", 0)
    try:
        problem, _ = planted_instance(4, 8, 2, seed=1)
        res = recover(problem, validate=False, max_iter=60)
    finally:
        mp.undo()
    assert res.status == "certified" and res.certificate.kind == "local-newton"
    assert res.certificate.constants["margin"] > 0
    return problem, res


def test_recheck_proves_lambda_min_by_cholesky_above_the_eigh_size(matrix_free_certificate, monkeypatch):
    """The path taken at dn = 16384 (two heads, (64, 256)), forced at (4, 8): it accepts the true
    certificate, and rejects a lambda_min raised above the true one."""
    problem, res = matrix_free_certificate
    by_eigh = recheck(res.certificate, problem, res.X)
    monkeypatch.setattr(recheck_module, "RECHECK_EIGH_MAX", 0)
    by_cholesky = recheck(res.certificate, problem, res.X)
    assert by_cholesky["status"] == "certified"
    claim = res.certificate.constants["lambda_min"] - res.certificate.constants["margin"]
    assert claim <= by_cholesky["lambda_min"] <= by_eigh["lambda_min"]  # the claim proved, below the eigenvalue
    forged = json.loads(json.dumps(res.certificate.as_dict()))
    forged["constants"]["lambda_min"] = 1.5 * by_eigh["lambda_min"] + forged["constants"]["margin"]
    with pytest.raises(CertificateMismatchError, match="lambda_min.*not proved"):
        recheck(forged, problem, res.X)


def _forced_matrix_free(monkeypatch, lanczos=None, eigh_max=None):
    """Two heads (4, 8), seed 1, through the matrix-free branches (DENSE_MAX = 0)."""
    import solver.newton
    from proofs_check import recheck as recheck_mod

    monkeypatch.setattr(solver.newton, "DENSE_MAX", 0)
    if lanczos is not None:
        monkeypatch.setattr(solver.newton, "lanczos_smallest", lanczos)
    if eigh_max is not None:
        monkeypatch.setattr(recheck_mod, "RECHECK_EIGH_MAX", eigh_max)
    problem, _ = planted_instance(4, 8, 2, seed=1)
    return problem, recover(problem, certify=False, validate=False, max_iter=60)


def test_issuer_refuses_a_lanczos_lambda_min_it_cannot_prove(monkeypatch):
    """Lanczos stopping at an eigenvalue that is not the smallest (two heads (64, 128), seed 7, once did,
    at 300 steps) claims too large a lambda_min. Forced here: a Ritz value 4x the true smallest with a
    zero residual. The issuer's dense proof rejects it and the result is uncertified, where the
    certificate used to be issued and only recheck caught it (with the interval certificates on, this
    instance is then certified by the interval-Hessian one)."""
    import solver.newton

    honest = solver.newton.lanczos_smallest

    def too_high(mv, v0, **kw):
        theta, res, steps = honest(mv, v0, **kw)
        return 4.0 * theta, 0.0, steps

    import solver.certificate

    monkeypatch.setattr(solver.certificate, "JACOBIAN_CERT_MAX", 0)  # no interval certificate to fall back on
    problem, res = _forced_matrix_free(monkeypatch, lanczos=too_high)
    assert res.status == "uncertified"
    assert "(Lanczos) was not proved: the dense Hessian's smallest eigenvalue" in res.certificate.reason
    with pytest.raises(CertificationError, match=r"\(Lanczos\) was not proved"):
        recover(problem, validate=False, max_iter=60)


@pytest.mark.parametrize("eigh_max, cholesky", [(4096, True), (0, True), (4096, False)])
def test_issuer_proves_an_honest_lanczos_lambda_min_by_eigenvalues_or_cholesky(monkeypatch, eigh_max, cholesky):
    """The same instance with the honest Lanczos: proved by the shifted Cholesky (tried first, and the
    only test above dn = 4096) and, where that breaks down (forced), by every eigenvalue, so
    certified; recheck accepts it."""
    if not cholesky:
        import proofs_check.rigorous

        monkeypatch.setattr(proofs_check.rigorous, "lambda_min_at_least", lambda A, t: None)
    problem, res = _forced_matrix_free(monkeypatch, eigh_max=eigh_max)
    assert res.status == "certified" and res.certificate.kind == "local-newton"
    assert res.certificate.constants["margin"] > 0  # the Ritz residual: the Lanczos path was taken
    assert recheck(res.certificate, problem, res.X)["status"] == "certified"


def _forged(cert, **constants):
    data = json.loads(json.dumps(cert.as_dict()))
    data["constants"].update(constants)
    return data


def test_recheck_checks_every_constant_of_a_local_newton_certificate(matrix_free_certificate, monkeypatch):
    """L_g must bound lambda_max + M r, m must not exceed lambda_min - M r, and eta and the
    self-concordance constant must follow from the certificate's own m and M: each forged value is
    rejected, by eigenvalues (dn <= RECHECK_EIGH_MAX) and by row sums or a Cholesky factorisation
    above. The issuer's L_g above DENSE_MAX is the row-sum bound, which the cheap test confirms."""
    problem, res = matrix_free_certificate
    cert = res.certificate
    c = cert.constants
    X = np.asarray(res.X)
    loss, args = recheck_module._loss_and_args(problem)
    H = np.asarray(jax.hessian(loss)(X, *args)).reshape(32, 32)
    lam_max = float(np.linalg.eigvalsh((H + H.T) / 2)[-1])
    Mr = c["M"] * cert.radius
    assert c["L_g"] >= np.max(np.sum(np.abs(H), axis=1)) + Mr >= lam_max + Mr  # the issuer's row-sum bound
    for eigh_max in (4096, 0):
        monkeypatch.setattr(recheck_module, "RECHECK_EIGH_MAX", eigh_max)
        mine = recheck(cert, problem, res.X)
        assert mine["status"] == "certified"
        # below lambda_max + M r: rejected (eigenvalues, or row sums then Cholesky)
        with pytest.raises(CertificateMismatchError, match="L_g"):
            recheck(_forged(cert, L_g=0.999 * lam_max + Mr), problem, res.X)
        # a few percent above lambda_max but below the row sums: proved by eigenvalues or by Cholesky
        assert recheck(_forged(cert, L_g=1.02 * lam_max + Mr), problem, res.X)["status"] == "certified"
        m = 1.001 * mine["m"] + 1e-12  # above the recomputed m, with eta and self-concordance to match
        with pytest.raises(CertificateMismatchError, match="m: the certificate"):
            recheck(_forged(cert, m=m, eta=m**2 / c["M"], self_concordance=c["M"] / (2 * m**1.5)), problem, res.X)
        with pytest.raises(CertificateMismatchError, match="eta"):
            recheck(_forged(cert, eta=1.01 * c["eta"]), problem, res.X)
        with pytest.raises(CertificateMismatchError, match="self_concordance"):
            recheck(_forged(cert, self_concordance=0.99 * c["self_concordance"]), problem, res.X)
        for key, value in (("R", 0.5 * cert.region["R"]), ("heads", 1)):  # a smaller region than X's
            data = json.loads(json.dumps(cert.as_dict()))
            data["region"][key] = value
            with pytest.raises(CertificateMismatchError, match=f"region: the certificate says {key}"):
                recheck(data, problem, res.X)
