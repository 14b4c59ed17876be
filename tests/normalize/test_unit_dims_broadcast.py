"""jax's transposes of a broadcast with one sequence per device (issue 21, the DeepSeek-V3-like
row: ep 64 with a global batch of 64). Multi-head latent attention's RoPE key part is shared by
every head, `broadcast_to(k_pe[:, :, None, :], (b, s, heads, r))`; with a local batch of one
its gradient is `reduce` over the unit batch dim and the heads, put back as unit dims, then
`reduce` over the unit batch dim and the inserted dim, which drops the inserted one. Read as
reductions these sum over the split batch dim (a partial sum that is never psum'd); entangle-
normalize reads them as the reshapes they are (`unit_dims._puts_back`). A norm gain taken out
of a layer stack (`g[i]`) has its gradient reduced over the batch and sequence and then put
back into the stack by the transpose of `g[i]`: that unit dim is the layer slot, not the
batch, and stays a partial sum over dp (pmean'd by the program).

Grounded: both programs run on simulated CPU devices; the correct one matches its reference and
is proven, the buggy twin (the gain's gradient not averaged over dp) differs and is not."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import check, lower_pair

DP, SEQ, HEADS, R, LAYERS = 4, 8, 4, 4, 2


def loss(x, g, w):
    """A shared key part broadcast to every head, scaled by a gain from a layer stack."""
    k = jnp.broadcast_to((x * g[1])[:, :, None, :], (x.shape[0], SEQ, HEADS, R))
    return jnp.mean(jnp.square(k * w))


def reference(x, g, w):
    return jax.grad(loss, argnums=(0, 1))(x, g, w)


def sharded_body(x, g, w):
    dx, dg = jax.grad(loss, argnums=(0, 1))(x, g, w)
    n = lax.axis_size("dp")
    return dx / n, lax.pmean(dg, "dp")


def sharded_body_unsynced(x, g, w):
    dx, dg = jax.grad(loss, argnums=(0, 1))(x, g, w)
    n = lax.axis_size("dp")
    return dx / n, dg  # BUG: the gain's gradient is this device's share, not averaged over dp


def _case(body, sequences_per_device: int):
    mesh = jax.make_mesh((DP,), ("dp",), axis_types=(AxisType.Explicit,),
                         devices=jax.devices()[:DP])
    specs = (P("dp"), P(), P())
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs,
                                    out_specs=(P("dp"), P()), check_vma=False))
    shapes = [(DP * sequences_per_device, SEQ, R), (LAYERS, R), (HEADS, R)]
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
             for s, spec in zip(shapes, specs)]
    return sharded, avals


def _max_difference(sharded, avals) -> float:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(a.shape).astype(np.float32) for a in avals]
    want = jax.jit(reference)(*args)
    got = sharded(*(jax.device_put(x, a.sharding) for x, a in zip(args, avals)))
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(want, got))


@pytest.mark.parametrize("sequences", [1, 2], ids=["one_sequence", "two_sequences"])
def test_shared_key_gradient_matches_and_is_proven(sequences: int) -> None:
    """By the layout tier alone (the general tier proves it by expansion either way)."""
    sharded, avals = _case(sharded_body, sequences)
    assert _max_difference(sharded, avals) < 1e-6
    report = check_texts(*lower_pair(reference, sharded, *avals), general_tier=False)
    assert report.proven, report.render_text()


def test_unsynced_gain_gradient_differs_and_is_not_proven() -> None:
    sharded, avals = _case(sharded_body_unsynced, 1)
    assert _max_difference(sharded, avals) > 1e-3
    report = check(reference, sharded, *avals, evidence=False)
    assert not report.proven
