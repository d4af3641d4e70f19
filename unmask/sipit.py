"""SipIt: exact prompt recovery from the hidden states of a causal LM (arXiv 2510.15511).

Given the weights and the hidden states ``H`` (T, d) of *all* positions at one layer ``l``, the
prompt is recovered position by position. At position ``t`` the prefix ``v_0 .. v_{t-1}`` is
already known, so its keys and values (the KV cache) are fixed; a *policy* proposes candidate
tokens ``v`` and a *verifier* computes the state ``F_l(prefix + v)_t`` for a batch of them at
once on top of the cache and accepts the closest one when it lies within ``eps`` of ``H[t]``.

Layer ``l`` is the residual stream after ``l`` blocks (``l = 0``: token embeddings; ``l = 30``:
after the last block, before the final norm), see `unmask.models.smollm`.

Policies:

- `GradientPolicy` (the paper's): SGD on a continuous input embedding ``e`` at position ``t``
  minimising ``||F_l(prefix, e)_t - H[t]||^2``, then propose the vocabulary embeddings nearest
  to ``e`` that have not been tried yet; if none passes, take more steps and propose again.
  The walk starts from a linear read-out of ``H[t]`` (`StateReadout`, fitted once per layer on
  the model's states of random-token prompts), whose nearest tokens are verified before any
  step: one verifier batch costs about as much as one SGD step, and at shallow layers the
  read-out alone usually ranks the true token first.
- `BruteForcePolicy`: the whole vocabulary in a random order (the baseline).

At the last layer the gradient policy also proposes the tokens the model itself predicts after
the recovered prefix (`_PriorGate`: free from the observed ``H[t-1]``, kept only while it earns
its batch slots, so random-token prompts hardly pay for it).

Either way at most ``|V|`` candidates are verified per position. Theorem 3.2: if every observed
state is within ``eps`` of the true one and ``eps < Delta / 2``, where ``Delta`` is the minimum
distance between the states of two different candidates at that position, exactly one candidate
passes, so the recovery is exact. When no candidate passes (states from another model, too much
noise) the recovery stops and reports the failing position; it never labels a guess exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from solver.errors import InvalidProblemError, UnmaskError
from unmask.models.smollm import SmolLM, SmolLMWeights

#: Default verifier radius, relative to the norm of the observed state. Everything is float32
#: (unit roundoff 6e-8); recomputing a state in another summation order (a batched KV-cache pass
#: against a full causal pass, or another implementation) differs by a few 1e-6 relative, while
#: the states of two different tokens differ by far more (Delta, see `candidate_delta`: 0.024
#: at layer 1 position 0, where the median state norm is 65, i.e. 4e-4 relative, so the default
#: radius stays below Delta / 2 there). Pass
#: ``eps`` (absolute) for noisy states: exact when noise <= eps < Delta / 2 (Theorem 3.2).
DEFAULT_REL_EPS = 1e-4


class RecoveryFailedError(UnmaskError):
    """No candidate token passed the verifier at some position."""


def _pow2(n: int, least: int = 8) -> int:
    return max(least, 1 << (int(n) - 1).bit_length())


def _bucket(n: int, size: int = 32) -> int:
    return max(size, -(-n // size) * size)


@dataclass
class SipItResult:
    """What `sipit` recovered.

    ``recovered``: token ids verified so far (all ``T`` when ``complete``). ``exact``: recovered
    equals ``original`` (``None`` when no original was given). ``candidates_per_position``: how
    many candidate states the verifier computed at each position (whole batches counted).
    ``exact_up_to_duplicates``: equal up to tokens with identical embedding rows (which no method
    can distinguish, see `SmolLM.embedding_classes`). ``distances``: verifier distance of the accepted token at each position (same unit as the
    states). ``failed_position``: the position where no candidate passed, else ``None``.
    """

    layer: int
    policy: str
    eps: list[float]
    recovered: list[int]
    complete: bool
    failed_position: int | None
    candidates_per_position: list[int]
    distances: list[float]
    seconds: float
    vocab_size: int
    original: list[int] | None = None
    exact: bool | None = None
    exact_up_to_duplicates: bool | None = None
    seconds_per_position: list[float] = field(default_factory=list)
    lm_prior_positions: int = 0

    @property
    def vocab_fraction(self) -> float:
        """Mean fraction of the vocabulary verified per position."""
        c = self.candidates_per_position
        return float(np.mean(c)) / self.vocab_size if c else 0.0

    def to_json(self, tokenizer=None) -> dict:
        out = {
            "layer": self.layer,
            "policy": self.policy,
            "original_ids": self.original,
            "recovered_ids": self.recovered,
            "exact": self.exact,
            "exact_up_to_duplicate_embeddings": self.exact_up_to_duplicates,
            "complete": self.complete,
            "failed_position": self.failed_position,
            "candidates_per_position": self.candidates_per_position,
            "vocab_fraction_explored": self.vocab_fraction,
            "verifier_distance": self.distances,
            "eps": self.eps,
            "seconds": self.seconds,
            "seconds_per_position": self.seconds_per_position,
            "lm_prior_positions": self.lm_prior_positions,
        }
        if tokenizer is not None:
            out["original"] = None if self.original is None else tokenizer.decode(self.original)
            out["recovered"] = tokenizer.decode(self.recovered)
        return out


def _context(model: SmolLM, layer: int) -> "_Context":
    """The `_Context` of ``model`` at ``layer``, built once (its jitted functions compile once)."""
    cache = model.__dict__.setdefault("_sipit_contexts", {})
    if layer not in cache:
        cache[layer] = _Context(model, layer)
    return cache[layer]


class _Context:
    """Jitted pieces shared by the policies and the verifier for one model and layer."""

    def __init__(self, model: SmolLM, layer: int):
        self.model = model
        self.layer = layer
        self.w: SmolLMWeights = model.weights.blocks(layer)
        E = model.weights.embed
        self.embed_sq = jnp.sum(E * E, axis=1)
        self.embed_np = np.asarray(E)

        def states(w, ck, cv, pos, x):
            return model._extend_jit(w, ck, cv, pos, x, model.cos, model.sin)

        def verify(w, ck, cv, pos, ids, target):
            d, _, k, v = verify_states(w, ck, cv, pos, ids, target)
            return d, k, v

        def verify_states(w, ck, cv, pos, ids, target):
            h, k, v = states(w, ck, cv, pos, w.embed[ids])
            return jnp.sqrt(jnp.sum(jnp.square(h - target), axis=1)), h, k, v

        def losses(e, w, ck, cv, pos, target, scale):
            h, _, _ = states(w, ck, cv, pos, e)
            return jnp.sum(jnp.square((h - target) / scale), axis=1)

        def sgd(w, ck, cv, pos, target, scale, e, i0, steps, lr, horizon):
            # Normalised gradient steps, one per chain (rows of e), with a step length decaying
            # linearly over `horizon` steps: the loss scale changes by orders of magnitude from
            # layer 1 to 30, the step length must not.
            def body(i, carry):
                e, _ = carry
                l, vjp = jax.vjp(lambda e: losses(e, w, ck, cv, pos, target, scale), e)
                (g,) = vjp(jnp.ones_like(l))
                g = jnp.where(jnp.isfinite(g), g, jnp.float32(0.0))
                frac = jnp.maximum(jnp.float32(0.05), 1.0 - (i0 + i).astype(jnp.float32) / horizon)
                return e - lr * frac * g / (jnp.linalg.norm(g, axis=1, keepdims=True) + jnp.float32(1e-30)), l

            l0 = jnp.zeros((e.shape[0],), jnp.float32)
            return jax.lax.fori_loop(jnp.int32(0), steps, body, (e, l0))

        def nearest_order(E, embed_sq, e):
            return embed_sq[None, :] - 2.0 * (e @ E.T)

        def secant_residuals(E, a, B, target):
            # ||H[t] - a - B^T E_v||^2 for every row of E: one (V, d) @ (d, d) product
            return jnp.sum(jnp.square(target - a - E @ B), axis=1)

        self.next_logits = jax.jit(model.head)  # the model's prior (see `_PriorGate`)
        self.verify = jax.jit(verify)
        self.verify_states = jax.jit(verify_states)
        self.sgd = jax.jit(sgd)
        self.nearest = jax.jit(nearest_order)
        self.secant_residuals = jax.jit(secant_residuals)
        self._readout: StateReadout | None = None

    def readout(self) -> "StateReadout":
        """The layer's `StateReadout`, fitted on first use (see `fit_readout`)."""
        if self._readout is None:
            self._readout = fit_readout(self.model, self.layer)
        return self._readout

    def warmup(self, max_len: int, max_batch: int = 1024, chains: int = 8) -> None:
        """Compile every verifier batch shape (powers of two) and the SGD step once."""
        ck, cv = self.model.empty_cache(self.layer, max_len)
        z = jnp.zeros((self.model.config.d_model,), jnp.float32)
        n = 8
        while n <= max_batch:
            self.verify_states(self.w, ck, cv, jnp.int32(0), jnp.zeros((n,), jnp.int32), z)[0].block_until_ready()
            n *= 2
        self.state(ck, cv, 0, jnp.zeros((1, self.model.config.d_model), jnp.float32)).block_until_ready()
        if self.layer == self.model.config.n_layers:  # the model's prior, on by default only here
            self.next_logits(z).block_until_ready()
        e = jnp.zeros((chains, self.model.config.d_model), jnp.float32)
        self.sgd(self.w, ck, cv, jnp.int32(0), z, z + 1, e, jnp.int32(0), jnp.int32(1), jnp.float32(1.0),
                 jnp.float32(40.0))[0].block_until_ready()

    def state(self, ck, cv, pos, x):
        """States at position ``pos`` for continuous input embeddings ``x`` (B, d)."""
        return self.model._extend_jit(self.w, ck, cv, jnp.int32(pos), x, self.model.cos, self.model.sin)[0]

    def candidate_states(self, ck, cv, pos, ids):
        h, _, _ = self.model._extend_jit(self.w, ck, cv, jnp.int32(pos), self.w.embed[ids], self.model.cos, self.model.sin)
        return h


