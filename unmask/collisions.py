"""The collision test: are the last-token hidden states of distinct prompts ever equal?

For many distinct prompts (`generate_prompts`: natural sentences from a small grammar and random
token sequences, no data download), take the residual stream of the last token at layers 1,
L/2 and L, and find the minimum pairwise L2 distance by exact, blocked nearest-neighbour search
(`min_pairwise_distance`: float64 Gram blocks, memory bounded by the block size). Then, for the
closest pairs, the exhaustive one-token-extension test (`extension_test`): append every
vocabulary token to both prompts of a pair and take the minimum distance among all ``2 |V|``
continuations' last-token states.

Layer ``l`` is the residual stream after ``l`` blocks (see `unmask.models.smollm`).
"""

from __future__ import annotations

import heapq
import time

import jax.numpy as jnp
import numpy as np

from solver.errors import InvalidProblemError, MemoryBudgetError

#: The paper's minimum distances (layer 1 / L/2 / L), 100k prompts per model (arXiv 2510.15511).
PAPER_MIN_DISTANCES = {
    "TinyStories-33M": (0.029, 1.434, 2.793),
    "Llama-3.1-8B": (0.001, 0.129, 0.620),
}


def min_pairwise_distance(X, *, k: int = 1, block: int = 2048, memory_budget: int = 2 << 30) -> dict:
    """Exact minimum pairwise L2 distance among the rows of ``X`` (n, d), blocked.

    Squared distances come from float64 Gram blocks (``|a|^2 + |b|^2 - 2 a.b``; float64 keeps
    the cancellation error near 1e-16 |a|^2, far below any distance reported here), the ``k``
    smallest pairs are kept across blocks and their distances recomputed directly as ``|a - b|``.
    Peak extra memory is about ``3 * block^2 * 8`` bytes.

    Returns ``{"min_distance", "pair", "pairs": [(dist, i, j), ...] (k smallest, i < j),
    "n_pairs", "seconds"}``.
    """
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] < 2:
        raise InvalidProblemError(f"need at least two rows (n, d), got shape {X.shape}")
    if 3 * block * block * 8 > memory_budget:
        raise MemoryBudgetError(
            f"block {block} needs about {3 * block * block * 8 / 2**30:.1f} GiB; the budget is "
            f"{memory_budget / 2**30:.1f} GiB; use a smaller block"
        )
    t0 = time.perf_counter()
    X64 = X.astype(np.float64)
    n = X64.shape[0]
    sq = np.einsum("ij,ij->i", X64, X64)
    best: list[tuple[float, int, int]] = []  # max-heap of (-d2, i, j)
    for a in range(0, n, block):
        A, sa = X64[a : a + block], sq[a : a + block]
        for b in range(a, n, block):
            Bm, sb = X64[b : b + block], sq[b : b + block]
            d2 = sa[:, None] + sb[None, :] - 2.0 * (A @ Bm.T)
            if a == b:
                d2[np.tril_indices(d2.shape[0], 0, d2.shape[1])] = np.inf
            flat = d2.ravel()
            m = min(k, flat.size)
            idx = np.argpartition(flat, m - 1)[:m] if m < flat.size else np.arange(flat.size)
            for f in idx:
                val = float(flat[f])
                if not np.isfinite(val):
                    continue
                i, j = a + int(f) // d2.shape[1], b + int(f) % d2.shape[1]
                item = (-val, i, j)
                if len(best) < k:
                    heapq.heappush(best, item)
                elif item > best[0]:
                    heapq.heapreplace(best, item)
    pairs = sorted(
        (float(np.linalg.norm(X64[i] - X64[j])), i, j) for _, i, j in best
    )
    return {
        "min_distance": pairs[0][0],
        "pair": (pairs[0][1], pairs[0][2]),
        "pairs": pairs,
        "n_pairs": n * (n - 1) // 2,
        "seconds": time.perf_counter() - t0,
    }


# ----------------------------------------------------------------------------- prompts

_SUBJECTS = ["the cat", "a young doctor", "my neighbour", "the old man", "our team", "the river", "a small bird",
             "the teacher", "every student", "the machine", "her brother", "the committee", "a stranger",
             "the children", "this company", "the engineer", "the moon", "a quiet village", "the market", "my friend"]
_VERBS = [("sees", "see"), ("builds", "build"), ("remembers", "remember"), ("carries", "carry"), ("paints", "paint"),
          ("finds", "find"), ("explains", "explain"), ("follows", "follow"), ("watches", "watch"), ("sells", "sell"),
          ("writes about", "write about"), ("forgets", "forget"), ("opens", "open"), ("measures", "measure"),
          ("borrows", "borrow"), ("describes", "describe"), ("repairs", "repair"), ("visits", "visit"),
          ("loves", "love"), ("fears", "fear")]
