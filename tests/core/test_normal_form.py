"""Lemmas of `core/normal_form/`: every identity it applies is proved by Z3 on small
symbolic tensors of several shapes (the term before, written out with raw nodes the builders
do not touch, against the normal form after), and a wrong variant of each (pieces swapped,
rows off by one, contractions paired out of order) is refuted and left alone."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from entangle_mlir.analysis.instance.term_equality import check_term_equality
from entangle_mlir.core.normal_form import (
    blocks_meet,
    generic_element,
    make_concat,
    normal_form,
    slice_term,
    split_like,
    update_slice,
)
from entangle_mlir.core.terms import (
    DENSE_VALUES,
    intern,
    make_add,
    make_arg,
    make_broadcast,
    make_dense,
    make_dot,
    make_elementwise,
    make_iota,
    make_lin,
    make_mul,
    make_op,
    make_reshape,
    make_splat,
    make_transpose,
    rebuild,
    rebuild_elementwise,
    subterms,
)
from entangle_mlir.semantics.evaluate import evaluate_term
from entangle_mlir.semantics.tensor import obj_array

F32 = "f32"


def raw_slice(term, dim: int, start: int, stop: int):
    """rows [start, stop) of `term` along `dim` as a raw node (no builder rewriting)."""
    rank = len(term.shape)
    starts = tuple(start if d == dim else 0 for d in range(rank))
    limits = tuple(stop if d == dim else n for d, n in enumerate(term.shape))
    shape = tuple(stop - start if d == dim else n for d, n in enumerate(term.shape))
    return intern("slice", (term,), (starts, limits, (1,) * rank), shape, term.dtype)


def raw_concat(pieces, dim: int):
    shape = list(pieces[0].shape)
    shape[dim] = sum(p.shape[dim] for p in pieces)
    return intern("concatenate", tuple(pieces), (dim,), tuple(shape), pieces[0].dtype)


def proved(a, b) -> bool:
    return check_term_equality(a, b, "normal_form.lemma").status == "proved"


def refuted(a, b) -> bool:
    return check_term_equality(a, b, "normal_form.must_fail").status == "refuted"


SHAPES = [(8,), (6, 3), (4, 2, 3)]


@pytest.mark.parametrize("shape", SHAPES)
def test_adjacent_slices_join(shape) -> None:
    x = make_arg(0, shape, F32)
    n = shape[0]
    cut = n // 2
    before = raw_concat([raw_slice(x, 0, 0, cut), raw_slice(x, 0, cut, n)], 0)
    assert make_concat([slice_term(x, 0, 0, cut), slice_term(x, 0, cut, n)], 0) is x
    assert proved(before, x)
    part = make_concat([slice_term(x, 0, 1, cut), slice_term(x, 0, cut, n)], 0)
    assert part is slice_term(x, 0, 1, n) and proved(raw_concat(
        [raw_slice(x, 0, 1, cut), raw_slice(x, 0, cut, n)], 0), part)
    # must fail: a gap of one row, or the pieces swapped, is not the tensor
    gap = make_concat([slice_term(x, 0, 0, cut - 1), slice_term(x, 0, cut, n)], 0)
    assert gap.op == "concatenate"
    swapped = make_concat([slice_term(x, 0, cut, n), slice_term(x, 0, 0, cut)], 0)
    assert swapped is not x and refuted(swapped, x)


@pytest.mark.parametrize("shape", SHAPES)
def test_slice_spanning_pieces(shape) -> None:
    a, b = make_arg(0, shape, F32), make_arg(1, shape, F32)
    n = shape[0]
    joined = raw_concat([a, b], 0)
    window = raw_slice(joined, 0, 1, n + 1)
    normal = normal_form(window)
    assert normal.op == "concatenate" and proved(window, normal)
    # must fail: the same pieces one row further on
    off = make_concat([slice_term(a, 0, 2, n), slice_term(b, 0, 0, 2)], 0)
    assert off is not normal and refuted(window, off)


@pytest.mark.parametrize("shape", SHAPES)
def test_elementwise_through_concat(shape) -> None:
    x, y = make_arg(0, shape, F32), make_arg(1, shape, F32)
    n = shape[0]
    pieces = [make_elementwise("stablehlo.tanh", (make_elementwise(
        "stablehlo.multiply", (slice_term(x, 0, lo, hi), slice_term(y, 0, lo, hi))),))
        for lo, hi in ((0, n // 2), (n // 2, n))]
    whole = make_elementwise("stablehlo.tanh", (make_elementwise("stablehlo.multiply",
                                                                 (x, y)),))
    assert make_concat(pieces, 0) is whole
    assert proved(raw_concat(pieces, 0), whole)
    # must fail: the pieces' operands crossed (x's rows with the other half of y)
    crossed = [make_elementwise("stablehlo.tanh", (make_elementwise(
        "stablehlo.multiply", (slice_term(x, 0, lo, hi), slice_term(y, 0, n - hi, n - lo))),))
        for lo, hi in ((0, n // 2), (n // 2, n))]
    if n % 2 == 0:
        assert make_concat(crossed, 0) is not whole
        assert refuted(raw_concat(crossed, 0), whole)


@pytest.mark.parametrize("shape", SHAPES)
def test_linear_pieces_through_concat(shape) -> None:
    x, y = make_arg(0, shape, F32), make_arg(1, shape, F32)
    n = shape[0]

    def lin(lo, hi, k):
        return make_lin([(Fraction(2), slice_term(x, 0, lo, hi)),
                         (Fraction(k), slice_term(y, 0, lo, hi))], Fraction(1),
                        slice_term(x, 0, lo, hi).shape, F32)

    whole = make_lin([(Fraction(2), x), (Fraction(3), y)], Fraction(1), shape, F32)
    pieces = [lin(0, n // 2, 3), lin(n // 2, n, 3)]
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: one piece with another coefficient
    wrong = [lin(0, n // 2, 3), lin(n // 2, n, 4)]
    assert make_concat(wrong, 0) is not whole and refuted(raw_concat(wrong, 0), whole)


@pytest.mark.parametrize("k", [4, 6])
def test_contraction_over_split_dim_joins(k) -> None:
    x, w = make_arg(0, (2, k), F32), make_arg(1, (k, 3), F32)
    attrs = ((), (), (1,), (0,))
    half = k // 2

    def part(lo, hi, rlo, rhi):
        return make_dot(slice_term(x, 1, lo, hi), slice_term(w, 0, rlo, rhi), attrs, (2, 3),
                        F32)

    whole = make_dot(x, w, attrs, (2, 3), F32)
    summed = make_lin([(Fraction(1), part(0, half, 0, half)),
                       (Fraction(1), part(half, k, half, k))], Fraction(0), (2, 3), F32)
    assert normal_form(summed) is whole and proved(summed, whole)
    # must fail: row i of x paired with another row of w
    crossed = make_lin([(Fraction(1), part(0, half, half, k)),
                        (Fraction(1), part(half, k, 0, half))], Fraction(0), (2, 3), F32)
    assert normal_form(crossed) is not whole and refuted(crossed, whole)
    # must fail: pieces with different coefficients do not join
    scaled = make_lin([(Fraction(1), part(0, half, 0, half)),
                       (Fraction(2), part(half, k, half, k))], Fraction(0), (2, 3), F32)
    assert normal_form(scaled) is not whole


def test_a_constant_added_to_joined_contractions_stays() -> None:
    """`dot(x_lo, w_lo) + dot(x_hi, w_hi) + c` is `dot(x, w) + c`: joining the contractions
    keeps the sum's constant (it once dropped it, proving `... + 0.5` equal to `a0 @ a1`)."""
    x, w = make_arg(0, (2, 4), F32), make_arg(1, (4, 3), F32)
    attrs = ((), (), (1,), (0,))

    def part(lo, hi):
        return make_dot(slice_term(x, 1, lo, hi), slice_term(w, 0, lo, hi), attrs, (2, 3), F32)

    whole = make_dot(x, w, attrs, (2, 3), F32)
    for c in (Fraction(1, 2), Fraction(-3)):
        summed = make_lin([(Fraction(1), part(0, 2)), (Fraction(1), part(2, 4))], c, (2, 3),
                          F32)
        want = make_lin([(Fraction(1), whole)], c, (2, 3), F32)
        assert normal_form(summed) is want and proved(summed, want)
        # must fail: the sum without its constant is not the joined contraction
        assert normal_form(summed) is not whole and refuted(summed, whole)


