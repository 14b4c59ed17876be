"""Optimizer and training steps written with shard_map the way distributed-training code spells
them: ZeRO stage 1/2 Adam (DeepSpeed's ZeRO paper, Megatron-LM's distributed optimizer: params
replicated, gradients reduce-scattered, Adam moments sharded, updated shards all-gathered),
ZeRO-3/FSDP Adam (params sharded, gathered for the forward pass, gradients reduce-scattered; the
shard_map notebook's FSDP with jax.grad transposing the all_gather), optax's
clip_by_global_norm over sharded gradients, Megatron-LM's sequence-parallel norm-weight
gradients (the all-reduce of Megatron-LM issue #443 / TransformerEngine issue #435) and a
data x tensor parallel SGD step. Small float32 shapes, meshes of 4 devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .corpus import Example, f32, program

DATA4 = (("data", 4),)
FSDP4 = (("fsdp", 4),)
TP4 = (("tp", 4),)
DP_TP = (("data", 2), ("model", 2))
LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-8


def _p(prog: str, mesh, reference, body, args, out, what: str, **kw) -> Example:
    return program("training_steps", prog, mesh, reference, body, args, out, what, **kw)


def _loss(w, x, y):
    return jnp.sum((jnp.tanh(x @ w) - y) ** 2) / x.shape[0]


def _adam(p, g, m, v):
    """One Adam step (optax.adam at step 1: bias corrections 1 - b1 and 1 - b2)."""
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * g * g
    m_hat, v_hat = m / (1 - B1), v / (1 - B2)
    return p - LR * m_hat / (jnp.sqrt(v_hat) + EPS), m, v


def adam_step_ref(w, m, v, x, y):
    return _adam(w, jax.grad(_loss)(w, x, y), m, v)


# ----- ZeRO-1/2: params replicated, grads reduce-scattered, moments sharded ---------------------

def _zero_adam(w, m, v, x, y, *, mean: bool, local: bool = False, shift: int = 0):
    n = lax.axis_size("data")
    g = jax.grad(_loss)(w, x, y)
    rows = m.shape[0]
    if local:
        g = lax.dynamic_slice_in_dim(g, lax.axis_index("data") * rows, rows)
    else:
        g = lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True)
        if mean:
            g = g / n
    start = (lax.axis_index("data") + shift) % n * rows
    w_shard = lax.dynamic_slice_in_dim(w, start, rows)
    w_shard, m, v = _adam(w_shard, g, m, v)
    return lax.all_gather(w_shard, "data", tiled=True), m, v


def zero_adam(w, m, v, x, y):
    return _zero_adam(w, m, v, x, y, mean=True)


def zero_adam_summed(w, m, v, x, y):
    return _zero_adam(w, m, v, x, y, mean=False)  # BUG


def zero_adam_local_grads(w, m, v, x, y):
    return _zero_adam(w, m, v, x, y, mean=True, local=True)  # BUG


def zero_adam_next_shard(w, m, v, x, y):
    return _zero_adam(w, m, v, x, y, mean=True, shift=1)  # BUG


def zero1_adam_allreduce(w, m, v, x, y):
    """ZeRO-1 as Megatron-LM's distributed optimizer without the reduce-scatter: pmean the
    whole gradient, slice this rank's rows, update them, all_gather the params."""
    g = lax.pmean(jax.grad(_loss)(w, x, y), "data")
    rows = m.shape[0]
    start = lax.axis_index("data") * rows
    w_shard, m, v = _adam(lax.dynamic_slice_in_dim(w, start, rows),
                          lax.dynamic_slice_in_dim(g, start, rows), m, v)
    return lax.all_gather(w_shard, "data", tiled=True), m, v


def zero1_adam_allreduce_grad_rows_of_rank0(w, m, v, x, y):
    g = lax.pmean(jax.grad(_loss)(w, x, y), "data")
    rows = m.shape[0]
    start = lax.axis_index("data") * rows
    w_shard, m, v = _adam(lax.dynamic_slice_in_dim(w, start, rows),
                          g[:rows], m, v)  # BUG
    return lax.all_gather(w_shard, "data", tiled=True), m, v


