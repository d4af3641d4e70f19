"""Certified recovery on planted instances; certificates re-check; refusals are honest."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs_check.recheck import recheck
from solver import CertificateMismatchError, CertificationError, planted_instance
from solver.errors import InvalidProblemError
from solver.recover import recover
from solver.symmetry import distance_to_orbit


@given(d=st.sampled_from([3, 4, 6]), heads=st.sampled_from([2, 3]), bias=st.booleans(), seed=st.integers(0, 10**6))
@settings(max_examples=3)
def test_planted_two_head_recovery_is_exact_and_certified(d, heads, bias, seed):
    problem, X = planted_instance(d, 2 * d, heads, bias=bias, seed=seed)
    result = recover(problem, validate=False)  # validation is exercised (slowly) in the next test
    assert result.status == "certified"
    assert distance_to_orbit(problem, result.X, X) <= 1e-8
    cert = result.certificate
    # the a-posteriori bound must hold against the planted truth (the unique nearby minimiser)
    assert distance_to_orbit(problem, result.X, X) * np.linalg.norm(X) <= cert.error_bound + 1e-12
    assert cert.iterations <= cert.iteration_bound
    assert "it reproduces B" in cert.uniqueness  # loss at rounding: says it reproduces B
    assert recheck(cert, problem, result.X)["status"] == "certified"


def test_certified_phase_from_a_perturbed_start():
    problem, X = planted_instance(4, 8, 2, seed=3)
    start = X + 1e-3 * np.random.default_rng(0).normal(size=X.shape)
    result = recover(problem, X_init=start)
    assert result.status == "certified" and distance_to_orbit(problem, result.X, X) <= 1e-8
    assert result.certificate.validation["status"] == "OK"
    assert result.certificate.iterations <= result.certificate.iteration_bound


def test_recheck_rejects_other_instances_and_tampering():
    problem, X = planted_instance(3, 6, 2, seed=1)
    result = recover(problem, validate=False)
    other, _ = planted_instance(3, 6, 2, seed=2)
    with pytest.raises(CertificateMismatchError, match="another problem"):
        recheck(result.certificate, other, result.X)
    with pytest.raises(CertificateMismatchError, match="digest"):
        recheck(result.certificate, problem, result.X + 1e-6)
    forged = json.loads(json.dumps(result.certificate.as_dict()))
    forged["constants"]["M"] /= 100
    with pytest.raises(CertificateMismatchError, match="M"):
        recheck(forged, problem, result.X)
    forged = json.loads(json.dumps(result.certificate.as_dict()))
    forged["constants"]["lambda_min"] *= 1.01  # a lower bound above the true lambda_min
    with pytest.raises(CertificateMismatchError, match="lambda_min"):
        recheck(forged, problem, result.X)
    forged = json.loads(json.dumps(result.certificate.as_dict()))
    forged["error_bound"] /= 10
    with pytest.raises(CertificateMismatchError, match="error bound"):
        recheck(forged, problem, result.X)


def test_unidentifiable_instance_is_refused_or_labelled():
    # n <= d: the continuous problem is underdetermined; no certificate may be issued
    problem, _ = planted_instance(6, 4, 2, seed=0)
    with pytest.raises(CertificationError):
        recover(problem, restarts=2, max_iter=30)
    result = recover(problem, certify=False, restarts=2, max_iter=30)
    assert result.status == "uncertified" and result.certificate.status == "uncertified"
    assert result.certificate.error_bound is None


@given(seed=st.integers(0, 10**6))
@settings(max_examples=3)
def test_levenberg_marquardt_converges_quadratically_near_a_solution(seed):
    # shift ~ ||grad|| keeps Newton's quadratic rate: from 1e-3 away the gradient reaches the float64
    # floor in a handful of accepted steps, each squaring the previous gradient up to a constant
    from solver.newton import History, levenberg_marquardt

    problem, X = planted_instance(6, 12, 2, seed=seed)
    start = X + 1e-3 * np.random.default_rng([seed, 1]).normal(size=X.shape)
    history = History()
    Xr = levenberg_marquardt(problem, start, history, 30, 0.0)
    assert distance_to_orbit(problem, Xr, X) <= 1e-12
    g = [s.grad_norm for s in history.steps]
    assert len(g) <= 8, g
    assert any(b <= 1e3 * a * a for a, b in zip(g, g[1:]) if a < 1e-4), g


def test_random_restarts_are_not_drawn_from_the_planted_stream():
    # recover's random starts must not coincide with the planted X of the same seed
    from solver.recover import _starts

    problem, X = planted_instance(4, 8, 1, seed=5)
    for X0 in _starts(problem, 4, seed=5):
        assert distance_to_orbit(problem, X0, X) > 1e-3


def test_certificate_says_whether_its_minimiser_reproduces_B():
    """The local certificate proves a unique critical point; its text says whether that point is an
    exact fit (a recovery) or a local minimiser with positive loss, by the loss at X, not by claim."""
    from solver.certificate import _fit_clause

    problem, X = planted_instance(3, 6, 2, seed=4)
    assert "it reproduces B" in _fit_clause(problem, float(problem.loss(X)))
    far = X + 0.1  # residual about 1e-2 relative
    assert "does NOT reproduce B" in _fit_clause(problem, float(problem.loss(far)))
    # the threshold: a residual of 2e-8 relative is not called a fit, 5e-9 is
    scale = max(1.0, float(np.linalg.norm(problem.B)))
    assert "does NOT" in _fit_clause(problem, 0.5 * (2e-8 * scale) ** 2)
    assert "it reproduces B" in _fit_clause(problem, 0.5 * (5e-9 * scale) ** 2)
    assert "regularised" in _fit_clause(problem.with_regulariser(0.5), 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["output", "one head"])
def test_every_certificate_on_forty_seeds_rechecks(family):
    """The property "a certified run never reports a certificate recheck rejects", on 40 fixed
    seeds per family at (4, 8), not 3 hypothesis draws: a float64 gradient allowance once let
    output seed 27 through (recheck rejected its radius), which 3 draws had not met."""
    kw = dict(heads=1, variant="output") if family == "output" else dict(heads=1)
    certified = 0
    for seed in range(40):
        problem, _ = planted_instance(4, 8, seed=seed, **kw)
        res = recover(problem, certify=False, validate=False, max_iter=60)
        if res.status == "certified":
            certified += 1
            assert recheck(res.certificate, problem, res.X)["status"] == "certified", seed
        else:
            assert res.certificate.error_bound is None
    assert certified >= 35  # measured: 199/200 with 32 starts, 200/200 with 256 (output); 200/200 (one head), at (4, 8)


def test_progress_true_prints_each_stage_and_a_wrong_progress_is_refused(capsys):
    problem, _ = planted_instance(3, 6, heads=2, seed=0)
    res = recover(problem, validate=False, progress=True)
    err = capsys.readouterr().err
    assert res.status == "certified"
    assert "recover: closed-form start" in err and err.count("recover: ") >= 2
    recover(problem, validate=False, progress=False)
    assert capsys.readouterr().err == ""
    with pytest.raises(InvalidProblemError, match="progress must be a callable"):
        recover(problem, validate=False, progress="yes")
