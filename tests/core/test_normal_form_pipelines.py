"""Lemmas of the normal-form identities a pipeline's terms need (issue 19): a pipeline computes
each micro-batch's rows apart, one row block of one micro-batch at a time, and sums its
gradients step by step, where the reference computes the stacked batch at once. Each identity
is checked on small symbolic tensors (Z3 on the term before, written with raw nodes, against
the normal form after, or exact evaluation on integers), and its nearest wrong variant (rows
swapped, another reduction, a tile left out, a division that may be by zero) is not met.
The later part holds the identities of a pipelined training step with tp stages (issue 21,
`examples/frontier.py`'s `pipeline_step`): tp's column blocks, rotary halves, partial sums.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from entangle_mlir.analysis.general.decide import Decider, without_kept_zeros
from entangle_mlir.core.normal_form import blocks_meet, make_concat, normal_form, slice_term
from entangle_mlir.core.terms import (
    DENSE_VALUES,
    finite_unless_overflow,
    make_arg,
    make_broadcast,
    make_dense,
    make_div,
    make_dot,
    make_elementwise,
    make_lin,
    make_mul,
    make_op,
    make_reshape,
    make_splat,
    term_interval,
)
from tests.core.raw_terms import F32, proved, raw, raw_concat, raw_slice, refuted

DOT = ((), (), (1,), (0,))


def rows(x, start: int, stop: int, dim: int = 0):
    return slice_term(x, dim, start, stop)


def total(x, dims):
    kept = tuple(n for d, n in enumerate(x.shape) if d not in dims)
    return make_op("reduce_sum", (x,), (tuple(dims),), kept, x.dtype, linear_in=0)


def micro(x, i: int):
    """Micro-batch i of a stacked (m, b, d) batch, as a pipeline stage reads it."""
    return make_reshape(rows(x, i, i + 1), x.shape[1:])


def norm_scale(h):
    """1 / (1 + sum of squares of each row): a normalization's per-row factor."""
    squares = total(make_mul(h, h), (len(h.shape) - 1,))
    return make_div(make_splat(1, squares.shape, F32),
                    make_lin([(Fraction(1), squares)], Fraction(1), squares.shape, F32))


def normed(h):
    """h times its rows' factor broadcast back (RMSNorm's form)."""
    scale = norm_scale(h)
    return make_mul(h, make_broadcast(scale, tuple(range(len(scale.shape))), h.shape))


def test_one_micro_batch_and_two_joined_ones_lift_together() -> None:
    """Micro-batches 0 and 1 joined (a broadcast of a (2, b) factor) next to micro-batches 2
    and 3 alone (a broadcast of a (b,) factor each, the unit dim left out): one broadcast of
    the whole batch's factor (`_units_alike`, broadcasts and reductions)."""
    x = make_arg(0, (4, 2, 3), F32)
    whole = normal_form(normed(x))
    pieces = [normal_form(normed(rows(x, 0, 2)))] + [
        normal_form(make_reshape(normed(micro(x, i)), (1, 2, 3))) for i in (2, 3)]
    assert make_concat(pieces, 0) is whole
    assert proved(raw_concat(pieces, 0), whole)
    # must fail: micro-batches 2 and 3 swapped
    swapped = [pieces[0], pieces[2], pieces[1]]
    assert make_concat(swapped, 0) is not whole and refuted(raw_concat(swapped, 0), whole)


def test_gate_and_up_projections_line_up_by_their_weights() -> None:
    """SwiGLU's `silu(h @ gate) * (h @ up)` of two micro-batches: the two contractions are
    alike but for their weight, and each piece may list them in either order (`_aligned`)."""
    x = make_arg(0, (2, 2, 3), F32)
    gate, up = make_arg(1, (3, 4), F32), make_arg(2, (3, 4), F32)

    def swiglu(h, swap: bool):
        dims = ((), (), (len(h.shape) - 1,), (0,))
        shape = h.shape[:-1] + (4,)
        if swap:  # built the other way round: the product lists them in the other order
            b = make_dot(h, up, dims, shape, F32)
            a = make_dot(h, gate, dims, shape, F32)
        else:
            a, b = make_dot(h, gate, dims, shape, F32), make_dot(h, up, dims, shape, F32)
        return make_mul(a, b)

    whole = swiglu(x, False)
    pieces = [make_reshape(swiglu(micro(x, i), bool(i)), (1, 2, 4)) for i in range(2)]
    assert make_concat(pieces, 0) is normal_form(whole)
    # must fail: the second micro-batch with its weights exchanged is another product
    wrong = [pieces[0], make_reshape(
        make_mul(make_dot(micro(x, 1), gate, ((), (), (1,), (0,)), (2, 4), F32),
                 make_dot(micro(x, 1), gate, ((), (), (1,), (0,)), (2, 4), F32)), (1, 2, 4))]
    assert make_concat(wrong, 0) is not normal_form(whole)
    assert refuted(raw_concat(wrong, 0), whole)


def test_a_block_matrix_read_by_rows_is_the_one_read_by_columns() -> None:
    """Rows of micro-batches, each the concatenation of its layers' columns: the columns,
    each the micro-batches' rows joined (`_swap_blocks`)."""
    x, w1, w2 = make_arg(0, (4, 3), F32), make_arg(1, (3, 2), F32), make_arg(2, (3, 2), F32)
    dims = ((), (), (1,), (0,))

    def layer(h, w):
        return make_dot(h, w, dims, h.shape[:1] + (2,), F32)

    pieces = [make_concat([layer(rows(x, i, i + 2), w1), layer(rows(x, i, i + 2), w2)], 1)
              for i in (0, 2)]
    assert all(p.op == "concatenate" for p in pieces)
    whole = make_concat([layer(x, w1), layer(x, w2)], 1)
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: the second row block with its columns swapped
    other = make_concat([layer(rows(x, 2, 4), w2), layer(rows(x, 2, 4), w1)], 1)
    assert make_concat([pieces[0], other], 0) is not whole
    assert refuted(raw_concat([pieces[0], other], 0), whole)


