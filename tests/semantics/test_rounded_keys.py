"""Ops that order floats read their keys rounded, and float constants and ranges are read as
their dtype holds them (session 10's wrong twins, benchmarks/ATTACK_RESULTS.md).

Found by the attacker (fuzz/twins.py), each a false proof on main before the fix:
* `argmax(x + 2.0)` was proven equal to `argmax(x)`: argmax / argmin, sort and top_k compared
  exact sums; in f32 `2^24 - 2 + 2` and `2^24 - 1 + 2` are one value and the first index
  wins (`tensor.compared_keys`);
* `where(full(2^24) + full(1.0) > full(2^24), x, 0)` was proven equal to `x`: the float
  ranges of normalize/bounds.py kept the exact sum 2^24 + 1 (`ranges.rounded`), and the
  layout tier folded the compare of the splats as integers (`rules.elementwise._held`);
* `(full(1.01171875) + full(-2^-25)).astype(bf16)` was proven equal to 1.0078125 (the exact
  sum rounded once); XLA rounds to f32 first (1.01171875, a bf16 tie) and gets 1.015625.

Here by Z3 on terms and exactly on numbers, against XLA's numbers (numpy / ml_dtypes); the
grounded program pairs are tw_argmax_rounded, tw_top_k_rounded, tw_argsort_rounded,
tw_constant_compare, tw_constant_indicator, tw_constant_to_int and tw_double_rounding of
fuzz/twins.py (tests/fuzz/test_twins.py runs some)."""

from __future__ import annotations

import random
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.precision import round_to
from entangle_mlir.core.ranges import rounded
from entangle_mlir.core.selection import make_arg_reduce, make_top_k
from entangle_mlir.core.terms import make_arg, make_iota, make_lin, make_splat
from entangle_mlir.rules.elementwise import _held
from entangle_mlir.semantics.ops import ELEMENTWISE
from entangle_mlir.semantics.tensor import arg_reduce, sort_ascending, top_k

F32 = "f32"
TIED = [Fraction(2 ** 24 - 2), Fraction(2 ** 24 - 1)]  # + 2: both 2^24 in f32


def _plus(x, c: int):
    return make_lin([(Fraction(1), x)], Fraction(c), x.shape, x.dtype)


def _argmax(values, kind: str = "argmax"):
    init = make_splat(float("-inf") if kind == "argmax" else float("inf"), (), values.dtype)
    return make_arg_reduce(kind, values, make_iota(values.shape, 1, "i32"), init,
                           make_splat(0, (), "i32"), (1,), 1)


@pytest.mark.parametrize("width", [2, 3])
def test_argmax_of_a_sum_is_not_the_argmax_of_its_operand(width: int) -> None:
    """Z3 must not prove `argmax(x + 2) = argmax(x)` (ties made by rounding); the argmax of a
    regrouped sum is the argmax of the sum; an input's argmax is decided exactly."""
    x = make_arg(0, (1, width), F32)
    wrong = check_term_equality(_argmax(_plus(x, 2)), _argmax(x))
    assert wrong.status != "proved", wrong
    shifted = _plus(_plus(x, 1), 1)
    assert check_term_equality(_argmax(shifted), _argmax(_plus(x, 2))).status == "proved"
    negated = make_lin([(Fraction(-1), x)], Fraction(0), x.shape, F32)
    assert check_term_equality(_argmax(negated, "argmin"), _argmax(x)).status == "proved"


def test_top_k_of_a_sum_is_not_the_top_k_of_its_operand() -> None:
    x = make_arg(0, (1, 3), F32)
    wrong = check_term_equality(make_top_k(_plus(x, 2), 2, 1, "i32"), make_top_k(x, 2, 1, "i32"))
    assert wrong.status != "proved", wrong


def test_concrete_ties_are_xlas() -> None:
    """On numbers the keys round exactly: argmax / top_k / a stable sort of the f32 sums
    `[2^24 - 2, 2^24 - 1] + 2` pick as numpy does on the f32 values."""
    keys = np.array([[v + 2 for v in TIED]], dtype=object)
    want = np.array([TIED], np.float32) + np.float32(2)
    index = np.array([[0, 1]], dtype=object)
    _, got = arg_reduce(keys, index, float("-inf"), 0, (1,), "argmax", F32)
    assert got[0] == np.argmax(want[0]) == 0
    _, picked = top_k(keys, 1, F32)
    assert picked[0, 0] == 0
    backwards = np.array([[TIED[1] + 2, TIED[0] + 2]], dtype=object)
    _, order = sort_ascending([backwards, index], 1, F32)
    assert list(order[0]) == list(np.argsort(want[0][::-1], kind="stable")) == [0, 1]
    # must fail: read exactly, the larger sum wins
    _, exact = arg_reduce(keys, index, float("-inf"), 0, (1,), "argmax", "f64")
    assert exact[0] == 1


