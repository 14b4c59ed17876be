"""Boolean reductions (jnp.any / jnp.all: reduce with `or` / `and`) and integer max / min
reductions over split dims, on whole programs grounded by execution on 4 simulated devices.

Over a split dim each device reduces its block, a partial max (or; false < true) or min (and)
over the axes, completed by jax's pmax / pmin of the booleans (an all_reduce with `maximum` /
`minimum` on i1) or of the integers. The nearest wrong programs combine the blocks with the
other reduction, or leave the per-device answer as the result, and are not proven.
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

MESH = (("i", 4),)
X = ArgDef("x", (8, 16), "float32", "data", P(None, "i"))
IDS = ArgDef("ids", (8, 16), "int32", "tokens", P(None, "i"), high=1000)


def _floats(seed: int = 0) -> list[np.ndarray]:
    """Rows where a few, all or none of the elements are positive (any and all differ)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    x[0] = np.abs(x[0]) + 0.1  # all positive
    x[1] = -np.abs(x[1]) - 0.1  # none positive
    x[2] = -np.abs(x[2]) - 0.1
    x[2, 13] = 1.0  # one positive, in the last block
    x[3] = np.abs(x[3]) + 0.1
    x[3, 2] = -1.0  # all but one, in the first block
    return [x]


def _ints(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(-(2**31), 2**31 - 1, (8, 16), dtype=np.int64).astype(np.int32)
    ids[0] = np.iinfo(np.int32).min  # the identity of max itself
    ids[1] = np.iinfo(np.int32).max
    return [ids]


def ref_any(x):
    return jnp.any(x > 0, axis=1)


def ref_all(x):
    return jnp.all(x > 0, axis=1)


def any_pmax(x):
    return lax.pmax(jnp.any(x > 0, axis=1), "i")


def all_pmin(x):
    return lax.pmin(jnp.all(x > 0, axis=1), "i")


def any_pmin(x):
    return lax.pmin(jnp.any(x > 0, axis=1), "i")  # BUG


def all_pmax(x):
    return lax.pmax(jnp.all(x > 0, axis=1), "i")  # BUG


def any_local(x):
    return jnp.any(x > 0, axis=1)  # BUG


def none_pmin(x):
    return lax.pmin(~jnp.any(x > 0, axis=1), "i")


def ref_none(x):
    return ~jnp.any(x > 0, axis=1)


def any_as_int_pmax(x):
    return lax.pmax(jnp.any(x > 0, axis=1).astype(jnp.int32), "i") > 0


def ref_max(ids):
    return jnp.max(ids, axis=1)


def ref_min(ids):
    return jnp.min(ids, axis=1)


def max_pmax(ids):
    return lax.pmax(jnp.max(ids, axis=1), "i")


def min_pmin(ids):
    return lax.pmin(jnp.min(ids, axis=1), "i")


def max_pmin(ids):
    return lax.pmin(jnp.max(ids, axis=1), "i")  # BUG


def neg_max_pmin(ids):
    return -lax.pmax(jnp.max(ids, axis=1), "i")


def neg_pmin_of_neg(ids):
    return lax.pmin(-jnp.max(ids, axis=1), "i")  # BUG: -INT_MIN wraps to INT_MIN


def ref_neg_max(ids):
    return -jnp.max(ids, axis=1)


def test_any_over_a_split_dim_then_pmax_is_proven():
    assert_correct(pair("any_pmax", MESH, ref_any, any_pmax, (X,), P()), [_floats(0),
                                                                          _floats(1)], tol=0)


def test_all_over_a_split_dim_then_pmin_is_proven():
    assert_correct(pair("all_pmin", MESH, ref_all, all_pmin, (X,), P()), [_floats(0)], tol=0)


def test_not_any_then_pmin_is_proven():
    """not(or over the block) is a partial and: pmin completes it."""
    assert_correct(pair("none_pmin", MESH, ref_none, none_pmin, (X,), P()), [_floats(0)],
                   tol=0)


def test_any_as_an_integer_then_pmax_is_proven():
    """A boolean converted to 0/1 keeps its order: the partial max survives the convert; the
    layout tier ends with `convert(any) > 0` where the reference has `any` (the same values,
    another term), which the general tier decides."""
    assert_correct(pair("any_int_pmax", MESH, ref_any, any_as_int_pmax, (X,), P()),
                   [_floats(0)], tol=0, tier="general")


def test_any_combined_with_and_is_not_proven():
    assert_bug(pair("any_pmin", MESH, ref_any, any_pmin, (X,), P(), bug=True), [_floats(0)],
               tol=0.5, contains="the value is a partial max: the reduction kind is wrong")


def test_all_combined_with_or_is_not_proven():
    assert_bug(pair("all_pmax", MESH, ref_all, all_pmax, (X,), P(), bug=True), [_floats(0)],
               tol=0.5)


def test_any_of_the_block_alone_is_not_proven():
    """The missing pmax: every device answers for its own block (out_specs P() takes device
    0's)."""
    assert_bug(pair("any_local", MESH, ref_any, any_local, (X,), P(), bug=True),
               [_floats(0)], tol=0.5)


def test_integer_max_and_min_over_a_split_dim_are_proven():
    """The init of jax's integer max is the least int32, the identity of max: every device
    may start from it."""
    assert_correct(pair("int_max", MESH, ref_max, max_pmax, (IDS,), P()), [_ints(0)], tol=0)
    assert_correct(pair("int_min", MESH, ref_min, min_pmin, (IDS,), P()), [_ints(0)], tol=0)


def test_integer_max_combined_with_min_is_not_proven():
    assert_bug(pair("int_max_pmin", MESH, ref_max, max_pmin, (IDS,), P(), bug=True),
               [_ints(0)], tol=0.5)


def test_negated_partial_integer_max_is_not_taken_for_a_min():
    """-max over the devices is the reference's -max; min over devices of -max(block) is not
    when a block's max is the least int32 (its negation wraps to itself)."""
    assert_correct(pair("neg_max", MESH, ref_neg_max, neg_max_pmin, (IDS,), P()), [_ints(0)],
                   tol=0)
    ids = _ints(0)[0]
    ids[2, :] = 5
    ids[2, 4:8] = np.iinfo(np.int32).min  # block 1's max is the least int32
    assert_bug(pair("neg_pmin", MESH, ref_neg_max, neg_pmin_of_neg, (IDS,), P(), bug=True),
               [[ids]], tol=0.5)


def test_xla_partitions_any_over_a_split_dim():
    """XLA's own partitioning of jnp.any along a split dim: proven."""
    mesh = jax.make_mesh((4,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    aval = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P(None, "i")))
    for fn in (ref_any, ref_all, ref_max):
        arg = aval if fn is not ref_max else jax.ShapeDtypeStruct(
            (8, 16), jnp.int32, sharding=NamedSharding(mesh, P(None, "i")))
        report = check_partitioned(jax.jit(fn, out_shardings=NamedSharding(mesh, P())), arg)
        assert report.proven, report.render_text()
        assert report.stats.get("tier") == "layout", report.stats
