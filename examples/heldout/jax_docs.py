"""Programs of JAX's shard_map notebook ("Manual parallelism with shard_map",
https://docs.jax.dev/en/latest/notebooks/shard_map.html), rewritten in our style: the same
algorithms, collectives and specs, small float32 shapes, 4-8 simulated CPU devices. Each
description names the notebook section it follows.
"""

from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Example, f32, program

DOC = "shard_map notebook"
I4 = (("i", 4),)
IJ = (("i", 4), ("j", 2))
XY = (("x", 4), ("y", 2))
BATCH8 = (("batch", 8),)
BATCH4 = (("batch", 4),)


def _p(prog: str, mesh, reference, body, args, out, section: str, **kw) -> Example:
    return program("jax_docs", prog, mesh, reference, body, args, out, f"{DOC}, {section}", **kw)


# ----- first examples and out_specs -----------------------------------------------------------

def matmul_ref(a, b):
    return a @ b


def matmul_basic(a_block, b_block):
    c_partialsum = jnp.dot(a_block, b_block)
    return lax.psum(c_partialsum, "y")


def matmul_basic_psum_wrong_axis(a_block, b_block):
    c_partialsum = jnp.dot(a_block, b_block)
    return lax.psum(c_partialsum, "x")  # BUG


def gram_per_block_ref(y):
    return jnp.concatenate([blk.T @ blk for blk in jnp.split(y, 4)])


def gram_per_block(y_blk):
    return y_blk.T @ y_blk


def column_block_sum_ref(x):
    return sum(jnp.split(x, 2, axis=1))


def psum_j(x_block):
    return lax.psum(x_block, "j")


def row_block_sum_ref(x):
    return sum(jnp.split(x, 4, axis=0))


def psum_i(x_block):
    return lax.psum(x_block, "i")


def all_block_sum_ref(x):
    return sum(blk for rows in jnp.split(x, 4, axis=0) for blk in jnp.split(rows, 2, axis=1))


def psum_ij(x_block):
    return lax.psum(x_block, ("i", "j"))


# ----- collectives tutorial -------------------------------------------------------------------

def block_sum_ref(x):
    return sum(jnp.split(x, 4))


def psum_1d(x_block):
    return lax.psum(x_block, "i")


def psum_1d_pmean(x_block):
    return lax.pmean(x_block, "i")  # BUG


def tile4_ref(x):
    return jnp.tile(x, 4)


def all_gather_tiled(x_block):
    return lax.all_gather(x_block, "i", tiled=True)


def stacked_copies_ref(x):
    return jnp.tile(x.reshape(4, -1), (4, 1))


def all_gather_stacked(x_block):
    return lax.all_gather(x_block, "i", tiled=False)


def psum_scatter_1d(x_block):
    return lax.psum_scatter(x_block, "i", tiled=True)


