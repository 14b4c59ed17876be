"""The models of Flax's sharding guides ("Scale up on multiple devices",
flax.readthedocs.io/en/latest/guides/flax_gspmd.html, and the Linen "Scale up Flax Modules on
multiple devices" guide with logical axis rules and nn.scan), written in plain JAX (Flax is not a
dependency): the DotReluDot block with its variables annotated ('data', 'model'), its SGD train
step, the scanned stack of blocks, the FSDP layout, all jitted with shardings (XLA partitions
them), and the same block written by hand with shard_map.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .corpus import Example, f32, program

MESH = (("data", 2), ("model", 4))
GUIDE = "Flax sharding guide"


def _p(prog: str, reference, body, args, out, section: str, **kw) -> Example:
    return program("flax_guide", prog, MESH, reference, body, args, out, f"{GUIDE}, {section}",
                   **kw)


def _no_constraint(y, *spec):
    return y


def _constrainer(mesh):
    def constrain(y, *spec):
        return lax.with_sharding_constraint(y, NamedSharding(mesh, P(*spec)))
    return constrain


def dot_relu_dot(x, w1, w2, constrain=_no_constraint):
    y = jax.nn.relu(x @ w1)
    y = constrain(y, "data", "model")
    return y @ w2


def mse_loss(w1, w2, x, target, constrain=_no_constraint):
    return jnp.mean((dot_relu_dot(x, w1, w2, constrain) - target) ** 2)


def train_step(w1, w2, x, target, constrain=_no_constraint):
    loss, (g1, g2) = jax.value_and_grad(mse_loss, argnums=(0, 1))(w1, w2, x, target, constrain)
    return w1 - 0.05 * g1, w2 - 0.05 * g2, loss


def scanned_blocks(x, w1s, w2s, constrain=_no_constraint):
    def layer(h, ws):
        w1, w2 = ws
        return dot_relu_dot(h, w1, w2, constrain), None

    out, _ = lax.scan(layer, x, (w1s, w2s))
    return out


def manual_dot_relu_dot(x, w1, w2):
    y = jax.nn.relu(x @ w1)
    return lax.psum(y @ w2, "model")


def manual_dot_relu_dot_wrong_axis(x, w1, w2):
    y = jax.nn.relu(x @ w1)
    return lax.psum(y @ w2, "data")  # BUG


def dot_relu_dot_bias(x, w1, w2, b2):
    return jax.nn.relu(x @ w1) @ w2 + b2


def manual_dot_relu_dot_bias(x, w1, w2, b2):
    y = jax.nn.relu(x @ w1)
    return lax.psum(y @ w2, "model") + b2


def manual_dot_relu_dot_bias_inside(x, w1, w2, b2):
    y = jax.nn.relu(x @ w1)
    return lax.psum(y @ w2 + b2, "model")  # BUG


def manual_dot_relu_dot_no_psum(x, w1, w2):
    y = jax.nn.relu(x @ w1)
    return y @ w2  # BUG


def _jit_form(f):
    """mesh -> `f` with its sharding constraints on that mesh."""
    return lambda mesh: (lambda *args: f(*args, constrain=_constrainer(mesh)))


def programs() -> list[Example]:
    drd = (f32((8, 16), P("data", None)), f32((16, 32), P(None, "model"), "weight"),
           f32((32, 16), P("model", None), "weight"))
    step = (drd[1], drd[2], drd[0], f32((8, 16), P("data", None)))
    scan = (f32((8, 16), P("data", None)), f32((3, 16, 32), P(None, None, "model"), "weight"),
            f32((3, 32, 16), P(None, "model", None), "weight"))
    fsdp = (f32((8, 16), P("data", None)), f32((16, 32), P("data", "model"), "weight"),
            f32((32, 16), P("model", "data"), "weight"))
    return [
        _p("dot_relu_dot", dot_relu_dot, _jit_form(dot_relu_dot), drd, P("data", None),
           "DotReluDot forward: kernels (None, 'model') / ('model', None), activations "
           "constrained to ('data', 'model')", partitioned=True),
        _p("dot_relu_dot_train_step", train_step, _jit_form(train_step), step,
           (P(None, "model"), P("model", None), P()),
           "the SGD train step (value_and_grad, update), params keep their shardings",
           partitioned=True),
        _p("scanned_dot_relu_dot", scanned_blocks, _jit_form(scanned_blocks), scan,
           P("data", None), "nn.scan over 3 DotReluDot layers, stacked kernels with a "
           "replicated layer axis (logical axis rules: 'layers' -> None)", partitioned=True),
        _p("dot_relu_dot_fsdp", dot_relu_dot, _jit_form(dot_relu_dot), fsdp, P("data", None),
           "the FSDP layout: kernels sharded over both 'data' and 'model'", partitioned=True),
        _p("manual_dot_relu_dot", dot_relu_dot, manual_dot_relu_dot, drd, P("data", None),
           "DotReluDot by hand with shard_map (the guide's manual-parallelism pointer)"),
        _p("manual_dot_relu_dot", dot_relu_dot, manual_dot_relu_dot_wrong_axis, drd,
           P("data", None), "DotReluDot by hand with shard_map", bug="psum_over_data"),
        _p("manual_dot_relu_dot", dot_relu_dot, manual_dot_relu_dot_no_psum, drd,
           P("data", None), "DotReluDot by hand with shard_map", bug="missing_psum"),
        _p("manual_dot_relu_dot_bias", dot_relu_dot_bias, manual_dot_relu_dot_bias,
           drd + (f32((16,), P()),), P("data", None),
           "DotReluDot with the second Linear's bias, by hand with shard_map"),
        _p("manual_dot_relu_dot_bias", dot_relu_dot_bias, manual_dot_relu_dot_bias_inside,
           drd + (f32((16,), P()),), P("data", None), "DotReluDot with a bias, by hand",
           bug="bias_added_before_psum"),
    ]
