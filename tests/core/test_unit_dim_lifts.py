"""Lemmas of the normal-form identities that meet a unit dim present on one side and absent on
the other (issues 19 / 21: one kv head a device at tp 8, one batch row a device, a batch of
one). Each identity is proved by Z3 on small symbolic tensors (the term before, written with
raw nodes the builders do not touch, against the normal form after), and its nearest wrong
variant (pieces in the other order, the copies on the other side of the split, a broadcast
along the other dim) is refuted and not met.
"""

from __future__ import annotations

from entangle_mlir.core.normal_form import (
    broadcast_hoisted,
    make_concat,
    normal_form,
    slice_term,
)
from entangle_mlir.core.terms import (
    make_arg,
    make_broadcast,
    make_dot,
    make_elementwise,
    make_mul,
    make_op,
    make_reshape,
)
from tests.core.raw_terms import F32, proved, raw, raw_concat, refuted


def raw_broadcast(x, dims, shape):
    return raw("broadcast", (x,), (tuple(dims),), shape, x.dtype)


def raw_reshape(x, shape):
    return raw("reshape", (x,), (), shape, x.dtype)


def test_an_op_of_broadcasts_along_a_dim_none_fills_is_broadcast_after_it() -> None:
    """`sin(broadcast(t) * broadcast(f))` with neither factor filling dim 0: the broadcast
    along dim 0 of `sin(t * f)` computed once (a RoPE table rebuilt from copies of one
    (seq, d) block meets the reference's table broadcast over the batch). Wrong: the table
    broadcast along the other dim (the transposed table) is refuted and not met."""
    t, f = make_arg(0, (3,), F32), make_arg(1, (2,), F32)
    angle = raw("mul", (raw_broadcast(t, (1,), (4, 3, 2)), raw_broadcast(f, (2,), (4, 3, 2))),
                (), (4, 3, 2))
    wide = raw("stablehlo.sine", (angle,), (), (4, 3, 2))
    table = make_elementwise("stablehlo.sine", (make_mul(make_broadcast(t, (0,), (3, 2)),
                                                          make_broadcast(f, (1,), (3, 2))),))
    want = make_broadcast(table, (1, 2), (4, 3, 2))
    assert normal_form(wide, {}) is want and proved(wide, want)
    assert broadcast_hoisted(make_mul(make_broadcast(t, (1,), (4, 3)),
                                      make_arg(2, (4, 3), F32))) is None  # one operand varies
    u, v = make_arg(3, (2,), F32), make_arg(4, (2,), F32)

    def table(du: int, dv: int):
        return make_broadcast(make_elementwise("stablehlo.sine", (make_mul(
            make_broadcast(u, (du,), (2, 2)), make_broadcast(v, (dv,), (2, 2))),)), (1, 2),
            (3, 2, 2))

    square = raw("stablehlo.sine", (raw("mul", (raw_broadcast(u, (1,), (3, 2, 2)),
                                                 raw_broadcast(v, (2,), (3, 2, 2))), (),
                                        (3, 2, 2)),), (), (3, 2, 2))
    assert normal_form(square, {}) is table(0, 1) and proved(square, table(0, 1))
    assert table(1, 0) is not table(0, 1) and refuted(square, table(1, 0))


def test_a_reshape_splitting_a_concatenation_at_its_pieces_splits_each_piece() -> None:
    """`reshape(concat(x_0 .. x_3 along 0), (4, 8, 2))` of (8, 2) pieces: each piece is one
    row of the split dim, the concatenation of the pieces reshaped (`reshape_of_concat`);
    four copies of one table are its broadcast. Wrong: the pieces in the other order; and
    pieces cut off the split's rows (6 + 10 rows into rows of 4) are left alone."""
    xs = [make_arg(10 + i, (8, 2), F32) for i in range(4)]
    before = raw_reshape(raw_concat(xs, 0), (4, 8, 2))
    after = normal_form(before, {})
    assert after is make_concat([make_reshape(x, (1, 8, 2)) for x in xs], 0)
    assert proved(before, after)
    swapped = make_concat([make_reshape(x, (1, 8, 2)) for x in reversed(xs)], 0)
    assert swapped is not after and refuted(before, swapped)
    copies = normal_form(raw_reshape(raw_concat([xs[0]] * 4, 0), (4, 8, 2)), {})
    assert copies is make_broadcast(xs[0], (1, 2), (4, 8, 2))
    uneven = raw_reshape(raw_concat([make_arg(20, (6, 2), F32), make_arg(21, (10, 2), F32)],
                                    0), (4, 4, 2))
    assert normal_form(uneven, {}).op == "reshape"