@pytest.mark.parametrize("shape", [(8,), (6, 4)])
def test_sums_over_split_dim_join(shape) -> None:
    x = make_arg(0, shape, F32)
    n = shape[0]
    out = shape[1:]
    def total(lo, hi):
        return make_op("reduce_sum", (slice_term(x, 0, lo, hi),), ((0,),), out, F32,
                       linear_in=0)

    whole = make_op("reduce_sum", (x,), ((0,),), out, F32, linear_in=0)
    summed = make_lin([(Fraction(1), total(0, 3)), (Fraction(1), total(3, n))], Fraction(0),
                      out, F32)
    assert normal_form(summed) is whole and proved(summed, whole)
    overlap = make_lin([(Fraction(1), total(0, 3)), (Fraction(1), total(2, n))], Fraction(0),
                       out, F32)
    assert normal_form(overlap) is not whole and refuted(overlap, whole)


def test_constants_join() -> None:
    assert make_concat([make_splat(2, (3,), F32), make_splat(2, (5,), F32)], 0) is \
        make_splat(2, (8,), F32)
    assert make_concat([make_splat(2, (3,), F32), make_splat(3, (5,), F32)], 0).op == \
        "concatenate"
    iota = make_iota((8,), 0, "i32")
    blocks = [slice_term(iota, 0, lo, lo + 2) for lo in range(0, 8, 2)]
    assert make_concat(blocks, 0) is iota
    assert proved(raw_concat(blocks, 0), iota)
    shifted = [slice_term(iota, 0, lo, lo + 2) for lo in (0, 2, 6, 4)]
    joined = make_concat(shifted, 0)
    assert joined is not iota and refuted(raw_concat(shifted, 0), iota)


@pytest.mark.parametrize("shape,dim,a", [((12,), 0, 4), ((6, 4), 0, 3), ((2, 8, 3), 1, 4)])
def test_sum_over_a_split_dim_is_the_sum_of_its_blocks(shape, dim, a) -> None:
    x = make_arg(0, shape, F32)
    b = shape[dim] // a
    split = shape[:dim] + (a, b) + shape[dim + 1:]
    out = shape[:dim] + (b,) + shape[dim + 1:]
    reshaped = intern("reshape", (x,), (), split, F32)
    summed = intern("reduce_sum", (reshaped,), ((dim,),), out, F32)
    blocks = make_lin([(Fraction(1), slice_term(x, dim, k * b, (k + 1) * b)) for k in range(a)],
                      Fraction(0), out, F32)
    assert normal_form(summed) is blocks and proved(summed, blocks)
    # must fail: summing the minor half (b) is not the sum of the blocks
    minor = intern("reduce_sum", (reshaped,), ((dim + 1,),), shape[:dim] + (a,) + shape[dim + 1:],
                   F32)
    assert normal_form(minor).op != "lin"
    if a == b:
        assert refuted(minor, blocks)


@pytest.mark.parametrize("pieces,rows", [(4, 1), (2, 3)])
def test_reshape_of_a_concatenation_along_its_major_dim(pieces, rows) -> None:
    args = [make_arg(k, (rows, 2, 3), F32) for k in range(pieces)]
    joined = raw_concat(args, 0)
    merged = intern("reshape", (joined,), (), (pieces * rows * 2, 3), F32)
    normal = normal_form(merged)
    assert normal.op == "concatenate" and proved(merged, normal)
    # must fail: concatenated along the minor dim of the merged group, the pieces interleave
    across = raw_concat([make_arg(k, (2, rows, 3), F32) for k in range(pieces)], 1)
    mixed = intern("reshape", (across,), (), (2 * pieces * rows, 3), F32)
    assert normal_form(mixed).op == "reshape"
    wrong = make_concat([make_reshape(make_arg(k, (2, rows, 3), F32), (2 * rows, 3))
                         for k in range(pieces)], 0)
    assert refuted(mixed, wrong)


@pytest.mark.parametrize("src,dst,starts,limits", [
    ((8, 3), (2, 4, 3), (1, 0, 0), (2, 4, 3)),      # micro-batch 1 of a block
    ((8, 3), (2, 4, 3), (0, 2, 0), (1, 4, 3)),      # rows 2..4 of micro-batch 0
    ((2, 4, 3), (8, 3), (4, 0), (8, 3)),            # merged dims: rows of the major one
    ((2, 4, 3), (8, 3), (1, 0), (3, 3)),            # inside one row of the major dim
    ((24,), (2, 3, 4), (1, 2, 0), (2, 3, 4)),
])
def test_slice_of_a_reshape_is_the_reshape_of_a_box(src, dst, starts, limits) -> None:
    x = make_arg(0, src, F32)
    shape = tuple(hi - lo for lo, hi in zip(starts, limits))
    sliced = intern("slice", (intern("reshape", (x,), (), dst, F32),),
                    (starts, limits, (1,) * len(dst)), shape, F32)
    normal = normal_form(sliced)
    assert normal.op != "slice" or normal.args[0] is x
    assert proved(sliced, normal)


@pytest.mark.parametrize("src,dst,starts,limits", [
    ((8, 3), (2, 4, 3), (0, 1, 0), (2, 2, 3)),      # row 1 of both micro-batches: not a box
    ((2, 4, 3), (8, 3), (3, 0), (5, 3)),            # across two rows of the major dim
    ((6,), (2, 3), (0, 1), (2, 2)),                 # a column: strided in the operand
])
def test_slice_of_a_reshape_that_is_no_box_stays(src, dst, starts, limits) -> None:
    x = make_arg(0, src, F32)
    shape = tuple(hi - lo for lo, hi in zip(starts, limits))
    sliced = intern("slice", (intern("reshape", (x,), (), dst, F32),),
                    (starts, limits, (1,) * len(dst)), shape, F32)
    normal = normal_form(sliced)
    assert normal.op == "slice" and normal.args[0].op == "reshape"
    assert proved(sliced, normal)


def test_slice_of_a_reshape_off_by_one_is_not_the_box() -> None:
    x = make_arg(0, (8, 3), F32)
    reshaped = intern("reshape", (x,), (), (2, 4, 3), F32)
    second = intern("slice", (reshaped,), ((1, 0, 0), (2, 4, 3), (1, 1, 1)), (1, 4, 3), F32)
    normal = normal_form(second)
    right = make_reshape(slice_term(x, 0, 4, 8), (1, 4, 3))
    off = make_reshape(slice_term(x, 0, 3, 7), (1, 4, 3))
    assert normal is right and proved(second, right)
    assert normal is not off and refuted(second, off)


def _rows_of_a_computation(x, w, lo, hi):
    """tanh(x[lo:hi] @ w): rows lo..hi of one computation, built from the rows of x."""
    attrs = ((), (), (1,), (0,))
    dot = make_dot(slice_term(x, 0, lo, hi), w, attrs, (hi - lo, w.shape[1]), F32)
    return make_elementwise("stablehlo.tanh", (dot,))


def test_concatenated_contractions_sharing_an_operand_are_one() -> None:
    x, w = make_arg(0, (6, 4), F32), make_arg(1, (4, 3), F32)
    attrs = ((), (), (1,), (0,))
    pieces = [make_dot(slice_term(x, 0, lo, lo + 2), w, attrs, (2, 3), F32) for lo in (0, 2, 4)]
    whole = make_dot(x, w, attrs, (6, 3), F32)
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: the rows in another order are not the contraction of x
    swapped = [pieces[1], pieces[0], pieces[2]]
    assert make_concat(swapped, 0) is not whole and refuted(raw_concat(swapped, 0), whole)
    # must fail: pieces contracting with different operands are not lifted
    v = make_arg(2, (4, 3), F32)
    mixed = [pieces[0], make_dot(slice_term(x, 0, 2, 6), v, attrs, (4, 3), F32)]
    assert make_concat(mixed, 0).op == "concatenate"


