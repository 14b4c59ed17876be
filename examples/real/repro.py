"""One minimal reproducer per reason the verifier fails on the real-model corpus.

Each reproducer is a tiny correct (reference, shard_map body) pair that the verifier does not
prove yet, named by the cause it isolates; `FAILURES.md` ranks the causes by how many corpus
programs they block. ``python -m examples.real.repro [--markdown]`` prints every reproducer's
current verdict and first diagnostic (and its source, with --markdown).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .catalog import Example, custom
from .programs import ArgDef

TP, DP, CP = "tp", "dp", "cp"


def _f(name, shape, spec=None, kind="data", high=0):
    spec = P() if spec is None else spec
    dtype = "int32" if kind == "tokens" else "float32"
    return ArgDef(name, shape, dtype, kind, spec, high=high)


@dataclass(frozen=True)
class Repro:
    cause: str  # short key, used by expected.py
    title: str
    example: Example


# A. jnp.take / take_along_axis bounds check: a variadic-free reduce with an `and` reducer.
def take_ref(w, t):
    return jnp.take(w, t, axis=0)


# B. Device-dependent offsets broadcast into tensors: vocab-parallel one-hot lookup.
def onehot_ref(w, t):
    return jax.nn.one_hot(t, w.shape[0]) @ w


def onehot_vocab_parallel(w, t):
    """Megatron's masked lookup (tokens outside this shard's vocab range masked to row 0 and
    zeroed), with a one-hot matmul in place of the gather."""
    vl = w.shape[0]
    start = lax.axis_index(TP) * vl
    outside = (t < start) | (t >= start + vl)
    local = jnp.where(outside, 0, t - start)
    hit = (local[:, None] == jnp.arange(vl)[None, :]) & ~outside[:, None]
    return lax.psum(hit.astype(w.dtype) @ w, TP)


# B'. Device-dependent offsets broadcast into tensors: global positions of a sequence shard.
def positions_ref(x):
    return x * jnp.arange(x.shape[0], dtype=x.dtype)[:, None]


def positions_cp(x):
    s = x.shape[0]
    pos = lax.axis_index(CP) * s + jnp.arange(s)
    return x * pos.astype(x.dtype)[:, None]


# C. take_along_axis (gather with batching dims) and its gradient (scatter with batching dims).
def target_logit_ref(logits, t):
    return jnp.take_along_axis(logits, t[:, None], axis=-1, mode="clip")[:, 0]


def target_logit_grad_ref(logits, t):
    return jax.grad(lambda lg: jnp.sum(jnp.take_along_axis(lg, t[:, None], axis=-1,
                                                           mode="clip")))(logits)


# D. chlo.top_k (MoE routing).
def topk_ref(x):
    return lax.top_k(x, 2)[0]


# E. lax.scan backward: stacked gradients written with dynamic_update_slice in a while loop.
def scan_grad_ref(w, x):
    def loss(w):
        def step(c, wi):
            return c + jnp.sum(jnp.tanh(x @ wi)), None
        return lax.scan(step, jnp.float32(0), w)[0]
    return jax.grad(loss)(w)


def scan_grad_tp(w, x):
    """Each layer's weight split on its columns over tp (jax-native gradient, check_vma)."""
    def loss(w):
        def step(c, wi):
            return c + jnp.sum(jnp.tanh(x @ wi)), None
        init = lax.pcast(jnp.float32(0), (TP,), to="varying")
        return lax.psum(lax.scan(step, init, w)[0], TP)
    return jax.grad(loss)(w)


# F. Gradient of a tp-split bias: reshape (n,) -> (1, 1, n) puts the split on a unit dim.
def bias_grad_ref(b, x):
    return jax.grad(lambda b: jnp.sum(jnp.tanh(x + b)))(b)


# G. Local mean under data parallelism: 1/N_local cotangent, pmean'd gradient.
def dp_mean_grad_ref(w, x):
    return jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w)))(w)


def dp_mean_grad(w, x):
    return lax.pmean(jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w)))(w), DP)