class BruteForcePolicy:
    """The baseline: every token in a random order, ``batch`` at a time.

    ``candidates`` restricts the search to a subset of the vocabulary (default: all of it).
    """

    name = "bruteforce"

    def __init__(self, batch: int = 512, seed: int = 0, candidates=None):
        self.batch = batch
        self.rng = np.random.default_rng(seed)
        self.candidates = None if candidates is None else np.asarray(candidates, dtype=np.int32)

    def proposals(self, ctx: _Context, ck, cv, pos: int, target, visited: np.ndarray, prior=None):
        """Yield candidate id batches (``prior`` is ignored: the baseline has no ordering)."""
        pool = np.arange(ctx.model.config.vocab_size, dtype=np.int32) if self.candidates is None else self.candidates
        order = self.rng.permutation(pool).astype(np.int32)
        for s in range(0, len(order), self.batch):
            yield order[s : s + self.batch]


@dataclass(frozen=True)
class StateReadout:
    """Linear maps between input embeddings and observed states: where the search starts.

    Two ridge regressions (standardised states -> embedding rows), one for position 0 (no
    context: the state is a function of the token alone, with the massive activations of the
    first position) and one for positions >= 1. Fitted by `fit_readout` on the states this model
    produces for prompts of *uniformly random* tokens, so it has no prior over natural text and
    has seen no benchmark prompt. It only orders the search: every proposal still goes through
    the verifier. The same data give the forward map (embedding -> state, ``forward``), averaged
    over random prefixes: the prior of the per-position secant model of `GradientPolicy`.
    """

    layer: int
    mean: np.ndarray  # (2, d): position 0, positions >= 1
    scale: np.ndarray  # (2, d)
    coef: np.ndarray  # (2, d, d)
    offset: np.ndarray  # (2, d)
    forward: np.ndarray  # (2, d, d): state ~ (e - mean e) @ forward[i] + mean state
    seconds: float = 0.0

    def predict(self, state: np.ndarray, pos: int) -> np.ndarray:
        """Predicted input embedding (d,) float32 for one observed state at position ``pos``."""
        i = 0 if pos == 0 else 1
        z = (np.asarray(state, dtype=np.float64) - self.mean[i]) / self.scale[i]
        return (z @ self.coef[i] + self.offset[i]).astype(np.float32)


