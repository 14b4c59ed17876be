"""Whole-layer reuse after a vocab-parallel embedding.

The sharded embedding (mask, local lookup, psum) equals the reference's `take` only for valid
token ids, so the first layer's input meets the reference's under the valid-index assumption:
reuse takes it for the reference's input and the report states the assumption. Without the
mask the numbers differ (grounded by execution) and nothing is proven.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import lower_pair

LAYERS, VOCAB, D, S, TP = 5, 16, 8, 4, 2


def _layer(x, w1, w2, reduce):
    h = x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    return x + reduce(jnp.tanh(h @ w1) @ w2)


def _programs(masked: bool):
    mesh = jax.make_mesh((TP,), ("tp",), axis_types=(AxisType.Auto,))

    def reference(tokens, wte, *params):
        x = jnp.take(wte, tokens, axis=0)
        for i in range(LAYERS):
            x = _layer(x, params[2 * i], params[2 * i + 1], lambda v: v)
        return x

    def body(tokens, wte, *params):
        block = VOCAB // TP
        start = lax.axis_index("tp") * block
        outside = (tokens < start) | (tokens >= start + block)
        rows = jnp.take(wte, jnp.where(outside, 0, tokens - start), axis=0)
        if masked:
            rows = jnp.where(outside[:, None], 0.0, rows)
        x = lax.psum(rows, "tp")
        for i in range(LAYERS):
            x = _layer(x, params[2 * i], params[2 * i + 1], lambda v: lax.psum(v, "tp"))
        return x

    specs = (P(), P("tp", None)) + (P(None, "tp"), P("tp", None)) * LAYERS
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()))
    shapes = [(S,), (VOCAB, D)] + [(D, 2 * D), (2 * D, D)] * LAYERS
    dtypes = [jnp.int32] + [jnp.float32] * (len(shapes) - 1)
    avals = [jax.ShapeDtypeStruct(s, t, sharding=NamedSharding(mesh, spec))
             for s, t, spec in zip(shapes, dtypes, specs)]
    rng = np.random.default_rng(0)
    args = [np.array([1, 9, 15, 3], dtype=np.int32)] + [
        rng.standard_normal(s).astype(np.float32) / np.sqrt(s[0]) for s in shapes[1:]]
    placed = [jax.device_put(a, NamedSharding(mesh, spec)) for a, spec in zip(args, specs)]
    diff = float(np.max(np.abs(np.asarray(jax.jit(reference)(*args))
                               - np.asarray(sharded(*placed)))))
    return reference, sharded, avals, diff


@pytest.mark.parametrize("masked", [True, False])
def test_layers_after_a_vocab_parallel_embedding(masked: bool) -> None:
    reference, sharded, avals, diff = _programs(masked)
    report = check_texts(*lower_pair(reference, sharded, *avals))
    if masked:
        assert diff < 1e-4  # grounded: equal numbers
        assert report.proven, report.render_text()
        assert "layers reused" in report.stats
        assert any("valid indices" in note and "summarized layer" in note
                   for note in report.notes), report.notes
    else:
        assert diff > 1e-2  # grounded: the unmasked lookup adds other devices' rows
        assert not report.proven
        assert "layers reused" not in report.stats
