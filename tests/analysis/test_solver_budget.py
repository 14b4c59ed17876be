"""Z3 budgets are work, not wall time (`solver.WORK_PER_MS`): a verdict does not depend on how
loaded the machine is (a rule check that timed out under a loaded CI machine and proved on an
idle one is what this prevents)."""

from __future__ import annotations

import itertools
import time

import z3

from entangle_mlir.analysis import solver


def _hard_claim() -> z3.BoolRef:
    xs = [z3.Real(f"x{i}") for i in range(6)]
    cubes = sum(x * x * x for x in xs)
    return z3.Not(z3.And(cubes == 7, *(x * y > 1 for x, y in itertools.pairwise(xs))))


def test_a_small_budget_is_a_work_limit() -> None:
    result = solver.prove(_hard_claim(), name="budget", timeout_ms=20)
    assert result.status == "unknown"
    assert "resource" in result.reason or "timeout" in result.reason


def test_work_limit_not_wall_time_decides(monkeypatch) -> None:
    """With the wall backstop far away, only the work limit stops the query (what runs out
    is Z3's work count, the same on an idle and a busy machine)."""
    monkeypatch.setattr(solver, "WALL_SLACK", 10_000)
    start = time.perf_counter()
    small = solver.prove(_hard_claim(), name="budget", timeout_ms=5)
    assert small.status == "unknown" and "resource" in small.reason, small.reason
    assert time.perf_counter() - start < 30
    enough = solver.prove(_hard_claim(), name="budget", timeout_ms=2_000)
    assert enough.status == "refuted"


def test_budgets_are_per_query() -> None:
    """Z3's work count is per context: each query's limit counts from where it starts."""
    for _ in range(30):
        solver.prove(_hard_claim(), name="budget", timeout_ms=2)
    assert solver.prove(_hard_claim(), name="budget", timeout_ms=2_000).status == "refuted"


def test_a_fresh_context_answers_as_the_shared_one() -> None:
    """Inside `fresh_contexts` a query is asked in a new Z3 context (the general tier's
    decisions: their search order then does not depend on what the process asked before):
    the same statuses, and a refutation's model is read back in the formulas' own context,
    so a witness evaluating the caller's terms still works."""
    x, y = z3.Ints("x y")
    queries = [(x + y == y + x, []), (x * x >= 0, []), (x < y, [x >= y - 1]),
               (x + 1 > x + 2, [])]
    shared = [solver.prove(c, h, name="shared") for c, h in queries]
    with solver.fresh_contexts():
        fresh = [solver.prove(c, h, name="fresh",
                              witness=lambda model: model.eval(x - y, model_completion=True))
                 for c, h in queries]
    assert [r.status for r in shared] == ["proved", "proved", "refuted", "refuted"]
    assert [r.status for r in fresh] == [r.status for r in shared]
    assert fresh[2].witness.as_long() >= 0  # a model of x >= y - 1 and not x < y
    assert fresh[2].witness.ctx is x.ctx and fresh[3].witness is not None