_OBJECTS = ["a red house", "the long letter", "three apples", "the broken clock", "an empty road", "the new bridge",
            "a strange song", "the last train", "two old books", "the winter garden", "a warm coat", "the data",
            "the mountain path", "a blue umbrella", "the final answer", "some fresh bread", "the city lights"]
_ADVERBS = ["slowly", "every morning", "without a word", "at night", "again", "with great care", "in the rain",
            "before dinner", "on Sundays", "quite often", "for no reason", "after the storm", "in silence"]
_TEMPLATES = [
    "{S} {V} {O}.", "{S} {V} {O} {A}.", "Yesterday {S} {V} {O}.", "Why does {S} {V2} {O}?",
    "I think {S} {V} {O} {A}.", "{S} never {V2} {O}, but {S2} {V} {O2}.", "In {Y}, {S} {V} {O}.",
    "Question {N}: does {S} {V2} {O}?", "{S} {V} {O} and {O2} {A}.", "Note {N}: {S} {V} {O}.",
]


def _natural(rng: np.random.Generator) -> str:
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    v = pick(_VERBS)
    text = pick(_TEMPLATES).format(
        S=pick(_SUBJECTS), S2=pick(_SUBJECTS), V=v[0], V2=v[1],
        O=pick(_OBJECTS), O2=pick(_OBJECTS), A=pick(_ADVERBS), Y=int(rng.integers(1800, 2030)), N=int(rng.integers(1, 1000)),
    )
    return text[0].upper() + text[1:]


def generate_prompts(model, n: int, *, seed: int = 0, max_len: int = 16, natural_fraction: float = 0.5) -> list[np.ndarray]:
    """``n`` distinct prompts as int32 token arrays (no data download).

    A ``natural_fraction`` are sentences from a small grammar (templates x subjects x verbs x
    objects x adverbs x numbers), the rest random token sequences (uniform ids, length 1 to
    ``max_len``). Prompts are truncated to ``max_len`` tokens and deduplicated by their ids, so
    every pair compared is a pair of different token sequences.
    """
    if n < 2:
        raise InvalidProblemError(f"need at least 2 prompts, got {n}")
    rng = np.random.default_rng(seed)
    V = model.config.vocab_size
    seen: set[tuple[int, ...]] = set()
    out: list[np.ndarray] = []
    n_nat = int(round(n * natural_fraction))
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n:
            raise InvalidProblemError(f"could not generate {n} distinct prompts")
        if len(out) < n_nat:
            ids = model.encode(_natural(rng))[:max_len]
        else:
            ids = rng.integers(0, V, int(rng.integers(1, max_len + 1))).astype(np.int32)
        key = tuple(int(i) for i in ids)
        if not key or key in seen:
            continue
        seen.add(key)
        out.append(np.asarray(ids, dtype=np.int32))
    return out