# ----- ZeRO-3 / FSDP: params sharded too --------------------------------------------------------

def fsdp_adam_explicit(w, m, v, x, y):
    """Gather the params, differentiate the local loss, reduce-scatter the gradient (mean)."""
    w_full = lax.all_gather(w, "fsdp", tiled=True)
    g = jax.grad(_loss)(w_full, x, y)
    g = lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True) / lax.axis_size("fsdp")
    return _adam(w, g, m, v)


def fsdp_adam_explicit_scatter_dim1(w, m, v, x, y):
    w_full = lax.all_gather(w, "fsdp", tiled=True)
    g = jax.grad(_loss)(w_full, x, y)
    g = lax.psum_scatter(g.reshape(4, -1, g.shape[1]), "fsdp", scatter_dimension=1,  # BUG
                         tiled=True).reshape(w.shape) / lax.axis_size("fsdp")
    return _adam(w, g, m, v)


def _fsdp_loss(w, x, y):
    return lax.pmean(_loss(lax.all_gather(w, "fsdp", tiled=True), x, y), "fsdp")


def fsdp_adam_autodiff(w, m, v, x, y):
    """The shard_map notebook's FSDP: jax.grad of the pmean'd loss of the gathered params
    (the all_gather transposes to a psum_scatter, the pmean to the 1/n)."""
    return _adam(w, jax.grad(_fsdp_loss)(w, x, y), m, v)


def fsdp_adam_autodiff_mean_twice(w, m, v, x, y):
    g = jax.grad(_fsdp_loss)(w, x, y) / lax.axis_size("fsdp")  # BUG
    return _adam(w, g, m, v)


# ----- optax.clip_by_global_norm over sharded gradients -----------------------------------------

MAX_NORM = 1.0


def clip_ref(g_sharded, g_replicated):
    norm = jnp.sqrt(jnp.sum(g_sharded ** 2) + jnp.sum(g_replicated ** 2))
    scale = jnp.minimum(1.0, MAX_NORM / norm)
    return g_sharded * scale, g_replicated * scale


def _clip(g_sharded, g_replicated, *, reduce_sharded: bool, reduce_replicated: bool):
    sq_sharded = jnp.sum(g_sharded ** 2)
    sq_replicated = jnp.sum(g_replicated ** 2)
    if reduce_sharded:
        sq_sharded = lax.psum(sq_sharded, "fsdp")
    if reduce_replicated:
        sq_replicated = lax.psum(sq_replicated, "fsdp")
    norm = jnp.sqrt(sq_sharded + sq_replicated)
    scale = jnp.minimum(1.0, MAX_NORM / norm)
    return g_sharded * scale, g_replicated * scale


def clip_global_norm(g_sharded, g_replicated):
    return _clip(g_sharded, g_replicated, reduce_sharded=True, reduce_replicated=False)


def clip_global_norm_local(g_sharded, g_replicated):
    return _clip(g_sharded, g_replicated, reduce_sharded=False,  # BUG
                 reduce_replicated=False)


def clip_global_norm_replicated_summed(g_sharded, g_replicated):
    return _clip(g_sharded, g_replicated, reduce_sharded=True,
                 reduce_replicated=True)  # BUG


# ----- Megatron-LM sequence parallelism: norm-weight gradients all-reduced over tp --------------