def test_contractions_over_rows_of_one_computation_join() -> None:
    """sum_k h[rows k]^T y[rows k] (a gradient accumulated over micro-batches) is h^T y, also
    under a transpose; rows paired with other rows, or a piece missing, are not."""
    x, w, y = make_arg(0, (8, 4), F32), make_arg(1, (4, 3), F32), make_arg(2, (8, 2), F32)
    attrs = ((), (), (0,), (0,))

    def grad(lo, hi, ylo=None):
        ylo = lo if ylo is None else ylo
        h = _rows_of_a_computation(x, w, lo, hi)
        dot = make_dot(h, slice_term(y, 0, ylo, ylo + hi - lo), attrs, (3, 2), F32)
        return make_op("transpose", (dot,), ((1, 0),), (2, 3), F32)

    whole = make_op("transpose", (make_dot(_rows_of_a_computation(x, w, 0, 8), y, attrs,
                                           (3, 2), F32),), ((1, 0),), (2, 3), F32)
    parts = [grad(lo, lo + 2) for lo in (6, 0, 4, 2)]
    summed = make_lin([(Fraction(1, 4), p) for p in parts], Fraction(0), (2, 3), F32)
    assert normal_form(summed) is normal_form(make_lin([(Fraction(1, 4), whole)], Fraction(0),
                                                       (2, 3), F32))
    assert proved(summed, make_lin([(Fraction(1, 4), whole)], Fraction(0), (2, 3), F32))
    # must fail: micro-batch 1's activations met with micro-batch 2's targets
    crossed = make_lin([(Fraction(1), grad(0, 2, 2)), (Fraction(1), grad(2, 4, 0)),
                        (Fraction(1), grad(4, 8))], Fraction(0), (2, 3), F32)
    assert normal_form(crossed) is not normal_form(whole)
    assert refuted(crossed, whole)
    # must fail: a micro-batch missing (off-by-one trip count)
    short = make_lin([(Fraction(1), grad(0, 2)), (Fraction(1), grad(2, 4)),
                      (Fraction(1), grad(4, 6))], Fraction(0), (2, 3), F32)
    assert normal_form(short) is not normal_form(whole)


SCATTER_DIMS = (("index_vector_dim", 0), ("input_batching_dims", ()),
                ("inserted_window_dims", (0,)), ("scatter_dims_to_operand_dims", (0,)),
                ("scatter_indices_batching_dims", ()), ("update_window_dims", (0,)))


def raw_scatter(rows: int, at: int, updates, reducer: str = "add"):
    """`x.at[at].add(updates)` into zeros of `rows` rows, as the raw scatter node (a
    device's ring step once its id is known)."""
    attrs = tuple(sorted(SCATTER_DIMS + (("reducer", reducer),)))
    shape = (rows,) + updates.shape
    return intern("stablehlo.scatter", (make_splat(0, shape, F32), make_splat(at, (1,), "i32"),
                                        updates), attrs, shape, F32)


def padded(rows: int, at: int, updates):
    """`updates` as row `at` of `rows` rows of zeros (the raw pad node)."""
    low, high = (at,) + (0,) * len(updates.shape), (rows - at - 1,) + (0,) * len(updates.shape)
    row = make_reshape(updates, (1,) + updates.shape)
    return intern("pad", (row, make_splat(0, (), F32)), (low, high, (0,) * len(low)),
                  (rows,) + updates.shape, F32)


@pytest.mark.parametrize("rows,at,width", [(4, 0, 1), (4, 3, 1), (3, 1, 2)])
def test_a_scatter_add_into_zeros_at_a_constant_index_is_a_padded_row(rows, at, width) -> None:
    u = make_arg(0, (width,), F32)
    scattered = raw_scatter(rows, at, u)
    normal = normal_form(scattered)
    assert normal.op != "stablehlo.scatter" and proved(scattered, normal)
    assert proved(scattered, padded(rows, at, u))
    # a row of it is the update or zeros: what lets a ring's sums meet the reference's
    assert normal_form(slice_term(scattered, 0, at, at + 1)) is make_reshape(u, (1, width))
    other = (at + 1) % rows
    assert normal_form(slice_term(scattered, 0, other, other + 1)) is \
        make_splat(0, (1, width), F32)
    # must fail: the row next to it
    assert refuted(scattered, padded(rows, other, u))


def test_a_scatter_not_at_known_rows_inside_is_left_alone() -> None:
    u = make_arg(0, (2,), F32)
    outside = raw_scatter(4, 4, u)  # out of bounds: implementation-defined, not rewritten
    assert normal_form(outside).op == "stablehlo.scatter"
    assert normal_form(raw_scatter(4, -1, u)).op == "stablehlo.scatter"
    replace = raw_scatter(4, 1, u, reducer="replace")  # a write: the concatenation instead
    assert normal_form(replace).op == "concatenate"
    for other in ("max", "mul", "other"):  # neither a sum nor a write: left alone
        assert normal_form(raw_scatter(4, 1, u, reducer=other)).op == "stablehlo.scatter"
    attrs = tuple(sorted(SCATTER_DIMS + (("reducer", "add"),)))
    unknown = intern("stablehlo.scatter", (make_splat(0, (4, 2), F32), make_arg(1, (1,), "i32"),
                                           u), attrs, (4, 2), F32)
    assert normal_form(unknown).op == "stablehlo.scatter"


def test_colliding_constant_windows_are_summed() -> None:
    attrs = dict(SCATTER_DIMS, index_vector_dim=1, update_window_dims=(1,), reducer="add")
    u = make_arg(0, (2, 3), F32)
    indices = make_splat(2, (2, 1), "i32")  # both update rows land on row 2
    scattered = intern("stablehlo.scatter", (make_splat(0, (4, 3), F32), indices, u),
                       tuple(sorted(attrs.items())), (4, 3), F32)
    normal = normal_form(scattered)
    assert normal.op != "stablehlo.scatter" and proved(scattered, normal)
    # must fail: only one of the two colliding rows
    first = make_reshape(slice_term(u, 0, 0, 1), (3,))
    assert refuted(scattered, padded(4, 2, first))


def test_concatenation_lifts_through_transpose_broadcast_and_dot() -> None:
    x, w = make_arg(0, (6, 4), F32), make_arg(1, (4, 3), F32)
    b = make_arg(2, (3,), F32)
    attrs = ((), (), (1,), (0,))
    rows = [(0, 2), (2, 6)]
    # dot_general along the lhs free dim (one rhs), then transposed
    pieces = [make_transpose(make_dot(slice_term(x, 0, lo, hi), w, attrs, (hi - lo, 3), F32),
                             (1, 0)) for lo, hi in rows]
    whole = make_transpose(make_dot(x, w, attrs, (6, 3), F32), (1, 0))
    assert make_concat(pieces, 1) is whole and proved(raw_concat(pieces, 1), whole)
    # along the rhs free dim (one lhs)
    cols = [make_dot(x, slice_term(w, 1, lo, hi), attrs, (6, hi - lo), F32)
            for lo, hi in ((0, 1), (1, 3))]
    dot = make_dot(x, w, attrs, (6, 3), F32)
    assert make_concat(cols, 1) is dot and proved(raw_concat(cols, 1), dot)
    # broadcasts: of one operand along a dim it does not fill; of windows along one it fills
    same = [make_broadcast(b, (1,), (hi - lo, 3)) for lo, hi in rows]
    assert make_concat(same, 0) is make_broadcast(b, (1,), (6, 3))
    assert proved(raw_concat(same, 0), make_broadcast(b, (1,), (6, 3)))
    b4 = make_arg(5, (4,), F32)
    parts = [make_broadcast(slice_term(b4, 0, lo, hi), (1,), (6, hi - lo))
             for lo, hi in ((0, 2), (2, 4))]
    assert make_concat(parts, 1) is make_broadcast(b4, (1,), (6, 4))
    assert proved(raw_concat(parts, 1), make_broadcast(b4, (1,), (6, 4)))
    # must fail: the rows in the other order, another rhs per piece, another operand
    swapped = [pieces[1], pieces[0]]
    assert make_concat(swapped, 1) is not whole and refuted(raw_concat(swapped, 1), whole)
    v = make_arg(3, (4, 3), F32)
    mixed = [make_dot(slice_term(x, 0, 0, 2), w, attrs, (2, 3), F32),
             make_dot(slice_term(x, 0, 2, 6), v, attrs, (4, 3), F32)]
    assert make_concat(mixed, 0).op == "concatenate" and refuted(raw_concat(mixed, 0), dot)
    c = make_arg(4, (3,), F32)
    two = [make_broadcast(b, (1,), (2, 3)), make_broadcast(c, (1,), (4, 3))]
    assert make_concat(two, 0).op == "concatenate"
    assert refuted(raw_concat(two, 0), make_broadcast(b, (1,), (6, 3)))


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max"])
def test_concatenation_lifts_through_a_reduction(op) -> None:
    x = make_arg(0, (6, 4), F32)
    pieces = [make_op(op, (slice_term(x, 0, lo, hi),), ((1,),), (hi - lo,), F32)
              for lo, hi in ((0, 2), (2, 6))]
    whole = make_op(op, (x,), ((1,),), (6,), F32)
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: the blocks swapped
    swapped = raw_concat(pieces[::-1], 0)
    assert make_concat(pieces[::-1], 0) is not whole and refuted(swapped, whole)


