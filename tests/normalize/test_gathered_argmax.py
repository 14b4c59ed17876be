"""The gathered argmax (`normalize/idioms.py`, `_gathered_argmax`), grounded by execution.

jnp.argmax over a split dim as XLA partitions it, and as a shard_map program spells it (each
device's argmax with global indices, the (value, index) answers all-gathered, the argmax of the
answers): proven, the rewrite being argmax over the gathered candidates. With the indices left
local to each block, or the answers combined with argmin, the programs compute other numbers
and are not proven.
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
from tests.rules.grounding import ArgDef, assert_bug, assert_correct, pair

MESH = (("tp", 4),)
X = ArgDef("logits", (8, 64), "float32", "data", P(None, "tp"))


def _ties(seed: int = 0) -> list[np.ndarray]:
    return [np.random.default_rng(seed).integers(0, 5, (8, 64)).astype(np.float32)]


def ref_argmax(x):
    return jnp.argmax(x, axis=-1)


def _argmax_pairs(x, idx, direction: str = "GT"):
    def comb(a, b):
        (v, i), (w, j) = a, b
        better = (v > w) if direction == "GT" else (v < w)
        picked = better | jnp.isnan(v)
        return jnp.where(picked, v, w), jnp.where(picked | ((v == w) & (i < j)), i, j)

    init = np.float32(-np.inf if direction == "GT" else np.inf)
    return lax.reduce((x, idx), (init, np.int32(0)), comb, (1,))


def _sharded(offset: bool, combine: str = "GT"):
    def body(x):
        idx = lax.broadcasted_iota(jnp.int32, x.shape, 1)
        if offset:
            idx = idx + x.shape[1] * lax.axis_index("tp")
        v, i = _argmax_pairs(x, idx)
        vs = lax.all_gather(v[:, None], "tp", axis=1, tiled=True)
        js = lax.all_gather(i[:, None], "tp", axis=1, tiled=True)
        return _argmax_pairs(vs, js, combine)[1]

    return body


def test_xla_partitioned_argmax_over_the_split_vocab_is_proven():
    mesh = jax.make_mesh((4,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
    aval = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "tp")))
    fn = jax.jit(ref_argmax, out_shardings=NamedSharding(mesh, P()))
    report = check_partitioned(fn, aval)
    assert report.proven, report.render_text()


def test_xla_partitioned_argmax_with_local_indices_is_not_proven():
    """XLA's program with the device offset dropped from the indices (block-local answers)."""
    mesh = jax.make_mesh((4,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
    aval = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "tp")))
    fn = jax.jit(ref_argmax, out_shardings=NamedSharding(mesh, P()))
    ref_text, program = lower_partitioned(fn, aval)
    text = str(parse_module(program))
    offset = re.search(r"(%\d+) = stablehlo.add (%\d+), (%\d+) : tensor<16xi32>", text)
    assert offset, text
    local = text.replace(f"{offset.group(1)} = stablehlo.add {offset.group(2)}, "
                         f"{offset.group(3)} : tensor<16xi32>",
                         f"{offset.group(1)} = stablehlo.add {offset.group(2)}, "
                         f"{offset.group(2)} : tensor<16xi32>")  # 2 * iota: not the offset
    x = _ties()[0]
    want = expected_per_device(local, [np.asarray(ref_argmax(x))])
    got = run_per_device(local, x)
    assert any(not np.array_equal(g[0], w[0]) for g, w in zip(got, want))
    report = check_texts(ref_text, local, verify_rules=False)
    assert not report.proven, report.render_text()


def test_shard_map_argmax_of_gathered_answers_is_proven():
    assert_correct(pair("argmax_gathered", MESH, ref_argmax, _sharded(True), (X,), P()),
                   [_ties(0), _ties(1)], tol=0)


def test_shard_map_argmax_with_block_local_indices_is_not_proven():
    assert_bug(pair("argmax_gathered_local", MESH, ref_argmax, _sharded(False), (X,), P(),
                    bug=True), [_ties(0)], tol=0.5)


def test_shard_map_answers_combined_with_argmin_are_not_proven():
    normal = [np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)]
    assert_bug(pair("argmax_gathered_argmin", MESH, ref_argmax, _sharded(True, "LT"), (X,),
                    P(), bug=True), [normal], tol=0.5)
