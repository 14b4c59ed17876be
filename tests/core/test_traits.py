"""The elementwise traits table (`entangle_mlir/core/traits.py`) is complete and true.

Every op in it has a rule in `RULES`, a lit test `lit_tests/rules/<op>.mlir`, a lemma case in
`tests/rules/test_lemmas.py` and exact semantics (`semantics/ops.py` `ELEMENTWISE`); the per-op
tables kept with their analyses hold exactly the ops the table says need them; and the traits
agree with what the builders and the semantics do. The checklist: `docs/adding-an-op.md`.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.core import terms as T
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.normalize.bounds import ELEMENTWISE_BOUNDS
from entangle_mlir.rules import RULES
from entangle_mlir.semantics import ops as S
from tests.rules.test_lemmas import ALL_LEMMAS
from tests.test_lit_coverage import lit_test_problem


def coverage_gaps(table: Collection[str], covered: Mapping[str, Collection[str]]) -> list[str]:
    """`op: no <piece>` for each op of `table` missing from a piece's set of covered ops."""
    return [f"{op}: no {piece}" for op in table for piece, ops in covered.items()
            if op not in ops]


def covered() -> dict[str, set[str]]:
    """The ops each piece covers: piece (what to add, where) -> ops."""
    return {
        "rule in RULES (entangle_mlir/rules/)": set(RULES),
        "lit test (lit_tests/rules/<op>.mlir)": {
            op for op in ELEMENTWISE_OPS if lit_test_problem(op) is None},
        "lemma case (tests/rules/test_lemmas.py)": {lemma.op for lemma in ALL_LEMMAS},
        "exact semantics (entangle_mlir/semantics/ops.py ELEMENTWISE)": set(S.ELEMENTWISE),
    }


def test_every_op_in_the_table_has_a_rule_lit_test_lemma_and_semantics() -> None:
    gaps = coverage_gaps(ELEMENTWISE_OPS, covered())
    assert not gaps, "\n".join(gaps)


@pytest.mark.parametrize("piece", list(covered()))
def test_a_missing_piece_is_reported(piece: str) -> None:
    """The check is not vacuous: dropping an op from a copy of one piece's coverage reports
    that op and that piece, and nothing else."""
    op = "stablehlo.tanh"
    pieces = covered()
    pieces[piece] = pieces[piece] - {op}
    assert coverage_gaps(ELEMENTWISE_OPS, pieces) == [f"{op}: no {piece}"]


def test_semantics_are_exactly_the_table() -> None:
    """Every elementwise op needs its exact semantics, and an op with elementwise semantics is
    in the table (else no consumer treats it as elementwise)."""
    assert set(S.ELEMENTWISE) == set(ELEMENTWISE_OPS)


def test_bounds_are_exactly_the_ops_with_the_bounds_trait() -> None:
    """`ELEMENTWISE_BOUNDS` has a range function for exactly the ops marked `bounds=True`:
    the others' results are unbounded to the interval analysis (an integer result: its
    dtype's range), which the table states by leaving `bounds` False."""
    marked = {op for op, traits in ELEMENTWISE_OPS.items() if traits.bounds}
    assert set(ELEMENTWISE_BOUNDS) == marked


def test_every_lemma_is_of_an_op_with_a_rule() -> None:
    """A lemma case of an op that is in no table would be skipped (`prove_lemma`), silently."""
    assert {lemma.op for lemma in ALL_LEMMAS} <= set(RULES)


def test_arity_is_the_lemmas_operand_count() -> None:
    wrong = sorted({(lemma.op, len(lemma.ins)) for lemma in ALL_LEMMAS
                    if lemma.op in ELEMENTWISE_OPS
                    and len(lemma.ins) != ELEMENTWISE_OPS[lemma.op].arity})
    assert not wrong, wrong


_LOGICAL = ("stablehlo.and", "stablehlo.or", "stablehlo.xor", "stablehlo.not")


@pytest.mark.parametrize("op", list(ELEMENTWISE_OPS))
def test_the_term_builder_makes_the_node_the_table_names(op: str) -> None:
    """`Traits.term`: the op on fresh arguments becomes that arithmetic node, or a node of its
    own name."""
    traits = ELEMENTWISE_OPS[op]
    fresh = itertools.count(900_000)
    dtype = "i1" if op in _LOGICAL else "f32"
    args = [T.make_arg(next(fresh), (4,), dtype) for _ in range(traits.arity)]
    if op == "stablehlo.select":
        args[0] = T.make_arg(next(fresh), (4,), "i1")
    attrs = ("LT",) if op == "stablehlo.compare" else ()
    assert traits.term is None or traits.term in T.ARITHMETIC_TERM_OPS
    assert T.make_elementwise(op, tuple(args), attrs).op == (traits.term or op)


@pytest.mark.parametrize("op", [op for op, traits in ELEMENTWISE_OPS.items() if traits.commutes])
def test_commuting_ops_commute_and_associate(op: str) -> None:
    """`Traits.commutes` (the term builder reorders and regroups operands): true of the exact
    semantics on sample values."""
    if op in _LOGICAL:
        x, y, z, dtype = ([1, 0, 1], [1, 1, 0], [0, 1, 1], "i1")
    else:
        x, y, z, dtype = ([Fraction(1), Fraction(-3), Fraction(5, 2)],
                          [Fraction(2), Fraction(-3), Fraction(1, 3)],
                          [Fraction(0), Fraction(7), Fraction(-1)], "f32")
    x, y, z = (np.array(v, dtype=object) for v in (x, y, z))

    def f(a, b):
        return S.ELEMENTWISE[op]([a, b], {}, dtype, [dtype, dtype])

    assert list(f(x, y)) == list(f(y, x))
    assert list(f(f(x, y), z)) == list(f(x, f(y, z)))
