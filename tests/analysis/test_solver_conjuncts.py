"""Claims inconclusive as one conjunction are proved in parts (`solver.prove_all`): Z3's nonlinear arithmetic times out on 16 independent copies of
`c / x == c * (1 / x)` (x != 0) that it settles at once one by one. The nearest wrong claims
(one cell's constant off, one cell without its x != 0 hypothesis) are not proved."""

from __future__ import annotations

from fractions import Fraction

import z3

from entangle_mlir.analysis import solver

C = z3.RealVal(Fraction(1, 16))


def _cells(n: int = 16) -> list[z3.ArithRef]:
    return [z3.Real(f"A[{i}]") for i in range(n)]


def test_independent_cells_proved() -> None:
    xs = _cells()
    claims = [C / x == C * (1 / x) for x in xs]
    result = solver.prove_all(claims, [x != 0 for x in xs], name="cells", timeout_ms=2_000)
    assert result.status == "proved", result.describe()


def test_cells_sharing_a_variable_proved_one_by_one() -> None:
    """One part (every claim reads `s`): the claims are asked one at a time."""
    xs, s = _cells(), z3.Real("s")
    claims = [C / x + s - s == C * (1 / x) for x in xs]
    assert len(solver._independent_parts(claims)) == 1
    result = solver.prove_all(claims, [x != 0 for x in xs], name="shared", timeout_ms=2_000)
    assert result.status == "proved", result.describe()


def test_one_cell_off_is_refuted() -> None:
    xs = _cells()
    wrong = [C * (1 / x) for x in xs]
    wrong[9] = z3.RealVal(Fraction(1, 15)) * (1 / xs[9])  # BUG: the constant off
    claims = [C / x == w for x, w in zip(xs, wrong)]
    result = solver.prove_all(claims, [x != 0 for x in xs], name="cells", timeout_ms=2_000)
    assert result.status == "refuted", result.describe()
    assert result.counterexample


def test_one_cell_without_its_hypothesis_not_proved() -> None:
    """One conjunct (x9 * x9 > 0) false where x9 = 0, which its missing hypothesis allows."""
    xs = _cells()
    claims = [*(C / x == C * (1 / x) for x in xs), xs[9] * xs[9] > 0]
    result = solver.prove_all(claims, [x != 0 for i, x in enumerate(xs) if i != 9],
                              name="cells", timeout_ms=2_000)
    assert result.status != "proved", result.describe()