def _rms(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def _sp_loss(g, w, x, count):
    return jnp.sum(jnp.tanh(_rms(x, g) @ w) ** 2) / count


def sp_norm_grads_ref(g, w, x):
    return jax.grad(_sp_loss, argnums=(0, 1))(g, w, x, x.shape[0] * x.shape[1])


def _sp_norm_grads(g, w, x, *, reduce_gain: bool):
    count = x.shape[0] * x.shape[1] * lax.axis_size("tp")
    dg, dw = jax.grad(_sp_loss, argnums=(0, 1))(g, w, x, count)
    if reduce_gain:
        dg = lax.psum(dg, "tp")
    return dg, lax.psum(dw, "tp")


def sp_norm_grads(g, w, x):
    return _sp_norm_grads(g, w, x, reduce_gain=True)


def sp_norm_grads_gain_not_reduced(g, w, x):
    return _sp_norm_grads(g, w, x, reduce_gain=False)  # BUG


# ----- data x tensor parallel SGD step (Megatron MLP under jax.grad, pmean over data) ----------

def _mlp(w1, w2, x):
    return jax.nn.relu(x @ w1) @ w2


def dp_tp_sgd_ref(w1, w2, x, y):
    loss = lambda a, b: jnp.mean((_mlp(a, b, x) - y) ** 2)
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def _dp_tp_sgd(w1, w2, x, y, *, reduce):
    def loss(a, b):
        out = lax.psum(jax.nn.relu(x @ a) @ b, "model")
        return jnp.mean((out - y) ** 2)

    w1v, w2v = lax.pcast(w1, "data", to="varying"), lax.pcast(w2, "data", to="varying")
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1v, w2v)
    g1, g2 = reduce(g1, "data"), reduce(g2, "data")
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def dp_tp_sgd(w1, w2, x, y):
    return _dp_tp_sgd(w1, w2, x, y, reduce=lax.pmean)


def dp_tp_sgd_psum_not_pmean(w1, w2, x, y):
    return _dp_tp_sgd(w1, w2, x, y, reduce=lax.psum)  # BUG


# ----- FSDP over scanned layers (MaxText scan_layers): gather each layer inside the scan --------

def _stack_loss(ws, x, y, gather):
    def layer(h, w):
        return jnp.tanh(h @ gather(w)), None

    h, _ = lax.scan(layer, x, ws)
    return jnp.sum((h - y) ** 2) / x.shape[0]


def scanned_grads_ref(ws, x, y):
    return jax.grad(_stack_loss)(ws, x, y, lambda w: w)


def _scanned_fsdp_grads(ws, x, y, reduce):
    gather = lambda w: lax.all_gather(w, "fsdp", axis=0, tiled=True)
    return jax.grad(lambda p: reduce(_stack_loss(p, x, y, gather), "fsdp"))(ws)


def scanned_fsdp_grads(ws, x, y):
    return _scanned_fsdp_grads(ws, x, y, lax.pmean)


def scanned_fsdp_grads_loss_psummed(ws, x, y):
    return _scanned_fsdp_grads(ws, x, y, lax.psum)  # BUG


# ----- the corpus -----------------------------------------------------------------------------