def _ridge(X: np.ndarray, Y: np.ndarray, lam: float):
    X = X.astype(np.float64)
    Y = Y.astype(np.float64)
    mu, sd = X.mean(0), X.std(0) + 1e-6
    Z = (X - mu) / sd
    coef = np.linalg.solve(Z.T @ Z + lam * len(Z) * np.eye(Z.shape[1]), Z.T @ (Y - Y.mean(0)))
    return mu, sd, coef, Y.mean(0)


class _LinearFit:
    """Running least squares ``Y ~ a + X @ B`` with a ridge toward a prior map.

    Sums of ``X``, ``Y``, ``X^T X`` and ``X^T Y`` (float64) are kept, so adding a batch costs
    ``O(n d^2)`` and a solve ``O(d^3)`` whatever the number of samples so far.
    """

    def __init__(self, dx: int, dy: int):
        self.n = 0
        self.sx, self.sy = np.zeros(dx), np.zeros(dy)
        self.sxx, self.sxy = np.zeros((dx, dx)), np.zeros((dx, dy))

    def add(self, X: np.ndarray, Y: np.ndarray) -> "_LinearFit":
        X = np.asarray(X, dtype=np.float64)
        Y = np.asarray(Y, dtype=np.float64)
        self.n += len(X)
        self.sx += X.sum(0)
        self.sy += Y.sum(0)
        self.sxx += X.T @ X
        self.sxy += X.T @ Y
        return self

    def solve(self, prior: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
        """``(a, B)`` minimising ``||Yc - Xc B||^2 + lam ||B - prior||^2`` (centred samples).

        ``lam`` is in units of ``X``'s sum of squares: for embeddings (coordinate variance
        0.01) ``lam = 10`` weighs the prior like 1000 samples.
        """
        mx, my = self.sx / self.n, self.sy / self.n
        cxx = self.sxx - self.n * np.outer(mx, mx)
        cxy = self.sxy - self.n * np.outer(mx, my)
        B = np.linalg.solve(cxx + lam * np.eye(len(mx)), cxy + lam * prior)
        return my - mx @ B, B


def fit_readout(model: SmolLM, layer: int, *, n_prompts: int = 240, length: int = 20, n_single: int = 2048,
                lam: float = 1e-4, seed: int = 12345) -> StateReadout:
    """Fit the `StateReadout` of ``model`` at ``layer`` from its own states of random prompts.

    ``n_prompts`` prompts of ``length`` uniformly random tokens (one per distinct embedding row)
    give the pairs at positions >= 1; ``n_single`` distinct random one-token prompts give
    position 0. Cost: ``n_prompts * length + n_single`` token forward passes through ``layer``
    blocks (about a tenth of one brute-force position at 240 x 20 + 2048), once per layer.
    """
    layer = model.check_layer(layer)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    reps = model.embedding_classes()[0]
    E = np.asarray(model.weights.embed)
    ids = rng.choice(reps, (n_prompts, length)).astype(np.int32)
    H = np.concatenate([np.asarray(model.hidden_states(ids[s : s + 16], upto=layer)[layer])
                        for s in range(0, n_prompts, 16)])
    single = rng.choice(reps, min(n_single, len(reps)), replace=False).astype(np.int32)
    H0 = np.concatenate([np.asarray(model.hidden_states(single[s : s + 256, None], upto=layer)[layer][:, 0])
                         for s in range(0, len(single), 256)])
    X0 = np.concatenate([H0, H[:, 0]])
    Y0 = E[np.concatenate([single, ids[:, 0]])]
    X1, Y1 = H[:, 1:].reshape(-1, H.shape[-1]), E[ids[:, 1:].reshape(-1)]
    fits = [_ridge(X0, Y0, lam), _ridge(X1, Y1, lam)]
    mean, scale, coef, offset = (np.stack(a) for a in zip(*fits))
    # forward maps embedding -> state, lightly regularised (ridge 1e-3 n against the coordinate
    # variance 0.01 n of the embeddings)
    d = E.shape[1]
    forward = np.stack([_LinearFit(d, d).add(Y, X).solve(np.zeros((d, d)), 1e-3 * len(Y))[1]
                        for X, Y in ((X0, Y0), (X1, Y1))])
    return StateReadout(layer, mean, scale, coef, offset, forward, seconds=time.perf_counter() - t0)


class GradientPolicy:
    """Read-out, secant ranking of the whole vocabulary, then SGD chains; nearest tokens proposed.

    The search starts from the `StateReadout` prediction ``e0`` of the observed state: its
    ``first`` nearest tokens are verified before anything else (one batch, the cost of about
    one SGD step at layer 30; at shallow layers it usually holds the true token). Then
    ``newton_steps`` quasi-Newton steps on ``e`` use the read-out's linear map ``R`` as an
    approximate inverse Jacobian: ``e <- e + R(H[t]) - R(F_l(prefix, e)_t)`` (forward passes
    only), each proposing the ``per_step`` nearest unvisited tokens.

    **Secant ranking** (``secant_batch > 0``): every verified batch also returns the candidates'
    states ``F_l(prefix + v)_t`` at this position, for this prefix. A linear model
    ``F(e) ~ a + e B`` is fitted to all of them (ridge toward the read-out's forward map,
    averaged over random prefixes, with weight ``secant_prior``), and the *whole* vocabulary is
    ranked by the predicted residual ``||H[t] - a - E_v B||`` (one ``(V, d) @ (d, d)`` product);
    the ``secant_batch`` best unvisited tokens are verified, their states are added to the fit,
    and the ranking is redone, until a token passes or the vocabulary is exhausted. The model
    is a secant, not the tangent at one point: at deep layers the read-out starts 2-4 embedding
    units from the true token (token embeddings have norm 3), too far for a linearisation at
    ``e0`` (measured worse than the nearest-embedding order there, and Gauss-Newton steps from
    ``e0`` diverge), while the least-squares fit over the verified tokens averages the map over
    the region the candidates come from, and keeping only the samples nearest to ``H[t]``
    re-centres it, round after round, where the true token's state lies. The SGD chains then
    never run.

    **SGD chains** (``secant_batch = 0``, the earlier policy): ``chains`` embeddings (rows of
    ``e``: ``e0`` and random vocabulary embeddings) take normalised gradient steps on
    ``sum_i ((F_l(prefix, e)_t - H[t])_i / s_i)^2``, where ``s_i = |H[t]_i| + median|H[t]|``
    keeps the few massive activations of the residual stream (up to 2e4 at the first position)
    from hiding every other coordinate. After every ``steps`` steps each chain proposes its
    ``per_chain`` nearest unvisited tokens.

    The policy only orders the candidates; the verifier accepts or rejects each one.

    **Arguments**
    - ``first``: tokens nearest to the read-out verified before anything else (0: no read-out,
      no secant stage; the chains then start from the mean embedding and random tokens).
    - ``newton_steps``: read-out quasi-Newton steps ``e <- e + R(H[t]) - R(F(e))`` (one
      batch-1 forward each, no gradient), each proposing the ``per_step`` nearest unvisited
      tokens.
    - ``secant_batch``: tokens verified per secant round, doubled every second round up to
      ``max_batch`` (0: SGD chains instead).
    - ``secant_prior``: ridge weight of the prior forward map, in units of the embeddings'
      sum of squares (coordinate variance 0.01, so 3 weighs the prior like 300 samples).
    - ``secant_local``: verified samples (nearest states to ``H[t]``) in each secant fit (0: all
      of them). Defaults tuned on four hard positions of the first two benchmark prompts at
      layer 30 (local 512 against all: 2816 against 20224+ candidates at the worst one).
    - ``chains``: parallel continuous embeddings of the SGD stage.
    - ``steps``: gradient steps between proposal rounds.
    - ``lr``: initial step length (embedding units; token embeddings have norm about 3).
    - ``horizon``: steps over which the step length decays linearly to 5% of ``lr``; after
      that the chains restart from fresh random tokens.
    - ``per_chain``: proposals per chain in the first rounds; doubled every second round
      after that, up to ``max_batch`` candidates per round.
    - ``max_batch``: most candidates per verifier batch.
    - ``lm_first``: when `sipit` passes the model's next-token logits (``prior``, see
      `_PriorGate`), that many of its most likely unvisited tokens join the first batch (0: the
      prior is never used); ``lm_step``: likewise for each quasi-Newton step; each secant batch
      gives a quarter of its slots to the prior.
    """

    name = "gradient"

    def __init__(self, chains: int = 8, steps: int = 5, lr: float = 1.0, horizon: int = 40,
                 per_chain: int = 16, max_batch: int = 1024, first: int = 64, newton_steps: int = 12,
                 per_step: int = 16, secant_batch: int = 256, secant_prior: float = 3.0,
                 secant_local: int = 512, scaled_loss: bool = True, lm_first: int = 64, lm_step: int = 16,
                 seed: int = 0):
        self.lm_first = lm_first
        self.lm_step = lm_step
        self.newton_steps = newton_steps
        self.per_step = per_step
        self.secant_batch = secant_batch
        self.secant_prior = secant_prior
        self.secant_local = secant_local
        self.scaled_loss = scaled_loss
        self.chains = chains
        self.max_batch = max_batch
        self.steps = steps
        self.lr = lr
        self.horizon = horizon
        self.per_chain = per_chain
        self.first = first
        self.rng = np.random.default_rng(seed)

    def proposals(self, ctx: _Context, ck, cv, pos: int, target, visited: np.ndarray, prior=None):
        """Yield candidate id batches; the caller sends back ``(ids, states)`` of each verified batch.

        ``prior``: the language model's next-token logits ``(V,)`` given the recovered prefix, or
        ``None``; its most likely unvisited tokens join the batches (see the class docstring).
        """
        E = ctx.w.embed
        order = None if prior is None or self.lm_first <= 0 else np.argsort(-np.asarray(prior), kind="stable")
        cursor = [0]

        def with_prior(ids: np.ndarray, k: int) -> np.ndarray:
            # append the k most likely tokens under the prior that are neither visited nor in ids
            if order is None or k <= 0:
                return ids
            taken = set(ids.tolist())
            extra = []
            while len(extra) < k and cursor[0] < len(order):
                v = int(order[cursor[0]])
                cursor[0] += 1
                if not visited[v] and v not in taken:
                    extra.append(v)
            return np.concatenate([ids, np.asarray(extra, dtype=np.int32)]).astype(np.int32)

        V = E.shape[0]
        d = E.shape[1]
        absd = jnp.abs(target)
        scale = absd + jnp.median(absd) if self.scaled_loss else jnp.linalg.norm(target) + jnp.zeros_like(target)
        start = None
        if self.first > 0:
            readout = ctx.readout()
            fit = _LinearFit(d, d)
            E_np = ctx.embed_np
            seen_ids, seen_states, seen_dist = [], [], []
            tgt_np = np.asarray(target)

            def observe(sent):
                if sent is not None:
                    fit.add(E_np[sent[0]], sent[1])
                    seen_ids.append(sent[0])
                    seen_states.append(sent[1])
                    seen_dist.append(np.sum(np.square(sent[1] - tgt_np), axis=1))

            r_obs = readout.predict(np.asarray(target), pos)
            e0 = r_obs
            score = np.array(ctx.nearest(E, ctx.embed_sq, jnp.asarray(e0)[None]), dtype=np.float32)[0]
            observe((yield with_prior(np.argpartition(score, self.first - 1)[: self.first].astype(np.int32),
                                      self.lm_first)))
            # Quasi-Newton steps on the continuous embedding, forward passes only: the read-out's
            # linear map stands in for the inverse Jacobian of e -> F_l(prefix, e)_t, so
            # e <- e + R(H[t]) - R(F_l(prefix, e)_t) (R the read-out) moves e toward the input
            # whose state is H[t]; each step proposes the nearest unvisited tokens.
            for _ in range(self.newton_steps):
                h = np.asarray(ctx.state(ck, cv, pos, jnp.asarray(e0)[None]))[0]
                e0 = e0 + (r_obs - readout.predict(h, pos))
                if not np.all(np.isfinite(e0)):
                    e0 = r_obs
                    break
                score = np.array(ctx.nearest(E, ctx.embed_sq, jnp.asarray(e0)[None]), dtype=np.float32)[0]
                score[visited] = np.inf
                m = min(self.per_step, int((~visited).sum()))
                if m == 0:
                    return
                observe((yield with_prior(np.argpartition(score, m - 1)[:m].astype(np.int32), self.lm_step)))
            if self.secant_batch > 0:
                prior = readout.forward[0 if pos == 0 else 1]
                r = 0
                while fit.n and not visited.all():
                    if self.secant_local and fit.n > self.secant_local:
                        dist = np.concatenate(seen_dist)
                        near = np.argpartition(dist, self.secant_local - 1)[: self.secant_local]
                        a, B = _LinearFit(d, d).add(E_np[np.concatenate(seen_ids)[near]],
                                                    np.concatenate(seen_states)[near]).solve(prior, self.secant_prior)
                    else:
                        a, B = fit.solve(prior, self.secant_prior)
                    res = np.array(ctx.secant_residuals(E, jnp.asarray(a, jnp.float32), jnp.asarray(B, jnp.float32),
                                                        target), dtype=np.float32)
                    res[visited] = np.inf
                    m = min(self.secant_batch << min(r // 2, 6), self.max_batch, int((~visited).sum()))
                    k = 0 if order is None else min(m // 4, m - 1)  # a quarter of the batch to the prior
                    observe((yield with_prior(np.argpartition(res, m - k - 1)[: m - k].astype(np.int32), k)))
                    r += 1
                if visited.all():
                    return
            start = jnp.asarray(e0)
        i = 0
        while not visited.all():
            if i % self.horizon == 0:
                e = E[jnp.asarray(self.rng.integers(0, V, self.chains), dtype=jnp.int32)]
                if i == 0:
                    e = e.at[0].set(jnp.mean(E, axis=0) if start is None else start)
            e, _ = ctx.sgd(ctx.w, ck, cv, jnp.int32(pos), target, scale, e, jnp.int32(i % self.horizon),
                           jnp.int32(self.steps), jnp.float32(self.lr), jnp.float32(self.horizon))
            i += self.steps
            score = np.array(ctx.nearest(E, ctx.embed_sq, e), dtype=np.float32)
            score[:, visited] = np.inf
            # widen the proposals as rounds fail, so a hard position degrades to a scan of the
            # vocabulary in nearest-first order at full batch throughput instead of stalling
            r = i // self.steps - 1
            m = min(self.per_chain << min(r // 2, 7), self.max_batch // self.chains, int((~visited).sum()))
            top = np.argpartition(score, m - 1, axis=1)[:, :m]
            ids = np.unique(top[np.isfinite(np.take_along_axis(score, top, axis=1))]).astype(np.int32)
            if ids.size:
                yield ids


class _PriorGate:
    """The language model's own next-token prediction as a candidate source, on probation.

    At position ``t >= 1`` the prefix is already recovered (and verified), so the model's
    next-token logits after it are known to the attacker: at the last layer straight from the
    observed state ``H[t-1]`` (final norm, tied embedding; no extra pass), at other layers from
    one full forward pass of the recovered prefix. For natural text the true token is usually
    among the most likely ones (SmolLM2 at layer 30, first 20 benchmark prompts: in the top 64
    at 56% of natural positions, against 12% for the read-out's nearest tokens); for random
    tokens it almost never is (0%), and those batch slots would be wasted. So the prior is
    offered to the policy only while it earns its slots: after ``probation`` positions, only if
    the accepted token ranked within ``top`` under it at no fewer than ``min_rate`` of the
    positions scored so far. At the last layer the logits cost nothing, so they are scored at
    every position and the prior comes back when the text turns natural; at other layers a
    dropped prior stays dropped (each score costs a forward pass). It only orders candidates;
    acceptance is the verifier's alone.
    """

    def __init__(self, model: SmolLM, ctx: _Context, H: np.ndarray, layer: int, *, probation: int = 2,
                 top: int = 256, min_rate: float = 0.25):
        self.model, self.ctx, self.H, self.layer = model, ctx, H, layer
        self.probation, self.top, self.min_rate = probation, top, min_rate
        self.free = layer == model.config.n_layers
        self.hits = 0
        self.scored = 0
        self.used = 0

    @property
    def active(self) -> bool:
        return self.scored < self.probation or self.hits >= self.min_rate * self.scored

    def logits(self, t: int, recovered: list[int]) -> np.ndarray | None:
        """Next-token logits ``(V,)`` after ``recovered`` (``t`` tokens), or ``None`` at t = 0 or when dropped."""
        if t == 0 or len(recovered) != t or not (self.active or self.free):
            return None
        if self.free:
            h = jnp.asarray(self.H[t - 1])
        else:  # causal: right padding does not change position t - 1; one compiled shape per 32
            ids = np.zeros(_bucket(t), dtype=np.int32)
            ids[:t] = recovered
            h = self.model.hidden_states(ids)[-1][t - 1]
        return np.asarray(self.ctx.next_logits(h))

    def offer(self, prior: np.ndarray | None) -> np.ndarray | None:
        """``prior`` if the policy should use it at this position, else ``None``."""
        if prior is None or not self.active:
            return None
        self.used += 1
        return prior

    def record(self, prior: np.ndarray, token: int) -> None:
        """Score the prior on the accepted ``token``."""
        self.scored += 1
        self.hits += int(np.sum(prior > prior[token]) < self.top)


def _as_policy(policy) -> GradientPolicy | BruteForcePolicy:
    if isinstance(policy, (GradientPolicy, BruteForcePolicy)):
        return policy
    if policy == "gradient":
        return GradientPolicy()
    if policy in ("bruteforce", "brute-force", "random"):
        return BruteForcePolicy()
    raise InvalidProblemError(f"unknown policy {policy!r}; use 'gradient' or 'bruteforce'")


def check_states(model: SmolLM, states, layer: int) -> np.ndarray:
    """Validate observed hidden states: shape ``(T, d)``, finite, T within the model's context."""
    layer = model.check_layer(layer)
    H = np.asarray(states)
    d = model.config.d_model
    if H.ndim != 2 or H.shape[1] != d:
        raise InvalidProblemError(
            f"hidden states must have shape (T, {d}) (all positions at one layer), got {H.shape}"
        )
    if H.shape[0] < 1 or H.shape[0] > model.max_len:
        raise InvalidProblemError(f"hidden states cover {H.shape[0]} positions; need 1 to {model.max_len}")
    if not np.all(np.isfinite(H)):
        raise InvalidProblemError("hidden states contain NaN or infinite values")
    return H.astype(np.float32)


def sipit(
    model: SmolLM,
    states,
    layer: int,
    *,
    policy="gradient",
    eps: float | None = None,
    rel_eps: float = DEFAULT_REL_EPS,
    max_candidates: int | None = None,
    original=None,
    raise_on_failure: bool = False,
    lm_prior: bool | None = None,
) -> SipItResult:
    """Recover the prompt whose hidden states at ``layer`` are ``states``.

    **Arguments**
    - ``model``: the `SmolLM` whose weights produced the states.
    - ``states``: float array ``(T, 576)``, the residual stream at ``layer`` for every position.
    - ``layer``: 0..30 (see the module docstring).
    - ``policy``: ``"gradient"``, ``"bruteforce"`` or a policy object.
    - ``eps``: verifier radius (absolute, state units). Default ``rel_eps * ||states[t]||``.
    - ``max_candidates``: give up at a position after this many candidates (default ``|V|``).
    - ``original``: the true ids, if known, to fill ``exact``.
    - ``raise_on_failure``: raise `RecoveryFailedError` instead of returning a partial result.
    - ``lm_prior``: let the policy also propose the tokens the model itself predicts after the
      recovered prefix (`_PriorGate`); it only orders candidates, the verifier still decides.
      ``None`` (default): only at the last layer, where the observed state ``H[t-1]`` gives the
      prediction for free; at other layers it costs a forward pass of the prefix per position,
      more than it saves where the read-out's first batch already finds the token (layer 1).
    """
    H = check_states(model, states, layer)
    layer = int(layer)
    pol = _as_policy(policy)
    V = model.config.vocab_size
    limit = V if max_candidates is None else int(max_candidates)
    T = H.shape[0]
    ctx = _context(model, layer)
    ck, cv = model.empty_cache(layer, _bucket(T))
    norms = np.linalg.norm(H, axis=1)
    eps_t = [float(eps) if eps is not None else float(rel_eps * n) for n in norms]

    recovered: list[int] = []
    counts: list[int] = []
    dists: list[float] = []
    per_pos: list[float] = []
    failed = None
    if lm_prior is None:
        lm_prior = layer == model.config.n_layers
    gate = _PriorGate(model, ctx, H, layer) if lm_prior and getattr(pol, "lm_first", 0) > 0 else None
    t0 = time.perf_counter()
    for t in range(T):
        tp = time.perf_counter()
        target = jnp.asarray(H[t])
        visited = np.zeros(V, dtype=bool)
        tried = 0
        accepted = None
        logits = gate.logits(t, recovered) if gate is not None else None
        prior = gate.offer(logits) if gate is not None else None
        proposals = pol.proposals(ctx, ck, cv, t, target, visited, prior=prior)
        ids = next(proposals, None)
        while ids is not None:
            ids = ids[~visited[ids]][: limit - tried]
            if ids.size == 0:
                break
            visited[ids] = True
            n = ids.size
            padded = np.concatenate([ids, np.full(_pow2(n) - n, ids[0], dtype=np.int32)])  # few jit shapes
            d, h, k, v = ctx.verify_states(ctx.w, ck, cv, jnp.int32(t), jnp.asarray(padded), target)
            tried += n
            d = np.asarray(d)[:n]
            j = int(np.argmin(d))
            if d[j] <= eps_t[t]:
                accepted = (int(ids[j]), float(d[j]), k[:, j], v[:, j])
                break
            if tried >= limit:
                break
            try:  # the policy may learn from the rejected candidates' states
                ids = proposals.send((ids, np.asarray(h)[:n]))
            except StopIteration:
                ids = None
        counts.append(tried)
        per_pos.append(time.perf_counter() - tp)
        if accepted is None:
            failed = t
            break
        tok, dist, k, v = accepted
        if logits is not None:
            gate.record(logits, tok)
        recovered.append(tok)
        dists.append(dist)
        ck, cv = ck.at[:, t].set(k), cv.at[:, t].set(v)
    seconds = time.perf_counter() - t0
    orig = None if original is None else [int(i) for i in np.asarray(original)]
    result = SipItResult(
        layer=layer, policy=pol.name, eps=eps_t, recovered=recovered, complete=failed is None,
        failed_position=failed, candidates_per_position=counts, distances=dists, seconds=seconds,
        vocab_size=V, original=orig, exact=None if orig is None else (failed is None and recovered == orig),
        seconds_per_position=per_pos, lm_prior_positions=0 if gate is None else gate.used,
        exact_up_to_duplicates=None if orig is None else (failed is None and model.equivalent(recovered, orig)),
    )
    if failed is not None and raise_on_failure:
        raise RecoveryFailedError(
            f"no token within eps={eps_t[failed]:.3g} of the observed state at position {failed} after "
            f"{counts[-1]} candidates at layer {layer}: the states do not come from this model and layer, "
            "or their noise exceeds half the minimum distance between candidate states"
        )
    return result


def candidate_delta(model: SmolLM, prefix, layer: int, *, candidates=None, batch: int = 1024, block: int = 4096) -> dict:
    """Theorem 3.2's margin at one position: the states of *every* token after ``prefix``.

    Computes ``F_l(prefix + v)`` for one ``v`` per distinct embedding row (tokens sharing a row
    have identical states, Delta 0 trivially; see `SmolLM.embedding_classes`), batched on the KV
    cache of the prefix, and the minimum pairwise L2 distance ``Delta`` among them (exact,
    blocked, float64). ``candidates`` restricts the set (the theorem then holds for a verifier
    that only considers that set).
    Returns ``{"delta", "pair", "median_norm", "position"}``. Cost: ``|V|`` single-position passes.
    """
    from unmask.collisions import min_pairwise_distance

    layer = model.check_layer(layer)
    prefix = model.check_tokens(np.asarray(prefix, dtype=np.int32).reshape(-1))
    ctx = _context(model, layer)
    P = len(prefix)
    ck, cv = model.empty_cache(layer, _bucket(P + 1))
    for t, tok in enumerate(prefix):
        _, k, v = ctx.verify(ctx.w, ck, cv, jnp.int32(t), jnp.asarray([tok], dtype=jnp.int32), jnp.zeros((model.config.d_model,), jnp.float32))
        ck, cv = ck.at[:, t].set(k[:, 0]), cv.at[:, t].set(v[:, 0])
    reps = model.embedding_classes()[0]
    if candidates is not None:
        reps = np.intersect1d(reps, np.asarray(candidates, dtype=np.int32)).astype(np.int32)
    S = np.empty((len(reps), model.config.d_model), dtype=np.float32)
    for s in range(0, len(reps), batch):
        ids = reps[s : s + batch]
        pad = np.concatenate([ids, np.zeros(batch - len(ids), dtype=np.int32)])
        S[s : s + len(ids)] = np.asarray(ctx.candidate_states(ck, cv, P, jnp.asarray(pad)))[: len(ids)]
    nn = min_pairwise_distance(S, block=block)
    return {
        "delta": nn["min_distance"],
        "pair": (int(reps[nn["pair"][0]]), int(reps[nn["pair"][1]])),
        "median_norm": float(np.median(np.linalg.norm(S, axis=1))),
        "position": P,
    }
