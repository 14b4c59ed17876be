"""Programs of "How to Scale Your Model" (jax-ml.github.io/scaling-book): the shard_map examples
and worked problems of part 10 ("Programming TPUs in JAX", jax-stuff) and the sharded-matmul cases
of part 3 ("Sharded Matrices"), written in our style (small float32 shapes, the book's 2x4 mesh
'X' x 'Y' or a 1-D mesh). The worked problems have no code in the book; these are straightforward
solutions of them with the collectives the problems ask for.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Example, f32, ids, program

BOOK = "scaling book"
XY24 = (("X", 2), ("Y", 4))
xy24 = (("x", 2), ("y", 4))


def _p(prog: str, mesh, reference, body, args, out, section: str, **kw) -> Example:
    return program("scaling_book", prog, mesh, reference, body, args, out,
                   f"{BOOK}, {section}", **kw)


def matmul_ref(a, b):
    return a @ b


# ----- part 10: shard_map ---------------------------------------------------------------------

def slice_and_average_ref(x):
    return x.reshape(8, -1)[:, :4].mean(axis=0)


def slice_and_average(x):
    return lax.pmean(x[:4], axis_name=("x", "y"))


def slice_and_average_one_axis(x):
    return lax.pmean(x[:4], axis_name="y")  # BUG


def _collective_matmul(lhs, rhs, *, unroll: bool, to: int):
    """AllGather collective matmul, A[B_X, D_Y] @ W[D, F_Y]: multiply the local chunk of A by
    the matching rows of W while A's chunks travel around the ring."""
    axis_size = lax.psum(1, axis_name="Y")
    idx = lax.axis_index("Y")
    chunk = lhs.shape[1]

    def step(i, carry):
        accum, lhs = carry
        rhs_chunk = lax.dynamic_slice_in_dim(rhs, (idx + i) % axis_size * chunk, chunk)
        update = lhs @ rhs_chunk
        lhs = lax.ppermute(lhs, axis_name="Y",
                           perm=[(j, (j + to) % axis_size) for j in range(axis_size)])
        return accum + update, lhs

    accum = jnp.zeros((lhs.shape[0], rhs.shape[1]), dtype=lhs.dtype)
    accum, lhs = lax.fori_loop(0, axis_size - 1, step, (accum, lhs), unroll=unroll)
    last = axis_size - 1
    rhs_chunk = lax.dynamic_slice_in_dim(rhs, (idx + last) % axis_size * chunk, chunk)
    return accum + lhs @ rhs_chunk


def collective_matmul(lhs, rhs):
    return _collective_matmul(lhs, rhs, unroll=True, to=-1)


def collective_matmul_loop(lhs, rhs):
    return _collective_matmul(lhs, rhs, unroll=False, to=-1)


def collective_matmul_shift_right(lhs, rhs):
    return _collective_matmul(lhs, rhs, unroll=True, to=+1)  # BUG


def shard_mean_ref(a):
    return a.reshape(2, -1, a.shape[1]).mean(axis=1)


def shard_mean(a):
    return a.mean(axis=0, keepdims=True)


def roll_within_shard_ref(a):
    return jnp.concatenate([jnp.roll(b, 1, axis=0) - b for b in jnp.split(a, 2)])


def roll_within_shard(a):
    return jnp.roll(a, 1, axis=0) - a


def moe_ref(w, a, route):
    return jnp.einsum("sd,sdf->sf", a, w[route])


def _moe_allgather(w, a, route, *, stride):
    """Each device holds a few experts: gather all tokens, apply the local experts to the tokens
    routed to them (zero elsewhere), reduce-scatter the tokens back."""
    me = lax.axis_index("X")
    a_all = lax.all_gather(a, "X", tiled=True)
    route_all = lax.all_gather(route, "X", tiled=True)
    n_local = w.shape[0]
    local = route_all - me * stride
    mine = (local >= 0) & (local < n_local)
    w_tok = w[jnp.clip(local, 0, n_local - 1)]
    out = jnp.einsum("sd,sdf->sf", a_all, w_tok)
    out = jnp.where(mine[:, None], out, 0.0)
    return lax.psum_scatter(out, "X", scatter_dimension=0, tiled=True)


def moe_allgather(w, a, route):
    return _moe_allgather(w, a, route, stride=w.shape[0])


def moe_allgather_expert_offset(w, a, route):
    return _moe_allgather(w, a, route, stride=1)  # BUG


def moe_topk_ref(w, a, route):
    return sum(jnp.einsum("sd,sdf->sf", a, w[route[:, k]]) for k in range(route.shape[1])) / 2


