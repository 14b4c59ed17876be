"""A twelfth-session batch, from sources and spellings the earlier batches did not use:
Levanter/Haliax's logsumexp over a vocab-sharded axis (a logsumexp of the blocks'
logsumexps), Flax's BatchNorm with `axis_name` (pmean of the mean and of the mean square),
cumulative products, maxima and reverse sums over a sharded axis (a gathered exclusive prefix,
a Hillis-Steele scan with ppermute, suffix totals, a local associative_scan), a flip of a
sharded axis, argmax and top-2 with ties over a sharded axis (int32 data cast to float in the
middle), a sort redistributed by `dynamic_slice` at the device's offset, a transpose by
all_to_all (split and concat axes swapped), the reduce-scatter + all-gather spelling of an
all-reduce, psum_scatter untiled, FSDP with bfloat16 weights and float32 accumulation,
Megatron's conjugate f/g operators written as `jax.custom_vjp` and its row-parallel bias added
once (cond / where on axis_index), a rematerialized TP MLP under `jax.checkpoint` with a
policy, a scan over stacked TP layers, microbatches in a scan with an int32 counter, a vmap
inside a shard_map body, a positional-embedding table sliced by `axis_index`, a gather spelled
as dynamic_update_slice + psum, int32 / float32 expert counters (and their bfloat16 / int8
twins), segment_sum, the Switch/MaxText load-balancing loss, EasyLM's valid-token loss and
accuracy, a vocab-parallel lookup with one unsigned compare, int8 (AQT-style) quantization,
floor division of shifted positions, jax.experimental.custom_partitioning, and jit with
in/out shardings (XLA's per-device program) of logsumexp, cumsum (forward and reverse), sort,
mean, argmax, top_k, cross entropy and a t5x-style attention with logical axes. Each program
is ours, written with the algorithm, collectives and specs the source describes; small
shapes; each correct program has a wrong twin nearest to it (a psum for a pmean, a wrong
axis, an offset off by one, the other dtype, a scale by the wrong size, a folded constant).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Arg, Example, f32, ids, program

TP4 = (("tp", 4),)
I4 = (("i", 4),)
SP4 = (("sp", 4),)
DP4 = (("dp", 4),)
FSDP4 = (("fsdp", 4),)
DP2_TP2 = (("dp", 2), ("tp", 2))


def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program("twelfth_sources", prog, mesh, reference, body, args, out, what, **kw)


def _xla(prog: str, mesh, reference, build, args, out, what: str, **kw) -> Example:
    return _p(prog, mesh, reference, build, args, out, what, partitioned=True, **kw)


# ----- Levanter / Haliax: logsumexp over a vocab-sharded axis ----------------------------------

def lse_ref(x):
    return jax.nn.logsumexp(x, axis=-1)


def _lse_of_block_lse(x, combine):
    local = jax.nn.logsumexp(x, axis=-1)
    top = lax.pmax(local, "tp")
    return top + jnp.log(combine(jnp.exp(local - top), "tp"))


def lse_of_block_lse(x):
    return _lse_of_block_lse(x, lax.psum)


def lse_of_block_lse_pmean(x):
    return _lse_of_block_lse(x, lax.pmean)  # BUG


def _lse_gathered(x, combine):
    blocks = lax.all_gather(jax.nn.logsumexp(x, axis=-1), "tp", axis=-1, tiled=False)
    return combine(blocks)


def lse_gathered(x):
    return _lse_gathered(x, lambda b: jax.nn.logsumexp(b, axis=-1))


def lse_gathered_max(x):
    return _lse_gathered(x, lambda b: jnp.max(b, axis=-1))  # BUG


# ----- Flax BatchNorm(axis_name="dp"): statistics averaged over the batch shards --------------

def batchnorm_ref(x, scale, bias):
    mean = jnp.mean(x, axis=0)
    mean2 = jnp.mean(x * x, axis=0)
    var = jnp.maximum(0.0, mean2 - mean * mean)
    return (x - mean) * lax.rsqrt(var + 1e-5) * scale + bias


def _batchnorm(x, scale, bias, *, mean2_reduced: bool):
    mean = lax.pmean(jnp.mean(x, axis=0), "dp")
    mean2 = jnp.mean(x * x, axis=0)
    if mean2_reduced:
        mean2 = lax.pmean(mean2, "dp")
    var = jnp.maximum(0.0, mean2 - mean * mean)
    return (x - mean) * lax.rsqrt(var + 1e-5) * scale + bias


def batchnorm(x, scale, bias):
    return _batchnorm(x, scale, bias, mean2_reduced=True)


def batchnorm_local_mean_square(x, scale, bias):
    return _batchnorm(x, scale, bias, mean2_reduced=False)  # BUG


# ----- cumulative product and maximum over a sharded axis --------------------------------------

def cumprod_ref(x):
    return jnp.cumprod(x)


def _cumprod(x, before):
    local = jnp.cumprod(x)
    totals = lax.all_gather(local[-1], "i")
    mine = lax.axis_index("i")
    prefix = jnp.prod(jnp.where(before(jnp.arange(totals.shape[0]), mine), totals, 1.0))
    return local * prefix


def cumprod_sharded(x):
    return _cumprod(x, lambda k, mine: k < mine)


def cumprod_sharded_inclusive(x):
    return _cumprod(x, lambda k, mine: k <= mine)  # BUG


def cummax_ref(x):
    return lax.cummax(x, axis=0)


def _cummax(x, toward):
    n = lax.axis_size("i")
    mine = lax.axis_index("i")
    local = lax.cummax(x, axis=0)
    running = local[-1]
    prefix = jnp.full_like(running, -jnp.inf)
    shift = 1
    while shift < n:
        got = lax.ppermute(running, "i", [(k, (k + toward * shift) % n) for k in range(n)])
        got = jnp.where(mine >= shift, got, -jnp.inf)
        prefix = jnp.maximum(prefix, got)
        running = jnp.maximum(running, got)
        shift *= 2
    return jnp.maximum(local, prefix)


def cummax_scan(x):
    return _cummax(x, 1)


def cummax_scan_backwards(x):
    return _cummax(x, -1)  # BUG


# ----- argmax with ties over a sharded axis (first index wins, as jnp.argmax) ------------------

def argmax_ref(x):
    return jnp.argmax(x.astype(jnp.float32), axis=-1).astype(jnp.int32)


def _argmax_ties(x, pick):
    xf = x.astype(jnp.float32)
    chunk = xf.shape[-1]
    best = jnp.max(xf, axis=-1)
    where = jnp.argmax(xf, axis=-1).astype(jnp.int32) + lax.axis_index("tp") * chunk
    top = lax.pmax(best, "tp")
    return pick(best == top, where)


def argmax_ties(x):
    return _argmax_ties(x, lambda hit, at: lax.pmin(jnp.where(hit, at, 2 ** 30), "tp"))


def argmax_ties_last(x):
    return _argmax_ties(x, lambda hit, at: lax.pmax(jnp.where(hit, at, -1), "tp"))  # BUG


# ----- a sort redistributed: gather, sort, each device keeps its slice -------------------------

def sort_ref(x):
    return jnp.sort(x)


def _sort_slice(x, block):
    n = lax.axis_size("i")
    chunk = x.shape[0]
    ordered = jnp.sort(lax.all_gather(x, "i", tiled=True))
    return lax.dynamic_slice_in_dim(ordered, block(lax.axis_index("i"), n) * chunk, chunk)


def sort_slice(x):
    return _sort_slice(x, lambda k, n: k)


def sort_slice_reversed(x):
    return _sort_slice(x, lambda k, n: n - 1 - k)  # BUG


# ----- a transpose by all_to_all, rows to columns ----------------------------------------------

def transpose_ref(x):
    return x.T


def transpose_a2a(x):
    return lax.all_to_all(x, "i", split_axis=1, concat_axis=0, tiled=True).T


def transpose_a2a_first(x):
    return lax.all_to_all(x.T, "i", split_axis=0, concat_axis=1, tiled=True)


def transpose_a2a_first_same_axis(x):
    return lax.all_to_all(x.T, "i", split_axis=0, concat_axis=0, tiled=True).T  # BUG


# ----- an all-reduce spelled as reduce-scatter then all-gather (stacked, then regrouped) --------

def block_sum_ref(x):
    return x.reshape(4, -1, x.shape[-1]).sum(axis=0)


def _rs_ag(x, regroup):
    part = lax.psum_scatter(x, "i", scatter_dimension=1, tiled=True)
    return regroup(lax.all_gather(part, "i", axis=0, tiled=False))


def rs_ag(x):
    return _rs_ag(x, lambda g: jnp.moveaxis(g, 0, 1).reshape(g.shape[1], -1))


def rs_ag_reshaped(x):
    return _rs_ag(x, lambda g: g.reshape(g.shape[1], -1))  # BUG


# ----- FSDP step: bfloat16 weights gathered, float32 accumulation and update --------------------

LR = 0.1


def _fsdp_update(w, grad):
    return (w - LR * grad).astype(jnp.bfloat16).astype(jnp.float32)


def fsdp_bf16_ref(w, x, t):
    y = jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
                preferred_element_type=jnp.float32)
    dy = 2.0 * (y - t) / x.shape[0]
    return _fsdp_update(w, jnp.dot(x.T, dy))


def _fsdp_bf16(w, x, t, rows):
    full = lax.all_gather(w.astype(jnp.bfloat16), "fsdp", tiled=True)
    y = jnp.dot(x.astype(jnp.bfloat16), full, preferred_element_type=jnp.float32)
    dy = 2.0 * (y - t) / rows(x)
    grad = lax.psum_scatter(jnp.dot(x.T, dy), "fsdp", scatter_dimension=0, tiled=True)
    return _fsdp_update(w, grad)


def fsdp_bf16(w, x, t):
    return _fsdp_bf16(w, x, t, lambda x: x.shape[0] * lax.axis_size("fsdp"))


def fsdp_bf16_local_batch(w, x, t):
    return _fsdp_bf16(w, x, t, lambda x: x.shape[0])  # BUG


# ----- Megatron's f and g operators as jax.custom_vjp, under jax.grad -------------------------

def _tp_mlp_loss(x, w1, w2):
    return jnp.sum((jnp.tanh(x @ w1) @ w2) ** 2)


megatron_ref = jax.grad(_tp_mlp_loss, argnums=(0, 1, 2))


def _conjugates(backward_sum: bool):
    @jax.custom_vjp
    def copy_to_tp(x):
        return x

    def copy_fwd(x):
        return x, None

    def copy_bwd(_, g):
        return (lax.psum(g, "tp") if backward_sum else g,)

    copy_to_tp.defvjp(copy_fwd, copy_bwd)

    @jax.custom_vjp
    def reduce_from_tp(x):
        return lax.psum(x, "tp")

    def reduce_fwd(x):
        return lax.psum(x, "tp"), None

    def reduce_bwd(_, g):
        return (g,)

    reduce_from_tp.defvjp(reduce_fwd, reduce_bwd)
    return copy_to_tp, reduce_from_tp


def _megatron_loss(x, w1, w2, backward_sum: bool):
    f, g = _conjugates(backward_sum)
    return jnp.sum(g(jnp.tanh(f(x) @ w1) @ w2) ** 2)


def megatron_fg(x, w1, w2):
    return jax.grad(_megatron_loss, argnums=(0, 1, 2))(x, w1, w2, True)


def megatron_fg_no_backward_sum(x, w1, w2):
    return jax.grad(_megatron_loss, argnums=(0, 1, 2))(x, w1, w2, False)  # BUG


# ----- a rematerialized TP MLP block (jax.checkpoint with a policy) under jax.grad --------------

def remat_ref(w1, w2, x):
    return jnp.sum((jax.nn.gelu(x @ w1) @ w2) ** 2) / x.shape[0]


def _remat_loss(w1, w2, x, rows):
    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_saveable)
    def block(x, w1, w2):
        return lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")

    return lax.psum(jnp.sum(block(x, w1, w2) ** 2), "dp") / rows(x)


def remat_mlp(w1, w2, x):
    return _remat_loss(w1, w2, x, lambda x: x.shape[0] * lax.axis_size("dp"))


def remat_mlp_local_rows(w1, w2, x):
    return _remat_loss(w1, w2, x, lambda x: x.shape[0])  # BUG


def _grad2(f):
    return jax.grad(f, argnums=(0, 1))


# ----- a scan over stacked TP layers, residual after the all-reduce -----------------------------

def _layer_ref(x, w):
    w1, w2 = w
    return x + jax.nn.gelu(x @ w1) @ w2, None


def scan_layers_ref(x, w1, w2):
    return lax.scan(_layer_ref, x, (w1, w2))[0]


def _scan_layers(x, w1, w2, residual_inside: bool):
    def layer(x, w):
        w1, w2 = w
        partial = jax.nn.gelu(x @ w1) @ w2
        if residual_inside:
            return lax.psum(x + partial, "tp"), None  # BUG
        return x + lax.psum(partial, "tp"), None

    return lax.scan(layer, x, (w1, w2))[0]


def scan_layers(x, w1, w2):
    return _scan_layers(x, w1, w2, False)


def scan_layers_residual_in_psum(x, w1, w2):
    return _scan_layers(x, w1, w2, True)


# ----- a vmap over examples inside the shard_map body, a psum under the vmap -------------------

def per_example_ref(x, w1, w2):
    return jax.vmap(lambda r: jnp.tanh(r @ w1) @ w2)(x)


def _vmapped(x, w1, w2, reduce):
    return jax.vmap(lambda r: reduce(jnp.tanh(r @ w1) @ w2, "tp"))(x)


def vmapped(x, w1, w2):
    return _vmapped(x, w1, w2, lax.psum)


def vmapped_pmean(x, w1, w2):
    return _vmapped(x, w1, w2, lax.pmean)  # BUG


# ----- sequence-parallel positions: the table sliced at the device's offset ---------------------

def pos_embed_ref(x, table):
    return x + table[None]


def _pos_embed(x, table, extra: int):
    chunk = x.shape[1]
    start = lax.axis_index("sp") * chunk + extra
    return x + lax.dynamic_slice_in_dim(table, start, chunk, axis=0)[None]


def pos_embed(x, table):
    return _pos_embed(x, table, 0)


def pos_embed_off_by_one(x, table):
    return _pos_embed(x, table, 1)  # BUG


# ----- int32 expert counters, and the load-balancing loss built on them -------------------------

N_EXPERTS = 8


def counts_ref(idx):
    return jnp.bincount(idx.ravel(), length=N_EXPERTS)


def _counts(idx, axes):
    return lax.psum(jnp.bincount(idx.ravel(), length=N_EXPERTS), axes)


def expert_counts(idx):
    return _counts(idx, "dp")


def expert_counts_over_dp_tp(idx):
    return _counts(idx, ("dp", "tp"))  # BUG


def balance_ref(logits, idx):
    fraction = jnp.bincount(idx, length=N_EXPERTS).astype(jnp.float32) / idx.shape[0]
    prob = jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
    return N_EXPERTS * jnp.sum(fraction * prob)


def _balance(logits, idx, integer_division: bool):
    counts = lax.psum(jnp.bincount(idx, length=N_EXPERTS), "dp")
    tokens = idx.shape[0] * lax.axis_size("dp")
    if integer_division:
        fraction = (counts // tokens).astype(jnp.float32)  # BUG
    else:
        fraction = counts.astype(jnp.float32) / tokens
    prob = lax.pmean(jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0), "dp")
    return N_EXPERTS * jnp.sum(fraction * prob)


def balance(logits, idx):
    return _balance(logits, idx, False)


def balance_integer_division(logits, idx):
    return _balance(logits, idx, True)


# ----- jit with in/out shardings: XLA's per-device program ---------------------------------------

def lse_rows(mesh):
    return lse_ref


def lse_columns(mesh):
    return lambda x: jax.nn.logsumexp(x, axis=0)  # BUG


def cumsum_ref(x):
    return jnp.cumsum(x, axis=0)


def cumsum_rows(mesh):
    return cumsum_ref


def cumsum_columns(mesh):
    return lambda x: jnp.cumsum(x, axis=1)  # BUG


def sort_rows_ref(x):
    return jnp.sort(x, axis=0)


def sort_rows(mesh):
    return sort_rows_ref


def sort_rows_descending(mesh):
    return lambda x: -jnp.sort(-x, axis=0)  # BUG


def mean_all_ref(x):
    return jnp.mean(x)


def mean_all(mesh):
    return mean_all_ref


def mean_all_over_rows_only(mesh):
    return lambda x: jnp.sum(x) / x.shape[0]  # BUG


def attention_heads_ref(q, k, v):
    s = jnp.einsum("bqnh,bknh->bnqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, axis=-1), v)


def attention_heads(mesh):
    return attention_heads_ref


def attention_heads_softmax_over_queries(mesh):
    def f(q, k, v):
        s = jnp.einsum("bqnh,bknh->bnqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
        return jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, axis=-2), v)  # BUG
    return f


# ----- expert capacity: counts summed in float32, or in bfloat16 (the other dtype) --------------

CAPACITY_EXPERTS, CAPACITY = 4, 240.0


def overflow_ref(idx):
    counts = jnp.sum(jax.nn.one_hot(idx, CAPACITY_EXPERTS, dtype=jnp.float32), axis=0)
    return jnp.maximum(counts - CAPACITY, 0.0)


def _overflow(idx, dtype):
    local = jnp.sum(jax.nn.one_hot(idx, CAPACITY_EXPERTS, dtype=jnp.float32), axis=0)
    counts = lax.psum(local.astype(dtype), "dp").astype(jnp.float32)
    return jnp.maximum(counts - CAPACITY, 0.0)


def overflow(idx):
    return _overflow(idx, jnp.float32)


def overflow_bf16_psum(idx):
    return _overflow(idx, jnp.bfloat16)  # BUG


def int_counts_ref(idx):
    return jnp.sum(jax.nn.one_hot(idx, CAPACITY_EXPERTS, dtype=jnp.int32), axis=0)


def _int_counts(idx, dtype):
    local = jnp.sum(jax.nn.one_hot(idx, CAPACITY_EXPERTS, dtype=jnp.int32), axis=0)
    return lax.psum(local.astype(dtype), "dp").astype(jnp.int32)


def int_counts(idx):
    return _int_counts(idx, jnp.int32)


def int_counts_int8(idx):
    return _int_counts(idx, jnp.int8)  # BUG


def _capacity_ids():
    """Counts near the capacity, not all even (bfloat16 spaces 256..512 by 2)."""
    import numpy as np

    rng = np.random.default_rng(3)
    return [[rng.permutation(np.repeat(np.arange(4), [259, 257, 255, 253])).astype(np.int32)]]


# ----- a similarity over a sharded embed dim, scaled by the global width -----------------------

def similarity_ref(q, k):
    return jax.nn.softmax(q @ k.T / jnp.sqrt(jnp.float32(q.shape[-1])), axis=-1)


def _similarity(q, k, width):
    s = lax.psum(q @ k.T, "tp")
    return jax.nn.softmax(s / jnp.sqrt(jnp.float32(width(q))), axis=-1)


def similarity(q, k):
    return _similarity(q, k, lambda q: q.shape[-1] * lax.axis_size("tp"))


def similarity_local_width(q, k):
    return _similarity(q, k, lambda q: q.shape[-1])  # BUG


# ----- psum_scatter untiled: each device keeps one row of the summed product ---------------------

def flat_matmul_ref(x, w):
    return (x @ w).reshape(-1)


def flat_scatter(x, w):
    return lax.psum_scatter(x @ w, "i", scatter_dimension=0, tiled=False)


def flat_scatter_rows_reversed(x, w):
    return lax.psum_scatter((x @ w)[::-1], "i", scatter_dimension=0, tiled=False)  # BUG


# ----- microbatches in a scan with an int32 counter, data parallel ------------------------------

def _mb_loss(w, x, t):
    return jnp.mean((jnp.tanh(x @ w) - t) ** 2)


mb_ref = jax.grad(_mb_loss)


def _microbatched(w, x, t, start: int):
    def step(carry, batch):
        total, count = carry
        return (total + jax.grad(_mb_loss)(w, *batch), count + 1), None

    xs = x.reshape(2, -1, x.shape[-1])
    ts = t.reshape(2, -1, t.shape[-1])
    (total, count), _ = lax.scan(step, (jnp.zeros_like(w), jnp.int32(start)), (xs, ts))
    return lax.psum(total, "dp") / lax.psum(count, "dp").astype(jnp.float32)


def microbatched(w, x, t):
    return _microbatched(w, x, t, 0)


def microbatched_count_from_one(w, x, t):
    return _microbatched(w, x, t, 1)  # BUG


# ----- a gather spelled as dynamic_update_slice into zeros, then psum ----------------------------

def identity_ref(x):
    return x


def _dus_gather(x, extra: int):
    chunk = x.shape[0]
    buf = jnp.zeros((chunk * lax.axis_size("i"),), x.dtype)
    buf = lax.dynamic_update_slice(buf, x, (lax.axis_index("i") * chunk + extra,))
    return lax.psum(buf, "i")


def dus_gather(x):
    return _dus_gather(x, 0)


def dus_gather_off_by_one(x):
    return _dus_gather(x, 1)  # BUG


# ----- cumsum as a local associative_scan plus the gathered exclusive prefix ---------------------

def cumsum1_ref(x):
    return jnp.cumsum(x)


def _assoc_cumsum(x, before):
    local = lax.associative_scan(jnp.add, x)
    totals = lax.all_gather(local[-1], "i")
    mine = lax.axis_index("i")
    return local + jnp.sum(jnp.where(before(jnp.arange(totals.shape[0]), mine), totals, 0.0))


def assoc_cumsum(x):
    return _assoc_cumsum(x, lambda k, mine: k < mine)


def assoc_cumsum_inclusive(x):
    return _assoc_cumsum(x, lambda k, mine: k <= mine)  # BUG


# ----- segment_sum over batch-sharded rows ------------------------------------------------------

def segment_ref(data, seg):
    return jax.ops.segment_sum(data, seg, num_segments=4)


def _segment(data, seg, axes):
    return lax.psum(jax.ops.segment_sum(data, seg, num_segments=4), axes)


def segment(data, seg):
    return _segment(data, seg, "dp")


def segment_over_dp_tp(data, seg):
    return _segment(data, seg, ("dp", "tp"))  # BUG


# ----- more jit with in/out shardings: cross entropy, argmax, top_k, reverse cumsum ------------

def ce_ref(logits, labels):
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def ce(mesh):
    return ce_ref


def ce_labels_shifted(mesh):
    def f(logits, labels):
        labels = (labels + 1) % logits.shape[-1]  # BUG
        return ce_ref(logits, labels)
    return f


def argmax_rows_ref(x):
    return jnp.argmax(x, axis=-1)


def argmax_rows(mesh):
    return argmax_rows_ref


def argmax_rows_argmin(mesh):
    return lambda x: jnp.argmin(x, axis=-1)  # BUG


def top2_ref(x):
    return tuple(lax.top_k(x, 2))


def top2(mesh):
    return top2_ref


def top2_reversed(mesh):
    def f(x):
        values, where = lax.top_k(x, 2)
        return values[:, ::-1], where[:, ::-1]  # BUG
    return f


def rcumsum_ref(x):
    return lax.cumsum(x, axis=0, reverse=True)


def rcumsum(mesh):
    return rcumsum_ref


def rcumsum_forward(mesh):
    return lambda x: lax.cumsum(x, axis=0, reverse=False)  # BUG


# ----- vocab-parallel lookup with one unsigned compare for both bounds -------------------------

def lookup_ref(tokens, table):
    return table[tokens]


def _lookup_unsigned(tokens, table, unsigned: bool):
    chunk = table.shape[0]
    local = tokens - lax.axis_index("tp") * chunk
    if unsigned:
        inside = local.astype(jnp.uint32) < chunk
    else:
        inside = local < chunk  # BUG
    rows = jnp.take(table, jnp.clip(local, 0, chunk - 1), axis=0)
    return lax.psum(jnp.where(inside[:, None], rows, 0.0), "tp")


def lookup_unsigned(tokens, table):
    return _lookup_unsigned(tokens, table, True)


def lookup_unsigned_signed_compare(tokens, table):
    return _lookup_unsigned(tokens, table, False)


# ----- a max over a sharded axis started from -inf, or from 0 (not the identity) ---------------

def neg_max_ref(x):
    return jnp.max(-x, axis=-1)


def _neg_max(x, start: float):
    return lax.pmax(jnp.max(-x, axis=-1, initial=start), "tp")


def neg_max(x):
    return _neg_max(x, -jnp.inf)


def neg_max_initial_zero(x):
    return _neg_max(x, 0.0)  # BUG


# ----- int8 quantization with a scale from the global absmax (round, then convert) ------------

def quant_ref(x):
    scale = jnp.max(jnp.abs(x)) / 127.0
    return jnp.round(x / scale).astype(jnp.int8)


def _quant(x, rounded: bool):
    scaled = x / (lax.pmax(jnp.max(jnp.abs(x)), "i") / 127.0)
    if rounded:
        return jnp.round(scaled).astype(jnp.int8)
    return scaled.astype(jnp.int8)  # BUG


def quant(x):
    return _quant(x, True)


def quant_truncated(x):
    return _quant(x, False)


def quant_scale_folded(x):
    amax = lax.pmax(jnp.max(jnp.abs(x)), "i")
    return jnp.round(127.0 * (x / amax)).astype(jnp.int8)  # BUG


def _quant_witness():
    """Where `x / (m / 127)` and `127 * (x / m)` round to different int8 values (float32)."""
    import numpy as np

    x = np.full((16, 4), 0.1, np.float32)
    x[3, 1], x[9, 2] = -1.6156265, 2.2424543
    return [[x]]


# ----- positions bucketed by floor division of a shifted index ----------------------------------

def bucket_ref(pos):
    return (pos - 8) // 4


def _bucket(pos, floor: bool):
    shifted = pos - 8
    if floor:
        return shifted // 4
    return lax.div(shifted, jnp.int32(4))  # BUG


def bucket(pos):
    return _bucket(pos, True)


def bucket_truncated(pos):
    return _bucket(pos, False)


# ----- a flip of a sharded axis: each device flips its block, the blocks change places --------

def flip_ref(x):
    return jnp.flip(x, axis=0)


def _flip(x, moved: bool):
    n = lax.axis_size("i")
    local = jnp.flip(x, axis=0)
    if not moved:
        return local  # BUG
    return lax.ppermute(local, "i", [(k, n - 1 - k) for k in range(n)])


def flip_blocks(x):
    return _flip(x, True)


def flip_blocks_not_moved(x):
    return _flip(x, False)


# ----- a reverse cumsum over a sharded axis: local suffix sums plus the later blocks' totals ----

def rcumsum1_ref(x):
    return lax.cumsum(x, axis=0, reverse=True)


def _suffix(x, after):
    local = lax.cumsum(x, axis=0, reverse=True)
    totals = lax.all_gather(local[0], "i")
    mine = lax.axis_index("i")
    return local + jnp.sum(jnp.where(after(jnp.arange(totals.shape[0]), mine), totals, 0.0))


def suffix_sums(x):
    return _suffix(x, lambda k, mine: k > mine)


def suffix_sums_own_block_twice(x):
    return _suffix(x, lambda k, mine: k >= mine)  # BUG


# ----- top-2 with ties over a vocab-sharded axis: candidates gathered in device order ----------

def top2_ties_ref(x):
    values, where = lax.top_k(x.astype(jnp.float32), 2)
    return values, where.astype(jnp.int32)


def _top2_ties(x, order):
    xf = x.astype(jnp.float32)
    chunk = xf.shape[-1]
    values, where = lax.top_k(xf, 2)
    where = where.astype(jnp.int32) + lax.axis_index("tp") * chunk
    all_values = lax.all_gather(values, "tp", axis=1, tiled=True)
    all_where = lax.all_gather(where, "tp", axis=1, tiled=True)
    all_values, all_where = order(all_values), order(all_where)
    best, pick = lax.top_k(all_values, 2)
    return best, jnp.take_along_axis(all_where, pick, axis=1)


def top2_ties(x):
    return _top2_ties(x, lambda a: a)


def top2_ties_devices_reversed(x):
    return _top2_ties(x, lambda a: a.reshape(a.shape[0], 4, 2)[:, ::-1].reshape(a.shape))  # BUG


# ----- a row-parallel bias added once: by one device before the psum (cond / where) ------------

def row_bias_ref(x, w, b):
    return x @ w + b


def _bias_by_cond(x, w, b, holders):
    partial = x @ w
    mine = lax.axis_index("tp")
    partial = lax.cond(holders(mine), lambda p: p + b, lambda p: p, partial)
    return lax.psum(partial, "tp")


def bias_by_cond(x, w, b):
    return _bias_by_cond(x, w, b, lambda mine: mine == 0)


def bias_by_cond_two_holders(x, w, b):
    return _bias_by_cond(x, w, b, lambda mine: mine < 2)  # BUG


def _bias_by_where(x, w, b, holder: int):
    partial = x @ w + jnp.where(lax.axis_index("tp") == holder, b, jnp.zeros_like(b))
    return lax.psum(partial, "tp")


def bias_by_where(x, w, b):
    return _bias_by_where(x, w, b, 3)


def bias_by_where_no_holder(x, w, b):
    return _bias_by_where(x, w, b, 4)  # BUG


# ----- jax.experimental.custom_partitioning: a row norm whose partition keeps rows whole -------

def rownorm_ref(x):
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)


@functools.cache
def _custom_rownorm(axis: int):
    """A row norm with a custom partitioning rule: rows split over the mesh's first axis, the
    normalized dim whole (XLA reshards the operand to that), and each device runs `lower` on
    its rows; `axis` is the dim the per-device lowering normalizes over."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding

    @custom_partitioning
    def rownorm(x):
        return rownorm_ref(x)

    def rows(mesh, arg_shapes):
        return NamedSharding(mesh, P(mesh.axis_names[0], None))

    def partition(mesh, arg_shapes, result_shape):
        def lower(x):
            return x / jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True) + 1e-6)
        return mesh, lower, rows(mesh, arg_shapes), (rows(mesh, arg_shapes),)

    rownorm.def_partition(partition=partition,
                          infer_sharding_from_operands=lambda mesh, args, out: rows(mesh, args),
                          sharding_rule="i j -> i j")
    return rownorm


