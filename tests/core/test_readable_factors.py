"""Scale factors and constants in diagnostics as a person reads them (issue 20): float32's 0.1
times 4 is `4 x 0.1 (float32)`, not 13421773/33554432."""

from __future__ import annotations

from fractions import Fraction

import pytest

from entangle_mlir.core.precision import readable_factor, round_to, shortest_decimal
from entangle_mlir.core.terms import make_arg, make_lin, make_splat, pretty

F32_TENTH = round_to(Fraction(1, 10), "f32")


@pytest.mark.parametrize("k,dtype,constants,text", [
    (Fraction(4), "f32", (), "4"),
    (Fraction(1, 4), "f32", (), "1/4"),
    (Fraction(3, 128), "f32", (), "3/128"),
    (4 * F32_TENTH, "f32", (), "0.4 (float32)"),
    (4 * F32_TENTH, "f32", (F32_TENTH,), "4 x 0.1 (float32)"),
    (F32_TENTH / 4, "f32", (F32_TENTH,), "1/4 x 0.1 (float32)"),
    (-2 * F32_TENTH, "f32", (-F32_TENTH,), "2 x -0.1 (float32)"),
    (F32_TENTH / 4, "f32", (), "0.025 (float32)"),
    (3 * round_to(Fraction(7, 10), "f32"), "f32", (), "3 x 0.7 (float32)"),
    (2 * round_to(Fraction(1, 10), "bf16"), "bf16", (), "0.2 (bfloat16)"),
    (Fraction(1, 3), "f32", (), "1/3"),
    (8 * round_to(Fraction(1, 3), "f32"), "f32", (), "~2.66666675"),
])
def test_readable_factor(k, dtype, constants, text) -> None:
    assert readable_factor(k, dtype, constants) == text


@pytest.mark.parametrize("k,dtype,constants", [
    (4 * F32_TENTH, "f32", (F32_TENTH,)),
    (F32_TENTH / 4, "f32", ()),
    (3 * round_to(Fraction(7, 10), "f32"), "f32", ()),
    (2 * round_to(Fraction(1, 10), "bf16"), "bf16", ()),
])
def test_readable_factor_is_exact(k, dtype, constants) -> None:
    """What is printed names the factor exactly: its decimals rounded to the named type, times
    the named multiple, give back k (a factor is never printed as a nearby value)."""
    text = readable_factor(k, dtype, constants)
    words = text.replace("(", "").replace(")", "").split()
    names = {"float32": "f32", "bfloat16": "bf16"}
    value = round_to(Fraction(words[-2]), names[words[-1]])
    multiple = Fraction(words[0]) if len(words) == 4 else 1
    assert multiple * value == k, text


def test_shortest_decimal_only_of_values_of_the_type() -> None:
    assert shortest_decimal(F32_TENTH, "f32") == "0.1"
    assert shortest_decimal(Fraction(1, 10), "f32") is None      # 1/10 is no float32 value
    assert shortest_decimal(F32_TENTH, "f64") is None or Fraction(
        shortest_decimal(F32_TENTH, "f64")) != Fraction(1, 10)


def test_pretty_prints_large_fractions_in_decimal() -> None:
    x = make_arg(0, (4,), "f32")
    big = make_lin([(Fraction(1), x)], Fraction(-23170474609375, 8192), (4,), "f32")
    small = make_lin([(Fraction(1, 768), x)], Fraction(0), (4,), "f32")
    assert "-2.82843e+09" in pretty(big) and "/8192" not in pretty(big)
    assert "1/768" in pretty(small)
    assert pretty(make_splat(Fraction(3, 4), (4,), "f32")) == "3/4"
