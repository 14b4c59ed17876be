"""A float compare, and every op that jumps (floor, sign, a convert to an integer), reads an
operand computed by float arithmetic rounded to its dtype (`element.compared_value`).

Found by the attacker (benchmarks/ATTACK_RESULTS.md, session 9; fixed in session 10): `x + 1.0
> x` was proven equal to `true` over the exact reals; in f32 it is false for |x| >= 2^24. Here
by Z3 on terms (`check_term_equality`): the decision over the reals is refused, what holds in
f32 for every finite x (`>=`, the same compare of a regrouped sum) is proven, and the concrete
rounding is XLA's. The program pair is grounded by execution in tests/fuzz/test_twins.py
(`tw_compare_rounded`)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.terms import make_arg, make_elementwise, make_lin, make_splat
from entangle_mlir.semantics.element import compare, compared_value

F32 = "f32"


def _plus(x, c: float):
    return make_lin([(Fraction(1), x)], Fraction(c), x.shape, x.dtype)


def _compare(a, b, direction: str):
    return make_elementwise("stablehlo.compare", (a, b), (direction,), "i1")


def _true(shape):
    return make_splat(True, shape, "i1")


@pytest.mark.parametrize("shape", [(), (3,), (2, 2)])
def test_x_plus_one_is_not_greater_than_x_in_every_f32(shape) -> None:
    """`x + 1 > x` is not `true` (refused: Z3 may round x + 1 down to x); `x + 1 >= x` is
    (rounding is monotone and keeps x)."""
    x = make_arg(0, shape, F32)
    greater = check_term_equality(_compare(_plus(x, 1), x, "GT"), _true(shape))
    assert greater.status != "proved", greater
    at_least = check_term_equality(_compare(_plus(x, 1), x, "GE"), _true(shape))
    assert at_least.status == "proved", at_least


@pytest.mark.parametrize("shape", [(), (4,)])
def test_a_regrouped_sum_compares_alike(shape) -> None:
    """`(a + b) + c > d` and `a + (b + c) > d`, summed in other orders: equal sums, equal
    roundings."""
    a, b, c, d = (make_arg(k, shape, F32) for k in range(4))
    left = make_elementwise("stablehlo.add", (make_elementwise("stablehlo.add", (a, b), (), F32),
                                               c), (), F32)
    right = make_elementwise("stablehlo.add", (a, make_elementwise("stablehlo.add", (b, c), (),
                                                                   F32)), (), F32)
    proof = check_term_equality(_compare(left, d, "GT"), _compare(right, d, "GT"))
    assert proof.status == "proved", proof
    # must fail: another sum compared
    other = make_elementwise("stablehlo.add", (a, b), (), F32)
    assert check_term_equality(_compare(left, d, "GT"),
                               _compare(other, d, "GT")).status == "refuted"


def test_a_compare_of_inputs_is_decided_exactly() -> None:
    """Inputs are values of their dtype: `x > y` and `y < x` are one compare."""
    x, y = make_arg(0, (3,), F32), make_arg(1, (3,), F32)
    assert check_term_equality(_compare(x, y, "GT"), _compare(y, x, "LT")).status == "proved"


def test_concrete_operands_round_as_f32_does() -> None:
    """On numbers the operand is rounded exactly: 2^24 + 1 is 2^24 in f32, so it is not
    greater than 2^24, as XLA computes `x + 1 > x` at x = 2^24."""
    big = Fraction(2 ** 24)
    assert compared_value(big + 1, F32) == big
    assert compare(compared_value(big + 1, F32), big, "GT") is False
    assert bool(np.float32(2 ** 24) + np.float32(1) > np.float32(2 ** 24)) is False
    assert compared_value(Fraction(1, 3), "i32") == Fraction(1, 3)


def test_small_integers_computed_in_float_are_exact() -> None:
    """`3 * indicator(x > 0)` is 0 or 3, which f32 holds: compared as it is (its compare with
    2 is the indicator), while the same count scaled past 2^24 is rounded."""
    x = make_arg(0, (3,), F32)
    indicator = make_elementwise("stablehlo.select", (
        _compare(x, make_splat(Fraction(0), (3,), F32), "GT"), make_splat(Fraction(1), (3,), F32),
        make_splat(Fraction(0), (3,), F32)), (), F32)
    three = make_lin([(Fraction(3), indicator)], Fraction(0), (3,), F32)
    two = make_splat(Fraction(2), (3,), F32)
    zero = make_splat(Fraction(0), (3,), F32)
    proof = check_term_equality(_compare(three, two, "GT"), _compare(x, zero, "GT"))
    assert proof.status == "proved", proof
    huge = make_lin([(Fraction(2 ** 25 + 1), indicator)], Fraction(0), (3,), F32)
    wide = make_splat(Fraction(2 ** 25), (3,), F32)
    assert check_term_equality(_compare(huge, wide, "GT"),
                               _compare(x, zero, "GT")).status != "proved"


def test_a_subnormal_operand_decides_nothing() -> None:
    """XLA's CPU flushes subnormal f32 results to zero and reads subnormal operands as zero,
    while a compare it folds reads the constant as it is (`precision.subnormal`): a compare
    of a subnormal number is left undecided, on numbers and by Z3 (`x * 1e-39 > 0` for
    x >= 1: a square of 1e-20 and the like are grounded in tests/fuzz/test_twins.py,
    `tw_flushed_product`, `tw_flushed_square`). f16 is computed in f32: its subnormals stay."""
    tiny = Fraction(np.float32(1e-39).item())
    assert not isinstance(compared_value(Fraction(1e-39), F32), (Fraction, float, int))
    assert compared_value(Fraction(1e-30), F32) == Fraction(np.float32(1e-30).item())
    assert compared_value(Fraction(1, 10 ** 5), "f16") == Fraction(np.float16(1e-5).item())
    x = make_arg(0, (3,), F32)
    one, zero = (make_splat(Fraction(v), (3,), F32) for v in (1, 0))
    at_least_one = make_elementwise("stablehlo.maximum", (x, one), (), F32)
    product = make_lin([(tiny, at_least_one)], Fraction(0), (3,), F32)
    assert check_term_equality(_compare(product, zero, "GT"), _true((3,))).status != "proved"
    normal = make_lin([(Fraction(2 ** -100), at_least_one)], Fraction(0), (3,), F32)
    assert check_term_equality(_compare(normal, zero, "GE"), _true((3,))).status == "proved"


def test_a_subnormal_range_end_takes_zero_in() -> None:
    """A range whose ends are subnormal in f32 / bf16 holds zero (the device may flush), in
    f16 it does not, and normal ends are kept."""
    from entangle_mlir.core.ranges import rounded

    assert rounded((1e-40, 4e-40), F32)[0] == 0.0
    assert rounded((-4e-40, -1e-40), "bf16")[1] == 0.0
    assert rounded((1e-6, 2e-6), "f16")[0] > 0
    assert rounded((1e-30, 2e-30), F32)[0] > 0