def shift_right_ref(x):
    return jnp.roll(x, x.shape[0] // 4)


def ppermute_right(x_block):
    n = lax.axis_size("i")
    return lax.ppermute(x_block, "i", [(k, (k + 1) % n) for k in range(n)])


def ppermute_left(x_block):
    n = lax.axis_size("i")
    return lax.ppermute(x_block, "i", [(k, (k - 1) % n) for k in range(n)])  # BUG


def ppermute_no_wraparound(x_block):
    n = lax.axis_size("i")
    return lax.ppermute(x_block, "i", [(k, k + 1) for k in range(n - 1)])  # BUG


def ring_reduce_scatter(x_block):
    """psum_scatter spelled as a ring of ppermutes: each step passes a partial chunk sum on to
    the previous device and adds the local chunk it is responsible for next."""
    n = lax.axis_size("i")
    me = lax.axis_index("i")
    chunks = x_block.reshape(n, -1)
    to_prev = partial(lax.ppermute, axis_name="i", perm=[(k, (k - 1) % n) for k in range(n)])
    for step in range(1, n):
        passed = to_prev(chunks[(me + step) % n])
        chunks = chunks.at[(me + step + 1) % n].add(passed)
    return chunks[me]


def ring_reduce_scatter_off_by_one(x_block):
    n = lax.axis_size("i")
    me = lax.axis_index("i")
    chunks = x_block.reshape(n, -1)
    to_prev = partial(lax.ppermute, axis_name="i", perm=[(k, (k - 1) % n) for k in range(n)])
    for step in range(1, n):
        passed = to_prev(chunks[(me + step) % n])
        chunks = chunks.at[(me + step) % n].add(passed)  # BUG
    return chunks[me]


def block_transpose_ref(x):
    return x.reshape(4, 4).T.reshape(-1)


def all_to_all_1d(x_block):
    return lax.all_to_all(x_block, "i", split_axis=0, concat_axis=0, tiled=True)


# ----- matrix multiplies ----------------------------------------------------------------------

def matmul_allgather(lhs_block, rhs_block):
    rhs = lax.all_gather(rhs_block, "i", tiled=True)
    return lhs_block @ rhs


def matmul_allgather_interleaved(lhs_block, rhs_block):
    rhs = lax.all_gather(rhs_block, "i", axis=1).reshape(-1, rhs_block.shape[1])  # BUG
    return lhs_block @ rhs


def matmul_allgather_overlapped(lhs_block, rhs_block):
    n = lax.axis_size("i")
    me = lax.axis_index("i")
    shift = partial(lax.ppermute, axis_name="i", perm=[(k, (k + 1) % n) for k in range(n)])
    width = lhs_block.shape[1] // n

    def lhs_cols(k):
        return lax.dynamic_slice_in_dim(lhs_block, k * width, width, 1)

    out_block = lhs_cols(me) @ rhs_block
    for step in range(1, n):
        rhs_block = shift(rhs_block)
        out_block += lhs_cols((me - step) % n) @ rhs_block
    return out_block


def matmul_allgather_overlapped_wrong_chunk(lhs_block, rhs_block):
    n = lax.axis_size("i")
    me = lax.axis_index("i")
    shift = partial(lax.ppermute, axis_name="i", perm=[(k, (k + 1) % n) for k in range(n)])
    width = lhs_block.shape[1] // n

    def lhs_cols(k):
        return lax.dynamic_slice_in_dim(lhs_block, k * width, width, 1)

    out_block = lhs_cols(me) @ rhs_block
    for step in range(1, n):
        rhs_block = shift(rhs_block)
        out_block += lhs_cols((me + step) % n) @ rhs_block  # BUG
    return out_block


def _bidi_allgather_matmul(lhs_block, rhs_block, hi_shift: int):
    n = lax.axis_size("i")
    me = lax.axis_index("i")
    up = partial(lax.ppermute, axis_name="i", perm=[(k, (k + 1) % n) for k in range(n)])
    down = partial(lax.ppermute, axis_name="i",
                   perm=[(k, (k + hi_shift) % n) for k in range(n)])
    half = lhs_block.shape[1] // n // 2

    def lhs_half(k, hi):
        return lax.dynamic_slice_in_dim(lhs_block, (2 * k + hi) * half, half, 1)

    def block_matmul(rhs_lo, rhs_hi, k_lo, k_hi):
        # One full-size dot: the two halves padded onto complementary halves and added.
        lhs = (jnp.pad(lhs_half(k_lo, 0), [(0, 0), (0, half)])
               + jnp.pad(lhs_half(k_hi, 1), [(0, 0), (half, 0)]))
        rhs = jnp.pad(rhs_lo, [(0, half), (0, 0)]) + jnp.pad(rhs_hi, [(half, 0), (0, 0)])
        return lhs @ rhs

    rhs_lo, rhs_hi = jnp.split(rhs_block, 2, axis=0)
    out_block = block_matmul(rhs_lo, rhs_hi, me, me)
    for step in range(1, n):
        rhs_lo = up(rhs_lo)
        rhs_hi = down(rhs_hi)
        out_block += block_matmul(rhs_lo, rhs_hi, (me - step) % n, (me + step) % n)
    return out_block


def matmul_allgather_bidi(lhs_block, rhs_block):
    return _bidi_allgather_matmul(lhs_block, rhs_block, -1)


def matmul_allgather_bidi_same_direction(lhs_block, rhs_block):
    return _bidi_allgather_matmul(lhs_block, rhs_block, +1)  # BUG


def matmul_psumscatter(lhs_block, rhs_block):
    out_summand = lhs_block @ rhs_block
    return lax.psum_scatter(out_summand, "i", tiled=True)


def matmul_psum_first_rows(lhs_block, rhs_block):
    out = lax.psum(lhs_block @ rhs_block, "i")
    rows = out.shape[0] // lax.axis_size("i")
    return out[:rows]  # BUG


def _psumscatter_overlapped(lhs_block, rhs_block, direction: int):
    n = lax.axis_size("i")
    me = lax.axis_index("i")
    shift = partial(lax.ppermute, axis_name="i",
                    perm=[(k, (k + direction) % n) for k in range(n)])
    rows = lhs_block.reshape(n, -1, lhs_block.shape[1])
    acc = rows[(me + 1) % n] @ rhs_block
    for step in range(1, n):
        acc = shift(acc)
        acc += rows[(me + step + 1) % n] @ rhs_block
    return acc


def matmul_psumscatter_overlapped(lhs_block, rhs_block):
    return _psumscatter_overlapped(lhs_block, rhs_block, -1)


def matmul_psumscatter_overlapped_wrong_direction(lhs_block, rhs_block):
    return _psumscatter_overlapped(lhs_block, rhs_block, +1)  # BUG


def matmul_psumscatter_bidi(lhs_block, rhs_block):
    n = lax.axis_size("i")
    me = lax.axis_index("i")
    up = partial(lax.ppermute, axis_name="i", perm=[(k, (k + 1) % n) for k in range(n)])
    down = partial(lax.ppermute, axis_name="i", perm=[(k, (k - 1) % n) for k in range(n)])
    half = lhs_block.shape[0] // n // 2

    def lhs_rows(k, hi):
        return lax.dynamic_slice_in_dim(lhs_block, (2 * k + hi) * half, half, 0)

    acc_lo = lhs_rows((me - 1) % n, 0) @ rhs_block
    acc_hi = lhs_rows((me + 1) % n, 1) @ rhs_block
    for step in range(1, n):
        acc_lo = up(acc_lo)
        acc_hi = down(acc_hi)
        acc_lo += lhs_rows((me - step - 1) % n, 0) @ rhs_block
        acc_hi += lhs_rows((me + step + 1) % n, 1) @ rhs_block
    return jnp.concatenate([acc_lo, acc_hi])


# ----- neural networks ------------------------------------------------------------------------

def _predict(params, inputs):
    for w, b in params:
        outputs = inputs @ w + b
        inputs = jax.nn.relu(outputs)
    return outputs


def mlp_loss(w1, b1, w2, b2, w3, b3, inputs, targets):
    predictions = _predict(((w1, b1), (w2, b2), (w3, b3)), inputs)
    return jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))


