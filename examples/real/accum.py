"""Data parallelism with a token mask: per-token normalisation, gradient accumulation.

The loss is the mean over the *valid* tokens of the whole batch (a 0/1 mask with a different
number of valid tokens on every shard and in every micro-batch):

    loss = sum(token_loss * mask) / sum(mask)

The correct programs normalise by the global valid-token count (psum over dp, summed over
micro-batches); the buggy twins normalise per shard or per micro-batch, which only agrees when
every shard / micro-batch happens to hold the same number of valid tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .catalog import Example, custom
from .models import llama, train
from .models.config import LLAMA3
from .models.par import Par
from .models.params import ParamDef, spec, unflatten
from .programs import ArgDef, param_args

CFG = LLAMA3
DEFS: list[ParamDef] = [pd for pd in llama.param_defs(CFG) if pd.stacked]
N = len(DEFS)
DP = "dp"
MICRO = 2  # micro-batches per step


def token_losses(params: dict, x: jax.Array, y: jax.Array, par: Par) -> jax.Array:
    h = llama.stack(params, x, CFG, par)
    return 0.5 * jnp.sum(jnp.square(h - y), axis=-1)


def _step(params: dict, grads: dict, loss) -> tuple:
    new = train.sgd(params, grads)
    return (loss, *[new[pd.name] for pd in DEFS])


def masked_ref(*args):
    params, (x, y, mask) = unflatten(DEFS, args[:N]), args[N:]

    def loss_fn(p):
        return jnp.sum(token_losses(p, x, y, Par()) * mask) / jnp.sum(mask)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return _step(params, grads, loss)


def dp_per_token(*args):
    """DP: local sum of masked token losses over the global valid count; psum the gradients."""
    params, (x, y, mask) = unflatten(DEFS, args[:N]), args[N:]
    par = Par(dp=DP)
    count = lax.psum(jnp.sum(mask), DP)

    def loss_fn(p):
        return jnp.sum(token_losses(p, x, y, par) * mask) / count

    loss, grads = jax.value_and_grad(loss_fn)(params)
    grads = {k: lax.psum(g, DP) for k, g in grads.items()}
    return _step(params, grads, lax.psum(loss, DP))


def dp_per_shard_mean(*args):
    """DP averaging each shard's own masked mean: wrong when shards hold unequal valid counts."""
    params, (x, y, mask) = unflatten(DEFS, args[:N]), args[N:]
    par = Par(dp=DP)

    def loss_fn(p):
        return jnp.sum(token_losses(p, x, y, par) * mask) / jnp.sum(mask)  # BUG

    loss, grads = jax.value_and_grad(loss_fn)(params)
    grads = {k: lax.pmean(g, DP) for k, g in grads.items()}
    return _step(params, grads, lax.pmean(loss, DP))


def accum_per_token(*args):
    """DP with gradient accumulation over micro-batches, normalised by the global valid count."""
    params, (x, y, mask) = unflatten(DEFS, args[:N]), args[N:]
    par = Par(dp=DP)
    count = lax.psum(jnp.sum(mask), DP)
    mb = x.shape[0] // MICRO
    loss = jnp.float32(0.0)
    grads = jax.tree.map(jnp.zeros_like, params)
    for i in range(MICRO):
        xs, ys, ms = x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb], mask[i * mb:(i + 1) * mb]

        def loss_fn(p, xs=xs, ys=ys, ms=ms):
            return jnp.sum(token_losses(p, xs, ys, par) * ms) / count

        l_i, g_i = jax.value_and_grad(loss_fn)(params)
        loss = loss + l_i
        grads = jax.tree.map(jnp.add, grads, g_i)
    grads = {k: lax.psum(g, DP) for k, g in grads.items()}
    return _step(params, grads, lax.psum(loss, DP))


def accum_per_microbatch(*args):
    """Gradient accumulation normalising every micro-batch by its own valid count."""
    params, (x, y, mask) = unflatten(DEFS, args[:N]), args[N:]
    par = Par(dp=DP)
    mb = x.shape[0] // MICRO
    loss = jnp.float32(0.0)
    grads = jax.tree.map(jnp.zeros_like, params)
    for i in range(MICRO):
        xs, ys, ms = x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb], mask[i * mb:(i + 1) * mb]

        def loss_fn(p, xs=xs, ys=ys, ms=ms):
            return jnp.sum(token_losses(p, xs, ys, par) * ms) / jnp.sum(ms) / MICRO  # BUG

        l_i, g_i = jax.value_and_grad(loss_fn)(params)
        loss = loss + l_i
        grads = jax.tree.map(jnp.add, grads, g_i)
    grads = {k: lax.pmean(g, DP) for k, g in grads.items()}
    return _step(params, grads, lax.pmean(loss, DP))


def _args(par: Par) -> tuple[ArgDef, ...]:
    B, S, D = CFG.batch, CFG.seq, CFG.d_model
    data = P(DP, None, None)
    return (*param_args(DEFS, par),
            ArgDef("x", (B, S, D), "float32", "data", data),
            ArgDef("y", (B, S, D), "float32", "data", data),
            ArgDef("mask", (B, S), "float32", "mask", P(DP, None)))


def accum_programs() -> tuple[list[Example], list[Example]]:
    """(correct programs, buggy programs) on a dp=2 mesh (4 sequences per device)."""
    par = Par(dp=DP)
    args = _args(par)
    out = (P(), *[spec(pd, par) for pd in DEFS])
    mesh = ((DP, 2),)
    common = {"model": "llama3", "style": "dp (masked)", "task": "stack_sgd"}
    correct = [
        custom("llama3_masked_sgd", mesh, masked_ref, dp_per_token, args, out,
               "Masked loss under DP: per-token normalisation by the global valid count",
               **common),
        custom("llama3_masked_accum_sgd", mesh, masked_ref, accum_per_token, args, out,
               "Gradient accumulation over 2 micro-batches, per-token normalisation", **common),
    ]
    buggy = [
        custom("llama3_masked_sgd_per_shard_mean", mesh, masked_ref, dp_per_shard_mean, args,
               out, "Each dp shard averages its own masked mean (unequal valid counts)",
               bug="per_shard_mean_unequal_tokens", bug_fn=dp_per_shard_mean, **common),
        custom("llama3_masked_accum_sgd_per_microbatch", mesh, masked_ref, accum_per_microbatch,
               args, out, "Gradient accumulation normalised per micro-batch, not per token",
               bug="grad_accum_per_microbatch", bug_fn=accum_per_microbatch, **common),
    ]
    return correct, buggy
