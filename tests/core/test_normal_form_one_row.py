"""Lemmas of the normal-form identities a pipeline with attention needs when a device holds one
batch row (gap 1 of benchmarks/FRONTIER_RESULTS.md, attention half: `examples/frontier.py`'s
`pipeline_step` at dp 2 with a batch of 2): each device's row is computed with a unit batch
dim, the reference's rows all at once, and the two regroup the (rows, seq) tokens at other
places. Each identity is checked on small symbolic tensors (Z3 on the terms before, written
with raw nodes, against the normal form after) with its nearest wrong variant, which must not
meet and which Z3 refutes."""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.core.normal_form import blocks_meet, make_concat, normal_form, slice_term
from entangle_mlir.core.terms import (
    make_arg,
    make_broadcast,
    make_dot,
    make_elementwise,
    make_lin,
    make_mul,
    make_op,
    make_reshape,
    make_splat,
    make_transpose,
)
from tests.core.raw_terms import F32, proved, raw, raw_concat, refuted

DOT = ((), (), (1,), (0,))


def _sum(x, dims):
    kept = tuple(n for d, n in enumerate(x.shape) if d not in dims)
    return make_op("reduce_sum", (x,), (tuple(dims),), kept, x.dtype, linear_in=0)


def test_a_reshape_of_a_reduction_goes_in_group_by_group() -> None:
    """A GQA backward's sum over each kv head's copies, `sum_g y[t, h, g, d]`, flattened to
    (tokens, h * d) after the sum and split back into (rows, seq) tokens: the split of the
    tokens goes into the operand, the merge across the summed dim stays above the sum
    (`reshape_through_reduction`), so the form is one whichever side split the tokens first."""
    y = make_arg(0, (6, 4, 4, 2), F32)
    flat_first = raw("reshape", (raw("reduce_sum", (y,), ((2,),), (6, 4, 2)),), (), (2, 3, 8))
    split_first = make_reshape(_sum(make_reshape(y, (2, 3, 4, 4, 2)), (3,)), (2, 3, 8))
    assert normal_form(flat_first) is normal_form(split_first)
    assert proved(flat_first, split_first)
    merged = raw("reshape", (raw("reduce_sum", (make_reshape(y, (2, 3, 4, 4, 2)),), ((3,),),
                                 (2, 3, 4, 2)),), (), (6, 8))
    assert normal_form(merged) is normal_form(make_reshape(_sum(y, (2,)), (6, 8)))
    assert proved(merged, make_reshape(_sum(y, (2,)), (6, 8)))
    # must fail: the sum over the heads' other dim (the kv heads, not their copies)
    other = make_reshape(_sum(make_reshape(y, (2, 3, 4, 4, 2)), (2,)), (2, 3, 8))
    assert normal_form(flat_first) is not normal_form(other)
    assert refuted(flat_first, other)


def test_a_reshape_of_a_contraction_regroups_its_lhs_free_dims_inside() -> None:
    """The last projection of (micro-batch, row, seq) tokens flattened to (micro-batch x row,
    seq x feature) for a loss: the merge of the lhs's free dims goes into the lhs, the merge
    of seq with the rhs's feature dim stays above the dot (`reshape_through_dot`), so it
    meets the projection of the tokens flattened before it."""
    x, w = make_arg(0, (2, 2, 3, 5), F32), make_arg(1, (5, 4), F32)
    attrs = ((), (), (3,), (0,))
    flat = raw("reshape", (raw("stablehlo.dot_general", (x, w), attrs, (2, 2, 3, 4)),), (),
               (4, 12))
    rows_first = make_reshape(make_dot(make_reshape(x, (4, 3, 5)), w, ((), (), (2,), (0,)),
                                       (4, 3, 4), F32), (4, 12))
    assert normal_form(flat) is normal_form(rows_first)
    assert proved(flat, rows_first)
    # must fail: the rows flattened in the other order (row-major over (row, micro-batch))
    swapped = make_reshape(make_dot(make_reshape(make_transpose(x, (1, 0, 2, 3)), (4, 3, 5)),
                                    w, ((), (), (2,), (0,)), (4, 3, 4), F32), (4, 12))
    assert normal_form(flat) is not normal_form(swapped)
    assert refuted(flat, swapped)


