"""mhlo.topk (XLA's per-device spelling of top_k) on whole programs, grounded by execution.

XLA partitions lax.top_k over vocab-sharded logits by gathering the vocab first, over
row-sharded logits by selecting within each device's rows: both proven. The same per-device
program with the gather removed (each device picks among its own candidates) computes other
numbers and is not proven.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import (
    check_partitioned,
    expected_per_device,
    lower_partitioned,
    run_per_device,
)
from entangle_mlir.mlir.ir import parse_module


def top4(logits):
    return tuple(lax.top_k(logits, 4))


def _mesh():
    return jax.make_mesh((4,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))


def _jitted(spec: P):
    mesh = _mesh()
    aval = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, spec))
    return jax.jit(top4, out_shardings=(NamedSharding(mesh, P()),) * 2), aval


def _logits() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 6, (8, 64)).astype(np.float32)  # ties


def test_topk_over_vocab_sharded_logits_is_proven():
    fn, aval = _jitted(P(None, "tp"))
    report = check_partitioned(fn, aval)
    assert report.proven, report.render_text()
    assert "mhlo.topk" in str(parse_module(lower_partitioned(fn, aval)[1]))


def test_topk_over_row_sharded_logits_is_proven():
    mesh = _mesh()
    aval = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P("tp")))
    fn = jax.jit(top4, out_shardings=(NamedSharding(mesh, P("tp")),) * 2)
    report = check_partitioned(fn, aval)
    assert report.proven, report.render_text()


def test_topk_of_each_devices_own_candidates_is_not_proven():
    fn, aval = _jitted(P(None, "tp"))
    ref_text, program = lower_partitioned(fn, aval)
    text = str(parse_module(program))
    gathered = re.search(r"(%\d+) = \"stablehlo.all_gather\"\((%arg\d+)\)", text)
    assert gathered, text
    local = re.sub(r"mhlo.topk\(" + gathered.group(1) + r", k = 4\) : tensor<8x64xf32>",
                   f"mhlo.topk({gathered.group(2)}, k = 4) : tensor<8x16xf32>", text)
    assert local != text
    x = _logits()
    want = expected_per_device(local, [np.asarray(v) for v in top4(x)])
    got = run_per_device(local, x)
    assert any(not np.array_equal(g, w) for gd, wd in zip(got, want) for g, w in zip(gd, wd))
    report = check_texts(ref_text, local, verify_rules=False)
    assert not report.proven, report.render_text()
    assert "each device picks the top 4 of its own block" in report.render_text()
