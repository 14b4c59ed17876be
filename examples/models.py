"""Plain jax.numpy models and their shard_map bodies (correct and buggy).

Every ``*_ref`` function is the unsharded reference, taking global arrays.  Every ``*_body``
function is a per-device shard_map body using the mesh axis names ``"tp"`` (tensor/sequence
parallel) and ``"dp"`` (data parallel).  Buggy bodies carry exactly one source line ending
in ``# BUG``: the line where the mistake is made.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array

TP = "tp"
DP = "dp"
HEAD_DIM = 4
EPS = 1e-5


# ---------------------------------------------------------------------------------------------
# Shared building blocks (used by references and, where no communication is needed, by bodies)
# ---------------------------------------------------------------------------------------------


def layer_norm(x: Array, g: Array, b: Array) -> Array:
    """LayerNorm over the last axis."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + EPS) * g + b


def rms_norm(x: Array, g: Array) -> Array:
    """RMSNorm over the last axis."""
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * lax.rsqrt(ms + EPS) * g


def causal_attention(x: Array, wq: Array, wk: Array, wv: Array) -> Array:
    """Causal multi-head attention without output projection; heads are HEAD_DIM wide.

    Works unchanged on a column shard of wq/wk/wv (a subset of the heads).
    """
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, -1, HEAD_DIM)
    k = (x @ wk).reshape(b, s, -1, HEAD_DIM)
    v = (x @ wv).reshape(b, s, -1, HEAD_DIM)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(HEAD_DIM))
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return out.reshape(b, s, -1)


# ---------------------------------------------------------------------------------------------
# 1. Megatron MLP: W1/b1 column-parallel, W2 row-parallel, psum, then b2.
# ---------------------------------------------------------------------------------------------


def mlp_ref(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """Two-layer GELU MLP."""
    h = jax.nn.gelu(x @ w1 + b1)
    return h @ w2 + b2


def mlp_body(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """Megatron tensor-parallel MLP."""
    h = jax.nn.gelu(x @ w1 + b1)
    y = lax.psum(h @ w2, TP)
    return y + b2


def mlp_missing_psum_body(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """Megatron MLP that forgets to reduce the row-parallel partial sums."""
    h = jax.nn.gelu(x @ w1 + b1)
    y = h @ w2  # BUG
    return y + b2


def mlp_pmean_body(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """Megatron MLP reducing with pmean instead of psum."""
    h = jax.nn.gelu(x @ w1 + b1)
    y = lax.pmean(h @ w2, TP)  # BUG
    return y + b2


def mlp_bias_before_psum_body(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """Megatron MLP adding the replicated bias inside the partial sum (added tp times)."""
    h = jax.nn.gelu(x @ w1 + b1)
    y = lax.psum(h @ w2 + b2, TP)  # BUG
    return y


# ---------------------------------------------------------------------------------------------
# 2. Row-parallel linear followed by GELU (input arrives split on hidden).
# ---------------------------------------------------------------------------------------------


def row_linear_gelu_ref(x: Array, w: Array) -> Array:
    """GELU of a linear layer."""
    return jax.nn.gelu(x @ w)


def row_linear_gelu_body(x: Array, w: Array) -> Array:
    """Row-parallel linear: reduce the partial products, then GELU."""
    y = lax.psum(x @ w, TP)
    return jax.nn.gelu(y)


def row_linear_gelu_before_psum_body(x: Array, w: Array) -> Array:
    """Row-parallel linear pushing partial products through GELU before the reduction."""
    y = jax.nn.gelu(x @ w)  # BUG
    return lax.psum(y, TP)


# ---------------------------------------------------------------------------------------------
# 3. Causal multi-head attention, heads split over tp, row-parallel output projection.
# ---------------------------------------------------------------------------------------------


def attention_ref(x: Array, wq: Array, wk: Array, wv: Array, wo: Array, bo: Array) -> Array:
    """Causal multi-head self-attention with output projection."""
    return causal_attention(x, wq, wk, wv) @ wo + bo


def attention_body(x: Array, wq: Array, wk: Array, wv: Array, wo: Array, bo: Array) -> Array:
    """Attention with local heads; output projection row-parallel + psum."""
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, -1, HEAD_DIM)
    k = (x @ wk).reshape(b, s, -1, HEAD_DIM)
    v = (x @ wv).reshape(b, s, -1, HEAD_DIM)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(HEAD_DIM))
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1)
    return lax.psum(ctx @ wo, TP) + bo


# ---------------------------------------------------------------------------------------------
# 4./5. LayerNorm and RMSNorm with hidden split (statistics need a psum).
# ---------------------------------------------------------------------------------------------


def layernorm_ref(x: Array, g: Array, b: Array) -> Array:
    """LayerNorm reference."""
    return layer_norm(x, g, b)


def layernorm_hidden_body(x: Array, g: Array, b: Array) -> Array:
    """LayerNorm with the hidden axis split: global statistics via psum of local sums."""
    d = lax.psum(x.shape[-1], TP)
    mean = lax.psum(jnp.sum(x, axis=-1, keepdims=True), TP) / d
    xc = x - mean
    var = lax.psum(jnp.sum(xc * xc, axis=-1, keepdims=True), TP) / d
    return xc * lax.rsqrt(var + EPS) * g + b


def layernorm_hidden_local_stats_body(x: Array, g: Array, b: Array) -> Array:
    """LayerNorm with the hidden axis split but per-shard statistics."""
    mean = jnp.mean(x, axis=-1, keepdims=True)  # BUG
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + EPS) * g + b


def rmsnorm_ref(x: Array, g: Array) -> Array:
    """RMSNorm reference."""
    return rms_norm(x, g)


def rmsnorm_hidden_body(x: Array, g: Array) -> Array:
    """RMSNorm with the hidden axis split: psum of the local sum of squares."""
    d = x.shape[-1] * lax.axis_size(TP)
    ss = lax.psum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), TP)
    return x * lax.rsqrt(ss / d + EPS) * g


