"""Recover the input of all-MiniLM-L6-v2 from one layer's attention maps.

Layer 0 (the text itself): the layer input is ``x_p = LayerNorm(E[t_p] + P[p] + T[0])`` for
a vocabulary token ``t_p``. For a set J of positions, the block of ``log B_h`` on J with each
row centred over J equals the logits on J centred the same way: the softmax normaliser and
every row-only term cancel, so the block depends only on the tokens at J (notes/problem.md,
"Sub-blocks"). Decoding therefore goes position by position from the known ``[CLS]``: with
the prefix ``0..p-1`` decoded, every vocabulary token is scored at position p by the
weighted, row-centred squared error of the block ``J = {0..p}`` over all 12 heads, and the
best one is kept (a beam keeps the best few prefixes).

The scan is vectorised: with ``e~`` the centred token embedding and ``q~_p`` the centred
position + type embedding, ``x = gamma * (e~ + q~_p) / sigma + beta`` with one scalar
``sigma`` per token and position, so the queries and keys of all 30522 candidates at a
position are ``(E~ gamma A^T + q~_p gamma A^T) / sigma + const``; ``E~ gamma A^T`` is
computed once. A position then costs O(V d + V d_head H p) instead of a forward pass per token.

Entries of B that are exactly 0 (underflow, top-k truncation, quantisation) carry no
log-domain information and get weight 0; the row centring is then over the remaining entries
of each row. Perturbed maps can be scored with weights ``B_ij ** power``
(``power = 2`` is the inverse variance of ``log B_ij`` under additive noise on B).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from solver.errors import InvalidProblemError
from solver.problem import Problem
from unmask.models import minilm as _minilm


# ---- input checks ---------------------------------------------------------------------------
def check_attention(B, *, n_heads: int = _minilm.N_HEADS, tol: float = 1e-3) -> np.ndarray:
    """Validate observed attention maps and return them as float64 (H, n, n).

    Rows must be non-negative, finite and sum to 1 within ``tol`` (float32 maps of 512
    positions sum to 1 within about 1e-5).
    """
    B = np.asarray(B)
    if B.dtype not in (np.float32, np.float64):
        raise InvalidProblemError(f"attention maps must be float32 or float64, got {B.dtype}")
    if B.ndim != 3 or B.shape[0] != n_heads or B.shape[1] != B.shape[2]:
        raise InvalidProblemError(
            f"attention maps must have shape ({n_heads}, n, n) (one n x n map per head), got {B.shape}"
        )
    n = B.shape[1]
    if n < 2 or n > _minilm.MAX_POSITIONS:
        raise InvalidProblemError(f"attention maps cover n = {n} positions; the model needs 2 <= n <= {_minilm.MAX_POSITIONS}")
    B = B.astype(np.float64)
    if not np.all(np.isfinite(B)):
        raise InvalidProblemError("attention maps contain NaN or infinite entries")
    if B.min() < 0:
        h, i, j = np.unravel_index(np.argmin(B), B.shape)
        raise InvalidProblemError(f"attention maps must be non-negative; head {h} entry ({i}, {j}) is {B[h, i, j]:.3g}")
    sums = B.sum(axis=-1)
    bad = np.abs(sums - 1.0) > tol
    if bad.any():
        h, i = np.argwhere(bad)[0]
        raise InvalidProblemError(
            f"attention maps must be row-stochastic: head {h} row {i} sums to {sums[h, i]:.6g}; "
            f"rows must sum to 1 (tolerance {tol:g}); pass the softmax probabilities, not logits"
        )
    return B


# ---- perturbations (defences) ------------------------------------------------------------
def renormalise(B: np.ndarray) -> np.ndarray:
    """Rescale rows to sum to 1 (a row scale is a row constant in the log domain: harmless)."""
    s = B.sum(axis=-1, keepdims=True)
    return B / np.where(s > 0, s, 1.0)


def gaussian_noise(B: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Additive N(0, sigma^2) noise on every entry, clipped at 0, rows renormalised."""
    return renormalise(np.maximum(B + sigma * rng.standard_normal(B.shape), 0.0))


def quantise(B: np.ndarray, bits: int) -> np.ndarray:
    """Uniform quantisation of the probabilities to 2^bits - 1 levels on [0, 1], rows renormalised."""
    levels = 2**bits - 1
    return renormalise(np.round(B * levels) / levels)


