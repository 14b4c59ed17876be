"""One training step: value_and_grad inside shard_map, gradient synchronisation, SGD or AdamW.

Megatron / DDP style (`par.megatron`): each device differentiates the mean loss over its own
tokens; afterwards gradients are synchronised explicitly (`sync_grads`):

* under sequence parallelism, parameters replicated over tp (norm weights, biases added after a
  reduce-scatter, positions, the router) saw only their shard of the sequence: psum over tp;
  so did replicated parameters applied to tp-split heads (a per-head norm weight shared by
  all heads, role `head_shared`), with or without sequence parallelism;
* over the data axes (dp, cp, ep) gradients are averaged (pmean); expert weights under ep and
  every weight under FSDP already arrive summed over the data ranks (by the all_to_all / the
  reduce_scatter that transposes the weight all_gather), so they are only divided.

jax-native style (`check_vma=True`): the loss is pmean'd over the data axes inside the
differentiated function and jax inserts every gradient reduction itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .par import Par
from .params import ParamDef, is_expert, spec

Array = jax.Array

LR = 1.0
ADAM = {"lr": 1e-2, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "wd": 0.01}
CLIP = 0.5  # below the gradient norm of the test inputs, so that clipping is active


def split_axes(pd: ParamDef, par: Par) -> tuple[str, ...]:
    """The mesh axes a parameter is split over."""
    out = []
    for entry in spec(pd, par):
        if entry is None:
            continue
        out.extend(entry if isinstance(entry, tuple) else (entry,))
    return tuple(out)


def sync_grads(grads: dict, defs: list[ParamDef], par: Par) -> dict:
    """Megatron / DDP gradient synchronisation (see the module docstring)."""
    out = {}
    for pd in defs:
        g = grads[pd.name]
        if (par.tp and (par.sp or pd.role == "head_shared")
                and par.tp not in split_axes(pd, par)):
            g = lax.psum(g, par.tp)
        for axis in (par.dp, par.cp, par.ep):
            if not axis:
                continue
            if axis == par.ep and is_expert(pd):
                g = g / lax.axis_size(axis)
            else:
                g = lax.pmean(g, axis)
        if par.fsdp:
            g = g / lax.axis_size(par.fsdp)
        out[pd.name] = g
    return out


def average_loss(loss: Array, par: Par) -> Array:
    for axis in par.data_axes:
        loss = lax.pmean(loss, axis)
    return loss


def loss_and_grads(loss_fn, params: dict, defs: list[ParamDef], par: Par, sync=None):
    """(loss averaged over the whole batch, synchronised gradients)."""
    if par.megatron:
        loss, grads = jax.value_and_grad(loss_fn)(params)
        return average_loss(loss, par), (sync or sync_grads)(grads, defs, par)
    return jax.value_and_grad(lambda p: average_loss(loss_fn(p), par))(params)


def sgd(params: dict, grads: dict, lr: float = LR) -> dict:
    return {k: params[k] - lr * grads[k] for k in params}


def global_norm(grads: dict, defs: list[ParamDef], par: Par) -> Array:
    """L2 norm of all gradients: each parameter's sum of squares psum'd over its split axes."""
    total = jnp.float32(0.0)
    for pd in defs:
        sq = jnp.sum(jnp.square(grads[pd.name]))
        axes = split_axes(pd, par)
        if axes:
            sq = lax.psum(sq, axes)
        total = total + sq
    return jnp.sqrt(total)


def clip(grads: dict, defs: list[ParamDef], par: Par, max_norm: float = CLIP,
         norm=None) -> dict:
    """Scale all gradients down so that their global norm is at most `max_norm`."""
    scale = jnp.minimum(1.0, max_norm / ((norm or global_norm)(grads, defs, par) + 1e-6))
    return {k: g * scale for k, g in grads.items()}


def adamw(params: dict, grads: dict, m: dict, v: dict, step: int = 1, lr: float = ADAM["lr"],
          b1: float = ADAM["b1"], b2: float = ADAM["b2"], eps: float = ADAM["eps"],
          wd: float = ADAM["wd"]) -> tuple[dict, dict, dict]:
    """AdamW (decoupled weight decay) at step `step` with bias correction."""
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k]
        new_m[k] = b1 * m[k] + (1 - b1) * g
        new_v[k] = b2 * v[k] + (1 - b2) * g * g
        m_hat = new_m[k] / (1 - b1**step)
        v_hat = new_v[k] / (1 - b2**step)
        new_p[k] = p - lr * (m_hat / (jnp.sqrt(v_hat) + eps) + wd * p)
    return new_p, new_m, new_v