# H. One sequence per device: broadcast_in_dim's transpose reduces the local unit batch dim.
def unit_batch_grad_ref(w, x):
    def loss(w):
        h = x @ w
        return jnp.sum(jnp.tanh(h - jnp.mean(h, axis=-1, keepdims=True)))
    return jax.grad(loss)(w)


def unit_batch_grad(w, x):
    return lax.psum(unit_batch_grad_ref(w, x), DP)


# I. Grouped-query attention with one kv head per device: jnp.repeat's gradient.
def gqa_repeat_grad_ref(wk, x):
    def loss(wk):
        k = (x @ wk).reshape(x.shape[0], -1, 2)  # (tokens, kv heads, head_dim)
        return jnp.sum(jnp.tanh(jnp.repeat(k, 2, axis=1)))
    return jax.grad(loss)(wk)


def gqa_repeat_grad(wk, x):
    return gqa_repeat_grad_ref(wk, x)


# J. Micro-batching the local batch: a static slice of a dp-split dim.
def microbatch_ref(x):
    return jnp.sum(jnp.tanh(x))


def microbatch_dp(x):
    half = x.shape[0] // 2
    return lax.psum(jnp.sum(jnp.tanh(x[:half])) + jnp.sum(jnp.tanh(x[half:])), DP)


# J'. Gradient accumulation: each micro-batch's gradient of the masked loss over the global
# valid count, summed over the micro-batches and psum'd (the weight gradient contracts the
# micro-batch's rows).
def accum_grad_ref(w, x, m):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) * m[:, None]) / jnp.sum(m))(w)


def accum_grad_dp(w, x, m):
    count = lax.psum(jnp.sum(m), DP)
    half = x.shape[0] // 2
    grads = jnp.zeros_like(w)
    for rows in (slice(0, half), slice(half, None)):
        xs, ms = x[rows], m[rows]
        grads = grads + jax.grad(
            lambda w, xs=xs, ms=ms: jnp.sum(jnp.tanh(xs @ w) * ms[:, None]) / count)(w)
    return lax.psum(grads, DP)


# K. A ring all-gather by collective_permute (the data movement of ring attention).
def ring_gather_ref(x):
    return jnp.tile(x, (1, 1))


def ring_gather(x):
    n = lax.axis_size(CP)
    me = lax.axis_index(CP)
    blocks = [x]
    cur = x
    for _ in range(n - 1):
        cur = lax.ppermute(cur, CP, [(i, (i + 1) % n) for i in range(n)])
        blocks.append(cur)
    # blocks[j] holds the block of device (me - j) % n: put them in global order.
    ordered = jnp.stack(blocks)[(me - jnp.arange(n)) % n]
    return ordered.reshape(-1, x.shape[1])


# K'. Ring attention: K/V blocks passed around the cp ring, combined by an online softmax.
def ring_attention_ref(q, k, v):
    s = q @ k.T
    s = jnp.where(jnp.arange(q.shape[0])[:, None] >= jnp.arange(k.shape[0])[None, :], s,
                  -jnp.inf)
    return jax.nn.softmax(s, axis=-1) @ v


def ring_attention(q, k, v, hop: int = 1, stop_max: bool = False, guard: str = ""):
    """`hop` = -1 is the bug of passing K/V to the previous device while the key positions
    assume the next one (`ring_attention_backwards`, tests/normalize/test_online_softmax.py).
    `stop_max` stops the running max's gradient (as flash-attention kernels and
    `jax.nn.softmax` do; exact: its cotangent is zero in exact arithmetic). `guard` keeps
    the running max finite as flash-attention implementations do, started at ("init") or
    clamped after each step to ("clamp") the dtype's lowest finite value: a row of the first
    block whose scores all overflow to -inf then gives exp(-inf - min) = 0, not NaN
    (`ring_attention_guarded`; tests/normalize/test_exact_ring_overflow.py)."""
    n, me, rows = lax.axis_size(CP), lax.axis_index(CP), q.shape[0]
    floor = jnp.finfo(q.dtype).min
    q_pos = me * rows + jnp.arange(rows)
    m = jnp.full((rows,), floor if guard == "init" else -jnp.inf)
    denom = jnp.zeros((rows,))
    o = jnp.zeros(q.shape[:1] + v.shape[1:])
    for i in range(n):
        k_pos = ((me - i) % n) * rows + jnp.arange(rows)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], q @ k.T, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        if guard == "clamp":
            m_new = jnp.maximum(m_new, floor)
        if stop_max:
            m_new = lax.stop_gradient(m_new)
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * corr[:, None] + p @ v
        m = m_new
        k, v = (lax.ppermute(x, CP, [(j, (j + hop) % n) for j in range(n)]) for x in (k, v))
    return o / denom[:, None]