def loss_dp(w1, b1, w2, b2, w3, b3, inputs, targets):
    local_loss = mlp_loss(w1, b1, w2, b2, w3, b3, inputs, targets)
    return lax.pmean(local_loss, "batch")


def loss_dp_psum(w1, b1, w2, b2, w3, b3, inputs, targets):
    local_loss = mlp_loss(w1, b1, w2, b2, w3, b3, inputs, targets)
    return lax.psum(local_loss, "batch")  # BUG


def loss_dp_wrong_count(w1, b1, w2, b2, w3, b3, inputs, targets):
    local_loss = mlp_loss(w1, b1, w2, b2, w3, b3, inputs, targets)
    return lax.psum(local_loss, "batch") / 4  # BUG


@partial(jax.remat, policy=lambda op, *_, **__: str(op) != "all_gather")
def _predict_fsdp(params, inputs):
    for w_frag, b_frag in params:
        w = lax.all_gather(w_frag, "batch", tiled=True)
        b = lax.all_gather(b_frag, "batch", tiled=True)
        outputs = inputs @ w + b
        inputs = jax.nn.relu(outputs)
    return outputs


def loss_fsdp(w1, b1, w2, b2, w3, b3, inputs, targets):
    predictions = _predict_fsdp(((w1, b1), (w2, b2), (w3, b3)), inputs)
    local_loss = jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))
    return lax.pmean(local_loss, "batch")