def test_adjacent_summed_and_contracted_dims_merge() -> None:
    """A sum over a stacked batch's micro-batches and rows is the sum over the rows
    flattened; so is a contraction over them (`merge_summed_dims`,
    `merge_contracted_dims`)."""
    x, g = make_arg(0, (2, 3, 4), F32), make_arg(1, (2, 3, 5), F32)
    summed = raw("reduce_sum", (x,), ((0, 1),), (4,))
    flat = total(make_reshape(x, (6, 4)), (0,))
    assert normal_form(summed) is normal_form(flat) and proved(summed, flat)
    grad = raw("stablehlo.dot_general", (x, g), ((), (), (0, 1), (0, 1)), (4, 5))
    flat_grad = make_dot(make_reshape(x, (6, 4)), make_reshape(g, (6, 5)),
                         ((), (), (0,), (0,)), (4, 5), F32)
    assert normal_form(grad) is normal_form(flat_grad) and proved(grad, flat_grad)
    # must fail: a sum over dims that are not adjacent stays, and is another sum
    apart = raw("reduce_sum", (x,), ((0, 2),), (3,))
    assert normal_form(apart).op == "reduce_sum" and normal_form(apart).attrs == ((0, 2),)
    # must fail: contracting (0, 1) against (1, 0) pairs other elements
    crossed = raw("stablehlo.dot_general", (x, make_arg(2, (3, 2, 5), F32)),
                  ((), (), (0, 1), (1, 0)), (4, 5))
    assert normal_form(crossed) is not normal_form(flat_grad)


def test_reshapes_merge_through_reductions_and_broadcasts() -> None:
    """The rows of a (m, b) reduction flattened are the reduction over the flattened rows
    (`reshape_through_reduction`); a broadcast of an (m, b) factor flattened is the broadcast
    of the factor flattened (`merge_through_broadcast`)."""
    x = make_arg(0, (2, 3, 4), F32)
    sums = total(x, (2,))
    flat = raw("reshape", (sums,), (), (6,))
    want = total(make_reshape(x, (6, 4)), (1,))
    assert normal_form(flat) is normal_form(want) and proved(flat, want)
    spread = raw("reshape", (make_broadcast(sums, (0, 1), (2, 3, 4)),), (), (6, 4))
    spread_want = make_broadcast(want, (0,), (6, 4))
    assert normal_form(spread) is normal_form(spread_want) and proved(spread, spread_want)
    # must fail: the rows flattened from a sum over the middle dim are another order
    middle = raw("reshape", (total(x, (1,)),), (), (8,))
    assert normal_form(middle) is not normal_form(total(make_reshape(x, (2, 12)), (1,)))


def test_sums_over_every_element_meet_across_shapes_and_tiles() -> None:
    """A loss summed over a stacked batch meets the micro-batches' losses flattened
    (`_full_sums_meet`) and the sum of each micro-batch's and row block's tile
    (`_tiled_sums_meet`)."""
    x = make_arg(0, (2, 4, 3), F32)
    sq = make_mul(x, x)
    whole = make_lin([(Fraction(1, 24), total(sq, (0, 1, 2)))], Fraction(0), (), F32)
    flat = make_lin([(Fraction(1, 24), total(make_reshape(sq, (8, 3)), (0, 1)))],
                    Fraction(0), (), F32)
    assert blocks_meet(normal_form(whole), normal_form(flat))
    tiles = [make_mul(t, t) for t in (rows(rows(x, i, i + 1), r, r + 2, 1)
                                      for i in range(2) for r in (0, 2))]
    tiled = make_lin([(Fraction(1, 24), total(t, (0, 1, 2))) for t in tiles], Fraction(0),
                     (), F32)
    assert blocks_meet(normal_form(whole), normal_form(tiled)) and proved(whole, tiled)
    # must fail: one tile counted twice, another left out
    twice = make_lin([(Fraction(1, 24), total(t, (0, 1, 2))) for t in tiles[:3] + tiles[:1]],
                     Fraction(0), (), F32)
    assert not blocks_meet(normal_form(whole), normal_form(twice)) and refuted(whole, twice)


def test_rows_meet_along_a_concatenation_in_a_sum() -> None:
    """A sum of per-stage concatenations (a stage's rows of each micro-batch's gradient)
    meets the sum of padded rows (the reference's gradient of each stacked layer) row block
    by row block (`_spine_cuts`); zero pads of like rows are summed under the pad (`_peel`)."""
    g = [make_arg(i, (1, 3), F32) for i in range(4)]
    w = make_arg(4, (2, 3), F32)
    zero = make_splat(0, (), F32)

    def pad(r, at: int):
        return make_op("pad", (r, zero), ((at, 0), (1 - at, 0), (0, 0)), (2, 3), F32,
                       linear_in=0)

    ref = make_lin([(Fraction(1), w), (Fraction(-1), pad(make_lin(
        [(Fraction(1), g[0]), (Fraction(1), g[1])], Fraction(0), (1, 3), F32), 0)),
        (Fraction(-1), pad(make_lin([(Fraction(1), g[2]), (Fraction(1), g[3])], Fraction(0),
                                    (1, 3), F32), 1))], Fraction(0), (2, 3), F32)
    stages = make_lin([(Fraction(1), w), (Fraction(-1), make_concat([g[0], g[2]], 0)),
                       (Fraction(-1), make_concat([g[1], g[3]], 0))], Fraction(0), (2, 3), F32)
    assert blocks_meet(normal_form(ref), normal_form(stages)) and proved(ref, stages)
    # must fail: a micro-batch's gradient of the first layer in the second layer's row
    wrong = make_lin([(Fraction(1), w), (Fraction(-1), make_concat([g[0], g[2]], 0)),
                      (Fraction(-1), make_concat([g[3], g[1]], 0))], Fraction(0), (2, 3), F32)
    assert not blocks_meet(normal_form(ref), normal_form(wrong)) and refuted(ref, wrong)


