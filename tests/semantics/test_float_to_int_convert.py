"""A float -> integer convert truncates toward zero and saturates at the integer type's limits,
as XLA computes it (f16(-5) -> ui8 is 0, 1e10 -> i32 is INT_MAX); it never wraps like an
integer -> integer convert (i8(-5) -> ui8 is 251).

Found by the attacker (benchmarks/ATTACK_RESULTS.md, session 9): `x.astype(f16).astype(u8)`
of an int8 x was proven equal to `x.astype(u8)` by the general tier, whose element semantics
wrapped the truncated float into ui8. The semantics are checked here against XLA's numbers
(concrete elements) and by Z3 (symbolic elements: saturation proved on every real, the
wrap-around model refuted); the program pair is grounded by execution."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import z3
from jax.sharding import PartitionSpec as P

from entangle_mlir.core.ranges import int_limits
from entangle_mlir.driver import check_texts
from entangle_mlir.semantics.element import convert, wrap_int
from tests.jax_runs import run_and_lower

VALUES = [-1e10, -300.5, -128.5, -128.0, -5.0, -1.5, -0.5, 0.0, 0.5, 127.9, 128.0, 255.5,
          256.0, 65535.0, 3e9, 1e10]
TARGETS = {"i8": jnp.int8, "ui8": jnp.uint8, "i16": jnp.int16, "ui16": jnp.uint16,
           "i32": jnp.int32, "ui32": jnp.uint32}


@pytest.mark.parametrize("target", list(TARGETS))
def test_concrete_float_to_int_converts_are_xlas(target: str) -> None:
    """Element by element, the semantics' convert f32 -> `target` is XLA's."""
    xs = np.array(VALUES, np.float32)
    want = np.asarray(jax.jit(lambda x: x.astype(TARGETS[target]))(xs))
    got = [wrap_int(convert(float(x), "f32", target), target) for x in xs]
    assert [int(v) for v in want] == [int(v) for v in got]


def _prove(claim) -> str:
    solver = z3.Solver()
    solver.set("timeout", 10_000)
    solver.add(z3.Not(claim))
    answer = solver.check()
    return "proved" if answer == z3.unsat else "refuted" if answer == z3.sat else "unknown"


@pytest.mark.parametrize("target", ["i8", "ui8", "i32", "ui32"])
def test_symbolic_float_to_int_convert_saturates(target: str) -> None:
    """For every real r: convert(r) is trunc(r) clamped to the target's range (proved), and
    is not trunc(r) wrapped into the range (refuted: the model the false proof used)."""
    r = z3.Real("r")
    lo, hi = (z3.IntVal(int(v)) for v in int_limits(target))
    got = wrap_int(convert(r, "f32", target), target)
    trunc = z3.If(r >= 0, z3.ToInt(r), -z3.ToInt(-r))
    saturated = z3.If(trunc < lo, lo, z3.If(trunc > hi, hi, trunc))
    assert _prove(got == saturated) == "proved"
    assert _prove(got == wrap_int(trunc, target)) == "refuted"


# ----- the program pair, grounded ------------------------------------------------------------------

PAIRS = {
    # name: (sharded body, computes the reference's numbers)
    "through_f16_to_i32": (lambda x: x.astype(jnp.float16).astype(jnp.int32), True),
    "through_f16_to_u8": (lambda x: x.astype(jnp.float16).astype(jnp.uint8), False),
    "through_f32_to_i8": (lambda x: x.astype(jnp.float32).astype(jnp.int8), True),
}
REFERENCES = {"through_f16_to_i32": lambda x: x.astype(jnp.int32),
              "through_f16_to_u8": lambda x: x.astype(jnp.uint8),
              "through_f32_to_i8": lambda x: x}


@pytest.mark.parametrize("name", list(PAIRS))
def test_a_float_round_trip_to_integers_is_judged(name: str) -> None:
    """int8 x through a float to an integer type: exact where the target holds every int8
    (proven), saturating at 0 for negatives into ui8 where the reference wraps (other
    numbers, not proven)."""
    body, correct = PAIRS[name]
    x = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    want, got, texts = run_and_lower(REFERENCES[name], body, [x], (P("d", None),),
                                     P("d", None))
    assert np.array_equal(want, got) == correct
    report = check_texts(*texts, verify_rules=correct)
    assert report.proven == correct, report.render_text()
    if correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


@pytest.mark.parametrize(("added", "correct"),
                         [(2 ** 31 - 1, True), (3_000_000_000 - 2 ** 32, False)],
                         ids=["saturated", "wrapped"])
def test_a_converted_float_constant_saturates(added: int, correct: bool) -> None:
    """`x + full(3e9, f32).astype(i32)`: the layout tier folds the converted constant
    (`rules/elementwise._folded`) to INT_MAX, as XLA computes it, not to 3e9 wrapped into
    int32 (which was proven without the Z3 rule checks)."""
    x = np.arange(-64, 64, dtype=np.int32).reshape(8, 16)

    def body(x):
        return x + jnp.full(x.shape, 3e9, jnp.float32).astype(jnp.int32)

    want, got, texts = run_and_lower(lambda x: x + jnp.int32(added), body, [x],
                                     (P("d", None),), P("d", None))
    assert np.array_equal(want, got) == correct
    for rules in (False, True):
        report = check_texts(*texts, verify_rules=rules)
        assert report.proven == correct, report.render_text()