# ---------------------------------------------------------------------------------------------
# 6./7. LayerNorm and RMSNorm with the sequence split: purely local.
# ---------------------------------------------------------------------------------------------


def layernorm_seq_body(x: Array, g: Array, b: Array) -> Array:
    """LayerNorm on a sequence shard (rows are independent)."""
    return layer_norm(x, g, b)


def rmsnorm_seq_body(x: Array, g: Array) -> Array:
    """RMSNorm on a sequence shard."""
    return rms_norm(x, g)


# ---------------------------------------------------------------------------------------------
# 8. Megatron sequence-parallel MLP: all_gather(seq) -> column/row parallel -> reduce_scatter.
# ---------------------------------------------------------------------------------------------


def seqpar_mlp_body(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """Sequence-parallel MLP on (batch, seq, hidden) with tokens flattened for the matmuls."""
    bsz, _, d = x.shape
    xg = lax.all_gather(x, TP, axis=1, tiled=True)
    h = jax.nn.gelu(xg.reshape(-1, d) @ w1 + b1)
    y = (h @ w2).reshape(bsz, -1, d)
    return lax.psum_scatter(y, TP, scatter_dimension=1, tiled=True) + b2


def seqpar_mlp_gather_hidden_body(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """Sequence-parallel MLP gathering along hidden; the token flatten hides the shape error."""
    bsz, _, d = x.shape
    xg = lax.all_gather(x, TP, axis=2, tiled=True)  # BUG
    h = jax.nn.gelu(xg.reshape(-1, d) @ w1 + b1)
    y = (h @ w2).reshape(bsz, -1, d)
    return lax.psum_scatter(y, TP, scatter_dimension=1, tiled=True) + b2


# ---------------------------------------------------------------------------------------------
# 9. GPT-2 block on a dp x tp mesh.
# ---------------------------------------------------------------------------------------------


def gpt2_block_ref(
    x: Array,
    ln1_g: Array,
    ln1_b: Array,
    wq: Array,
    wk: Array,
    wv: Array,
    wo: Array,
    bo: Array,
    ln2_g: Array,
    ln2_b: Array,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
) -> Array:
    """Pre-LN GPT-2 transformer block."""
    x = x + causal_attention(layer_norm(x, ln1_g, ln1_b), wq, wk, wv) @ wo + bo
    h = jax.nn.gelu(layer_norm(x, ln2_g, ln2_b) @ w1 + b1)
    return x + h @ w2 + b2


def gpt2_block_body(
    x: Array,
    ln1_g: Array,
    ln1_b: Array,
    wq: Array,
    wk: Array,
    wv: Array,
    wo: Array,
    bo: Array,
    ln2_g: Array,
    ln2_b: Array,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
) -> Array:
    """GPT-2 block: batch over dp, heads and MLP columns over tp."""
    attn = causal_attention(layer_norm(x, ln1_g, ln1_b), wq, wk, wv)
    x = x + lax.psum(attn @ wo, TP) + bo
    h = jax.nn.gelu(layer_norm(x, ln2_g, ln2_b) @ w1 + b1)
    y = lax.psum(h @ w2, TP)
    return x + y + b2


def gpt2_block_psum_wrong_axis_body(
    x: Array,
    ln1_g: Array,
    ln1_b: Array,
    wq: Array,
    wk: Array,
    wv: Array,
    wo: Array,
    bo: Array,
    ln2_g: Array,
    ln2_b: Array,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
) -> Array:
    """GPT-2 block whose MLP reduction runs over the data-parallel axis."""
    attn = causal_attention(layer_norm(x, ln1_g, ln1_b), wq, wk, wv)
    x = x + lax.psum(attn @ wo, TP) + bo
    h = jax.nn.gelu(layer_norm(x, ln2_g, ln2_b) @ w1 + b1)
    y = lax.psum(h @ w2, DP)  # BUG
    return x + y + b2
