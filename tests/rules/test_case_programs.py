"""case (lax.switch / lax.cond) on whole programs, grounded by execution on simulated CPU
devices: every branch read whole, the results selected by the index.

On an index every device reads alike (an argument, a psum'd statistic) the layout tier relates
the branches' results; with the branches reordered, or a psum missing in one branch, the
programs differ and are not proven. lax.cond on each device's own block (a partial value as
the predicate) is per-device by design: the general tier proves it, and the same program with
`all` for `any` is not proven.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.jax import check_partitioned
from tests.rules.grounding import ArgDef, assert_bug, assert_correct, pair

XY = (("x", 2), ("y", 2))
TP = (("tp", 4),)
N = ArgDef("n", (), "int32", "tokens", P(), high=3)
X8 = ArgDef("x", (8,), "float32", "data", P("x"))
X = ArgDef("x", (8, 16), "float32", "data", P(None, "tp"))
W = ArgDef("w", (16, 8), "float32", "weight", P("tp", None), fan_in=16)
FLAG = ArgDef("flag", (), "int32", "tokens", P(), high=2)


def _switch_inputs() -> list[list[np.ndarray]]:
    x = np.random.default_rng(3).standard_normal(8).astype(np.float32)
    return [[np.int32(k), x] for k in range(3)]


def ref_switch(n, x):
    return lax.switch(n, [lambda x: x, lambda x: x + 1, lambda x: x * 2], x)


def switch(n, x):
    return lax.switch(n, [lambda x: x, lambda x: x + 1, lambda x: x * 2], x)


def switch_reordered(n, x):
    return lax.switch(n, [lambda x: x, lambda x: x * 2, lambda x: x + 1], x)  # BUG


def _matmul_inputs() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = (rng.standard_normal((16, 8)) / 4).astype(np.float32)
    return [[np.int32(k), x, w] for k in (0, 1)]


def ref_cond_matmul(flag, x, w):
    return lax.cond(flag > 0, lambda: jnp.tanh(x @ w), lambda: -(x @ w))


def cond_psum_in_branches(flag, x, w):
    return lax.cond(flag > 0, lambda: jnp.tanh(lax.psum(x @ w, "tp")),
                    lambda: -lax.psum(x @ w, "tp"))


def cond_psum_missing_in_one_branch(flag, x, w):
    return lax.cond(flag > 0, lambda: jnp.tanh(x @ w),  # BUG: tanh of a partial sum
                    lambda: -lax.psum(x @ w, "tp"))


def _cond_inputs() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(8).astype(np.float32)
    x[:4] = -np.abs(x[:4])  # the first block has no positive element
    x[4:] = np.abs(x[4:])  # the second block is all positive
    y = rng.standard_normal(8).astype(np.float32)
    y[2] = -1.0  # a block with a positive and a negative element
    y[3] = 1.0
    return [[x], [y]]


def ref_cond_per_block(x):
    blocks = x.reshape(2, 4)
    positive = jnp.any(blocks > 0, axis=1, keepdims=True)
    return jnp.where(positive, blocks, blocks + 1).reshape(-1)


def cond_on_own_block(x):
    return lax.cond(jnp.any(x > 0), lambda x: x, lambda x: x + 1, x)


def cond_on_own_block_all(x):
    return lax.cond(jnp.all(x > 0), lambda x: x, lambda x: x + 1, x)  # BUG: all, not any


def test_switch_on_a_replicated_index_is_proven():
    assert_correct(pair("switch", XY, ref_switch, switch, (N, X8), P("x")), _switch_inputs(),
                   tol=0)


def test_switch_with_branches_reordered_is_not_proven():
    assert_bug(pair("switch_reordered", XY, ref_switch, switch_reordered, (N, X8), P("x"),
                    bug=True), _switch_inputs(), tol=1e-3, contains="which the reference never")


def test_cond_with_a_psum_in_each_branch_is_proven():
    assert_correct(pair("cond_psum", TP, ref_cond_matmul, cond_psum_in_branches, (FLAG, X, W),
                        P()), _matmul_inputs())


def test_cond_with_a_psum_missing_in_one_branch_is_not_proven():
    assert_bug(pair("cond_psum_missing", TP, ref_cond_matmul, cond_psum_missing_in_one_branch,
                    (FLAG, X, W), P(), bug=True), _matmul_inputs(),
               contains="nonlinear op tanh applied to a partial sum")


def test_cond_on_each_devices_own_block_is_proven_by_the_general_tier():
    assert_correct(pair("cond_own_block", (("x", 2),), ref_cond_per_block, cond_on_own_block,
                        (X8,), P("x")), _cond_inputs(), tol=0, tier="general")


def test_cond_on_own_block_with_all_for_any_is_not_proven():
    assert_bug(pair("cond_own_block_all", (("x", 2),), ref_cond_per_block,
                    cond_on_own_block_all, (X8,), P("x"), bug=True), _cond_inputs(), tol=0.5)


def test_xla_partitions_a_cond_on_a_replicated_predicate():
    mesh = jax.make_mesh((4,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
    flag = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P("tp")))

    def f(flag, x):
        return lax.cond(flag > 0, lambda: jnp.tanh(x), lambda: x * 2)

    report = check_partitioned(jax.jit(f, out_shardings=NamedSharding(mesh, P("tp"))), flag, x)
    assert report.proven, report.render_text()
