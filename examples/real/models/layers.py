"""Building blocks shared by the models: norms, RoPE, attention, embeddings, cross-entropy.

Each block takes a `Par`; with `Par()` it is the plain unsharded computation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .par import Par, allreduce_tp, axis_index, axis_size, exit_tp, gather_cp, pmax, reduce_from_tp

Array = jax.Array
EPS = 1e-5


def layer_norm(x: Array, g: Array, b: Array) -> Array:
    """LayerNorm over the last axis (GPT-2)."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + EPS) * g + b


def rms_norm(x: Array, g: Array) -> Array:
    """RMSNorm over the last axis (Llama)."""
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * lax.rsqrt(ms + EPS) * g


def rms_norm_tp(x: Array, g: Array, par: Par) -> Array:
    """RMSNorm over a last axis split over tp (OLMo-2 style QK-norm on the whole projection)."""
    width = x.shape[-1] * (lax.axis_size(par.tp) if par.tp else 1)
    ss = allreduce_tp(jnp.sum(jnp.square(x), axis=-1, keepdims=True), par)
    return x * lax.rsqrt(ss / width + EPS) * g


def gelu(x: Array) -> Array:
    return jax.nn.gelu(x, approximate=True)


def silu(x: Array) -> Array:
    return x * jax.nn.sigmoid(x)


def rope(x: Array, pos: Array, theta: float = 10000.0) -> Array:
    """Rotary position embedding (rotate-half convention) on (batch, seq, heads, head_dim)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = pos.astype(jnp.float32)[:, None] * freqs[None, :]
    cos = jnp.cos(angles)[None, :, None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q: Array, k: Array, v: Array, q_pos: Array, k_pos: Array) -> Array:
    """Causal attention; grouped-query when k/v have fewer heads than q. (b, s, h, d) layout."""
    rep = q.shape[2] // k.shape[2]
    if rep > 1:
        k = jnp.repeat(k, rep, axis=2)
        v = jnp.repeat(v, rep, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    mask = q_pos[:, None] >= k_pos[None, :]
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def context_attention(q: Array, k: Array, v: Array, q_pos: Array, par: Par) -> Array:
    """Attention of local queries to the whole sequence: K/V all-gathered over cp, or passed
    around the cp ring (ring attention)."""
    if par.cp and par.ring:
        return ring_attention(q, k, v, q_pos, par)
    k = gather_cp(k, par)
    v = gather_cp(v, par)
    k_pos = jnp.arange(k.shape[1])
    return attention(q, k, v, q_pos, k_pos)


def ring_attention(q: Array, k: Array, v: Array, q_pos: Array, par: Par) -> Array:
    """Ring attention: K/V blocks travel around the cp ring (collective_permute); an online
    softmax (running max, running denominator, rescaled accumulator) combines the blocks."""
    n = lax.axis_size(par.cp)
    me = lax.axis_index(par.cp)
    s_l = k.shape[1]
    rep = q.shape[2] // k.shape[2]
    perm = [(i, (i + 1) % n) for i in range(n)]
    b, _, h, d = q.shape
    o = jnp.zeros(q.shape, q.dtype)
    m = jnp.full((b, h, s_l), -jnp.inf, q.dtype)
    denom = jnp.zeros((b, h, s_l), q.dtype)

    def step(i, carry):
        o, m, denom, kb, vb = carry
        src = (me - i) % n  # whose block we hold after i hops
        k_pos = src * s_l + jnp.arange(s_l)
        kr = jnp.repeat(kb, rep, axis=2) if rep > 1 else kb
        vr = jnp.repeat(vb, rep, axis=2) if rep > 1 else vb
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, kr) / jnp.sqrt(jnp.float32(d))
        scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        p = jnp.exp(scores - m_new[..., None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * jnp.swapaxes(corr, 1, 2)[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, vr)
        kb = lax.ppermute(kb, par.cp, perm)
        vb = lax.ppermute(vb, par.cp, perm)
        return o, m_new, denom, kb, vb

    carry = (o, m, denom, k, v)
    if par.ring == "loop":
        carry = lax.fori_loop(0, n, step, carry)
    else:
        for i in range(n):
            carry = step(i, carry)
    o, _, denom, _, _ = carry
    return o / jnp.swapaxes(denom, 1, 2)[..., None]


def rows(table: Array, offset, n: int) -> Array:
    """Rows offset..offset+n of a table (a static slice when the offset is known)."""
    if isinstance(offset, int):
        return table[offset:offset + n]
    return lax.dynamic_slice_in_dim(table, offset, n, axis=0)


# ---------------------------------------------------------------------------------------------
# Embedding and cross-entropy, plain and vocab-parallel (Megatron).
# ---------------------------------------------------------------------------------------------


def embed(wte: Array, tokens: Array, par: Par) -> Array:
    """Token embedding; vocab-parallel: masked local lookup, then psum (reduce_scatter if SP)."""
    if not (par.vocab and par.tp):
        return jnp.take(wte, tokens, axis=0)
    vl = wte.shape[0]
    start = axis_index(par.tp) * vl
    if par.vocab_clip:
        local, inside = _local_ids(tokens, start, vl)
        found = jnp.take(wte, local, axis=0)
        return exit_tp(jnp.where(inside[..., None], found, 0.0), par)
    outside = (tokens < start) | (tokens >= start + vl)
    local = jnp.where(outside, 0, tokens - start)
    found = jnp.take(wte, local, axis=0)
    found = jnp.where(outside[..., None], 0.0, found)
    return exit_tp(found, par)


def _local_ids(ids: Array, start, n: int) -> tuple[Array, Array]:
    """Megatron-LM's common spelling of a vocab shard's lookup index: the ids minus the
    shard's start, clipped into the shard, and the mask of the ids the shard holds."""
    local = ids - start
    inside = (local >= 0) & (local < n)
    return jnp.clip(local, 0, n - 1), inside