def _chain(x, w, lo, hi):
    """A per-block computation: tanh(x[lo:hi] @ w) then summed over its rows with itself."""
    attrs = ((), (), (1,), (0,))
    h = make_elementwise("stablehlo.tanh", (make_dot(slice_term(x, 0, lo, hi), w, attrs,
                                                     (hi - lo, 3), F32),))
    return h, slice_term(x, 0, lo, hi)


def test_sum_of_contractions_over_computed_blocks_joins() -> None:
    x, w = make_arg(0, (6, 2), F32), make_arg(1, (2, 3), F32)
    grad = ((), (), (0,), (0,))
    blocks = [(0, 2), (2, 4), (4, 6)]

    def part(lo, hi, xlo=None, xhi=None):
        h, _ = _chain(x, w, lo, hi)
        xs = slice_term(x, 0, lo if xlo is None else xlo, hi if xhi is None else xhi)
        return make_dot(h, xs, grad, (3, 2), F32)

    h, _ = _chain(x, w, 0, 6)
    whole = make_dot(h, x, grad, (3, 2), F32)
    summed = make_lin([(Fraction(1), part(lo, hi)) for lo, hi in blocks], Fraction(0),
                      (3, 2), F32)
    assert normal_form(summed) is whole and proved(summed, whole)
    assert blocks_meet(normal_form(whole), normal_form(summed))
    # must fail: block 0's activations paired with block 1's rows of x (a wrong block)
    crossed = make_lin([(Fraction(1), part(0, 2, 2, 4)), (Fraction(1), part(2, 4, 0, 2)),
                        (Fraction(1), part(4, 6))], Fraction(0), (3, 2), F32)
    assert normal_form(crossed) is not whole and refuted(crossed, whole)
    assert not blocks_meet(normal_form(whole), normal_form(crossed))
    # must fail: a block missing (rows 4..6 not summed)
    short = make_lin([(Fraction(1), part(lo, hi)) for lo, hi in blocks[:2]], Fraction(0),
                     (3, 2), F32)
    assert normal_form(short) is not whole and not blocks_meet(normal_form(whole),
                                                               normal_form(short))
    assert refuted(short, whole)


def test_split_like_cuts_a_contraction_into_the_blocks_of_a_sum() -> None:
    x, w = make_arg(0, (2, 6), F32), make_arg(1, (6, 3), F32)
    attrs = ((), (), (1,), (0,))
    whole = make_dot(x, w, attrs, (2, 3), F32)

    def part(lo, hi, wlo=None, whi=None):
        return make_dot(slice_term(x, 1, lo, hi), slice_term(w, 0, lo if wlo is None else wlo,
                                                             hi if whi is None else whi),
                        attrs, (2, 3), F32)

    # raw sums (the builders' joining is not asked): the blocks of sizes 2 and 4
    summed = intern("lin", (part(0, 2), part(2, 6)), (Fraction(0), (Fraction(1), Fraction(1))),
                    (2, 3), F32)
    cut = split_like(whole, summed)
    assert cut is not None and proved(cut, whole) and proved(cut, summed)
    # must fail: a sum whose blocks pair row i of x with another row of w is not met
    off = intern("lin", (part(0, 2, 4, 6), part(2, 6, 0, 4)),
                 (Fraction(0), (Fraction(1), Fraction(1))), (2, 3), F32)
    cut = split_like(whole, off)
    assert cut is None or normal_form(cut) is not normal_form(off)
    assert not blocks_meet(whole, off) and refuted(off, whole)


def test_blocks_meet_a_concatenation_piece_by_piece() -> None:
    x, w = make_arg(0, (4, 6), F32), make_arg(1, (6, 3), F32)
    attrs = ((), (), (1,), (0,))
    whole = make_dot(x, w, attrs, (4, 3), F32)
    rows = [make_dot(slice_term(x, 0, lo, hi), w, attrs, (2, 3), F32) for lo, hi in ((0, 2),
                                                                                 (2, 4))]
    pieces = raw_concat(rows, 0)
    assert blocks_meet(whole, pieces) and proved(pieces, whole)
    # must fail: the rows in the other order
    assert not blocks_meet(whole, raw_concat(rows[::-1], 0))
    assert refuted(raw_concat(rows[::-1], 0), whole)


def test_a_square_root_of_a_constant_folds_to_its_rounded_value() -> None:
    import numpy as np  # lazy: only this test computes a float32 root

    root = make_elementwise("stablehlo.sqrt", (make_splat(8, (), F32),))
    folded = normal_form(root)
    expected = Fraction(float(np.sqrt(np.float32(8))))  # IEEE sqrt, correctly rounded
    assert folded.op == "splat" and folded.attrs[0] == expected
    x = make_arg(0, (2, 3), F32)
    scaled = intern("div", (x, make_broadcast(root, (), (2, 3))), (), (2, 3), F32)
    assert normal_form(scaled) is make_lin([(1 / expected, x)], Fraction(0), (2, 3), F32)
    # must fail: the root in bf16 is another value; an exact reciprocal of the unrounded
    # root, or the float32 rounding of 1/sqrt(8) (XLA's rewrite, an assumption), is not met
    bf16 = normal_form(make_elementwise("stablehlo.sqrt", (make_splat(8, (), "bf16"),)))
    assert bf16.op == "splat" and bf16.attrs[0] != expected
    rounded = Fraction(float(np.float32(1) / np.sqrt(np.float32(8))))
    assert rounded != 1 / expected
    assert normal_form(scaled) is not make_lin([(rounded, x)], Fraction(0), (2, 3), F32)
    # a negative root and a transcendental function of a constant stay as they are
    negative = make_elementwise("stablehlo.sqrt", (make_splat(-4, (), F32),))
    assert normal_form(negative).op == "stablehlo.sqrt"
    assert normal_form(make_elementwise("stablehlo.exponential", (make_splat(1, (), F32),))
                       ).op == "stablehlo.exponential"


def test_a_transpose_of_a_concatenation_is_the_concatenation_of_the_transposes() -> None:
    a, b = make_arg(0, (2, 3, 4), F32), make_arg(1, (2, 1, 4), F32)
    perm = (2, 0, 1)
    term = intern("transpose", (raw_concat([a, b], 1),), (perm,), (4, 2, 4), F32)
    normal = normal_form(term)
    assert normal.op == "concatenate" and normal.attrs == (2,) and proved(term, normal)
    # must fail: the pieces transposed but concatenated in the other order
    swapped = raw_concat([make_transpose(b, perm), make_transpose(a, perm)], 2)
    assert normal is not normal_form(swapped) and refuted(term, swapped)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max"])