def test_pieces_smaller_than_a_row_of_the_split_join_into_rows() -> None:
    """`reshape(concat(x_0 .. x_7 along 0), (4, 2, 3, 2))` of (1, 3, 2) pieces (one batch row
    a device, two rows a micro-batch): consecutive pairs make the rows of the split dim, each
    the concatenation along the next dim of its pieces given unit dims
    (`reshape_of_concat`); the normal form is the one the pieces placed by hand have. Wrong:
    the pieces of each pair swapped (refuted, another form); pieces that do not fill a row
    one by one (1 + 2 + 1 of rows of 2: a run of two rows) are left alone."""
    xs = [make_arg(40 + i, (1, 3, 2), F32) for i in range(8)]
    before = raw_reshape(raw_concat(xs, 0), (4, 2, 3, 2))
    after = normal_form(before, {})
    placed = make_concat([make_concat([make_reshape(xs[2 * i + j], (1, 1, 3, 2))
                                       for j in range(2)], 1) for i in range(4)], 0)
    assert after is normal_form(placed, {})
    assert proved(before, after)
    swapped = make_concat([make_concat([make_reshape(xs[2 * i + 1 - j], (1, 1, 3, 2))
                                        for j in range(2)], 1) for i in range(4)], 0)
    assert normal_form(swapped, {}) is not after and refuted(before, swapped)
    ys = [make_arg(50, (1, 3, 2), F32), make_arg(51, (2, 3, 2), F32),
          make_arg(52, (1, 3, 2), F32)]
    assert normal_form(raw_reshape(raw_concat(ys, 0), (2, 2, 3, 2)), {}).op == "reshape"


def _kv_heads(n: int, k: int):
    """Per device i, one kv head of `x @ w` (w's columns i*d .. (i+1)*d, the head dim left
    out) broadcast to its k query heads, and the whole: all heads computed at once and each
    broadcast to k query heads, merged by a reshape (GQA's repeat of the kv heads)."""
    d = 2
    x, w = make_arg(30, (4, 3), F32), make_arg(31, (3, n * d), F32)
    dims = ((), (), (1,), (0,))
    pieces = [make_broadcast(make_dot(x, slice_term(w, 1, i * d, (i + 1) * d), dims, (4, d),
                                      F32), (0, 2), (4, k, d)) for i in range(n)]
    heads = make_dot(x, make_reshape(w, (3, n, d)), dims, (4, n, d), F32)
    whole = make_reshape(make_broadcast(heads, (0, 1, 3), (4, n, k, d)), (4, n * k, d))
    return pieces, heads, whole


def test_one_kv_head_a_device_broadcast_to_its_query_heads_lifts() -> None:
    """The unsqueeze lift: pieces broadcast along a dim no operand dim fills, k rows each,
    concatenated along it, are the operands given a unit dim and concatenated along it,
    broadcast to (pieces, k) and merged (one kv head a device at tp 8, its k query heads).
    Wrong: the copies outside the heads (`(k, n)` merged: head-major order) and the devices
    in the other order are refuted and not met."""
    pieces, heads, whole = _kv_heads(3, 2)
    assert make_concat(pieces, 1) is normal_form(whole, {})
    assert proved(raw_concat(pieces, 1), whole)
    copies_outside = make_reshape(make_broadcast(heads, (0, 2, 3), (4, 2, 3, 2)), (4, 6, 2))
    assert copies_outside is not normal_form(whole, {})
    assert refuted(raw_concat(pieces, 1), copies_outside)
    backwards = make_concat(list(reversed(pieces)), 1)
    assert backwards is not normal_form(whole, {})
    assert refuted(raw_concat(list(reversed(pieces)), 1), whole)


