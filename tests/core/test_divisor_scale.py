"""A divisor's constant factor leaves the division only when it is a power of two.

`make_div(x, k * m)` was `(1/k) * (x / m)` for every rational k, which identified
`round(x / (m / 127))` (the reference's int8 quantization) with `round(127 * (x / m))`: the
held-out program `int8_quant` with its scale folded that way was proven, and the two differ
in float32 (x = -1.6156265, m = 2.2424543: -92 against -91). Dividing by `2^e * m` rounds the
one exact quotient `x / m / 2^e`, so for powers of two the factor still moves (Z3's
floating-point theory proves it on small formats where no value is within a factor two of
the subnormal range or overflows); for k = 3 or 1/127 Z3 finds inputs where it does not.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import z3

from entangle_mlir.core import terms as T


def _arg(index: int) -> T.Term:
    return T.make_arg(index, (3,), "f32")


@pytest.mark.parametrize("k", [Fraction(2), Fraction(1, 4), Fraction(-8)])
def test_power_of_two_factor_leaves_the_divisor(k: Fraction) -> None:
    x, m = _arg(0), _arg(1)
    assert T.make_div(x, T.scale(m, k)) is T.scale(T.make_div(x, m), 1 / k)


@pytest.mark.parametrize("k", [Fraction(3), Fraction(1, 127), Fraction(-6)])
def test_other_factor_stays_in_the_divisor(k: Fraction) -> None:
    x, m = _arg(0), _arg(1)
    quotient = T.make_div(x, T.scale(m, k))
    assert quotient is not T.scale(T.make_div(x, m), 1 / k)
    assert quotient.op == "div" and quotient.args[1] is T.scale(m, k)


def test_numerator_factor_still_moves() -> None:
    """A numerator's factor is a product's factor (regrouped under liberty 1)."""
    x, m = _arg(0), _arg(1)
    assert T.make_div(T.scale(x, 3), m) is T.scale(T.make_div(x, m), 3)


@pytest.mark.parametrize("k", [Fraction(3), Fraction(-6), Fraction(1, 127)])
def test_constant_numerator_stays_in_the_quotient(k: Fraction) -> None:
    """`k / m` rounds once, `k * (1 / m)` rounds the reciprocal first (session 13's attacks:
    `3 / s` against `3 * (1 / s)` under a compare was proven and differs in float32)."""
    m = _arg(1)
    quotient = T.make_div(T.make_splat(k, (3,), "f32"), m)
    assert quotient is not T.scale(T.make_div(T.make_splat(1, (3,), "f32"), m), k)
    assert quotient.op == "div"


@pytest.mark.parametrize("k", [Fraction(4), Fraction(-1), Fraction(1, 2)])
def test_power_of_two_numerator_leaves_the_quotient(k: Fraction) -> None:
    m = _arg(1)
    assert T.make_div(T.make_splat(k, (3,), "f32"), m) is \
        T.scale(T.make_div(T.make_splat(1, (3,), "f32"), m), k)


def test_float32_witness() -> None:
    """The folded scale differs from the reference's in float32 (the held-out false proof)."""
    x, m = np.float32(-1.6156265), np.float32(2.2424543)
    assert np.round(x / (m / np.float32(127))) != np.round(np.float32(127) * (x / m))


def _differs(ebits: int, sbits: int, k: Fraction) -> str:
    """Z3: is there x, m with x / fl(k * m) != fl(1/k) * (x / m), every value at least twice
    the least normal and none infinite?"""
    sort, rne = z3.FPSort(ebits, sbits), z3.RNE()
    x, m = z3.FP("x", sort), z3.FP("m", sort)
    scaled = z3.fpMul(rne, z3.FPVal(float(k), sort), m)
    left = z3.fpDiv(rne, x, scaled)
    quotient = z3.fpDiv(rne, x, m)
    right = z3.fpMul(rne, z3.FPVal(float(1 / k), sort), quotient)
    floor = z3.FPVal(2.0 ** (3 - 2 ** (ebits - 1)), sort)
    solver = z3.Solver()
    solver.set("timeout", 20_000)
    solver.add(*[z3.Not(z3.fpIsInf(t)) for t in (scaled, left, quotient, right)])
    solver.add(*[z3.fpGEQ(z3.fpAbs(t), floor) for t in (x, m, scaled, left, quotient, right)])
    solver.add(z3.Not(z3.fpEQ(left, right)))
    return str(solver.check())


@pytest.mark.parametrize("fmt", [(3, 4), (4, 6)])
@pytest.mark.parametrize("k", [Fraction(2), Fraction(1, 4), Fraction(-2)])
def test_power_of_two_factor_is_exact_in_floats(fmt: tuple[int, int], k: Fraction) -> None:
    assert _differs(*fmt, k) == "unsat"


@pytest.mark.parametrize("fmt,k", [((3, 4), Fraction(3)), ((4, 6), Fraction(3)),
                                   ((4, 8), Fraction(1, 127))])
def test_other_factor_is_not_exact_in_floats(fmt: tuple[int, int], k: Fraction) -> None:
    assert _differs(*fmt, k) == "sat"


def _numerator_differs(ebits: int, sbits: int, k: Fraction) -> str:
    """Z3: is there m with fl(k / m) != fl(k * fl(1 / m)), every value at least twice the
    least normal and none infinite?"""
    sort, rne = z3.FPSort(ebits, sbits), z3.RNE()
    m, kk = z3.FP("m", sort), z3.FPVal(float(k), sort)
    left = z3.fpDiv(rne, kk, m)
    reciprocal = z3.fpDiv(rne, z3.FPVal(1.0, sort), m)
    right = z3.fpMul(rne, kk, reciprocal)
    floor = z3.FPVal(2.0 ** (3 - 2 ** (ebits - 1)), sort)
    solver = z3.Solver()
    solver.set("timeout", 20_000)
    solver.add(*[z3.Not(z3.fpIsInf(t)) for t in (left, reciprocal, right)])
    solver.add(*[z3.fpGEQ(z3.fpAbs(t), floor) for t in (m, left, reciprocal, right)])
    solver.add(z3.Not(z3.fpEQ(left, right)))
    return str(solver.check())


@pytest.mark.parametrize("fmt", [(3, 4), (4, 6)])
@pytest.mark.parametrize("k", [Fraction(4), Fraction(-2), Fraction(1, 2)])
def test_power_of_two_numerator_is_exact_in_floats(fmt: tuple[int, int], k: Fraction) -> None:
    assert _numerator_differs(*fmt, k) == "unsat"


@pytest.mark.parametrize("fmt,k", [((3, 4), Fraction(3)), ((4, 6), Fraction(3)),
                                   ((4, 6), Fraction(-6))])
def test_other_numerator_is_not_exact_in_floats(fmt: tuple[int, int], k: Fraction) -> None:
    assert _numerator_differs(*fmt, k) == "sat"
