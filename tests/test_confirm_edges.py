"""Confirmation's "edges" draw (`confirm.input_edges`, `evidence.random_input(kind="edges")`).

Random integers are small and non-negative, so two real bugs were never confirmed by running:
an int8 row-parallel matmul whose partial sums are narrowed to int8 before the psum (they wrap
only for large weights) and a sequence-parallel cross-entropy averaging per-shard means (it
differs only where shards hold different numbers of ignored labels, -100). The edges draw
mixes into an integer input the values the reference compares it with (c - 1, c, c + 1:
`labels >= 0`) and, for an input that is only data (converted, summed, contracted), the
extremes of its type. A value outside an input's index range (a proof's valid-index
assumption) is never drawn: jax's negative-index wrap compares ids with 0, and an id of -1
on a correct vocab-parallel program is a difference no proof claims away.

Grounded on the held-out corpus: both bugs are now confirmed on the edges draw; their correct
twins are proven; the correct one-hot embedding (a claim the layout tier makes and running
withdraws) stays withdrawn.
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

from entangle_mlir.confirm import EDGE_DRAW, confirm_texts, input_edges, is_confirmed
from entangle_mlir.driver import check_texts
from entangle_mlir.evidence import random_input
from entangle_mlir.mlir.ir import context, parse_module
from examples.heldout.corpus import examples, lower_pair


def _edges(fn, *avals, index_ranges=None) -> dict[int, tuple[int, ...]]:
    text = jax.jit(fn).lower(*avals).as_text()
    with context():
        module = parse_module(text)
        main = next(op.operation for op in module.body.operations
                    if op.operation.name == "func.func"
                    and str(op.attributes["sym_name"]) == '"main"')
        return input_edges(main, index_ranges)


def _i(shape, dtype=jnp.int32):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_a_compared_constant_and_its_neighbours() -> None:
    found = _edges(lambda x, labels: jnp.sum(jnp.where(labels >= 0, x, 0.0)),
                   jax.ShapeDtypeStruct((4,), jnp.float32), _i((4,)))
    assert found == {1: (-1, 0, 1)}


def test_the_extremes_of_integer_data() -> None:
    found = _edges(lambda x, w: x.astype(jnp.int32) @ w.astype(jnp.int32),
                   _i((2, 3), jnp.int8), _i((3, 2), jnp.int8))
    assert found == {0: (-128, -127, 126, 127), 1: (-128, -127, 126, 127)}


def test_indices_get_no_extremes_and_stay_in_their_range() -> None:
    """jnp indexing compares ids with 0 (negative ids wrap): -1, 0 and 1 unless the proof
    assumes the ids index the table's 8 rows; a sum of int32 data gets its extremes."""
    table = jax.ShapeDtypeStruct((8, 3), jnp.float32)
    assert _edges(lambda t, ids: t[ids], table, _i((4,))) == {1: (-1, 0, 1)}
    assert _edges(lambda t, ids: t[ids], table, _i((4,)), index_ranges={1: 8}) == {1: (0, 1)}
    assert _edges(lambda x: jnp.sum(x), _i((4,))) == {
        0: (-2**31, -2**31 + 1, 2**31 - 2, 2**31 - 1)}
    assert _edges(lambda x: jnp.sum(x * (x > 2)), _i((4,))) == {0: (1, 2, 3)}


def test_the_edges_draw_mixes_the_values_in() -> None:
    rng = np.random.default_rng(EDGE_DRAW[0])
    drawn = random_input((64,), np.int8, rng, "edges", 0, (-128, 127))
    assert drawn.dtype == np.int8 and {-128, 127} <= set(drawn.tolist())
    assert set(drawn.tolist()) - {-128, 127}
    floats = random_input((8,), np.float32, np.random.default_rng(0), "edges", 0, (-1,))
    assert floats.dtype == np.float32
    assert np.array_equal(random_input((8,), np.int32, np.random.default_rng(1), "edges"),
                          random_input((8,), np.int32, np.random.default_rng(1), "normal"))


_BY_NAME = {e.name: e for e in examples()}

BUGS = ["int8_matmul_tp_partials_narrowed_to_int8_tp4", "masked_ce_sp_mean_of_shard_means_sp4"]
CORRECT = ["int8_matmul_tp_tp4", "masked_ce_sp_sp4"]


@pytest.fixture(scope="module")
def texts():
    return {name: lower_pair(_BY_NAME[name]) for name in BUGS + CORRECT + ["one_hot_embed_tp4"]}


@pytest.mark.parametrize("name", BUGS)
def test_bugs_random_draws_miss_are_confirmed_on_the_edges(texts, name: str) -> None:
    ref, sharded = texts[name]
    report = confirm_texts(check_texts(ref, sharded, verify_rules=False), ref, sharded)
    assert not report.proven and is_confirmed(report.diagnostics[0]), report.render_text()
    seeds = [o["seed"] for o in report.evidence["confirmation"]["outputs"] if o["differs"]]
    assert seeds == [EDGE_DRAW[0]]


@pytest.mark.parametrize("name", CORRECT)
def test_their_correct_twins_are_proven(texts, name: str) -> None:
    assert check_texts(*texts[name], verify_rules=False).proven


def test_a_correct_programs_claim_stays_withdrawn(texts, monkeypatch) -> None:
    """The one-hot embedding is proven (normalize/one_hot.py); without its rewrites the layout
    tier reads a claim into it, which the edge draws must not confirm: jax's wrap of negative
    ids compares them with 0, yet -1 lies outside the valid-index range its proof assumes."""
    from entangle_mlir.normalize import one_hot

    monkeypatch.setattr(one_hot, "REWRITES", {})
    ref, sharded = texts["one_hot_embed_tp4"]
    report = confirm_texts(check_texts(ref, sharded, verify_rules=False), ref, sharded)
    assert not report.proven and not any(is_confirmed(d) for d in report.diagnostics)
    assert report.diagnostics[0].category == "cannot_relate", report.render_text()
    assert report.evidence["confirmation"]["inputs"] == 5