def test_row_blocks_of_each_micro_batch_join_before_the_micro_batches() -> None:
    """Pieces (2, d) of a (m, 4, d) batch, two row blocks per micro-batch, in order: the
    batch flattened (`_runs_joined`)."""
    x = make_arg(0, (2, 4, 3), F32)
    pieces = [make_reshape(rows(rows(x, i, i + 1), r, r + 2, 1), (2, 3))
              for i in range(2) for r in (0, 2)]
    whole = make_reshape(x, (8, 3))
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: the row blocks of the second micro-batch in the other order
    order = pieces[:2] + pieces[:1:-1]
    assert make_concat(order, 0) is not whole and refuted(raw_concat(order, 0), whole)


def test_a_slice_of_a_squeezed_sum_ends() -> None:
    """A row of a sum over a unit-row block, read through the reshape that drops the unit
    dim: its normal form ends (it looped: slice of reshape, squeezed back to the slice) and
    is the sum of that row."""
    x = make_arg(0, (1, 2, 3), F32)
    term = raw("slice", (raw("reshape", (total(x, (2,)),), (), (2,)),), ((1,), (2,), (1,)),
               (1,))
    out = normal_form(term)
    assert proved(term, out)
    # must fail: the other row
    other = raw("slice", (raw("reshape", (total(x, (2,)),), (), (2,)),), ((0,), (1,), (1,)),
                (1,))
    assert normal_form(other) is not out and refuted(term, other)


def test_zeros_through_linear_ops_and_contractions() -> None:
    """A sum, slice or zero pad of zeros is zeros; a contraction with zeros is zero where the
    other side is finite (an input), and kept where it may not be (`exp(x)` overflows)."""
    x = make_arg(0, (2, 3), F32)
    zeros = make_splat(0, (2, 3), F32)
    assert total(zeros, (1,)).op == "splat"
    assert make_dot(zeros, make_arg(1, (3, 4), F32), ((), (), (1,), (0,)), (2, 4),
                    F32).op == "splat"
    big = make_elementwise("stablehlo.exponential", (make_arg(2, (3, 4), F32),))
    kept = make_dot(zeros, big, ((), (), (1,), (0,)), (2, 4), F32)
    assert kept.op == "stablehlo.dot_general"  # must fail: 0 * inf is NaN, not 0
    assert make_op("pad", (zeros, make_splat(0, (), F32)), ((0, 0), (1, 0), (0, 0)), (2, 4),
                   F32, linear_in=0).op == "splat"
    assert x.op == "arg"


def test_a_square_is_not_negative() -> None:
    """`x * x` ranges over [0, max]; `x * y` may be negative (must fail)."""
    x, y = make_arg(0, (3,), F32), make_arg(1, (3,), F32)
    assert term_interval(make_mul(x, x))[0] == 0
    assert term_interval(make_mul(x, y))[0] < 0


def test_a_slice_reaching_into_a_pad() -> None:
    """A window of a pad that holds padding and operand rows: the pad of the operand's part
    (`_slice_across_pad`)."""
    x = make_arg(0, (2, 3), F32)
    zero = make_splat(0, (), F32)
    padded = make_op("pad", (x, zero), ((1, 0), (2, 0), (0, 0)), (5, 3), F32, linear_in=0)
    window = rows(padded, 0, 2)
    assert window.op == "pad" and proved(window, raw("slice", (padded,),
                                                        ((0, 0), (2, 3), (1, 1)), (2, 3)))
    # must fail: the window one row further down
    assert refuted(rows(padded, 1, 3), raw("slice", (padded,), ((0, 0), (2, 3), (1, 1)),
                                           (2, 3)))


def test_a_known_step_of_a_stored_mask_is_a_constant() -> None:
    """A scan's step mask stored as a table and read at a known step: the splat it holds;
    two steps with different values stay a table holding them."""
    table = np.array([False, False, True, True])
    mask = make_dense(b"pipelines-mask-test", (4,), "i1", table)
    one = normal_form(make_reshape(raw("slice", (mask,), ((2,), (3,), (1,)), (1,), "i1"), ()))
    assert one.op == "splat" and one.attrs[0] == 1
    two = normal_form(raw("slice", (mask,), ((1,), (3,), (1,)), (2,), "i1"))
    assert two.op == "dense" and list(DENSE_VALUES[two.attrs[0]]) == [False, True]


def test_kept_zeros_are_dropped_only_where_nothing_overflows() -> None:
    """`0 * t + a` against `a`: not proven by default (t may overflow: 0 * inf is NaN), proven
    under --assume-no-overflow with the assumption listed; `0 * (1 / x)` is not dropped even
    then (x may be 0), and `t` with a log of a possibly negative value is not finite."""
    a, x = make_arg(0, (3,), F32), make_arg(1, (3,), F32)
    t = make_mul(x, x)
    assert finite_unless_overflow(t) and not finite_unless_overflow(
        make_elementwise("stablehlo.log", (x,)))
    kept = make_lin([(Fraction(1), a), (Fraction(0), t)], Fraction(0), (3,), F32)
    assert kept is not a
    strict = Decider([a]).decide(a, kept, "kept.strict")
    assert not strict.proved and "--assume-no-overflow" in strict.reason
    loose = Decider([a], assume_no_overflow=True).decide(a, kept, "kept.loose")
    assert loose.proved and any("overflow" in s for s in loose.assumptions)
    # must fail: 0 * (1 / x) is NaN at x = 0 whatever overflows
    pole = make_div(make_splat(1, (3,), F32), x)
    inf_zero = make_lin([(Fraction(1), a), (Fraction(0), pole)], Fraction(0), (3,), F32)
    assert without_kept_zeros(inf_zero, {}) is inf_zero
    assert not Decider([a], assume_no_overflow=True).decide(a, inf_zero, "pole").proved


