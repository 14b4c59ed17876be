"""Lemmas of the `core/normal_form.py` identities a pipelined training step with tp stages
needs (issues 19 and 21, `examples/frontier.py`'s `pipeline_step`): each is proved by Z3 on
small symbolic tensors (the raw term before, the normal form after), and its nearest wrong
variant (pieces out of order, another window, another dim) is refuted and left apart."""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.core.normal_form import make_concat, normal_form, slice_term
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
)
from tests.core.raw_terms import F32, proved, raw, raw_concat, raw_slice, refuted

DOT = ((), (), (1,), (0,))












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
