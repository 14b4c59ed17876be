"""Layers in the spellings of MaxText, Levanter and Megatron-LM ported to JAX: the vocab-parallel
embedding and cross-entropy as Megatron-LM spells them (`local = ids - start; mask = (local >= 0)
& (local < n); take(w, clip(local, 0, n - 1)); where(mask, ., 0); psum`), GShard/MaxText top-2 MoE
with capacity (dense dispatch and combine einsums, all_to_all over the expert axis), DeepSpeed-
Ulysses attention (all_to_all between sequence and heads), sequence-parallel SwiGLU and RoPE,
all-gathered K/V context parallelism, sharded greedy decoding (argmax, top-k over vocab shards)
and Levanter-style gradient accumulation. Small float32 shapes, meshes of 4-8 devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Example, f32, ids, program

TP4 = (("tp", 4),)
SP4 = (("sp", 4),)
EP4 = (("ep", 4),)
DP_TP = (("dp", 2), ("tp", 4))
V, D = 64, 16


def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program("maxtext_style", prog, mesh, reference, body, args, out, what, **kw)


# ----- vocab-parallel embedding (Megatron-LM VocabParallelEmbedding) ------------------------------

def embed_ref(token_ids, table):
    return table[token_ids]


def vocab_parallel_embed(token_ids, table):
    n = table.shape[0]
    start = lax.axis_index("tp") * n
    local = token_ids - start
    mask = (local >= 0) & (local < n)
    rows = jnp.take(table, jnp.clip(local, 0, n - 1), axis=0)
    rows = jnp.where(mask[..., None], rows, 0.0)
    return lax.psum(rows, "tp")


def vocab_parallel_embed_upper_bound(token_ids, table):
    n = table.shape[0]
    start = lax.axis_index("tp") * n
    local = token_ids - start
    mask = (local >= 0) & (local <= n)  # BUG
    rows = jnp.take(table, jnp.clip(local, 0, n - 1), axis=0)
    rows = jnp.where(mask[..., None], rows, 0.0)
    return lax.psum(rows, "tp")


def vocab_parallel_embed_unmasked(token_ids, table):
    n = table.shape[0]
    start = lax.axis_index("tp") * n
    local = token_ids - start
    rows = jnp.take(table, jnp.clip(local, 0, n - 1), axis=0)  # BUG
    return lax.psum(rows, "tp")


def _block_starts():
    """Token ids at every block start and end (where an off-by-one in the mask shows)."""
    rng = np.random.default_rng(5)
    t = rng.integers(0, V, (4, 8)).astype(np.int32)
    t[0] = [0, 15, 16, 31, 32, 47, 48, 63]
    table = rng.standard_normal((V, D)).astype(np.float32)
    return [[t, table]]


def _grad_embed(f):
    return jax.grad(lambda t, w: (f(t, w) ** 2).sum(), argnums=1)


# ----- vocab-parallel cross-entropy (Megatron-LM vocab_parallel_cross_entropy) --------------------

def ce_ref(logits, labels):
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def _vocab_parallel_ce(logits, labels, *, global_max: bool):
    n = logits.shape[-1]
    start = lax.axis_index("tp") * n
    m = lax.stop_gradient(jnp.max(logits, axis=-1))
    if global_max:
        m = lax.pmax(m, "tp")
    shifted = logits - m[:, None]
    local = labels - start
    mask = (local >= 0) & (local < n)
    picked = jnp.take_along_axis(shifted, jnp.clip(local, 0, n - 1)[:, None], axis=-1)[:, 0]
    picked = lax.psum(jnp.where(mask, picked, 0.0), "tp")
    sum_exp = lax.psum(jnp.sum(jnp.exp(shifted), axis=-1), "tp")
    return jnp.mean(jnp.log(sum_exp) - picked)


def vocab_parallel_ce(logits, labels):
    return _vocab_parallel_ce(logits, labels, global_max=True)


def vocab_parallel_ce_local_max(logits, labels):
    return _vocab_parallel_ce(logits, labels, global_max=False)  # BUG


def head_ce_ref(hidden, w_out, labels):
    return ce_ref(hidden @ w_out, labels)


def head_vocab_parallel_ce(hidden, w_out, labels):
    return _vocab_parallel_ce(hidden @ w_out, labels, global_max=True)


def _grad_head(f):
    return jax.grad(f, argnums=(0, 1))


# ----- MoE top-2 with capacity (GShard / MaxText dense dispatch) ---------------------------------

E, CAP = 8, 4


def _route(x, wg):
    """Top-2 routing of one group of tokens with capacity CAP per expert: (dispatch, combine),
    both (tokens, experts, capacity); second choices queue after all first choices."""
    probs = jax.nn.softmax(x @ wg, axis=-1)
    gates, choice = lax.top_k(probs, 2)
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    combine = jnp.zeros((x.shape[0], E, CAP), x.dtype)
    filled = jnp.zeros((E,), jnp.int32)
    for k in range(2):
        onehot = jax.nn.one_hot(choice[:, k], E, dtype=jnp.int32)
        position = jnp.cumsum(onehot, axis=0) - 1 + filled[None, :]
        keep = onehot * (position < CAP)
        slot = jax.nn.one_hot(jnp.sum(position * keep, axis=-1), CAP, dtype=x.dtype)
        combine = combine + (gates[:, k, None, None] * keep[:, :, None].astype(x.dtype)
                             * slot[:, None, :])
        filled = filled + jnp.sum(onehot, axis=0)
    return (combine > 0).astype(x.dtype), combine


def _experts(h, w1, w2):
    return jnp.einsum("ecf,efd->ecd", jax.nn.relu(jnp.einsum("ecd,edf->ecf", h, w1)), w2)


def moe_ref(x, wg, w1, w2):
    """The unsharded layer, tokens in 4 groups of 8 (as MaxText groups them)."""
    groups = x.reshape(4, -1, x.shape[-1])
    dispatch, combine = jax.vmap(_route, in_axes=(0, None))(groups, wg)
    expert_in = jnp.einsum("gtec,gtd->egcd", dispatch, groups)
    e, g, c, d = expert_in.shape
    out = _experts(expert_in.reshape(e, g * c, d), w1, w2).reshape(e, g, c, d)
    return jnp.einsum("gtec,egcd->gtd", combine, out).reshape(x.shape)


def moe_expert_parallel(x, wg, w1, w2):
    dispatch, combine = _route(x, wg)
    expert_in = jnp.einsum("tec,td->ecd", dispatch, x)
    expert_in = lax.all_to_all(expert_in, "ep", split_axis=0, concat_axis=1, tiled=True)
    out = _experts(expert_in, w1, w2)
    out = lax.all_to_all(out, "ep", split_axis=1, concat_axis=0, tiled=True)
    return jnp.einsum("tec,ecd->td", combine, out)


def moe_expert_parallel_unweighted(x, wg, w1, w2):
    dispatch, _ = _route(x, wg)
    expert_in = jnp.einsum("tec,td->ecd", dispatch, x)
    expert_in = lax.all_to_all(expert_in, "ep", split_axis=0, concat_axis=1, tiled=True)
    out = _experts(expert_in, w1, w2)
    out = lax.all_to_all(out, "ep", split_axis=1, concat_axis=0, tiled=True)
    return jnp.einsum("tec,ecd->td", dispatch, out)  # BUG


# ----- attention under sequence/context parallelism ----------------------------------------------

def _attend(q, k, v, q_pos, k_pos):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def causal_attention_ref(q, k, v):
    pos = jnp.arange(q.shape[1])
    return _attend(q, k, v, pos, pos)


def _ulysses(q, k, v, axes):
    def to_heads(t):
        return lax.all_to_all(t, axes, split_axis=2, concat_axis=1, tiled=True)

    q, k, v = to_heads(q), to_heads(k), to_heads(v)
    pos = jnp.arange(q.shape[1])
    out = _attend(q, k, v, pos, pos)
    return lax.all_to_all(out, axes, split_axis=1, concat_axis=2, tiled=True)


def ulysses_attention(q, k, v):
    return _ulysses(q, k, v, "sp")


def ulysses_attention_two_axes(q, k, v):
    return _ulysses(q, k, v, ("a", "b"))


def allgather_kv_attention(q, k, v):
    s = q.shape[1]
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    q_pos = lax.axis_index("sp") * s + jnp.arange(s)
    return _attend(q, k, v, q_pos, jnp.arange(k.shape[1]))


def allgather_kv_attention_local_positions(q, k, v):
    s = q.shape[1]
    k = lax.all_gather(k, "sp", axis=1, tiled=True)
    v = lax.all_gather(v, "sp", axis=1, tiled=True)
    q_pos = jnp.arange(s)  # BUG
    return _attend(q, k, v, q_pos, jnp.arange(k.shape[1]))


def _rope(x, pos):
    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angle = pos[:, None].astype(jnp.float32) * freq[None, :]
    sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_ref(x):
    return _rope(x, jnp.arange(x.shape[1]))


def rope_seq_parallel(x):
    s = x.shape[1]
    return _rope(x, lax.axis_index("sp") * s + jnp.arange(s))


def rope_seq_parallel_restart(x):
    return _rope(x, jnp.arange(x.shape[1]))  # BUG


def rope_seq_parallel_global_stride(x):
    s = x.shape[1]
    return _rope(x, lax.axis_index("sp") * 16 + jnp.arange(s))  # BUG


# ----- sequence-parallel SwiGLU (MaxText/Llama) ---------------------------------------------------

def _rms(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def swiglu_ref(x, g, w_gate, w_up, w_down):
    h = _rms(x, g)
    return x + (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down


def swiglu_seq_parallel(x, g, w_gate, w_up, w_down):
    h = lax.all_gather(_rms(x, g), "tp", axis=1, tiled=True)
    y = (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down
    return x + lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True)


def swiglu_seq_parallel_gate_up_swapped(x, g, w_gate, w_up, w_down):
    h = lax.all_gather(_rms(x, g), "tp", axis=1, tiled=True)
    y = (jax.nn.silu(h @ w_up) * (h @ w_gate)) @ w_down  # BUG
    return x + lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True)


def swiglu_seq_parallel_residual_inside(x, g, w_gate, w_up, w_down):
    h = lax.all_gather(_rms(x, g), "tp", axis=1, tiled=True)
    x_full = lax.all_gather(x, "tp", axis=1, tiled=True)
    y = (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down
    return lax.psum_scatter(y + x_full, "tp", scatter_dimension=1, tiled=True)  # BUG


def swiglu_psum_then_slice(x, g, w_gate, w_up, w_down):
    """The reduce-scatter spelled as a psum of the whole sequence and a slice of this device's
    rows (correct, if wasteful)."""
    h = lax.all_gather(_rms(x, g), "tp", axis=1, tiled=True)
    y = lax.psum((jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down, "tp")
    rows = x.shape[1]
    return x + lax.dynamic_slice_in_dim(y, lax.axis_index("tp") * rows, rows, axis=1)


def swiglu_psum_then_slice_next_rows(x, g, w_gate, w_up, w_down):
    h = lax.all_gather(_rms(x, g), "tp", axis=1, tiled=True)
    y = lax.psum((jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down, "tp")
    rows = x.shape[1]
    start = (lax.axis_index("tp") + 1) % lax.axis_size("tp") * rows  # BUG
    return x + lax.dynamic_slice_in_dim(y, start, rows, axis=1)


# ----- greedy decoding over vocab shards ----------------------------------------------------------

def argmax_ref(logits):
    return jnp.argmax(logits, axis=-1)


def _sharded_argmax(logits, offset: bool):
    n = logits.shape[-1]
    local_max = jnp.max(logits, axis=-1)
    local_arg = jnp.argmax(logits, axis=-1)
    if offset:
        local_arg = local_arg + lax.axis_index("tp") * n
    maxes = lax.all_gather(local_max, "tp")
    args = lax.all_gather(local_arg, "tp")
    best = jnp.argmax(maxes, axis=0)
    return jnp.take_along_axis(args, best[None], axis=0)[0]


def sharded_argmax(logits):
    return _sharded_argmax(logits, True)


def sharded_argmax_local_ids(logits):
    return _sharded_argmax(logits, False)  # BUG


def topk_ref(logits):
    return lax.top_k(logits, 4)


def sharded_topk(logits):
    n = logits.shape[-1]
    values, local = lax.top_k(logits, 4)
    values = lax.all_gather(values, "tp", axis=1, tiled=True)
    index = lax.all_gather(local + lax.axis_index("tp") * n, "tp", axis=1, tiled=True)
    best_values, pick = lax.top_k(values, 4)
    return best_values, jnp.take_along_axis(index, pick, axis=1)


# ----- Levanter-style gradient accumulation (data parallel) ---------------------------------------

def _mse(w1, w2, x, y):
    return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)


def sgd_step_ref(w1, w2, x, y):
    g1, g2 = jax.grad(_mse, argnums=(0, 1))(w1, w2, x, y)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def _accumulated_step(w1, w2, x, y, *, average: bool, varying: bool = True):
    """Under check_vma, the gradient w.r.t. a replicated parameter is summed over the devices
    by jax itself; casting the parameters to varying first keeps each device's own gradient,
    which the pmean then averages."""
    micro = 2
    p1, p2 = w1, w2
    if varying:
        p1, p2 = lax.pcast(w1, "data", to="varying"), lax.pcast(w2, "data", to="varying")
    xs = x.reshape(micro, -1, x.shape[-1])
    ys = y.reshape(micro, -1, y.shape[-1])

    def accumulate(acc, batch):
        g = jax.grad(_mse, argnums=(0, 1))(p1, p2, *batch)
        return (acc[0] + g[0], acc[1] + g[1]), None

    zeros = (jnp.zeros_like(p1), jnp.zeros_like(p2))
    (g1, g2), _ = lax.scan(accumulate, zeros, (xs, ys))
    if average:
        g1, g2 = g1 / micro, g2 / micro
    g1, g2 = lax.pmean(g1, "data"), lax.pmean(g2, "data")
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def accumulated_sgd_step(w1, w2, x, y):
    return _accumulated_step(w1, w2, x, y, average=True)


def accumulated_sgd_step_summed(w1, w2, x, y):
    return _accumulated_step(w1, w2, x, y, average=False)  # BUG


def accumulated_sgd_step_not_varying(w1, w2, x, y):
    return _accumulated_step(w1, w2, x, y, average=True, varying=False)  # BUG


# ----- the corpus -----------------------------------------------------------------------------

def programs() -> list[Example]:
    emb = (ids((4, 8), P(), V), f32((V, D), P("tp", None)))
    emb_dp = (ids((4, 8), P("dp", None), V), f32((V, D), P("tp", None)))
    ce = (f32((16, V), P(None, "tp")), ids((16,), P(), V))
    head = (f32((16, D)), f32((D, V), P(None, "tp"), "weight"), ids((16,), P(), V))
    moe = (f32((32, 8), P("ep", None)), f32((8, E), P(), "weight"),
           f32((E, 8, 16), P("ep", None, None), "weight"),
           f32((E, 16, 8), P("ep", None, None), "weight"))
    qkv = tuple(f32((2, 16, 4, 8), P(None, "sp", None, None)) for _ in range(3))
    qkv2 = tuple(f32((2, 16, 4, 8), P(None, ("a", "b"), None, None)) for _ in range(3))
    sp_mlp = (f32((2, 16, D), P(None, "tp", None)), f32((D,), P(), "positive"),
              f32((D, 32), P(None, "tp"), "weight"), f32((D, 32), P(None, "tp"), "weight"),
              f32((32, D), P("tp", None), "weight"))
    accum = (f32((8, 16), P(), "weight"), f32((16, 4), P(), "weight"),
             f32((32, 8), P("data")), f32((32, 4), P("data")))
    desc_emb = "Megatron-LM VocabParallelEmbedding spelling: ids - start, mask, take(clip), psum"
    desc_ce = "Megatron-LM vocab-parallel cross-entropy: pmax, masked target logit, psum"
    ex = [
        _p("vocab_parallel_embed", TP4, embed_ref, vocab_parallel_embed, emb, P(), desc_emb,
           chosen=_block_starts),
        _p("vocab_parallel_embed", TP4, embed_ref, vocab_parallel_embed_upper_bound, emb, P(),
           desc_emb, bug="mask_upper_bound_inclusive", chosen=_block_starts),
        _p("vocab_parallel_embed", TP4, embed_ref, vocab_parallel_embed_unmasked, emb, P(),
           desc_emb, bug="no_mask", chosen=_block_starts),
        _p("vocab_parallel_embed", DP_TP, embed_ref, vocab_parallel_embed, emb_dp,
           P("dp", None, None), desc_emb + ", batch over dp"),
        _p("grad_vocab_parallel_embed", TP4, _grad_embed(embed_ref), vocab_parallel_embed, emb,
           P(), desc_emb + ": gradient w.r.t. the table (scatter-add into the shard)",
           wrap=_grad_embed),
        _p("vocab_parallel_ce", TP4, ce_ref, vocab_parallel_ce, ce, P(), desc_ce),
        _p("vocab_parallel_ce", TP4, ce_ref, vocab_parallel_ce_local_max, ce, P(), desc_ce,
           bug="local_max_no_pmax"),
        _p("head_vocab_parallel_ce", TP4, head_ce_ref, head_vocab_parallel_ce, head, P(),
           desc_ce + ", on a column-parallel LM head"),
        _p("grad_head_vocab_parallel_ce", TP4, _grad_head(head_ce_ref), head_vocab_parallel_ce,
           head, P(), desc_ce + ": gradients w.r.t. the hidden states and the head",
           wrap=_grad_head),
        _p("moe_top2_capacity", EP4, moe_ref, moe_expert_parallel, moe, P("ep", None),
           "GShard/MaxText MoE: top-2 with capacity, dispatch/combine einsums, all_to_all "
           "over the expert axis"),
        _p("moe_top2_capacity", EP4, moe_ref, moe_expert_parallel_unweighted, moe,
           P("ep", None), "GShard/MaxText MoE", bug="combined_with_dispatch_mask"),
        _p("ulysses_attention", SP4, causal_attention_ref, ulysses_attention, qkv,
           P(None, "sp", None, None),
           "DeepSpeed-Ulysses attention (MaxText context parallelism): all_to_all sequence "
           "<-> heads, causal attention, all_to_all back"),
        _p("ulysses_attention_two_axes", (("a", 2), ("b", 2)), causal_attention_ref,
           ulysses_attention_two_axes, qkv2, P(None, ("a", "b"), None, None),
           "DeepSpeed-Ulysses attention with all_to_all over two mesh axes"),
        _p("allgather_kv_attention", SP4, causal_attention_ref, allgather_kv_attention, qkv,
           P(None, "sp", None, None),
           "context parallelism by all-gathered K/V (MaxText cp), causal mask at global "
           "positions"),
        _p("allgather_kv_attention", SP4, causal_attention_ref,
           allgather_kv_attention_local_positions, qkv, P(None, "sp", None, None),
           "context parallelism by all-gathered K/V", bug="query_positions_restart"),
        _p("rope_seq_parallel", SP4, rope_ref, rope_seq_parallel,
           [f32((2, 16, 4, 8), P(None, "sp", None, None))], P(None, "sp", None, None),
           "Llama RoPE under sequence parallelism: positions offset by the shard index"),
        _p("rope_seq_parallel", SP4, rope_ref, rope_seq_parallel_restart,
           [f32((2, 16, 4, 8), P(None, "sp", None, None))], P(None, "sp", None, None),
           "Llama RoPE under sequence parallelism", bug="positions_restart"),
        _p("rope_seq_parallel", SP4, rope_ref, rope_seq_parallel_global_stride,
           [f32((2, 16, 4, 8), P(None, "sp", None, None))], P(None, "sp", None, None),
           "Llama RoPE under sequence parallelism", bug="offset_by_global_length"),
        _p("swiglu_seq_parallel", TP4, swiglu_ref, swiglu_seq_parallel, sp_mlp,
           P(None, "tp", None),
           "MaxText/Llama sequence-parallel SwiGLU: all_gather(seq), TP matmuls, "
           "psum_scatter(seq), residual"),
        _p("swiglu_seq_parallel", TP4, swiglu_ref, swiglu_seq_parallel_residual_inside, sp_mlp,
           P(None, "tp", None), "sequence-parallel SwiGLU", bug="residual_inside_reduce"),
        _p("swiglu_seq_parallel", TP4, swiglu_ref, swiglu_seq_parallel_gate_up_swapped, sp_mlp,
           P(None, "tp", None), "sequence-parallel SwiGLU", bug="gate_and_up_swapped"),
        _p("swiglu_psum_then_slice", TP4, swiglu_ref, swiglu_psum_then_slice, sp_mlp,
           P(None, "tp", None), "sequence-parallel SwiGLU reduced by psum + dynamic_slice of "
           "the device's rows"),
        _p("swiglu_psum_then_slice", TP4, swiglu_ref, swiglu_psum_then_slice_next_rows, sp_mlp,
           P(None, "tp", None), "sequence-parallel SwiGLU by psum + slice",
           bug="slices_next_devices_rows"),
        _p("greedy_argmax", TP4, argmax_ref, sharded_argmax, [f32((8, V), P(None, "tp"))], P(),
           "greedy decoding over vocab shards: local max/argmax, all_gather(tiled=False), "
           "argmax of the maxima", check_vma=False),
        _p("greedy_argmax", TP4, argmax_ref, sharded_argmax_local_ids,
           [f32((8, V), P(None, "tp"))], P(), "greedy decoding over vocab shards",
           bug="shard_offset_missing"),
        _p("sharded_top4", TP4, topk_ref, sharded_topk, [f32((8, V), P(None, "tp"))], (P(), P()),
           "top-k sampling over vocab shards: local top_k, all_gather, top_k of the candidates",
           check_vma=False),
        _p("grad_accumulation", (("data", 4),), sgd_step_ref, accumulated_sgd_step, accum,
           (P(), P()), "Levanter-style microbatched gradient accumulation (lax.scan), pmean "
           "over data, SGD"),
        _p("grad_accumulation", (("data", 4),), sgd_step_ref, accumulated_sgd_step_summed,
           accum, (P(), P()), "Levanter-style gradient accumulation",
           bug="microbatch_grads_summed"),
        _p("grad_accumulation", (("data", 4),), sgd_step_ref, accumulated_sgd_step_not_varying,
           accum, (P(), P()), "Levanter-style gradient accumulation",
           bug="replicated_grads_psummed_then_pmeaned", check_vma=True),
    ]
    return ex