def moe_topk_allgather(w, a, route):
    me = lax.axis_index("X")
    a_all = lax.all_gather(a, "X", tiled=True)
    route_all = lax.all_gather(route, "X", tiled=True)
    n_local = w.shape[0]
    out = jnp.zeros((a_all.shape[0], w.shape[2]), a.dtype)
    for k in range(route.shape[1]):
        local = route_all[:, k] - me * n_local
        mine = (local >= 0) & (local < n_local)
        y = jnp.einsum("sd,sdf->sf", a_all, w[jnp.clip(local, 0, n_local - 1)])
        out = out + jnp.where(mine[:, None], y, 0.0)
    return lax.psum_scatter(out / route.shape[1], "X", scatter_dimension=0, tiled=True)


def allreduce_collective_matmul(a, w):
    """Problem 3.1: A[B_X, D_Y] @ W[D_Y, F] -> Out[B_X, F], tiled over the output columns so each
    tile's AllReduce can overlap the next tile's matmul."""
    n = lax.axis_size("Y")
    cols = w.shape[1] // n
    tiles = [lax.psum(a @ w[:, k * cols:(k + 1) * cols], "Y") for k in range(n)]
    return jnp.concatenate(tiles, axis=1)


def _rs_collective_matmul(tmp, w2, *, first: int):
    """Problem 3.2: Tmp[B_X, F_Y] @ W2[F_Y, D] -> Out[B_X, D_Y]: accumulate output column chunks
    while passing the accumulator to the previous device."""
    n = lax.axis_size("Y")
    me = lax.axis_index("Y")
    cols = w2.shape[1] // n
    to_prev = partial(lax.ppermute, axis_name="Y", perm=[(j, (j - 1) % n) for j in range(n)])

    def part(k):
        return tmp @ lax.dynamic_slice_in_dim(w2, k * cols, cols, axis=1)

    acc = part((me + 1) % n)
    for step in range(1, n):
        acc = to_prev(acc)
        acc = acc + part((me + step + first) % n)
    return acc


def rs_collective_matmul(tmp, w2):
    return _rs_collective_matmul(tmp, w2, first=1)


def rs_collective_matmul_off_by_one(tmp, w2):
    return _rs_collective_matmul(tmp, w2, first=0)  # BUG


def mlp_ref(x, w_in, w_out):
    return jax.nn.gelu(x @ w_in) @ w_out


def overlapped_block(x, w_in, w_out):
    """Problem 3.3: In[B_X, D_Y] @ W_in[D, F_Y] -> gelu -> @ W_out[F_Y, D] -> Out[B_X, D_Y], both
    matmuls as collective matmuls."""
    h = _collective_matmul(x, w_in, unroll=True, to=-1)
    return _rs_collective_matmul(jax.nn.gelu(h), w_out, first=1)


# ----- part 3: sharded matrices ---------------------------------------------------------------

def local_matmul(a, b):
    return a @ b


def gather_lhs_matmul(a, b):
    return lax.all_gather(a, "X", tiled=True) @ b


def gather_lhs_stacked_matmul(a, b):
    return lax.all_gather(a, "X").reshape(-1, a.shape[1]) @ b


def gather_lhs_stacked_interleaved(a, b):
    return lax.all_gather(a, "X", axis=1).reshape(-1, a.shape[1]) @ b  # BUG


def reduce_scatter_matmul(a, b):
    return lax.psum_scatter(a @ b, "X", scatter_dimension=0, tiled=True)


def reshard_ref(x):
    return x


def all_to_all_reshard(x):
    return lax.all_to_all(x, "X", split_axis=0, concat_axis=1, tiled=True)


# ----- the corpus -----------------------------------------------------------------------------