def test_micro_batch_losses_join_whatever_order_their_subterms_list() -> None:
    """The losses of micro-batches computed alike, each reading its own rows of the batch
    and one shared weight row (built in between, so the pieces list their slices in other
    orders): one sum over the batch, taken in the order of the rows each reads
    (`_unique_window_starts`)."""
    x, w = make_arg(0, (3, 4), F32), make_arg(1, (2, 4), F32)
    first = rows(x, 0, 1)
    shared = make_broadcast(make_reshape(rows(w, 1, 2), (4,)), (1,), (1, 4))
    later = [rows(x, 1, 2), rows(x, 2, 3)]
    losses = [total(make_mul(r, shared), (0, 1)) for r in [first, *later]]
    summed = normal_form(make_lin([(Fraction(1), t) for t in losses[::-1]], Fraction(0), (),
                                  F32))
    whole = normal_form(total(make_mul(x, make_broadcast(make_reshape(rows(w, 1, 2), (4,)),
                                                         (1,), (3, 4))), (0, 1)))
    assert summed is whole and proved(summed, whole)
    # must fail: a row of the batch read twice, another left out
    twice = normal_form(make_lin([(Fraction(1), t) for t in losses[:2] + losses[:1]],
                                 Fraction(0), (), F32))
    assert twice is not whole and refuted(twice, whole)


def test_zero_pads_of_a_sum_join_under_the_pad() -> None:
    """A stage's row of a stacked layer's gradient, one micro-batch at a time: the sum of
    the micro-batches' row sums each padded into the stage's rows is the padded row sum of
    the batch (`_peel` reads through zero pads)."""
    x = make_arg(0, (8, 3), F32)
    zero = make_splat(0, (), F32)

    def padded(r):
        return make_op("pad", (make_reshape(total(r, (0,)), (1, 3)), zero),
                       ((1, 0), (0, 0), (0, 0)), (2, 3), F32, linear_in=0)

    parts = [padded(rows(x, 2 * i, 2 * i + 2)) for i in range(4)]
    summed = normal_form(make_lin([(Fraction(1), p) for p in parts], Fraction(0), (2, 3), F32))
    assert summed is normal_form(padded(x)) and proved(summed, padded(x))
    # must fail: a micro-batch padded into the other row
    other = make_op("pad", (make_reshape(total(rows(x, 6, 8), (0,)), (1, 3)), zero),
                    ((0, 0), (1, 0), (0, 0)), (2, 3), F32, linear_in=0)
    wrong = normal_form(make_lin([(Fraction(1), p) for p in parts[:3] + [other]], Fraction(0),
                                 (2, 3), F32))
    assert wrong is not normal_form(padded(x)) and refuted(wrong, padded(x))


def _lin(pairs, shape):
    return make_lin([(Fraction(c), t) for c, t in pairs], Fraction(0), tuple(shape), F32)


def test_micro_batch_sums_listed_in_other_orders_pull_one_sign() -> None:
    """`(8 * y - x) * w` of two micro-batches whose rows were read in other orders (the sum
    lists its parts by serial: `-x` first in one piece, `8 * y` first in the other): the
    content a product pulls out of a sum is signed by its greatest coefficient
    (`terms.content_sign`), not by whichever part is listed first, so the pieces lift into
    the whole batch's product (the 1F1B pipeline's norm gradients, issue 18)."""
    x, y, w = (make_arg(40 + i, (2, 3), F32) for i in range(3))
    read = [(rows(x, 0, 1), rows(y, 0, 1)), tuple(reversed((rows(y, 1, 2), rows(x, 1, 2))))]

    def piece(i: int, k: int = 8):
        u, v = read[i]
        return make_mul(_lin([(-1, u), (k, v)], (1, 3)), rows(w, i, i + 1))

    whole = make_mul(_lin([(-1, x), (8, y)], (2, 3)), w)
    pieces = [piece(0), piece(1)]
    assert make_concat(pieces, 0) is normal_form(whole) and proved(raw_concat(pieces, 0), whole)
    # must fail: the second micro-batch's coefficient off by one
    wrong = [pieces[0], piece(1, 7)]
    assert make_concat(wrong, 0) is not normal_form(whole)
    assert refuted(raw_concat(wrong, 0), whole)


def test_differences_listed_in_other_orders_pull_one_sign() -> None:
    """`(x * y - z) * w` of two micro-batches whose rows were read in other orders (`x * y`
    first in one piece's sum, `-z` first in the other's): a difference `a - b` (the tie of
    `terms.content_sign`, its two coefficients of one magnitude) is signed by the skeletons
    of its parts (`terms.skeleton`: a product before a slice, whatever their serials), so
    both pieces pull the same sign and lift into the whole batch's product (a dp x pp
    pipeline's weight gradients, one row a device; benchmarks/FRONTIER_RESULTS.md)."""
    x, y, z, w = (make_arg(60 + i, (2, 3), F32) for i in range(4))
    first = _lin([(1, make_mul(rows(x, 0, 1), rows(y, 0, 1))), (-1, rows(z, 0, 1))], (1, 3))
    late = rows(z, 1, 2)  # built before the product: listed first in the second sum

    def second(k: int = -1):
        return _lin([(k, late), (1, make_mul(rows(x, 1, 2), rows(y, 1, 2)))], (1, 3))

    pieces = [make_mul(first, rows(w, 0, 1)), make_mul(second(), rows(w, 1, 2))]
    whole = make_mul(_lin([(1, make_mul(x, y)), (-1, z)], (2, 3)), w)
    assert make_concat(pieces, 0) is normal_form(whole) and proved(raw_concat(pieces, 0), whole)
    # must fail: the second micro-batch's difference the other way round (z - x * y)
    flipped = make_mul(_lin([(1, late), (-1, make_mul(rows(x, 1, 2), rows(y, 1, 2)))], (1, 3)),
                       rows(w, 1, 2))
    assert make_concat([pieces[0], flipped], 0) is not normal_form(whole)
    assert refuted(raw_concat([pieces[0], flipped], 0), whole)


