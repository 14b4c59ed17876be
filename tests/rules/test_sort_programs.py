"""stablehlo.sort (jnp.sort, argsort) on whole programs, grounded by execution on simulated
CPU devices: rows split over a mesh axis are sorted whole on their device (proven, ties kept
in order by argsort); each device sorting its own part of a row is another result where the
reference sorts the row (not proven), and the same program by design, against a reference
that sorts each block, is proven by the general tier.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from tests.rules.grounding import ArgDef, assert_bug, assert_correct, pair

MESH = (("i", 4),)
ROWS = ArgDef("x", (8, 8), "float32", "data", P("i", None))
COLS = ArgDef("x", (8, 8), "float32", "data", P(None, "i"))


def _ties(seed: int = 0) -> list[np.ndarray]:
    return [np.random.default_rng(seed).integers(-3, 3, (8, 8)).astype(np.float32)]


def sort_rows(x):
    return jnp.sort(x, axis=1)


def argsort_rows(x):
    return jnp.argsort(x, axis=1)


def ref_sort_blocks(x):
    return jnp.sort(x.reshape(8, 4, 2), axis=-1).reshape(8, 8)


def test_sort_of_split_rows_is_proven():
    assert_correct(pair("sort_rows", MESH, sort_rows, sort_rows, (ROWS,), P("i")),
                   [_ties(0), _ties(1)], tol=0)


def test_argsort_of_split_rows_is_proven():
    assert_correct(pair("argsort_rows", MESH, argsort_rows, argsort_rows, (ROWS,), P("i")),
                   [_ties(0)], tol=0)


def test_sort_of_each_devices_part_of_the_rows_is_not_proven():
    assert_bug(pair("sort_own_part", MESH, sort_rows, sort_rows, (COLS,), P(None, "i"),
                    bug=True), [_ties(0)], tol=0.5,
               contains="each device sorts its own block")


def test_sort_of_each_block_by_design_is_proven_by_the_general_tier():
    assert_correct(pair("sort_blocks", MESH, ref_sort_blocks, sort_rows, (COLS,), P(None, "i")),
                   [_ties(0)], tol=0, tier="general")


def test_descending_sort_where_the_reference_ascends_is_not_proven():
    def descending(x):
        return jnp.sort(x, axis=1, descending=True)  # BUG

    assert_bug(pair("sort_descending", MESH, sort_rows, descending, (ROWS,), P("i"), bug=True),
               [_ties(0)], tol=0.5)
