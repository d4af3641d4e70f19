"""The lemma constants: true on drawn instances, monotone, and the checker can fail."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs_check.checker import check
from proofs_check.region import Region
from solver.errors import InvalidRegionError

FAST = dict(instances=6, starts=2, steps=12, progress=False)


@given(d=st.sampled_from([2, 3]), n=st.sampled_from([3, 5]), R=st.sampled_from([0.5, 1.0, 2.0]),
       omega=st.sampled_from([0.5, 2.0]), mu=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 10**6))
@settings(max_examples=3)
@pytest.mark.slow
def test_every_bound_holds_on_drawn_instances(d, n, R, omega, mu, seed):
    report = check(Region(d=d, n=n, heads=2, R=R, omega=omega, mu=mu, gamma=1.0, gamma_max=1.5), seed=seed, **FAST)
    bad = [(r.name, r.worst_random_ratio, r.worst_adversarial_ratio) for r in report.lemmas if r.status != "OK"]
    assert not bad, bad


@pytest.mark.slow
def test_output_variant_bounds_hold():
    region = Region(d=2, n=4, heads=1, R=1.0, omega=1.0, mu=0.3, gamma=0.5, gamma_max=1.0, variant="output",
                    d_v=2, omega_V=1.0, beta=1.0)
    report = check(region, **FAST)
    assert report.ok, report.table()


@given(R=st.floats(0.1, 3.0), omega=st.floats(0.1, 3.0), factor=st.floats(1.01, 3.0))
def test_bounds_grow_with_R_and_omega(R, omega, factor):
    base = Region(d=3, n=6, heads=2, R=R, omega=omega, mu=0.2, gamma=1.0, gamma_max=1.0).bounds()
    for bigger in (Region(d=3, n=6, heads=2, R=R * factor, omega=omega, mu=0.2, gamma=1.0, gamma_max=1.0),
                   Region(d=3, n=6, heads=2, R=R, omega=omega * factor, mu=0.2, gamma=1.0, gamma_max=1.0)):
        b = bigger.bounds()
        for name, value in base.items():
            if name == "strong_convexity":
                assert b[name] <= value  # a lower bound shrinks as the region grows
            else:
                assert b[name] >= value, name


@pytest.mark.parametrize("name", ["gradient_lipschitz", "softmax_second", "strong_convexity"])
def test_checker_reports_a_weakened_bound(tmp_path, name):
    # inject a bound equal to the true quantity divided by 10: it must be reported VIOLATED
    region = Region(d=3, n=5, heads=2, R=1.0, omega=2.0, mu=0.5, gamma=1.0, gamma_max=1.0)
    honest = check(region, names=[name], **FAST).lemmas[0]
    assert honest.status == "OK"
    worst = max(honest.worst_random_ratio, honest.worst_adversarial_ratio)  # true quantity / bound
    assert worst > 0
    b = region.bounds()[name]
    if name == "strong_convexity":  # the bounded quantity is the curvature deficit gamma^2 - lambda_min
        weakened = region.gamma**2 - (region.gamma**2 - b) * worst / 10
        scale = weakened / b
    else:
        scale = worst / 10
    report = check(region, names=[name], bound_scale={name: scale}, counterexample_dir=tmp_path, **FAST)
    row = report.lemmas[0]
    assert row.status == "VIOLATED", report.table()
    assert row.counterexample and np.load(row.counterexample)["ratio"] > 1


def test_inconsistent_regions_are_refused():
    with pytest.raises(InvalidRegionError, match="R = 0"):
        Region(d=2, n=3, R=0.0)
    with pytest.raises(InvalidRegionError, match="gamma"):
        Region(d=2, n=3, gamma=-1.0)
    with pytest.raises(InvalidRegionError, match="gamma_max"):
        Region(d=2, n=3, gamma=2.0, gamma_max=1.0)


def test_instance_outside_region_is_refused():
    from solver import planted_instance

    problem, X = planted_instance(3, 5, 2, seed=0)
    region = Region(d=3, n=5, heads=2, R=10.0, omega=1e-3)
    with pytest.raises(InvalidRegionError, match="omega"):
        region.require_contains(problem, X)


def test_rigorous_box():
    from proofs_check.rigorous import certify_box

    box = certify_box(seed=1)
    assert box["certified"] and box["lambda_min_lower"] >= box["l"] > 0
