"""Lemmas of two normal-form identities of concatenations the attention pipeline's
norm-weight gradient needs through the layer template (benchmarks/FRONTIER_RESULTS.md,
thirteenth session): blocks of rows of one function of a stream leaf, of one row and of two
rows side by side, join in runs of one size (`concat._even_runs_joined`); blocks each scaled
by one constant are that constant times their concatenation (`concat._common_scale`). Each
is checked by Z3 on the terms before (raw nodes) against the normal form after, with its
nearest wrong variant, which must not meet and which Z3 refutes."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

from entangle_mlir.core.normal_form import make_concat, normal_form, slice_term
from entangle_mlir.core.terms import (
    make_arg,
    make_broadcast,
    make_elementwise,
    make_lin,
    make_mul,
    make_op,
    make_reshape,
)
from tests.core.raw_terms import F32, proved, raw_concat, refuted


def _row_normalized(y):
    """`y * rsqrt(sum(y * y))` along the last dim (an RMS norm without its mean or weight)."""
    last = len(y.shape) - 1
    squares = make_mul(y, y)
    total = make_op("reduce_sum", (squares,), ((last,),), y.shape[:last], F32, linear_in=0)
    scale = make_elementwise("stablehlo.rsqrt", (total,))
    return make_mul(y, make_broadcast(scale, tuple(range(last)), y.shape))


def test_one_row_blocks_beside_a_two_row_block_join_in_runs_of_one_size() -> None:
    """A stream leaf's rows normalized and rotated, then repeated for two query heads a key
    (GQA), block by block: one-row blocks, each computed with its unit row dim left out
    (the broadcast adds it), next to a two-row block computed with its rows (one device holds
    two rows, or two rows joined before): the one-row blocks join all at once, then the blocks
    of rows, so the whole meets `f(x)`; all one-row blocks met before, mixed ones did not."""
    x = make_arg(0, (4, 3, 2), F32)
    gain = make_arg(1, (3, 2), F32)

    def inner(y):
        normed = _row_normalized(y)
        last = len(y.shape) - 1
        scaled = make_mul(normed, make_broadcast(gain, (last - 1, last), y.shape))
        return make_concat([normed, scaled], last)

    def one_row(b):
        y = make_reshape(slice_term(x, 0, b, b + 1), (3, 2))
        return make_reshape(make_broadcast(inner(y), (1, 3), (1, 3, 2, 4)), (1, 6, 4))

    def rows(y):
        r = y.shape[0]
        return make_reshape(make_broadcast(inner(y), (0, 1, 3), (r, 3, 2, 4)), (r, 6, 4))

    whole = rows(x)
    for pieces in ([one_row(0), one_row(1), rows(slice_term(x, 0, 2, 4))],
                   [rows(slice_term(x, 0, 0, 2)), one_row(2), one_row(3)]):
        assert make_concat(pieces, 0) is normal_form(whole)
        assert proved(raw_concat(pieces, 0), whole)
    # must fail: the one-row blocks in the other order
    swapped = [one_row(1), one_row(0), rows(slice_term(x, 0, 2, 4))]
    assert make_concat(swapped, 0) is not normal_form(whole)
    assert refuted(raw_concat(swapped, 0), whole)


def _scaled(c, t):
    return make_lin([(c, t)], 0, t.shape, t.dtype)


def test_blocks_scaled_by_one_constant_are_the_scaled_concatenation() -> None:
    """`concat(-a, -b) = -concat(a, b)` (a RoPE backward's rotated half negated per block) and
    `concat(3a, 3b) = 3 concat(a, b)`, for blocks a, b that do not join otherwise."""
    a, b = make_arg(0, (2, 3), F32), make_arg(1, (1, 3), F32)
    for c in (-1, 3):
        whole = _scaled(c, make_concat([a, b], 0))
        pieces = [_scaled(c, a), _scaled(c, b)]
        assert make_concat(pieces, 0) is normal_form(whole)
        assert proved(raw_concat(pieces, 0), whole)
    # must fail: one block negated, the other not; two different scales
    whole = _scaled(-1, make_concat([a, b], 0))
    for pieces in ([_scaled(-1, a), b], [_scaled(-1, a), _scaled(3, b)]):
        assert make_concat(pieces, 0) is not normal_form(whole)
        assert refuted(raw_concat(pieces, 0), whole)


def test_blocks_scaled_by_nearly_one_constant_stay_apart() -> None:
    """Session 13's attacks on `_common_scale`: blocks scaled by f32 0.1 and the next f32 up,
    by bf16 0.1 and f32 0.1, or by one coefficient with a constant added to one block only,
    are not a scaled concatenation (other forms; Z3 refutes each against the one scale)."""
    a, b = make_arg(0, (2, 3), F32), make_arg(1, (1, 3), F32)
    tenth = Fraction(float(np.float32(0.1)))
    up = Fraction(float(np.nextafter(np.float32(0.1), np.float32(1))))
    bf16 = Fraction(float(ml_dtypes.bfloat16(0.1)))
    assert len({tenth, up, bf16}) == 3
    whole = _scaled(tenth, make_concat([a, b], 0))
    offset = make_lin([(tenth, b)], 1, b.shape, F32)
    for pieces in ([_scaled(tenth, a), _scaled(up, b)], [_scaled(bf16, a), _scaled(tenth, b)],
                   [_scaled(tenth, a), offset]):
        assert make_concat(pieces, 0) is not normal_form(whole)
        assert refuted(raw_concat(pieces, 0), whole)
