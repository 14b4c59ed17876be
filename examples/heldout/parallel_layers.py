"""Model-parallel layers and collective idioms as other code spells them, each in shard_map:

* MaxText's grouped-query attention with heads over tp (K/V heads `jnp.repeat`ed to the query
  heads; K/V heads fewer than the devices: each device picks its K/V head by axis_index);
* tensor-parallel RMSNorm / LayerNorm over a hidden dim split over tp (penzai / Megatron-style
  model-axis norms: psum of the squares over the global width) and softmax over a split dim;
* flash-decoding over a KV cache split along the sequence (the scaling book's inference part:
  local max, sum and output, combined by pmax and rescaled psums);
* MaxText's sorted ("dropless") MoE: argsort tokens by expert, per-token expert matmul, unsort;
* Megatron-LM's column -> row parallel MLP with a replicated bias sliced per rank, its LM head
  with gather_output (all_gather of the vocab shards), and the row-parallel bias pre-divided;
* a ring all-reduce by ppermute (reduce-scatter then all-gather), a halo exchange for a 3-point
  stencil with a non-cyclic ppermute, and an exclusive prefix sum across devices (token offsets);
* jax.lax docs' psum_scatter(tiled=False) and all_to_all(tiled=False).

Small float32 shapes, meshes of 4 devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Arg, Example, f32, ids, program

TP4 = (("tp", 4),)
SP4 = (("sp", 4),)
I4 = (("i", 4),)
DATA4 = (("data", 4),)
DP_TP = (("dp", 2), ("tp", 2))


def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program("parallel_layers", prog, mesh, reference, body, args, out, what, **kw)


# ----- grouped-query attention (MaxText attentions.py, heads over tp) ----------------------------

def _causal(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(q.shape[-1]))
    pos = jnp.arange(q.shape[1])
    scores = jnp.where(pos[:, None] >= pos[None, :], scores, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def _gqa(x, wq, wk, wv, wo, expand):
    q = jnp.einsum("bsd,dhk->bshk", x, wq)
    k = jnp.einsum("bsd,dhk->bshk", x, wk)
    v = jnp.einsum("bsd,dhk->bshk", x, wv)
    group = q.shape[2] // k.shape[2]
    out = _causal(q, expand(k, group), expand(v, group))
    return jnp.einsum("bshk,hkd->bsd", out, wo)


def _repeat(t, group):
    return jnp.repeat(t, group, axis=2)


def _tile(t, group):
    return jnp.tile(t, (1, 1, group, 1))


def gqa_ref(x, wq, wk, wv, wo):
    return _gqa(x, wq, wk, wv, wo, _repeat)


def gqa_tp(x, wq, wk, wv, wo):
    return lax.psum(_gqa(x, wq, wk, wv, wo, _repeat), "tp")


def gqa_tp_kv_tiled(x, wq, wk, wv, wo):
    return lax.psum(_gqa(x, wq, wk, wv, wo, _tile), "tp")  # BUG


def _gqa_kv_replicated(x, wq, wk, wv, wo, pick):
    """Fewer K/V heads than devices: K/V projections replicated, each device keeps the K/V head
    its query heads belong to."""
    q = jnp.einsum("bsd,dhk->bshk", x, wq)
    kv_head = pick(lax.axis_index("tp"), lax.axis_size("tp"), wk.shape[1])
    k = jnp.einsum("bsd,dhk->bshk", x, lax.dynamic_slice_in_dim(wk, kv_head, 1, axis=1))
    v = jnp.einsum("bsd,dhk->bshk", x, lax.dynamic_slice_in_dim(wv, kv_head, 1, axis=1))
    out = _causal(q, _repeat(k, q.shape[2]), _repeat(v, q.shape[2]))
    return lax.psum(jnp.einsum("bshk,hkd->bsd", out, wo), "tp")


def gqa_kv_replicated(x, wq, wk, wv, wo):
    return _gqa_kv_replicated(x, wq, wk, wv, wo, lambda i, n, kv: i * kv // n)


def gqa_kv_replicated_modulo(x, wq, wk, wv, wo):
    return _gqa_kv_replicated(x, wq, wk, wv, wo, lambda i, n, kv: i % kv)  # BUG


# ----- norms and softmax over a dim split over tp ------------------------------------------------

def rms_ref(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def _rms_tp(x, g, width):
    ms = lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), "tp") / width
    return x * lax.rsqrt(ms + 1e-6) * g


def rms_tp(x, g):
    return _rms_tp(x, g, x.shape[-1] * lax.axis_size("tp"))


def rms_tp_local_width(x, g):
    return _rms_tp(x, g, x.shape[-1])  # BUG


def rms_tp_pmean(x, g):
    """The mean of the squares as the pmean of the local means (equal widths)."""
    ms = lax.pmean(jnp.mean(x * x, axis=-1, keepdims=True), "tp")
    return x * lax.rsqrt(ms + 1e-6) * g


def layernorm_ref(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * g + b


def _layernorm_tp(x, g, b, *, global_mean: bool):
    width = x.shape[-1] * lax.axis_size("tp")
    mean = jnp.sum(x, axis=-1, keepdims=True)
    mean = lax.psum(mean, "tp") / width if global_mean else mean / x.shape[-1]
    var = lax.psum(jnp.sum((x - mean) ** 2, axis=-1, keepdims=True), "tp") / width
    return (x - mean) * lax.rsqrt(var + 1e-5) * g + b


def layernorm_tp(x, g, b):
    return _layernorm_tp(x, g, b, global_mean=True)


def layernorm_tp_local_mean(x, g, b):
    return _layernorm_tp(x, g, b, global_mean=False)  # BUG


def softmax_ref(x):
    return jax.nn.softmax(x, axis=-1)


def softmax_tp(x):
    m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), "tp")
    e = jnp.exp(x - m)
    return e / lax.psum(jnp.sum(e, axis=-1, keepdims=True), "tp")


def softmax_tp_local_sum(x):
    m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), "tp")
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=-1, keepdims=True)  # BUG


# ----- flash-decoding over a KV cache split along the sequence ----------------------------------

def decode_ref(q, k, v):
    scores = jnp.einsum("bhd,bshd->bhs", q, k) / np.float32(np.sqrt(q.shape[-1]))
    return jnp.einsum("bhs,bshd->bhd", jax.nn.softmax(scores, axis=-1), v)


def _flash_decode(q, k, v, *, rescale: bool):
    scores = jnp.einsum("bhd,bshd->bhs", q, k) / np.float32(np.sqrt(q.shape[-1]))
    m = jnp.max(scores, axis=-1)
    p = jnp.exp(scores - m[..., None])
    lsum = jnp.sum(p, axis=-1)
    out = jnp.einsum("bhs,bshd->bhd", p, v)
    if rescale:
        m_all = lax.pmax(m, "sp")
        corr = jnp.exp(m - m_all)
        out, lsum = out * corr[..., None], lsum * corr
    return lax.psum(out, "sp") / lax.psum(lsum, "sp")[..., None]


def flash_decode(q, k, v):
    return _flash_decode(q, k, v, rescale=True)


def flash_decode_no_rescale(q, k, v):
    return _flash_decode(q, k, v, rescale=False)  # BUG


# ----- MaxText sorted (dropless) MoE, tokens over data ------------------------------------------

def _sorted_moe(x, wr, we, *, inverse: bool):
    logits = x @ wr
    expert = jnp.argmax(logits, axis=-1)
    gate = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
    order = jnp.argsort(expert)
    xs = x[order]
    ys = jnp.einsum("td,tdf->tf", xs, we[expert[order]])
    unsort = jnp.argsort(order) if inverse else order
    return ys[unsort] * gate[:, None]


def sorted_moe_ref(x, wr, we):
    return _sorted_moe(x, wr, we, inverse=True)


def sorted_moe(x, wr, we):
    return _sorted_moe(x, wr, we, inverse=True)


def sorted_moe_unsorted_by_order(x, wr, we):
    return _sorted_moe(x, wr, we, inverse=False)  # BUG


def _sorted_moe_scattered(x, wr, we, *, to_order: bool):
    """The unsort spelled as a scatter: row t of the sorted output written back to row
    order[t] (`zeros.at[order].set(ys)`)."""
    logits = x @ wr
    expert = jnp.argmax(logits, axis=-1)
    gate = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
    order = jnp.argsort(expert)
    ys = jnp.einsum("td,tdf->tf", x[order], we[expert[order]])
    rows = order if to_order else jnp.argsort(order)
    return jnp.zeros_like(ys).at[rows].set(ys) * gate[:, None]


def sorted_moe_scattered(x, wr, we):
    return _sorted_moe_scattered(x, wr, we, to_order=True)


def sorted_moe_scattered_to_inverse(x, wr, we):
    return _sorted_moe_scattered(x, wr, we, to_order=False)  # BUG


# ----- Megatron-LM column -> row parallel MLP, LM head ------------------------------------------

def megatron_mlp_ref(x, w1, b1, w2, b2):
    return jax.nn.gelu(x @ w1 + b1) @ w2 + b2


def _megatron_mlp(x, w1, b1, w2, b2, *, first_chunk: bool):
    n = w1.shape[1]
    start = 0 if first_chunk else lax.axis_index("tp") * n
    b1_local = lax.dynamic_slice_in_dim(b1, start, n)
    return lax.psum(jax.nn.gelu(x @ w1 + b1_local) @ w2, "tp") + b2


def megatron_mlp(x, w1, b1, w2, b2):
    return _megatron_mlp(x, w1, b1, w2, b2, first_chunk=False)


def megatron_mlp_bias_chunk_of_rank0(x, w1, b1, w2, b2):
    return _megatron_mlp(x, w1, b1, w2, b2, first_chunk=True)  # BUG


def _row_bias_split(x, w1, b1, w2, b2, *, divide: bool):
    """The row-parallel bias added on every rank before the psum, pre-divided by tp."""
    n = w1.shape[1]
    b1_local = lax.dynamic_slice_in_dim(b1, lax.axis_index("tp") * n, n)
    share = b2 / lax.axis_size("tp") if divide else b2
    return lax.psum(jax.nn.gelu(x @ w1 + b1_local) @ w2 + share, "tp")


def row_bias_split(x, w1, b1, w2, b2):
    return _row_bias_split(x, w1, b1, w2, b2, divide=True)


def row_bias_split_not_divided(x, w1, b1, w2, b2):
    return _row_bias_split(x, w1, b1, w2, b2, divide=False)  # BUG


def lm_head_ref(h, w):
    return h @ w


def lm_head_gather(h, w):
    return lax.all_gather(h @ w, "tp", axis=1, tiled=True)


def lm_head_gather_stacked_reshaped(h, w):
    logits = h @ w
    stacked = lax.all_gather(logits, "tp")
    return stacked.reshape(logits.shape[0], -1)  # BUG


def lm_head_gather_stacked(h, w):
    """all_gather(tiled=False) stacks the shards in front: move that axis next to the vocab."""
    logits = h @ w
    stacked = lax.all_gather(logits, "tp")
    return jnp.moveaxis(stacked, 0, 1).reshape(logits.shape[0], -1)


# ----- rings, halos and prefix sums -------------------------------------------------------------

def block_sum_ref(x):
    return x.reshape(4, -1).sum(axis=0)


def _ring_allreduce(x, *, gather_shift: int):
    n = lax.axis_size("i")
    idx = lax.axis_index("i")
    chunks = x.reshape(n, -1)
    right = [(j, (j + 1) % n) for j in range(n)]
    acc = chunks[idx]
    for s in range(n - 1):
        acc = lax.ppermute(acc, "i", right) + chunks[(idx - 1 - s) % n]
    out = jnp.zeros_like(chunks).at[(idx + 1) % n].set(acc)
    for s in range(n - 1):
        acc = lax.ppermute(acc, "i", right)
        out = out.at[(idx - s + gather_shift) % n].set(acc)
    return out.reshape(-1)


def ring_allreduce(x):
    return _ring_allreduce(x, gather_shift=0)


def ring_allreduce_gather_off_by_one(x):
    return _ring_allreduce(x, gather_shift=-1)  # BUG


def stencil_ref(x):
    padded = jnp.pad(x, 1)
    return padded[:-2] + padded[1:-1] + padded[2:]


def _halo_stencil(x, *, cyclic: bool):
    n = lax.axis_size("i")
    if cyclic:
        to_right = [(j, (j + 1) % n) for j in range(n)]
        to_left = [(j, (j - 1) % n) for j in range(n)]
    else:
        to_right = [(j, j + 1) for j in range(n - 1)]
        to_left = [(j + 1, j) for j in range(n - 1)]
    left_halo = lax.ppermute(x[-1:], "i", to_right)
    right_halo = lax.ppermute(x[:1], "i", to_left)
    padded = jnp.concatenate([left_halo, x, right_halo])
    return padded[:-2] + padded[1:-1] + padded[2:]


def halo_stencil(x):
    return _halo_stencil(x, cyclic=False)


def halo_stencil_cyclic(x):
    return _halo_stencil(x, cyclic=True)  # BUG


def cumsum_ref(x):
    return jnp.cumsum(x)


def _sharded_cumsum(x, *, inclusive: bool):
    local = jnp.cumsum(x)
    totals = lax.all_gather(local[-1], "i")
    before = jnp.arange(lax.axis_size("i"))
    idx = lax.axis_index("i")
    mask = before <= idx if inclusive else before < idx
    return local + jnp.sum(jnp.where(mask, totals, 0.0))


def sharded_cumsum(x):
    return _sharded_cumsum(x, inclusive=False)


def sharded_cumsum_inclusive_offset(x):
    return _sharded_cumsum(x, inclusive=True)  # BUG


# ----- jax.lax docs: psum_scatter and all_to_all untiled ----------------------------------------

def untiled_scatter_ref(x):
    return x.reshape(4, 4, -1).sum(axis=0).reshape(-1)


def psum_scatter_untiled(x):
    return lax.psum_scatter(x, "i", scatter_dimension=0, tiled=False)


def psum_scatter_untiled_dim1(x):
    return lax.psum_scatter(x.T, "i", scatter_dimension=0, tiled=False)  # BUG


def block_transpose_ref(x):
    return x.reshape(4, 4, -1).transpose(1, 0, 2).reshape(x.shape)


def all_to_all_untiled(x):
    return lax.all_to_all(x, "i", split_axis=0, concat_axis=0, tiled=False)


def all_to_all_untiled_reversed(x):
    return lax.all_to_all(x[::-1], "i", split_axis=0, concat_axis=0, tiled=False)  # BUG


# ----- one-hot embedding over vocab shards (MaxText's TPU lookup), int8 TP matmul --------------

def one_hot_embed(token_ids, table):
    n = table.shape[0]
    local = token_ids - lax.axis_index("tp") * n
    return lax.psum(jax.nn.one_hot(local, n, dtype=table.dtype) @ table, "tp")


def one_hot_embed_global_ids(token_ids, table):
    n = table.shape[0]
    return lax.psum(jax.nn.one_hot(token_ids, n, dtype=table.dtype) @ table, "tp")  # BUG


def embed_ref(token_ids, table):
    return table[token_ids]


# ----- vocab-parallel cross-entropy with a one-hot pick (Megatron-LM's masked target) ----------

def target_ce_ref(logits, labels):
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def _one_hot_ce(logits, labels, *, modulo: bool):
    """The target logit of a vocab shard as `sum(logits * one_hot(local))`, the labels outside
    the shard masked to 0 and their pick zeroed, psum'd. `modulo` (the bug): the local label
    taken as `labels % n`, so every shard picks its column labels % n."""
    n = logits.shape[-1]
    local = labels - lax.axis_index("tp") * n
    if modulo:
        local = labels % n  # BUG
    outside = (local < 0) | (local >= n)
    picked = jnp.sum(logits * jax.nn.one_hot(jnp.where(outside, 0, local), n), axis=-1)
    picked = lax.psum(jnp.where(outside, 0.0, picked), "tp")
    m = lax.pmax(lax.stop_gradient(jnp.max(logits, axis=-1)), "tp")
    sum_exp = lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")
    return jnp.mean(jnp.log(sum_exp) + m - picked)


def one_hot_ce(logits, labels):
    return _one_hot_ce(logits, labels, modulo=False)


def one_hot_ce_label_modulo(logits, labels):
    return _one_hot_ce(logits, labels, modulo=True)  # the bug is in _one_hot_ce


def _grad_logits(f):
    return jax.grad(f, argnums=0)


def one_hot_ce_grad(logits, labels):
    """The gradient w.r.t. the logits shard taken inside the shard_map (jax transposes the
    one-hot pick into `g * one_hot(local)`)."""
    return jax.grad(one_hot_ce)(logits, labels)


def one_hot_ce_label_modulo_grad(logits, labels):
    return jax.grad(one_hot_ce_label_modulo)(logits, labels)


def int8_matmul_ref(x, w):
    return x.astype(jnp.int32) @ w.astype(jnp.int32)


def int8_matmul_tp(x, w):
    """AQT-style int8 row-parallel matmul: int32 accumulation, psum in int32."""
    return lax.psum(jnp.matmul(x, w, preferred_element_type=jnp.int32), "tp")


def int8_matmul_tp_int8_psum(x, w):
    partial = jnp.matmul(x, w, preferred_element_type=jnp.int32)
    return lax.psum(partial.astype(jnp.int8), "tp").astype(jnp.int32)  # BUG


# ----- sequence-parallel cross-entropy with ignored labels (-100) --------------------------------

def masked_ce_ref(logits, labels):
    valid = labels >= 0
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    return -jnp.sum(jnp.where(valid, picked, 0.0)) / jnp.sum(valid)


def _masked_ce_sp(logits, labels, *, global_count: bool):
    valid = labels >= 0
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    total = -jnp.sum(jnp.where(valid, picked, 0.0))
    if global_count:
        return lax.psum(total, "sp") / lax.psum(jnp.sum(valid), "sp")
    return lax.pmean(total / jnp.sum(valid), "sp")


def masked_ce_sp(logits, labels):
    return _masked_ce_sp(logits, labels, global_count=True)


def masked_ce_sp_mean_of_means(logits, labels):
    return _masked_ce_sp(logits, labels, global_count=False)  # BUG


def _ignored_labels():
    """Labels with a different number of ignored (-100) tokens on each sequence shard."""
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((2, 16, 32)).astype(np.float32)
    labels = rng.integers(0, 32, (2, 16)).astype(np.int32)
    labels[:, :3] = -100
    labels[0, 8:10] = -100
    logits[:, 3, :] = 0.0
    logits[np.arange(2), 3, labels[:, 3]] = -20.0  # the few kept tokens of shard 0: large losses
    return [[logits, labels]]


def _labels(shape, spec, high):
    return ids(shape, spec, high)


# ----- sliding-window causal attention under context parallelism ------------------------------

WINDOW = 6


def _windowed(q, k, v, q_pos, k_pos):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(q.shape[-1]))
    ok = (q_pos[:, None] >= k_pos[None, :]) & (q_pos[:, None] - k_pos[None, :] < WINDOW)
    scores = jnp.where(ok, scores, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def window_attention_ref(q, k, v):
    pos = jnp.arange(q.shape[1])
    return _windowed(q, k, v, pos, pos)


def _window_cp(q, k, v, *, strict: bool):
    s = q.shape[1]
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    q_pos = lax.axis_index("sp") * s + jnp.arange(s)
    k_pos = jnp.arange(k.shape[1])
    if strict:
        return _windowed(q, k, v, q_pos, k_pos)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(q.shape[-1]))
    ok = (q_pos[:, None] >= k_pos[None, :]) & (q_pos[:, None] - k_pos[None, :] <= WINDOW)  # BUG
    scores = jnp.where(ok, scores, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def window_attention_cp(q, k, v):
    return _window_cp(q, k, v, strict=True)


def window_attention_cp_window_off_by_one(q, k, v):
    return _window_cp(q, k, v, strict=False)  # the bug is in _window_cp


# ----- the corpus -----------------------------------------------------------------------------

def _inputs_far_apart():
    """Rows whose shards' maxima differ by far (where a missing rescale shows most)."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 32, 4, 8)).astype(np.float32)
    k[:, :8] *= 4
    v = rng.standard_normal((2, 32, 4, 8)).astype(np.float32)
    return [[q, k, v]]