def test_a_slice_of_a_reduction_is_the_reduction_of_the_rows(op) -> None:
    x = make_arg(0, (6, 4), F32)
    reduced = make_op(op, (x,), ((1,),), (6,), F32)
    term = intern("slice", (reduced,), ((2,), (5,), (1,)), (3,), F32)
    normal = normal_form(term)
    rows = make_op(op, (slice_term(x, 0, 2, 5),), ((1,),), (3,), F32)
    assert normal is normal_form(rows) and proved(term, normal)
    # must fail: the rows off by one
    off = make_op(op, (slice_term(x, 0, 1, 4),), ((1,),), (3,), F32)
    assert normal is not normal_form(off) and refuted(term, off)


def test_broadcasts_along_a_new_unit_dim_lift_out_of_a_concatenation() -> None:
    x = make_arg(0, (2, 4), F32)
    rows = [make_reshape(slice_term(x, 0, i, i + 1), (4,)) for i in range(2)]
    pieces = [make_broadcast(r, (1,), (1, 4, 3)) for r in rows]
    whole = make_broadcast(x, (0, 1), (2, 4, 3))
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: the rows swapped
    assert make_concat(pieces[::-1], 0) is not whole
    assert refuted(raw_concat(pieces[::-1], 0), whole)


def test_reshapes_along_the_major_dim_lift_out_of_a_concatenation() -> None:
    x = make_arg(0, (4, 3), F32)
    pieces = [make_reshape(slice_term(x, 0, i, i + 1), (1, 3, 1)) for i in range(4)]
    whole = make_reshape(x, (4, 3, 1))
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: two rows swapped
    order = [pieces[1], pieces[0], pieces[2], pieces[3]]
    assert make_concat(order, 0) is not whole and refuted(raw_concat(order, 0), whole)


GATHER = (("collapsed_slice_dims", (0,)), ("index_vector_dim", 2), ("offset_dims", (2,)),
          ("operand_batching_dims", ()), ("slice_sizes", (1, 3)), ("start_index_map", (0,)),
          ("start_indices_batching_dims", ()))


def _gather(table, indices):
    shape = indices.shape[:2] + (3,)
    return make_op("stablehlo.gather", (table, indices), GATHER, shape, F32, linear_in=0)


def test_gathers_from_one_table_lift_out_of_a_concatenation() -> None:
    table, ids = make_arg(0, (5, 3), F32), make_arg(1, (2, 2, 1), "i32")
    pieces = [_gather(table, slice_term(ids, 0, i, i + 1)) for i in range(2)]
    whole = _gather(table, ids)
    assert make_concat(pieces, 0) is whole and proved(raw_concat(pieces, 0), whole)
    # must fail: another table for the second piece is not lifted, and differs
    other = make_arg(2, (5, 3), F32)
    mixed = [pieces[0], _gather(other, slice_term(ids, 0, 1, 2))]
    assert make_concat(mixed, 0).op == "concatenate"
    assert refuted(raw_concat(mixed, 0), whole)


def test_a_sum_of_scatter_adds_over_blocks_of_updates_is_one_scatter() -> None:
    attrs = tuple(sorted(dict(SCATTER_DIMS, index_vector_dim=2, update_window_dims=(2,),
                              reducer="add").items()))
    ids, u = make_arg(0, (2, 2, 1), "i32"), make_arg(1, (2, 2, 3), F32)
    zero = make_splat(0, (5, 3), F32)

    def scatter(indices, updates):
        return make_op("stablehlo.scatter", (zero, indices, updates), attrs, (5, 3), F32,
                       linear_in=2)

    whole = scatter(ids, u)
    parts = [scatter(slice_term(ids, 0, i, i + 1), slice_term(u, 0, i, i + 1))
             for i in range(2)]
    summed = make_lin([(Fraction(1), p) for p in parts], Fraction(0), (5, 3), F32)
    assert normal_form(summed) is normal_form(whole)
    assert proved(summed, whole)
    # must fail: block 0's indices paired with block 1's updates
    crossed = make_lin([(Fraction(1), scatter(slice_term(ids, 0, 0, 1), slice_term(u, 0, 1, 2))),
                        (Fraction(1), scatter(slice_term(ids, 0, 1, 2), slice_term(u, 0, 0, 1)))],
                       Fraction(0), (5, 3), F32)
    assert normal_form(crossed) is not normal_form(whole) and refuted(crossed, whole)


def test_sums_under_one_reshape_join() -> None:
    x, w = make_arg(0, (4, 3), F32), make_arg(1, (3, 2), F32)
    attrs = ((), (), (1,), (0,))

    def total(lo, hi):  # a block's sum of every element, as the builders write it
        h = make_elementwise("stablehlo.tanh", (make_dot(slice_term(x, 0, lo, hi), w, attrs,
                                                         (hi - lo, 2), F32),))
        return make_op("reduce_sum", (h,), ((0, 1),), (), F32, linear_in=0)

    parts = [total(i, i + 1) for i in range(4)]
    assert parts[0].op == "reshape"  # a block of one row: a sum over its real dims, reshaped
    summed = make_lin([(Fraction(1), p) for p in parts], Fraction(0), (), F32)
    whole = total(0, 4)
    assert normal_form(summed) is normal_form(whole) and proved(summed, whole)
    # must fail: a block missing
    short = make_lin([(Fraction(1), p) for p in parts[:3]], Fraction(0), (), F32)
    assert normal_form(short) is not normal_form(whole) and refuted(short, whole)


def test_contractions_under_one_reshape_join_in_the_order_of_their_distinct_rows() -> None:
    x, w = make_arg(0, (4, 3), F32), make_arg(1, (6, 2), F32)
    attrs = ((), (), (0,), (0,))

    def part(lo, hi, xlo=None):  # the shared weight window comes first in every part
        xlo = lo if xlo is None else xlo
        left = make_elementwise("stablehlo.tanh", (slice_term(w, 0, 0, 3),))
        right = make_dot(slice_term(x, 0, xlo, xlo + hi - lo), left, ((), (), (1,), (0,)),
                         (hi - lo, 2), F32)
        dot = make_dot(slice_term(x, 0, lo, hi), right, attrs, (3, 2), F32)
        return make_reshape(dot, (3, 2, 1))

    parts = [part(i, i + 2) for i in (0, 2)]
    summed = make_lin([(Fraction(1), p) for p in parts], Fraction(0), (3, 2, 1), F32)
    whole = part(0, 4)
    assert normal_form(summed) is normal_form(whole) and proved(summed, whole)
    # must fail: each block's rows paired with the other block's activations
    crossed = make_lin([(Fraction(1), part(0, 2, 2)), (Fraction(1), part(2, 4, 0))],
                       Fraction(0), (3, 2, 1), F32)
    assert normal_form(crossed) is not normal_form(whole) and not proved(crossed, whole)


def test_normal_form_is_idempotent_after_rewrites_that_build_new_terms() -> None:
    x = make_arg(0, (2, 1, 16), F32)
    reduced = make_op("reduce_max", (x,), ((2,),), (2, 1), F32)
    term = intern("slice", (make_reshape(reduced, (2,)),), ((0,), (1,), (1,)), (1,), F32)
    once = normal_form(term)
    assert normal_form(once) is once and proved(term, once)


# ----- scatter (replace) at constant indices; stacking micro-batches ---------------------

def _values(term, env):
    """`term` evaluated exactly on concrete inputs (dense tables from `DENSE_VALUES`)."""
    full = dict(env)
    full["dense"] = lambda t: obj_array(np.array(DENSE_VALUES[t.attrs[0]]).reshape(t.shape))
    return evaluate_term(term, full)


def same_values(a, b, env) -> bool:
    return bool((_values(a, env) == _values(b, env)).all())


def _ints(*shape: int, seed: int = 0):
    return obj_array(np.random.default_rng(seed).integers(-9, 10, size=shape))