def ring_attention_guarded(q, k, v):
    return ring_attention(q, k, v, guard="init")


def ring_attention_backwards(q, k, v):
    return ring_attention(q, k, v, hop=-1)


# K''. Ring attention training: the gradients through the ring. jax's backward reads every
# step's mask and probabilities, differentiates the running max (whose cotangent is zero only
# in exact arithmetic) and sends dK/dV back around the ring by the reverse collective_permutes.
def ring_attention_grad_ref(q, k, v, w):
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention_ref(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)


def ring_attention_grad(q, k, v, w):
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)


def ring_attention_grad_stop_max(q, k, v, w):
    """Without the running max's gradient (FAILURES.md section 7, item 2): the per-step blocks
    and the reverse ring alone."""
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention(q, k, v, stop_max=True) * w),
                    argnums=(0, 1, 2))(q, k, v)


# K''''. Ring attention training with the ring in `lax.fori_loop` (the models' `Par(ring="loop")`):
# jax's gradient of the loop is two loops, the forward storing every step's residuals into
# buffers indexed by the counter (dynamic_update_slice), the backward reading them back at the
# reversed counter (dynamic_slice) and sending the key/value cotangents around the reverse ring.
def ring_attention_loop(q, k, v, hop: int = 1):
    """`ring_attention` (running max differentiated, `hop` as there) in a `lax.fori_loop`."""
    n, me, rows = lax.axis_size(CP), lax.axis_index(CP), q.shape[0]
    q_pos = me * rows + jnp.arange(rows)

    def step(i, carry):
        o, m, denom, k, v = carry
        k_pos = ((me - i) % n) * rows + jnp.arange(rows)
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], q @ k.T, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * corr[:, None] + p @ v
        k, v = (lax.ppermute(x, CP, [(j, (j + hop) % n) for j in range(n)]) for x in (k, v))
        return o, m_new, denom, k, v

    init = (jnp.zeros(q.shape[:1] + v.shape[1:]), jnp.full((rows,), -jnp.inf),
            jnp.zeros((rows,)), k, v)
    o, _, denom, _, _ = lax.fori_loop(0, n, step, init)
    return o / denom[:, None]


def ring_attention_loop_grad(q, k, v, w):
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention_loop(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)


