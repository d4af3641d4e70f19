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


# ---- deeper layers: the continuous problem ---------------------------------------------------------
@dataclass
class DeepLayerResult:
    """A continuous recovery of one layer's input X from its maps.

    **Fields**
    - `X`: the recovered input (d x n).
    - `residual`: relative weighted log-domain residual
      ``||(S(X) - log B) P||_w / ||log B P||_w`` (rows centred): how well X explains the maps.
    - `unknowns`, `equations`: d n against the number of independent entries of the
      row-centred ``log B`` of all heads, H n (n - 1): when unknowns exceed equations a whole
      family of inputs explains the maps exactly (underdetermined).
    - `status`: "consistent" when the residual is below `tolerance`, else "inconsistent";
      "underdetermined" is appended when unknowns exceed equations.
    - `method`: what produced X.
    - `seconds`: wall time.
    """

    X: np.ndarray
    residual: float
    unknowns: int
    equations: int
    status: str
    method: str
    seconds: float
    iterations: int


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


def recover_deep_layer(
    B,
    model: _minilm.MiniLM | None = None,
    layer: int = 1,
    *,
    X0: np.ndarray | None = None,
    lam: float = 1e-4,
    maxiter: int = 500,
    tolerance: float = 1e-3,
) -> DeepLayerResult:
    """Recover layer ``layer``'s input X (d x n) from its maps B (12, n, n) by continuous least squares.

    The stand-in for the project's certified solver (``solver.recover``) until that exists:
    L-BFGS on the row-centred log-domain identity, :func:`log_domain_loss`, from the prior
    ``X0`` (default: the bias of the LayerNorm that produces this layer's input, repeated:
    the mean of a LayerNorm output whose normalised part averages out), with a small ridge
    ``lam`` towards it. Entries of B that are 0 get weight 0.
    """
    import scipy.optimize

    start = time.perf_counter()
    model = model or _minilm.load()
    model.check_layer(layer)
    B = np.asarray(B, dtype=np.float64)
    H, n, _ = B.shape
    Aq, bq, Ak = model.query_key(layer)
    d = Aq.shape[2]
    positive = B > 0
    L = np.log(np.where(positive, B, 1.0))
    Wt = positive.astype(np.float64)
    if X0 is None:
        X0 = np.repeat(prior_mean(model, layer)[:, None], n, axis=1)

    def fun(x):
        f, g = log_domain_loss(x.reshape(d, n), Aq, bq, Ak, L, Wt, X0, lam)
        return f, g.ravel()

    opt = scipy.optimize.minimize(
        fun, X0.ravel(), jac=True, method="L-BFGS-B", options={"maxiter": maxiter, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-10}
    )
    X = opt.x.reshape(d, n)
    Lc = L - (Wt * L).sum(-1, keepdims=True) / np.maximum(Wt.sum(-1, keepdims=True), 1.0)
    data, _ = log_domain_loss(X, Aq, bq, Ak, L, Wt, X, 0.0)
    residual = math.sqrt(2.0 * data) / float(np.sqrt((Wt * Lc * Lc).sum()))
    unknowns, equations = d * n, H * n * (n - 1)
    status = "consistent" if residual <= tolerance else "inconsistent"
    if unknowns > equations:
        status += ", underdetermined"
    return DeepLayerResult(
        X=X,
        residual=residual,
        unknowns=unknowns,
        equations=equations,
        status=status,
        method="log-domain least squares (L-BFGS; stand-in for solver.recover)",
        seconds=time.perf_counter() - start,
        iterations=int(opt.nit),
    )


def prior_mean(model: _minilm.MiniLM, layer: int) -> np.ndarray:
    """The bias of the LayerNorm whose output is layer ``layer``'s input (d,), float64."""
    w = model.weights
    key = "embeddings.LayerNorm.bias" if layer == 0 else f"encoder.layer.{layer - 1}.output.LayerNorm.bias"
    return w[key].astype(np.float64)
