"""`solver.consistent`: the check that a proof's hypotheses have a model. A cheap model with
every variable pinned is tried first; the full question is asked when that fails, and
contradictory hypotheses are never called consistent."""

from __future__ import annotations

import itertools
import time

import z3

from entangle_mlir.analysis import solver


def _monotone_rounding(n: int) -> list[z3.BoolRef]:
    """Pairwise monotonicity of an uninterpreted rounding over n integer elements (what the
    convert of an int32 tensor to float32 assumes), with their int32 ranges."""
    rounding = z3.Function("round_f32", z3.RealSort(), z3.RealSort())
    xs = [z3.Int(f"a{i}") for i in range(n)]
    hyps = [h for x in xs for h in (x >= -2**31, x <= 2**31 - 1)]
    for x, y in itertools.permutations(xs, 2):
        hyps.append(z3.Implies(z3.ToReal(x) <= z3.ToReal(y),
                               rounding(z3.ToReal(x)) <= rounding(z3.ToReal(y))))
    return hyps


def test_many_monotonicity_axioms_are_consistent_quickly() -> None:
    start = time.perf_counter()
    result = solver.consistent(_monotone_rounding(64), name="monotone", timeout_ms=10_000)
    assert result.status == "refuted", result.describe()
    assert time.perf_counter() - start < 30


def test_pinning_fails_then_the_full_question_is_asked() -> None:
    x, d = z3.Int("x"), z3.Real("d")
    result = solver.consistent([x != 1, d > 3, x * 2 == 8], name="unpinned")
    assert result.status == "refuted", result.describe()


def test_contradictory_hypotheses_are_not_consistent() -> None:
    x, y = z3.Int("x"), z3.Int("y")
    result = solver.consistent([x > y, y > x, x == 1], name="contradiction")
    assert result.status == "proved"


def test_shared_subterms_walked_once() -> None:
    """A formula built by doubling (2^200 paths) has its free variables found at once."""
    x = z3.Int("x")
    term = x
    for _ in range(200):
        term = term + term
    assert [str(v) for v in solver._free_constants([term > 0])] == ["x"]