# K'''. Ring attention training in the models' layout (b, s, h, d), as `layers.ring_attention`
# writes it: scores `einsum("bqhd,bkhd->bhqk")`, running max and denominator (b, h, s), the
# correction applied to the output (b, s, h, d) as `swapaxes(corr, 1, 2)[..., None]`.
def ring_attention_bshd_ref(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    pos = jnp.arange(q.shape[1])
    scores = jnp.where(pos[:, None] >= pos[None, :], scores, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def ring_attention_bshd(q, k, v, stop_max: bool = True, variant: str = "right",
                        rep: int = 1):
    """`layers.ring_attention` (unrolled, no grouped heads) on the local sequence block.
    `variant` names a near miss (tests/normalize/test_online_backward.py): "swapped_wrong"
    applies the correction swapped along the wrong axes (`swapaxes(corr, 0, 2)`: the same shape
    when b = h = rows), "previous_correction" rescales step 2's accumulator by step 1's
    correction."""
    n, me = lax.axis_size(CP), lax.axis_index(CP)
    b, rows, h, d = q.shape
    q_pos = me * rows + jnp.arange(rows)
    o = jnp.zeros(q.shape, q.dtype)
    m = jnp.full((b, h, rows), -jnp.inf, q.dtype)
    denom = jnp.zeros((b, h, rows), q.dtype)
    previous = m
    for i in range(n):
        k_pos = ((me - i) % n) * rows + jnp.arange(rows)
        kr, vr = (_grouped(x, rep, variant) for x in (k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, kr) / jnp.sqrt(jnp.float32(d))
        scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        if stop_max:
            m_new = lax.stop_gradient(m_new)
        p = jnp.exp(scores - m_new[..., None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        scale = jnp.swapaxes(corr, 1, 2)
        if variant == "swapped_wrong":
            scale = jnp.swapaxes(corr, 0, 2)
        if variant == "previous_correction" and i == 2:
            scale = jnp.swapaxes(previous, 1, 2)
        o = o * scale[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, vr)
        m, previous = m_new, corr
        k, v = (lax.ppermute(x, CP, [(j, (j + 1) % n) for j in range(n)]) for x in (k, v))
    return o / jnp.swapaxes(denom, 1, 2)[..., None]


def ring_attention_bshd_grad_ref(q, k, v, w):
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention_bshd_ref(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)


def ring_attention_bshd_grad_stop_max(q, k, v, w, variant: str = "right"):
    """The gradients of `ring_attention_bshd` with the running max's gradient stopped: the
    value cotangent meets the correction through `swapaxes(corr, 1, 2)`."""
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention_bshd(q, k, v, variant=variant) * w),
                    argnums=(0, 1, 2))(q, k, v)


# K (GQA). Ring attention training with grouped-query attention (Llama-3): k and v have fewer
# heads than q, repeated inside each ring step (`jnp.repeat(kb, rep, axis=2)`, as
# `layers.ring_attention` does), so the backward sums the repeated heads' key and value
# cotangents over the repeat before sending them back around the reverse ring.
def _grouped(x, rep: int, variant: str = "right"):
    """x's kv heads repeated `rep` times each (dim 2 of (b, s, h, d)); the near miss "tile"
    tiles them instead (heads [0, 1, 0, 1] where the reference reads [0, 0, 1, 1])."""
    if rep == 1:
        return x
    if variant == "tile":
        return jnp.tile(x, (1, 1, rep, 1))
    return jnp.repeat(x, rep, axis=2)


def ring_attention_gqa_ref(q, k, v):
    rep = q.shape[2] // k.shape[2]
    return ring_attention_bshd_ref(q, jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2))


def ring_attention_gqa_grad_ref(q, k, v, w):
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention_gqa_ref(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)


def ring_attention_gqa_grad(q, k, v, w, stop_max: bool = False, variant: str = "right"):
    """The gradients of `ring_attention_bshd` with k, v's heads repeated in each ring step
    (`variant` "tile": tiled instead, a near miss)."""
    rep = q.shape[2] // k.shape[2]
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention_bshd(
        q, k, v, stop_max=stop_max, variant=variant, rep=rep) * w), argnums=(0, 1, 2))(q, k, v)


def ring_attention_gqa_grad_stop_max(q, k, v, w, variant: str = "right"):
    return ring_attention_gqa_grad(q, k, v, w, stop_max=True, variant=variant)


# H'. One sequence per device: a broadcast bias's gradient is summed in two steps (batch, seq)
# with a keepdims reshape between; locally the batch dim is summed in the second step.
def unit_batch_bias_grad_ref(b, x):
    return jax.grad(lambda b: jnp.sum(jnp.tanh(x + b)))(b)


def unit_batch_bias_grad(b, x):
    return lax.psum(unit_batch_bias_grad_ref(b, x), DP)


# L. Tokens flattened from (batch, seq) with the sequence split (MoE under sequence parallelism):
# each device's tokens are `batch` strided runs of the global token dim.
def flat_tokens_grad_ref(w, x):
    def loss(w):
        b, s, d = x.shape
        h = jnp.tanh(x.reshape(-1, d) @ w)
        return jnp.sum(jnp.square(h.reshape(b, s, -1)))
    return jax.grad(loss)(w)


def flat_tokens_grad_sp(w, x):
    return lax.psum(flat_tokens_grad_ref(w, x), TP)