def test_float_ranges_round_to_their_dtype() -> None:
    """A range's ends are rounded to nearest in the dtype (monotone): every value the op
    computes from an exact result within the range lies within the rounded ends."""
    assert rounded((2.0 ** 24 + 1, 2.0 ** 24 + 1), F32) == (2.0 ** 24, 2.0 ** 24)
    assert rounded((1.0, 2.0 ** 24 + 3), F32) == (1.0, 2.0 ** 24 + 4)
    assert rounded((257.0, 257.0), "bf16") == (256.0, 256.0)
    assert rounded((-float("inf"), 2.0 ** 24 + 1), "f64") == (-float("inf"), 2.0 ** 24 + 1)
    rng = random.Random(0)
    for _ in range(200):
        lo = rng.uniform(-2 ** 25, 2 ** 25)
        hi = lo + rng.uniform(0, 8)
        r_lo, r_hi = rounded((lo, hi), F32)
        b_lo, b_hi = rounded((lo, hi), "bf16")
        for v in (lo, hi, (lo + hi) / 2):
            assert r_lo <= float(np.float32(v)) <= r_hi
            assert b_lo <= float(round_to(Fraction(v), "bf16")) <= b_hi
    # must fail: the exact ends do not hold the f32 value
    assert not 2.0 ** 24 + 1 <= float(np.float32(2.0 ** 24 + 1))


def test_a_float_constant_is_read_as_its_dtype_holds_it() -> None:
    """A folded sum of f32 constants is rounded before a compare or a convert to an integer
    reads it; integers and other dtypes stay as they are."""
    assert _held(Fraction(2 ** 24 + 1), F32) == 2 ** 24
    assert _held(Fraction(2 ** 24 + 1), "i32") == 2 ** 24 + 1
    assert _held(float("inf"), F32) == float("inf")
    assert int(np.float32(2 ** 24) + np.float32(1)) == 2 ** 24


def test_a_narrowing_convert_rounds_what_its_source_holds() -> None:
    """f32 -> bf16 of a number computed in f32 rounds twice, as XLA does: the f32 sum
    1.01171875 - 2^-25 is 1.01171875, a bf16 tie that goes to even (1.015625)."""
    value = Fraction(1) + Fraction(1, 2 ** 7) + Fraction(1, 2 ** 8) - Fraction(1, 2 ** 25)
    got = ELEMENTWISE["stablehlo.convert"]([np.array([value], dtype=object)], {}, "bf16",
                                           [F32])
    xla = np.float32(1 + 2 ** -7 + 2 ** -8) + np.float32(-2.0 ** -25)
    assert Fraction(float(ml_dtypes.bfloat16(xla))) == got[0] == Fraction(65, 64)
    # must fail: the single rounding of the exact value
    assert round_to(value, "bf16") == Fraction(129, 128) != got[0]


def test_approximated_functions_have_widened_ranges() -> None:
    """XLA's exp is not correctly rounded: exp(-9.9988003) is 4.5454428e-05 in f32 on CPU,
    below the exact 4.54544298e-05 (tw_exp_approximate). The range of exp of that point holds
    XLA's value, so `exp(c) > 4.5454428e-05` is not decided; exact ends (exp(0) = 1) are
    kept."""
    from entangle_mlir.core.ranges import ELEMENTWISE_BOUNDS

    point, xla = -9.998800277709961, 4.5454427890945226e-05
    exp = ELEMENTWISE_BOUNDS["stablehlo.exponential"][0]
    lo, hi = rounded(exp([(point, point)]), F32)
    assert lo <= xla <= hi
    assert rounded(exp([(-float("inf"), 0.0)]), F32) == (0.0, 1.0)
    tanh = ELEMENTWISE_BOUNDS["stablehlo.tanh"][0]
    assert tanh([(9.0109, 9.0109)])[1] == 1.0  # XLA's tanh(9.0109) is 1.0 in f32
    # must fail: the exact value, and its correct rounding, are above XLA's
    import math

    assert math.exp(point) > xla and float(np.float32(math.exp(point))) > xla


def test_a_negated_sum_is_read_rounded() -> None:
    """`-1 * v` is a negation (exact) whose operand must be a value of the dtype too:
    `-max(x + 1, x)` is a computed sum picked and negated, read rounded, so `-max(x + 1, x) <
    -x` is not `true` in every f32 (it is false for |x| >= 2^24), while `<=` is."""
    from entangle_mlir.core.terms import make_elementwise

    x = make_arg(0, (3,), F32)
    picked = make_elementwise("stablehlo.maximum", (_plus(x, 1), x), (), F32)
    negated_pick = make_lin([(Fraction(-1), picked)], Fraction(0), x.shape, F32)
    negated = make_lin([(Fraction(-1), x)], Fraction(0), x.shape, F32)
    true = make_splat(True, x.shape, "i1")

    def compare(direction):
        return make_elementwise("stablehlo.compare", (negated_pick, negated), (direction,),
                                "i1")

    assert check_term_equality(compare("LT"), true).status != "proved"
    assert check_term_equality(compare("LE"), true).status == "proved"


def test_erf_ranges_hold_xlas_values_beyond_one() -> None:
    """XLA's erf is not bounded by 1: erf(3.6962414) is 1.0000001 in f32 on CPU (jax 0.8.0
    and the newest; 1.0000002 elsewhere near 3.83). Its range holds that, on any operand
    range, so `erf(x) <= 1` is not decided by a range."""
    from entangle_mlir.core.ranges import ELEMENTWISE_BOUNDS

    erf = ELEMENTWISE_BOUNDS["chlo.erf"][0]
    xla = float(np.float32(1.0000002))
    assert rounded(erf([(-float("inf"), float("inf"))]), F32)[1] >= xla
    assert rounded(erf([(3.0, 4.0)]), F32)[1] >= xla
    assert rounded(erf([(-float("inf"), -3.0)]), F32)[0] <= -xla
    assert erf([(0.0, 0.0)]) == (0.0, 0.0)