def custom_rownorm(mesh):
    return _custom_rownorm(-1)


def custom_rownorm_over_rows(mesh):
    return _custom_rownorm(0)  # BUG


# ----- EasyLM's cross entropy with accuracy over valid tokens, batch sharded --------------------

def ce_accuracy_ref(logits, labels, valid):
    valid = valid.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
    hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    count = jnp.maximum(jnp.sum(valid), 1.0)
    return jnp.sum(nll * valid) / count, jnp.sum(hit * valid) / count


def _ce_accuracy(logits, labels, valid, *, pooled: bool):
    valid = valid.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
    hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    if not pooled:
        count = jnp.maximum(jnp.sum(valid), 1.0)
        return (lax.pmean(jnp.sum(nll * valid) / count, "dp"),  # BUG
                lax.pmean(jnp.sum(hit * valid) / count, "dp"))
    count = jnp.maximum(lax.psum(jnp.sum(valid), "dp"), 1.0)
    return (lax.psum(jnp.sum(nll * valid), "dp") / count,
            lax.psum(jnp.sum(hit * valid), "dp") / count)


def ce_accuracy(logits, labels, valid):
    return _ce_accuracy(logits, labels, valid, pooled=True)


def ce_accuracy_mean_of_shard_means(logits, labels, valid):
    return _ce_accuracy(logits, labels, valid, pooled=False)