# Causes the verifier handles only under `--assume-no-overflow` (their scores are products of
# unbounded inputs, which may overflow): their reproducers are checked with it.
NO_OVERFLOW_ASSUMED = {"ring_attention", "ring_backward", "ring_max_grad", "ring_gqa",
                       "ring_loop_backward"}

# Causes the verifier has since learned to handle: their reproducers must stay proven.
FIXED = {"bias_grad_unit_dims", "take_and_reducer", "top_k", "gather_batching_dims",
         "scatter_batching_dims", "dp_mean_coefficients", "scan_backward",
         "unit_dim_transpose", "moe_flatten_split_seq", "allgather_partial", "unit_batch_view",
         "slice_of_split_dim", "device_offset_tensor", "ring_attention", "ring_backward",
         "ring_max_grad", "ring_gqa", "ring_loop_backward",
         "ring_permute"}  # the layout tier does not prove it, the general tier does


def _gqa_args() -> tuple[ArgDef, ...]:
    """q, w (b, s, h, d) = (2, 8, 4, 4); k, v with 2 kv heads, each read by 2 query heads;
    the sequence split over cp."""
    spec = P(None, CP, None, None)
    return (_f("q", (2, 8, 4, 4), spec), _f("k", (2, 8, 2, 4), spec),
            _f("v", (2, 8, 2, 4), spec), _f("w", (2, 8, 4, 4), spec))