def test_kv_heads_made_of_two_halves_lift_through_the_halves() -> None:
    """The same pieces when each head is itself a concatenation (RoPE's two halves, here
    columns of two inputs): the unit dim goes to each half (`unsqueezed`), and the halves'
    columns meet. Wrong: the halves exchanged in one device is refuted and not met."""
    n, k = 3, 2
    a, b = make_arg(40, (4, n), F32), make_arg(41, (4, n), F32)

    def head(i: int, first=a, second=b):
        return make_concat([slice_term(first, 1, i, i + 1), slice_term(second, 1, i, i + 1)], 1)

    pieces = [make_broadcast(head(i), (0, 2), (4, k, 2)) for i in range(n)]
    halves = make_concat([make_reshape(a, (4, n, 1)), make_reshape(b, (4, n, 1))], 2)
    whole = make_reshape(make_broadcast(halves, (0, 1, 3), (4, n, k, 2)), (4, n * k, 2))
    assert make_concat(pieces, 1) is normal_form(whole, {})
    assert proved(raw_concat(pieces, 1), whole)
    wrong = [pieces[0], make_broadcast(head(1, b, a), (0, 2), (4, k, 2)), pieces[2]]
    assert make_concat(wrong, 1) is not normal_form(whole, {})
    assert refuted(raw_concat(wrong, 1), whole)


def test_a_partly_joined_piece_lines_up_by_its_first_piece() -> None:
    """`concat(d0, d1) * g` next to `g' * d2` (the first two pieces joined before the third
    came, each product listing its operands by serial): the operands line up by the kind of
    the concatenation's first piece (`normal_form._leading`), and the pieces lift into one
    product (d1 and d2 read adjacent columns of one weight and join). Wrong: the third
    piece's factor taken from another weight is refuted and not met."""
    x0, x1 = make_arg(50, (4, 3), F32), make_arg(51, (4, 3), F32)
    w0, w, other = (make_arg(52 + i, (3, n), F32) for i, n in enumerate((2, 4, 4)))
    v = make_arg(55, (4,), F32)
    dims = ((), (), (1,), (0,))

    def dot(x, weight):
        return make_dot(x, weight, dims, (4, weight.shape[1]), F32)

    g2 = make_broadcast(v, (0,), (4, 2))
    d0, d1 = dot(x0, w0), dot(x1, slice_term(w, 1, 0, 2))
    first = make_mul(make_concat([d0, d1], 1), make_broadcast(v, (0,), (4, 4)))
    third = make_mul(g2, dot(x1, slice_term(w, 1, 2, 4)))
    whole = make_mul(make_concat([d0, dot(x1, w)], 1), make_broadcast(v, (0,), (4, 6)))
    assert make_concat([first, third], 1) is normal_form(whole, {})
    assert proved(raw_concat([first, third], 1), whole)
    wrong = make_mul(g2, dot(x1, slice_term(other, 1, 2, 4)))
    assert make_concat([first, wrong], 1) is not normal_form(whole, {})
    assert refuted(raw_concat([first, wrong], 1), whole)


def _strided(j: int, offset: int = 2, stride: int = 4):
    """Head j's columns [offset, offset + 2) of a (6, 8) layer (two heads of 4 columns), the
    head dim inserted as a unit dim: what one device reads of a projection at one kv head a
    device (a rotary half of its head)."""
    a = make_arg(60, (2, 6, 8), F32)
    cols = stride * j + offset
    window = make_op("slice", (a,), ((0, 0, cols), (1, 6, cols + 2), (1, 1, 1)), (1, 6, 2),
                     F32, linear_in=0)
    return make_reshape(window, (6, 1, 2))


