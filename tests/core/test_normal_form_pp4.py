"""Lemmas of the pairings a pipeline with attention needs on dp 2 x pp 4 (issue 19's "dp x pp x
tp with attention", benchmarks/FRONTIER_RESULTS.md gap 1): a stage's rows come joined in part
(a micro-batch's two rows next to one row), and the pieces list their factors or parts in
other orders and forms, so the lifts and `congruent` must pair like with like. Any pairing of
a product's factors or of a sum's parts at equal coefficients is exact; each test checks with
Z3 that the pairing chosen is an equality on small symbolic tensors of several shapes, and
that its nearest wrong variant is refuted and does not meet."""

from __future__ import annotations

from fractions import Fraction

import pytest

from entangle_mlir.core.normal_form import blocks_meet, make_concat, normal_form, slice_term
from entangle_mlir.core.normal_form.concat import _aligned, _near_inputs
from entangle_mlir.core.normal_form.meet import _operand_pairs, congruent
from entangle_mlir.core.terms import (
    Term,
    make_arg,
    make_dot,
    make_elementwise,
    make_lin,
    make_mul,
    make_reshape,
)
from tests.core.raw_terms import F32, proved, raw, raw_concat, refuted

SHAPES = [(2, 3, 4), (1, 2, 2), (3, 2, 3)]
"""(seq, features, hidden) of the small cases."""


def _gate(g: Term) -> Term:
    """A SwiGLU gate's nonlinearity stand-in, `rsqrt(1 + rsqrt(1 - g))` (Z3 reads rsqrt as
    a function it can refute around; the real one is `1 / (1 + exp(-g))`): as there, the
    weights it reads lie further down than the projections'."""
    inner = make_elementwise("stablehlo.rsqrt", (make_lin([(Fraction(-1), g)], Fraction(1),
                                                          g.shape, F32),))
    return make_elementwise("stablehlo.rsqrt", (make_lin([(Fraction(1), inner)], Fraction(1),
                                                         g.shape, F32),))


def _swiglu_rows(x: Term, y: Term, wu: Term, wg: Term, lo: int, hi: int,
                 gate_first: bool = False) -> Term:
    """`up * gate * f(gate)` of two layers' hidden columns side by side (x through layer 0's
    weights, y through layer 1's) on rows lo..hi of (rows, seq, features) inputs, flattened
    to (tokens, 2 * hidden); one row is computed without its row dim and not flattened (its
    projections are concatenations, the rows' reshapes). `gate_first`: the gate built first,
    so the product lists its factors in another order."""
    seq, feat = x.shape[1:]
    hidden = wu.shape[2]

    def layer(w: Term, i: int) -> Term:
        return make_reshape(slice_term(w, 0, i, i + 1), (feat, hidden))

    def proj(w: Term) -> Term:
        if hi - lo == 1:
            return make_concat([make_dot(make_reshape(slice_term(t, 0, lo, hi), (seq, feat)),
                                         layer(w, i), ((), (), (1,), (0,)), (seq, hidden),
                                         F32) for i, t in enumerate((x, y))], 1)
        return make_reshape(make_concat([make_dot(slice_term(t, 0, lo, hi), layer(w, i),
                                                  ((), (), (2,), (0,)),
                                                  (hi - lo, seq, hidden), F32)
                                         for i, t in enumerate((x, y))], 2),
                            ((hi - lo) * seq, 2 * hidden))

    if gate_first:
        g = proj(wg)
        f = _gate(g)
        u = proj(wu)
    else:
        u, g = proj(wu), proj(wg)
        f = _gate(g)
    return make_mul(make_mul(u, g), f)


def _swiglu_inputs(seq: int, feat: int, hidden: int) -> tuple[Term, ...]:
    x, y = make_arg(0, (3, seq, feat), F32), make_arg(3, (3, seq, feat), F32)
    wu, wg = make_arg(1, (2, feat, hidden), F32), make_arg(2, (2, feat, hidden), F32)
    return x, y, wu, wg


def _product_of_columns(rows: list[tuple[Term, ...]]) -> Term:
    """The product of the factors' columns, each concatenated along the rows (raw nodes)."""
    columns = [raw_concat([r[k] for r in rows], 0) for k in range(len(rows[0]))]
    return raw("mul", columns, (), columns[0].shape)


@pytest.mark.parametrize("seq, feat, hidden", SHAPES)
def test_swiglu_factors_line_up_by_the_weights_they_read(seq: int, feat: int,
                                                         hidden: int) -> None:
    """A micro-batch's two rows' `up * gate * f(gate)` next to the last row's, listed in
    another order and in other forms (reshapes against concatenations, no weight directly
    under either): no kind of operand lines them up, the inputs each reads a few levels down
    do (`_aligned`'s last key, `_near_inputs`: up reads w_up, gate w_gate, f neither that
    near). The concatenation is the product of the factors' columns so lined up."""
    x, y, wu, wg = _swiglu_inputs(seq, feat, hidden)
    two = _swiglu_rows(x, y, wu, wg, 0, 2)
    one = _swiglu_rows(x, y, wu, wg, 2, 3, gate_first=True)
    assert [a.op for a in two.args] != [a.op for a in one.args]
    rows = _aligned([two, one], 0)
    assert all(len({_near_inputs(r[k]) for r in rows}) == 1 for k in range(3))
    assert proved(raw_concat([two, one], 0), _product_of_columns(rows))
    # must fail: the last row's up projection through other weights, lined up alike
    other = _swiglu_rows(x, y, make_arg(4, wu.shape, F32), wg, 2, 3, gate_first=True)
    assert refuted(raw_concat([two, other], 0), _product_of_columns(rows))