def test_products_of_one_coefficient_pair_up_by_their_factors() -> None:
    """`3 * a * t * u + 3 * a * u` of two micro-batches, each listing its two products in
    another order: the parts of one coefficient pair up by the ops of their factors
    (`normal_form._arg_ops`), not by position, and lift into the whole batch's sum."""
    a, t, u = (make_arg(50 + i, (2, 3), F32) for i in range(3))

    def three(i: int, second=t):
        return make_mul(make_mul(rows(a, i, i + 1), rows(second, i, i + 1)), rows(u, i, i + 1))

    def two(i: int):
        return make_mul(rows(a, i, i + 1), rows(u, i, i + 1))

    first = _lin([(3, three(0)), (3, two(0))], (1, 3))
    listed_first = two(1)
    second = _lin([(3, listed_first), (3, three(1))], (1, 3))
    whole = _lin([(3, make_mul(make_mul(a, t), u)), (3, make_mul(a, u))], (2, 3))
    assert make_concat([first, second], 0) is normal_form(whole)
    assert proved(raw_concat([first, second], 0), whole)
    # must fail: the second micro-batch's three-factor product reads `a` for `t`
    wrong = _lin([(3, listed_first), (3, three(1, a))], (1, 3))
    assert make_concat([first, wrong], 0) is not normal_form(whole)
    assert refuted(raw_concat([first, wrong], 0), whole)


def test_pieces_signed_apart_meet_the_whole_inside_a_contraction() -> None:
    """`g * (x - y)` cut in two row blocks, the first block's sum built with y's rows first:
    the builders sign a sum's content by serial, so that block is `-(g * (y - x))` and the
    concatenation of the blocks does not rejoin into the whole. Inside a contraction the
    blocks still meet the reference's whole tensor (congruence: same op and operand, the
    other operand's rows meet the pieces), as Z3 confirms on the raw terms; the blocks in the
    other order, or a piece of `g * (y - x)` (the sign really flipped), or another weight do
    not meet and are refuted."""
    g, x, y, w, v = (make_arg(930 + i, s, F32) for i, s in enumerate(
        [(4, 3), (4, 3), (4, 3), (3, 5), (3, 5)]))
    dot = ((), (), (1,), (0,))
    whole = make_mul(g, make_elementwise("stablehlo.subtract", (x, y)))
    rows(y, 0, 2), rows(x, 0, 2)  # y's rows get the lower serial: the first block's sign
    p0, p1 = (normal_form(rows(whole, a, a + 2), {}) for a in (0, 2))
    assert make_concat([p0, p1], 0).op == "concatenate"  # the blocks do not rejoin
    want = normal_form(make_dot(whole, w, dot, (4, 5), F32), {})

    def contraction(pieces, weight=w):
        return raw("stablehlo.dot_general", (raw_concat(pieces, 0), weight), dot, (4, 5))

    got = contraction([p0, p1])
    assert normal_form(got, {}) is not want and blocks_meet(want, normal_form(got, {}), {})
    assert proved(want, got)
    flipped = normal_form(rows(make_mul(g, make_elementwise("stablehlo.subtract", (y, x))),
                               0, 2), {})
    for wrong in (contraction([p1, p0]), contraction([flipped, p1]), contraction([p0, p1], v)):
        assert not blocks_meet(want, normal_form(wrong, {}), {})
        assert refuted(want, wrong)


def test_products_of_one_coefficient_pair_up_by_a_shared_factor() -> None:
    """RoPE's `cos * a + sin * b` of two micro-batches of two rows, the second listing its
    products the other way round (`sin * b` built first): both are products of a broadcast
    and a slice, alike in their ops, so the parts pair up by the factor they share
    (`normal_form._factor_keys`: the same `cos` broadcast), and the pieces lift into the
    whole batch's sum. The 1F1B pipeline with
    attention needs it once a batch-of-one reshape reads as a broadcast
    (`terms._reshape_broadcast`) and its terms are built in another order."""
    a, b = (make_arg(60 + i, (4, 3), F32) for i in range(2))
    angle = make_arg(62, (3,), F32)
    cos, sin = (make_elementwise(f"stablehlo.{f}", (angle,)) for f in ("cosine", "sine"))

    def wide(t, n: int):
        return make_broadcast(t, (1,), (n, 3))

    def piece(i: int, first, second):
        def one():
            return make_mul(wide(first, 2), rows(a, 2 * i, 2 * i + 2))

        def other():
            return make_mul(wide(second, 2), rows(b, 2 * i, 2 * i + 2))

        if i == 1:  # the sine product built first: the sum lists it first
            later = other()
            return _lin([(1, one()), (1, later)], (2, 3))
        return _lin([(1, one()), (1, other())], (2, 3))

    whole = _lin([(1, make_mul(wide(cos, 4), a)), (1, make_mul(wide(sin, 4), b))], (4, 3))
    pieces = [piece(0, cos, sin), piece(1, cos, sin)]
    assert make_concat(pieces, 0) is normal_form(whole)
    assert proved(raw_concat(pieces, 0), whole)
    # must fail: the second micro-batch's cos and sin exchanged
    wrong = [pieces[0], piece(1, sin, cos)]
    assert make_concat(wrong, 0) is not normal_form(whole)
    assert refuted(raw_concat(wrong, 0), whole)


def test_squeezing_a_slice_with_nothing_to_push_into_ends() -> None:
    """`reshape(slice(x))` dropping a unit dim x has and one the slice makes: the squeeze
    once moved the reshape under the slice, `slice_of_reshape` moved it back, without end
    (the tier's "terms nest too deeply" on every 1F1B step with one row a micro-batch)."""
    x = make_arg(0, (2, 1, 3, 2), F32)
    row = raw_slice(x, (1, 0, 0, 0), (2, 1, 3, 2))
    term = raw("reshape", (row,), (), (3, 2))
    normal = normal_form(term)
    assert proved(term, normal)
    # must fail: the other row
    other = raw("reshape", (raw_slice(x, (0, 0, 0, 0), (1, 1, 3, 2)),), (), (3, 2))
    assert normal_form(other) is not normal and refuted(term, normal_form(other))