def set_scatter(operand, indices, updates, **dims):
    """`scatter(operand, indices, updates)` whose region returns the update (a raw node),
    with jax's dimension numbers for `x.at[i].set(u)` unless `dims` overrides them."""
    attrs = dict(SCATTER_DIMS, update_window_dims=tuple(range(len(operand.shape) - 1)),
                 reducer="replace")
    attrs.update(dims)
    return intern("stablehlo.scatter", (operand, indices, updates), tuple(sorted(attrs.items())),
                  operand.shape, operand.dtype)


def table(values, shape):
    """A constant integer index table that keeps its values (as the lowering's constants)."""
    key = ("normal_form_test", tuple(values), shape)
    return make_dense(repr(key).encode(), shape, "i32", values=np.array(values, dtype=np.int32))


@pytest.mark.parametrize("at", [0, 2, 3])
def test_a_set_row_at_a_constant_index_is_a_concatenation(at) -> None:
    x, u = make_arg(0, (4, 2, 3), F32), make_arg(1, (2, 3), F32)
    env = {0: _ints(4, 2, 3), 1: _ints(2, 3, seed=1)}
    for index in (make_splat(at, (1,), "i32"), table([at], (1,))):
        scattered = set_scatter(x, index, u)
        normal = normal_form(scattered)
        assert normal.op != "stablehlo.scatter" and same_values(scattered, normal, env)
        pieces = [slice_term(x, 0, 0, at), make_reshape(u, (1, 2, 3)),
                  slice_term(x, 0, at + 1, 4)]
        assert normal is make_concat([p for p in pieces if p.shape[0]], 0)
        # must fail: the row next to it (index off by one)
        other = normal_form(set_scatter(x, make_splat((at + 1) % 4, (1,), "i32"), u))
        assert other is not normal and not same_values(scattered, other, env)
        if index.op == "splat":  # Z3 reads a splat index; a table only by evaluation
            assert proved(scattered, normal) and refuted(scattered, other)


def test_a_set_window_inside_a_row_and_a_table_of_disjoint_rows() -> None:
    x = make_arg(0, (4, 5), F32)
    env = {0: _ints(4, 5), 1: _ints(2, seed=1), 2: _ints(2, 5, seed=2)}
    # x.at[1, 2:4].set(v): a window of 2 columns of row 1, indices a (row, column) vector
    v = make_arg(1, (2,), F32)
    window = set_scatter(x, table([1, 2], (2,)), v, update_window_dims=(0,),
                         scatter_dims_to_operand_dims=(0, 1))
    normal = normal_form(window)
    assert normal.op != "stablehlo.scatter" and same_values(window, normal, env)
    # x.at[jnp.array([3, 0])].set(w): two disjoint rows in one scatter
    w = make_arg(2, (2, 5), F32)
    rows = set_scatter(x, table([3, 0], (2, 1)), w, index_vector_dim=1,
                       update_window_dims=(1,))
    normal = normal_form(rows)
    assert normal.op != "stablehlo.scatter" and same_values(rows, normal, env)
    swapped = normal_form(set_scatter(x, table([0, 3], (2, 1)), w, index_vector_dim=1,
                                      update_window_dims=(1,)))
    assert swapped is not normal and not same_values(rows, swapped, env)


def test_a_chain_of_sets_into_zeros_is_the_updates_stacked() -> None:
    parts = [make_arg(k, (2, 3), F32) for k in range(4)]
    env = {k: _ints(2, 3, seed=k) for k in range(4)}
    out = make_splat(0, (4, 2, 3), F32)
    for k in (2, 0, 3, 1):
        out = set_scatter(out, make_splat(k, (1,), "i32"), parts[k])
    stacked = make_concat([make_reshape(p, (1, 2, 3)) for p in parts], 0)
    assert normal_form(out) is stacked and same_values(out, stacked, env)
    # overlapping writes in a chain: the later one wins, and only it
    twice = set_scatter(set_scatter(make_splat(0, (4, 2, 3), F32), make_splat(1, (1,), "i32"),
                                    parts[0]), make_splat(1, (1,), "i32"), parts[1])
    later = normal_form(slice_term(twice, 0, 1, 2))
    assert later is make_reshape(parts[1], (1, 2, 3))
    earlier = normal_form(set_scatter(make_splat(0, (4, 2, 3), F32), make_splat(1, (1,), "i32"),
                                      parts[0]))
    assert normal_form(twice) is not earlier and not same_values(twice, earlier, env)


def test_a_set_that_overlaps_or_leaves_the_operand_is_left_alone() -> None:
    x, u = make_arg(0, (4, 3), F32), make_arg(1, (3,), F32)
    for at in (4, -1):  # out of bounds: implementation-defined, not rewritten
        assert normal_form(set_scatter(x, make_splat(at, (1,), "i32"), u)).op == \
            "stablehlo.scatter"
    # two windows on one row in one scatter: which write wins is implementation-defined
    w = make_arg(2, (2, 3), F32)
    colliding = set_scatter(x, table([2, 2], (2, 1)), w, index_vector_dim=1,
                            update_window_dims=(1,))
    assert normal_form(colliding).op == "stablehlo.scatter"
    unknown = set_scatter(x, make_arg(3, (1,), "i32"), u)
    assert normal_form(unknown).op == "stablehlo.scatter"


def _stage(rows, w, b, order: int):
    """relu(rows @ w + b) with the sum's parts built in either order (the builders sort a
    `lin`'s parts by serial, so pieces computed alike can list them differently)."""
    dot = make_dot(rows, w, ((), (), (len(rows.shape) - 1,), (0,)), rows.shape[:-1] + (3,), F32)
    bias = make_broadcast(b, (len(rows.shape) - 1,), dot.shape)
    parts = [(Fraction(1), dot), (Fraction(1), bias)]
    summed = make_lin(parts[::-1] if order else parts, Fraction(0), dot.shape, F32)
    return make_elementwise("stablehlo.maximum", (make_splat(0, dot.shape, F32), summed))


def test_stacked_micro_batches_of_one_computation_are_the_batch() -> None:
    x, w, b = make_arg(0, (4, 2, 3), F32), make_arg(1, (3, 3), F32), make_arg(2, (3,), F32)
    env = {0: _ints(4, 2, 3), 1: _ints(3, 3, seed=1), 2: _ints(3, seed=2), 3: _ints(3, seed=3)}
    whole = _stage(_stage(x, w, b, 0), w, b, 0)
    rows = [_stage(_stage(slice_term(x, 0, i, i + 1), w, b, i % 2), w, b, 0) for i in range(4)]
    assert make_concat(rows, 0) is normal_form(whole)
    # stacked the way a pipeline writes them: each micro-batch's result set into zeros
    out = make_splat(0, (4, 2, 3), F32)
    for i in range(4):
        micro = make_reshape(slice_term(x, 0, i, i + 1), (2, 3))
        out = set_scatter(out, make_splat(i, (1,), "i32"), _stage(_stage(micro, w, b, i % 2),
                                                                   w, b, 1))
    assert normal_form(out) is normal_form(whole) and same_values(out, whole, env)
    # must fail: two micro-batches swapped, or one with another bias, is not the batch
    swapped = [rows[1], rows[0], rows[2], rows[3]]
    assert make_concat(swapped, 0) is not normal_form(whole)
    assert not same_values(raw_concat(swapped, 0), whole, env)
    other = make_arg(3, (3,), F32)
    biased = rows[:3] + [_stage(_stage(slice_term(x, 0, 3, 4), w, other, 0), w, b, 0)]
    assert make_concat(biased, 0) is not normal_form(whole)
    assert not same_values(raw_concat(biased, 0), whole, env)
    # must fail: a part with another coefficient is no column of the same sum
    halved = [make_lin([(Fraction(1, 2), r)], Fraction(0), r.shape, F32) if i == 2 else r
              for i, r in enumerate(rows)]
    assert make_concat(halved, 0) is not normal_form(whole)


