"""Vocab-parallel `take_along_axis` with one sequence per device (the Llama-3-8B `adamw` row of
the benchmark, dp 2 x tp 8 with a global batch of 2): jax squeezes the local unit batch dim out
of the indices and gathers it as an offset dim, so the indices' global view was the flattened
`(batch * seq)` one and the gather's batching dims disagreed (`gather: batching dim 1 of the
operand has 8 rows but the indices' dim 0 has 16`). entangle-normalize now reads that unit
offset dim as a batching dim (`unit_dims._fold_gather`).

Grounded: each program runs on simulated CPU devices against its reference; the correct one
matches and is proven, the buggy twin (the target logit taken without the outside-vocab mask)
differs and is not proven.
"""

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

from entangle_mlir.jax import check

DP, TP, SEQ, VOCAB_PER_DEVICE = 2, 2, 8, 4


def reference(logits, targets):
    return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]


def target_logit(logits, targets):
    """Megatron's vocab-parallel target logit: local lookup, zero outside the block, psum."""
    vl = logits.shape[-1]
    start = lax.axis_index("tp") * vl
    outside = (targets < start) | (targets >= start + vl)
    local = jnp.where(outside, 0, targets - start)
    picked = jnp.take_along_axis(logits, local[..., None], axis=-1)[..., 0]
    return lax.psum(jnp.where(outside, 0.0, picked), "tp")


def target_logit_unmasked(logits, targets):
    vl = logits.shape[-1]
    start = lax.axis_index("tp") * vl
    outside = (targets < start) | (targets >= start + vl)
    local = jnp.where(outside, 0, targets - start)
    picked = jnp.take_along_axis(logits, local[..., None], axis=-1)[..., 0]
    return lax.psum(picked, "tp")  # BUG: rows of other devices' vocab blocks are added


def reference_grad(logits, targets):
    return jax.grad(lambda x: jnp.sum(reference(x, targets)))(logits)


def target_logit_grad(logits, targets):
    """The gradient of the summed target logits (a scatter with batching dims)."""
    return jax.grad(lambda x: jnp.sum(target_logit(x, targets)))(logits)


PER_TOKEN = P("dp", None)
LOGITS = P("dp", None, "tp")


def _case(body, sequences_per_device: int, out_spec=PER_TOKEN, seq: int = SEQ):
    mesh = jax.make_mesh((DP, TP), ("dp", "tp"), axis_types=(AxisType.Explicit,) * 2,
                         devices=jax.devices()[:DP * TP])
    specs = (P("dp", None, "tp"), P("dp", None))
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_spec))
    batch = DP * sequences_per_device
    avals = [jax.ShapeDtypeStruct((batch, seq, VOCAB_PER_DEVICE * TP), jnp.float32,
                                  sharding=NamedSharding(mesh, specs[0])),
             jax.ShapeDtypeStruct((batch, seq), jnp.int32,
                                  sharding=NamedSharding(mesh, specs[1]))]
    return sharded, avals


def _max_difference(sharded, avals, reference=reference) -> float:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(avals[0].shape).astype(np.float32)
    targets = rng.integers(0, avals[0].shape[-1], avals[1].shape).astype(np.int32)
    want = np.asarray(jax.jit(reference)(logits, targets))
    got = np.asarray(sharded(jax.device_put(logits, avals[0].sharding),
                             jax.device_put(targets, avals[1].sharding)))
    return float(np.max(np.abs(want - got)))


@pytest.mark.parametrize("sequences, seq", [(1, SEQ), (2, SEQ), (1, 128)],
                         ids=["one_sequence", "two_sequences", "one_long_sequence"])
def test_vocab_parallel_target_logit_matches_and_is_proven(sequences: int, seq: int) -> None:
    """A long sequence makes the bounds check's instances large enough to be checked at a
    reduced shape (its squeezed indices, a transpose of unit dims, are resized)."""
    sharded, avals = _case(target_logit, sequences, seq=seq)
    assert _max_difference(sharded, avals) == 0.0
    report = check(reference, sharded, *avals, evidence=False)
    assert report.proven, report.render_text()


def test_unmasked_target_logit_differs_and_is_not_proven() -> None:
    sharded, avals = _case(target_logit_unmasked, 1)
    assert _max_difference(sharded, avals) > 1e-3
    report = check(reference, sharded, *avals, evidence=False)
    assert not report.proven


@pytest.mark.parametrize("sequences", [1, 2], ids=["one_sequence", "two_sequences"])
def test_vocab_parallel_target_logit_gradient_matches_and_is_proven(sequences: int) -> None:
    sharded, avals = _case(target_logit_grad, sequences, LOGITS)
    assert _max_difference(sharded, avals, reference_grad) == 0.0
    report = check(reference_grad, sharded, *avals, evidence=False)
    assert report.proven, report.render_text()
