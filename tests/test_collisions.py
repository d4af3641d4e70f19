"""The collision test: blocked exact nearest-neighbour search against brute force, the prompt
generator, and the pipeline on SmolLM2-135M (a few hundred prompts; the 10,000-prompt run is the
benchmark)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.errors import InvalidProblemError, MemoryBudgetError
from unmask.collisions import min_pairwise_distance, nearest_neighbour_distances


def _brute(X):
    X = X.astype(np.float64)
    D = np.linalg.norm(X[:, None] - X[None], axis=-1)
    iu = np.triu_indices(len(X), 1)
    return D, sorted(zip(D[iu], *iu))


@given(n=st.integers(2, 60), d=st.integers(1, 9), block=st.integers(1, 70), k=st.integers(1, 8),
       seed=st.integers(0, 2**31), scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_blocked_search_equals_brute_force(n, d, block, k, seed, scale):
    X = (np.random.default_rng(seed).standard_normal((n, d)) * scale).astype(np.float32)
    D, pairs = _brute(X)
    res = min_pairwise_distance(X, k=k, block=block)
    kk = min(k, len(pairs))
    assert res["n_pairs"] == n * (n - 1) // 2
    np.testing.assert_allclose([p[0] for p in res["pairs"]], [p[0] for p in pairs[:kk]], rtol=1e-12, atol=0)
    assert res["min_distance"] == pytest.approx(pairs[0][0], rel=1e-12)
    i, j = res["pair"]
    assert i < j and D[i, j] == pytest.approx(res["min_distance"], rel=1e-12)
    np.fill_diagonal(D, np.inf)
    np.testing.assert_allclose(nearest_neighbour_distances(X, block=block), D.min(axis=1), rtol=1e-6, atol=1e-9 * scale)


def test_close_pair_on_large_norms_is_resolved():
    """float64 Gram blocks keep a 1e-3 gap visible on vectors of norm 1e3 (float32 would not)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 576)).astype(np.float32) * 40
    X[17] = X[250] + np.float32(1e-3) * np.eye(576, dtype=np.float32)[0] * 1.0
    res = min_pairwise_distance(X, block=64)
    assert res["pair"] == (17, 250) and res["min_distance"] == pytest.approx(1e-3, rel=1e-3)


def test_duplicate_rows_give_zero_and_bad_input():
    X = np.eye(4, dtype=np.float32)
    X[3] = X[1]
    assert min_pairwise_distance(X)["min_distance"] == 0.0
    with pytest.raises(InvalidProblemError):
        min_pairwise_distance(np.zeros((1, 3)))
    with pytest.raises(MemoryBudgetError, match="smaller block"):
        min_pairwise_distance(X, block=100_000)


smollm = pytest.importorskip("unmask.models.smollm")


@pytest.fixture(scope="module")
def model():
    return smollm.load_smollm()


@pytest.mark.models
def test_prompts_are_distinct_and_varied(model):
    from unmask.collisions import generate_prompts

    ps = generate_prompts(model, 400, seed=1)
    keys = {tuple(p.tolist()) for p in ps}
    assert len(keys) == 400 and all(p.dtype == np.int32 and 1 <= len(p) <= 16 for p in ps)
    texts = [model.decode(p) for p in ps[:200]]
    assert all(t[0].isupper() for t in texts)  # the natural half
    assert len({len(p) for p in ps}) > 8
    assert generate_prompts(model, 50, seed=1)[0].tolist() == ps[0].tolist()


@pytest.mark.models
def test_last_token_states_match_single_prompts(model):
    from unmask.collisions import generate_prompts, last_token_states

    ps = generate_prompts(model, 70, seed=2)
    S = last_token_states(model, ps, (1, 15, 30), batch=32)
    for i in (0, 33, 69):
        full = np.asarray(model.hidden_states(ps[i]))
        for layer in (1, 15, 30):
            ref = full[layer, -1]
            assert np.abs(S[layer][i] - ref).max() <= 1e-5 * np.abs(full[layer]).max()


@pytest.mark.models
def test_collisions_pipeline_and_cli(model, tmp_path):
    from unmask.cli import main

    out = tmp_path / "c.json"
    assert main(["collisions", "--prompts", "200", "--extension-pairs", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["min_distance"]) == {"1", "15", "30"} and res["n_pairs"] == 200 * 199 // 2
    # distinct prompts, distinct states: the injectivity claim, at 200 prompts
    assert all(v > 1e-3 for v in res["min_distance"].values())
    ext = res["extension_test"][0]
    assert ext["exhaustive"] and ext["n_extensions"] == 49152 - 11 and ext["min_same_token_distance"] > 0
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert main(["collisions", "--prompts", "1"]) == 2
