"""Divisors compared across two terms (`analysis/instance/divisors.py`). The same value spelled
with the operands of its sums and products in another order or grouping is one divisor,
matched by its canonical key without a proof; another regrouping is matched by a bounded Z3
proof; a value that differs (off by one, another variable, a sign) is not, nor is one past
the bounds. At the term level the equal divisors let two terms be proven equal, and a divisor
off by one keeps them apart: they then differ in float arithmetic (NaN against a number)."""

from __future__ import annotations

import numpy as np
import pytest
import z3

from entangle_mlir.analysis.instance import divisors as D
from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core import terms as T

X, Y, Z, W = z3.Reals("x y z w")
I, J = z3.Ints("i j")


@pytest.fixture
def no_proofs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a Z3 proof was asked for")

    monkeypatch.setattr(D, "prove", refuse)


def test_reordered_and_regrouped_operands_are_one_divisor(no_proofs) -> None:
    first = [(X * Y) * Z + W, X + 1, I * J + 1]
    second = [W + Z * (Y * X), 1 + X, 1 + J * I]
    assert first[0].get_id() != second[0].get_id()
    assert D.same_divisors(first, second) and D.same_divisors(second, first)


def test_a_distributed_constant_is_matched_by_a_proof() -> None:
    assert D.same_divisors([2 * (X + Y)], [2 * X + 2 * Y])


@pytest.mark.parametrize("other", [X * Y * Z + W + 1, X * Y * W + W, X * Y + W,
                                   X * Y * Z - W, 2 * X * Y * Z + W],
                         ids=["off_by_one", "other_variable", "factor_dropped", "sign",
                              "doubled"])
def test_a_divisor_that_differs_is_not_matched(other) -> None:
    assert not D.same_divisors([(X * Y) * Z + W], [other])
    assert not D.same_divisors([(X * Y) * Z + W, X], [other, X])


def test_past_the_bounds_nothing_is_matched(monkeypatch) -> None:
    """Equal divisors that need a proof: more than `MAX_LONE_DIVISORS`, or larger than
    `MAX_LONE_NODES`, are not matched (the terms are then not proven); nor are keys past
    the node budget."""
    many = [2 * (X + v) for v in (Y, Z, W)]
    spelled = [2 * X + 2 * v for v in (Y, Z, W)]
    assert not D.same_divisors(many, spelled)
    assert D.same_divisors(many[:2], spelled[:2])
    monkeypatch.setattr(D, "MAX_LONE_NODES", 3)
    assert not D.same_divisors(many[:1], spelled[:1])
    assert D.CanonicalKeys(max_nodes=3).key((X * Y) * Z + W) is None


def _factors_in_other_orders(offset: int):
    """`x / (y * z)` and `x / (z * y')` with y' the rows of y joined again (built after z, so
    its product lists the factors the other way round); `offset`: added to y' (1 is the
    divisor off by one). Each multiplied back by its divisor: equal in exact reals for
    every offset, wherever no divisor is zero."""
    f32 = "f32"
    x, y, z = (T.make_arg(60 + i, (2,), f32) for i in range(3))
    rows = [T.make_op("slice", (y,), ((i,), (i + 1,), (1,)), (1,), f32, linear_in=0)
            for i in range(2)]
    joined = T.make_op("concatenate", tuple(rows), (0,), (2,), f32)
    shifted = T.make_lin([(1, joined)], offset, (2,), f32)
    first, second = T.make_mul(y, z), T.make_mul(z, shifted)
    return (T.make_mul(T.make_div(x, first), first), T.make_mul(T.make_div(x, second), second))


def _run(offset: int, x, y, z):
    """The two terms of `_factors_in_other_orders` in float32, as numpy computes them."""
    with np.errstate(divide="ignore", invalid="ignore"):
        first, second = y * z, z * (y + np.float32(offset))
        return x / first * first, x / second * second


def test_terms_dividing_by_one_value_spelled_apart_are_proven() -> None:
    a, b = _factors_in_other_orders(0)
    result = check_term_equality(a, b, typed=True, finite_alike=True)
    assert result.status == "proved", result
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y, z = (rng.uniform(-4, 4, 2).astype(np.float32) for _ in range(3))
        y[0] = 0  # a zero divisor: NaN in both
        want, got = _run(0, x, y, z)
        assert np.array_equal(want, got, equal_nan=True)


def test_a_divisor_off_by_one_is_not_proven() -> None:
    a, b = _factors_in_other_orders(1)
    result = check_term_equality(a, b, typed=True, finite_alike=True)
    assert result.status == "unknown" and "divides by a value" in result.reason, result
    x, y, z = (np.array(v, dtype=np.float32) for v in ([3, 5], [-1, 2], [2, 2]))
    want, got = _run(1, x, y, z)
    assert not np.array_equal(want, got, equal_nan=True)  # y = -1: x against NaN
