"""Diagnostics in the user's vocabulary (issue 20): a scale factor spelled with the program's
own constant (`0.1 (float32)`, not 13421773/134217728), grounded by running both programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import examples.catalog  # noqa: F401 - sets XLA_FLAGS (8 CPU devices) before jax starts
from entangle_mlir.jax import check

MESH = jax.make_mesh((4,), ("tp",))
SPECS = (P(None, "tp"), P("tp", None))
AVALS = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(MESH, p))
         for s, p in zip(((8, 16), (16, 8)), SPECS)]


def _reference(x, w):
    return x @ w


def _body(x, w):
    return 0.1 * jax.lax.psum(x @ w, "tp")   # BUG: a scale the reference does not have


def _sharded():
    return jax.jit(jax.shard_map(_body, mesh=MESH, in_specs=SPECS, out_specs=P()))


def test_grounding() -> None:
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(a.shape).astype(np.float32) for a in AVALS)
    want = np.asarray(jax.jit(_reference)(x, w), np.float64)
    got = np.asarray(_sharded()(*(jax.device_put(v, a.sharding) for v, a in zip((x, w), AVALS))),
                     np.float64)
    assert not np.allclose(want, got, rtol=1e-3)
    assert np.allclose(got, want * float(np.float32(0.1)), rtol=1e-5)


def test_factor_is_spelled_with_the_programs_constant() -> None:
    report = check(_reference, _sharded(), *AVALS, verify_rules=False)
    assert not report.proven
    message = report.diagnostics[0].message
    assert "value is 0.1 (float32) x what the reference computes here" in message, message
    assert "13421773" not in report.render_text()