def programs() -> list[Example]:
    gqa = (f32((2, 8, 16), P("dp", None, None)), f32((16, 8, 4), P(None, "tp", None), "weight"),
           f32((16, 4, 4), P(None, "tp", None), "weight"),
           f32((16, 4, 4), P(None, "tp", None), "weight"),
           f32((8, 4, 16), P("tp", None, None), "weight"))
    gqa_rep = (f32((2, 8, 16)), f32((16, 8, 4), P(None, "tp", None), "weight"),
               f32((16, 2, 4), P(), "weight"), f32((16, 2, 4), P(), "weight"),
               f32((8, 4, 16), P("tp", None, None), "weight"))
    norm = (f32((8, 16), P(None, "tp")), f32((16,), P("tp"), "positive"))
    ln = norm + (f32((16,), P("tp")),)
    kv = (f32((2, 4, 8)), f32((2, 32, 4, 8), P(None, "sp", None, None)),
          f32((2, 32, 4, 8), P(None, "sp", None, None)))
    moe = (f32((16, 4), P("data")), f32((4, 4), P(), "weight"), f32((4, 4, 4), P(), "weight"))
    mlp = (f32((8, 16)), f32((16, 32), P(None, "tp"), "weight"), f32((32,)),
           f32((32, 16), P("tp", None), "weight"), f32((16,)))
    head = (f32((8, 16)), f32((16, 64), P(None, "tp"), "weight"))
    g = "MaxText grouped-query attention, heads over tp, K/V repeated to the query heads"
    gr = ("MaxText GQA with fewer K/V heads than tp devices: K/V projections replicated, each "
          "device slices its group's K/V head by axis_index")
    rm = "tensor-parallel RMSNorm over a hidden dim split over tp: psum of the squares"
    lnd = "tensor-parallel LayerNorm: psum'd mean and variance over the split hidden dim"
    sm = "softmax over a dim split over tp: pmax, exp, psum of the sums"
    fd = ("flash-decoding over a KV cache split along the sequence (scaling book, inference): "
          "local max/sum/output combined by pmax and rescaled psums")
    mo = ("MaxText sorted (dropless) MoE: argsort tokens by expert, per-token expert matmul, "
          "unsort with the inverse permutation; tokens over data")
    mm = ("Megatron-LM ColumnParallelLinear -> GeLU -> RowParallelLinear, the replicated "
          "first bias sliced per rank, psum, + bias")
    rb = "Megatron-style row-parallel bias added on every rank before the psum, divided by tp"
    lm = "Megatron-LM LM head, ColumnParallelLinear(gather_output=True): all_gather of logits"
    ring = ("ring all-reduce by ppermute (reduce-scatter phase then all-gather phase), "
            "dynamic chunk indices")
    halo = "halo exchange for a 3-point stencil: non-cyclic ppermute (edges receive zeros)"
    cs = ("exclusive prefix sum across devices (token offsets): local cumsum + sum of the "
          "earlier devices' totals from an all_gather")
    emb = (ids((4, 8), P(), 64), f32((64, 16), P("tp", None)))
    i8 = (Arg((8, 32), P(None, "tp"), "int8", "ids", 100), Arg((32, 16), P("tp", None), "int8",
                                                                "ids", 100))
    ce = (f32((2, 16, 32), P(None, "sp", None)), _labels((2, 16), P(None, "sp"), 32))
    qkv = tuple(f32((2, 16, 4, 8), P(None, "sp", None, None)) for _ in range(3))
    oh = ("MaxText's one-hot embedding lookup over vocab shards: one_hot(ids - start) @ table, "
          "psum (out-of-shard ids give zero rows)")
    vce = (f32((8, 32), P(None, "tp")), ids((8,), P(), 32))
    ohc = ("vocab-parallel cross-entropy, the target logit picked by a one-hot of the "
           "shard-local label (masked to 0 outside the shard, its pick zeroed), psum")
    q8 = ("AQT-style int8 row-parallel matmul: int32 accumulation "
          "(preferred_element_type), psum in int32")
    mc = ("sequence-parallel cross-entropy with ignored labels (-100): psum of the loss sum "
          "over psum of the valid-token count")
    wa = ("sliding-window causal attention under context parallelism (all-gathered K/V, "
          "window mask at global positions)")
    extra = [
        _p("one_hot_embed", TP4, embed_ref, one_hot_embed, emb, P(), oh),
        _p("one_hot_embed", TP4, embed_ref, one_hot_embed_global_ids, emb, P(), oh,
           bug="ids_not_shifted_to_shard"),
        _p("one_hot_ce", TP4, target_ce_ref, one_hot_ce, vce, P(), ohc),
        _p("one_hot_ce", TP4, target_ce_ref, one_hot_ce_label_modulo, vce, P(), ohc,
           bug="label_modulo_shard_width", bug_fn=_one_hot_ce),
        _p("one_hot_ce_grad", TP4, _grad_logits(target_ce_ref), one_hot_ce_grad, vce,
           P(None, "tp"), ohc + ": gradient w.r.t. the logits shard, taken in the shard_map "
           "(the one-hot spread, against take_along_axis's scatter)"),
        _p("one_hot_ce_grad", TP4, _grad_logits(target_ce_ref), one_hot_ce_label_modulo_grad,
           vce, P(None, "tp"), ohc + ": gradient w.r.t. the logits shard",
           bug="label_modulo_shard_width", bug_fn=_one_hot_ce),
        _p("one_hot_ce_wholegrad", TP4, _grad_logits(target_ce_ref), one_hot_ce, vce, P(),
           ohc + ": jax.grad of the shard_map'd loss (the one-hot a residual the backward "
           "shard_map reads back)", wrap=_grad_logits),
        _p("one_hot_ce_wholegrad", TP4, _grad_logits(target_ce_ref), one_hot_ce_label_modulo,
           vce, P(), ohc + ": jax.grad of the shard_map'd loss", bug="label_modulo_shard_width",
           bug_fn=_one_hot_ce, wrap=_grad_logits),
        _p("int8_matmul_tp", TP4, int8_matmul_ref, int8_matmul_tp, i8, P(), q8),
        _p("int8_matmul_tp", TP4, int8_matmul_ref, int8_matmul_tp_int8_psum, i8, P(), q8,
           bug="partials_narrowed_to_int8"),
        _p("masked_ce_sp", SP4, masked_ce_ref, masked_ce_sp, ce, P(), mc,
           chosen=_ignored_labels),
        _p("masked_ce_sp", SP4, masked_ce_ref, masked_ce_sp_mean_of_means, ce, P(), mc,
           bug="mean_of_shard_means", chosen=_ignored_labels),
        _p("window_attention_cp", SP4, window_attention_ref, window_attention_cp, qkv,
           P(None, "sp", None, None), wa),
        _p("window_attention_cp", SP4, window_attention_ref,
           window_attention_cp_window_off_by_one, qkv, P(None, "sp", None, None), wa,
           bug="window_off_by_one", bug_fn=_window_cp),
    ]
    return extra + [
        _p("gqa_tp", DP_TP, gqa_ref, gqa_tp, gqa, P("dp", None, None), g),
        _p("gqa_tp", DP_TP, gqa_ref, gqa_tp_kv_tiled, gqa, P("dp", None, None), g,
           bug="kv_heads_tiled_not_repeated"),
        _p("gqa_kv_replicated", TP4, gqa_ref, gqa_kv_replicated, gqa_rep, P(), gr),
        _p("gqa_kv_replicated", TP4, gqa_ref, gqa_kv_replicated_modulo, gqa_rep, P(), gr,
           bug="kv_head_index_modulo"),
        _p("rms_tp", TP4, rms_ref, rms_tp, norm, P(None, "tp"), rm),
        _p("rms_tp", TP4, rms_ref, rms_tp_local_width, norm, P(None, "tp"), rm,
           bug="divided_by_local_width"),
        _p("rms_tp_pmean", TP4, rms_ref, rms_tp_pmean, norm, P(None, "tp"),
           rm + " (spelled as the pmean of the local means)"),
        _p("layernorm_tp", TP4, layernorm_ref, layernorm_tp, ln, P(None, "tp"), lnd),
        _p("layernorm_tp", TP4, layernorm_ref, layernorm_tp_local_mean, ln, P(None, "tp"), lnd,
           bug="local_mean"),
        _p("softmax_tp", TP4, softmax_ref, softmax_tp, [f32((8, 32), P(None, "tp"))],
           P(None, "tp"), sm),
        _p("softmax_tp", TP4, softmax_ref, softmax_tp_local_sum, [f32((8, 32), P(None, "tp"))],
           P(None, "tp"), sm, bug="local_sum"),
        _p("flash_decode", SP4, decode_ref, flash_decode, kv, P(), fd, chosen=_inputs_far_apart),
        _p("flash_decode", SP4, decode_ref, flash_decode_no_rescale, kv, P(), fd,
           bug="partials_not_rescaled", chosen=_inputs_far_apart),
        _p("sorted_moe", DATA4, sorted_moe_ref, sorted_moe, moe, P("data"), mo),
        _p("sorted_moe", DATA4, sorted_moe_ref, sorted_moe_unsorted_by_order, moe, P("data"),
           mo, bug="unsorted_by_order_not_inverse"),
        _p("sorted_moe_scattered", DATA4, sorted_moe_ref, sorted_moe_scattered, moe, P("data"),
           mo + " (the unsort spelled as a scatter to the order)"),
        _p("sorted_moe_scattered", DATA4, sorted_moe_ref, sorted_moe_scattered_to_inverse, moe,
           P("data"), mo, bug="scattered_to_inverse_not_order"),
        _p("megatron_mlp", TP4, megatron_mlp_ref, megatron_mlp, mlp, P(), mm),
        _p("megatron_mlp", TP4, megatron_mlp_ref, megatron_mlp_bias_chunk_of_rank0, mlp, P(),
           mm, bug="bias_chunk_of_rank0"),
        _p("row_bias_split", TP4, megatron_mlp_ref, row_bias_split, mlp, P(), rb),
        _p("row_bias_split", TP4, megatron_mlp_ref, row_bias_split_not_divided, mlp, P(), rb,
           bug="bias_not_divided"),
        _p("lm_head_gather", TP4, lm_head_ref, lm_head_gather, head, P(), lm, check_vma=False),
        _p("lm_head_gather", TP4, lm_head_ref, lm_head_gather_stacked_reshaped, head, P(), lm,
           bug="stacked_shards_reshaped"),
        _p("lm_head_gather_stacked", TP4, lm_head_ref, lm_head_gather_stacked, head, P(),
           lm + " spelled with all_gather(tiled=False)", check_vma=False),
        _p("ring_allreduce", I4, block_sum_ref, ring_allreduce, [f32((32,), P("i"))], P(), ring,
           check_vma=False),
        _p("ring_allreduce", I4, block_sum_ref, ring_allreduce_gather_off_by_one,
           [f32((32,), P("i"))], P(), ring, bug="gather_chunk_off_by_one"),
        _p("halo_stencil", I4, stencil_ref, halo_stencil, [f32((32,), P("i"))], P("i"), halo),
        _p("halo_stencil", I4, stencil_ref, halo_stencil_cyclic, [f32((32,), P("i"))], P("i"),
           halo, bug="cyclic_permutation"),
        _p("sharded_cumsum", I4, cumsum_ref, sharded_cumsum, [f32((32,), P("i"))], P("i"), cs),
        _p("sharded_cumsum", I4, cumsum_ref, sharded_cumsum_inclusive_offset,
           [f32((32,), P("i"))], P("i"), cs, bug="inclusive_offset"),
        _p("psum_scatter_untiled", I4, untiled_scatter_ref, psum_scatter_untiled,
           [f32((16, 4), P("i"))], P("i"),
           "jax.lax.psum_scatter docs: tiled=False, each device keeps row axis_index of the sum"),
        _p("psum_scatter_untiled", I4, untiled_scatter_ref, psum_scatter_untiled_dim1,
           [f32((16, 4), P("i"))], P("i"), "jax.lax.psum_scatter docs",
           bug="scattered_along_columns"),
        _p("all_to_all_untiled", I4, block_transpose_ref, all_to_all_untiled,
           [f32((16, 3), P("i"))], P("i"),
           "jax.lax.all_to_all docs: tiled=False over the split axis, a block transpose"),
        _p("all_to_all_untiled", I4, block_transpose_ref, all_to_all_untiled_reversed,
           [f32((16, 3), P("i"))], P("i"), "jax.lax.all_to_all docs",
           bug="chunks_reversed"),
    ]
