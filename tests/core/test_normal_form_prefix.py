"""Lemma of `sums._after_prefix`: a sum of contractions whose first parts were joined before
(a residual stream: layer l's sum holds layer l - 1's parts) is joined as that joined prefix
plus the parts after it. Z3 proves the sum equal to its normal form; a sum with one part
from the wrong block of the weight is refuted and does not meet the whole."""

from __future__ import annotations

from fractions import Fraction

import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.normal_form import normal_form, slice_term, sums
from entangle_mlir.core.terms import make_arg, make_dot, make_elementwise, make_lin

F32 = "f32"
PRODUCT = ((), (), (1,), (0,))


def _part(x, a, w, block: int, width: int, rows: int | None = None):
    """`tanh(x @ a[:, block]) @ w[rows block]` (rows: another block of w, the wrong one)."""
    lo, hi = block * width, (block + 1) * width
    r = block if rows is None else rows
    h = make_elementwise("stablehlo.tanh", (make_dot(x, slice_term(a, 1, lo, hi), PRODUCT,
                                                     (x.shape[0], width), F32),))
    return make_dot(h, slice_term(w, 0, r * width, (r + 1) * width), PRODUCT,
                    (x.shape[0], w.shape[1]), F32)


def _sum(parts):
    return make_lin([(Fraction(1), p) for p in parts], Fraction(0), parts[0].shape, F32)


@pytest.mark.parametrize("n, width", [(3, 1), (3, 2), (4, 2)])
def test_a_sum_joined_onto_its_joined_prefix(n: int, width: int, monkeypatch) -> None:
    x = make_arg(0, (2, 3), F32)
    a, w = make_arg(1, (3, n * width), F32), make_arg(2, (n * width, 2), F32)
    parts = [_part(x, a, w, k, width) for k in range(n)]
    whole = make_dot(make_elementwise("stablehlo.tanh", (make_dot(x, a, PRODUCT, (2, n * width),
                                                                  F32),)),
                     w, PRODUCT, (2, 2), F32)
    normal_form(_sum(parts[:-1]))
    used = []
    monkeypatch.setattr(sums, "_after_prefix",
                        lambda key, cores, f=sums._after_prefix: used.append(f(key, cores))
                        or used[-1])
    stream = _sum(parts)
    assert normal_form(stream) is normal_form(whole)
    assert any(u is not None for u in used)
    assert check_term_equality(stream, whole, "prefix.lemma").status == "proved"
    # must fail: the last part reads the first block of w instead of its own
    wrong = _sum(parts[:-1] + [_part(x, a, w, n - 1, width, rows=0)])
    assert normal_form(wrong) is not normal_form(whole)
    assert check_term_equality(wrong, whole, "prefix.must_fail").status == "refuted"
