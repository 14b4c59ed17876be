"""Normal-form identities for selections over blocks: what the general tier needs to meet a
program that picks per block and combines the candidates (a vocab-sharded argmax or top_k)
with the reference's one selection over the whole dim. Used by `core/normal_form/`.

Every identity is exact on the values it is applied to (no NaN there: the blocks are shown
finite by `term_interval`, so jax's comparators are total orders on (value, index)):

* `decided`: a compare of small signed integers whose intervals decide it is that constant;
  a select on a constant predicate is the operand it picks; an `and` / `or` of booleans with
  constant operands, a `reduce_and` / `reduce_or` of a constant, are constants (jax's bounds
  checks around `take_along_axis` once the index is known in range);
* `pick_first_best`: `take_along_axis(C, argmax(M, position iota))` along the reduced dim,
  with `C` strictly increasing along it (pieces with disjoint increasing ranges), is
  `argmax(M, C)`'s index: the first best position has the least `C` among the best;
* `combine_blocks`: `argmax` over the blocks' (best value, best global index) candidates is
  the argmax of the blocks joined, indices joined (each block's candidate is the pair largest
  in (value, -index) among its elements; the pair largest among the candidates is the one
  over all elements; a block's index shifted by `s` is its argmax with indices shifted by s);
* `top_k_of_blocks`: `top_k` of the blocks' top-k' values (k <= k') is the top_k of the
  blocks joined; `take_along_axis` of the blocks' indices (shifted to global ones) at that
  top_k's positions is the joined top_k's indices (equal values keep the lower index first,
  in the candidates as in the whole row, because candidates keep block order).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

from entangle_mlir.core.ranges import fits
from entangle_mlir.core.terms import (
    Term,
    intern,
    linear_parts,
    make_broadcast,
    make_iota,
    make_lin,
    make_reshape,
    make_splat,
    splat_value,
    term_finite,
    term_interval,
)

ARG_KINDS = ("argmax", "argmin")
TOP_K = "chlo.top_k"
Concat = Callable[[list[Term], int], Term]
"""Builds the concatenation of pieces along a dim, in normal form."""
_SMALL_SIGNED = ("i8", "i16", "i32")
"""Integer dtypes whose values the float intervals of `term_interval` hold exactly."""


def make_arg_reduce(kind: str, values: Term, indices: Term, init_value: Term, init_index: Term,
                    dims: tuple[int, ...], result: int) -> Term:
    """Result `result` (0 the values, 1 the indices) of an argmax / argmin reduce over `dims`
    (semantics: `tensor.arg_reduce`)."""
    shape = tuple(n for d, n in enumerate(values.shape) if d not in dims)
    dtype = (values if result == 0 else indices).dtype
    return intern(kind, (values, indices, init_value, init_index), (tuple(sorted(dims)), result),
                  shape, dtype)


def make_top_k(operand: Term, k: int, result: int, dtype: str) -> Term:
    """Result `result` (0 values, 1 indices) of the top k along the last dim of `operand`."""
    shape = operand.shape[:-1] + (k,)
    return intern(TOP_K, (operand,), (k, result), shape, dtype)


# ----- constants an interval decides --------------------------------------------------------------

def decided(term: Term) -> Term | None:
    """`term` as the constant (or the operand) it is, when its operands decide it; else None."""
    if term.op == "stablehlo.compare":
        outcome = _compare_outcome(term)
        return None if outcome is None else make_splat(int(outcome), term.shape, term.dtype)
    if term.op == "stablehlo.select" and len(term.args) == 3:
        pred = splat_value(term.args[0])
        if pred is None or term.args[1].shape != term.shape or term.args[2].shape != term.shape:
            return None
        return term.args[1] if pred else term.args[2]
    if term.op in ("stablehlo.and", "stablehlo.or") and term.dtype == "i1":
        absorbing = 0 if term.op == "stablehlo.and" else 1
        values = [splat_value(a) for a in term.args]
        if any(v == absorbing for v in values):
            return make_splat(absorbing, term.shape, "i1")
        rest = [a for a, v in zip(term.args, values) if v is None]
        if not rest:
            return make_splat(1 - absorbing, term.shape, "i1")
        if len(rest) == 1 and len(term.args) > 1 and rest[0].shape == term.shape:
            return rest[0]
        return None
    if term.op in ("reduce_and", "reduce_or") and term.dtype == "i1":
        value = splat_value(term.args[0])
        if value is None or any(term.args[0].shape[d] == 0 for d in term.attrs[0]):
            return None
        return make_splat(value, term.shape, "i1")
    return None


def _compare_outcome(term: Term) -> bool | None:
    """The value of a compare of two small signed integers on every input, when the operands'
    intervals decide it (they are exact for these dtypes: integers wrap, `term_interval`
    widens to the whole width where they may)."""
    if len(term.args) != 2 or len(term.attrs) != 1:
        return None
    a, b = term.args
    if a.dtype not in _SMALL_SIGNED or b.dtype != a.dtype:
        return None
    (alo, ahi), (blo, bhi) = term_interval(a), term_interval(b)
    direction = term.attrs[0]
    apart = ahi < blo or alo > bhi
    single = alo == ahi == blo == bhi
    true_if = {"LT": ahi < blo, "LE": ahi <= blo, "GT": alo > bhi, "GE": alo >= bhi,
               "EQ": single, "NE": apart}
    false_if = {"LT": alo >= bhi, "LE": alo > bhi, "GT": ahi <= blo, "GE": ahi < blo,
                "EQ": apart, "NE": single}
    if direction not in true_if:
        return None
    if true_if[direction]:
        return True
    if false_if[direction]:
        return False
    return None


# ----- take_along_axis ------------------------------------------------------------------------

_TAKE_KEYS = {"offset_dims", "collapsed_slice_dims", "operand_batching_dims",
              "start_indices_batching_dims", "start_index_map", "index_vector_dim",
              "slice_sizes", "indices_are_sorted"}


def take_along(term: Term) -> tuple[Term, Term, int] | None:
    """(operand, index, d) when `term` is jax's `take_along_axis(operand, index, d)` as a
    gather: `out[p] = operand[p with p_d := index[p, 0]]` (the index clamped into the dim;
    every other dim a batch dim); else None."""
    if term.op != "stablehlo.gather" or len(term.args) != 2:
        return None
    operand, index = term.args
    attrs = dict(term.attrs)
    rank = len(operand.shape)
    if not set(attrs) <= _TAKE_KEYS or attrs.get("indices_are_sorted", False) not in (False, 0):
        return None
    collapsed = tuple(attrs.get("collapsed_slice_dims", ()))
    if len(collapsed) != 1 or tuple(attrs.get("start_index_map", ())) != collapsed:
        return None
    (d,) = collapsed
    others = tuple(k for k in range(rank) if k != d)
    if tuple(attrs.get("offset_dims", ())) or attrs.get("index_vector_dim") != rank or tuple(
            attrs.get("operand_batching_dims", ())) != others or tuple(
            attrs.get("start_indices_batching_dims", ())) != others or tuple(
            attrs.get("slice_sizes", ())) != (1,) * rank:
        return None
    if len(term.shape) != rank or index.shape != term.shape + (1,) or any(
            term.shape[k] != operand.shape[k] for k in others):
        return None
    return operand, index, d


def _without(shape: tuple[int, ...], d: int) -> tuple[int, ...]:
    return tuple(n for k, n in enumerate(shape) if k != d)


def _reshaped_from(term: Term, shape: tuple[int, ...]) -> Term | None:
    """The term `term` reshapes when that term has `shape` (or `term` itself has it)."""
    if term.shape == shape:
        return term
    if term.op == "reshape" and term.args[0].shape == shape:
        return term.args[0]
    return None


def _is_position_iota(term: Term, d: int) -> bool:
    """`term` holds its own position along dim `d` (an iota along d, or one broadcast)."""
    if term.op == "iota":
        return term.attrs == (d,)
    return term.op == "broadcast" and term.attrs == ((d,),) and term.args[0].op == "iota" \
        and len(term.args[0].shape) == 1


def _extreme_init(kind: str, init_value: Term) -> bool:
    """The init value is the one every number beats (-inf for argmax, +inf for argmin)."""
    value = splat_value(init_value)
    return isinstance(value, float) and value == (-math.inf if kind == "argmax" else math.inf)


def _strictly_increasing(term: Term, d: int) -> bool:
    """Along dim `d`, every element of `term` is below the next one for every input: a
    concatenation along d of one-row pieces whose integer ranges are disjoint and increasing."""
    if term.op != "concatenate" or term.attrs != (d,) or any(p.shape[d] != 1 for p in term.args):
        return False
    below = -math.inf
    for piece in term.args:
        lo, hi = term_interval(piece)
        if lo <= below:
            return False
        below = hi
    return True


def pick_first_best(term: Term, concat: Concat) -> Term | None:
    """`take_along_axis(C, argmax(M, position iota along d)[:, None], d)` as `argmax(M, C)`'s
    indices (see the module docstring), for finite M, C strictly increasing along d, the
    init value -inf (argmax) or +inf (argmin); else None."""
    found = take_along(term)
    if found is None:
        return None
    c, index, d = found
    if term.shape[d] != 1:
        return None
    best = _reshaped_from(index, _without(term.shape, d))
    if best is None or best.op not in ARG_KINDS or best.attrs != ((d,), 1):
        return None
    m, position, init_value, init_index = best.args
    if m.shape != c.shape or c.dtype != position.dtype or init_index.dtype != c.dtype:
        return None
    if not _is_position_iota(position, d) or not _extreme_init(best.op, init_value):
        return None
    if not _strictly_increasing(c, d) or not term_finite(m):
        return None
    picked = make_arg_reduce(best.op, m, c, init_value, init_index, (d,), 1)
    return make_reshape(combine_blocks(picked, concat) or picked, term.shape)


# ----- argmax of the blocks' answers --------------------------------------------------------------

def _shift_of(term: Term) -> tuple[Term, int]:
    """(x, s) when `term` is `x + s` for an integer s (s = 0: `term` itself)."""
    if term.op == "lin":
        pairs, constant = linear_parts(term)
        if len(pairs) == 1 and pairs[0][0] == 1 and isinstance(constant, Fraction) \
                and constant.denominator == 1:
            return pairs[0][1], int(constant)
    return term, 0


def _shifted(term: Term, shift: int) -> Term | None:
    """`term + shift`, when no element wraps around in its integer dtype; else None."""
    lo, hi = term_interval(term)
    if not fits(Fraction(lo) + shift, Fraction(hi) + shift, term.dtype):
        return None
    if shift == 0:
        return term
    return make_lin([(Fraction(1), term)], Fraction(shift), term.shape, term.dtype)


def _position_start(term: Term, d: int) -> tuple[int, int] | None:
    """(c, n) when `term` is `position along d + c` (an iota, or a broadcast one), n long."""
    base, c = _shift_of(term)
    if not _is_position_iota(base, d):
        return None
    return c, base.shape[d]


def join_indices(pieces: list[Term], d: int, concat: Concat) -> Term:
    """The concatenation along `d` of index operands; positions along d plus consecutive
    starts join into one position iota (plus its start), the form jax's own argmax index
    takes; otherwise the plain concatenation."""
    starts = [_position_start(p, d) for p in pieces]
    shape = list(pieces[0].shape)
    shape[d] = sum(p.shape[d] for p in pieces)
    dtype = pieces[0].dtype
    if all(s is not None for s in starts) and all(p.dtype == dtype for p in pieces):
        at = starts[0][0]
        for c, n in starts:
            if c != at:
                break
            at += n
        else:
            if fits(Fraction(starts[0][0]), Fraction(at - 1), dtype) and fits(
                    Fraction(0), Fraction(shape[d] - 1), dtype):
                iota = make_iota((shape[d],), 0, dtype)
                whole = iota if len(shape) == 1 else make_broadcast(iota, (d,), tuple(shape))
                return whole if starts[0][0] == 0 else make_lin(
                    [(Fraction(1), whole)], Fraction(starts[0][0]), tuple(shape), dtype)
    return concat(pieces, d)


def combine_blocks(term: Term, concat: Concat) -> Term | None:
    """`argmax(concat_k(v_k), concat_k(c_k))`'s indices along the concatenated dim, where
    each one-row piece is a block's answer (v_k its max, or its argmax's value; c_k its
    argmax's index plus an offset s_k), as the argmax of the blocks joined with their
    indices (plus s_k) joined; for finite blocks and inits -inf (argmax) / +inf (argmin);
    else None."""
    if term.op not in ARG_KINDS or term.attrs[1] != 1 or len(term.attrs[0]) != 1:
        return None
    kind = term.op
    values, indices, init_value, init_index = term.args
    (d,) = term.attrs[0]
    if values.op != "concatenate" or indices.op != "concatenate" or values.attrs != (d,) \
            or indices.attrs != (d,) or len(values.args) != len(indices.args) \
            or not _extreme_init(kind, init_value):
        return None
    blocks, block_indices, dim = [], [], None
    for v, c in zip(values.args, indices.args):
        if v.shape[d] != 1 or c.shape[d] != 1:
            return None
        inner, shift = _shift_of(c)
        best = _reshaped_from(inner, _without(c.shape, d))
        if best is None or best.op != kind or best.attrs[1] != 1 or len(best.attrs[0]) != 1:
            return None
        x, positions, block_init, _ = best.args
        (e,) = best.attrs[0]
        if dim not in (None, e) or not _extreme_init(kind, block_init):
            return None
        dim = e
        value = _reshaped_from(v, _without(v.shape, d))
        reduce = "reduce_max" if kind == "argmax" else "reduce_min"
        same_value = value is not None and (
            value.op == reduce and value.args[0] is x and value.attrs[0] == (e,)
            or value.op == kind and value.args == best.args and value.attrs == ((e,), 0))
        if not same_value or not term_finite(x):
            return None
        moved = _shifted(positions, shift)
        if moved is None:
            return None
        blocks.append(x)
        block_indices.append(moved)
    if any(b.shape[:dim] + b.shape[dim + 1:] != blocks[0].shape[:dim] + blocks[0].shape[dim + 1:]
           for b in blocks):
        return None
    joined = concat(blocks, dim)
    joined_indices = join_indices(block_indices, dim, concat)
    if joined_indices.dtype != term.dtype:
        return None
    return make_arg_reduce(kind, joined, joined_indices, init_value, init_index, (dim,), 1)


# ----- top_k of the blocks' top_k -----------------------------------------------------------------

def _block_tops(values: Term, k: int) -> list[tuple[Term, int]] | None:
    """[(block, k')] when `values` is the concatenation along the last dim of the blocks'
    top-k' values, each k' >= k and each block finite; else None."""
    last = len(values.shape) - 1
    if values.op != "concatenate" or values.attrs != (last,):
        return None
    tops = []
    for piece in values.args:
        if piece.op != TOP_K or piece.attrs[1] != 0 or piece.attrs[0] < k:
            return None
        (block,) = piece.args
        if not term_finite(block):
            return None
        tops.append((block, piece.attrs[0]))
    return tops


def top_k_of_blocks(term: Term, concat: Concat) -> Term | None:
    """`top_k(concat_k(top_k(x_k, k').values), k).values` as `top_k(concat_k(x_k), k)`'s
    values, for k <= k' and finite blocks; else None."""
    if term.op != TOP_K or term.attrs[1] != 0:
        return None
    k = term.attrs[0]
    tops = _block_tops(term.args[0], k)
    if tops is None:
        return None
    joined = concat([b for b, _ in tops], len(term.shape) - 1)
    return make_top_k(joined, k, 0, term.dtype)


def take_top_k_indices(term: Term, concat: Concat) -> Term | None:
    """`take_along_axis(concat_k(top_k(x_k, k').indices + s_k), top_k(V, k).indices, last)`,
    V the blocks' top-k' values as in `top_k_of_blocks` and s_k the start of x_k in the
    joined row, as `top_k(concat_k(x_k), k)`'s indices; else None."""
    found = take_along(term)
    if found is None:
        return None
    c, index, d = found
    last = len(term.shape) - 1
    if d != last:
        return None
    picks = _reshaped_from(index, term.shape)
    if picks is None or picks.op != TOP_K or picks.attrs[1] != 1:
        return None
    k = picks.attrs[0]
    tops = _block_tops(picks.args[0], k)
    if tops is None or c.op != "concatenate" or c.attrs != (last,) or len(c.args) != len(tops):
        return None
    start = 0
    for piece, (block, k_block) in zip(c.args, tops):
        inner, shift = _shift_of(piece)
        if inner.op != TOP_K or inner.args != (block,) or inner.attrs != (k_block, 1) \
                or shift != start or inner.dtype != term.dtype:
            return None
        if _shifted(inner, shift) is None:
            return None
        start += block.shape[last]
    if not fits(Fraction(0), Fraction(start - 1), term.dtype):
        return None
    joined = concat([b for b, _ in tops], last)
    return make_top_k(joined, k, 1, term.dtype)


def rewrite(term: Term, concat: Concat) -> Term | None:
    """The first of this module's identities that applies to `term` (its operands already in
    normal form), or None. `concat` builds a concatenation in normal form (the caller's
    `make_concat`: passed in, as `core/normal_form/` imports this module)."""
    out = decided(term)
    for step in (pick_first_best, combine_blocks, top_k_of_blocks, take_top_k_indices):
        if out is not None:
            return out
        out = step(term, concat)
    return out