def test_an_update_slice_in_plain_structure_and_in_normal_form() -> None:
    x, w, b = make_arg(0, (4, 2, 3), F32), make_arg(1, (3, 3), F32), make_arg(2, (3,), F32)
    env = {0: _ints(4, 2, 3), 1: _ints(3, 3, seed=1), 2: _ints(3, seed=2)}
    joined = make_splat(0, (4, 2, 3), F32)
    plain = joined
    for i in range(4):
        row = make_reshape(_stage(slice_term(x, 0, i, i + 1), w, b, i % 2), (1, 2, 3))
        joined = update_slice(joined, row, (i, 0, 0))
        plain = update_slice(plain, row, (i, 0, 0), joined=False)
    whole = _stage(x, w, b, 0)
    assert joined is normal_form(whole)  # the micro-batches met into the batch
    assert plain.op == "concatenate" and plain is not joined  # what an instance states
    assert normal_form(plain) is joined and same_values(plain, whole, env)
    # must fail: one row written at the next row's place
    shifted = update_slice(plain, make_reshape(_stage(slice_term(x, 0, 0, 1), w, b, 0),
                                               (1, 2, 3)), (1, 0, 0), joined=False)
    assert normal_form(shifted) is not joined and not same_values(shifted, whole, env)


def _cumsum(x, dim: int):
    """A cumulative sum along `dim` (reduce_window add, window the dim's length, padding
    n - 1 below), as jnp.cumsum lowers it."""
    rank, n = len(x.shape), x.shape[dim]
    window = tuple(n if d == dim else 1 for d in range(rank))
    low = tuple(n - 1 if d == dim else 0 for d in range(rank))
    return intern("reduce_window_sum", (x,), (window, (1,) * rank, (1,) * rank, (1,) * rank,
                                              low, (0,) * rank), x.shape, x.dtype)


def test_unit_dims_squeeze_through_a_batched_dot_and_a_cumsum() -> None:
    x, w = make_arg(0, (1, 3, 2), "i32"), make_arg(1, (1, 2, 4), "i32")
    dot = intern("stablehlo.dot_general", (_cumsum(x, 1), w), ((0,), (0,), (2,), (1,)),
                 (1, 3, 4), "i32")
    raw = intern("reshape", (dot,), (), (3, 4), "i32")
    out = normal_form(raw)
    assert out.op == "stablehlo.dot_general" and out.attrs == ((), (), (1,), (0,))
    assert proved(raw, out)
    # must fail: a cumsum along the other dim is not what the squeeze gives
    other = intern("reshape", (intern("stablehlo.dot_general", (_cumsum(x, 2), w),
                                      dot.attrs, dot.shape, "i32"),), (), (3, 4), "i32")
    assert normal_form(other) is not out and not proved(other, out)


def test_a_slice_across_a_cumsum_is_the_cumsum_of_the_slice() -> None:
    x = make_arg(0, (4, 3), "i32")
    whole = _cumsum(x, 1)
    raw = raw_slice(whole, 0, 1, 3)
    out = normal_form(raw)
    assert out.op == "reduce_window_sum" and proved(raw, out)
    # must fail: cut along the summed dim, each block restarts with no carry
    along = raw_slice(whole, 1, 1, 3)
    restarted = _cumsum(raw_slice(x, 1, 1, 3), 1)
    assert normal_form(along) is not normal_form(restarted) and refuted(along, restarted)
    # must fail: an off-by-one window (the last row left out)
    short = intern("reduce_window_sum", (x,), ((1, 2), (1, 1), (1, 1), (1, 1), (0, 1),
                                                (0, 0)), x.shape, "i32")
    assert normal_form(raw_slice(short, 0, 1, 3)) is not out
    assert refuted(raw_slice(short, 0, 1, 3), out)


def _random_values(term, seed: int = 0, ints=(-3, 4)):
    """`term` evaluated exactly on random small integers for its arguments."""
    rng = np.random.default_rng(seed)
    env = {}
    for t in subterms([term]):
        if t.op == "arg":
            env[t.attrs[0]] = np.vectorize(lambda v: Fraction(int(v)), otypes=[object])(
                rng.integers(*ints, t.shape))
    return [v for v in np.asarray(evaluate_term(term, env, {})).flat]


def _top(x, result: int):
    k = 2
    return intern("chlo.top_k", (x,), (k, result), (*x.shape[:-1], k),
                  "i32" if result else x.dtype)


def test_rows_of_a_top_k_are_the_top_k_of_the_rows() -> None:
    x = make_arg(0, (4, 3, 5), F32)
    for result in (0, 1):
        whole = _top(x, result)
        raw = raw_slice(whole, 0, 1, 3)
        out = normal_form(raw)
        assert out.op == "chlo.top_k" and out.args[0].shape == (2, 3, 5)
        assert all(_random_values(raw, s) == _random_values(out, s) for s in range(5))
        # a cut along the selected dim stays a slice of the top_k of the rows
        both = intern("slice", (whole,), ((1, 0, 1), (3, 3, 2), (1, 1, 1)), (2, 3, 1),
                      whole.dtype)
        cut = normal_form(both)
        assert cut.op == "slice" and cut.args[0].op == "chlo.top_k"
        assert cut.args[0].args[0].shape == (2, 3, 5)
        assert all(_random_values(both, s) == _random_values(cut, s) for s in range(5))
        # must fail: the top_k of the rows narrowed to the kept columns (the operand cut
        # like the result) is another value
        narrow = _top(raw_slice(raw_slice(x, 0, 1, 3), 2, 0, 2), result)
        assert normal_form(narrow) is not cut.args[0]
        assert any(_random_values(raw, s) != _random_values(narrow, s) for s in range(5))


def test_a_transpose_swapping_a_dots_free_dims_is_the_swapped_dot() -> None:
    a, b = make_arg(0, (2, 3, 4), F32), make_arg(1, (2, 4, 3), F32)
    dot = intern("stablehlo.dot_general", (a, b), ((0,), (0,), (2,), (1,)), (2, 3, 3), F32)
    raw = intern("transpose", (dot,), ((0, 2, 1),), (2, 3, 3), F32)
    out = normal_form(raw)
    assert out.op == "stablehlo.dot_general" and out.args == (b, a)
    assert out.attrs == ((0,), (0,), (1,), (2,)) and proved(raw, out)
    # must fail: without the transpose (same shape) it is another value, left apart
    assert normal_form(dot) is not out and refuted(dot, out)
    # a transpose that moves the batch dim is left alone
    moved = intern("transpose", (dot,), ((1, 0, 2),), (3, 2, 3), F32)
    assert normal_form(moved).op == "transpose"


def test_commuting_operands_line_up_when_a_concatenation_lifts() -> None:
    x = make_arg(0, (6, 4), "i32")
    m = make_arg(1, (6, 4), "i1")
    whole = intern("mul", (x, m), (), (6, 4), "i32")
    pieces = [intern("mul", (slice_term(x, 0, 0, 2), slice_term(m, 0, 0, 2)), (), (2, 4),
                     "i32"),
              intern("mul", (slice_term(m, 0, 2, 6), slice_term(x, 0, 2, 6)), (), (4, 4),
                     "i32")]
    joined = make_concat(pieces, 0)
    assert joined.op == "mul" and joined.dtype == "i32" and set(joined.args) == {x, m}
    assert all(_random_values(raw_concat(pieces, 0), s) == _random_values(whole, s) for s in range(3))
    # must fail: the pieces swapped do not join into the whole
    assert make_concat(pieces[::-1], 0) is not normal_form(whole)


def test_a_product_rebuilt_keeps_its_own_type() -> None:
    x = make_arg(0, (1, 4), "i32")
    m = make_arg(1, (1, 4), "i1")
    product = intern("mul", tuple(sorted((x, m), key=lambda t: t.serial)), (), (1, 4), "i32")
    flat = normal_form(intern("reshape", (product,), (), (4,), "i32"))
    assert flat.op == "mul" and flat.dtype == "i32"
    y = make_arg(2, (1, 4), "i32")
    for built in (rebuild(product, (m, y)), rebuild_elementwise(product, (m, y))):
        assert built.op == "mul" and built.dtype == "i32"
    # (the builder alone takes its first factor's type, the mask's)
    assert make_mul(m, y).dtype == "i1"