def _column_blocks(x, w, order):
    """tanh(x @ w[:, block]) for each block of `order`, w's two column blocks of 2."""
    return [make_elementwise("stablehlo.tanh", (make_dot(x, slice_term(w, 1, lo, lo + 2), DOT,
                                                        (x.shape[0], 2), F32),))
            for lo in order]


def test_adjacent_runs_of_a_concatenation_join() -> None:
    """tp's column blocks of two layers, [f(x0 @ w0[:, :k]), f(x0 @ w0[:, k:]), f(x1 @
    w1[:, :k]), f(x1 @ w1[:, k:])], are [f(x0 @ w0), f(x1 @ w1)]: they do not meet all at
    once (the layers' inputs differ), but each layer's run does."""
    x0, x1 = make_arg(0, (3, 4), F32), make_arg(1, (3, 4), F32)
    w0, w1 = make_arg(2, (4, 4), F32), make_arg(3, (4, 4), F32)
    pieces = _column_blocks(x0, w0, (0, 2)) + _column_blocks(x1, w1, (0, 2))
    layers = [make_elementwise("stablehlo.tanh", (make_dot(x, w, DOT, (3, 4), F32),))
              for x, w in ((x0, w0), (x1, w1))]
    normal = make_concat(pieces, 1)
    assert normal.op == "concatenate" and list(normal.args) == layers
    assert proved(raw_concat(pieces, 1), raw_concat(layers, 1))
    # must fail: layer 0's blocks swapped
    swapped = _column_blocks(x0, w0, (2, 0)) + _column_blocks(x1, w1, (0, 2))
    assert make_concat(swapped, 1) is not normal
    assert refuted(raw_concat(swapped, 1), raw_concat(layers, 1))


def test_a_reduction_keeping_a_unit_dim_is_the_reshaped_reduction() -> None:
    """A sum keeping its operand's unit dim (jax's backward of a one-layer stage's stacked
    weight) meets the builders' form: the reshape above the sum of the squeezed operand."""
    x, g = make_arg(0, (1, 3, 3), F32), make_arg(1, (1, 3, 3), F32)
    product = raw("mul", (x, g), (), (1, 3, 3))

    def builders(dim: int):
        flat = make_elementwise("stablehlo.multiply", (make_reshape(x, (3, 3)),
                                                       make_reshape(g, (3, 3))))
        return make_reshape(make_op("reduce_sum", (flat,), ((dim,),), (3,), F32,
                                    linear_in=0), (1, 3))

    kept = raw("reduce_sum", (product,), ((1,),), (1, 3))
    assert normal_form(kept) is normal_form(builders(0))
    assert proved(kept, builders(0))
    # must fail: the sum over the other dim
    other = raw("reduce_sum", (product,), ((2,),), (1, 3))
    assert normal_form(other) is normal_form(builders(1))
    assert normal_form(other) is not normal_form(kept) and refuted(other, builders(0))


def _halves(w, lo: int, part: int):
    """The rotary half `part` (0: first) of the heads in w's columns [lo, lo + 4), two heads
    of two: `reshape(w[:, lo:lo + 4], (4, 2, 2))[:, :, part]`."""
    block = slice_term(w, 1, lo, lo + 4)
    heads = make_reshape(block, (4, 2, 2))
    return slice_term(heads, 2, part, part + 1)


def test_a_concatenation_of_slices_cut_alike_is_the_slice_of_the_concatenation() -> None:
    """tp shards' rotary halves, `[reshape(w[:, :4])[..., :1], reshape(w[:, 4:])[..., :1]]`
    along the heads, are the half of all the heads."""
    w = make_arg(0, (4, 8), F32)
    pieces = [_halves(w, 0, 0), _halves(w, 4, 0)]
    whole = slice_term(make_reshape(w, (4, 4, 2)), 2, 0, 1)
    assert make_concat(pieces, 1) is whole
    assert proved(raw_concat(pieces, 1), whole)
    # must fail: the second shard's other half
    mixed = [_halves(w, 0, 0), _halves(w, 4, 1)]
    assert make_concat(mixed, 1) is not whole and refuted(raw_concat(mixed, 1), whole)


def _part(x, w, lo: int, hi: int):
    return make_dot(x, slice_term(w, 0, lo, hi), DOT, (2, 3), F32)


def test_a_sum_of_contractions_joins_per_weight() -> None:
    """A tp-partial residual stream, `a0 @ wo[:2] + a1 @ wo[2:] + h0 @ wd[:3] + h1 @
    wd[3:]`, is `[a0 a1] @ wo + [h0 h1] @ wd`: the four do not join as one sum, the two of
    each weight do."""
    a0, a1 = make_arg(0, (2, 2), F32), make_arg(1, (2, 2), F32)
    h0, h1 = make_arg(2, (2, 3), F32), make_arg(3, (2, 3), F32)
    wo, wd = make_arg(4, (4, 3), F32), make_arg(5, (6, 3), F32)

    def stream(order):
        parts = [_part(a0, wo, *order[0]), _part(a1, wo, *order[1]), _part(h0, wd, 0, 3),
                 _part(h1, wd, 3, 6)]
        return make_lin([(Fraction(1), p) for p in parts], Fraction(0), (2, 3), F32)

    joined = make_lin([(Fraction(1), make_dot(raw_concat([a0, a1], 1), wo, DOT, (2, 3), F32)),
                       (Fraction(1), make_dot(raw_concat([h0, h1], 1), wd, DOT, (2, 3), F32))],
                      Fraction(0), (2, 3), F32)
    summed = stream(((0, 2), (2, 4)))
    normal = normal_form(summed)
    assert normal.op == "lin" and len(normal.args) == 2
    assert all(p.op == "stablehlo.dot_general" and p.args[1].op == "arg" for p in normal.args)
    assert proved(summed, normal) and proved(normal, joined)
    # must fail: a0 paired with wo's second block
    crossed = stream(((2, 4), (0, 2)))
    assert normal_form(crossed) is not normal and refuted(crossed, joined)


