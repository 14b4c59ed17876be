"""A second batch, from sources the first one did not use: JAX's newer sharding docs ("Manual
parallelism with shard_map" with pcast and scan, "Distributed arrays and automatic
parallelization": with_sharding_constraint, manual psum_scatter, the jitted SGD steps), newer
cases of JAX's tests/shard_map_test.py (collectives with axis_index_groups, pbroadcast, partial
auto shard_map with axis_names, vmap of a shard_map), the scaling book's part 5 (training: FSDP
+ tensor parallelism with the backward pass written out, Megatron TP under jax.grad) and part 7
(inference: the KV cache sharded over batch and heads with two AllToAlls, 2D weight-stationary
MLP, a sequence-sharded KV-cache write), and MaxText's layers (ring-of-experts MoE, interleaved
rotary embedding, Gemma's (1 + scale) RMSNorm). Each program is ours, written with the
algorithm, collectives and specs the source describes; small float32 shapes.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .corpus import Example, f32, ids, program

I2 = (("i", 2),)
I4J2 = (("i", 4), ("j", 2))
XYZ = (("x", 2), ("y", 2), ("z", 2))
ZXY = (("z", 2), ("x", 2), ("y", 2))
BOOK_XY = (("X", 2), ("Y", 2))
BOOK_XYZ = (("X", 2), ("Y", 2), ("Z", 2))
YZ = (("Y", 2), ("Z", 2))
EP4 = (("ep", 4),)
SP4 = (("sp", 4),)
TP4 = (("tp", 4),)


def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program("newer_sources", prog, mesh, reference, body, args, out, what, **kw)


def _xla(prog: str, mesh, reference, build, args, out, what: str, **kw) -> Example:
    return _p(prog, mesh, reference, build, args, out, what, partitioned=True, **kw)


# ----- shard_map 201: pcast and a scan whose carry swaps a varying and an invarying value -------

def swap_carry_ref(x, y):
    return x, jnp.tile(y, 2)


def _swap_carry(x, y, length: int):
    def body(carry, _):
        a, b = carry
        return (b, a), ()

    y = lax.pcast(y, "i", to="varying")
    (x, y), _ = lax.scan(body, (x, y), (), length=length)
    return x, y


def swap_carry(x, y):
    return _swap_carry(x, y, 2)


def swap_carry_odd(x, y):
    return _swap_carry(x, y, 1)  # BUG


# ----- Distributed arrays: manual psum_scatter matmul, constrained dot, jitted SGD steps ---------

def matmul_ref(x, y):
    return x @ y


def _matmul_scatter(x_shard, y_shard, scale: float):
    return lax.psum_scatter(jnp.dot(x_shard, y_shard), "X", tiled=True) * scale


def matmul_scatter(x_shard, y_shard):
    return _matmul_scatter(x_shard, y_shard, 1.0)


def matmul_scatter_averaged(x_shard, y_shard):
    return _matmul_scatter(x_shard, y_shard, 0.25)  # BUG


def dot_constrained(mesh):
    def f(x, y):
        z = jnp.dot(x, y)
        return lax.with_sharding_constraint(z, NamedSharding(mesh, P("X", None)))
    return f


def _predict(params, inputs):
    for w, b in params[:-1]:
        inputs = jnp.maximum(inputs @ w + b, 0)
    w, b = params[-1]
    return inputs @ w + b


def _mse(params, inputs, targets):
    return jnp.mean(jnp.sum((_predict(params, inputs) - targets) ** 2, axis=-1))


def _sgd_step(lr: float):
    def step(w1, b1, w2, b2, w3, b3, inputs, targets):
        params = [(w1, b1), (w2, b2), (w3, b3)]
        grads = jax.grad(_mse)(params, inputs, targets)
        return tuple(p - lr * g for pg in zip(params, grads)
                     for p, g in zip(pg[0], pg[1]))
    return step


sgd_step_ref = _sgd_step(0.1)


def sgd_step(mesh):
    return _sgd_step(0.1)


def sgd_step_lr_off(mesh):
    return _sgd_step(0.01)  # BUG


# ----- shard_map tests: axis_index_groups, pbroadcast, partial auto, vmap of shard_map -----------

def gather_pairs_ref(a):
    g0, g1 = a[:, :4], a[:, 4:]
    return jnp.concatenate([g0, g0, g1, g1], axis=1)


def gather_pairs(a):
    return lax.all_gather(a, ("y", "z"), axis_index_groups=((0, 1), (2, 3)), axis=-1,
                          tiled=True)


def gather_pairs_strided(a):
    return lax.all_gather(a, ("y", "z"), axis_index_groups=((0, 2), (1, 3)), axis=-1,  # BUG
                          tiled=True)


def scatter_parity_ref(a):
    sums = jnp.stack([a[:, 0::2].sum(axis=1), a[:, 1::2].sum(axis=1)])   # [parity, rows]
    return sums.reshape(2, 4, 2).transpose(2, 1, 0).reshape(2, 8)


def scatter_parity(a):
    return lax.psum_scatter(a, ("x", "y", "z"), scatter_dimension=0,
                            axis_index_groups=((0, 2, 4, 6), (1, 3, 5, 7)), tiled=True)


def scatter_parity_halves(a):
    return lax.psum_scatter(a, ("x", "y", "z"), scatter_dimension=0,
                            axis_index_groups=((0, 1, 2, 3), (4, 5, 6, 7)),  # BUG
                            tiled=True)


def identity_pair_ref(a):
    return a, a


def _gather_invariant(a, minor_axes):
    c = lax.all_gather(a, "z", axis=0, tiled=True, to="invarying")
    d = lax.all_gather(a, minor_axes, axis=-1, tiled=True, to="invarying")
    return c, d


def gather_invariant(a):
    return _gather_invariant(a, ("x", "y"))


def gather_invariant_yx(a):
    return _gather_invariant(a, ("y", "x"))  # BUG


def roll2_ref(x):
    return jnp.roll(x, 2)


def _partial_auto_ppermute(mesh, step: int):
    def g(x):
        x = lax.with_sharding_constraint(x, NamedSharding(mesh, P("j")))
        return lax.ppermute(x, "i", [(k, (k + step) % 4) for k in range(4)])

    return jax.shard_map(g, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False,
                         axis_names=frozenset({"i"}))


def partial_auto_ppermute(mesh):
    return _partial_auto_ppermute(mesh, 1)


def partial_auto_ppermute_back(mesh):
    return _partial_auto_ppermute(mesh, -1)  # BUG


def _nested_matmul(mesh, psum: bool):
    def inner(x, w):
        y = x @ w
        return lax.psum(y, "j") if psum else y

    def outer(x, w):
        return jax.shard_map(inner, in_specs=(P(None, "j"), P("j", None)), out_specs=P(),
                             check_vma=psum)(x, w)

    return jax.shard_map(outer, mesh=mesh, in_specs=(P("i", None), P()),
                         out_specs=P("i", None), check_vma=False, axis_names=frozenset({"i"}))


def nested_matmul(mesh):
    return _nested_matmul(mesh, True)


def nested_matmul_no_psum(mesh):
    return _nested_matmul(mesh, False)  # BUG


def row_block_sums_ref(a):
    return a.reshape(2, 4, 2).sum(axis=1)


def _vmap_reduce(mesh, reduce):
    return jax.vmap(jax.shard_map(lambda x: reduce(x, "y"), mesh=mesh, in_specs=P("y"),
                                  out_specs=P(None)))


def vmap_psum(mesh):
    return _vmap_reduce(mesh, lax.psum)


def vmap_pmean(mesh):
    return _vmap_reduce(mesh, lax.pmean)  # BUG


def quadrants_ref(a):
    return jnp.concatenate([a[:2], a[2:]], axis=1)


def quadrants(a):
    return lax.all_to_all(a, "x", 1, 0, axis_index_groups=((0, 1), (2, 3)), tiled=True)


def quadrants_strided(a):
    return lax.all_to_all(a, "x", 1, 0, axis_index_groups=((0, 2), (1, 3)), tiled=True)  # BUG


def rotated_sums_ref(x, y, z):
    return z, jnp.full((4,), x.sum()), jnp.repeat(y.reshape(2, 2).sum(axis=1), 2)


def _rotated_sums(x, y, z, steps: int):
    x, y, z = x.sum(), y.sum(), z.sum()

    def body(carry):
        i, first, *rest = carry
        return (i + 1, *rest, first)

    x = lax.pcast(x, ("x", "y"), to="varying")
    y = lax.pcast(y, "y", to="varying")
    _, *out = lax.while_loop(lambda c: c[0] < steps, body, (0, x, y, z))
    return tuple(jnp.expand_dims(a, 0) for a in out)


def rotated_sums(x, y, z):
    return _rotated_sums(x, y, z, 5)


def rotated_sums_four_steps(x, y, z):
    return _rotated_sums(x, y, z, 4)  # BUG


# ----- scaling book part 7: KV cache over batch (Z) and KV heads (Y), two AllToAlls -------------

N_HEADS, KV_HEADS, HEAD = 8, 2, 4


def gqa_decode_ref(x, wq, kc, vc, wo):
    b = x.shape[0]
    q = jnp.einsum("bd,dnh->bnh", x, wq).reshape(b, KV_HEADS, -1, HEAD)
    s = jnp.einsum("bkmh,bskh->bkms", q, kc) / jnp.sqrt(jnp.float32(HEAD))
    o = jnp.einsum("bkms,bskh->bkmh", jax.nn.softmax(s, axis=-1), vc)
    return jnp.einsum("bnh,nhd->bd", o.reshape(b, N_HEADS, HEAD), wo)


def _esta_decode(x, wq, kc, vc, wo, *, back_over: str):
    q = jnp.einsum("bd,dnh->bnh", x, wq)                       # Q[B, N_YZ, H]
    q = lax.all_to_all(q, "Z", 0, 1, tiled=True)               # Q[B_Z, N_Y, H]
    q = q.reshape(q.shape[0], kc.shape[2], -1, HEAD)           # Q[B_Z, K_Y, M, H]
    s = jnp.einsum("bkmh,bskh->bkms", q, kc) / jnp.sqrt(jnp.float32(HEAD))
    o = jnp.einsum("bkms,bskh->bkmh", jax.nn.softmax(s, axis=-1), vc)
    o = lax.all_to_all(o, back_over, 2, 0, tiled=True)         # O[B, K_Y, M_Z, H]
    o = o.reshape(o.shape[0], -1, HEAD)                        # O[B, N_YZ, H]
    return lax.psum(jnp.einsum("bnh,nhd->bd", o, wo), ("Y", "Z"))


def esta_decode(x, wq, kc, vc, wo):
    return _esta_decode(x, wq, kc, vc, wo, back_over="Z")


def esta_decode_back_over_y(x, wq, kc, vc, wo):
    return _esta_decode(x, wq, kc, vc, wo, back_over="Y")  # BUG


# ----- scaling book part 7, question 7: 2D weight-stationary MLP ------------------------------

def mlp_ref(x, w_in, w_out):
    return jax.nn.gelu(x @ w_in) @ w_out


def _ws2d(x, w_in, w_out, gather_axes):
    x = lax.all_gather(x, gather_axes, axis=1, tiled=True)        # In[B, D_X]
    tmp = lax.psum(x @ w_in, "X")                                 # Tmp[B, F_YZ]
    out = jax.nn.gelu(tmp) @ w_out                                # Out[B, D_X] {U.YZ}
    return lax.psum_scatter(out, ("Y", "Z"), scatter_dimension=1, tiled=True)


def ws2d(x, w_in, w_out):
    return _ws2d(x, w_in, w_out, ("Y", "Z"))


def ws2d_gather_zy(x, w_in, w_out):
    return _ws2d(x, w_in, w_out, ("Z", "Y"))  # BUG


# ----- scaling book part 5: mixed FSDP + TP, forward and the written-out backward pass ----------

def fsdp_tp_ref(x, w_in, w_out, d_out):
    out, vjp = jax.vjp(lambda a, b, c: a @ b @ c, x, w_in, w_out)
    d_x, d_in, d_w_out = vjp(d_out)
    return out, d_in, d_w_out, d_x


def _fsdp_tp(x, w_in, w_out, d_out, *, d_x_over: str):
    x_full = lax.all_gather(x, "Y", axis=1, tiled=True)          # In[B_X, D]
    w_in_g = lax.all_gather(w_in, "X", axis=0, tiled=True)       # W_in[D, F_Y]
    tmp = x_full @ w_in_g                                         # Tmp[B_X, F_Y]
    w_out_g = lax.all_gather(w_out, "X", axis=1, tiled=True)     # W_out[F_Y, D]
    out = lax.psum_scatter(tmp @ w_out_g, "Y", scatter_dimension=1, tiled=True)
    d_full = lax.all_gather(d_out, "Y", axis=1, tiled=True)      # dOut[B_X, D]
    d_w_out = lax.psum_scatter(tmp.T @ d_full, "X", scatter_dimension=1, tiled=True)
    d_tmp = d_full @ w_out_g.T                                    # dTmp[B_X, F_Y]
    d_w_in = lax.psum_scatter(x_full.T @ d_tmp, "X", scatter_dimension=0, tiled=True)
    d_x = lax.psum_scatter(d_tmp @ w_in_g.T, d_x_over, scatter_dimension=1, tiled=True)
    return out, d_w_in, d_w_out, d_x


def fsdp_tp(x, w_in, w_out, d_out):
    return _fsdp_tp(x, w_in, w_out, d_out, d_x_over="Y")


def fsdp_tp_d_in_scattered_over_x(x, w_in, w_out, d_out):
    return _fsdp_tp(x, w_in, w_out, d_out, d_x_over="X")  # BUG


def dp_backward_ref(x, w_in, w_out, d_out):
    out, vjp = jax.vjp(lambda a, b, c: a @ b @ c, x, w_in, w_out)
    d_x, d_in, d_w_out = vjp(d_out)
    return out, d_in, d_w_out, d_x


def _dp_backward(x, w_in, w_out, d_out, reduce):
    tmp = x @ w_in
    out = tmp @ w_out
    d_w_out = lax.psum(tmp.T @ d_out, "X")
    d_tmp = d_out @ w_out.T
    d_w_in = reduce(x.T @ d_tmp, "X")
    return out, d_w_in, d_w_out, d_tmp @ w_in.T


def dp_backward(x, w_in, w_out, d_out):
    return _dp_backward(x, w_in, w_out, d_out, lax.psum)


def dp_backward_d_w_in_averaged(x, w_in, w_out, d_out):
    return _dp_backward(x, w_in, w_out, d_out, lax.pmean)  # BUG


# ----- scaling book part 5: Megatron TP MLP (AllGather In, ReduceScatter Out) under jax.grad ----

def tp_loss_ref(w_in, w_out, x):
    return jnp.sum((jax.nn.gelu(x @ w_in) @ w_out) ** 2) / x.shape[0]


def _tp_loss(w_in, w_out, x, *, total: bool):
    x = lax.all_gather(x, "Y", axis=1, tiled=True)
    out = lax.psum_scatter(jax.nn.gelu(x @ w_in) @ w_out, "Y", scatter_dimension=1, tiled=True)
    local = jnp.sum(out ** 2) / x.shape[0]
    return lax.psum(local, "Y") if total else local


def tp_loss(w_in, w_out, x):
    return _tp_loss(w_in, w_out, x, total=True)


def tp_loss_not_summed(w_in, w_out, x):
    return _tp_loss(w_in, w_out, x, total=False)  # BUG


def _grad2(f):
    return jax.grad(f, argnums=(0, 1))


# ----- scaling book part 7: writing a decode step's K into a sequence-sharded KV cache ----------

def cache_write_ref(cache, new, pos):
    return lax.dynamic_update_slice(cache, new, (0, pos, 0))


def _cache_write(cache, new, pos, *, guarded: bool):
    chunk = cache.shape[1]
    total = chunk * lax.axis_size("sp")
    pos = jnp.clip(jnp.where(pos < 0, pos + total, pos), 0, total - 1)   # as jax reads `pos`
    local = pos - lax.axis_index("sp") * chunk
    written = lax.dynamic_update_slice(cache, new, (0, jnp.clip(local, 0, chunk - 1), 0))
    if not guarded:
        return written  # BUG
    return jnp.where((local >= 0) & (local < chunk), written, cache)


def _cache_positions():
    """A negative position (jax reads it from the end), the last, and one past the end."""
    import numpy as np

    rng = np.random.default_rng(7)
    cache = rng.standard_normal((2, 16, 4)).astype(np.float32)
    new = rng.standard_normal((2, 1, 4)).astype(np.float32)
    return [[cache, new, np.int32(p)] for p in (-5, 15, 40)]


def cache_write(cache, new, pos):
    return _cache_write(cache, new, pos, guarded=True)


def cache_write_unguarded(cache, new, pos):
    return _cache_write(cache, new, pos, guarded=False)


# ----- MaxText: ring-of-experts (tokens travel the expert ring, each shard applies its experts) --

N_EXPERTS = 8


def _swiglu(x, wi0, wi1, wo):
    return (jax.nn.silu(x @ wi0) * (x @ wi1)) @ wo


def ring_moe_ref(x, idx, weights, wi0, wi1, wo):
    ys = jax.vmap(_swiglu, in_axes=(None, 0, 0, 0))(x, wi0, wi1, wo)        # [E, T, D]
    combine = jnp.einsum("tk,tke->te", weights, jax.nn.one_hot(idx, N_EXPERTS))
    return jnp.einsum("te,etd->td", combine, ys)


def _ring_step(expert0, carry, wi0, wi1, wo):
    x, out, idx, weights = carry
    for i in range(wi0.shape[0]):
        chosen = jnp.sum(weights * (idx == expert0 + i), axis=-1)
        out = out + chosen[:, None] * _swiglu(x, wi0[i], wi1[i], wo[i])
    return x, out, idx, weights


def _pass_on(carry):
    n = lax.axis_size("ep")
    return tuple(lax.ppermute(v, "ep", [(k, (k + 1) % n) for k in range(n)]) for v in carry)


def _ring_moe(x, idx, weights, wi0, wi1, wo, *, passes_short: int = 0, offset: bool = True):
    expert0 = lax.axis_index("ep") * wi0.shape[0] if offset else 0
    carry = (x, jnp.zeros_like(x), idx, weights)
    for _ in range(lax.axis_size("ep") - passes_short):
        carry = _pass_on(_ring_step(expert0, carry, wi0, wi1, wo))
    return carry[1]


def ring_moe(x, idx, weights, wi0, wi1, wo):
    return _ring_moe(x, idx, weights, wi0, wi1, wo)


def ring_moe_one_pass_short(x, idx, weights, wi0, wi1, wo):
    return _ring_moe(x, idx, weights, wi0, wi1, wo, passes_short=1)  # BUG


def _ring_moe_loop(x, idx, weights, wi0, wi1, wo, *, offset: bool):
    expert0 = lax.axis_index("ep") * wi0.shape[0] if offset else 0

    def outer(_, carry):
        return _pass_on(_ring_step(expert0, carry, wi0, wi1, wo))

    carry = (x, jnp.zeros_like(x), idx, weights)
    return lax.fori_loop(0, lax.axis_size("ep"), outer, carry)[1]


def ring_moe_loop(x, idx, weights, wi0, wi1, wo):
    return _ring_moe_loop(x, idx, weights, wi0, wi1, wo, offset=True)


def ring_moe_loop_no_shard_offset(x, idx, weights, wi0, wi1, wo):
    return _ring_moe_loop(x, idx, weights, wi0, wi1, wo, offset=False)  # BUG


def _gathered_experts(x, idx, weights, wi0, wi1, wo, *, stride, count=None):
    """The dense expert-parallel spelling: every device gathers all tokens, applies its own
    experts (ids compared with `shard offset + i`), and reduce-scatters the outputs back."""
    xs, ids_, ws = (lax.all_gather(t, "ep", tiled=True) for t in (x, idx, weights))
    first = lax.axis_index("ep") * stride
    out = jnp.zeros_like(xs)
    for i in range(wi0.shape[0] if count is None else count):
        chosen = jnp.sum(ws * (ids_ == first + i), axis=-1)
        out = out + chosen[:, None] * _swiglu(xs, wi0[i], wi1[i], wo[i])
    return lax.psum_scatter(out, "ep", tiled=True)


def gathered_experts(x, idx, weights, wi0, wi1, wo):
    return _gathered_experts(x, idx, weights, wi0, wi1, wo, stride=wi0.shape[0])


def gathered_experts_stride_1(x, idx, weights, wi0, wi1, wo):
    return _gathered_experts(x, idx, weights, wi0, wi1, wo, stride=1)  # BUG


def gathered_experts_last_expert_skipped(x, idx, weights, wi0, wi1, wo):
    local = wi0.shape[0]
    return _gathered_experts(x, idx, weights, wi0, wi1, wo, stride=local,
                             count=local - 1)  # BUG


# ----- MaxText: interleaved rotary embedding, sequence sharded ----------------------------------

def _rope_interleaved(x, pos):
    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) * 2 / x.shape[-1]))
    angle = pos[:, None].astype(jnp.float32) * freq[None, :]            # [S, Hd/2]
    cos, sin = jnp.cos(angle)[None], jnp.sin(angle)[None]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return out.reshape(x.shape)


def rope_interleaved_ref(x):
    return _rope_interleaved(x, jnp.arange(x.shape[1]))


def _rope_sp(x, block_start):
    return _rope_interleaved(x, block_start(x.shape[1]) + jnp.arange(x.shape[1]))


def rope_interleaved_sp(x):
    return _rope_sp(x, lambda chunk: lax.axis_index("sp") * chunk)


def rope_interleaved_sp_block_index(x):
    return _rope_sp(x, lambda chunk: lax.axis_index("sp"))  # BUG


# ----- MaxText: Gemma's RMSNorm ((1 + scale), statistics in float32) over a TP-sharded embed ----

def gemma_rms_ref(x, scale):
    var = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * lax.rsqrt(var + 1e-6) * (1 + scale)


def _gemma_rms(x, scale, over: str):
    width = x.shape[-1] * lax.axis_size("tp")
    var = lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), over) / width
    return x * lax.rsqrt(var + 1e-6) * (1 + scale)


def gemma_rms(x, scale):
    return _gemma_rms(x, scale, "tp")


def gemma_rms_over_data(x, scale):
    return _gemma_rms(x, scale, "data")  # BUG


# ----- Flax NNX-style tied embedding: nnx.Embed's lookup and attend, the table vocab-sharded ----

def tied_embed_ref(tokens, table):
    return jnp.tanh(table[tokens]) @ table.T


def tied_embed(mesh):
    return tied_embed_ref


def tied_embed_ids_shifted(mesh):
    def f(tokens, table):
        return jnp.tanh(table[(tokens + 1) % table.shape[0]]) @ table.T  # BUG
    return f


# ----- EasyDeL / MaxText-style ring attention: K and V travel the ring, online softmax ----------

def attention_ref(q, k, v):
    s = jnp.einsum("bqh,bkh->bqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("bqk,bkh->bqh", jax.nn.softmax(s, axis=-1), v)


def _ring_attention(q, k, v, *, rescale: bool):
    n = lax.axis_size("sp")
    m = jnp.full(q.shape[:2], -jnp.inf, q.dtype)
    denom = jnp.zeros(q.shape[:2], q.dtype)
    out = jnp.zeros_like(q)
    for _ in range(n):
        s = jnp.einsum("bqh,bkh->bqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[..., None])
        scale = jnp.exp(m - m_new) if rescale else jnp.ones_like(m)
        denom = denom * scale + p.sum(axis=-1)
        out = out * scale[..., None] + jnp.einsum("bqk,bkh->bqh", p, v)
        m = m_new
        k, v = (lax.ppermute(t, "sp", [(j, (j + 1) % n) for j in range(n)]) for t in (k, v))
    return out / denom[..., None]


def ring_attention(q, k, v):
    return _ring_attention(q, k, v, rescale=True)


def ring_attention_no_rescale(q, k, v):
    return _ring_attention(q, k, v, rescale=False)  # BUG


# ----- the corpus -------------------------------------------------------------------------------

def _mlp_params(w_spec, b_spec, sizes=(16, 32, 32, 8)):
    out = []
    for n_in, n_out in itertools.pairwise(sizes):
        out += [f32((n_in, n_out), w_spec, "weight"), f32((n_out,), b_spec)]
    return out


def programs() -> list[Example]:
    docs = "JAX docs, Manual parallelism with shard_map (201)"
    arrays = "JAX docs, Distributed arrays and automatic parallelization"
    tests = "JAX tests/shard_map_test.py"
    part5 = "scaling book part 5 (training)"
    part7 = "scaling book part 7 (inference)"
    out: list[Example] = []
    swap = [f32((6,), P("i")), f32((3,), P())]
    out += [
        _p("scan_swap_carry", I2, swap_carry_ref, swap_carry, swap, (P("i"), P("i")),
           f"{docs}: pcast so a scan can swap a varying and an invarying carry"),
        _p("scan_swap_carry", I2, swap_carry_ref, swap_carry_odd, swap, (P("i"), P("i")),
           f"{docs}: pcast and scan", bug="odd_number_of_swaps"),
    ]
    mm = [f32((8, 4), P(None, "X")), f32((4, 16), P("X", None), "weight")]
    x4y2 = (("X", 4), ("Y", 2))
    dp = _mlp_params(P(), P()) + [f32((16, 16), P("batch")), f32((16, 8), P("batch"))]
    dp_tp = (_mlp_params(P(None, "model"), P("model"))
             + [f32((16, 16), P("batch", None)), f32((16, 8), P("batch", None))])
    dp_out = tuple(P() for _ in range(6))
    out += [
        _p("manual_matmul_scatter", x4y2, matmul_ref, matmul_scatter, mm, P("X", None),
           f"{arrays}: Manual mode, local dot then psum_scatter over 'X'"),
        _p("manual_matmul_scatter", x4y2, matmul_ref, matmul_scatter_averaged, mm,
           P("X", None), f"{arrays}: Manual mode", bug="scatter_averaged"),
        _xla("dot_constrained", x4y2, matmul_ref, dot_constrained, mm, P("X", None),
             f"{arrays}: Auto mode, dot of P(None, 'X') by P('X', None) with a constraint"),
        _xla("sgd_step_dp", (("batch", 8),), sgd_step_ref, sgd_step, dp, dp_out,
             f"{arrays} (0.4 notebook): jitted SGD step, 8-way batch data parallelism"),
        _xla("sgd_step_dp", (("batch", 8),), sgd_step_ref, sgd_step_lr_off, dp, dp_out,
             f"{arrays}: jitted SGD step", bug="learning_rate_off"),
        _xla("sgd_step_dp_tp", (("batch", 4), ("model", 2)), sgd_step_ref, sgd_step, dp_tp,
             tuple(a.spec for a in dp_tp[:6]),
             f"{arrays} (0.4 notebook): jitted SGD step, 4-way batch x 2-way model"),
    ]
    a_xyz = [f32((8, 8), P("x", ("y", "z")))]
    b_xyz = [f32((8, 8), P(None, ("x", "y", "z")))]
    out += [
        _p("all_gather_index_groups", XYZ, gather_pairs_ref, gather_pairs, a_xyz,
           P("x", ("y", "z")), f"{tests}: test_all_gather_with_axis_index_groups"),
        _p("all_gather_index_groups", XYZ, gather_pairs_ref, gather_pairs_strided, a_xyz,
           P("x", ("y", "z")), f"{tests}: all_gather with axis_index_groups",
           bug="strided_groups"),
        _p("psum_scatter_index_groups", XYZ, scatter_parity_ref, scatter_parity, b_xyz,
           P(None, ("x", "y", "z")), f"{tests}: test_reduce_scatter_with_axis_index_groups"),
        _p("psum_scatter_index_groups", XYZ, scatter_parity_ref, scatter_parity_halves, b_xyz,
           P(None, ("x", "y", "z")), f"{tests}: psum_scatter with axis_index_groups",
           bug="contiguous_groups"),
        _p("all_gather_invariant", ZXY, identity_pair_ref, gather_invariant,
           [f32((8, 8), P("z", ("x", "y")))], (P(None, ("x", "y")), P("z")),
           f"{tests}: test_all_gather_invariant_complex (to='invarying')"),
        _p("all_gather_invariant", ZXY, identity_pair_ref, gather_invariant_yx,
           [f32((8, 8), P("z", ("x", "y")))], (P(None, ("x", "y")), P("z")),
           f"{tests}: all_gather to='invarying'", bug="minor_axes_y_x"),
        _xla("partial_auto_ppermute", I4J2, roll2_ref, partial_auto_ppermute,
             [f32((8,), P())], P("i"), f"{tests}: test_partial_auto_ppermute "
             "(manual over 'i' only, a constraint over auto 'j')"),
        _xla("partial_auto_ppermute", I4J2, roll2_ref, partial_auto_ppermute_back,
             [f32((8,), P())], P("i"), f"{tests}: test_partial_auto_ppermute",
             bug="permuted_backwards"),
        _xla("nested_partial_auto_matmul", (("i", 2), ("j", 2)), matmul_ref, nested_matmul,
             [f32((8, 8), P("i", "j")), f32((8, 4), P("j", None), "weight")], P("i", None),
             f"{tests}: test_nested_partial_auto (manual 'i' outside, 'j' inside)"),
        _xla("nested_partial_auto_matmul", (("i", 2), ("j", 2)), matmul_ref,
             nested_matmul_no_psum,
             [f32((8, 8), P("i", "j")), f32((8, 4), P("j", None), "weight")], P("i", None),
             f"{tests}: test_nested_partial_auto", bug="inner_psum_missing"),
        _xla("vmap_of_shard_map_psum", (("x", 2), ("y", 4)), row_block_sums_ref, vmap_psum,
             [f32((2, 8), P("x", "y"))], P("x", None), f"{tests}: test_vmap_shmap_psum"),
        _xla("vmap_of_shard_map_psum", (("x", 2), ("y", 4)), row_block_sums_ref, vmap_pmean,
             [f32((2, 8), P("x", "y"))], P("x", None), f"{tests}: test_vmap_shmap_psum",
             bug="pmean_not_psum"),
    ]
    out += [
        _p("all_to_all_index_groups", (("x", 4),), quadrants_ref, quadrants,
           [f32((4, 4), P("x", None))], P(None, "x"),
           f"{tests}: test_all_to_all_with_axis_index_groups (each device gets a quadrant)"),
        _p("all_to_all_index_groups", (("x", 4),), quadrants_ref, quadrants_strided,
           [f32((4, 4), P("x", None))], P(None, "x"),
           f"{tests}: all_to_all with axis_index_groups", bug="strided_groups"),
        _p("while_rotates_carries", (("x", 2), ("y", 2)), rotated_sums_ref, rotated_sums,
           [f32((4,), P(None)), f32((4,), P("x")), f32((4,), P(("x", "y")))],
           (P(("x", "y")),) * 3, f"{tests}: test_while_rep_rule (a while loop rotating "
           "carries of different variance)"),
        _p("while_rotates_carries", (("x", 2), ("y", 2)), rotated_sums_ref,
           rotated_sums_four_steps,
           [f32((4,), P(None)), f32((4,), P("x")), f32((4,), P(("x", "y")))],
           (P(("x", "y")),) * 3, f"{tests}: test_while_rep_rule", bug="four_steps"),
        _xla("tied_embed_attend", TP4, tied_embed_ref, tied_embed,
             [ids((8,), P(), 32), f32((32, 8), P("tp", None))], P(None, "tp"),
             "Flax NNX's Embed: lookup and attend with the vocab-sharded table, under jit"),
        _xla("tied_embed_attend", TP4, tied_embed_ref, tied_embed_ids_shifted,
             [ids((8,), P(), 32), f32((32, 8), P("tp", None))], P(None, "tp"),
             "Flax NNX's Embed: lookup and attend", bug="ids_shifted",
             bug_fn=tied_embed_ids_shifted),
    ]
    qkv = [f32((2, 16, 8), P(None, "sp", None)) for _ in range(3)]
    out += [
        _p("ring_attention", SP4, attention_ref, ring_attention, qkv, P(None, "sp", None),
           "EasyDeL / MaxText-style ring attention: K and V pass around 'sp', online softmax"),
        _p("ring_attention", SP4, attention_ref, ring_attention_no_rescale, qkv,
           P(None, "sp", None), "ring attention", bug="accumulator_not_rescaled"),
    ]
    esta = [f32((4, 16), P()), f32((16, N_HEADS, HEAD), P(None, ("Y", "Z"), None), "weight"),
            f32((4, 8, KV_HEADS, HEAD), P("Z", None, "Y", None)),
            f32((4, 8, KV_HEADS, HEAD), P("Z", None, "Y", None)),
            f32((N_HEADS, HEAD, 16), P(("Y", "Z"), None, None), "weight")]
    ws = [f32((4, 16), P(None, ("X", "Y", "Z"))), f32((16, 32), P("X", ("Y", "Z")), "weight"),
          f32((32, 16), P(("Y", "Z"), "X"), "weight")]
    ft = [f32((8, 8), P("X", "Y")), f32((8, 16), P("X", "Y"), "weight"),
          f32((16, 8), P("Y", "X"), "weight"), f32((8, 8), P("X", "Y"))]
    ft_out = (P("X", "Y"), P("X", "Y"), P("Y", "X"), P("X", "Y"))
    tp = [f32((16, 32), P(None, "Y"), "weight"), f32((32, 16), P("Y", None), "weight"),
          f32((8, 16), P(None, "Y"))]
    y4 = (("Y", 4),)
    dp_fb = [f32((8, 8), P("X")), f32((8, 16), P(), "weight"), f32((16, 8), P(), "weight"),
             f32((8, 8), P("X"))]
    kv = [f32((2, 16, 4), P(None, "sp", None)), f32((2, 1, 4), P()), ids((), P(), 16)]
    out += [
        _p("esta_kv_decode", YZ, gqa_decode_ref, esta_decode, esta, P(),
           f"{part7}: Sharding the KV cache: KV[B_Z, S, K_Y, H], AllToAll Q to batch "
           "sharding and the output back, AllReduce over YZ"),
        _p("esta_kv_decode", YZ, gqa_decode_ref, esta_decode_back_over_y, esta, P(),
           f"{part7}: KV cache over batch and heads", bug="second_all_to_all_over_y"),
        _p("weight_stationary_2d", BOOK_XYZ, mlp_ref, ws2d, ws, P(None, ("X", "Y", "Z")),
           f"{part7}: question 7, 2D weight-stationary sharding (AllGather_YZ, AllReduce_X, "
           "ReduceScatter_YZ)"),
        _p("weight_stationary_2d", BOOK_XYZ, mlp_ref, ws2d_gather_zy, ws,
           P(None, ("X", "Y", "Z")), f"{part7}: question 7", bug="gathered_over_z_y"),
        _p("fsdp_tp_forward_backward", BOOK_XY, fsdp_tp_ref, fsdp_tp, ft, ft_out,
           f"{part5}: Mixed FSDP and tensor parallelism, forward and backward as written"),
        _p("fsdp_tp_forward_backward", BOOK_XY, fsdp_tp_ref, fsdp_tp_d_in_scattered_over_x,
           ft, ft_out, f"{part5}: Mixed FSDP and TP", bug="d_in_scattered_over_x"),
        _p("dp_forward_backward", (("X", 4),), dp_backward_ref, dp_backward, dp_fb,
           (P("X"), P(), P(), P("X")),
           f"{part5}: Pure data parallelism, forward and backward as written (AllReduce dW)"),
        _p("dp_forward_backward", (("X", 4),), dp_backward_ref, dp_backward_d_w_in_averaged,
           dp_fb, (P("X"), P(), P(), P("X")), f"{part5}: Pure data parallelism",
           bug="d_w_in_averaged"),
        _p("grad_tp_mlp", y4, _grad2(tp_loss_ref), tp_loss, tp, P(),
           f"{part5}: Tensor parallelism (AllGather In, ReduceScatter Out) under jax.grad",
           wrap=_grad2),
        _p("grad_tp_mlp", y4, _grad2(tp_loss_ref), tp_loss_not_summed, tp, P(),
           f"{part5}: Tensor parallelism under jax.grad", bug="loss_not_summed",
           wrap=_grad2),
        _p("kv_cache_write", SP4, cache_write_ref, cache_write, kv, P(None, "sp", None),
           f"{part7}: sequence-sharded KV cache: the shard holding `pos` writes the new K",
           chosen=_cache_positions),
        _p("kv_cache_write", SP4, cache_write_ref, cache_write_unguarded, kv,
           P(None, "sp", None), f"{part7}: sequence-sharded KV cache write",
           bug="every_shard_writes", bug_fn=_cache_write, chosen=_cache_positions),
    ]
    moe = [f32((16, 8), P("ep")), ids((16, 2), P("ep"), N_EXPERTS), f32((16, 2), P("ep")),
           f32((N_EXPERTS, 8, 16), P("ep"), "weight"), f32((N_EXPERTS, 8, 16), P("ep"), "weight"),
           f32((N_EXPERTS, 16, 8), P("ep"), "weight")]
    maxtext = "MaxText"
    rope = [f32((2, 16, 8), P(None, "sp", None))]
    rms = [f32((8, 16), P("data", "tp")), f32((16,), P("tp"))]
    dtp = (("data", 2), ("tp", 2))
    out += [
        _p("ring_of_experts", EP4, ring_moe_ref, ring_moe, moe, P("ep"),
           f"{maxtext} ring_of_experts.py: tokens pass around the expert ring (unrolled)"),
        _p("ring_of_experts", EP4, ring_moe_ref, ring_moe_one_pass_short, moe, P("ep"),
           f"{maxtext} ring-of-experts", bug="one_pass_short"),
        _p("ring_of_experts_loop", EP4, ring_moe_ref, ring_moe_loop, moe, P("ep"),
           f"{maxtext} ring_of_experts.py: the ring as a fori_loop, as written there"),
        _p("ring_of_experts_loop", EP4, ring_moe_ref, ring_moe_loop_no_shard_offset, moe,
           P("ep"), f"{maxtext} ring-of-experts loop", bug="no_shard_offset"),
        _p("gathered_experts", EP4, ring_moe_ref, gathered_experts, moe, P("ep"),
           f"{maxtext}-style dense expert parallelism: all-gather the tokens, each shard "
           "applies its experts (ids == shard offset + i), psum_scatter back"),
        _p("gathered_experts", EP4, ring_moe_ref, gathered_experts_stride_1, moe, P("ep"),
           f"{maxtext}-style dense expert parallelism", bug="shard_offset_stride_1"),
        _p("gathered_experts", EP4, ring_moe_ref, gathered_experts_last_expert_skipped, moe,
           P("ep"), f"{maxtext}-style dense expert parallelism", bug="last_expert_skipped"),
        _p("rope_interleaved_sp", SP4, rope_interleaved_ref, rope_interleaved_sp, rope,
           P(None, "sp", None), f"{maxtext}: rotary embedding on interleaved pairs, the "
           "sequence sharded (positions from the block start)"),
        _p("rope_interleaved_sp", SP4, rope_interleaved_ref, rope_interleaved_sp_block_index,
           rope, P(None, "sp", None), f"{maxtext}: interleaved rotary, sequence sharded",
           bug="offset_by_block_index"),
        _p("gemma_rms_tp", dtp, gemma_rms_ref, gemma_rms, rms, P("data", "tp"),
           f"{maxtext}: Gemma's RMSNorm (1 + scale) with the embed dim over 'tp'"),
        _p("gemma_rms_tp", dtp, gemma_rms_ref, gemma_rms_over_data, rms, P("data", "tp"),
           f"{maxtext}: Gemma's RMSNorm, embed over 'tp'", bug="sum_of_squares_over_data"),
    ]
    return out