def test_a_split_of_a_reductions_kept_dim_goes_to_its_operand() -> None:
    ids = make_arg(0, (4, 8), "i32")
    flat = make_reshape(ids, (32,))
    vocab = make_broadcast(make_iota((16,), 0, "i32"), (1,), (32, 16))
    hits = make_elementwise("stablehlo.compare", (make_broadcast(flat, (0,), (32, 16)), vocab),
                            ("EQ",))
    counted = make_op("reduce_sum", (make_elementwise("stablehlo.convert", (hits,), (),
                                                      dtype="i32"),), ((1,),), (32,), "i32",
                      linear_in=0)
    raw = intern("reshape", (counted,), (), (4, 8), "i32")
    whole_hits = make_elementwise("stablehlo.compare", (
        make_broadcast(ids, (0, 1), (4, 8, 16)),
        make_broadcast(make_iota((16,), 0, "i32"), (2,), (4, 8, 16))), ("EQ",))
    whole = make_op("reduce_sum", (make_elementwise("stablehlo.convert", (whole_hits,), (),
                                                    dtype="i32"),), ((2,),), (4, 8), "i32",
                    linear_in=0)
    assert normal_form(raw) is normal_form(whole) and proved(raw, whole)
    # must fail: the flat rows read as (8, 4) transposed is another order
    other = make_transpose(intern("reshape", (counted,), (), (8, 4), "i32"), (1, 0))
    assert normal_form(other) is not normal_form(whole) and refuted(other, whole)


def test_a_units_batch_dim_under_a_reduction_is_not_squeezed() -> None:
    q, k = make_arg(0, (1, 4, 3), F32), make_arg(1, (1, 5, 3), F32)
    scores = make_dot(q, k, ((0,), (0,), (2,), (2,)), (1, 4, 5), F32)
    top = make_op("reduce_max", (scores,), ((2,),), (1, 4), F32)
    raw = intern("reshape", (top,), (), (4,), F32)
    out = normal_form(raw)
    # one row of a batch the other rows join along: the reshape stays above the reduction
    assert out.op == "reshape" and out.args[0].op == "reduce_max" and proved(raw, out)
    # a unit free dim under a reduction still squeezes
    x = make_arg(2, (1, 4, 3), F32)
    w = make_arg(3, (3, 5), F32)
    logits = make_dot(x, w, ((), (), (2,), (0,)), (1, 4, 5), F32)
    free = intern("reshape", (make_op("reduce_max", (logits,), ((2,),), (1, 4), F32),), (),
                  (4,), F32)
    squeezed = normal_form(free)
    assert squeezed.op == "reduce_max" and proved(free, squeezed)
    # must fail: the min in place of the max
    least = intern("reshape", (make_op("reduce_min", (logits,), ((2,),), (1, 4), F32),), (),
                   (4,), F32)
    assert normal_form(least) is not squeezed and refuted(least, free)


def test_a_sum_over_rows_read_one_at_a_time_meets_the_whole_sum() -> None:
    """`sum_j reduce_sum(x[j])` (each row read as jax indexes one: sliced, its unit dim
    reshaped away) meets `reduce_sum(x)` cut into its rows (`split_like`, `_rows_like`); the
    same sum with one row read twice and another not at all does not."""
    x = make_arg(0, (3, 2, 4), F32)
    whole = make_op("reduce_sum", (make_mul(x, x),), ((0, 1, 2),), (), F32, linear_in=0)

    def row(j):
        r = make_reshape(slice_term(x, 0, j, j + 1), (2, 4))
        return make_op("reduce_sum", (make_mul(r, r),), ((0, 1),), (), F32, linear_in=0)

    def summed(rows):
        return intern("lin", tuple(row(j) for j in rows),
                      (Fraction(0), tuple(Fraction(1) for _ in rows)), (), F32)

    # raw sums (the builders' joining is not asked)
    cut = split_like(whole, summed([0, 1, 2]))
    assert cut is not None and proved(cut, whole)
    assert normal_form(cut) is normal_form(summed([0, 1, 2]))
    assert blocks_meet(normal_form(whole), normal_form(summed([0, 1, 2])))
    # must fail: row 0 twice, row 2 never
    cut = split_like(whole, summed([0, 0, 1]))
    assert cut is None or normal_form(cut) is not normal_form(summed([0, 0, 1]))
    assert not blocks_meet(normal_form(whole), normal_form(summed([0, 0, 1])))
    assert refuted(summed([0, 0, 1]), whole)


def test_a_sum_over_all_elements_read_in_another_shape_meets() -> None:
    """A full sum of x read as (3, 2, 4) and of x read as (6, 4) are one sum
    (`_full_sums_meet`); of x and of another tensor's elements in that shape they are not."""
    x, y = make_arg(0, (3, 2, 4), F32), make_arg(1, (3, 2, 4), F32)

    def full(t):
        dims = tuple(range(len(t.shape)))
        return make_op("reduce_sum", (make_mul(t, t),), (dims,), (), F32, linear_in=0)

    flat = full(make_reshape(x, (6, 4)))
    assert blocks_meet(normal_form(full(x)), normal_form(flat)) and proved(flat, full(x))
    # must fail: the other tensor's elements
    other = full(make_reshape(y, (6, 4)))
    assert not blocks_meet(normal_form(full(x)), normal_form(other))
    assert refuted(other, full(x))


# ----- generic_element: an elementwise equality decided at one element -------------------------

def _clipped(x, op: str, bound: int):
    """select(compare(x, bound) by `op`, x, 0): x where it passes the bound, else 0."""
    shape = x.shape
    passes = make_elementwise("stablehlo.compare", (x, make_splat(bound, shape, x.dtype)),
                              (op,), dtype="i1")
    return make_elementwise("stablehlo.select", (passes, x, make_splat(0, shape, x.dtype)), ())


def test_elementwise_terms_are_compared_at_one_generic_element() -> None:
    x = make_arg(0, (8, 16), "i32")
    pair = generic_element([_clipped(x, "GT", 5), _clipped(x, "GE", 6)])
    assert pair is not None and all(t.shape == () for t in pair)
    assert check_term_equality(*pair, typed=True).proved  # x > 5 is x >= 6 on integers


@pytest.mark.parametrize("wrong", ["off_by_one", "float"])
def test_generic_elements_of_terms_that_differ_at_one_value_are_refuted(wrong: str) -> None:
    """x > 5 and x >= 5 differ only where x = 5 (and, on floats, x > 5 and x >= 6 between):
    the generic elements are refuted, and the decider's refutation holds on the whole terms
    (its inputs widened to every element: evaluated, they differ)."""
    from entangle_mlir.analysis.general.decide import Decider

    dtype = "f32" if wrong == "float" else "i32"
    x = make_arg(0, (8, 16), dtype)
    want = _clipped(x, "GT", 5)
    got = _clipped(x, "GE", 6 if wrong == "float" else 5)
    pair = generic_element([want, got])
    assert pair is not None and check_term_equality(*pair, typed=True).status == "refuted"
    decision = Decider([want]).decide(want, got, "generic")
    assert decision.status == "refuted", decision
    assert np.shape(decision.inputs[0]) == (8, 16)
    env = {0: decision.inputs[0]}
    assert any(a != b for a, b in zip(evaluate_term(want, env).flat, evaluate_term(got, env).flat))


def test_position_dependent_terms_have_no_generic_element() -> None:
    """An iota, a constant table, a movement or a broadcast of a non-scalar makes an element
    depend on its position: no reduction (x + iota and x + 3 agree at position 3 only)."""
    x = make_arg(0, (8,), "i32")
    iota = make_iota((8,), 0, "i32")
    assert generic_element([make_add(x, iota), make_add(x, make_splat(3, (8,), "i32"))]) is None
    row = make_arg(1, (8,), "i32")
    wide = make_broadcast(row, (1,), (4, 8))
    assert generic_element([wide, make_broadcast(row, (1,), (4, 8))]) is None
    assert generic_element([make_transpose(make_arg(2, (8, 8), "i32"), (1, 0)),
                            make_arg(2, (8, 8), "i32")]) is None
