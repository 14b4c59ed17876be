"""Loops in the general tier (`expand.Expansion._device_while`): a shard_map body's
`fori_loop` / `scan` with a trip count its counter decides is expanded per device trip by
trip, collectives in the body combined per trip.

Every label is grounded by execution on simulated CPU devices: the correct programs (a
micro-batch loop summing each micro-batch's activations, psum after the loop or on every
trip; a two-carry loop) compute the reference's numbers and are proven by the general tier
where the layout tier does not prove them; each wrong twin (one trip too few, the slice at
the counter off by one, the psum of the carried sum on every trip, the carries swapped) computes
other numbers and is not proven. A loop whose trip count depends on data is refused with
that reason; a counted loop of MAX_LOOP_WORK trips is solved by its invariant
(`analysis/general/loops.py`), and the same loop stepping its counter by 2 (not a counted
loop: run trip by trip) says it is past the work bound.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.analysis.general.expand import MAX_LOOP_WORK
from entangle_mlir.driver import check_texts
from tests.jax_runs import run_and_lower

N = 4
TIER_NOTE = f"proven by per-device expansion on {N} devices (general tier)"
RNG = np.random.default_rng(7)
X = RNG.standard_normal((32, 8)).astype(np.float32)
W = RNG.standard_normal((8, 4)).astype(np.float32)
MICRO = 2


@dataclass(frozen=True)
class Program:
    name: str
    reference: object
    body: object
    out_specs: object = P()


def _run(program: Program):
    """(reference output, sharded output, lowered pair): x split over 'd', w replicated."""
    return run_and_lower(program.reference, program.body, (X, W), (P("d", None), P()),
                         program.out_specs)


def _activations(x, w):
    return jnp.sum(jnp.tanh(x @ w), axis=0)


def reference(x, w):
    return _activations(x, w)


def _micro_loop(trips: int = MICRO, shift: int = 0, psum_each_trip: bool = False,
                psum_carry: bool = False):
    """Sum each micro-batch's activations in a fori_loop, then psum over the devices."""
    def body(x, w):
        xs = x.reshape(MICRO, -1, x.shape[-1])

        def step(i, acc):
            batch = lax.dynamic_index_in_dim(xs, i + shift, keepdims=False)
            part = _activations(batch, w)
            if psum_each_trip:
                return acc + lax.psum(part, "d")
            if psum_carry:
                return lax.psum(acc + part, "d")
            return acc + part

        acc = lax.fori_loop(0, trips, step, jnp.zeros((W.shape[1],), jnp.float32))
        return acc if psum_each_trip or psum_carry else lax.psum(acc, "d")
    return body


def two_carry_reference(x, w):
    return _activations(x, w), jnp.sum(x, axis=0)


def _two_carries(swapped: bool = False):
    """Two sums carried through one scan over the micro-batches."""
    def body(x, w):
        xs = x.reshape(MICRO, -1, x.shape[-1])
        ws = jnp.zeros((w.shape[1],), jnp.float32)
        pad = jnp.zeros((x.shape[-1] - w.shape[1],), jnp.float32)

        def step(carry, batch):
            a, s = carry
            a, s = a + _activations(batch, w), s + jnp.sum(batch, axis=0)
            if swapped:  # the carries change places every trip (padded to one shape)
                return (s[:w.shape[1]], jnp.concatenate([a, pad])), None
            return (a, s), None

        (a, s), _ = lax.scan(step, (ws, jnp.zeros((x.shape[-1],), jnp.float32)), xs)
        return lax.psum(a, "d"), lax.psum(s, "d")
    return body


CORRECT = [
    Program("micro_batch_loop_psum_after", reference, _micro_loop()),
    Program("micro_batch_loop_psum_each_trip", reference, _micro_loop(psum_each_trip=True)),
    Program("scan_with_two_carries", two_carry_reference, _two_carries(), (P(), P())),
]
TWINS = [
    Program("one_trip_too_few", reference, _micro_loop(trips=MICRO - 1)),
    Program("slice_at_the_counter_off_by_one", reference, _micro_loop(shift=1)),
    Program("psum_of_the_carry_on_every_trip", reference, _micro_loop(psum_carry=True)),
    Program("carries_swapped", two_carry_reference, _two_carries(swapped=True), (P(), P())),
]