def loss_fsdp_global_batch_mean(w1, b1, w2, b2, w3, b3, inputs, targets):
    predictions = _predict_fsdp(((w1, b1), (w2, b2), (w3, b3)), inputs)
    global_batch = inputs.shape[0] * lax.axis_size("batch")
    local_loss = jnp.sum((predictions - targets) ** 2) / global_batch
    return lax.pmean(local_loss, "batch")  # BUG


def _gather_stacked(frag, axis: int = 0):
    """all_gather(tiled=False) stacks the fragments on a new dim; merging it with the next
    gives the tiled gather."""
    return lax.all_gather(frag, "batch", axis=axis).reshape(-1, *frag.shape[1:])


def loss_fsdp_stacked(w1, b1, w2, b2, w3, b3, inputs, targets):
    for_layer = ((w1, b1), (w2, b2), (w3, b3))
    for w_frag, b_frag in for_layer:
        outputs = inputs @ _gather_stacked(w_frag) + _gather_stacked(b_frag)
        inputs = jax.nn.relu(outputs)
    local_loss = jnp.mean(jnp.sum((outputs - targets) ** 2, axis=-1))
    return lax.pmean(local_loss, "batch")


def loss_fsdp_stacked_interleaved(w1, b1, w2, b2, w3, b3, inputs, targets):
    for_layer = ((w1, b1), (w2, b2), (w3, b3))
    for w_frag, b_frag in for_layer:
        w = lax.all_gather(w_frag, "batch", axis=1).reshape(-1, w_frag.shape[1])  # BUG
        outputs = inputs @ w + _gather_stacked(b_frag)
        inputs = jax.nn.relu(outputs)
    local_loss = jnp.mean(jnp.sum((outputs - targets) ** 2, axis=-1))
    return lax.pmean(local_loss, "batch")


def gemm_ref(inputs, w, b):
    return inputs @ w + b


def gemm_tp(inputs, w, b):
    block_result = jnp.dot(inputs, w)
    return lax.psum_scatter(block_result, "feats", scatter_dimension=1, tiled=True) + b


def _predict_fsdp_tp(params, inputs):
    for w_frag, b_frag in params:
        w = lax.all_gather(w_frag, "batch", tiled=True)
        b = lax.all_gather(b_frag, "batch", tiled=True)
        block_result = inputs @ w
        outputs = lax.psum_scatter(block_result, "feats", scatter_dimension=1, tiled=True) + b
        inputs = jax.nn.relu(outputs)
    return outputs


def loss_fsdp_tp(w1, b1, w2, b2, w3, b3, inputs, targets):
    predictions = _predict_fsdp_tp(((w1, b1), (w2, b2), (w3, b3)), inputs)
    sq_err = lax.psum(jnp.sum((predictions - targets) ** 2, axis=-1), "feats")
    return lax.pmean(jnp.mean(sq_err), "batch")


def loss_fsdp_tp_no_feats_psum(w1, b1, w2, b2, w3, b3, inputs, targets):
    predictions = _predict_fsdp_tp(((w1, b1), (w2, b2), (w3, b3)), inputs)
    sq_err = jnp.sum((predictions - targets) ** 2, axis=-1)  # BUG
    return lax.pmean(jnp.mean(sq_err), ("batch", "feats"))