# ----- the corpus -------------------------------------------------------------------------------

def _pair(name, mesh, ref, good, bad, bug, args, out, what, **kw) -> list[Example]:
    """A correct program and its nearest wrong twin (same reference, args and specs)."""
    maker = _xla if kw.pop("xla", False) else _p
    bug_fn = kw.pop("bug_fn", None)
    twin_kw = {k: v for k, v in kw.items() if k != "check_vma"} | {"bug_fn": bug_fn}
    return [maker(name, mesh, ref, good, args, out, what, **kw),
            maker(name, mesh, ref, bad, args, out, what, bug=bug, **twin_kw)]


def programs() -> list[Example]:
    lev = "Levanter/Haliax (hax.nn.logsumexp over a sharded Vocab axis)"
    out: list[Example] = []
    vocab = [f32((8, 32), P(None, "tp"))]
    out += _pair("lse_of_block_lse", TP4, lse_ref, lse_of_block_lse, lse_of_block_lse_pmean,
                 "pmean", vocab, P(), f"{lev}: pmax of the blocks' logsumexps, psum of exps")
    out += _pair("lse_gathered", TP4, lse_ref, lse_gathered, lse_gathered_max, "max", vocab,
                 P(), f"{lev}: the blocks' logsumexps gathered, their logsumexp",
                 check_vma=False)
    bn = [f32((16, 8), P("dp", None)), f32((8,), P(), "positive"), f32((8,), P())]
    out += _pair("batchnorm_axis_name", DP4, batchnorm_ref, batchnorm,
                 batchnorm_local_mean_square, "local_mean_square", bn, P("dp", None),
                 "Flax nn.BatchNorm(axis_name='dp'): pmean of mean and mean square")
    line = [f32((16,), P("i"), "positive")]
    out += _pair("cumprod_sharded", I4, cumprod_ref, cumprod_sharded, cumprod_sharded_inclusive,
                 "inclusive", line, P("i"), "jnp.cumprod over a sharded axis: gathered "
                 "block products, exclusive prefix", check_vma=False)
    out += _pair("cummax_scan", I4, cummax_ref, cummax_scan, cummax_scan_backwards,
                 "backwards", [f32((16, 3), P("i", None))], P("i", None),
                 "lax.cummax over a sharded axis: Hillis-Steele prefix with ppermute",
                 check_vma=False)
    out += _pair("argmax_ties", TP4, argmax_ref, argmax_ties, argmax_ties_last, "last",
                 [ids((8, 16), P(None, "tp"), 3)], P(),
                 "MaxText greedy sampling over a vocab-sharded axis, int32 logits with ties "
                 "(first index wins)")
    out += _pair("sort_slice", I4, sort_ref, sort_slice, sort_slice_reversed, "reversed",
                 [f32((16,), P("i"))], P("i"),
                 "jnp.sort of a sharded vector: all_gather, sort, dynamic_slice at the "
                 "device's offset", check_vma=False)
    sq = [f32((8, 8), P("i", None))]
    out += [_p("transpose_a2a", I4, transpose_ref, transpose_a2a, sq, P("i", None),
               "a transpose by all_to_all (split columns, concat rows), then a local .T")]
    out += _pair("transpose_a2a_first", I4, transpose_ref, transpose_a2a_first,
                 transpose_a2a_first_same_axis, "same_axis", sq, P("i", None),
                 "a local .T, then all_to_all (split rows, concat columns)")
    out += _pair("rs_ag_allreduce", I4, block_sum_ref, rs_ag, rs_ag_reshaped, "reshaped",
                 [f32((16, 8), P("i", None))], P(), "an all-reduce as psum_scatter then "
                 "all_gather(tiled=False) regrouped (EasyLM / t5x all-reduce decompositions)",
                 check_vma=False)
    fsdp = [f32((16, 8), P("fsdp", None), "weight"), f32((16, 16), P("fsdp", None)),
            f32((16, 8), P("fsdp", None))]
    out += _pair("fsdp_bf16", FSDP4, fsdp_bf16_ref, fsdp_bf16, fsdp_bf16_local_batch,
                 "local_batch", fsdp, P("fsdp", None), "MaxText/Praxis FSDP: bfloat16 "
                 "weights all-gathered, float32 accumulation, grads psum_scattered",
                 atol=2e-3)
    meg = [f32((4, 8), P()), f32((8, 16), P(None, "tp"), "weight"),
           f32((16, 8), P("tp", None), "weight")]
    out += _pair("megatron_custom_vjp", TP4, megatron_ref, megatron_fg,
                 megatron_fg_no_backward_sum, "no_backward_sum", meg,
                 (P(), P(None, "tp"), P("tp", None)), "Megatron-LM's f/g conjugate operators "
                 "as jax.custom_vjp, each rank's backward pass (jax.grad in the body)",
                 check_vma=False)
    remat = [f32((8, 16), P(None, "tp"), "weight"), f32((16, 8), P("tp", None), "weight"),
             f32((8, 8), P("dp", None))]
    out += _pair("remat_tp_mlp", DP2_TP2, _grad2(remat_ref), remat_mlp, remat_mlp_local_rows,
                 "local_rows", remat, P(), "MaxText remat policy: jax.checkpoint("
                 "dots_saveable) on a TP MLP, under jax.grad", wrap=_grad2, check_vma=False)
    layers = [f32((4, 8), P()), f32((3, 8, 16), P(None, None, "tp"), "weight"),
              f32((3, 16, 8), P(None, "tp", None), "weight")]
    out += _pair("scan_tp_layers", TP4, scan_layers_ref, scan_layers,
                 scan_layers_residual_in_psum, "residual_in_psum", layers, P(),
                 "MaxText scan_layers: lax.scan over stacked TP layers, residual after psum",
                 bug_fn=_scan_layers)
    vm = [f32((8, 8), P("dp", None)), f32((8, 16), P(None, "tp"), "weight"),
          f32((16, 8), P("tp", None), "weight")]
    out += _pair("vmap_in_body", DP2_TP2, per_example_ref, vmapped, vmapped_pmean, "pmean", vm,
                 P("dp", None), "a per-example function vmapped inside the shard_map body "
                 "(psum under vmap)")
    pe = [f32((2, 16, 8), P(None, "sp", None)), f32((16, 8), P())]
    out += _pair("pos_embed_slice", SP4, pos_embed_ref, pos_embed, pos_embed_off_by_one,
                 "off_by_one", pe, P(None, "sp", None), "sequence parallelism: the learned "
                 "position table sliced by axis_index * chunk (dynamic_slice)")
    out += _pair("expert_counts", DP2_TP2, counts_ref, expert_counts, expert_counts_over_dp_tp,
                 "over_dp_tp", [ids((16, 2), P("dp", None), N_EXPERTS)], P(),
                 "MaxText MoE: int32 tokens-per-expert counters (bincount), psum over data")
    out += _pair("load_balance_loss", DP4, balance_ref, balance, balance_integer_division,
                 "integer_division", [f32((16, N_EXPERTS), P("dp", None)),
                                      ids((16,), P("dp"), N_EXPERTS)], P(),
                 "Switch / MaxText load-balancing loss: int32 counts psum'd, cast to float",
                 bug_fn=_balance)
    jit_ = "jit with in/out shardings (XLA's per-device program)"
    out += _pair("xla_logsumexp", TP4, lse_ref, lse_rows, lse_columns, "columns",
                 [f32((8, 8), P(None, "tp"))], P(), f"{jit_}: logsumexp over a sharded "
                 "axis", xla=True)
    out += _pair("xla_cumsum", I4, cumsum_ref, cumsum_rows, cumsum_columns, "columns",
                 [f32((8, 8), P("i", None))], P("i", None),
                 f"{jit_}: cumsum along a sharded axis", xla=True)
    out += _pair("xla_sort", I4, sort_rows_ref, sort_rows, sort_rows_descending, "descending",
                 [f32((8, 4), P("i", None))], P(None, "i"),
                 f"{jit_}: sort along a sharded axis, out sharded on the other", xla=True)
    out += _pair("xla_mean", DP2_TP2, mean_all_ref, mean_all, mean_all_over_rows_only,
                 "over_rows_only", [f32((8, 8), P("dp", "tp"))], P(),
                 f"{jit_}: jnp.mean over both sharded dims", xla=True)
    qkv = [Arg((2, 8, 4, 4), P("dp", None, "tp", None)) for _ in range(3)]
    out += _pair("xla_t5x_attention", DP2_TP2, attention_heads_ref, attention_heads,
                 attention_heads_softmax_over_queries, "softmax_over_queries", qkv,
                 P("dp", None, "tp", None), f"{jit_}: t5x logical axes (batch -> data, "
                 "heads -> model)", xla=True)
    dp4 = "MaxText MoE capacity (tokens per expert)"
    cap = [ids((1024,), P("dp"), CAPACITY_EXPERTS)]
    out += _pair("capacity_overflow", DP4, overflow_ref, overflow, overflow_bf16_psum,
                 "bf16_psum", cap, P(), f"{dp4}: float32 counts psum'd, tokens over capacity",
                 chosen=_capacity_ids)
    out += _pair("int_counts", DP4, int_counts_ref, int_counts, int_counts_int8, "int8", cap,
                 P(), f"{dp4}: int32 one-hot counts psum'd", chosen=_capacity_ids)
    qk = [f32((8, 16), P(None, "tp")), f32((8, 16), P(None, "tp"))]
    out += _pair("similarity", TP4, similarity_ref, similarity, similarity_local_width,
                 "local_width", qk, P(), "dot-product scores over a TP-sharded embed dim, "
                 "scaled by 1/sqrt(global width)")
    fl = [f32((4, 16), P(None, "i")), f32((16, 6), P("i", None), "weight")]
    out += _pair("flat_scatter", I4, flat_matmul_ref, flat_scatter, flat_scatter_rows_reversed,
                 "rows_reversed", fl, P("i"), "psum_scatter(tiled=False): each device keeps "
                 "one row of the summed product")
    mb = [f32((8, 4), P(), "weight"), f32((16, 8), P("dp", None)), f32((16, 4), P("dp", None))]
    out += _pair("microbatch_counter", DP4, mb_ref, microbatched, microbatched_count_from_one,
                 "count_from_one", mb, P(), "gradient accumulation over microbatches in a "
                 "scan with an int32 counter, averaged by the psum'd count", check_vma=False)
    out += _pair("dus_gather", I4, identity_ref, dus_gather, dus_gather_off_by_one,
                 "off_by_one", [f32((16,), P("i"))], P(), "an all_gather spelled as "
                 "dynamic_update_slice at axis_index * chunk into zeros, then psum")
    out += _pair("assoc_scan_cumsum", I4, cumsum1_ref, assoc_cumsum, assoc_cumsum_inclusive,
                 "inclusive", [f32((16,), P("i"))], P("i"), "cumsum as a local "
                 "lax.associative_scan plus the gathered exclusive prefix", check_vma=False)
    out += _pair("segment_sum", DP2_TP2, segment_ref, segment, segment_over_dp_tp, "over_dp_tp",
                 [f32((16, 4), P("dp", None)), ids((16,), P("dp"), 4)], P(),
                 "jax.ops.segment_sum over batch-sharded rows, psum over data")
    out += _pair("xla_cross_entropy", TP4, ce_ref, ce, ce_labels_shifted, "labels_shifted",
                 [f32((8, 32), P(None, "tp")), ids((8,), P(), 32)], P(),
                 f"{jit_}: cross entropy with take_along_axis over vocab-sharded logits",
                 xla=True, bug_fn=ce_labels_shifted)
    out += _pair("xla_argmax", TP4, argmax_rows_ref, argmax_rows, argmax_rows_argmin, "argmin",
                 [f32((8, 16), P(None, "tp"))], P(), f"{jit_}: argmax over a sharded axis",
                 xla=True)
    out += _pair("xla_top2", TP4, top2_ref, top2, top2_reversed, "reversed",
                 [f32((8, 16), P(None, "tp"))], (P(), P()),
                 f"{jit_}: lax.top_k over a sharded axis", xla=True)
    out += _pair("xla_reverse_cumsum", I4, rcumsum_ref, rcumsum, rcumsum_forward, "forward",
                 [f32((8, 4), P("i", None))], P("i", None),
                 f"{jit_}: lax.cumsum(reverse=True) along a sharded axis", xla=True)
    out += _pair("lookup_unsigned_bounds", TP4, lookup_ref, lookup_unsigned,
                 lookup_unsigned_signed_compare, "signed_compare",
                 [ids((8,), P(), 32), f32((32, 8), P("tp", None))], P(),
                 "Megatron-style vocab-parallel lookup, both bounds in one uint32 compare",
                 bug_fn=_lookup_unsigned)
    out += _pair("neg_max", TP4, neg_max_ref, neg_max, neg_max_initial_zero, "initial_zero",
                 [f32((8, 16), P(None, "tp"), "positive")], P(),
                 "a max over a sharded axis with jnp.max(initial=...), then pmax")
    q8 = [f32((16, 4), P("i", None))]
    q8_what = "int8 quantization (AQT-style): global absmax by pmax, round, convert"
    out += _pair("int8_quant", I4, quant_ref, quant, quant_truncated, "truncated", q8,
                 P("i", None), q8_what, bug_fn=_quant, chosen=_quant_witness)
    out += [_p("int8_quant", I4, quant_ref, quant_scale_folded, q8, P("i", None), q8_what,
               bug="scale_folded", bug_fn=quant_scale_folded, chosen=_quant_witness)]
    out += _pair("floor_bucket", I4, bucket_ref, bucket, bucket_truncated, "truncated",
                 [ids((16,), P("i"), 16)], P("i"),
                 "relative positions bucketed by floor division (negative offsets)",
                 bug_fn=_bucket)
    out += _pair("flip_sharded", I4, flip_ref, flip_blocks, flip_blocks_not_moved,
                 "not_moved", [f32((16, 2), P("i", None))], P("i", None),
                 "jnp.flip of a sharded axis: local flip, blocks swapped by ppermute",
                 bug_fn=_flip)
    out += _pair("suffix_sums", I4, rcumsum1_ref, suffix_sums, suffix_sums_own_block_twice,
                 "own_block_twice", [f32((16,), P("i"))], P("i"), "lax.cumsum(reverse=True) "
                 "over a sharded axis: local suffix sums plus the later blocks' totals",
                 check_vma=False)
    out += _pair("top2_ties", TP4, top2_ties_ref, top2_ties, top2_ties_devices_reversed,
                 "devices_reversed", [ids((8, 16), P(None, "tp"), 3)], (P(), P()),
                 "MaxText/vLLM-style sharded top-k: local top_k, candidates gathered in device "
                 "order, top_k again (ties go to the lowest index)", check_vma=False)
    rb = [f32((4, 16), P(None, "tp")), f32((16, 8), P("tp", None), "weight"), f32((8,), P())]
    out += _pair("bias_once_cond", TP4, row_bias_ref, bias_by_cond, bias_by_cond_two_holders,
                 "two_holders", rb, P(), "Megatron row-parallel bias added once: "
                 "lax.cond(axis_index == 0) before the psum", check_vma=False)
    out += _pair("bias_once_where", TP4, row_bias_ref, bias_by_where, bias_by_where_no_holder,
                 "no_holder", rb, P(), "Megatron row-parallel bias added once: "
                 "where(axis_index == last) before the psum", check_vma=False)
    out += _pair("custom_partitioning_rownorm", I4, rownorm_ref, custom_rownorm,
                 custom_rownorm_over_rows, "over_rows", [f32((8, 8), P(None, "i"))],
                 P("i", None), "jax.experimental.custom_partitioning docs: a row norm whose "
                 "partition rule wants rows split (XLA reshards the column-split operand) and "
                 "runs the lowering per device", xla=True)
    acc = [f32((16, 8), P("dp", None)), ids((16,), P("dp"), 8), ids((16,), P("dp"), 2)]
    out += _pair("easylm_ce_accuracy", DP4, ce_accuracy_ref, ce_accuracy,
                 ce_accuracy_mean_of_shard_means, "mean_of_shard_means", acc, (P(), P()),
                 "EasyLM cross_entropy_loss_and_accuracy: valid-token mean of the loss and of "
                 "argmax hits, batch sharded", bug_fn=_ce_accuracy)
    return out