def reproducers() -> list[Repro]:
    two, four = ((TP, 2),), ((TP, 4),)
    dp4, cp4 = ((DP, 4),), ((CP, 4),)
    tokens = _f("t", (8,), kind="tokens", high=16)
    out = [
        Repro("take_and_reducer", "jnp.take bounds check: reduce with an `and` reducer",
              custom("repro_take", two, take_ref, take_ref,
                     (_f("w", (16, 4), kind="weight"), tokens), P(), "jnp.take(w, t)")),
        Repro("device_offset_tensor", "axis_index * size broadcast into a tensor "
              "(vocab-parallel lookup)",
              custom("repro_vocab_onehot", four, onehot_ref, onehot_vocab_parallel,
                     (_f("w", (16, 4), P(TP, None), "weight"), tokens), P(),
                     "one-hot lookup of a vocab-split table")),
        Repro("device_offset_tensor", "axis_index * size + iota (positions of a sequence "
              "shard)",
              custom("repro_cp_positions", cp4, positions_ref, positions_cp,
                     (_f("x", (16, 4), P(CP, None)),), P(CP, None), "x * position")),
        Repro("gather_batching_dims", "take_along_axis: gather with batching dims",
              custom("repro_take_along_axis", dp4, target_logit_ref, target_logit_ref,
                     (_f("logits", (8, 16), P(DP, None)),
                      _f("t", (8,), P(DP), "tokens", 16)), P(DP), "target logit")),
        Repro("scatter_batching_dims", "take_along_axis gradient: scatter with batching dims",
              custom("repro_take_along_axis_grad", dp4, target_logit_grad_ref,
                     target_logit_grad_ref,
                     (_f("logits", (8, 16), P(DP, None)),
                      _f("t", (8,), P(DP), "tokens", 16)), P(DP, None), "its gradient")),
        Repro("top_k", "chlo.top_k (MoE router)",
              custom("repro_top_k", dp4, topk_ref, topk_ref, (_f("x", (8, 8), P(DP, None)),),
                     P(DP, None), "lax.top_k")),
        Repro("scan_backward", "lax.scan backward: stacked gradient via dynamic_update_slice "
              "in a while loop",
              custom("repro_scan_grad", two, scan_grad_ref, scan_grad_tp,
                     (_f("w", (2, 8, 8), P(None, None, TP), "weight"), _f("x", (4, 8))),
                     P(None, None, TP), "grad through lax.scan", check_vma=True)),
        Repro("bias_grad_unit_dims", "gradient of a tp-split bias: reshape (n,) -> (1, 1, n) "
              "puts the split on a unit dim",
              custom("repro_bias_grad", two, bias_grad_ref, bias_grad_ref,
                     (_f("b", (8,), P(TP), "bias"), _f("x", (2, 4, 8), P(None, None, TP))),
                     P(TP), "grad of x + b")),
        Repro("dp_mean_coefficients", "local mean under DP: 1/N_local cotangent, pmean'd "
              "gradient",
              custom("repro_dp_mean_grad", dp4, dp_mean_grad_ref, dp_mean_grad,
                     (_f("w", (8, 4), kind="weight"), _f("x", (8, 8), P(DP, None))), P(),
                     "pmean(grad(mean))")),
        Repro("unit_dim_transpose", "one sequence per device: the transpose of "
              "broadcast_in_dim reduces the local unit batch dim",
              custom("repro_unit_batch_grad", dp4, unit_batch_grad_ref, unit_batch_grad,
                     (_f("w", (8, 8), kind="weight"), _f("x", (4, 3, 8), P(DP, None, None))),
                     P(), "psum(grad) with batch 1 per device")),
        Repro("unit_dim_transpose", "grouped-query attention with one kv head per device: "
              "gradient of jnp.repeat",
              custom("repro_gqa_repeat_grad", two, gqa_repeat_grad_ref, gqa_repeat_grad,
                     (_f("wk", (8, 4), P(None, TP), "weight"), _f("x", (4, 8))), P(None, TP),
                     "grad of repeat(k)")),
        Repro("unit_batch_view", "one sequence per device: a bias gradient summed over "
              "(batch, seq) in two steps, the batch dim in the other step",
              custom("repro_unit_batch_bias_grad", dp4, unit_batch_bias_grad_ref,
                     unit_batch_bias_grad,
                     (_f("b", (8,), kind="bias"), _f("x", (4, 3, 8), P(DP, None, None))), P(),
                     "psum(grad of x + b) with batch 1 per device")),
        Repro("slice_of_split_dim", "micro-batching: a static slice of a dp-split dim",
              custom("repro_microbatch", dp4, microbatch_ref, microbatch_dp,
                     (_f("x", (16, 4), P(DP, None)),), P(), "sum over two micro-batches")),
        Repro("slice_of_split_dim", "gradient accumulation over two micro-batches of the "
              "local batch, masked loss over the global valid count",
              custom("repro_accum_grad", dp4, accum_grad_ref, accum_grad_dp,
                     (_f("w", (8, 4), kind="weight"), _f("x", (16, 8), P(DP, None)),
                      _f("m", (16,), P(DP), "mask")), P(), "psum(accumulated grad)")),
        Repro("moe_flatten_split_seq", "per-token weights on (batch, seq) flattened to tokens "
              "with the sequence split (MoE router under sequence parallelism)",
              custom("repro_flat_tokens_sp", four, flat_tokens_grad_ref, flat_tokens_grad_sp,
                     (_f("w", (8, 4), kind="weight"), _f("x", (2, 8, 8), P(None, TP, None))),
                     P(), "psum(grad) through a token flatten")),
        Repro("ring_permute", "a ring all-gather by collective_permute (ring attention's data "
              "movement)",
              custom("repro_ring_gather", cp4, ring_gather_ref, ring_gather,
                     (_f("x", (8, 4), P(CP, None)),), P(), "ring all-gather")),
        Repro("ring_attention", "ring attention: K/V blocks passed around the ring "
              "(collective_permute), an online softmax over them",
              custom("repro_ring_attention", cp4, ring_attention_ref, ring_attention,
                     (_f("q", (8, 4), P(CP, None)), _f("k", (8, 4), P(CP, None)),
                      _f("v", (8, 4), P(CP, None))), P(CP, None), "causal ring attention")),
        Repro("ring_overflow", "ring attention whose running max is guarded by float32's "
              "lowest finite value (exact where a whole row of a block's scores overflows to "
              "-inf, which the unguarded ring is not): the fold does not recognise the guard",
              custom("repro_ring_attention_guarded", cp4, ring_attention_ref,
                     ring_attention_guarded,
                     (_f("q", (8, 4), P(CP, None)), _f("k", (8, 4), P(CP, None)),
                      _f("v", (8, 4), P(CP, None))), P(CP, None),
                     "causal ring attention, running max guarded")),
        Repro("ring_max_grad", "ring attention training with the running max differentiated: "
              "its cotangent, zero in real arithmetic, reaches the scores' argmax",
              custom("repro_ring_attention_grad", cp4, ring_attention_grad_ref,
                     ring_attention_grad,
                     (_f("q", (8, 4), P(CP, None)), _f("k", (8, 4), P(CP, None)),
                      _f("v", (8, 4), P(CP, None)), _f("w", (8, 4), P(CP, None))),
                     (P(CP, None),) * 3, "gradients of causal ring attention")),
        Repro("ring_backward", "ring attention training with the running max's gradient "
              "stopped: per-step blocks and dK/dV along the reverse ring only",
              custom("repro_ring_attention_grad_stop_max", cp4, ring_attention_grad_ref,
                     ring_attention_grad_stop_max,
                     (_f("q", (8, 4), P(CP, None)), _f("k", (8, 4), P(CP, None)),
                      _f("v", (8, 4), P(CP, None)), _f("w", (8, 4), P(CP, None))),
                     (P(CP, None),) * 3, "gradients of causal ring attention, max stopped")),
        Repro("ring_loop_backward", "ring attention training with the ring in a "
              "fori_loop: residuals stored by the forward loop, read back by the backward one",
              custom("repro_ring_attention_loop_grad", cp4, ring_attention_grad_ref,
                     ring_attention_loop_grad,
                     (_f("q", (8, 4), P(CP, None)), _f("k", (8, 4), P(CP, None)),
                      _f("v", (8, 4), P(CP, None)), _f("w", (8, 4), P(CP, None))),
                     (P(CP, None),) * 3, "gradients of causal ring attention, fori_loop")),
        Repro("ring_backward", "ring attention training in the models' (b, s, h, d) "
              "layout, max stopped: the correction reaches the value cotangent through a "
              "swapaxes",
              custom("repro_ring_attention_bshd_grad_stop_max", cp4,
                     ring_attention_bshd_grad_ref, ring_attention_bshd_grad_stop_max,
                     tuple(_f(name, (2, 8, 2, 4), P(None, CP, None, None)) for name in "qkvw"),
                     (P(None, CP, None, None),) * 3,
                     "gradients of causal ring attention (b, s, h, d), max stopped")),
        Repro("ring_gqa", "ring attention training with grouped-query attention (k, v "
              "heads repeated in each ring step), max stopped",
              custom("repro_ring_attention_gqa_grad_stop_max", cp4,
                     ring_attention_gqa_grad_ref, ring_attention_gqa_grad_stop_max,
                     _gqa_args(), (P(None, CP, None, None),) * 3,
                     "gradients of causal GQA ring attention (b, s, h, d), max stopped")),
        Repro("ring_gqa", "ring attention training with grouped-query attention (k, v "
              "heads repeated in each ring step), the running max differentiated",
              custom("repro_ring_attention_gqa_grad", cp4, ring_attention_gqa_grad_ref,
                     ring_attention_gqa_grad, _gqa_args(), (P(None, CP, None, None),) * 3,
                     "gradients of causal GQA ring attention (b, s, h, d)")),
    ]
    from .ce import ce_programs
    from .tricky import tricky_programs

    tricky = {e.name: e for e in ce_programs()[0] + tricky_programs()}
    out += [
        Repro("allgather_partial", "psum written as all_gather on a new axis + sum",
              tricky["psum_as_all_gather_sum_tp4"]),
    ]
    return out


def main(argv: list[str]) -> int:
    from entangle_mlir.driver import check_texts

    from .catalog import lower_pair

    markdown = "--markdown" in argv
    for r in reproducers():
        assumed = r.cause in NO_OVERFLOW_ASSUMED
        report = check_texts(*lower_pair(r.example), verify_rules=False,
                             assume_no_overflow=assumed)
        first = report.diagnostics[0].message if report.diagnostics else ""
        print(f"{r.cause}: {r.example.name}: {report.verdict}"
              f"{' (--assume-no-overflow)' if assumed else ''}: {first}")
        if markdown:
            print("```python")
            for fn in {r.example.reference, r.example.body}:
                print(inspect.getsource(fn).rstrip())
            print("```")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