def programs() -> list[Example]:
    cm = (f32((8, 16), P("X", "Y")), f32((16, 16), P(None, "Y"), "weight"))
    moe = (f32((8, 8, 8), P("X", None, None), "weight"), f32((16, 8), P("X", None)),
           ids((16,), P("X"), 8))
    moe2 = (moe[0], moe[1], ids((16, 2), P("X", None), 8))
    x4 = (("X", 4),)
    ex = [
        _p("slice_and_average", xy24, slice_and_average_ref, slice_and_average,
           [f32((64,), P(("x", "y")))], P(None),
           "part 10, shard_map: slice_and_average (pmean of each shard's first 4 elements)"),
        _p("slice_and_average", xy24, slice_and_average_ref, slice_and_average_one_axis,
           [f32((64,), P(("x", "y")))], P(None), "part 10, slice_and_average",
           bug="pmean_over_y_only"),
        _p("collective_matmul", XY24, matmul_ref, collective_matmul, cm, P("X", "Y"),
           "part 10, Example [Collective Matmul] (fori_loop, unroll=True)", check_vma=False),
        _p("collective_matmul_loop", XY24, matmul_ref, collective_matmul_loop, cm, P("X", "Y"),
           "part 10, Example [Collective Matmul] as a rolled fori_loop (rotating carry)",
           check_vma=False),
        _p("collective_matmul", XY24, matmul_ref, collective_matmul_shift_right, cm,
           P("X", "Y"), "part 10, Example [Collective Matmul]", bug="shift_right"),
        _p("shard_mean", XY24, shard_mean_ref, shard_mean, [f32((16, 8), P("X", "Y"))],
           P("X", "Y"), "part 10, Problem 1.1: the average over each X shard"),
        _p("roll_within_shard", XY24, roll_within_shard_ref, roll_within_shard,
           [f32((16, 8), P("X", "Y"))], P("X", "Y"),
           "part 10, Problem 1.2: roll(x, shift) - x within each X shard"),
        _p("moe_allgather", x4, moe_ref, moe_allgather, moe, P("X", None),
           "part 10, Problem 2.3.1: MoE Out[i] = W[B[i]] @ A[i] with all_gather, experts over X"),
        _p("moe_allgather", x4, moe_ref, moe_allgather_expert_offset, moe, P("X", None),
           "part 10, Problem 2.3.1", bug="expert_offset_not_scaled"),
        _p("moe_top2_allgather", x4, moe_topk_ref, moe_topk_allgather, moe2, P("X", None),
           "part 10, Problem 2.4: top-2 routing, the two experts' outputs averaged"),
        _p("allreduce_collective_matmul", XY24, matmul_ref, allreduce_collective_matmul,
           [f32((8, 16), P("X", "Y")), f32((16, 16), P("Y", None), "weight")], P("X", None),
           "part 10, Problem 3.1: AllReduce collective matmul tiled over the output"),
        _p("rs_collective_matmul", XY24, matmul_ref, rs_collective_matmul,
           [f32((8, 16), P("X", "Y")), f32((16, 16), P("Y", None), "weight")], P("X", "Y"),
           "part 10, Problem 3.2: ReduceScatter collective matmul (permuting the accumulator)"),
        _p("rs_collective_matmul", XY24, matmul_ref, rs_collective_matmul_off_by_one,
           [f32((8, 16), P("X", "Y")), f32((16, 16), P("Y", None), "weight")], P("X", "Y"),
           "part 10, Problem 3.2", bug="chunk_off_by_one"),
        _p("overlapped_mlp_block", XY24, mlp_ref, overlapped_block,
           [f32((8, 16), P("X", "Y")), f32((16, 32), P(None, "Y"), "weight"),
            f32((32, 16), P("Y", None), "weight")], P("X", "Y"),
           "part 10, Problem 3.3: a Transformer MLP with both collective matmuls", check_vma=False),
        _p("matmul_no_comms", XY24, matmul_ref, local_matmul,
           [f32((8, 16), P("X", None)), f32((16, 8), P(None, "Y"), "weight")], P("X", "Y"),
           "part 3, case 1: A[I_X, J] . B[J, K_Y] -> C[I_X, K_Y], no communication"),
        _p("matmul_gather_lhs", x4, matmul_ref, gather_lhs_matmul,
           [f32((8, 16), P("X", None)), f32((16, 8), P(None, "X"), "weight")], P(None, "X"),
           "part 3, case 4: A[I_X, J] . B[J, K_X]: AllGather A first"),
        _p("matmul_gather_lhs_untiled", x4, matmul_ref, gather_lhs_stacked_matmul,
           [f32((8, 16), P("X", None)), f32((16, 8), P(None, "X"), "weight")], P(None, "X"),
           "part 3, case 4 with all_gather(tiled=False) + reshape"),
        _p("matmul_gather_lhs_untiled", x4, matmul_ref, gather_lhs_stacked_interleaved,
           [f32((8, 16), P("X", None)), f32((16, 8), P(None, "X"), "weight")], P(None, "X"),
           "part 3, case 4 with all_gather(tiled=False) + reshape",
           bug="stacked_on_wrong_axis"),
        _p("matmul_reduce_scatter", x4, matmul_ref, reduce_scatter_matmul,
           [f32((8, 16), P(None, "X")), f32((16, 8), P("X", None), "weight")], P("X", None),
           "part 3, case 2: A[I, J_X] . B[J_X, K] -> ReduceScatter -> C[I_X, K]"),
        _p("all_to_all_reshard", x4, reshard_ref, all_to_all_reshard,
           [f32((8, 16), P(None, "X"))], P("X", None),
           "part 3, AllToAll: [A, B_X] -> [A_X, B]"),
    ]
    return ex
