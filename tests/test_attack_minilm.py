"""The layer-0 attack on all-MiniLM-L6-v2: block errors, perturbations, input checks, decoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.errors import InvalidProblemError
from unmask.attacks import minilm as atk


def _brute_block_error(Qc, Kc, Qp, Kp, L, Wt, scale):
    """The definition, one candidate at a time: sum over heads and rows of min_c sum w (S - L - c)^2."""
    H, V, _ = Qc.shape
    out = np.zeros(V)
    for v in range(V):
        Q = np.concatenate([Qp, Qc[:, v : v + 1]], axis=1)
        K = np.concatenate([Kp, Kc[:, v : v + 1]], axis=1)
        R = np.matmul(Q, np.swapaxes(K, 1, 2)) * scale - L
        for h in range(H):
            for i in range(R.shape[1]):
                w, r = Wt[h, i], R[h, i]
                if w.sum() == 0:
                    continue
                c = (w * r).sum() / w.sum()
                out[v] += (w * (r - c) ** 2).sum()
    return out


@given(
    m=st.integers(1, 5),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
    zeros=st.booleans(),
)
def test_block_errors_match_definition(m, heads, seed, zeros):
    rng = np.random.default_rng(seed)
    dh, V, scale = 4, 6, 0.5
    Qc, Kc = rng.standard_normal((2, heads, V, dh))
    Qp, Kp = rng.standard_normal((2, heads, m, dh))
    L = rng.standard_normal((heads, m + 1, m + 1))
    Wt = rng.uniform(0.1, 2.0, L.shape)
    if zeros:
        Wt[rng.uniform(size=L.shape) < 0.3] = 0.0
    old = atk.known_row_sums(Qp, Kp, L, Wt, scale)
    got = atk.block_errors(np, *atk.candidate_logits(np, Qc, Kc, Qp, Kp, scale), L, Wt, old)
    want = _brute_block_error(Qc, Kc, Qp, Kp, L, Wt, scale)
    # float64, O(10) terms of O(10): 1e-9 absolute leaves 1e5 ulps of slack
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-9)


@given(m=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_true_candidate_has_zero_error_under_row_shifts(m, seed):
    """The identity: L = S + row constants gives error 0 for the planted candidate only."""
    rng = np.random.default_rng(seed)
    H, dh, V, scale = 2, 4, 5, 0.5
    Qc, Kc = rng.standard_normal((2, H, V, dh))
    Qp, Kp = rng.standard_normal((2, H, m, dh))
    Q = np.concatenate([Qp, Qc[:, :1]], axis=1)
    K = np.concatenate([Kp, Kc[:, :1]], axis=1)
    L = np.matmul(Q, np.swapaxes(K, 1, 2)) * scale + rng.standard_normal((H, m + 1, 1))
    Wt = np.ones_like(L)
    err = atk.block_errors(np, *atk.candidate_logits(np, Qc, Kc, Qp, Kp, scale), L, Wt, atk.known_row_sums(Qp, Kp, L, Wt, scale))
    assert err[0] < 1e-20 + 1e-12 * err[1:].max()
    assert err[1:].min() > 1e-6


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 9))
def test_perturbations_stay_row_stochastic(seed, n):
    rng = np.random.default_rng(seed)
    B = rng.dirichlet(np.ones(n), size=(3, n))
    for P in (atk.gaussian_noise(B, 0.01, rng), atk.quantise(B, 8), atk.quantise(B, 4), atk.top_k(B, 2)):
        assert P.min() >= 0
        np.testing.assert_allclose(P.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert ((atk.top_k(B, 2) > 0).sum(-1) <= 2).all()
    q = atk.quantise(B, 4).reshape(-1, n)  # a row holds at most 16 levels (k/15, rescaled)
    assert max(np.unique(np.round(row, 12)).size for row in q) <= 16


def test_check_attention_rejects_bad_maps():
    good = np.full((12, 4, 4), 0.25, dtype=np.float32)
    assert atk.check_attention(good).dtype == np.float64
    with pytest.raises(InvalidProblemError, match=r"shape \(12, n, n\)"):
        atk.check_attention(good[:, :3])
    with pytest.raises(InvalidProblemError, match=r"shape \(12, n, n\)"):
        atk.check_attention(good[:11])
    with pytest.raises(InvalidProblemError, match="row-stochastic"):
        atk.check_attention(good * 2)
    bad = good.copy()
    bad[0, 0, :2] = [-0.25, 0.75]
    with pytest.raises(InvalidProblemError, match="non-negative"):
        atk.check_attention(bad)
    bad = good.copy()
    bad[3, 1, 1] = np.nan
    with pytest.raises(InvalidProblemError, match="NaN"):
        atk.check_attention(bad)
    with pytest.raises(InvalidProblemError, match="float32 or float64"):
        atk.check_attention(good.astype(np.int64))
    with pytest.raises(InvalidProblemError, match="512"):
        atk.check_attention(np.full((12, 513, 513), 1 / 513))


# ---- on the real model ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    minilm = pytest.importorskip("unmask.models.minilm")
    return minilm.load()


@pytest.mark.models
@pytest.mark.parametrize(
    "text",
    [
        "The quick brown fox jumps over the lazy dog near the river bank.",
        "In 1969, astronauts walked on the moon for the first time.",
    ],
)
def test_layer0_decodes_text_exactly(model, text):
    ids = model.encode(text)
    B = model.forward(ids).B[0]  # float32, what a deployed model exposes
    result = atk.decode_layer0(atk.check_attention(B), model)
    assert result.ids.tolist() == ids.tolist()
    assert result.text == model.decode(ids)
    assert result.status == "verified"
    # float32 maps reproduce to ~1e-6; a single wrong token moves entries by >> 1e-3
    assert result.residual < 1e-5
    assert np.all(result.margins[1:] > 1.0)


@pytest.mark.models
def test_layer0_decodes_random_tokens(model):
    rng = np.random.default_rng(7)
    ids = np.r_[101, rng.integers(999, model.vocab_size, 14), 102]
    result = atk.decode_layer0(model.forward(ids).B[0], model)
    assert result.ids.tolist() == ids.tolist()


@pytest.mark.models
def test_layer0_survives_zeros(model):
    """Top-k truncation zeros most entries: they get weight 0 and decoding still succeeds."""
    ids = model.encode("Please remove your shoes before entering the temple.")
    B = atk.top_k(model.forward(ids).B[0].astype(np.float64), 6)
    assert (B == 0).mean() > 0.4
    result = atk.decode_layer0(B, model)
    assert result.ids.tolist() == ids.tolist()
    assert result.status == "inconsistent"  # the truncated maps are not the model's maps


@pytest.mark.models
def test_wrong_first_token_is_not_verified(model):
    ids = model.encode("Please remove your shoes before entering the temple.")
    result = atk.decode_layer0(model.forward(ids).B[0], model, first_token=1996)
    assert result.status == "inconsistent"


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 6), lam=st.sampled_from([0.0, 0.3]))
def test_log_domain_loss_gradient(seed, n, lam):
    """Central differences in a random direction; float64, step 1e-6: agreement to 1e-6 relative."""
    rng = np.random.default_rng(seed)
    H, dh, d = 3, 2, 5
    Aq, Ak = rng.standard_normal((2, H, dh, d))
    bq = rng.standard_normal((H, dh))
    X, X0, E = rng.standard_normal((3, d, n))
    L = rng.standard_normal((H, n, n))
    Wt = (rng.uniform(size=L.shape) > 0.25).astype(np.float64)
    f, g = atk.log_domain_loss(X, Aq, bq, Ak, L, Wt, X0, lam)
    h = 1e-6
    fp, _ = atk.log_domain_loss(X + h * E, Aq, bq, Ak, L, Wt, X0, lam)
    fm, _ = atk.log_domain_loss(X - h * E, Aq, bq, Ak, L, Wt, X0, lam)
    assert abs((fp - fm) / (2 * h) - float((g * E).sum())) <= 1e-6 * (1.0 + abs(f) + float(np.abs(g).sum()))
    # zero loss exactly when L is the logits plus row constants
    W = np.einsum("hed,hef->hdf", Aq, Ak) / np.sqrt(dh)
    u = np.einsum("hed,he->hd", Ak, bq) / np.sqrt(dh)
    S = np.einsum("dn,hde,em->hnm", X, W, X) + (u @ X)[:, None, :] + rng.standard_normal((H, n, 1))
    f0, _ = atk.log_domain_loss(X, Aq, bq, Ak, S, np.ones_like(S), X, 0.0)
    assert f0 < 1e-20 * (1.0 + float((S * S).sum()))


@given(seed=st.integers(0, 2**31 - 1), extra=st.integers(0, 8))
def test_factor_closed_form_recovers_miniature_layer(seed, extra):
    """d = 16, 4 heads of 4, LayerNorm inputs, float64 maps: from n = 2 d_head + 1 = 9 (below d) one
    candidate is X. The error is eps times the inverse spectral gap of the Gram matrix, largest at the
    threshold n = 9: measured 1e-13 .. 1.4e-6 there; a wrong null vector gives O(1)."""
    layer = atk.AttentionLayer.random(16, 4, seed=seed)
    n = 2 * layer.d_head + 1 + extra
    X = layer.layer_norm(np.random.default_rng(seed + 1).standard_normal((16, n)))
    B = layer.maps(X)
    candidates = atk.factor_closed_form(B, layer)
    assert 1 <= len(candidates) <= 2
    err = np.linalg.norm(candidates[0] - X) / np.linalg.norm(X)  # the LayerNorm picks the sign
    assert err < 1e-4
    # one position fewer: the linear system has more than one null direction, no closed form
    assert atk.factor_closed_form(B[:, : n - extra - 1, : n - extra - 1] / B[:, : n - extra - 1, : n - extra - 1].sum(-1, keepdims=True), layer) == []


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 12))
def test_query_bias_reflection_is_a_symmetry(seed, n):
    """X -> -X - 2 v 1^T with v = W_q^{-1} b_q leaves every head's map unchanged (H d_head = d),
    and the reflected columns are not LayerNorm outputs."""
    layer = atk.AttentionLayer.random(12, 3, seed=seed, logit_scale=4.0)
    X = layer.layer_norm(np.random.default_rng(seed).standard_normal((12, n)))
    v = np.linalg.solve(layer.Aq.reshape(12, 12), layer.bq.reshape(12))
    Xr = -X - 2 * v[:, None]
    np.testing.assert_allclose(layer.maps(Xr), layer.maps(X), rtol=0, atol=1e-12)
    assert atk.layer_norm_defect(X, layer) < 1e-9 < 1e-3 < atk.layer_norm_defect(Xr, layer)


def test_identifiability_counts():
    layer = atk.AttentionLayer.random(16, 4)
    assert layer.identifiability(4).verdict.startswith("no")  # 4 (n - 1) = 12 < 16 equations per column
    assert layer.identifiability(5).verdict == "by count only"
    assert layer.identifiability(9).verdict.startswith("yes")
    ident = layer.identifiability(7)
    assert (ident.unknowns, ident.equations) == (16 * 7, 4 * 7 * 6)


@pytest.mark.slow
def test_deep_layer_certified_through_solver():
    """Miniature layer (d = 8, 4 heads of 2, logits O(4)), n = 12 > d: closed form, then solver.recover
    certifies; the true X lies within the certificate's error bound (modulo the symmetry group).
    Not every instance certifies (lambda_min^2 < 8 M ||grad|| on some: see the benchmark's
    miniature rows); this one does (about 90 s on 2 busy cores)."""
    layer = atk.AttentionLayer.random(8, 4, seed=1, logit_scale=4.0)
    X = layer.layer_norm(np.random.default_rng(2).standard_normal((8, 12)))
    B = layer.maps(X)
    r = atk.recover_layer_input(B, layer)
    assert r.method.startswith("solver.recover") and r.symmetry_dimension is not None
    assert r.init == "factor closed form"
    assert r.status == "certified", r.reason
    assert r.recheck is not None and r.recheck["status"] == "certified"  # proofs_check recomputed it
    err = atk.layer_input_error(r, layer, B, X) * np.linalg.norm(X)
    # the certificate bounds the distance to the unique critical point; X is one (loss 0)
    assert err <= r.certificate.error_bound + 1e-12 * np.linalg.norm(X)


@pytest.mark.slow
def test_deep_layer_certified_only_when_rechecked(monkeypatch):
    """The instance above with proofs_check.recheck out of reach: solver.recover's certificate alone
    does not make the status certified."""
    monkeypatch.setattr(atk, "RECHECK_MAX_DN", 0)
    layer = atk.AttentionLayer.random(8, 4, seed=1, logit_scale=4.0)
    X = layer.layer_norm(np.random.default_rng(2).standard_normal((8, 12)))
    r = atk.recover_layer_input(layer.maps(X), layer)
    assert r.certificate.status == "certified"
    assert r.status == "uncertified" and "recheck" in r.reason and r.recheck is None


def test_deep_layer_large_path_tries_the_certificate():
    """d = 72 > 64, 4 heads of 18, n = 40 (d n = 2880 > SOLVER_START_MAX_DN): closed form, L-BFGS,
    then solver.recover, whose symmetry analysis finds the heads' factors itself (finite group).
    Refused until recover moved X to its slice polish (LM stopped at ||grad|| = 1.3e-12, 1.2e-6 from
    the critical point; the local Newton certificate needs ||grad|| <= 2.2e-13): now certified by
    the interval-Jacobian certificate there, and rechecked (66 s in all, one thread)."""
    layer = atk.AttentionLayer.random(72, 4, seed=0, logit_scale=1.0)
    X = layer.layer_norm(np.random.default_rng(1).standard_normal((72, 40)))
    B = layer.maps(X)
    r = atk.recover_layer_input(B, layer, maxiter=100)
    assert r.method.endswith("solver.recover (certified Newton) from it") and r.init == "factor closed form"
    assert r.symmetry_dimension == 0 and r.certificate is not None and r.certificate_seconds > 0
    assert atk.layer_input_error(r, layer, B, X) < 1e-6
    assert r.status == "certified" and r.certificate.kind == "interval-jacobian", r.reason
    assert r.recheck["status"] == "certified"
    skipped = atk.recover_layer_input(B, layer, maxiter=100, certify=False)
    assert skipped.certificate is None and "not attempted" in skipped.reason


def test_deep_layer_unidentifiable_is_uncertified():
    """n = 2 < count_min_n = 3: a family of inputs explains the maps; solver.recover cannot certify."""
    layer = atk.AttentionLayer.random(8, 4, seed=0, logit_scale=4.0)
    X = layer.layer_norm(np.random.default_rng(5).standard_normal((8, 2)))
    r = atk.recover_layer_input(layer.maps(X), layer)
    assert r.identifiability.verdict.startswith("no")
    assert r.method.startswith("solver.recover")
    assert r.status == "uncertified" and r.reason
    assert r.certificate.status == "uncertified"


@pytest.mark.models
def test_deep_layer_real_model_is_uncertified_below_closed_form(model):
    """Layer 1 with n = 8: d n = 3072 unknowns, 12 n (n - 1) = 672 equations. The fit is close
    but X is not the true input, and the result says why (no closed form, no certificate tried)."""
    ids = model.encode("Close the door, please.")
    trace = model.forward(ids)
    r = atk.recover_deep_layer(trace.B[1], model, 1, maxiter=60)
    assert r.identifiability.verdict.startswith("no")
    assert r.status == "uncertified" and "no closed form" in r.reason and r.certificate is None
    assert r.init == "prior"
    assert r.unknowns == 384 * len(ids) and r.equations == 12 * len(ids) * (len(ids) - 1)
    assert r.residual < 0.05  # from about 1 at the prior
    X = trace.X[1].astype(np.float64)
    assert np.linalg.norm(r.X - X) / np.linalg.norm(X) > 0.3


@pytest.mark.slow
@pytest.mark.models
def test_deep_layer_real_model_closed_form(model):
    """Layer 3, n = 100 random word pieces (65 <= n < d): the factor closed form from float64 maps
    recovers the layer input. The null vector of a 12288 x 12288 Gram matrix carries the error:
    measured 2.3e-6 at layer 1 (float32 maps: see the benchmark); a wrong one gives O(1)."""
    import jax

    if not jax.config.jax_enable_x64:
        pytest.skip("needs jax_enable_x64")
    rng = np.random.default_rng(11)
    ids = np.r_[101, rng.integers(999, model.vocab_size, 98), 102]
    trace = model.forward(ids, dtype="float64")
    layer = atk.AttentionLayer.of_model(model, 3)
    X = trace.X[3]
    candidates = atk.factor_closed_form(trace.B[3], layer)
    assert candidates
    assert np.linalg.norm(candidates[0] - X) / np.linalg.norm(X) < 1e-4


@pytest.mark.slow
@pytest.mark.models
def test_layer0_sentence_set_sample(model):
    """Every 16th sentence of the benchmark set (10 sentences): all exact."""
    from unmask.attacks.sentences import SENTENCES

    for text in SENTENCES[::16]:
        ids = model.encode(text)
        result = atk.decode_layer0(model.forward(ids).B[0], model)
        assert result.ids.tolist() == ids.tolist(), text
        assert result.status == "verified"


@pytest.mark.slow
@pytest.mark.models
def test_layer0_long_input_beyond_d(model):
    """n = 392 > d = 384 tokens (the regime where the continuous problem is determined):
    the sequential decoding still recovers every token (about 3-7 minutes on 2 cores)."""
    rng = np.random.default_rng(3)
    ids = np.r_[101, rng.integers(999, model.vocab_size, 390), 102]
    result = atk.decode_layer0(model.forward(ids).B[0], model)
    assert result.ids.tolist() == ids.tolist()


@pytest.mark.models
def test_robust_decoding_under_noise(model):
    """Additive noise 1e-3 on B: uniform log-domain weights fail (tiny entries are pure noise),
    the robust decoder's B^1 / B^2 weightings recover the text."""
    ids = model.encode("Close the door, please.")
    B = atk.gaussian_noise(model.forward(ids).B[0].astype(np.float64), 1e-3, np.random.default_rng(1))
    result = atk.decode_layer0_robust(B, model)
    assert result.ids.tolist() == ids.tolist()
    assert result.status == "inconsistent"  # the noisy maps are not exactly the model's
