"""`solver.prove_all`: a conjunction of claims on disjoint variables asked part by part.

The territory fuzzer's int32 programs (seeds 77, 116: a per-device factor, a ring all-reduce)
ran out of time on one query of 64 independent wrap-around products that Z3 decides in
milliseconds one by one. Splitting is exact (`H -> c1 and c2` iff `H -> c1` and `H -> c2`);
these tests show the verdicts are those of the single query, with a real counterexample when
one part is false.
"""

from __future__ import annotations

import z3

from entangle_mlir.analysis.solver import _independent_parts, prove, prove_all

LO, HI, SPAN = -(2**31), 2**31 - 1, 2**32


def _wrap(value):
    """int32 wrap-around of an integer expression, as the semantics spells it."""
    return z3.If(z3.And(value >= LO, value <= HI), value,
                 (value - LO) % SPAN + LO)


def _products(n: int, wrong: int | None = None):
    xs = [z3.Int(f"x{i}") for i in range(n)]
    hyps = [h for x in xs for h in (x >= LO, x <= HI)]
    claims = [_wrap(5 * _wrap(x * (2 + i % 8))) ==
              _wrap(x * (5 * (2 + i % 8) + (1 if i == wrong else 0))) for i, x in enumerate(xs)]
    return xs, claims, hyps


def test_independent_wrapping_products_are_proved_part_by_part() -> None:
    _, claims, hyps = _products(16)
    assert len(_independent_parts(claims)) == 16
    result = prove_all(claims, hyps, name="split.ok", timeout_ms=10_000)
    assert result.status == "proved", result


def test_one_wrong_part_is_refuted_with_a_model_of_every_hypothesis() -> None:
    xs, claims, hyps = _products(16, wrong=11)
    hyps.append(xs[3] == 7)  # a hypothesis of another part: the witness must satisfy it
    seen = {}
    result = prove_all(claims, hyps, name="split.wrong", timeout_ms=5_000,
                       witness=lambda model: seen.setdefault(
                           "x3", model.eval(xs[3], model_completion=True).as_long()))
    assert result.status == "refuted"
    assert seen["x3"] == 7


def test_claims_sharing_a_variable_stay_one_query() -> None:
    x, y = z3.Ints("x y")
    claims = [x + y == y + x, x * 2 == x + x, y - y == 0]
    parts = _independent_parts(claims)
    assert len(parts) == 1 and len(parts[0][0]) == 3
    z = z3.Int("z")
    assert len(_independent_parts(claims + [z * 0 == 0])) == 2
    assert prove_all(claims + [z * 0 == 0], name="split.shared").status == "proved"
    wrong = prove_all(claims + [z * 1 == 0], name="split.shared_wrong")
    assert wrong.status == prove(z3.And(claims + [z * 1 == 0])).status == "refuted"


def _parts_claim_by_claim(claims):
    """The grouping `_independent_parts` must give, computed the plain way: each claim's free
    variables on their own, claims joined while they share one."""
    from entangle_mlir.analysis.solver import _free_constants

    groups: list[tuple[list, set[int]]] = []
    for claim in claims:
        variables = {v.get_id() for v in _free_constants([claim])}
        joined = [g for g in groups if g[1] & variables]
        merged = ([c for g in joined for c in g[0]] + [claim],
                  set().union(variables, *(g[1] for g in joined)))
        groups = [g for g in groups if not g[1] & variables] + [merged]
    return sorted((sorted(c.get_id() for c in cs), sorted(vs)) for cs, vs in groups)


def test_parts_are_those_of_each_claims_own_variables() -> None:
    """One walk over the shared DAG groups the claims as walking each claim apart does:
    shared subterms with and without variables, a claim with none, a variable under a
    shared subterm only, chains joining groups late."""
    x, y, z, w, u = (z3.Int(n) for n in "xyzwu")
    shared = x * y + 3
    constant = z3.IntVal(2) * 7
    claims = [shared > 0, z > constant, shared < z + 100, w * 2 == w + w, z3.BoolVal(True) == (
        constant > 1), u * u >= 0, (u + z) != 5]
    for count in range(1, len(claims) + 1):
        got = sorted((sorted(c.get_id() for c in cs), sorted(vs))
                     for cs, vs in _independent_parts(claims[:count]))
        assert got == _parts_claim_by_claim(claims[:count])
    assert len(_independent_parts(claims)) == 2 + 1  # {x, y, z, u}, {w}, the constant claim


def test_parts_asked_as_one_query_share_the_budget_as_one(monkeypatch) -> None:
    """32 parts that are one query up to renaming are asked once, with all of the budget left
    after the whole conjunction's try (not 1/32 of it: a query's verdict at a share that thin
    hangs on Z3's search order, which differs with the process's history: a vocab-parallel
    one-hot lookup's decision was proven alone and not in a CI worker); distinct parts split it."""
    from entangle_mlir.analysis import solver

    asked: list[tuple[str, int]] = []
    real = solver.prove

    def spy(claim, hyps=(), name="query", timeout_ms=None, witness=None):
        asked.append((name, timeout_ms))
        if name.endswith("whole"):
            return solver.ProofResult("unknown", None, 0.0, name, "spy")
        return real(claim, hyps, name=name, timeout_ms=timeout_ms, witness=witness)

    monkeypatch.setattr(solver, "prove", spy)
    budget = 1_600
    rest = budget - budget // solver.WHOLE_FIRST_SHARE
    _, claims, hyps = _products(32)
    same = [claims[i] for i in range(0, 32, 8)]
    assert solver.prove_all(same, hyps, name="whole", timeout_ms=budget).status == "proved"
    assert [t for n, t in asked if "part" in n] == [rest]
    asked.clear()
    assert solver.prove_all(claims[:4], hyps, name="whole", timeout_ms=budget).status == "proved"
    assert [t for n, t in asked if "part" in n] == [rest // 4] * 4