def test_a_concatenation_of_zero_pads_along_an_unpadded_dim_is_the_pad() -> None:
    """The rotary backward per tp shard of heads, `[pad(g0, high 2), pad(g1, high 2)]` along
    the heads, is the pad of the heads' rows."""
    x = make_arg(0, (4, 2), F32)
    zero = make_splat(0, (), F32)

    def padded(lo, hi, low, high):
        return make_op("pad", (slice_term(x, 0, lo, hi), zero), ((0, low), (0, high), (0, 0)),
                       (hi - lo, 2 + low + high), F32, linear_in=0)

    pieces = [padded(0, 2, 0, 2), padded(2, 4, 0, 2)]
    whole = make_op("pad", (x, zero), ((0, 0), (0, 2), (0, 0)), (4, 4), F32, linear_in=0)
    assert make_concat(pieces, 0) is whole
    assert proved(raw_concat(pieces, 0), whole)
    # must fail: the second shard padded on the other side
    other = [padded(0, 2, 0, 2), padded(2, 4, 2, 0)]
    assert make_concat(other, 0) is not whole and refuted(raw_concat(other, 0), whole)


def _stage_part(base, w, cols: tuple[int, int], rows: tuple[int, int]):
    """A stage's contribution `tanh(base[:, cols]) @ w[rows]` (a computed lhs: no argument
    moved, its first slice a window of the stage's own input)."""
    x = make_elementwise("stablehlo.tanh", (slice_term(base, 1, *cols),))
    return make_dot(x, slice_term(w, 0, *rows), DOT, (2, 3), F32)


def test_a_sum_of_stages_contractions_joins_per_weight_in_any_order() -> None:
    """Two stages' (micro-batches') tp-partial contributions to one residual stream, `p0 =
    tanh(P[:, :2]) @ wo[:2]`, `p1 = tanh(Q[:, :2]) @ wo[2:]`, `p2 = tanh(P[:, 2:]) @ wd[:3]`,
    `p3 = tanh(Q[:, 2:]) @ wd[3:]`, join per weight, `[tanh(P[:, :2]) tanh(Q[:, :2])] @ wo +
    [...] @ wd`, not per stage (split by the first slice under each computed lhs, `tanh(P) @
    [wo[:2] wd[:3]] + tanh(Q) @ [...]`, the form no whole-batch reference takes), whichever
    order the parts are listed in."""
    p, q = make_arg(0, (2, 5), F32), make_arg(1, (2, 5), F32)
    wo, wd = make_arg(2, (4, 3), F32), make_arg(3, (6, 3), F32)

    def parts(wd_rows=((0, 3), (3, 6)), wo_bases=(p, q)):
        return [_stage_part(wo_bases[0], wo, (0, 2), (0, 2)),
                _stage_part(wo_bases[1], wo, (0, 2), (2, 4)),
                _stage_part(p, wd, (2, 5), wd_rows[0]), _stage_part(q, wd, (2, 5), wd_rows[1])]

    def total(terms):
        return make_lin([(Fraction(1), t) for t in terms], Fraction(0), (2, 3), F32)

    def tanh(base, lo, hi):
        return make_elementwise("stablehlo.tanh", (raw_slice(base, (0, lo), (2, hi)),))

    reference = total([
        raw("stablehlo.dot_general", (raw_concat([tanh(p, 0, 2), tanh(q, 0, 2)], 1), wo), DOT,
            (2, 3)),
        raw("stablehlo.dot_general", (raw_concat([tanh(p, 2, 5), tanh(q, 2, 5)], 1), wd), DOT,
            (2, 3))])
    p0, p1, p2, p3 = parts()
    flat = total([p0, p1, p2, p3])
    normal = normal_form(flat)
    assert normal.op == "lin" and len(normal.args) == 2
    assert {t.args[1].op for t in normal.args} == {"arg"}  # each weight whole: per weight
    assert normal_form(total([p3, p0, p2, p1])) is normal
    assert proved(flat, normal) and proved(normal, reference)
    # must fail: another order (Q's rows with wo's first block), a part dropped, another
    # weight slice (the second stage's wd block read at the first's rows)
    crossed = total(parts(wo_bases=(q, p)))
    dropped = total([p0, p1, p2])
    shifted = total(parts(wd_rows=((0, 3), (0, 3))))
    for wrong in (crossed, dropped, shifted):
        assert normal_form(wrong) is not normal and refuted(wrong, reference)


def test_rotary_pieces_of_other_head_counts_pair_by_their_tables() -> None:
    """Rotary embeddings of 2 heads and of 3 heads, `q_i * cos + r_i * sin` (each table
    broadcast over the piece's heads), concatenated along the heads: the parts pair up by
    the table they broadcast (not in the order their serials list them), so the concatenation
    is `[q_0 q_1] * cos + [r_0 r_1] * sin`."""
    cos, sin = make_arg(0, (2,), F32), make_arg(1, (2,), F32)
    q0, r0 = make_arg(2, (2, 2), F32), make_arg(3, (2, 2), F32)
    q1, r1 = make_arg(4, (2, 3), F32), make_arg(5, (2, 3), F32)

    def table(t, heads):
        return make_broadcast(t, (0,), (2, heads))

    def rotary(q, r, heads, first, second, sin_first=False):
        parts = [(Fraction(1), make_mul(r, table(second, heads)))] if sin_first else []
        parts.append((Fraction(1), make_mul(q, table(first, heads))))
        if not sin_first:
            parts.append((Fraction(1), make_mul(r, table(second, heads))))
        return make_lin(parts, Fraction(0), (2, heads), F32)

    def tanh(x):
        return make_elementwise("stablehlo.tanh", (x,))

    two = rotary(q0, r0, 2, cos, sin)
    one = rotary(tanh(q1), tanh(r1), 3, cos, sin, sin_first=True)
    def tables(rotated):
        return [next(f for f in part.args if f.op == "broadcast").args[0]
                for part in rotated.args]

    assert tables(two) != tables(one)  # listed in other orders
    whole = make_concat([two, one], 1)
    lifted = make_lin([(Fraction(1), make_mul(make_concat([q0, tanh(q1)], 1), table(cos, 5))),
                       (Fraction(1), make_mul(make_concat([r0, tanh(r1)], 1), table(sin, 5)))],
                      Fraction(0), (2, 5), F32)
    assert whole is lifted
    assert proved(raw_concat([two, one], 1), lifted)
    # must fail: the 3-head piece with its tables swapped
    swapped = rotary(tanh(q1), tanh(r1), 3, sin, cos)
    assert make_concat([two, swapped], 1) is not lifted
    assert refuted(raw_concat([two, swapped], 1), lifted)