def last_token_states(model, prompts: list[np.ndarray], layers: tuple[int, ...], *, batch: int = 64) -> dict[int, np.ndarray]:
    """Last-token residual stream of every prompt at each of ``layers``: ``{layer: (n, d) float32}``.

    Prompts are sorted by length and run in right-padded batches (padding after the last token
    cannot change it: attention is causal); lengths are rounded up to a multiple of 4 and the
    batch size is fixed to bound the number of compiled shapes.
    """
    layers = tuple(model.check_layer(l) for l in layers)
    upto = max(layers)
    n, d = len(prompts), model.config.d_model
    out = {l: np.empty((n, d), dtype=np.float32) for l in layers}
    order = sorted(range(n), key=lambda i: len(prompts[i]))
    for s in range(0, n, batch):
        idx = order[s : s + batch]
        T = -(-max(len(prompts[i]) for i in idx) // 4) * 4
        ids = np.zeros((batch, T), dtype=np.int32)
        last = np.zeros(batch, dtype=np.int64)
        for r, i in enumerate(idx):
            ids[r, : len(prompts[i])] = prompts[i]
            last[r] = len(prompts[i]) - 1
        hs = model.hidden_states(ids, upto=upto)
        for l in layers:
            h = np.asarray(hs[l])
            out[l][idx] = h[np.arange(len(idx)), last[: len(idx)]]
    return out


def collision_test(model, n_prompts: int, *, seed: int = 0, layers: tuple[int, ...] | None = None, k: int = 10,
                   max_len: int = 16, block: int = 2048) -> dict:
    """Minimum pairwise distance of last-token states of ``n_prompts`` distinct prompts, per layer.

    Returns ``{"layers", "n_prompts", "n_pairs", "min_distance": {layer: float},
    "closest_pairs": {layer: [(dist, i, j), ...]}, "prompts", "states", "seconds": {...}}``.
    """
    L = model.config.n_layers
    layers = (1, L // 2, L) if layers is None else tuple(layers)
    t0 = time.perf_counter()
    prompts = generate_prompts(model, n_prompts, seed=seed, max_len=max_len)
    t1 = time.perf_counter()
    states = last_token_states(model, prompts, layers)
    t2 = time.perf_counter()
    nn = {l: min_pairwise_distance(states[l], k=k, block=block) for l in layers}
    t3 = time.perf_counter()
    return {
        "layers": list(layers),
        "n_prompts": n_prompts,
        "n_pairs": n_prompts * (n_prompts - 1) // 2,
        "min_distance": {l: nn[l]["min_distance"] for l in layers},
        "closest_pairs": {l: nn[l]["pairs"] for l in layers},
        "median_norm": {l: float(np.median(np.linalg.norm(states[l], axis=1))) for l in layers},
        "prompts": prompts,
        "states": states,
        "seconds": {"prompts": t1 - t0, "forward": t2 - t1, "search": t3 - t2, "total": t3 - t0},
    }


def extension_test(model, prompt_a, prompt_b, layer: int, *, vocab=None, batch: int = 1024) -> dict:
    """One-token extensions of a pair: ``min_v ||F_l(a + v) - F_l(b + v)||`` over ``vocab``.

    ``vocab``: token ids to append (default: one token per distinct embedding row, the
    exhaustive test; tokens with identical embedding rows have identical states, see
    `SmolLM.embedding_classes`). The
    last-token states of ``a + v`` and ``b + v`` are computed in batches on the KV caches of
    ``a`` and ``b``. Also returns the minimum over all pairs among the ``2 |vocab|``
    continuations (exact, blocked float64) when ``|vocab| <= 8192``.
    """
    from unmask.sipit import _bucket, _context

    layer = model.check_layer(layer)
    distinct = model.embedding_classes()[0]
    vocab = distinct if vocab is None else np.asarray(vocab, dtype=np.int32)
    ctx = _context(model, layer)
    t0 = time.perf_counter()

    def continuations(prefix):
        prefix = np.asarray(prefix, dtype=np.int32)
        P = len(prefix)
        ck, cv = model.empty_cache(layer, _bucket(P + 1))
        zero = jnp.zeros((model.config.d_model,), jnp.float32)
        for t, tok in enumerate(prefix):
            _, k, v = ctx.verify(ctx.w, ck, cv, jnp.int32(t), jnp.asarray([tok], dtype=jnp.int32), zero)
            ck, cv = ck.at[:, t].set(k[:, 0]), cv.at[:, t].set(v[:, 0])
        S = np.empty((len(vocab), model.config.d_model), dtype=np.float32)
        for s in range(0, len(vocab), batch):
            ids = vocab[s : s + batch]
            pad = np.concatenate([ids, np.zeros(batch - len(ids), dtype=np.int32)])
            S[s : s + len(ids)] = np.asarray(ctx.candidate_states(ck, cv, P, jnp.asarray(pad)))[: len(ids)]
        return S

    Sa, Sb = continuations(prompt_a), continuations(prompt_b)
    d = np.linalg.norm(Sa.astype(np.float64) - Sb.astype(np.float64), axis=1)
    j = int(np.argmin(d))
    out = {
        "layer": layer,
        "n_extensions": int(len(vocab)),
        "exhaustive": len(vocab) >= len(distinct),
        "min_same_token_distance": float(d[j]),
        "argmin_token": int(vocab[j]),
    }
    if len(vocab) <= 8192:
        nn = min_pairwise_distance(np.concatenate([Sa, Sb]))
        out["min_all_pairs_distance"] = nn["min_distance"]
        out["n_all_pairs"] = nn["n_pairs"]
    out["seconds"] = time.perf_counter() - t0
    return out


def nearest_neighbour_distances(X, *, block: int = 2048) -> np.ndarray:
    """Each row's distance to its nearest other row (exact, blocked float64), shape ``(n,)``."""
    X64 = np.asarray(X, dtype=np.float64)
    n = X64.shape[0]
    sq = np.einsum("ij,ij->i", X64, X64)
    out = np.full(n, np.inf)
    for a in range(0, n, block):
        d2 = sq[a : a + block, None] + sq[None, :] - 2.0 * (X64[a : a + block] @ X64.T)
        d2[np.arange(d2.shape[0]), a + np.arange(d2.shape[0])] = np.inf
        out[a : a + block] = d2.min(axis=1)
    return np.sqrt(np.maximum(out, 0.0))