def _attention_row(x, heads: int, dims: int):
    """One batch row's attention output (rows of x: (rows, seq, heads, dims)), as (rows, seq,
    heads, dims): softmax-free, `(q q^T) q` per head, scaled by a table of the positions."""
    rows, seq = x.shape[:2]
    scores = make_dot(x, x, ((0, 2), (0, 2), (3,), (3,)), (rows, heads, seq, seq), F32)
    out = make_dot(scores, x, ((0, 1), (0, 2), (3,), (1,)), (rows, heads, seq, dims), F32)
    return make_transpose(out, (0, 2, 1, 3))


def test_a_batch_s_rows_stack_along_their_unit_dim() -> None:
    """Each device's row of attention, `reshape(pad(f(row_i)), (seq, heads x dims))` with
    row_i of shape (1, seq, heads, dims) read out of the flattened (rows x seq) tokens,
    concatenated along the tokens: the rows stack along their unit dim, the reference's batch
    dim (`_rows_stacked`), not along seq as one longer sequence of one row."""
    tokens = make_arg(0, (8, 2, 2), F32)
    table = make_arg(1, (2, 2), F32)
    zero = make_splat(0, (), F32)

    def block(x):
        rows, seq, heads, dims = x.shape
        rotated = make_mul(_attention_row(x, heads, dims),
                           make_broadcast(table, (1, 3), x.shape))
        padded = make_op("pad", (rotated, zero), ((0,) * 4, (0, 0, 0, 1), (0,) * 4),
                         (rows, seq, heads, dims + 1), F32, linear_in=0)
        return make_reshape(padded, (rows * seq, heads * (dims + 1)))

    pieces = [block(make_reshape(slice_term(tokens, 0, 2 * i, 2 * i + 2), (1, 2, 2, 2)))
              for i in range(4)]
    whole = block(make_reshape(tokens, (4, 2, 2, 2)))
    assert make_concat(pieces, 0) is normal_form(whole)
    assert proved(raw_concat(pieces, 0), whole)
    # must fail: two rows swapped
    swapped = [pieces[1], pieces[0], *pieces[2:]]
    assert make_concat(swapped, 0) is not normal_form(whole)
    assert refuted(raw_concat(swapped, 0), whole)


def test_reshapes_of_pieces_of_other_sizes_join_along_their_major_dim() -> None:
    """`reshape(pad(x0))` of 2 heads next to `reshape(pad(x1))` of 1 head (one stage's two
    layers of keys already joined, the next stage's one layer), each x_i its own heads of
    one tensor: one reshape of the heads joined (`_uneven_reshapes_joined`)."""
    x = make_arg(0, (3, 6), F32)

    def heads(lo: int, hi: int):
        block = make_reshape(slice_term(x, 1, 2 * lo, 2 * hi), (3, hi - lo, 2))
        return make_reshape(_padded(block, 0, 1), (3, 3 * (hi - lo)))

    pieces = [heads(0, 2), heads(2, 3)]
    whole = make_reshape(_padded(make_reshape(x, (3, 3, 2)), 0, 1), (3, 9))
    assert make_concat(pieces, 1) is whole
    assert proved(raw_concat(pieces, 1), whole)
    # must fail: the pieces in the other order
    other = [pieces[1], pieces[0]]
    assert make_concat(other, 1) is not whole and refuted(raw_concat(other, 1), whole)
    # a micro-batch's two rows next to one row (its unit dim grouped with the next by the
    # reshape): the rows of one tensor
    y = make_arg(1, (3, 3, 2), F32)

    def rows_of(lo: int, hi: int):
        return make_reshape(_padded(slice_term(y, 0, lo, hi), 0, 1), (hi - lo, 9))

    rows = [rows_of(0, 2), rows_of(2, 3)]
    whole_rows = make_reshape(_padded(y, 0, 1), (3, 9))
    assert make_concat(rows, 0) is whole_rows
    assert proved(raw_concat(rows, 0), whole_rows)
    swapped = [rows_of(1, 3), rows_of(0, 1)]
    assert make_concat(swapped, 0) is not whole_rows
    assert refuted(raw_concat(swapped, 0), whole_rows)


