"""argmax / argmin (a reduce over (values, indices) with jax's comparator), on whole programs
grounded by execution on simulated CPU devices.

The comparator region is read whole: jax's (the larger value, on ties the first index) is an
argmax, written by hand in another op order too; a region that keeps the last index on ties is
another function, and with tied inputs the programs differ: never proven. Over dims that are
not split the rows keep their split (proven by the layout tier); an argmax of each device's own
block by design is proven by the general tier, and the same blocks numbered globally are not.
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
X = ArgDef("x", (16, 32), "float32", "data", P("i", None))
IDS = ArgDef("ids", (16, 32), "int32", "tokens", P("i", None), high=5)


def _ties(seed: int = 0) -> list[np.ndarray]:
    """Rows with repeated maxima and minima (small integers as floats)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 4, (16, 32)).astype(np.float32)]


def _ints(seed: int = 0) -> list[np.ndarray]:
    return [np.random.default_rng(seed).integers(0, 5, (16, 32)).astype(np.int32)]


def ref_argmax(x):
    return jnp.argmax(x, axis=1)


def ref_argmin(x):
    return jnp.argmin(x, axis=1)


def rows_argmax(x):
    return jnp.argmax(x, axis=1)


def rows_argmin(x):
    return jnp.argmin(x, axis=1)


def _by_hand(x, later_wins: bool):
    """A variadic lax.reduce with an argmax comparator written out (ops in another order)."""
    idx = lax.broadcasted_iota(jnp.int32, x.shape, 1)

    def comb(a, b):
        (v, i), (w, j) = a, b
        picked = jnp.isnan(v) | (w < v)
        tie = (i > j) if later_wins else (j > i)
        take = (tie & (w == v)) | picked
        return jnp.where(picked, v, w), jnp.where(take, i, j)

    return lax.reduce((x, idx), (np.float32(-np.inf), np.int32(0)), comb, (1,))[1]


def argmax_by_hand(x):
    return _by_hand(x, later_wins=False)


def argmax_last_on_ties(x):
    return _by_hand(x, later_wins=True)  # BUG: keeps the last index on ties


def argmin_for_argmax(x):
    return jnp.argmin(x, axis=1)  # BUG


def ref_argmax_per_block(x):
    return x.reshape(16, 4, 8).argmax(axis=-1)


def argmax_per_block(x):
    return jnp.argmax(x, axis=1, keepdims=True)


def argmax_per_block_numbered_globally(x):
    return jnp.argmax(x, axis=1, keepdims=True) + 8 * lax.axis_index("i")  # BUG


def test_argmax_of_split_rows_is_proven():
    assert_correct(pair("argmax_rows", MESH, ref_argmax, rows_argmax, (X,), P("i")),
                   [_ties(0), _ties(1)], tol=0)


def test_argmin_of_split_rows_is_proven():
    assert_correct(pair("argmin_rows", MESH, ref_argmin, rows_argmin, (X,), P("i")),
                   [_ties(0)], tol=0)


def test_integer_argmax_is_proven():
    assert_correct(pair("argmax_ints", MESH, ref_argmax, rows_argmax, (IDS,), P("i")),
                   [_ints(0)], tol=0)


def test_jax_comparator_written_by_hand_is_read_as_argmax():
    assert_correct(pair("argmax_by_hand", MESH, ref_argmax, argmax_by_hand, (X,), P("i")),
                   [_ties(0)], tol=0)


def test_comparator_keeping_the_last_index_on_ties_is_not_proven():
    assert_bug(pair("argmax_last", MESH, ref_argmax, argmax_last_on_ties, (X,), P("i"),
                    bug=True), [_ties(0)], tol=0.5,
               contains="region is not jax's argmax/argmin comparator")


def test_argmin_where_the_reference_takes_argmax_is_not_proven():
    assert_bug(pair("argmin_for_argmax", MESH, ref_argmax, argmin_for_argmax, (X,), P("i"),
                    bug=True), [_ties(0)], tol=0.5)


def test_argmax_of_each_block_by_design_is_proven_by_the_general_tier():
    assert_correct(pair("argmax_per_block", MESH, ref_argmax_per_block, argmax_per_block,
                        (ArgDef("x", (16, 32), "float32", "data", P(None, "i")),),
                        P(None, "i")), [_ties(0)], tol=0, tier="general")


def test_blocks_numbered_globally_where_the_reference_numbers_them_locally():
    assert_bug(pair("argmax_per_block_global", MESH, ref_argmax_per_block,
                    argmax_per_block_numbered_globally,
                    (ArgDef("x", (16, 32), "float32", "data", P(None, "i")),), P(None, "i"),
                    bug=True), [_ties(0)], tol=0.5)


def test_xla_partitions_argmax_over_an_unsplit_dim():
    mesh = jax.make_mesh((4,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    aval = jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=NamedSharding(mesh, P("i")))
    for fn in (ref_argmax, ref_argmin):
        report = check_partitioned(jax.jit(fn, out_shardings=NamedSharding(mesh, P("i"))), aval)
        assert report.proven, report.render_text()
        assert report.stats.get("tier") == "layout", report.stats