def test_heads_read_at_a_stride_are_one_strided_slice() -> None:
    """`concat_j reshape(slice(a, head j's columns 2:4))` along the unit head dim: one slice of
    the layer read as (rows, heads, head dim) (`_strided_rows`: each piece is checked to be
    the candidate's row). Wrong: the heads in the other order, and the other half's offset
    in one head, are refuted and not met; windows not at one stride are left alone."""
    a = make_arg(60, (2, 6, 8), F32)
    layer = make_op("slice", (a,), ((0, 0, 0), (1, 6, 8), (1, 1, 1)), (1, 6, 8), F32,
                    linear_in=0)
    whole = normal_form(slice_term(make_reshape(layer, (6, 2, 4)), 2, 2, 4), {})
    pieces = [_strided(j) for j in range(2)]
    assert make_concat(pieces, 1) is whole and proved(raw_concat(pieces, 1), whole)
    backwards = list(reversed(pieces))
    assert make_concat(backwards, 1) is not whole and refuted(raw_concat(backwards, 1), whole)
    shifted = [pieces[0], _strided(1, offset=1)]
    assert make_concat(shifted, 1) is not whole and refuted(raw_concat(shifted, 1), whole)
    assert make_concat([_strided(0), _strided(1, stride=3)], 1).op == "concatenate"


def test_one_column_pieces_of_two_layers_join_layer_by_layer() -> None:
    """One-column contractions of two layers side by side (one kv head a device, each stage's
    heads next to the other's): the runs that share an operand join into one contraction
    each (`_heads_of_contractions`). Wrong: the layers' inputs exchanged is refuted."""
    x0, x1 = make_arg(70, (4, 3), F32), make_arg(71, (4, 3), F32)
    w0, w1 = make_arg(72, (3, 2), F32), make_arg(73, (3, 2), F32)
    dims = ((), (), (1,), (0,))

    def col(x, w, j):
        return make_dot(x, slice_term(w, 1, j, j + 1), dims, (4, 1), F32)

    pieces = [col(x0, w0, 0), col(x0, w0, 1), col(x1, w1, 0), col(x1, w1, 1)]
    whole = make_concat([make_dot(x0, w0, dims, (4, 2), F32),
                         make_dot(x1, w1, dims, (4, 2), F32)], 1)
    assert make_concat(pieces, 1) is whole and proved(raw_concat(pieces, 1), whole)
    wrong = [col(x1, w0, 0), col(x1, w0, 1), col(x0, w1, 0), col(x0, w1, 1)]
    assert make_concat(wrong, 1) is not whole and refuted(raw_concat(wrong, 1), whole)


def test_pieces_without_their_head_dim_stack_along_it() -> None:
    """`concat_i reduce_sum(y_i over the copies)` along the head dim (4, k) each: a GQA
    backward's sum over one kv head's k query heads, the kv-head dim left out and merged
    with the head dim. Stacked along a unit head dim (`_stacked_rows`) the pieces are rows
    of one reduction, the unit dim kept before the copies it sums (`_reduction_keeping_unit`,
    `early`). Wrong: the kv heads in the other order are refuted and not met."""
    n, r, k = 2, 2, 2
    y, z = make_arg(80, (4, n, r, k), F32), make_arg(81, (4, n, r, k), F32)

    def piece(i: int):
        rows = make_mul(*(make_reshape(slice_term(t, 1, i, i + 1), (4, r, k)) for t in (y, z)))
        return make_op("reduce_sum", (rows,), ((1,),), (4, k), F32, linear_in=0)

    summed = make_op("reduce_sum", (make_mul(y, z),), ((2,),), (4, n, k), F32, linear_in=0)
    whole = normal_form(make_reshape(summed, (4, n * k)), {})
    pieces = [piece(i) for i in range(n)]
    assert make_concat(pieces, 1) is whole and proved(raw_concat(pieces, 1), whole)
    backwards = list(reversed(pieces))
    assert make_concat(backwards, 1) is not whole and refuted(raw_concat(backwards, 1), whole)