def _padded(x, low: int, high: int):
    """x padded with zeros along its last dim."""
    zero = make_splat(0, (), F32)
    none = (0,) * (len(x.shape) - 1)
    shape = x.shape[:-1] + (x.shape[-1] + low + high,)
    return make_op("pad", (x, zero), (none + (low,), none + (high,), none + (0,)), shape, F32,
                   linear_in=0)


def test_rotary_halves_of_other_head_counts_pair_by_their_pads() -> None:
    """The rotary backward of k (1 head) and of q (2 heads), each `pad(first half, high) +
    pad(second half, low)` flattened to (rows, heads x dims), listed in other orders (by
    serial): any pairing of parts at one coefficient is exact; the one by the pads' sides
    meets (`_moved_by`): `pad(a, high) + pad(b, low)` over the heads joined."""
    a, b = make_arg(0, (2, 3, 2), F32), make_arg(1, (2, 3, 2), F32)

    def half(x, lo: int, hi: int, low: int, high: int):
        return make_reshape(_padded(slice_term(x, 1, lo, hi), low, high), (2, 4 * (hi - lo)))

    def backward(lo: int, hi: int, second_first: bool):
        first, second = half(a, lo, hi, 0, 2), half(b, lo, hi, 2, 0)
        parts = [second, first] if second_first else [first, second]
        return make_lin([(Fraction(1), p) for p in parts], Fraction(0), parts[0].shape, F32)

    k = backward(0, 1, False)
    half(b, 1, 3, 2, 0)  # built first: listed first
    q = backward(1, 3, True)
    assert [p.args[0].attrs for p in k.args] != [p.args[0].attrs for p in q.args]
    whole = make_lin([(Fraction(1), make_reshape(_padded(a, 0, 2), (2, 12))),
                      (Fraction(1), make_reshape(_padded(b, 2, 0), (2, 12)))], Fraction(0),
                     (2, 12), F32)
    assert make_concat([k, q], 1) is whole
    assert proved(raw_concat([k, q], 1), whole)
    # must fail: q's halves swapped (its first half padded on the low side)
    wrong = make_lin([(Fraction(1), half(a, 1, 3, 2, 0)), (Fraction(1), half(b, 1, 3, 0, 2))],
                     Fraction(0), (2, 8), F32)
    assert make_concat([k, wrong], 1) is not whole
    assert refuted(raw_concat([k, wrong], 1), whole)


def test_contractions_of_distinct_weights_join_in_weight_order() -> None:
    """`dq @ wq^T + dk @ wk^T` (the attention norm's gradient through the q and k
    projections), dq and dk columns of one computation: one contraction over the weights
    concatenated in the order of their arguments, whichever order the sum lists them in."""
    g = make_arg(0, (3, 5), F32)
    wq, wk = make_arg(2, (4, 3), F32), make_arg(1, (4, 2), F32)
    t = make_elementwise("stablehlo.tanh", (g,))
    attrs = ((), (), (1,), (1,))
    dq = make_dot(slice_term(t, 1, 2, 5), wq, attrs, (3, 4), F32)
    dk = make_dot(slice_term(t, 1, 0, 2), wk, attrs, (3, 4), F32)

    def total(parts):
        return make_lin([(Fraction(1), p) for p in parts], Fraction(0), (3, 4), F32)

    normal = normal_form(total([dq, dk]))
    assert normal_form(total([dk, dq])) is normal
    assert normal.op == "stablehlo.dot_general"
    assert proved(total([dq, dk]), normal)
    # must fail: dk read at q's columns
    crossed = total([dq, make_dot(slice_term(t, 1, 3, 5), wk, attrs, (3, 4), F32)])
    assert normal_form(crossed) is not normal and refuted(crossed, normal)


