"""A float division rounds its quotient, also inside an operand a compare reads
(`element._quotients_rounded`).

Found by session 13's attacks (examples/heldout/attacks13.py, `recip_*`): a compare of
`x / d` was proven equal to the same compare of `x * (1 / d)`, and of `3 / d` to `3 * (1 / d)`,
because exact reals equate them; in float32 the reciprocal is rounded first and the two
differ in the last bit (x = -5.2974358, d = 2.7002612: -1.9618235 against -1.9618236), which a
compare with a threshold between them turns into another answer. Here by Z3 on terms
(`check_term_equality`): those compares are refused, the same compare of one quotient of a
regrouped sum is still proven."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.terms import make_arg, make_div, make_elementwise, make_mul, make_splat

F32 = "f32"


def _at_least(a, t):
    return make_elementwise("stablehlo.compare", (a, t), ("GE",), "i1")


def _add(a, b):
    return make_elementwise("stablehlo.add", (a, b), (), F32)


def _reciprocal(d):
    return make_div(make_splat(Fraction(1), d.shape, F32), d)


@pytest.mark.parametrize("shape", [(), (3,)])
@pytest.mark.parametrize("numerator", ["x", "3"])
def test_quotient_and_product_with_a_reciprocal_compare_apart(shape, numerator: str) -> None:
    x, d, t = (make_arg(k, shape, F32) for k in range(3))
    if numerator == "3":
        x = make_splat(Fraction(3), shape, F32)
    left, right = make_div(x, d), make_mul(x, _reciprocal(d))
    proof = check_term_equality(_at_least(left, t), _at_least(right, t))
    assert proof.status != "proved", proof


@pytest.mark.parametrize("shape", [(), (3,)])
def test_one_quotient_of_a_regrouped_sum_compares_alike(shape) -> None:
    a, b, d, t = (make_arg(k, shape, F32) for k in range(4))
    left = make_div(_add(a, b), d)
    right = make_div(_add(b, a), d)
    assert check_term_equality(_at_least(left, t), _at_least(right, t)).status == "proved"


def test_float32_witness() -> None:
    x, d = np.float32(-5.2974358), np.float32(2.7002612)
    assert x / d != x * (np.float32(1) / d)
    assert np.float32(3) / np.float32(0.50509804) != \
        np.float32(3) * (np.float32(1) / np.float32(0.50509804))


def test_a_quotient_shared_inside_another_is_rounded_there_too() -> None:
    """No exact quotient by a non-numeral is left, also where an inner quotient is shared by
    the outer one and by the sum around it (`element._heights`: the inner one counts below
    both parents, so it is rounded before the outer one is)."""
    import z3

    from entangle_mlir.semantics import element

    x, y, w = z3.Reals("x y w")
    inner = y / w
    z = x / (1 + inner) + inner
    rounded = element._quotients_rounded(z, F32)

    def exact_quotient(n) -> bool:
        return z3.is_app(n) and n.decl().kind() == z3.Z3_OP_DIV

    nodes = list(element._distinct_nodes(rounded))
    assert sum(exact_quotient(n) for n in nodes) == 2
    # an exact quotient only as the argument of its rounding
    assert all(n.decl().name() == "quotient_f32" for n in nodes if z3.is_app(n)
               and any(exact_quotient(c) for c in n.children()))
    assert str(rounded).count("quotient_f32") == 3  # the outer one, the inner one twice