def top_k(B: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest entries of every row, zero the rest, rows renormalised."""
    if k >= B.shape[-1]:
        return B.copy()
    idx = np.argpartition(-B, k - 1, axis=-1)[..., :k]
    out = np.zeros_like(B)
    np.put_along_axis(out, idx, np.take_along_axis(B, idx, axis=-1), axis=-1)
    return renormalise(out)


# ---- the vectorised vocabulary scan -------------------------------------------------------------
def candidate_logits(xp, Qc, Kc, Qp, Kp, scale: float):
    """Logits a candidate at a new position shares with m known positions.

    `Qc`, `Kc` (H, V, dh): queries (with bias) and keys (without) of V candidates; `Qp`, `Kp`
    (H, m, dh): those of the known positions. Returns ``row`` (H, V, m), the candidate's query
    against the known keys; ``diag`` (H, V), its own logit; ``col`` (H, V, m), the known
    queries against its key.
    """
    row = xp.matmul(Qc, xp.swapaxes(Kp, 1, 2)) * scale
    diag = xp.sum(Qc * Kc, axis=-1) * scale
    col = xp.matmul(Kc, xp.swapaxes(Qp, 1, 2)) * scale
    return row, diag, col


def block_errors(xp, row, diag, col, L, Wt, old):
    """Row-centred log-domain error of the block J = (known positions, candidate), per candidate.

    **Arguments**
    - `xp`: the array namespace (numpy, or jax.numpy inside the jitted scan).
    - `row`, `diag`, `col`: :func:`candidate_logits` of the V candidates.
    - `L`, `Wt`: observed log B and entry weights on J, (H, m+1, m+1), the candidate last.
    - `old`: :func:`known_row_sums` of the known positions (their candidate-free entries).

    Returns ``sum_h sum_{i in J} min_c sum_{j in J} w_hij (S_hij - L_hij - c)^2`` for every
    candidate, (V,): zero for the true token when the known positions are right. All arrays
    must share one dtype.
    """
    m = row.shape[-1]
    # the candidate's row
    r = row - L[:, m, None, :m]
    rd = diag - L[:, m, m, None]
    w, wd = Wt[:, m, None, :m], Wt[:, m, m, None]
    wr = w * r
    sw = xp.sum(w, axis=-1) + wd
    sr = xp.sum(wr, axis=-1) + wd * rd
    srr = xp.sum(wr * r, axis=-1) + wd * rd * rd
    err = xp.sum(srr - sr * sr / xp.where(sw > 0, sw, 1.0), axis=0)
    # the known rows: old entries (in `old`) plus the candidate's key at column m
    c = col - L[:, None, :m, m]
    wc = Wt[:, None, :m, m]
    sw_old, sr_old, srr_old = old
    sw = (sw_old + Wt[:, :m, m])[:, None, :]
    sr = sr_old[:, None, :] + wc * c
    srr = srr_old[:, None, :] + wc * c * c
    return err + xp.sum(srr - sr * sr / xp.where(sw > 0, sw, 1.0), axis=(0, 2))


def known_row_sums(Qp, Kp, L, Wt, scale: float):
    """Weighted sums (sum w, sum w r, sum w r^2) over the block of the known positions, (H, m) each."""
    m = Qp.shape[1]
    r = np.matmul(Qp, np.swapaxes(Kp, 1, 2)) * scale - L[:, :m, :m]
    w = Wt[:, :m, :m]
    return w.sum(-1), (w * r).sum(-1), (w * r * r).sum(-1)


def _shortlist_impl(QE, KE, QEKE, Ec, Ec_sq, pos, Qp, Kp, L, Wt, old, consts, *, scale, k):
    # The candidates' queries are inv * (QE + aq) + qc and keys inv * (KE + ak) + kc, with
    # inv = 1/sigma per token; expanding the products reads QE and KE once each.
    import jax
    import jax.numpy as jnp

    Aq, Ak, q_const, k_const = consts
    H, V, dh = QE.shape
    qp = pos - jnp.mean(pos)
    var = (Ec_sq + 2.0 * (Ec @ qp) + qp @ qp) / Ec.shape[1]
    inv = jax.lax.rsqrt(var + _minilm.LN_EPS)[None, :]  # (1, V)
    aq, ak = (Aq @ qp).reshape(H, dh), (Ak @ qp).reshape(H, dh)
    qc, kc = q_const.reshape(H, dh), k_const.reshape(H, dh)
    m = Qp.shape[1]
    A = jnp.matmul(QE, jnp.concatenate([jnp.swapaxes(Kp, 1, 2), ak[:, :, None], kc[:, :, None]], axis=2))
    Bk = jnp.matmul(KE, jnp.concatenate([jnp.swapaxes(Qp, 1, 2), aq[:, :, None], qc[:, :, None]], axis=2))
    inv3 = inv[:, :, None]
    row = (inv3 * (A[:, :, :m] + jnp.einsum("hd,hjd->hj", aq, Kp)[:, None, :]) + jnp.einsum("hd,hjd->hj", qc, Kp)[:, None, :]) * scale
    col = (inv3 * (Bk[:, :, :m] + jnp.einsum("hd,hjd->hj", ak, Qp)[:, None, :]) + jnp.einsum("hd,hjd->hj", kc, Qp)[:, None, :]) * scale
    a_k, a_c = jnp.sum(aq * ak, axis=-1)[:, None], jnp.sum(aq * kc, axis=-1)[:, None]
    c_k, c_c = jnp.sum(qc * ak, axis=-1)[:, None], jnp.sum(qc * kc, axis=-1)[:, None]
    diag = (
        inv * inv * (QEKE + A[:, :, m] + Bk[:, :, m] + a_k) + inv * (A[:, :, m + 1] + Bk[:, :, m + 1] + a_c + c_k) + c_c
    ) * scale
    err = block_errors(jnp, row, diag, col, L, Wt, old)
    return jax.lax.top_k(-err, k)[1]


class Layer0Scanner:
    """Ranks every vocabulary token at a position, in one jitted float32 pass.

    A layer-0 column is ``x = gamma * (e~ + q~_p) / sigma + beta`` (``e~`` the centred token
    embedding, ``q~_p`` the centred position + type embedding, ``sigma`` one scalar per token
    and position), so the queries and keys of all candidates at a position are
    ``(E~ gamma A^T + q~_p gamma A^T) / sigma + const``, with ``E~ gamma A^T`` computed once.
    The shortlist is then rescored exactly in float64 (:meth:`columns_qk`).
    """

    def __init__(self, model: _minilm.MiniLM):
        import jax
        import jax.numpy as jnp

        w = model.weights
        self.model = model
        Aq, bq, Ak = model.query_key(0)
        H, dh, d = Aq.shape
        self.H, self.dh, self.d = H, dh, d
        self.Aq = Aq.reshape(H * dh, d)
        self.Ak = Ak.reshape(H * dh, d)
        self.bq = bq.reshape(-1)
        gamma = w["embeddings.LayerNorm.weight"].astype(np.float64)
        beta = w["embeddings.LayerNorm.bias"].astype(np.float64)
        E = w["embeddings.word_embeddings.weight"].astype(np.float64)
        Ec = E - E.mean(axis=1, keepdims=True)
        self.pos = (
            w["embeddings.position_embeddings.weight"].astype(np.float64)
            + w["embeddings.token_type_embeddings.weight"][0].astype(np.float64)
        )
        AqG, AkG = self.Aq * gamma, self.Ak * gamma
        f32 = jnp.float32
        # head-major (H, V, dh): every head's scan is one contiguous matrix product
        self.QE = jnp.asarray((Ec @ AqG.T).reshape(-1, H, dh).transpose(1, 0, 2), dtype=f32)
        self.KE = jnp.asarray((Ec @ AkG.T).reshape(-1, H, dh).transpose(1, 0, 2), dtype=f32)
        self.QEKE = jnp.sum(self.QE * self.KE, axis=-1)
        self.Ec = jnp.asarray(Ec, dtype=f32)
        self.Ec_sq = jnp.asarray((Ec * Ec).sum(axis=1), dtype=f32)
        self.consts = tuple(jnp.asarray(a, dtype=f32) for a in (AqG, AkG, self.Aq @ beta + self.bq, self.Ak @ beta))
        self.scale = 1.0 / math.sqrt(dh)
        self._jitted = jax.jit(_shortlist_impl, static_argnames=("scale", "k"))

    @property
    def vocab_size(self) -> int:
        return int(self.QE.shape[1])

    def shortlist(self, p: int, Qp, Kp, L, Wt, k: int, size: int) -> np.ndarray:
        """The k tokens with the smallest block error at position p (float32 ranking).

        `Qp`, `Kp` (H, m, dh) are the known positions of the block, `L`, `Wt` (H, m+1, m+1)
        with the candidate last. The block is padded with weight-0 positions to ``size`` known
        positions, so that one compiled scan serves every position.
        """
        import jax.numpy as jnp

        H, m, dh = Qp.shape
        if m > size:
            raise ValueError(f"block of {m} known positions exceeds size {size}")
        old = known_row_sums(Qp, Kp, L, Wt, self.scale)
        at = np.r_[np.arange(m), size]
        Lp, Wp = np.zeros((H, size + 1, size + 1)), np.zeros((H, size + 1, size + 1))
        Lp[:, at[:, None], at] = L
        Wp[:, at[:, None], at] = Wt
        pad = lambda a: np.concatenate([a, np.zeros((H, size - m) + a.shape[2:])], axis=1)  # noqa: E731
        f = lambda a: jnp.asarray(a, dtype=jnp.float32)  # noqa: E731
        idx = self._jitted(
            self.QE, self.KE, self.QEKE, self.Ec, self.Ec_sq, f(self.pos[p]), f(pad(Qp)), f(pad(Kp)), f(Lp), f(Wp),
            tuple(f(pad(a)) for a in old), self.consts, scale=self.scale, k=min(k, self.vocab_size),
        )
        return np.asarray(idx)

    def columns_qk(self, ids: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Queries and keys, float64, of the layer-0 columns of ``ids`` at ``positions``: (H, m, dh) each."""
        X = self.model.embedding_columns(np.asarray(ids), np.asarray(positions))
        m = X.shape[1]
        Q = (X.T @ self.Aq.T + self.bq).reshape(m, self.H, self.dh).transpose(1, 0, 2)
        K = (X.T @ self.Ak.T).reshape(m, self.H, self.dh).transpose(1, 0, 2)
        return np.ascontiguousarray(Q), np.ascontiguousarray(K)


@dataclass
class Layer0Result:
    """Decoded tokens and how well they explain the observed maps.

    **Fields**
    - `ids`: decoded token ids (position 0 is the known first token).
    - `text`: the decoded text (special tokens dropped).
    - `scores`: the block error of the chosen token at each position (0 at position 0).
    - `margins`: runner-up minus chosen block error at each position (inf at position 0):
      how far the next-best token is from explaining the data.
    - `residual`: max |B(decoded) - B(observed)| over all heads and entries.
    - `fit`: ||B(decoded) - B(observed)||_F, what :func:`decode_layer0_robust` compares.
    - `status`: "verified" when the decoded tokens reproduce the observed maps within
      `tolerance`, "inconsistent" otherwise (the maps were perturbed, or decoding failed).
    - `seconds`: wall time of the decoding.
    """

    ids: np.ndarray
    text: str
    scores: np.ndarray
    margins: np.ndarray
    residual: float
    fit: float
    tolerance: float
    status: str
    seconds: float


def _weights(B: np.ndarray, power: float) -> np.ndarray:
    positive = B > 0
    if power == 0:
        return positive.astype(np.float64)
    return np.where(positive, B, 0.0) ** power


def decode_layer0(
    B,
    model: _minilm.MiniLM | None = None,
    *,
    first_token: int = _minilm.CLS_ID,
    beam: int = 1,
    window: int = 6,
    shortlist: int = 64,
    weight_power: float = 0.0,
    tolerance: float = 1e-5,
) -> Layer0Result:
    """Decode the tokens behind layer-0 attention maps ``B`` (12, n, n), from ``first_token``.

    At each position every vocabulary token is ranked on the block of position 0, the last
    ``window`` decoded positions and the new one (float32); the best ``shortlist`` are then
    rescored in float64 on the block of all positions so far, and the best ``beam`` prefixes
    kept.

    **Arguments**
    - `B`: observed maps, row-stochastic (zeros allowed: they get weight 0).
    - `model`: the loaded model (default: :func:`unmask.models.minilm.load`).
    - `first_token`: the known token at position 0 ([CLS] for this model).
    - `beam`: number of prefixes kept per position (1 is greedy).
    - `window`, `shortlist`: the cheap ranking stage (see above).
    - `weight_power`: entry weights ``B_ij ** weight_power`` in the log-domain error (0: every
      positive entry counts the same, right for exact float32 maps; 1 or 2 for noisy maps).
    - `tolerance`: max-entry deviation between the observed maps and those of the decoded
      tokens below which the result is "verified" (float32 maps: 1e-5, about 100 ulps of 1).
    """
    start = time.perf_counter()
    model = model or _minilm.load()
    B = np.asarray(B, dtype=np.float64)
    H, n, _ = B.shape
    scan = scanner_for(model)
    positive = B > 0
    L = np.log(np.where(positive, B, 1.0))
    Wt = _weights(B, weight_power)
    q0, k0 = scan.columns_qk(np.array([first_token]), np.array([0]))
    # a beam entry: (total error, ids, Q (H, p, dh) float64, K, per-position errors, margins)
    beams = [(0.0, [first_token], q0, k0, [0.0], [math.inf])]
    for p in range(1, n):
        J = np.unique(np.r_[0, np.arange(max(1, p - window), p)])
        Jp = np.r_[J, p]
        full = np.arange(p + 1)
        options = []
        for total, ids, Qp, Kp, errs, margins in beams:
            short = scan.shortlist(p, Qp[:, J], Kp[:, J], L[:, Jp][:, :, Jp], Wt[:, Jp][:, :, Jp], shortlist, window + 1)
            k = short.shape[0]
            qs, ks = scan.columns_qk(short, np.full(k, p))
            Lf, Wf = L[:, full][:, :, full], Wt[:, full][:, :, full]
            old = known_row_sums(Qp, Kp, Lf, Wf, scan.scale)
            fine = block_errors(np, *candidate_logits(np, qs, ks, Qp, Kp, scan.scale), Lf, Wf, old)
            order = np.argsort(fine)
            for rank in range(min(beam, k)):
                i = order[rank]
                runner = fine[order[rank + 1]] if rank + 1 < k else math.inf
                options.append(
                    (
                        total + float(fine[i]),
                        ids + [int(short[i])],
                        np.concatenate([Qp, qs[:, i : i + 1]], axis=1),
                        np.concatenate([Kp, ks[:, i : i + 1]], axis=1),
                        errs + [float(fine[i])],
                        margins + [float(runner - fine[i])],
                    )
                )
        options.sort(key=lambda o: o[0])
        beams = options[:beam]
    _, ids, _, _, errs, margins = beams[0]
    ids = np.asarray(ids, dtype=np.int64)
    diff = layer0_maps(model, ids) - B
    residual = float(np.abs(diff).max())
    return Layer0Result(
        ids=ids,
        text=model.decode(ids),
        scores=np.asarray(errs),
        margins=np.asarray(margins),
        residual=residual,
        fit=float(np.linalg.norm(diff)),
        tolerance=tolerance,
        status="verified" if residual <= tolerance else "inconsistent",
        seconds=time.perf_counter() - start,
    )


def decode_layer0_robust(B, model: _minilm.MiniLM | None = None, *, powers=(0.0, 1.0, 2.0), **kwargs) -> Layer0Result:
    """Decode with each entry weighting ``B ** power`` and keep the tokens whose maps fit B best.

    For perturbed maps (noise, quantisation, truncation) no single weighting wins everywhere;
    the attacker can compare the candidates on the observation itself, ||B(ids) - B||_F.
    Stops early when a decoding is "verified". ``seconds`` is the total.
    """
    start = time.perf_counter()
    best = None
    for power in powers:
        r = decode_layer0(B, model, weight_power=power, **kwargs)
        if best is None or r.fit < best.fit:
            best = r
        if r.status == "verified":
            break
    best.seconds = time.perf_counter() - start
    return best


def layer0_maps(model: _minilm.MiniLM, ids: np.ndarray) -> np.ndarray:
    """Layer-0 attention maps of ``ids`` in float64: row-softmax of the logits of their layer-0 columns."""
    scan = scanner_for(model)
    Q, K = scan.columns_qk(ids, np.arange(len(ids)))
    S = np.matmul(Q, np.swapaxes(K, 1, 2)) * scan.scale
    S = S - S.max(axis=-1, keepdims=True)
    E = np.exp(S)
    return E / E.sum(axis=-1, keepdims=True)


_SCANNERS: dict[int, Layer0Scanner] = {}


def scanner_for(model: _minilm.MiniLM) -> Layer0Scanner:
    """The scanner of ``model`` (built once, about 1 s and 200 MB)."""
    key = id(model)
    if key not in _SCANNERS:
        _SCANNERS.clear()
        _SCANNERS[key] = Layer0Scanner(model)
    return _SCANNERS[key]


# ---- deeper layers: X from the attention maps, through solver.recover ----------------------------
#: up to this d n, solver.recover starts from the closed form or its own random restarts (the dense
#: Newton path); above it the start is the closed form polished by log-domain L-BFGS
SOLVER_START_MAX_DN = 2048
#: proofs_check.recheck forms the dense (dn, dn) Hessian with jax.hessian: up to this d n only
RECHECK_MAX_DN = 4096


@dataclass(frozen=True, eq=False)
class AttentionLayer:
    """The query/key parameters of one BERT self-attention layer and the LayerNorm producing its input.

    **Fields** (float64): `Aq`, `Ak` (H, d_head, d), `bq` (H, d_head), `gamma`, `beta` (d,).

    The layer input X (d x n, columns are tokens) is the hidden state entering the Q/K
    projections: the output of the embedding LayerNorm (layer 0) or of the previous layer's
    output LayerNorm, so every column is ``gamma * z + beta`` with ``1^T z = 0``. With
    ``q_i = A_q x_i + b_q`` and ``k_j = A_k x_j + b_k`` the logits are
    ``S_h = X^T W_h X + 1 u_h^T X`` plus terms that depend on the query i only (every term
    with the key bias b_k), which cancel in the row softmax:
    ``W_h = A_q,h^T A_k,h / sqrt(d_head)`` (rank d_head) and ``u_h = A_k,h^T b_q,h / sqrt(d_head)``:
    the *query* bias produces u.
    """

    Aq: np.ndarray
    bq: np.ndarray
    Ak: np.ndarray
    gamma: np.ndarray
    beta: np.ndarray

    @classmethod
    def of_model(cls, model: _minilm.MiniLM, layer: int) -> "AttentionLayer":
        Aq, bq, Ak = model.query_key(layer)
        key = "embeddings.LayerNorm" if layer == 0 else f"encoder.layer.{layer - 1}.output.LayerNorm"
        w = model.weights
        return cls(Aq, bq, Ak, w[key + ".weight"].astype(np.float64), w[key + ".bias"].astype(np.float64))

    @classmethod
    def random(cls, d: int, heads: int, seed: int = 0, logit_scale: float = 1.0) -> "AttentionLayer":
        """A miniature with the model's structure (H heads of d / H, q bias, LayerNorm input), Gaussian weights.

        Logits are O(logit_scale) on LayerNorm inputs.
        """
        if d % heads:
            raise InvalidProblemError(f"d = {d} must be a multiple of heads = {heads}")
        rng = np.random.default_rng(seed)
        dh = d // heads
        Aq, Ak = rng.normal(scale=math.sqrt(logit_scale / d), size=(2, heads, dh, d))
        return cls(Aq, rng.normal(scale=0.5, size=(heads, dh)), Ak, 1 + 0.2 * rng.standard_normal(d), 0.1 * rng.standard_normal(d))

    @property
    def heads(self) -> int:
        return self.Aq.shape[0]

    @property
    def d_head(self) -> int:
        return self.Aq.shape[1]

    @property
    def d(self) -> int:
        return self.Aq.shape[2]

    @property
    def W(self) -> np.ndarray:
        return np.einsum("hed,hef->hdf", self.Aq, self.Ak) / math.sqrt(self.d_head)

    @property
    def u(self) -> np.ndarray:
        return np.einsum("hed,he->hd", self.Ak, self.bq) / math.sqrt(self.d_head)

    def layer_norm(self, E: np.ndarray) -> np.ndarray:
        """Columns ``gamma * (e - mean e) / std e + beta`` of E (d, n): a valid layer input."""
        Z = E - E.mean(axis=0, keepdims=True)
        Z = Z / np.sqrt((Z * Z).mean(axis=0, keepdims=True) + _minilm.LN_EPS)
        return self.gamma[:, None] * Z + self.beta[:, None]

    def maps(self, X: np.ndarray) -> np.ndarray:
        """The attention maps (H, n, n) of input X in float64 (through the rank-d_head factors)."""
        H, dh, d = self.Aq.shape
        n = X.shape[1]
        Q = (self.Aq.reshape(H * dh, d) @ X).reshape(H, dh, n) + self.bq[:, :, None]
        K = (self.Ak.reshape(H * dh, d) @ X).reshape(H, dh, n)
        S = np.matmul(np.swapaxes(Q, 1, 2), K) / math.sqrt(dh)
        S = np.exp(S - S.max(axis=-1, keepdims=True))
        return S / S.sum(axis=-1, keepdims=True)

    def problem(self, B: np.ndarray) -> Problem:
        """The multi-head attention problem of ``solver``: all heads' W_h, u_h and maps B_h."""
        return Problem.create(self.W, renormalise(np.asarray(B, np.float64)), u=self.u)

    def factors(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(W_q, W_k, d_head)`` with ``W_h = W_q,h^T W_k,h / sqrt(d_head)``: the ``factors`` argument of
        :func:`solver.symmetry.symmetries` (solver.recover finds them from W itself above d = 64)."""
        H, dh, d = self.Aq.shape
        return self.Aq.reshape(H * dh, d), self.Ak.reshape(H * dh, d), dh

    def identifiability(self, n: int) -> "Identifiability":
        return Identifiability(n=n, unknowns=self.d * n, equations=self.heads * n * (n - 1),
                               count_min_n=-(-self.d // self.heads) + 1, closed_form_min_n=2 * self.d_head + 1)


@dataclass(frozen=True)
class Identifiability:
    """What the maps of n positions can determine about X (d x n).

    - `unknowns`: d n; `equations`: H n (n - 1), the independent entries of the row-centred
      log maps. ``count_min_n`` is the smallest n with ``H (n - 1) >= d``: below it a family of
      inputs of dimension at least ``d n - H n (n - 1)`` explains the maps exactly.
    - `closed_form_min_n` = 2 d_head + 1: from there :func:`factor_closed_form` determines X
      (the linear system for the heads' factor changes has a one-dimensional null space).
    """

    n: int
    unknowns: int
    equations: int
    count_min_n: int
    closed_form_min_n: int

    @property
    def verdict(self) -> str:
        if self.n < self.count_min_n:
            return "no: underdetermined"
        if self.n < self.closed_form_min_n:
            return "by count only"
        return "yes: closed form"


def factor_closed_form(B: np.ndarray, layer: AttentionLayer) -> list[np.ndarray]:
    """Candidates for X (d, n) from the maps of all heads in closed form, best first; [] where it does not apply.

    The centred log map of head h, ``G_h = P log B_h P = (A_q,h Y)^T (A_k,h Y) / sqrt(d_head)``
    (``Y = X P``), has rank d_head; with its SVD ``G_h = L_h R_h^T`` (L_h orthonormal),
    ``Y^T A_q,h^T = L_h T_h`` and ``Y^T A_k,h^T / sqrt(d_head) = R_h S_h`` with ``S_h = T_h^{-T}``
    unknown. Stacking the heads, ``Y^T = sqrt(d_head) [R_h S_h]_h W_k^{-T}`` and
    ``Y^T W_q^T = [L_h T_h]_h``, so for every head ``(I - L_h L_h^T) sum_g R_g S_g N_gh = 0``
    with ``N = W_k^{-T} W_q^T`` (blocks N_gh): a homogeneous linear system in the
    H d_head^2 entries of the S_g. For n >= 2 d_head + 1 its null space is the true S up to
    scale; ``T_h^T S_h = I`` fixes the scale up to sign, and the mean column follows from
    ``m^T W_h Y = (1/n) 1^T log B_h P - u_h^T Y`` (solver.algebraic, step 5).

    The sign is not determined by the maps: with ``v = W_q^{-1} b_q`` (``u_h = W_h^T v`` for
    every head), ``X -> -X - 2 v 1^T`` maps every query ``A_q x + b_q = A_q (x + v)`` to its
    negative and every key to its negative plus a constant, which changes each logit row by a
    constant only: an exact symmetry of all heads together (solver.symmetry counts a sign
    flip only when u = 0). The LayerNorm does determine it: the true columns are
    ``gamma * z + beta`` with z of mean 0 and variance 1, the reflected ones are not. The
    candidate with the smaller :func:`layer_norm_defect` comes first; the other is returned
    too only when its defect is within a factor 100 (then the solver's loss decides).
    This needs neither n > d nor full-rank heads (solver.algebraic needs both), nor full-rank Y
    (a LayerNorm output has rank d - 1).
    """
    B = np.asarray(B, np.float64)
    H, dh, d = layer.Aq.shape
    n = B.shape[-1]
    if n < 2 * dh + 1 or np.any(B <= 0):
        return []
    logB = np.log(B)
    G = logB - logB.mean(axis=-1, keepdims=True)
    G = G - G.mean(axis=-2, keepdims=True)
    U, s, Vt = np.linalg.svd(G)
    Ls = U[:, :, :dh]
    Rs = np.swapaxes(Vt[:, :dh], 1, 2) * s[:, None, :dh]
    Wq, Wk = layer.Aq.reshape(H * dh, d), layer.Ak.reshape(H * dh, d)
    N = np.linalg.solve(Wk.T, Wq.T).reshape(H, dh, H, dh).transpose(0, 2, 1, 3)  # N[g, h]
    LR = np.einsum("hma,gmb->hgab", Ls, Rs)
    F = Rs[None] - np.matmul(Ls[:, None], LR)  # F[h, g] = (I - L_h L_h^T) R_g
    # normal matrix of the system, row-major vec(S_g): sum_h (F_hg^T F_hk) kron (N_gh N_kh^T)
    FF = np.einsum("hgni,hkna->gkiah", F, F).reshape(H * H, dh * dh, H)
    NN = np.einsum("ghjl,khbl->gkhjb", N, N).reshape(H * H, H, dh * dh)
    size = H * dh * dh
    gram = np.matmul(FF, NN).reshape(H, H, dh, dh, dh, dh).transpose(0, 2, 4, 1, 3, 5).reshape(size, size)
    del FF, NN
    gram = (gram + gram.T) / 2
    S = _smallest_eigenvector(gram).reshape(H, dh, dh)
    del gram
    RS = np.einsum("hna,hab->hnb", Rs, S)
    T = math.sqrt(dh) * np.einsum("hna,hnb->hab", Ls, np.einsum("gna,ghab->hnb", RS, N, optimize=True))
    c2 = float(np.einsum("hab,hac->", T, S)) / d  # T_h^T S_h = c^2 I for the scaled null vector
    if not c2 > 0:
        return []
    Y = np.linalg.solve(Wk, math.sqrt(dh / c2) * RS.transpose(0, 2, 1).reshape(d, n))
    W, u = layer.W, layer.u
    r = logB.mean(axis=1)
    r = r - r.mean(axis=-1, keepdims=True)
    found = []
    for Ys in (Y, -Y):
        A = np.concatenate([(W[h] @ Ys).T for h in range(H)])
        m = np.linalg.lstsq(A, np.concatenate([r[h] - u[h] @ Ys for h in range(H)]), rcond=None)[0]
        X = Ys + m[:, None]
        if np.all(np.isfinite(X)):
            found.append((layer_norm_defect(X, layer), X))
    found.sort(key=lambda c: c[0])
    return [X for f, X in found if f <= 100 * found[0][0] + 1e-300]


def layer_norm_defect(X: np.ndarray, layer: AttentionLayer) -> float:
    """How far the columns of X are from LayerNorm outputs: RMS over columns of
    ``(mean z, var z - 1)`` with ``z = (x - beta) / gamma`` (0 for a layer input, up to LN_EPS)."""
    Z = (np.asarray(X, np.float64) - layer.beta[:, None]) / layer.gamma[:, None]
    mean = Z.mean(axis=0)
    var = ((Z - mean) ** 2).mean(axis=0)
    return float(np.sqrt(np.mean(mean**2 + (var - 1.0) ** 2)))


def _smallest_eigenvector(A: np.ndarray) -> np.ndarray:
    """Unit eigenvector of the smallest eigenvalue of a symmetric PSD matrix (one null vector)."""
    import scipy.linalg

    if A.shape[0] <= 2048:
        return scipy.linalg.eigh(A, subset_by_index=[0, 0])[1][:, 0]
    # inverse iteration on A + delta I: converges at rate delta / lambda_2 per step
    delta = 1e-12 * float(np.trace(A)) / A.shape[0]
    A[np.diag_indices_from(A)] += delta
    c = scipy.linalg.cho_factor(A, overwrite_a=True, check_finite=False)
    v = np.random.default_rng(0).standard_normal(A.shape[0])
    for _ in range(4):
        v = scipy.linalg.cho_solve(c, v, check_finite=False)
        v /= np.linalg.norm(v)
    return v


def _log_residual(X, layer: AttentionLayer, logB, Wt) -> float:
    """Relative weighted row-centred log-domain residual of X against the maps."""
    data, _ = log_domain_loss(X, layer.Aq, layer.bq, layer.Ak, logB, Wt, X, 0.0)
    Lc = logB - (Wt * logB).sum(-1, keepdims=True) / np.maximum(Wt.sum(-1, keepdims=True), 1.0)
    return math.sqrt(2.0 * data) / max(float(np.sqrt((Wt * Lc * Lc).sum())), 1e-300)


@dataclass
class DeepLayerResult:
    """A recovery of one layer's input X from its maps.

    **Fields**
    - `X`: the recovered input (d x n).
    - `status`: ``"certified"`` (solver.recover's certificate holds and proofs_check.recheck
      recomputed it) or ``"uncertified"``.
    - `certificate_seconds`: time of the certificate attempt at d n > SOLVER_START_MAX_DN (0 if none).
    - `reason`: why it is uncertified (empty when certified).
    - `init`: how the start was obtained: ``"factor closed form"``, ``"random restarts"``
      (solver.recover's own) or ``"prior"`` (the LayerNorm bias, repeated).
    - `method`: what produced X (``solver.recover`` or the log-domain L-BFGS fallback).
    - `identifiability`: :class:`Identifiability` of the instance (its `verdict`).
    - `certificate`: solver.recover's :class:`~solver.certificate.Certificate`, or None.
    - `recheck`: what :func:`proofs_check.recheck.recheck` recomputed for a certified result, else None.
    - `symmetry_dimension`: from solver.recover, None when it did not run.
    - `residual`: relative row-centred log-domain residual ``||(S(X) - log B) P|| / ||log B P||``.
    - `unknowns`, `equations`: as in `identifiability`.
    - `seconds`: wall time.
    """

    X: np.ndarray
    status: str
    reason: str
    init: str
    method: str
    identifiability: Identifiability
    certificate: object
    symmetry_dimension: int | None
    residual: float
    unknowns: int
    equations: int
    seconds: float
    recheck: dict | None = None
    certificate_seconds: float = 0.0


def log_domain_loss(X, Aq, bq, Ak, L, Wt, X0, lam):
    """``1/2 sum_h ||(S_h(X) - L_h) P||_w^2 + lam/2 ||X - X0||^2`` and its gradient in X.

    ``S_h(X) = X^T W_h X + 1 u_h^T X`` evaluated through the rank-32 factors of the head
    (:meth:`MiniLM.query_key`): ``S_h = (A_q,h X + b_q,h 1^T)^T (A_k,h X) / sqrt(32)``, which
    is the same matrix (``W_h = A_q,h^T A_k,h / sqrt 32``, ``u_h = A_k,h^T b_q,h / sqrt 32``)
    at 1/12 of the cost. Each row is centred with its own weights (the optimal row
    constant), so the gradient with respect to S is the weighted centred residual G_h.
    """
    H, dh, d = Aq.shape
    n = X.shape[1]
    scale = 1.0 / math.sqrt(dh)
    Qf = (Aq.reshape(H * dh, d) @ X).reshape(H, dh, n) + bq[:, :, None]
    K = (Ak.reshape(H * dh, d) @ X).reshape(H, dh, n)
    S = np.matmul(np.swapaxes(Qf, 1, 2), K) * scale
    R = S - L
    sw = Wt.sum(-1, keepdims=True)
    c = (Wt * R).sum(-1, keepdims=True) / np.where(sw > 0, sw, 1.0)
    G = Wt * (R - c)
    f = 0.5 * float((G * (R - c)).sum())
    gK = np.matmul(Qf, G) * scale  # (H, dh, n)
    gQ = np.matmul(K, np.swapaxes(G, 1, 2)) * scale
    grad = Ak.reshape(H * dh, d).T @ gK.reshape(H * dh, n) + Aq.reshape(H * dh, d).T @ gQ.reshape(H * dh, n)
    D = X - X0
    return f + 0.5 * lam * float((D * D).sum()), grad + lam * D



def recover_layer_input(B, layer: AttentionLayer, *, gtol: float = 1e-10, seed: int = 0, maxiter: int = 300,
                        validate: bool = True, certify: bool = True) -> DeepLayerResult:
    """Recover the input X (d x n) of ``layer`` from its attention maps B (H, n, n).

    1. **initialise**: :func:`factor_closed_form` when n >= 2 d_head + 1 and B > 0;
    2. small instances (d n <= :data:`SOLVER_START_MAX_DN`, the miniatures): ``solver.recover`` on
       :meth:`AttentionLayer.problem` (the multi-head attention loss with u, every head) from that
       start, or from its own seeded random restarts without one;
    3. larger ones (all-MiniLM-L6-v2, d = 384): L-BFGS on the row-centred log-domain identity
       (:func:`log_domain_loss`) from the closed form, or from the prior (the LayerNorm bias)
       with a small ridge towards it; then, with ``certify`` and a closed form, ``solver.recover``
       from that X (its symmetry analysis takes the heads in factored form,
       :func:`solver.symmetry.factored_algebra`), which certifies or says which constant failed.

    The status is ``certified`` only when solver.recover built a certificate *and*
    :func:`proofs_check.recheck.recheck` recomputed it (that needs the dense (dn)^2 Hessian:
    d n <= :data:`RECHECK_MAX_DN`); otherwise ``uncertified``, with the reason.
    Entries of B that are 0 carry no log-domain information: they disable the closed form
    and get weight 0 in the fallback.
    """
    import scipy.optimize

    from solver.recover import recover

    start = time.perf_counter()
    B = check_attention(B, n_heads=layer.heads)
    H, n, _ = B.shape
    d = layer.d
    ident = layer.identifiability(n)
    starts = factor_closed_form(B, layer)
    init = "factor closed form" if starts else "random restarts"
    positive = B > 0
    logB = np.log(np.where(positive, B, 1.0))
    Wt = positive.astype(np.float64)
    cert = recheck = symdim = None
    cert_seconds = 0.0
    if d * n <= SOLVER_START_MAX_DN:
        problem = layer.problem(B)
        runs = [recover(problem, X_init=X0, certify=False, validate=validate, gtol=gtol, seed=seed)
                for X0 in (starts or [None])]
        res = min(runs, key=lambda r: (r.status != "certified", layer_norm_defect(r.X, layer)))
        X, cert, symdim = res.X, res.certificate, res.symmetry_dimension
        reason = "" if res.status == "certified" else cert.reason
        method = "solver.recover (multi-head attention loss with u, certified Newton)"
    else:
        if not starts:
            init = "prior"
        fits = []
        for prior in starts or [np.repeat(layer.beta[:, None], n, axis=1)]:
            lam = 0.0 if starts else 1e-4  # a ridge towards the prior only where there is no closed form

            def fun(x, prior=prior, lam=lam):
                f, g = log_domain_loss(x.reshape(d, n), layer.Aq, layer.bq, layer.Ak, logB, Wt, prior, lam)
                return f, g.ravel()

            opt = scipy.optimize.minimize(fun, prior.ravel(), jac=True, method="L-BFGS-B",
                                          options={"maxiter": maxiter, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-12})
            Xc = opt.x.reshape(d, n) if opt.fun <= fun(prior.ravel())[0] else prior
            fits.append((_log_residual(Xc, layer, logB, Wt), Xc))
        X = fits[0][1] if starts else min(fits, key=lambda c: c[0])[1]  # closed-form starts: LayerNorm order
        method = "log-domain L-BFGS"
        if not starts:
            reason = (f"no closed form below n = {ident.closed_form_min_n} ({ident.verdict}): L-BFGS from the prior, "
                      f"no certificate tried")
        elif not certify:
            reason = "certificate not attempted (certify=False)"
        else:
            t0 = time.perf_counter()
            res = recover(layer.problem(B), X_init=X, certify=False, validate=validate, gtol=gtol, seed=seed)
            cert_seconds = time.perf_counter() - t0
            X, cert, symdim = res.X, res.certificate, res.symmetry_dimension
            method = "log-domain L-BFGS, then solver.recover (certified Newton) from it"
            reason = "" if res.status == "certified" else f"solver.recover: {cert.reason}"
    status = "uncertified"
    if cert is not None and cert.status == "certified":
        if d * n > RECHECK_MAX_DN:
            reason = (f"solver.recover certified (error bound {cert.error_bound:.2e}), but proofs_check.recheck "
                      f"forms the dense ({d * n}, {d * n}) Hessian and cannot run here (d n <= {RECHECK_MAX_DN})")
        else:
            from proofs_check.recheck import recheck as recheck_certificate
            from solver.errors import CertificateMismatchError

            try:
                recheck = recheck_certificate(cert, layer.problem(B), X)
                status = "certified"
            except CertificateMismatchError as exc:
                reason = f"solver.recover certified, but proofs_check.recheck rejected it: {exc}"
    return DeepLayerResult(X=X, status=status, reason=reason, init=init, method=method, identifiability=ident,
                           certificate=cert, symmetry_dimension=symdim, residual=_log_residual(X, layer, logB, Wt),
                           unknowns=ident.unknowns, equations=ident.equations, seconds=time.perf_counter() - start,
                           recheck=recheck, certificate_seconds=cert_seconds)


def recover_deep_layer(B, model: _minilm.MiniLM | None = None, layer: int = 1, **kwargs) -> DeepLayerResult:
    """:func:`recover_layer_input` for layer ``layer`` of all-MiniLM-L6-v2 (default: the installed model).

    ``certify`` defaults to False here: at d = 384 the attempt costs 7-14 minutes at n = 100, was
    refused on every layer measured (README), and a certificate could not be rechecked at this
    size anyway (d n > RECHECK_MAX_DN), so the status would stay ``uncertified``. Pass
    ``certify=True`` (``unmask attack minilm --try-certificate``) to see the refusal's numbers.
    """
    kwargs.setdefault("certify", False)
    model = model or _minilm.load()
    model.check_layer(layer)
    return recover_layer_input(B, AttentionLayer.of_model(model, layer), **kwargs)


def layer_input_error(result: DeepLayerResult, layer: AttentionLayer, B, X_true) -> float:
    """``||X - X_true|| / ||X_true||``, modulo the instance's symmetry group when solver.recover ran.

    Without the group (solver not run) this is the plain error: an upper bound on the error
    modulo the group.
    """
    X_true = np.asarray(X_true, np.float64)
    if result.symmetry_dimension is None:
        return float(np.linalg.norm(result.X - X_true) / np.linalg.norm(X_true))
    from solver.symmetry import distance_to_orbit

    return distance_to_orbit(layer.problem(B), result.X, X_true)