def _same(got, want) -> bool:
    return all(np.allclose(g, w, rtol=1e-5, atol=1e-5)
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


@pytest.mark.parametrize("program", CORRECT, ids=lambda p: p.name)
def test_correct_loops_are_proven_by_the_general_tier(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    assert _same(got, want)  # grounded: the same numbers
    layout = check_texts(ref_text, sharded_text, general_tier=False)
    assert not layout.proven, "the layout tier proves it: no longer a general-tier case"
    report = check_texts(ref_text, sharded_text)
    assert report.proven, report.render_text()
    assert TIER_NOTE in report.notes
    general = report.stats["general_tier"]
    assert general["proven"] and general["rule_instances"]["refuted"] == 0
    assert general["rule_instances"]["unknown"] == 0


@pytest.mark.parametrize("program", TWINS, ids=lambda p: p.name)
def test_wrong_loops_are_not_proven(program: Program) -> None:
    want, got, (ref_text, sharded_text) = _run(program)
    assert not _same(got, want)  # grounded: other numbers
    report = check_texts(ref_text, sharded_text)
    assert not report.proven, report.render_text()
    general = report.stats["general_tier"]
    assert not general["proven"] and general["reason"]


def test_a_trip_count_that_depends_on_data_is_refused() -> None:
    def body(x, w):
        def cond(carry):
            return jnp.sum(carry[1]) < 1e30  # always true twice: the count is data's

        def step(carry):
            i, acc = carry
            return i + 1, acc + _activations(x, w) * (i < MICRO)

        _, acc = lax.while_loop(lambda c: (c[0] < MICRO) & cond(c), step,
                                (0, jnp.zeros((W.shape[1],), jnp.float32)))
        return lax.psum(acc, "d") / MICRO
    program = Program("data_dependent_trips", reference, body)
    want, got, (ref_text, sharded_text) = _run(program)
    assert _same(got, want)
    report = check_texts(ref_text, sharded_text)
    assert not report.proven
    assert "trip count depends on data" in report.stats["general_tier"]["reason"]


def _long_loop(stride: int):
    """MAX_LOOP_WORK trips adding zeros read from the micro-batch at the counter, the counter
    stepping by `stride` (1: a counted loop, solved by invariant; 2: not one, run trip by
    trip), then the activations."""
    trips = MAX_LOOP_WORK  # every trip costs more than one op

    def body(x, w):
        xs = x.reshape(MICRO, -1, x.shape[-1])

        def step(carry):
            i, acc = carry
            batch = lax.dynamic_index_in_dim(xs, i // stride, keepdims=False)
            return i + stride, acc + 0.0 * _activations(batch, w)

        _, acc = lax.while_loop(lambda c: c[0] < stride * trips, step,
                                (0, jnp.zeros((W.shape[1],), jnp.float32)))
        return lax.psum(acc + _activations(x, w), "d")
    return Program(f"long_loop_stride{stride}", reference, body)


def test_a_long_counted_loop_is_solved_by_invariant() -> None:
    want, got, (ref_text, sharded_text) = _run(_long_loop(1))
    assert _same(got, want)
    report = check_texts(ref_text, sharded_text)
    assert report.proven, report.render_text()
    loops = report.stats["general_tier"]["loops"]
    assert loops["by_invariant"] == 1 and loops["trips"] == MAX_LOOP_WORK


def test_a_loop_past_the_work_bound_says_so() -> None:
    want, got, (ref_text, sharded_text) = _run(_long_loop(2))
    assert _same(got, want)
    report = check_texts(ref_text, sharded_text)
    assert not report.proven
    general = report.stats["general_tier"]
    assert f"past the general tier's bound of {MAX_LOOP_WORK}" in general["reason"]
    assert "not a counted loop" in general["loops"]["not_by_invariant"][0]