@pytest.mark.parametrize("seq, feat, hidden", SHAPES)
def test_swiglu_rows_with_factors_in_other_orders_meet_the_batch(seq: int, feat: int,
                                                                 hidden: int) -> None:
    """The same rows' concatenation meets the three rows computed at once; with the last
    row's up projection reading another weight it does not, and Z3 refutes it."""
    x, y, wu, wg = _swiglu_inputs(seq, feat, hidden)
    whole = normal_form(_swiglu_rows(x, y, wu, wg, 0, 3))
    two = _swiglu_rows(x, y, wu, wg, 0, 2)
    one = _swiglu_rows(x, y, wu, wg, 2, 3, gate_first=True)
    assert normal_form(make_concat([two, one], 0)) is whole
    assert proved(raw_concat([two, one], 0), whole)
    other = _swiglu_rows(x, y, make_arg(4, wu.shape, F32), wg, 2, 3, gate_first=True)
    wrong = normal_form(make_concat([two, other], 0))
    assert wrong is not whole and not blocks_meet(wrong, whole, {})
    assert refuted(raw_concat([two, other], 0), whole)


@pytest.mark.parametrize("seq, feat, hidden", SHAPES)
def test_a_residual_stream_s_parts_pair_by_a_concatenation_s_first_piece(
        seq: int, feat: int, hidden: int) -> None:
    """A stage input's residual `x + attn @ wo` on a micro-batch's two rows, x's rows joined
    only in part (`concat(x0, x1)`, two inputs), next to the last row's `x2 + attn2 @ wo`:
    the concatenation pairs with x2 (its first piece's kind, `_leading`), not with the
    contraction whose operands' kinds it shares; so the contractions' rows join into one
    (`attn @ wo`). Any pairing at equal coefficients is exact; this one meets."""
    inputs = make_arg(0, (4, seq, feat), F32)
    attn = make_arg(3, (3, seq, hidden), F32)
    wo = make_reshape(make_arg(4, (1, hidden, feat), F32), (hidden, feat))
    dot = ((), (), (1,), (0,))

    def row(r: int) -> Term:
        return make_reshape(slice_term(inputs, 0, r, r + 1), (seq, feat))

    def stream(residual: Term, lo: int, hi: int) -> Term:
        rows = (hi - lo) * seq
        a = make_dot(make_reshape(slice_term(attn, 0, lo, hi), (rows, hidden)), wo, dot,
                     (rows, feat), F32)
        return make_lin([(Fraction(1), residual), (Fraction(1), a)], Fraction(0),
                        (rows, feat), F32)

    two = stream(make_concat([row(0), row(2)], 0), 0, 2)
    one = stream(row(3), 2, 3)
    whole = stream(make_concat([row(0), row(2), row(3)], 0), 0, 3)
    joined = make_concat([two, one], 0)
    assert joined.op == "lin" and normal_form(joined) is normal_form(whole)
    assert proved(raw_concat([two, one], 0), whole)
    # must fail: the last row's residual read from another row of the inputs
    wrong = make_concat([two, stream(row(1), 2, 3)], 0)
    assert normal_form(wrong) is not normal_form(whole)
    assert refuted(raw_concat([two, stream(row(1), 2, 3)], 0), whole)


@pytest.mark.parametrize("seq, feat, hidden", SHAPES)
def test_congruent_pairs_projections_by_the_weights_they_read(seq: int, feat: int,
                                                              hidden: int) -> None:
    """`congruent` pairs two products' factors of one op and shape by what they are: among
    concatenations of contractions that share no operand and whose skeletons tie (a
    SwiGLU's up and gate projections of two layers side by side, one side's inputs cut into
    rows), by the weights each reads near (`_likeness`), so up meets up wherever the product
    lists it."""
    n = 2 * seq
    x, y = make_arg(0, (n, feat), F32), make_arg(1, (n, feat), F32)
    wu = [make_arg(2 + i, (feat, hidden), F32) for i in range(2)]
    wg = [make_arg(4 + i, (feat, hidden), F32) for i in range(2)]
    dot = ((), (), (1,), (0,))

    def rows(t: Term) -> Term:
        return raw_concat([slice_term(t, 0, 0, seq), slice_term(t, 0, seq, n)], 0)

    def proj(ws: list[Term], cut: bool) -> Term:
        return raw_concat([raw("stablehlo.dot_general", (rows(t) if cut else t, w), dot,
                               (n, hidden)) for t, w in zip((x, y), ws)], 1)

    def product(factors: list[Term]) -> Term:
        return raw("mul", factors, (), factors[0].shape)

    up, gate = proj(wu, False), proj(wg, False)
    want = product([up, gate, _gate(gate)])
    cut_up, cut_gate = proj(wu, True), proj(wg, True)
    got = product([cut_gate, cut_up, _gate(gate)])
    pairs = _operand_pairs(want, got)
    assert pairs is not None and (up, cut_up) in pairs and (gate, cut_gate) in pairs
    assert congruent(want, got, {}, {})
    assert proved(want, got)
    # must fail: the gate projection read through the up weights
    wrong = product([proj(wu, True), cut_up, _gate(gate)])
    assert not congruent(want, wrong, {}, {})
    assert refuted(want, wrong)