def programs() -> list[Example]:
    zero = (f32((16, 8), P(), "weight"), f32((16, 8), P("data")),
            f32((16, 8), P("data"), "positive"), f32((32, 16), P("data")),
            f32((32, 8), P("data")))
    zero_out = (P(), P("data"), P("data"))
    fsdp = (f32((16, 8), P("fsdp"), "weight"), f32((16, 8), P("fsdp")),
            f32((16, 8), P("fsdp"), "positive"), f32((32, 16), P("fsdp")),
            f32((32, 8), P("fsdp")))
    fsdp_out = (P("fsdp"), P("fsdp"), P("fsdp"))
    clip = (f32((16, 8), P("fsdp")), f32((8,)))
    sp = (f32((16,), P(), "positive"), f32((16, 8), P(), "weight"),
          f32((2, 16, 16), P(None, "tp", None)))
    dptp = (f32((16, 32), P(None, "model"), "weight"), f32((32, 8), P("model", None), "weight"),
            f32((16, 16), P("data")), f32((16, 8), P("data")))
    z = ("ZeRO stage 2 Adam (DeepSpeed ZeRO; Megatron-LM distributed optimizer): params "
         "replicated, grads psum_scatter'd (mean), Adam moments sharded, updated shards "
         "all_gather'd")
    z1 = ("ZeRO-1 as Megatron-LM's distributed optimizer: pmean the gradient, slice this "
          "rank's rows, all_gather the updated params")
    f = "ZeRO-3 / FSDP Adam: all_gather params, grad, psum_scatter (mean), Adam on the shard"
    fa = ("FSDP Adam as in the shard_map notebook: jax.grad of the pmean'd loss of all_gather'd "
          "params (autodiff inserts the psum_scatter)")
    c = ("optax.clip_by_global_norm over FSDP-sharded and replicated gradients: psum of the "
         "sharded squares only")
    s = ("Megatron-LM sequence parallelism: RMSNorm on sequence shards, norm-weight and "
         "projection gradients all-reduced over tp (Megatron-LM issue #443)")
    d = "data x tensor parallel SGD step: Megatron MLP (psum over model) under jax.grad, pmean over data"
    scan = (f32((3, 16, 16), P(None, "fsdp", None), "weight"), f32((32, 16), P("fsdp")),
            f32((32, 16), P("fsdp")))
    sc = ("FSDP over scanned layers (MaxText scan_layers): jax.grad of the pmean'd loss, each "
          "layer's weight all_gather'd inside lax.scan")
    return [
        _p("scanned_fsdp_grads", FSDP4, scanned_grads_ref, scanned_fsdp_grads, scan,
           P(None, "fsdp", None), sc),
        _p("scanned_fsdp_grads", FSDP4, scanned_grads_ref, scanned_fsdp_grads_loss_psummed,
           scan, P(None, "fsdp", None), sc, bug="loss_psummed_not_pmeaned", check_vma=True),
        _p("zero_adam", DATA4, adam_step_ref, zero_adam, zero, zero_out, z, check_vma=False),
        _p("zero_adam", DATA4, adam_step_ref, zero_adam_summed, zero, zero_out, z,
           bug="grads_summed_not_averaged"),
        _p("zero_adam", DATA4, adam_step_ref, zero_adam_local_grads, zero, zero_out, z,
           bug="local_grads_not_reduced"),
        _p("zero_adam", DATA4, adam_step_ref, zero_adam_next_shard, zero, zero_out, z,
           bug="param_shard_of_next_rank"),
        _p("zero1_adam_allreduce", DATA4, adam_step_ref, zero1_adam_allreduce, zero, zero_out,
           z1, check_vma=False),
        _p("zero1_adam_allreduce", DATA4, adam_step_ref, zero1_adam_allreduce_grad_rows_of_rank0,
           zero, zero_out, z1, bug="grad_rows_of_rank0"),
        _p("fsdp_adam_explicit", FSDP4, adam_step_ref, fsdp_adam_explicit, fsdp, fsdp_out, f,
           check_vma=False),
        _p("fsdp_adam_explicit", FSDP4, adam_step_ref, fsdp_adam_explicit_scatter_dim1, fsdp,
           fsdp_out, f, bug="scatter_along_wrong_dim"),
        _p("fsdp_adam_autodiff", FSDP4, adam_step_ref, fsdp_adam_autodiff, fsdp, fsdp_out, fa),
        _p("fsdp_adam_autodiff", FSDP4, adam_step_ref, fsdp_adam_autodiff_mean_twice, fsdp,
           fsdp_out, fa, bug="mean_taken_twice", check_vma=True),
        _p("clip_global_norm", FSDP4, clip_ref, clip_global_norm, clip, (P("fsdp"), P()), c),
        _p("clip_global_norm", FSDP4, clip_ref, clip_global_norm_local, clip,
           (P("fsdp"), P()), c, bug="local_norm_only"),
        _p("clip_global_norm", FSDP4, clip_ref, clip_global_norm_replicated_summed, clip,
           (P("fsdp"), P()), c, bug="replicated_norm_summed"),
        _p("sp_norm_grads", TP4, sp_norm_grads_ref, sp_norm_grads, sp, (P(), P()), s,
           check_vma=False),
        _p("sp_norm_grads", TP4, sp_norm_grads_ref, sp_norm_grads_gain_not_reduced, sp,
           (P(), P()), s, bug="gain_grad_not_all_reduced"),
        _p("dp_tp_sgd", DP_TP, dp_tp_sgd_ref, dp_tp_sgd, dptp, (P(None, "model"),
           P("model", None)), d),
        _p("dp_tp_sgd", DP_TP, dp_tp_sgd_ref, dp_tp_sgd_psum_not_pmean, dptp,
           (P(None, "model"), P("model", None)), d, bug="psum_not_pmean", check_vma=True),
    ]