def cross_entropy(logits: Array, targets: Array, par: Par) -> Array:
    """Per-token cross-entropy; vocab-parallel: pmax, psum of exp-sums, psum of target logit."""
    if not (par.vocab and par.tp):
        m = jnp.max(lax.stop_gradient(logits), axis=-1, keepdims=True)
        lse = jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1)) + m[..., 0]
        target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return lse - target
    vl = logits.shape[-1]
    start = axis_index(par.tp) * vl
    m = pmax(jnp.max(lax.stop_gradient(logits), axis=-1, keepdims=True), par.tp)
    sum_exp = reduce_from_tp(jnp.sum(jnp.exp(logits - m), axis=-1), par)
    if par.vocab_clip:
        local, inside = _local_ids(targets, start, vl)
        picked = jnp.take_along_axis(logits, local[..., None], axis=-1)[..., 0]
        target = reduce_from_tp(jnp.where(inside, picked, 0.0), par)
        return jnp.log(sum_exp) + m[..., 0] - target
    outside = (targets < start) | (targets >= start + vl)
    local = jnp.where(outside, 0, targets - start)
    picked = jnp.take_along_axis(logits, local[..., None], axis=-1)[..., 0]
    target = reduce_from_tp(jnp.where(outside, 0.0, picked), par)
    return jnp.log(sum_exp) + m[..., 0] - target


def mean_over_tokens(per_token: Array, par: Par) -> Array:
    """Mean over the local tokens (the caller averages over the data axes)."""
    return jnp.mean(per_token)


def masked_mean(per_token: Array, mask: Array, par: Par) -> Array:
    """Mean over the valid tokens of the whole batch: psum numerator and count over data axes."""
    num = jnp.sum(per_token * mask)
    den = jnp.sum(mask)
    for axis in par.data_axes:
        num = lax.psum(num, axis)
        den = lax.psum(den, axis)
    return num / den


__all__ = ["EPS", "attention", "axis_size", "context_attention", "cross_entropy", "embed",
           "gelu", "layer_norm", "masked_mean", "mean_over_tokens", "rms_norm", "rms_norm_tp",
           "rope", "rows", "silu"]