def pipeline_ref(w, b, inputs):
    x = inputs
    for layer in range(w.shape[0]):
        x = jax.nn.relu(x @ w[layer] + b[layer])
    return x


def _spmd_pipeline(w, b, inputs, direction: int):
    """GPipe-style: stage s applies its layer to the microbatch it holds, then every stage hands
    its state to the next; stage 0 feeds microbatches in, the last stage collects them."""
    stage = lax.axis_index("stages")
    n = lax.axis_size("stages")
    m = inputs.shape[0]
    state = jnp.zeros(inputs.shape[1:], inputs.dtype)
    outputs = jnp.zeros_like(inputs)
    for t in range(m + n - 1):
        state = jnp.where(stage == 0, inputs[min(t, m - 1)], state)
        state = jax.nn.relu(state @ w[0] + b[0])
        done = t - n + 1
        if done >= 0:
            outputs = outputs.at[done].set(jnp.where(stage == n - 1, state, outputs[done]))
        state = lax.ppermute(state, "stages", [(k, (k + direction) % n) for k in range(n)])
    return lax.psum(jnp.where(stage == n - 1, outputs, 0.0), "stages")


def spmd_pipeline(w, b, inputs):
    return _spmd_pipeline(w, b, inputs, +1)


def spmd_pipeline_backwards(w, b, inputs):
    return _spmd_pipeline(w, b, inputs, -1)  # BUG


# ----- the corpus -----------------------------------------------------------------------------

_MLP_SIZES = (16, 32, 32, 8)


def _mlp_args(param_spec, data_spec, sizes=_MLP_SIZES, batch: int = 32) -> list:
    args = []
    for n_in, n_out in itertools.pairwise(sizes):
        args += [f32((n_in, n_out), param_spec, "weight"), f32((n_out,), param_spec)]
    return args + [f32((batch, sizes[0]), data_spec), f32((batch, sizes[-1]), data_spec)]


def _grad(f):
    return jax.grad(f, argnums=tuple(range(6)))