def test_a_joined_contraction_meets_its_parts_inside_a_product() -> None:
    """The reference's `h * (-(dq @ wq^T + dk @ wk^T) + 2 dv @ wv^T)` with the q and k
    contractions joined over concatenated weights, against a sharded side that sums them
    apart (its pieces joined in another order) and lists the product's factors in another
    order: `congruent` pairs the factors by what they are and cuts the joined contraction at
    its weights' pieces (`split_like`), both exact."""
    h, dq, dk, dv = (make_arg(i, s, F32) for i, s in enumerate(
        [(3, 4), (3, 5), (3, 2), (3, 4)]))
    wq, wk, wv = make_arg(4, (4, 5), F32), make_arg(5, (4, 2), F32), make_arg(6, (4, 4), F32)
    attrs = ((), (), (1,), (1,))

    def dot(x, w):
        return raw("stablehlo.dot_general", (x, w), attrs, (3, 4))

    def product(total):
        return raw("mul", (h, total), (), (3, 4))

    joined = raw("lin", (dot(raw_concat([dk, dq], 1), raw_concat([wk, wq], 1)), dot(dv, wv)),
                 (Fraction(0), (Fraction(-1), Fraction(2))), (3, 4))
    apart = raw("lin", (dot(dq, wq), dot(dv, wv), dot(dk, wk)),
                (Fraction(0), (Fraction(-1), Fraction(2), Fraction(-1))), (3, 4))
    want, got = product(joined), raw("mul", (apart, h), (), (3, 4))
    assert blocks_meet(normal_form(want), normal_form(got), {})
    assert proved(want, got)
    # must fail: the weights' pieces in the other order (dk against wq's rows)
    wrong = product(raw("lin", (dot(raw_concat([dk, dq], 1), raw_concat([wq, wk], 1)),
                                dot(dv, wv)), (Fraction(0), (Fraction(-1), Fraction(2))),
                        (3, 4)))
    assert not blocks_meet(normal_form(wrong), normal_form(got), {})
    assert refuted(wrong, got)


def test_a_norm_s_factors_pair_by_the_input_they_move() -> None:
    """A norm's `x * gain * scale` on a micro-batch's rows, joined in part (two rows and one:
    `concat(x rows) * bcast(gain) * concat(scales)`), next to the last row's, its factors
    listed in another order and broadcast from squeezed operands: no kind of factor lines
    them up but the input each moves (`_aligned`'s last key, `_moved_input`), so the rows
    of x join; any pairing of a product's factors is exact, this one meets."""
    data = make_arg(0, (2, 2, 2, 3), F32)  # (micro-batch, row, seq, feature)
    gain = make_arg(1, (3,), F32)

    def scale(i: int, rows: int):
        factor = make_elementwise("stablehlo.rsqrt", (make_arg(2 + i, (rows, 2), F32),))
        if rows == 1:
            return make_broadcast(make_reshape(factor, (2,)), (1,), (1, 2, 3))
        return make_broadcast(factor, (0, 1), (rows, 2, 3))

    def rows_of(m: int, lo: int, hi: int, i: int, table=gain):
        x = make_reshape(slice_term(slice_term(data, 0, m, m + 1), 1, lo, hi), (hi - lo, 2, 3))
        return make_mul(make_mul(x, make_broadcast(table, (2,), x.shape)), scale(i, hi - lo))

    first = make_concat([rows_of(0, 0, 2, 0), rows_of(1, 0, 1, 1)], 0)
    last = rows_of(1, 1, 2, 2)
    whole = make_mul(make_mul(make_reshape(data, (4, 2, 3)),
                              make_broadcast(gain, (2,), (4, 2, 3))),
                     make_concat([scale(0, 2), scale(1, 1), scale(2, 1)], 0))
    assert make_concat([first, last], 0) is whole
    assert proved(raw_concat([first, last], 0), whole)
    # must fail: the last row scaled by another gain
    other = rows_of(1, 1, 2, 2, make_arg(5, (3,), F32))
    assert make_concat([first, other], 0) is not whole
    assert refuted(raw_concat([first, other], 0), whole)