def test_rotary_pieces_pair_whatever_order_their_factors_were_built_in() -> None:
    """As above, with the tables broadcast before the arguments exist (another check in the
    process built them first): the 2-head piece lists `bcast(sin) * r_0`, the 3-head one
    `tanh(r_1) * bcast(sin)`. The broadcasts line up by kind and the other factors by
    elimination (no one key tells `r_0` and `tanh(r_1)` apart), so the form is the same."""
    cos, sin = make_arg(0, (2,), F32), make_arg(1, (2,), F32)
    early = [make_broadcast(t, (0,), (2, 2)) for t in (cos, sin)]
    q0, r0 = make_arg(2, (2, 2), F32), make_arg(3, (2, 2), F32)
    q1, r1 = make_arg(4, (2, 3), F32), make_arg(5, (2, 3), F32)
    tanh_q1, tanh_r1 = (make_elementwise("stablehlo.tanh", (x,)) for x in (q1, r1))
    late = [make_broadcast(t, (0,), (2, 3)) for t in (cos, sin)]
    two = make_lin([(Fraction(1), make_mul(q0, early[0])), (Fraction(1), make_mul(r0, early[1]))],
                   Fraction(0), (2, 2), F32)
    one = make_lin([(Fraction(1), make_mul(tanh_q1, late[0])),
                    (Fraction(1), make_mul(tanh_r1, late[1]))], Fraction(0), (2, 3), F32)
    assert make_mul(r0, early[1]).args[0] is early[1]
    assert make_mul(tanh_r1, late[1]).args[0] is tanh_r1
    both = [make_broadcast(t, (0,), (2, 5)) for t in (cos, sin)]
    lifted = make_lin([(Fraction(1), make_mul(make_concat([q0, tanh_q1], 1), both[0])),
                       (Fraction(1), make_mul(make_concat([r0, tanh_r1], 1), both[1]))],
                      Fraction(0), (2, 5), F32)
    assert make_concat([two, one], 1) is lifted
    assert proved(raw_concat([two, one], 1), lifted)
    # must fail: the 3-head piece's factors crossed (q_1 with sin, r_1 with cos)
    crossed = make_lin([(Fraction(1), make_mul(tanh_q1, late[1])),
                        (Fraction(1), make_mul(tanh_r1, late[0]))], Fraction(0), (2, 3), F32)
    assert make_concat([two, crossed], 1) is not lifted
    assert refuted(raw_concat([two, crossed], 1), lifted)


def test_a_sum_of_more_contractions_than_blocks_joins_into_one() -> None:
    """A deep stack's tp-partial residual stream sums layers x tp contractions (16 layers at
    tp 8: 128 > `MAX_BLOCKS`), `sum_i h_i @ w[i]`: one contraction `[h_0 ... h_79] @ w`,
    as the reference's stream of whole layers joins."""
    n = 80
    hs = [make_arg(i, (2, 1), F32) for i in range(n)]
    w = make_arg(n, (n, 3), F32)

    def stream(blocks):
        return make_lin([(Fraction(1), make_dot(h, slice_term(w, 0, b, b + 1), DOT, (2, 3),
                                                F32)) for h, b in zip(hs, blocks)],
                        Fraction(0), (2, 3), F32)

    whole = make_dot(raw_concat(hs, 1), w, DOT, (2, 3), F32)
    summed = stream(range(n))
    normal = normal_form(summed)
    assert normal.op == "stablehlo.dot_general" and normal.args[1] is w
    assert proved(summed, normal) and proved(normal, whole)
    # must fail: one block read twice (the last layer's weight rows for the one before)
    doubled = stream([*range(n - 1), n - 2])
    assert normal_form(doubled) is not normal and refuted(doubled, whole)


def test_micro_batch_losses_join_behind_many_weight_slices() -> None:
    """The losses of micro-batches computed alike through a deep stage (70 layers, each a
    maximum with a row of one weight): the first piece built lists its 70 weight slices before its
    micro-batch's row, so the pieces' distinct rows are found only past `MAX_SLICES_SEEN`
    = 64 slices (32 layers of a pipeline stage passed it). One sum over the batch."""
    n = 70
    x, w = make_arg(0, (3, 4), F32), make_arg(1, (n, 4), F32)

    def stage(h):
        for k in range(n):
            floor = make_broadcast(make_reshape(rows(w, k, k + 1), (4,)), (1,), h.shape)
            h = make_elementwise("stablehlo.maximum", (h, floor))
        return h

    batch = [rows(x, i, i + 1) for i in range(3)]
    losses = [total(stage(r), (0, 1)) for r in batch]
    summed = make_lin([(Fraction(1), t) for t in losses], Fraction(0), (), F32)
    whole = normal_form(total(stage(x), (0, 1)))
    assert normal_form(summed) is whole and proved(summed, whole)
    # must fail: a row of the batch read twice, another left out
    twice = make_lin([(Fraction(1), t) for t in losses[:2] + losses[:1]], Fraction(0), (),
                     F32)
    assert normal_form(twice) is not whole and refuted(twice, whole)