def programs() -> list[Example]:
    ex: list[Example] = []
    mm = (f32((8, 16), P("x", "y"), "weight"), f32((16, 4), P("y", None), "weight"))
    ex += [
        _p("matmul_basic", XY, matmul_ref, matmul_basic, mm, P("x", None),
           "So, let's see a shard_map!: block matmul, psum over 'y'"),
        _p("matmul_basic", XY, matmul_ref, matmul_basic_psum_wrong_axis, mm, P("x", None),
           "So, let's see a shard_map!", bug="psum_wrong_axis"),
        _p("gram_per_block", I4, gram_per_block_ref, gram_per_block, [f32((16, 4), P("i"))],
           P("i"), "Rank-reducing vs rank-preserving maps: x.T @ x of each block, concatenated"),
        _p("psum_j_block_sums", IJ, column_block_sum_ref, psum_j, [f32((8, 8), P("i", "j"))],
           P("i", None), "out_specs: psum over 'j' untiled along 'j' (sums column blocks)"),
        _p("psum_i_block_sums", IJ, row_block_sum_ref, psum_i, [f32((8, 8), P("i", "j"))],
           P(None, "j"), "out_specs: psum over 'i' untiled along 'i' (sums row blocks)"),
        _p("psum_ij_block_sums", IJ, all_block_sum_ref, psum_ij, [f32((8, 8), P("i", "j"))],
           P(None, None), "out_specs: psum over both axes (sums all blocks)"),
        _p("psum_1d", I4, block_sum_ref, psum_1d, [f32((16,), P("i"))], P(None),
           "Collectives tutorial, psum: block sums"),
        _p("psum_1d", I4, block_sum_ref, psum_1d_pmean, [f32((16,), P("i"))], P(None),
           "Collectives tutorial, psum", bug="pmean_not_psum"),
        _p("all_gather_tiled", I4, tile4_ref, all_gather_tiled, [f32((8,), P("i"))], P("i"),
           "Collectives tutorial, all_gather (tiled=True): every device holds the whole x"),
        _p("all_gather_stacked", I4, stacked_copies_ref, all_gather_stacked,
           [f32((8,), P("i"))], P("i"),
           "Collectives tutorial, all_gather (tiled=False): blocks stacked on a new axis"),
        _p("psum_scatter_1d", I4, block_sum_ref, psum_scatter_1d, [f32((16,), P("i"))],
           P("i"), "Collectives tutorial, psum_scatter (tiled)"),
        _p("ppermute_shift", I4, shift_right_ref, ppermute_right, [f32((8,), P("i"))], P("i"),
           "Collectives tutorial, ppermute: each block to the next device"),
        _p("ppermute_shift", I4, shift_right_ref, ppermute_left, [f32((8,), P("i"))], P("i"),
           "Collectives tutorial, ppermute", bug="wrong_direction"),
        _p("ppermute_shift", I4, shift_right_ref, ppermute_no_wraparound, [f32((8,), P("i"))],
           P("i"), "Collectives tutorial, ppermute", bug="no_wraparound"),
        _p("ring_psum_scatter", I4, block_sum_ref, ring_reduce_scatter, [f32((16,), P("i"))],
           P("i"), "Collectives tutorial, ppermute: psum_scatter implemented as a ring"),
        _p("ring_psum_scatter", I4, block_sum_ref, ring_reduce_scatter_off_by_one,
           [f32((16,), P("i"))], P("i"), "Collectives tutorial, ppermute (ring psum_scatter)",
           bug="chunk_off_by_one"),
        _p("all_to_all_1d", I4, block_transpose_ref, all_to_all_1d, [f32((16,), P("i"))],
           P("i"), "Collectives tutorial, all_to_all: a block transpose"),
    ]
    ag = (f32((8, 8), P("i", None), "weight"), f32((8, 4), P("i", None), "weight"))
    rs = (f32((8, 8), P(None, "i"), "weight"), f32((8, 4), P("i", None), "weight"))
    ex += [
        _p("matmul_allgather", I4, matmul_ref, matmul_allgather, ag, P("i", None),
           "Matrix multiplies, Example 1: all-gather on one side"),
        _p("matmul_allgather", I4, matmul_ref, matmul_allgather_interleaved, ag, P("i", None),
           "Example 1: all-gather on one side", bug="gathered_on_new_minor_axis"),
        _p("matmul_allgather_overlapped", I4, matmul_ref, matmul_allgather_overlapped, ag,
           P("i", None), "Example 1: all-gather overlapped with ppermute (collective matmul)"),
        _p("matmul_allgather_overlapped", I4, matmul_ref,
           matmul_allgather_overlapped_wrong_chunk, ag, P("i", None),
           "Example 1: collective matmul", bug="wrong_chunk_index"),
        _p("matmul_allgather_bidi", I4, matmul_ref, matmul_allgather_bidi, ag, P("i", None),
           "Example 1: bidirectional collective matmul (pad-and-add halves)"),
        _p("matmul_allgather_bidi", I4, matmul_ref, matmul_allgather_bidi_same_direction, ag,
           P("i", None), "Example 1: bidirectional collective matmul",
           bug="both_halves_one_direction", bug_fn=matmul_allgather_bidi_same_direction),
        _p("matmul_psumscatter", I4, matmul_ref, matmul_psumscatter, rs, P("i", None),
           "Matrix multiplies, Example 2: psum_scatter the result"),
        _p("matmul_psumscatter", I4, matmul_ref, matmul_psum_first_rows, rs, P("i", None),
           "Example 2: psum_scatter the result", bug="psum_then_first_rows"),
        _p("matmul_psumscatter_overlapped", I4, matmul_ref, matmul_psumscatter_overlapped, rs,
           P("i", None), "Example 2: reduce-scatter overlapped with ppermute"),
        _p("matmul_psumscatter_overlapped", I4, matmul_ref,
           matmul_psumscatter_overlapped_wrong_direction, rs, P("i", None),
           "Example 2: reduce-scatter collective matmul", bug="wrong_direction"),
        _p("matmul_psumscatter_bidi", I4, matmul_ref, matmul_psumscatter_bidi, rs, P("i", None),
           "Example 2: bidirectional reduce-scatter collective matmul"),
    ]
    dp = _mlp_args(P(), P("batch"))
    fsdp = _mlp_args(P("batch"), P("batch"))
    fsdp_tp = _mlp_args(P(("feats", "batch")), P("batch", "feats"), (16, 32, 32, 16))
    bf = (("batch", 4), ("feats", 2))
    ex += [
        _p("loss_dp", BATCH8, mlp_loss, loss_dp, dp, P(),
           "Neural networks, 8-way batch data parallelism: pmean of the local losses"),
        _p("loss_dp", BATCH8, mlp_loss, loss_dp_psum, dp, P(),
           "8-way batch data parallelism", bug="psum_not_pmean"),
        _p("grad_loss_dp", BATCH8, _grad(mlp_loss), loss_dp, dp, P(),
           "8-way batch data parallelism: jax.grad of the shard_map'd loss", wrap=_grad),
        _p("grad_loss_dp", BATCH8, _grad(mlp_loss), loss_dp_wrong_count, dp, P(),
           "8-way batch data parallelism, gradients", bug="mean_over_4_not_8", wrap=_grad),
        _p("loss_fsdp", BATCH4, mlp_loss, loss_fsdp, fsdp, P(),
           "8-way fully sharded data parallelism (FSDP): all_gather params, remat policy"),
        _p("loss_fsdp", BATCH4, mlp_loss, loss_fsdp_global_batch_mean, fsdp, P(),
           "FSDP", bug="global_mean_then_pmean"),
        _p("grad_loss_fsdp", BATCH4, _grad(mlp_loss), loss_fsdp, fsdp, P(),
           "FSDP: jax.grad of the shard_map'd loss (all_gather transposes to psum_scatter)",
           wrap=_grad),
        _p("loss_fsdp_untiled", BATCH4, mlp_loss, loss_fsdp_stacked, fsdp, P(),
           "FSDP with all_gather(tiled=False) + reshape"),
        _p("loss_fsdp_untiled", BATCH4, mlp_loss, loss_fsdp_stacked_interleaved, fsdp, P(),
           "FSDP with all_gather(tiled=False) + reshape", bug="stacked_on_wrong_axis"),
        _p("gemm_tp", (("feats", 8),), gemm_ref, gemm_tp,
           [f32((8, 32), P(None, "feats")), f32((32, 32), P("feats", None), "weight"),
            f32((32,), P("feats"))], P(None, "feats"),
           "8-way tensor parallelism: local matmul, psum_scatter on the features, + b"),
        _p("loss_fsdp_tp", bf, mlp_loss, loss_fsdp_tp, fsdp_tp, P(),
           "FSDP + TP, with shard_map at the top level"),
        _p("loss_fsdp_tp", bf, mlp_loss, loss_fsdp_tp_no_feats_psum, fsdp_tp, P(),
           "FSDP + TP", bug="feats_partial_sums_averaged"),
        _p("grad_loss_fsdp_tp", bf, _grad(mlp_loss), loss_fsdp_tp, fsdp_tp, P(),
           "FSDP + TP: jax.grad of the shard_map'd loss", wrap=_grad),
    ]
    pp = (f32((4, 8, 8), P("stages"), "weight"), f32((4, 8), P("stages")),
          f32((4, 2, 8), P()))
    ex += [
        _p("spmd_pipeline", (("stages", 4),), pipeline_ref, spmd_pipeline, pp, P(),
           "SPMD pipeline parallelism (GPipe): ppermute the state between stages"),
        _p("spmd_pipeline", (("stages", 4),), pipeline_ref, spmd_pipeline_backwards, pp, P(),
           "SPMD pipeline parallelism", bug="state_sent_backwards"),
    ]
    return ex
