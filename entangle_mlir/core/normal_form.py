"""A normal form for data movement the term builders do not apply: what the general tier
(`analysis/general/`) needs to meet a program's per-device pieces with the reference's whole
tensors without Z3.

Every identity here is exact (a float sum split or joined over pieces is a regrouping, which
the semantics policy allows; nothing else is assumed):

* `make_concat`: nested concatenations along one dim are one; adjacent slices of one term
  along the dim join into one slice (the term itself when they cover it); empty pieces go;
  a single piece is itself;
* a slice spanning several pieces of a concatenation is the concatenation of the pieces'
  slices (the builders' `push_slice` only takes a slice inside one piece);
* a slice of a reshape that takes, in each group of dims the reshape splits or merges, a
  run of elements that is a box of the reshape's operand is the reshape of that box
  (`slice_of_reshape`: a micro-batch sliced out of a device's block is rows of the input);
* an elementwise op (same op, same attributes) of concatenations cut at the same rows is the
  concatenation of the op on the pieces, and the other way round: a concatenation of one
  elementwise op applied piece by piece is that op on the concatenated operands (for `lin`
  pieces, parts paired by equal coefficients, whatever order each piece lists them in);
* a concatenation of contractions with the same attributes and one operand in common,
  cut along a free dim of the other, is the contraction of the other operands concatenated
  along that dim;
* a `lin` whose parts are contractions (or sums) that differ only by adjacent slices of
  their operands along the contracted (summed) dim, with equal coefficients, is one
  contraction (sum) over the joined slices; so are parts whose operands' concatenation
  along the contracted dim is no concatenation in normal form (rows of one computation,
  `make_concat`), and transposes of such parts with one permutation;
* a sum over the major half of a dim split in two by a reshape is the sum of the dim's
  consecutive blocks (`sum_of_blocks`: the reference's block sums meet a psum of a tiled
  value); a reshape merging dims whose major one is concatenated is the concatenation of the
  pieces reshaped (`reshape_of_concat`: an untiled all_gather and its reshape);
* a scatter-add into zeros at constant indices whose every update window fits inside the
  operand is the sum of the updates' windows each padded with zeros to its place
  (`scatter_at_constants`: what a device's `x.at[(me + k) % n].add(u)` is once `me` is
  known; a colliding pair of windows is summed, as the scatter sums it);
* a scatter that writes (its region returns the update) at constant indices whose update
  windows fit inside the operand and are pairwise disjoint is the operand's rows around
  each window concatenated with that window's update, dim by dim
  (`scatter_replace_at_constants`: `x.at[i].set(u)` at a known i; a pipeline's outputs set
  micro-batch by micro-batch into zeros become the stacked micro-batches, which the lifts
  below meet with the whole batch's computation); overlapping windows (which write wins is
  implementation-defined) and windows out of bounds are left alone;
* a concatenation of one transpose, broadcast, dot_general or reduction applied piece by
  piece is that op of the concatenated operands, where that concatenation meets
  (`_lift_movement`);
* a sum of parts that are one contraction (sum), under the same transposes, over blocks
  of the summed dim is one contraction over the concatenated blocks, taken in an order in
  which some operand meets (`_join_groups`; any order used on both operands alike is exact);
  so is a sum of scatter-adds into zeros over blocks of their updates (`_join_scatters`).
* a square root or float convert of a constant is the splat of its exact value
  (`fold_constant`: IEEE 754 fixes both, `core/rounding.py`);
* argmax / argmin and top_k of per-block candidates, and index bounds an interval decides:
  `core/selection.py`.
* a reshape that only leaves out unit dims goes to the operands (`squeeze`): through a
  dot_general's unit batch or free dim, a transpose, elementwise ops and `lin`, broadcasts,
  reductions, a reduce_window (window 1 on the dim), a slice (on dims it keeps whole) and a
  top_k (the reference's group of one token block, cut out of its vmapped groups, meets the
  device's unbatched computation); not past a reduction to a dot's unit batch dim, nor to a
  scalar (a device's one batch row, which the other rows join along; `_sum_view`'s form);
* a reshape of a reduction takes each group of dims it splits, or merges without a reduced
  dim between them, into the operand, the rest of it staying above the reduction
  (`reshape_through_reduction`; the blocks of a flattened reduction, joined, meet the
  unflattened one), and through a broadcast it splits a dim of the broadcast operand alike
  (`make_reshape`); a reshape of a contraction takes the groups within one operand's free
  dims into that operand (`reshape_through_dot`);
* a slice of a reduction, of a reduce_window with a window of 1 on the cut dims (a cumsum
  along another dim) or of a top_k along its other dims is the op of the operand's rows
  (`slice_through`);
* a transpose putting a dot_general's rhs free dims before its lhs free dims is the dot with
  its operands swapped (`swapped_dot`);
* commuting operands (the builders sort them by serial) are lined up piece by piece before a
  concatenation lifts through an elementwise op (`_aligned`);

and for pipelines (issue 19: each micro-batch, and each row block of it, computed apart;
gradients summed step by step), each exact, at most a regrouping of a sum:

* a piece of one row along the concatenated dim is written in the form of a piece of
  several rows before a broadcast or reduction lifts (`_units_alike`); copies of one row are
  its broadcast (`_copies`); a concatenation of concatenations cut alike along another dim
  is the concatenation of its columns (`_swap_blocks`); runs of a reshape's pieces whose
  operands join along the one dim the reshape merges are joined first (`_runs_joined`);
* a sum or contraction over adjacent dims is one over them merged (`merge_summed_dims`,
  `merge_contracted_dims`); a reshape merging a reduction's adjacent kept dims, or a
  broadcast operand's dims, goes to the operand (`reshape_through_reduction`,
  `merge_through_broadcast`); a slice or reshape of a kept integer table is the table it
  gives (`_table_part`);
* zero pads are read through when sums join (`_peel`); sums of like pieces join in the
  order of the one window of an input each reads (`_unique_window_starts`);
* for a pipelined training step with tp stages (issue 21, `examples/frontier.py`'s
  `pipeline_step`): a concatenation whose pieces do not meet all at once joins its runs of
  adjacent pieces that do (`_adjacent_runs_joined`: each layer's tp column blocks; rows of
  one row each only where they move one input); a concatenation of slices cut alike is the
  slice of the concatenation (`_lift_slice`: the rotary halves of each shard's heads), one of
  pads along a dim they do not pad the pad of the concatenation (the rotary backward); a
  reduction keeping its operand's unit dims is the reshape of the reduction of the squeezed
  operand (`unit_kept_reduction`: a one-layer stage's weight gradient); the contractions of
  a sum that do not join all together join per weight they move (`_subgroups`: a
  tp-partial residual stream, attention and MLP);
* a unit dim present on one side and absent on the other (issue 21: one kv head a device
  at tp 8, one batch row a device): pieces broadcast along a dim no operand dim fills, k
  rows each, are the operands given that unit dim (`unsqueezed`, through a concatenation's
  pieces) broadcast to (pieces, k) and merged (the unsqueeze lift, `_lift_movement`); a
  reshape splitting a concatenation at its pieces splits each piece (`reshape_of_concat`);
  an elementwise op of broadcasts none of which fills a dim is the broadcast of the op
  without it (`broadcast_hoisted`: a table rebuilt from copies meets the table computed
  once); heads read at a stride are one strided slice (`_strided_rows`, each piece checked
  to be the candidate's row); pieces of k rows each that join nowhere else are stacked
  along a unit dim and merged (`_stacked_rows`: a GQA backward's per-kv-head sums, the
  reduction then keeping that unit dim before the copies it sums,
  `_reduction_keeping_unit(early=True)`); one-column contractions of two layers join layer
  by layer (`_heads_of_contractions`); commuting operands line up by a concatenation's first piece
  (`_leading`);
* one batch row a device with attention (gap 1, `pipeline_step` at dp 2 with a batch of 2):
  pieces of one row each, reshaped to (tokens, features), stack along their unit row dim
  before their runs join along seq (`_rows_stacked`); reshape pieces whose operands differ
  along one dim join along it (`_uneven_reshapes_joined`: a stage's two layers of heads next
  to one); a sum's parts pair up by the pads and transposes over them (`_moved_by`: rotary
  halves of k and q); contractions of distinct weights join in the order of the weights'
  arguments (`_orders`);
* `blocks_meet` also meets sums over every element across shapes and tiles
  (`_full_sums_meet`, `_tiled_sums_meet`), terms row block by row block where one is
  computed element by element from a concatenation (`_spine_cuts`), and one op over
  operands that meet position by position, a concatenation of pieces against the whole
  they are rows of (`congruent`: pieces whose sums came out signed apart stay a
  concatenation inside a contraction; a product's factors and a sum's parts paired by what
  they are, not by serial; a sum whose contractions joined on one side cut into the other's
  parts, `split_like`).

Since the builders order sums by serial, pieces computed alike can still come out with
different signs; `split_like` / `blocks_meet` (used by the general tier's decision) meet
them the other way: the reference's contraction is cut into the sharded sum's blocks, each
block then built from the same input windows as the sharded part.

`normal_form(term)` rebuilds a term bottom-up through these rules (memoized by serial).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction

from entangle_mlir.core import selection
from entangle_mlir.core.ranges import fits
from entangle_mlir.core.rounding import exact_value
from entangle_mlir.core.terms import (
    DENSE_VALUES,
    Term,
    intern,
    linear_parts,
    make_broadcast,
    make_dense,
    make_dot,
    make_iota,
    make_lin,
    make_op,
    make_reshape,
    make_splat,
    make_transpose,
    post_order,
    rebuild,
    rebuild_elementwise,
    reshape_groups,
    skeleton,
    splat_value,
    subterms,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS

_ELEMENTWISE = frozenset(ELEMENTWISE_OPS) | {"mul", "div"}
"""Term ops computed element by element from same-shaped operands (`lin` is handled by its
parts)."""


def slice_term(term: Term, dim: int, start: int, stop: int) -> Term:
    """Rows [start, stop) of `term` along `dim` (through the builders: pushed to the leaves)."""
    rank = len(term.shape)
    starts = tuple(start if d == dim else 0 for d in range(rank))
    limits = tuple(stop if d == dim else n for d, n in enumerate(term.shape))
    shape = tuple(stop - start if d == dim else n for d, n in enumerate(term.shape))
    return make_op("slice", (term,), (starts, limits, (1,) * rank), shape, term.dtype,
                   linear_in=0)


def _window(piece: Term, dim: int) -> tuple[Term, int, int, tuple] | None:
    """(base, start, stop, rest) when `piece` is rows [start, stop) of `base` along `dim` with
    unit strides, `rest` the windows of the other dims (a whole term is its own window)."""
    if piece.op != "slice":
        return piece, 0, piece.shape[dim], tuple((0, n) for d, n in enumerate(piece.shape)
                                                  if d != dim)
    base = piece.args[0]
    starts, limits, strides = piece.attrs
    if any(s != 1 for s in strides):
        return None
    rest = tuple((starts[d], limits[d]) for d in range(len(base.shape)) if d != dim)
    return base, starts[dim], limits[dim], rest


def _joins(first: Term, second: Term, dim: int) -> Term | None:
    """`first` then `second` along `dim` as one window of one term, when they are adjacent
    windows of it (at least one of them a slice), else None."""
    if first.op != "slice" and second.op != "slice":
        return None
    a, b = _window(first, dim), _window(second, dim)
    if a is None or b is None or a[0] is not b[0] or a[3] != b[3] or a[2] != b[1]:
        return None
    base, rank = a[0], len(first.shape)
    others = iter(a[3])
    bounds = [(a[1], b[2]) if d == dim else next(others) for d in range(rank)]
    starts = tuple(lo for lo, _ in bounds)
    limits = tuple(hi for _, hi in bounds)
    shape = tuple(hi - lo for lo, hi in bounds)
    return make_op("slice", (base,), (starts, limits, (1,) * rank), shape, base.dtype,
                   linear_in=0)


_CONCATS: dict[tuple, Term] = {}
"""make_concat by (piece serials, dim): terms are interned for the whole run, and lifting a
concatenation through a chain of ops asks for the same inner concatenations again."""


def make_concat(pieces, dim: int) -> Term:
    """The concatenation of `pieces` along `dim`, in normal form (see the module docstring)."""
    pieces = tuple(pieces)
    key = (tuple(p.serial for p in pieces), dim)
    found = _CONCATS.get(key)
    if found is not None:
        return found
    if key in _BUILDING:  # asked again while lifting itself (`_stacked_rows`)
        at = _BUILDING.index(key)
        for frame in range(at + 1, len(_BUILDING)):
            _TAINTED.add(_BUILDING[frame])
        return _plain_concat(list(pieces), dim)
    _BUILDING.append(key)
    try:
        found = _make_concat(pieces, dim)
    finally:
        _BUILDING.pop()
    if key in _TAINTED:
        _TAINTED.discard(key)
    else:
        _CONCATS[key] = found
    return found


_BUILDING: list[tuple] = []
"""The concatenations `make_concat` is computing, outermost first (a lift that asks for one
of them again gets it unlifted: a bound on the recursion)."""

_TAINTED: set[tuple] = set()
"""Concatenations computed inside one that was asked for again: their result saw that one
unlifted, so it is not memoized (the memo holds only forms that do not depend on what was
being computed around them)."""


def _plain_concat(pieces: list[Term], dim: int) -> Term:
    """The concatenation node itself, no identity applied."""
    shape = list(pieces[0].shape)
    shape[dim] = sum(p.shape[dim] for p in pieces)
    return intern("concatenate", tuple(pieces), (dim,), tuple(shape), pieces[0].dtype)


def _make_concat(pieces: tuple[Term, ...], dim: int) -> Term:
    flat: list[Term] = []
    for piece in pieces:
        if piece.op == "concatenate" and piece.attrs == (dim,):
            flat.extend(piece.args)
        elif piece.shape[dim]:
            flat.append(piece)
    if not flat:
        raise ValueError("concatenation of no rows")
    joined: list[Term] = []
    for piece in flat:
        merged = _joins(joined[-1], piece, dim) if joined else None
        if merged is not None:
            joined[-1] = merged
        else:
            joined.append(piece)
    if len(joined) == 1:
        return joined[0]
    constant = _joined_constant(joined, dim)
    if constant is not None:
        return constant
    if all(p is joined[0] for p in joined) and joined[0].shape[dim] == 1:
        return _copies(joined[0], dim, len(joined))
    lifted = _lift_elementwise(joined, dim)
    if lifted is None:
        lifted = _lift_movement(joined, dim)
    if lifted is None:
        lifted = _swap_blocks(joined, dim)
    if lifted is not None:
        return lifted
    runs = _adjacent_runs_joined(joined, dim)
    if runs is not None:
        return make_concat(runs, dim)
    stacked = _stacked_rows(joined, dim)
    if stacked is not None:
        return stacked
    return _plain_concat(joined, dim)


def _stacked_rows(pieces: list[Term], dim: int) -> Term | None:
    """Pieces of k > 1 rows each along `dim` (one kv head a device, its head dim left out of
    its computation and merged with the next) as `reshape(concat_i(p_i given a unit dim at
    `dim`))`, the unit dim becoming the pieces' dim followed by their k rows, when that
    stacked concatenation meets (exact: row-major, piece i's k rows are rows i*k .. i*k+k-1
    of the merged dim either way). None otherwise."""
    rows = pieces[0].shape[dim]
    if rows < 2 or any(p.shape[dim] != rows for p in pieces):
        return None
    inner = make_concat([unsqueezed(p, dim) for p in pieces], dim)
    if not _joined(inner, dim):
        return None
    shape = list(pieces[0].shape)
    shape[dim] = rows * len(pieces)
    return make_reshape(inner, tuple(shape))


def _adjacent_runs_joined(pieces: list[Term], dim: int) -> list[Term] | None:
    """The pieces (more than two, which did not meet all at once) with each run of adjacent
    ones that `make_concat` meets into something other than a concatenation along `dim`
    joined, left to right (exact: a concatenation is associative, so
    `concat(a, b, c, d) = concat(concat(a, b), concat(c, d))`; the tp column blocks of each
    layer of a pipeline stage, `[f(x0 @ w0[:, :k]), f(x0 @ w0[:, k:]), f(x1 @ w1[:, :k]),
    ...]`, join layer by layer where the layers' inputs differ). None when no two adjacent
    pieces meet, or some piece is one row along `dim` computed from the inputs (rows, such
    as a stage's layers or a micro-batch's rows, join in the forms the lifts give them all
    at once: joined in runs, they meet other rows in other forms); rows that are moves of
    one input (a grid of micro-batch x row slices, flattened) do join in runs."""
    if len(pieces) <= 2:
        return None
    if any(p.shape[dim] == 1 for p in pieces) and (
            _moved_argument(pieces[0], dim) is None
            or len({_moved_argument(p, dim) for p in pieces}) != 1) \
            and not _heads_of_contractions(pieces, dim):
        return None
    out = [pieces[0]]
    joined = False
    for piece in pieces[1:]:
        merged = make_concat([out[-1], piece], dim)
        if _joined(merged, dim):
            out[-1] = merged
            joined = True
        else:
            out.append(piece)
    return out if joined else None


def _heads_of_contractions(pieces: list[Term], dim: int) -> bool:
    """Whether the pieces are contractions cut along a free dim of one operand, the other
    operand shared within runs (one kv head a device, the devices of two layers side by
    side): such runs join by `_lift_dot` into one contraction each, whatever the rows
    around them."""
    first = pieces[0]
    if first.op != "stablehlo.dot_general" or any(
            p.op != first.op or p.attrs != first.attrs for p in pieces):
        return False
    lb, _, lc, _ = first.attrs
    lfree = len(first.args[0].shape) - len(lb) - len(lc)
    side = 0 if dim < len(lb) + lfree else 1
    return dim >= len(lb) and len({p.args[1 - side].serial for p in pieces}) < len(pieces)


def _copies(piece: Term, dim: int, count: int) -> Term:
    """`count` copies of `piece`, one row along `dim`, concatenated along it: the broadcast
    of the row (exact: every row is the piece; a weight row each micro-batch reads)."""
    kept = tuple(d for d in range(len(piece.shape)) if d != dim)
    row = make_reshape(piece, tuple(piece.shape[d] for d in kept))
    shape = tuple(count if d == dim else n for d, n in enumerate(piece.shape))
    return make_broadcast(row, kept, shape)


def _swap_blocks(pieces: list[Term], dim: int) -> Term | None:
    """A concatenation along `dim` of concatenations along another dim `e`, all cut at the
    same places along `e`, as the concatenation along `e` of the columns concatenated along
    `dim` (exact: a block matrix read by rows or by columns), when some column meets (the
    rows of each micro-batch's layers, stacked, meet the batch's layer by layer)."""
    first = pieces[0]
    if first.op != "concatenate" or first.attrs == (dim,):
        return None
    (e,) = first.attrs
    cuts = [a.shape[e] for a in first.args]
    if any(p.op != "concatenate" or p.attrs != (e,) or [a.shape[e] for a in p.args] != cuts
           for p in pieces):
        return None
    columns = [make_concat([p.args[j] for p in pieces], dim) for j in range(len(cuts))]
    if not any(_joined(c, dim) for c in columns):
        return None
    return make_concat(columns, e)


def _joined_constant(pieces: list[Term], dim: int) -> Term | None:
    """Splats of one value join into one splat; 1-D pieces `iota + c` with consecutive
    values join into one (the form `push_slice` gives a window of an iota)."""
    shape = list(pieces[0].shape)
    shape[dim] = sum(p.shape[dim] for p in pieces)
    if all(p.op == "splat" for p in pieces) and len({p.attrs for p in pieces}) == 1:
        return make_splat(pieces[0].attrs[0], tuple(shape), pieces[0].dtype)
    if len(shape) != 1:
        return None
    start = _iota_start(pieces[0])
    if start is None:
        return None
    at = start
    for piece in pieces:
        if _iota_start(piece) != at:
            return None
        at += piece.shape[0]
    if not fits(Fraction(0), Fraction(shape[0] - 1), pieces[0].dtype):
        return None  # the joined iota's own positions would wrap around (or round)
    iota = make_iota(tuple(shape), 0, pieces[0].dtype)
    return make_lin([(Fraction(1), iota)], start, tuple(shape), pieces[0].dtype)


def _iota_start(term: Term) -> Fraction | None:
    """c when the 1-D `term` is `iota + c` (an integer c), else None."""
    if term.op == "iota":
        return Fraction(0)
    pairs, constant = linear_parts(term)
    if term.op == "lin" and len(pairs) == 1 and pairs[0][0] == 1 and pairs[0][1].op == "iota" \
            and isinstance(constant, Fraction) and constant.denominator == 1:
        return constant
    return None


def _lift_elementwise(pieces: list[Term], dim: int) -> Term | None:
    """`op(concat(a_i), concat(b_i))` when every piece is `op(a_i, b_i)` with one op and
    attributes (operands of the piece's shape): exact, the op works element by element. Only
    when some operand then joins (a slice meets its neighbour), so the form stays smaller."""
    first = pieces[0]
    if first.op == "lin" and all(p.op == "lin" and p.attrs[0] == first.attrs[0]
                                 and len(p.args) == len(first.args) for p in pieces):
        rows = [_aligned_parts(first, p) for p in pieces]
        if any(r is None for r in rows):
            return None
        columns = [make_concat([r[k] for r in rows], dim) for k in range(len(first.args))]
        if not any(_joined(c, dim) for c in columns):
            return None
        constant, coefs = first.attrs
        return make_lin(list(zip(coefs, columns)), constant, columns[0].shape, first.dtype)
    if first.op not in _ELEMENTWISE or any(
            p.op != first.op or p.attrs != first.attrs or len(p.args) != len(first.args)
            or p.dtype != first.dtype for p in pieces):
        return None
    if any(a.shape != p.shape for p in pieces for a in p.args):
        return None
    operands = _aligned(pieces, dim)
    columns = [make_concat([args[k] for args in operands], dim)
               for k in range(len(first.args))]
    if not any(_joined(c, dim) for c in columns):
        return None
    return _rebuilt(first, tuple(columns))


_COMMUTES = frozenset({"mul"} | {op for op, t in ELEMENTWISE_OPS.items() if t.commutes})


def _broadcast_off(term: Term, dim: int) -> tuple | None:
    """The dims a broadcast fills other than `dim`, numbered as if `dim` were not there
    (None for other ops): what tells a broadcast of one row along `dim` (which leaves the
    unit dim out of its operand) and one of several rows apart from another broadcast."""
    if term.op != "broadcast":
        return None
    return _without([d for d in term.attrs[0] if d != dim], [dim])


_MOVES = frozenset({"slice", "reshape", "broadcast", "transpose"})


def _weights(term: Term) -> frozenset[int]:
    """The arguments `term`'s operands are, up to slicing, reshaping, broadcasting and
    transposing (a contraction's weight, a gain): what tells apart two operands computed
    alike from different parameters."""
    found = set()
    for arg in term.args:
        while arg.op in _MOVES and arg.args:
            arg = arg.args[0]
        if arg.op == "arg":
            found.add(arg.attrs[0])
    return frozenset(found)


_ARG_KEYS = (lambda t, dim: (t.op, t.dtype, t.attrs), lambda t, dim: (t.op, t.dtype),
             lambda t, dim: (t.op, t.dtype, _broadcast_off(t, dim)),
             lambda t, dim: (t.op, t.dtype, t.attrs, _weights(t)),
             lambda t, dim: (t.op, t.dtype, t.args[0].serial if t.op == "slice" else t.attrs),
             lambda t, dim: (_leading(t, dim).op, t.dtype, _broadcast_off(t, dim)),
             lambda t, dim: (t.dtype, _moved_input(_leading(t, dim))))
"""What lines commuting operands up across pieces, tried in order: the operand's kind with
its attributes, then without them (the windows of pieces' slices differ), then with only
what a broadcast fills besides the concatenation's dim (pieces of one row and of several
rows, with two broadcasts among their operands), then with the parameters it reads directly
(a SwiGLU's gate and up projections: two contractions alike but for their weight), then a
slice by the term it slices (a micro-batch's rows times a shared weight row), then an
operand that is itself a concatenation along the dim by its first piece's kind (pieces that
joined in part before: `concat(d0, d1) * bcast` next to `bcast * d2`), then by the input
each moves through its movement ops (and a concatenation's first piece): a norm's `x *
gain * scale` of a micro-batch's rows, joined in part, next to one row's, whose factors'
kinds and broadcasts all differ."""


def _leading(term: Term, dim: int) -> Term:
    """`term`'s first piece when it is a concatenation along `dim` (again, while it is one),
    else `term`."""
    while term.op == "concatenate" and term.attrs == (dim,):
        term = term.args[0]
    return term


def _aligned(pieces: list[Term], dim: int) -> list[tuple[Term, ...]]:
    """The operands of each piece (one op), in the first piece's operand order: for an op
    whose operands commute (so any order is the same value), each piece's reordered so that
    each operand lines up with the first piece's operand of the same kind (`_ARG_KEYS`, the
    first under which every piece's kinds are distinct and the same); else as they are. The
    builders order commuting operands by serial, so pieces computed alike can list them in
    different orders."""
    plain = [p.args for p in pieces]
    if pieces[0].op not in _COMMUTES:
        return plain
    for by in _ARG_KEYS:
        def key(t: Term, by=by):
            return by(t, dim)
        order = [key(a) for a in pieces[0].args]
        if len(set(order)) != len(order):
            continue
        out = []
        for p in pieces:
            mine = {key(a): a for a in p.args}
            if len(mine) != len(p.args) or set(mine) != set(order):
                break
            out.append(tuple(mine[k] for k in order))
        else:
            return out
    return plain


def _rebuilt(term: Term, args: tuple[Term, ...]) -> Term:
    """`rebuild_elementwise`, but a product of operands of other element types than its own
    (an i1 mask times i32 values, an i32 product) keeps its element type: the builder would
    take the first operand's."""
    if term.op == "mul" and any(a.dtype != term.dtype for a in args):
        shape = args[0].shape
        return intern("mul", tuple(sorted(args, key=lambda t: t.serial)), (), shape,
                      term.dtype)
    return rebuild_elementwise(term, args)


def _aligned_parts(first: Term, other: Term) -> list[Term] | None:
    """`other`'s parts (a `lin` like `first`) paired with `first`'s: each part of `first`
    with the same term in `other` at the same coefficient, where it has it; then each other
    part in turn with an unpaired part of the same coefficient, one with the same op first,
    then with arguments of the same ops (`_arg_ops`), with the most factors alike
    (`_factor_keys`: a rotary embedding's halves by their tables), over the same arguments
    (a broadcast of one bias at another piece's rows), with the same attributes (the
    builders order parts by serial, so pieces computed alike can list them in different
    orders); None when some part has no partner.
    Any pairing with equal coefficients is exact (a sum of concatenations is the
    concatenation of the sums, column by column); this one is the pairing that can meet."""
    (_, mine), (_, theirs) = first.attrs, other.attrs
    free = list(range(len(other.args)))
    same = {(a.serial, c): j for j, (a, c) in enumerate(zip(other.args, theirs))}
    taken: set[int] = set()
    out: list[Term | None] = []
    for coef, part in zip(mine, first.args):
        j = same.get((part.serial, coef))
        if j is not None and j not in taken:
            taken.add(j)
            out.append(other.args[j])
        else:
            out.append(None)
    free = [j for j in free if j not in taken]
    for slot, (coef, part) in enumerate(zip(mine, first.args)):
        if out[slot] is not None:
            continue
        ranked = sorted((j for j in free if theirs[j] == coef), key=lambda j: (
            other.args[j] is not part, other.args[j].op != part.op,
            _arg_ops(other.args[j]) != _arg_ops(part),
            _moved_by(other.args[j]) != _moved_by(part),
            -len(_factor_keys(other.args[j]) & _factor_keys(part)),
            not _same_args(other.args[j], part), other.args[j].attrs != part.attrs, j))
        if not ranked:
            return None
        free.remove(ranked[0])
        out[slot] = other.args[ranked[0]]
    return out  # type: ignore[return-value]


def _arg_ops(term: Term) -> list[str]:
    """The ops of a term's arguments, sorted: what tells apart two products (of one
    coefficient in a sum) of different factors, such as `x * tanh(y) * z` and `x * z`."""
    return sorted(a.op for a in term.args)


_MOVED_BY = {"pad": lambda t: t.attrs, "transpose": lambda t: t.attrs, "reshape": lambda t: ()}
"""The movement ops `_moved_by` reads through, each with what of its attributes does not
depend on the sizes of the dims it moves (a pad's widths, a transpose's permutation)."""


def _moved_by(term: Term) -> tuple:
    """The chain of movement ops over `term`'s first operand down to the first other op, each
    with its size-free attributes (`_MOVED_BY`): what tells apart a rotary embedding's two
    halves in pieces of other head counts (`reshape(pad(h, high 2))` and `reshape(pad(h',
    low 2))`), whose ops and skeletons alike leave them tied."""
    chain = []
    while term.op in _MOVED_BY and term.args:
        chain.append((term.op, _MOVED_BY[term.op](term)))
        term = term.args[0]
    return tuple(chain)


def _factor_keys(term: Term) -> set:
    """A term's arguments, each broadcast one by what it broadcasts (its operand and dims):
    what pairs up products of like factors by the factors they share where the pieces'
    shapes differ (a rotary embedding's `q * cos + rot(q) * sin` on 32 heads and on 16
    broadcast one cosine table to both)."""
    return {(a.args[0].serial, a.attrs) if a.op == "broadcast" else a.serial
            for a in term.args}


def _same_args(a: Term, b: Term) -> bool:
    """Whether two terms are nodes over the same arguments."""
    return len(a.args) == len(b.args) and all(x is y for x, y in zip(a.args, b.args))


def _lift_dot(pieces: list[Term], dim: int) -> Term | None:
    """`dot_general(concat(l_i), r)` when every piece is `dot_general(l_i, r)` with one `r`
    and attributes, cut along a free dim of the lhs (`dim` of the result), and the same the
    other way round: exact, each row of a contraction's result reads only its own row of
    that operand. Only when the concatenated operand is no concatenation (so the form stays
    smaller)."""
    first = pieces[0]
    if first.op != "stablehlo.dot_general" or any(
            p.op != first.op or p.attrs != first.attrs or p.dtype != first.dtype
            for p in pieces):
        return None
    lb, rb, lc, rc = first.attrs
    lhs, rhs = first.args
    lf = [d for d in range(len(lhs.shape)) if d not in lb and d not in lc]
    rf = [d for d in range(len(rhs.shape)) if d not in rb and d not in rc]
    free = [(0, d) for d in lf] + [(1, d) for d in rf]
    if dim < len(lb):
        return None
    side, operand_dim = free[dim - len(lb)]
    other = 1 - side
    if any(p.args[other] is not first.args[other] for p in pieces):
        return None
    joined = make_concat([p.args[side] for p in pieces], operand_dim)
    if not _joined(joined, operand_dim):
        return None
    args = (joined, first.args[other]) if side == 0 else (first.args[other], joined)
    shape = list(first.shape)
    shape[dim] = sum(p.shape[dim] for p in pieces)
    return make_dot(args[0], args[1], first.attrs, tuple(shape), first.dtype)


def _joined(term: Term, dim: int) -> bool:
    """Whether what `make_concat` returned for a concatenation along `dim` met into something
    else (progress): no concatenation, or one along another dim (`_swap_blocks`)."""
    return term.op != "concatenate" or term.attrs != (dim,)


def _same(pieces: list[Term], dim: int) -> bool:
    """Every piece has one op, attributes and element type, and the same shape but along
    `dim`."""
    first = pieces[0]
    return all(p.op == first.op and p.attrs == first.attrs and p.dtype == first.dtype
               and len(p.args) == len(first.args)
               and all(n == m for d, (n, m) in enumerate(zip(p.shape, first.shape)) if d != dim)
               for p in pieces)


_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or")


def _lift_movement(pieces: list[Term], dim: int) -> Term | None:
    """A concatenation of one data-movement or contraction op applied piece by piece, as the
    op on the concatenated operands, when that concatenation meets (so the form shrinks).
    Each is exact, the result's rows along `dim` being the operand's rows along the dim it
    comes from:

    * `transpose(a_i, perm)` along dim: `transpose(concat(a_i along perm[dim]), perm)`;
    * `broadcast(x_i, dims)` along a dim the operand's dim i fills at full size:
      `broadcast(concat(x_i along i))`; along a dim no operand dim fills (or one of size 1),
      with one operand x: `broadcast(x)` at the joined shape; along a dim no operand dim
      fills, k rows in every piece, the broadcast of the operands given a unit dim and
      concatenated along it, that dim followed by the k created rows, the two merged by a
      reshape (the unsqueeze lift: one kv head a device, its GQA copies of k query heads
      broadcast without the head dim; k = 1 needs no reshape);
    * `dot_general(l_i, r_i)` along a batch dim: the dot of both operands concatenated along
      that batch dim; along a free dim of the lhs (rhs), with one rhs (lhs): the dot of the
      lhs (rhs) concatenated along that free dim (row-major result dims: batch, lhs free,
      rhs free);
    * a reduction (sum, max, min, and, or) over dims other than `dim`: the reduction of the
      operands concatenated along the operand dim that `dim` keeps;
    * a gather from one operand along a batch dim: `_lift_gather`;
    * `pad(x_i, v)` along a dim it does not pad (one padding value v): `pad(concat(x_i))`
      (the backward of a rotary embedding's halves, per tp shard of heads);
    * a reshape along the major dim of the dims it splits or merges: `_lift_reshape` (a
      reshape inserting the unit dim `dim` above a reduction first as the reduction keeping
      it, `_reduction_keeping_unit`).

    Pieces of one row along `dim` next to pieces of several are first written alike
    (`_units_alike`)."""
    sliced = _lift_slice(pieces, dim)
    if sliced is not None:
        return sliced
    if not _same(pieces, dim):
        alike = _units_alike(pieces, dim)
        if alike is None or not _same(alike, dim):
            return None
        pieces = alike
    first = pieces[0]
    shape = list(first.shape)
    shape[dim] = sum(p.shape[dim] for p in pieces)
    shape = tuple(shape)
    if first.op == "transpose":
        (perm,) = first.attrs
        inner = make_concat([p.args[0] for p in pieces], perm[dim])
        return make_transpose(inner, perm) if _joined(inner, perm[dim]) else None
    if first.op == "broadcast":
        (dims,) = first.attrs
        operands = [p.args[0] for p in pieces]
        if dim in dims and all(x.shape[dims.index(dim)] == p.shape[dim]
                               for x, p in zip(operands, pieces)):
            inner = make_concat(operands, dims.index(dim))
            return make_broadcast(inner, dims, shape) if _joined(inner, dims.index(dim)) \
                else None
        if all(x is operands[0] for x in operands):
            return make_broadcast(operands[0], dims, shape)
        rows = first.shape[dim]
        if dim not in dims and all(p.shape[dim] == rows for p in pieces):
            at = sum(1 for d in dims if d < dim)
            inner = make_concat([unsqueezed(x, at) for x in operands], at)
            if not _joined(inner, at):
                return None
            if rows == 1:
                return make_broadcast(inner, dims[:at] + (dim,) + dims[at:], shape)
            split = shape[:dim] + (len(pieces), rows) + shape[dim + 1:]
            moved = tuple(d + (d > dim) for d in dims)
            return make_reshape(make_broadcast(inner, moved[:at] + (dim,) + moved[at:],
                                               split), shape)
        return None
    if first.op == "stablehlo.dot_general":
        lb, rb, lc, rc = first.attrs
        lhs, rhs = [p.args[0] for p in pieces], [p.args[1] for p in pieces]
        lfree = [d for d in range(len(first.args[0].shape)) if d not in lb and d not in lc]
        rfree = [d for d in range(len(first.args[1].shape)) if d not in rb and d not in rc]
        if dim < len(lb):
            left, right = make_concat(lhs, lb[dim]), make_concat(rhs, rb[dim])
            if not (_joined(left, lb[dim]) or _joined(right, rb[dim])):
                return None
        elif dim < len(lb) + len(lfree):
            if any(r is not rhs[0] for r in rhs):
                return None
            left, right = make_concat(lhs, lfree[dim - len(lb)]), rhs[0]
            if not _joined(left, lfree[dim - len(lb)]):
                return None
        else:
            if any(x is not lhs[0] for x in lhs):
                return None
            left, right = lhs[0], make_concat(rhs, rfree[dim - len(lb) - len(lfree)])
            if not _joined(right, rfree[dim - len(lb) - len(lfree)]):
                return None
        return make_dot(left, right, first.attrs, shape, first.dtype)
    if first.op == "stablehlo.gather" and len(first.args) == 2:
        return _lift_gather(pieces, dim, shape)
    if first.op == "pad":
        low, high, interior = first.attrs
        if low[dim] or high[dim] or interior[dim] \
                or any(p.args[1] is not first.args[1] for p in pieces):
            return None
        inner = make_concat([p.args[0] for p in pieces], dim)
        if not _joined(inner, dim):
            return None
        return make_op("pad", (inner, first.args[1]), first.attrs, shape, first.dtype,
                       linear_in=0 if splat_value(first.args[1]) == 0 else None)
    if first.op == "reshape":
        for early in (False, True):
            reductions = [_reduction_keeping_unit(p, dim, early) for p in pieces]
            if all(r is not None for r in reductions) and _same(reductions, dim):
                lifted = _lift_movement(reductions, dim)
                if lifted is not None:
                    return lifted
        return _lift_reshape(pieces, dim, shape)
    if first.op in _REDUCTIONS and len(first.args) == 1:
        reduced = first.attrs[0]
        kept = [d for d in range(len(first.args[0].shape)) if d not in reduced]
        inner = make_concat([p.args[0] for p in pieces], kept[dim])
        if not _joined(inner, kept[dim]):
            return None
        return make_op(first.op, (inner,), first.attrs, shape, first.dtype,
                       linear_in=0 if first.op == "reduce_sum" else None)
    return None


def _lift_slice(pieces: list[Term], dim: int) -> Term | None:
    """`slice(concat(x_i along dim))` for a concatenation along `dim` of unit-stride slices
    `slice(x_i)` that each take their operand whole along `dim` and one window of the other
    dims, the same for every piece (exact: the concatenation's rows along `dim` are the
    operands' rows, each cut alike along the others; the rotary halves of a tp shard's
    heads, `k[..., :d/2]`, joined across the shards before their heads join). None when that
    concatenation does not meet."""
    first = pieces[0]
    if first.op != "slice" or any(p.op != "slice" for p in pieces):
        return None
    bases = [p.args[0] for p in pieces]
    rank = len(first.shape)
    starts, limits, _ = first.attrs
    for p, x in zip(pieces, bases):
        s, lim, st = p.attrs
        if any(v != 1 for v in st) or s[dim] != 0 or lim[dim] != x.shape[dim] \
                or len(x.shape) != rank or x.dtype != first.dtype \
                or any(x.shape[d] != bases[0].shape[d] or s[d] != starts[d]
                       or lim[d] != limits[d] for d in range(rank) if d != dim):
            return None
    inner = make_concat(bases, dim)
    if not _joined(inner, dim):
        return None
    window = (tuple(0 if d == dim else starts[d] for d in range(rank)),
              tuple(inner.shape[dim] if d == dim else limits[d] for d in range(rank)),
              (1,) * rank)
    return _slice(inner, *window)


def _units_alike(pieces: list[Term], dim: int) -> list[Term] | None:
    """The pieces with every piece of one row along `dim` written in the form of the first
    piece of several rows (the model), when they differ only by that unit dim: the builders
    leave unit dims out (a broadcast drops its operand's unit dims, a reshape adding one
    stays above a reduction), so one micro-batch's row and two joined rows of the same
    computation come in different forms. Exact, a unit dim being one index:

    * `broadcast(x, dims less dim)` of one row is `broadcast(x with a unit dim, dims)`;
    * `reshape(reduce(y, r'))` adding the unit dim is `reduce(y with a unit dim, r)`, where
      r' is the model's reduced dims `r` without the operand dim `dim` comes from.

    The forms built here are not normal (a broadcast of a unit dim): they serve only to lift
    the concatenation, whose result the builders make normal again. None when some piece
    cannot be written in the model's form."""
    model = next((p for p in pieces if p.shape[dim] != 1), None)
    if model is None:
        return None
    out = []
    for piece in pieces:
        if piece.op == model.op and piece.attrs == model.attrs:
            out.append(piece)
            continue
        if piece.shape[dim] != 1 or len(piece.shape) != len(model.shape):
            return None
        written = _unit_like(piece, model, dim)
        if written is None:
            return None
        out.append(written)
    return out


def _unit_like(piece: Term, model: Term, dim: int) -> Term | None:
    """`piece` (one row along `dim`) in the op and attributes of `model`, or None
    (`_units_alike`)."""
    if model.op == "broadcast" and piece.op == "broadcast":
        (dims,) = model.attrs
        if dim not in dims:
            return None
        at = dims.index(dim)
        if piece.attrs[0] != dims[:at] + dims[at + 1:]:
            return None
        x = piece.args[0]
        operand = make_reshape(x, x.shape[:at] + (1,) + x.shape[at:])
        return intern("broadcast", (operand,), model.attrs, piece.shape, piece.dtype)
    if model.op in _REDUCTIONS and len(model.args) == 1:
        written = _reduction_keeping_unit(piece, dim)
        if written is None or written.op != model.op or written.attrs != model.attrs:
            return None
        return written
    return None


def _reduction_keeping_unit(piece: Term, dim: int, early: bool = False) -> Term | None:
    """`reshape(reduce(y, r))` that only inserts a unit dim at `dim` as `reduce(y', r')`, y'
    being y with a unit dim before the operand dim the next result dim comes from (after the
    last one, for a unit dim at the end), r' the reduced dims renumbered (exact: the unit dim
    is one index; every result element reduces the same elements in the same order). The
    form the lifts of a concatenation build when they join rows of a reduction, which the
    builders otherwise leave a reshape above it. `early`: the unit dim right after the
    operand dim the previous result dim comes from instead, before the reduced dims between
    them (a GQA backward's sum over the k query heads of one kv head: kv heads before the
    copies, as the heads `kv * k + r` are laid out). None for any other piece."""
    if piece.op != "reshape" or len(piece.shape) < 1 or piece.shape[dim] != 1:
        return None
    inner = piece.args[0]
    if inner.op not in _REDUCTIONS or len(inner.args) != 1 \
            or inner.shape != piece.shape[:dim] + piece.shape[dim + 1:]:
        return None
    (y,), reduced = inner.args, inner.attrs[0]
    kept = [d for d in range(len(y.shape)) if d not in reduced]
    at = kept[dim] if dim < len(kept) else (kept[-1] + 1 if kept else 0)
    if early:
        at = kept[dim - 1] + 1 if dim > 0 else 0
    operand = make_reshape(y, y.shape[:at] + (1,) + y.shape[at:])
    renumbered = tuple(d + (d >= at) for d in reduced)
    return intern(inner.op, (operand,), (renumbered,) + inner.attrs[1:], piece.shape,
                  piece.dtype)


def _lift_reshape(pieces: list[Term], dim: int, shape: tuple[int, ...]) -> Term | None:
    """`reshape(concat(x_i along c))` for a concatenation of `reshape(x_i)` (operands of one
    shape) along `dim`, where `dim` and c are the major dims of one group of dims the reshape
    splits or merges (every dim of the group before them of size 1): exact, in row-major
    order each piece's elements of that group are one run on both sides, the runs in piece
    order. None when that concatenation does not meet."""
    operands = [p.args[0] for p in pieces]
    if any(x.shape != operands[0].shape for x in operands):
        return _uneven_reshapes_joined(pieces, operands, dim, shape)
    groups = reshape_groups(operands[0].shape, pieces[0].shape)
    if groups is None:
        return None
    rows = _rows_stacked(operands, groups, dim, shape)
    if rows is not None:
        return rows
    runs = _runs_joined(pieces, operands, groups, dim)
    if runs is not None:
        return make_concat(runs, dim)
    strided = _strided_rows(pieces, operands, groups, dim)
    if strided is not None:
        return strided
    for src, dst in groups:
        if dim not in dst:
            continue
        if not src or any(pieces[0].shape[t] != 1 for t in dst[:dst.index(dim)]):
            return None
        for c in src:
            inner = make_concat(operands, c)
            if _joined(inner, c):
                return make_reshape(inner, shape)
            if operands[0].shape[c] != 1:
                break
    return None


def _strided_rows(pieces: list[Term], operands: list[Term], groups, dim: int) -> Term | None:
    """Pieces `reshape(slice(T, box_j))` concatenated along the unit dim `dim` of the reshape,
    the boxes equal but along one dim c of T, where they take w elements at offset r of
    consecutive blocks of p (`s_j = s_0 + j * p`): the rows of one strided slice,
    `slice(reshape(U, S), dim: [j_0, j_0 + n), w's dim: [r, r + w))`, U the slice of T whole
    along c and S the pieces' shape with `dim` counting the blocks and w's dim holding p (one
    kv head a device at tp 8 reads its head's rotary half out of the projection's columns:
    the reference reads the same half of every head at once). Exact: each piece must be,
    as the normal form builds it, that candidate's row j along `dim`, and a concatenation of
    a term's rows is the term. None otherwise."""
    if any(x.op != "slice" or x.args[0] is not operands[0].args[0] for x in operands):
        return None
    starts, limits, strides = zip(*(x.attrs for x in operands))
    if any(st != strides[0] or any(k != 1 for k in st) for st in strides):
        return None
    varying = [c for c in range(len(starts[0])) if len({s[c] for s in starts}) > 1]
    if len(varying) != 1:
        return None
    (c,) = varying
    base = operands[0].args[0]
    width = limits[0][c] - starts[0][c]
    period = starts[1][c] - starts[0][c]
    if period <= width or base.shape[c] % period or any(
            s[c] != starts[0][c] + j * period or lim[c] - s[c] != width
            for j, (s, lim) in enumerate(zip(starts, limits))):
        return None
    group = next((dst for src, dst in groups if c in src), None)
    wide = [d for d in group or [] if pieces[0].shape[d] != 1]
    if group is None or dim not in group or wide != [wide[0]] or wide[0] < dim \
            or pieces[0].shape[wide[0]] != width:
        return None
    (w_dim,) = wide
    whole_box = [0 if d == c else s for d, s in enumerate(starts[0])]
    whole_limits = [base.shape[c] if d == c else n for d, n in enumerate(limits[0])]
    shape = [base.shape[c] // period if d == dim else period if d == w_dim else n
             for d, n in enumerate(pieces[0].shape)]
    first, offset = divmod(starts[0][c], period)
    if offset + width > period or first + len(pieces) > shape[dim]:
        return None
    whole = make_op("slice", (base,), (tuple(whole_box), tuple(whole_limits), strides[0]),
                    tuple(b - a for a, b in zip(whole_box, whole_limits)), base.dtype,
                    linear_in=0)
    read = slice_term(make_reshape(whole, tuple(shape)), w_dim, offset, offset + width)
    memo: dict[int, Term] = {}
    candidate = normal_form(slice_term(read, dim, first, first + len(pieces)), memo)
    if any(normal_form(slice_term(candidate, dim, j, j + 1), memo) is not p
           for j, p in enumerate(pieces)):
        return None
    return candidate


def _uneven_reshapes_joined(pieces: list[Term], operands: list[Term], dim: int,
                            shape: tuple[int, ...]) -> Term | None:
    """`reshape(concat(x_i along c), shape)` for pieces `reshape(x_i)` whose operands differ
    only along c, the major dim of the group of dims that makes `dim` (read off the widest
    piece: the dims of the group before c and before `dim` of size 1; each piece's rows of
    `dim` hold its rows of c times the group's dims after c): exact, in row-major order each
    piece's elements of that group are one run of `dim`'s rows on both sides, in piece
    order. Pieces of other sizes along the concatenation (one stage's two layers of heads
    joined already, the next stage's one layer; a micro-batch's two rows next to one). None
    when that concatenation does not meet."""
    if any(len(x.shape) != len(operands[0].shape) for x in operands):
        return None
    differ = [d for d in range(len(operands[0].shape))
              if len({x.shape[d] for x in operands}) > 1]
    if len(differ) != 1:
        return None
    (c,) = differ
    widest = max(range(len(pieces)), key=lambda i: operands[i].shape[c])
    first, model = operands[widest], pieces[widest]
    groups = reshape_groups(first.shape, model.shape)
    group = next(((src, dst) for src, dst in groups or () if dim in dst), None)
    if group is None or c not in group[0]:
        return None
    src, dst = group
    inside = math.prod(first.shape[d] for d in src[src.index(c) + 1:])
    rows = math.prod(model.shape[t] for t in dst[dst.index(dim) + 1:])
    if any(first.shape[d] != 1 for d in src[:src.index(c)]) \
            or any(model.shape[t] != 1 for t in dst[:dst.index(dim)]) \
            or any(p.shape[:dim] + p.shape[dim + 1:] != model.shape[:dim] + model.shape[dim + 1:]
                   or x.shape[c] * inside != p.shape[dim] * rows
                   for x, p in zip(operands, pieces)):
        return None
    inner = make_concat(operands, c)
    return make_reshape(inner, shape) if _joined(inner, c) else None


def _rows_stacked(operands: list[Term], groups, dim: int, shape: tuple[int, ...]
                  ) -> Term | None:
    """`reshape(concat(x_i along u), shape)` for pieces `reshape(x_i)` concatenated along
    `dim`, where `dim` is made of the operands' unit dim u followed by their dims of a row
    (the group of `dim`: u first, u of size 1), the reshape also merges other dims (a
    flattening of tokens and features for a contraction, not a squeeze alone), and every
    operand joins along u (`make_concat` meets them: the rows of one computation). Exact:
    u is the major dim of `dim`'s group, so each piece's elements are one run of `dim`'s
    rows, in piece order, on both sides. The rows of a batch a device holds one of, stacked
    as the reference's batch dim, before their runs join along the row's minor dim
    (`_runs_joined`), which would read each row's tokens as one longer sequence. None
    otherwise."""
    group = next((src for src, dst in groups if dst == [dim]), None)
    if group is None or len(group) < 2 or operands[0].shape[group[0]] != 1:
        return None
    if not any(sum(operands[0].shape[d] != 1 for d in src) > 1 for src, _ in groups):
        return None
    inner = make_concat(operands, group[0])
    return make_reshape(inner, shape) if _joined(inner, group[0]) else None


def _runs_joined(pieces: list[Term], operands: list[Term], groups, dim: int
                 ) -> list[Term] | None:
    """The pieces `reshape(x_i)` (concatenated along `dim`) with each run of consecutive
    ones whose operands join along the group's one dim of size above 1 (adjacent windows,
    or computations of adjacent windows that `make_concat` meets) joined into one reshape,
    where `dim` is the one dim the group makes (exact: the group's other dims are 1, so a
    run's rows in row-major order are the joined operand's rows; the row blocks of one
    micro-batch, before the micro-batches join). None when no run joins."""
    group = next((src for src, dst in groups if dst == [dim]), None)
    if group is None or len(group) < 2:
        return None
    shape = operands[0].shape
    minor = [d for d in group if shape[d] != 1]
    if len(minor) != 1:
        return None
    (c,) = minor
    out: list[Term] = []
    windows: list[Term] = []
    joined = False
    for x in operands:
        merged = make_concat([windows[-1], x], c) if windows else None
        if merged is not None and _joined(merged, c):
            windows[-1] = merged
            joined = True
        else:
            windows.append(x)
    if not joined:
        return None
    for w in windows:
        size = list(pieces[0].shape)
        size[dim] = math.prod(w.shape[d] for d in group)
        out.append(make_reshape(w, tuple(size)))
    return out


def _lift_gather(pieces: list[Term], dim: int, shape: tuple[int, ...]) -> Term | None:
    """`gather(x, concat(i_k))` for a concatenation of `gather(x, i_k)` (one operand x, one
    set of attributes, no batching dims) along a batch dim of the result (not an offset
    dim): exact, each result row along it reads only its own row of the indices, the
    indices' dim that batch dim comes from. None when that concatenation does not meet."""
    first = pieces[0]
    if any(p.args[0] is not first.args[0] for p in pieces):
        return None
    attrs = dict(first.attrs)
    if any(attrs.get(a) for a in ("operand_batching_dims", "start_indices_batching_dims",
                                  *_PROMISES)):
        return None
    offset = tuple(attrs.get("offset_dims", ()))
    if dim in offset:
        return None
    vector = attrs["index_vector_dim"]
    batch = [d for d in range(len(first.shape)) if d not in offset]
    rows = [d for d in range(len(first.args[1].shape)) if d != vector]
    if len(batch) != len(rows):
        return None
    indices = make_concat([p.args[1] for p in pieces], rows[batch.index(dim)])
    if not _joined(indices, rows[batch.index(dim)]):
        return None
    return make_op("stablehlo.gather", (first.args[0], indices), first.attrs, shape,
                   first.dtype, linear_in=0)


def slice_of_concat(term: Term, starts, limits, strides) -> Term | None:
    """A unit-stride slice of a concatenation that spans several of its pieces, as the
    concatenation of the pieces' slices; None when it is not one."""
    if term.op != "concatenate":
        return None
    (dim,) = term.attrs
    if any(s != 1 for s in strides):
        return None
    lo, hi = starts[dim], limits[dim]
    parts, offset = [], 0
    for piece in term.args:
        size = piece.shape[dim]
        a, b = max(lo, offset), min(hi, offset + size)
        if a < b:
            p_starts = tuple(a - offset if d == dim else s for d, s in enumerate(starts))
            p_limits = tuple(b - offset if d == dim else s for d, s in enumerate(limits))
            shape = tuple(q - p for p, q in zip(p_starts, p_limits))
            parts.append(make_op("slice", (piece,), (p_starts, p_limits, tuple(strides)),
                                 shape, piece.dtype, linear_in=0))
        offset += size
    return make_concat(parts, dim) if len(parts) > 1 else None


def slice_of_reduction(arg: Term, starts, limits, strides) -> Term | None:
    """A slice of a reduction (sum, max, min, and, or) as the reduction of the operand's
    window: the kept dims sliced alike, the reduced dims whole (exact: each result element
    reduces only its own row). None for anything else."""
    if arg.op not in _REDUCTIONS or len(arg.args) != 1:
        return None
    (operand,), reduced = arg.args, arg.attrs[0]
    kept = [d for d in range(len(operand.shape)) if d not in reduced]
    o_starts, o_limits = [0] * len(operand.shape), list(operand.shape)
    o_strides = [1] * len(operand.shape)
    for k, d in enumerate(kept):
        o_starts[d], o_limits[d], o_strides[d] = starts[k], limits[k], strides[k]
    shape = tuple(len(range(lo, hi, st)) for lo, hi, st in zip(o_starts, o_limits, o_strides))
    window = make_op("slice", (operand,), (tuple(o_starts), tuple(o_limits),
                                          tuple(o_strides)), shape, operand.dtype, linear_in=0)
    result = tuple(len(range(lo, hi, st)) for lo, hi, st in zip(starts, limits, strides))
    return make_op(arg.op, (window,), arg.attrs, result, arg.dtype,
                   linear_in=0 if arg.op == "reduce_sum" else None)


def _reduced_with_dropped(term: Term, arg: Term) -> tuple[int, ...] | None:
    """The dims `arg = reduce(x, dims)` reduces plus the unit dims of its result that
    `term = reshape(arg)` drops, when the reshape does nothing else; else None."""
    if term.op != "reshape" or arg.op not in _REDUCTIONS or len(arg.args) != 1:
        return None
    (operand,), reduced = arg.args, arg.attrs[0]
    kept = [d for d in range(len(operand.shape)) if d not in reduced]
    dropped, j = [], 0
    for k, n in enumerate(arg.shape):
        if j < len(term.shape) and term.shape[j] == n:
            j += 1
        elif n == 1:
            dropped.append(kept[k])
        else:
            return None
    if j != len(term.shape) or not dropped:
        return None
    return tuple(sorted((*reduced, *dropped)))


def _sum_view(term: Term) -> Term:
    """`term` as a sum over more dims where it is `reshape(reduce_sum(x))` dropping unit dims
    of the sum (the builders' form of a sum over every dim of a block with one row): only a
    view for `_join_groups`, which builds its result with the builders again."""
    dims = _reduced_with_dropped(term, term.args[0]) if term.args else None
    if dims is None or term.args[0].op != "reduce_sum":
        return term
    return intern("reduce_sum", term.args[0].args, (dims,), term.shape, term.dtype)


def slice_of_reshape(arg: Term, starts, limits, strides) -> Term | None:
    """A unit-stride slice of `arg = reshape(x)` as the reshape of a slice of x: where in
    each group of dims the reshape splits or merges (`reshape_groups`), the slice takes one
    contiguous run of the group's row-major order that is a box of x's dims (single indices
    on the major ones, a range on one, the minor ones whole), the same elements in the same
    order; else None."""
    if arg.op != "reshape" or any(s != 1 for s in strides):
        return None
    x = arg.args[0]
    groups = reshape_groups(x.shape, arg.shape)
    if groups is None:
        return None
    x_starts, x_limits = [0] * len(x.shape), list(x.shape)
    for src, dst in groups:
        run = _flat_run([(starts[t], limits[t], arg.shape[t]) for t in dst])
        box = None if run is None else _box([x.shape[i] for i in src], *run)
        if box is None:
            return None
        for i, (lo, hi) in zip(src, box):
            x_starts[i], x_limits[i] = lo, hi
    shape = tuple(hi - lo for lo, hi in zip(x_starts, x_limits))
    window = (tuple(x_starts), tuple(x_limits), (1,) * len(shape))
    piece = slice_through(x, *window)  # a reduction's rows: the reduction of its rows
    if piece is None:
        piece = make_op("slice", (x,), window, shape, x.dtype, linear_in=0)
    out = tuple(hi - lo for lo, hi in zip(starts, limits))
    squeezed = squeeze(piece, out)
    return squeezed if squeezed is not None else make_reshape(piece, out)


def _flat_run(dims: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """The row-major positions [a, b) a box (lo, hi, size per dim) covers, when they are one
    contiguous run (single indices before one dim, whole dims after it); else None."""
    ranged = [k for k, (lo, hi, n) in enumerate(dims) if (lo, hi) != (0, n)]
    last = ranged[-1] if ranged else -1
    if any(hi - lo != 1 for lo, hi, _ in dims[:max(last, 0)]):
        return None
    a, stride = 0, 1
    for k in range(len(dims) - 1, -1, -1):
        lo, hi, n = dims[k]
        if k == last:
            span = (hi - lo) * stride
        a += lo * stride
        stride *= n
    return (a, a + span) if last >= 0 else (0, stride)


def _box(sizes: list[int], a: int, b: int) -> list[tuple[int, int]] | None:
    """The box of dims of `sizes` whose row-major positions are exactly [a, b): single
    indices on the dims before some dim k, a range on k, the dims after k whole; else
    None."""
    if not sizes:
        return [] if (a, b) == (0, 1) else None
    for k in range(len(sizes) - 1, -1, -1):
        stride = math.prod(sizes[k + 1:])
        if a % stride or b % stride:
            continue
        lo, hi = a // stride, b // stride
        if lo // sizes[k] != (hi - 1) // sizes[k]:
            continue
        prefix, fixed = lo // sizes[k], []
        for n in reversed(sizes[:k]):
            fixed.append((prefix % n, prefix % n + 1))
            prefix //= n
        if prefix:
            return None
        inner = lo % sizes[k]
        return (fixed[::-1] + [(inner, inner + hi - lo)]
                + [(0, n) for n in sizes[k + 1:]])
    return None


def _contraction_key(term: Term):
    """What a sum or contraction is, but for the windows of its operands: (kind, attrs,
    shape, dtype), or None."""
    if term.op in ("stablehlo.dot_general", "reduce_sum"):
        return term.op, term.attrs, term.shape, term.dtype
    return None


def _summed_dims(term: Term) -> list[tuple[int, int | None]]:
    """(lhs dim, rhs dim) pairs a contraction or sum runs over (rhs None for a sum)."""
    if term.op == "reduce_sum":
        return [(d, None) for d in term.attrs[0]]
    _, _, lc, rc = term.attrs
    return list(zip(lc, rc))


def _join_pair(a: Term, b: Term) -> Term | None:
    """One contraction (sum) for `a + b` when they are the same contraction (sum) whose
    operands are adjacent windows along one contracted (summed) dim, in the same order on
    both sides of a contraction (row i of the lhs meets row i of the rhs), else None."""
    if a.op == "transpose" and b.op == "transpose" and a.attrs == b.attrs:
        inner = _join_pair(a.args[0], b.args[0])
        return None if inner is None else make_transpose(inner, a.attrs[0])
    key = _contraction_key(a)
    if key is None or key != _contraction_key(b):
        return None
    for pair in _summed_dims(a):
        dims = [(k, d) for k, d in enumerate(pair) if d is not None]
        if any(a.args[k] is b.args[k] for k, _ in dims):
            continue
        forward = [_joins(a.args[k], b.args[k], d) for k, d in dims]
        backward = [_joins(b.args[k], a.args[k], d) for k, d in dims]
        for joined in (forward, backward):
            if all(j is not None for j in joined):
                args = tuple(joined) + tuple(a.args[len(joined):])
                if a.op == "reduce_sum":
                    return make_op("reduce_sum", args, a.attrs, a.shape, a.dtype,
                                   linear_in=0)
                return make_dot(args[0], args[1], a.attrs, a.shape, a.dtype)
    return None


def join_sums(term: Term) -> Term:
    """A `lin` whose parts with equal coefficients are one contraction (sum) over adjacent
    windows, with those parts joined (repeatedly, until no pair joins)."""
    if term.op != "lin":
        return term
    pairs, constant = linear_parts(term)
    while True:
        found = _first_joinable(pairs)
        if found is None:
            break
        i, j, joined = found
        ki = pairs[i][0]
        pairs = [p for k, p in enumerate(pairs) if k not in (i, j)]
        parts, offset = linear_parts(joined)
        if joined.op == "lin" and offset == 0:
            pairs.extend((ki * k, t) for k, t in parts)  # a factor pulled out
        else:
            pairs.append((ki, joined))
    pairs = _join_groups(pairs)
    if len(pairs) == len(term.args):
        return term
    return make_lin(pairs, constant, term.shape, term.dtype)


def _first_joinable(pairs: list) -> tuple[int, int, Term] | None:
    """(i, j, joined) for the first parts i < j of `pairs` (in that order) that `_join_pair`
    joins with one coefficient, or None. Only candidates are tried: parts keyed alike
    (`_join_keys`) whose first summed operands are adjacent windows of one term, which every
    join needs; a residual stream of hundreds of parts would otherwise try every pair."""
    keys = [_join_keys(k, t) for k, t in pairs]
    starts: dict[tuple, list[int]] = {}
    stops: dict[tuple, list[int]] = {}
    for j, found in enumerate(keys):
        for key, start, stop in found:
            starts.setdefault((key, start), []).append(j)
            stops.setdefault((key, stop), []).append(j)
    for i, found in enumerate(keys):
        candidates = sorted({j for key, start, stop in found
                             for j in (*starts.get((key, stop), ()),
                                       *stops.get((key, start), ())) if j > i})
        for j in candidates:
            joined = _join_pair(pairs[i][1], pairs[j][1])
            if joined is not None:
                return i, j, joined
    return None


def _join_keys(coefficient, term: Term) -> list[tuple[tuple, int, int]]:
    """(key, start, stop) of `term`'s first summed operand's window along each summed dim:
    key holds the coefficient, the transposes around the contraction, the contraction's
    kind (`_contraction_key`), the summed dims, the window's base and its other dims' bounds.
    Two parts `_join_pair` joins share a key, one's stop being the other's start."""
    perms = []
    while term.op == "transpose":
        perms.append(term.attrs[0])
        term = term.args[0]
    kind = _contraction_key(term)
    if kind is None:
        return []
    found = []
    for pair in _summed_dims(term):
        k, d = next((k, d) for k, d in enumerate(pair) if d is not None)
        window = _window(term.args[k], d)
        if window is None:
            continue
        base, start, stop, rest = window
        found.append(((coefficient, tuple(perms), kind, pair, base.serial, rest), start, stop))
    return found


def _peel(term: Term) -> tuple[tuple, Term]:
    """(the transposes, reshapes and zero pads around `term`, outermost first, as
    ("transpose", perm), ("reshape", shape) or ("pad", (attrs, shape, zero)); the term under
    them), where a sum dropping unit dims through a reshape is read as a sum over them
    (`_sum_view`) rather than peeled. Exact for a sum of parts wrapped alike: a transpose,
    reshape or zero pad of a sum is the sum of the parts' (a stage's rows of stacked
    layers' gradients)."""
    wrappers = []
    while term.op in ("transpose", "reshape") or term.op == "pad" and splat_value(
            term.args[1]) == 0:
        if term.op == "reshape":
            view = _sum_view(term)
            if view is not term:
                return tuple(wrappers), view
            wrappers.append(("reshape", term.shape))
        elif term.op == "pad":
            wrappers.append(("pad", (term.attrs, term.shape, term.args[1])))
        else:
            wrappers.append(("transpose", term.attrs[0]))
        term = term.args[0]
    return tuple(wrappers), term


def _wrap(core: Term, wrappers: tuple) -> Term:
    """`core` under `wrappers` (`_peel`'s), innermost first."""
    for kind, attr in reversed(wrappers):
        if kind == "transpose":
            core = make_transpose(core, attr)
        elif kind == "pad":
            attrs, shape, zero = attr
            core = make_op("pad", (core, zero), attrs, shape, core.dtype, linear_in=0)
        else:
            core = make_reshape(core, attr)
    return core


def _join_groups(pairs: list) -> list:
    """`pairs` with every group of two or more parts of one coefficient that are one
    contraction (sum), under the same transposes and reshapes, over operands that are not
    adjacent windows (`_join_pair` takes those) joined into one: `sum_i dot(l_i, r_i)`
    contracting (lhs dim a, rhs dim b) is `dot(concat_i l_i along a, concat_i r_i along b)`,
    and `sum_i reduce_sum(x_i)` over a dim d is the reduce_sum of `concat_i x_i along d`
    (exact for any order the pieces are taken in, the same on both operands: a regrouping of
    the sum, which the semantics policy allows; integer sums wrap alike in any order). The
    order is the one in which some operand's pieces meet (`_orders`); a group whose
    concatenations meet in no order stays as it is."""
    groups: dict[tuple, list[int]] = {}
    for i, (k, t) in enumerate(pairs):
        perms, core = _peel(t)
        key = _contraction_key(core) or _scatter_key(core)
        if key is not None:
            groups.setdefault((k, perms, key), []).append(i)
    done: set[int] = set()
    joined = []
    for (k, perms, _), members in groups.items():
        if len(members) < 2 or len(members) > MAX_JOINED:
            continue
        cores = [_peel(pairs[i][1])[1] for i in members]
        core = _join_group(cores)
        parts = [(members, core)] if core is not None else [
            ([members[i] for i in sub], _join_group([cores[i] for i in sub]))
            for sub in _subgroups(cores)]
        for part, core in parts:
            if core is None:
                continue
            done.update(part)
            joined.append((k, _wrap(core, perms)))
    if not joined:
        return pairs
    return [p for i, p in enumerate(pairs) if i not in done] + joined


MAX_JOINED = 4096
"""The most parts of a sum `_join_groups` joins into one contraction: a stack's residual
stream at tp 8 sums layers x 8 of them (80 layers: 640), and the reference's stream joins
its layers' alike, so a smaller cap would leave one side joined and the other not."""


def _subgroups(cores: list[Term]) -> list[list[int]]:
    """The positions of `cores` (one contraction or sum, which do not join all together)
    split by the argument an operand's piece moves (slices, reshapes), for the first summed
    operand whose pieces are so split into several groups (two of them at least twice),
    else likewise by the term the first slice under an operand's piece is a window of:
    the parts of a tp-partial residual stream, `attn_0 @ wo[:k] + attn_1 @ wo[k:] + h_0 @
    w_down[:f] + h_1 @ w_down[f:]`, are two sums (one per weight) that each join, not one.
    A weight comes first, whichever operand it is: split by the first slice under a computed
    lhs, the stream of a pipeline's several micro-batches (stages) splits by micro-batch
    (stage) instead, which the reference's whole-batch stream never does, and the two
    forms do not meet (gap 2 of benchmarks/FRONTIER_RESULTS.md: 4 layers, 2 micro-batches).
    Each subgroup is joined on its own (any grouping of a sum is a regrouping); [] when
    there is no such split."""
    for keyed in (_moved_argument, _first_slice_base):
        for pair in _summed_dims(cores[0]):
            for k, d in enumerate(pair):
                if d is None:
                    continue
                keys = [keyed(c.args[k], d) for c in cores]
                if any(key is None for key in keys):
                    continue
                split: dict[int, list[int]] = {}
                for i, key in enumerate(keys):
                    split.setdefault(key, []).append(i)
                if len(split) > 1 and any(len(sub) > 1 for sub in split.values()):
                    return [sub for sub in split.values() if len(sub) > 1]
    return []


def _moved_argument(term: Term, dim: int) -> int | None:
    """The serial of the argument `term` is a slice, reshape, broadcast or transpose of
    (through any chain of them), or None."""
    base = _moved_base(term)
    return base.serial if base.op == "arg" else None


def _moved_argument_index(term: Term) -> int | None:
    """The index of the argument `term` is a slice, reshape, broadcast or transpose of, or
    None: one number for one input on both sides of a comparison."""
    base = _moved_base(term)
    return base.attrs[0] if base.op == "arg" else None


def _moved_input(term: Term) -> tuple:
    """What `term` moves: ("arg", index) for an argument, else (op, None) for the op under
    its chain of slices, reshapes, broadcasts and transposes (`_moved_base`)."""
    base = _moved_base(term)
    return ("arg", base.attrs[0]) if base.op == "arg" else (base.op, None)


def _moved_base(term: Term) -> Term:
    """The term under `term`'s chain of slices, reshapes, broadcasts and transposes."""
    while term.op in _MOVES and term.args:
        term = term.args[0]
    return term


def _first_slice_base(term: Term, dim: int) -> int | None:
    """The serial of the term the first slice under `term` cuts, or None."""
    start = _first_slice_start(term, dim)
    return None if start is None else start[0]


def _scatter_key(term: Term):
    """What a scatter-add into zeros is, but for its indices and updates (attributes, shape,
    dtype), or None for any other term."""
    if term.op != "stablehlo.scatter" or len(term.args) != 3:
        return None
    attrs = dict(term.attrs)
    if attrs.get("reducer") != "add" or splat_value(term.args[0]) != 0 or any(
            attrs.get(a) for a in ("input_batching_dims", "scatter_indices_batching_dims",
                                   *_PROMISES)):
        return None
    return term.op, term.attrs, term.shape, term.dtype


_PROMISES = ("unique_indices", "indices_are_sorted")
"""Attributes promising something of the indices that joined indices need not keep (where
broken, the op's result is implementation-defined): no join is made under them."""


def _join_scatters(cores: list[Term]) -> Term | None:
    """`scatter_add(0, concat I_i, concat U_i)` for `sum_i scatter_add(0, I_i, U_i)` (one
    set of attributes), the indices and updates concatenated along one scatter dim (an
    update dim that is no window dim, and the indices dim it comes from): exact, each update
    window lands where its index says whichever piece holds it, and colliding windows are
    summed either way (a regrouping of the sum). The order is the one in which the pieces'
    first distinct slices stand (`_distinct_slice_starts`); None when no concatenation
    meets."""
    first = cores[0]
    attrs = dict(first.attrs)
    window = tuple(attrs["update_window_dims"])
    vector = attrs["index_vector_dim"]
    updates, indices = first.args[2], first.args[1]
    scatter = [d for d in range(len(updates.shape)) if d not in window]
    rows = [d for d in range(len(indices.shape)) if d != vector]
    if len(scatter) != len(rows):
        return None
    starts = _distinct_slice_starts([c.args[1] for c in cores]) or _distinct_slice_starts(
        [c.args[2] for c in cores])
    if starts is None:
        return None
    ordered = [cores[i] for i in sorted(range(len(cores)), key=lambda i: starts[i])]
    for u, r in zip(scatter, rows):
        if any(c.args[2].shape[d] != updates.shape[d] for c in cores
               for d in range(len(updates.shape)) if d != u) or any(
                c.args[1].shape[d] != indices.shape[d] for c in cores
                for d in range(len(indices.shape)) if d != r):
            continue
        joined_indices = make_concat([c.args[1] for c in ordered], r)
        joined_updates = make_concat([c.args[2] for c in ordered], u)
        if _joined(joined_indices, r) or _joined(joined_updates, u):
            return make_op(first.op, (first.args[0], joined_indices, joined_updates),
                           first.attrs, first.shape, first.dtype, linear_in=2)
    return None


def _join_group(cores: list[Term]) -> Term | None:
    """One contraction (sum) for the sum of `cores` (see `_join_groups`), or None."""
    first = cores[0]
    if first.op == "stablehlo.scatter":
        return _join_scatters(cores)
    for pair in _summed_dims(first):
        dims = [(k, d) for k, d in enumerate(pair) if d is not None]
        for order in _orders(cores, dims):
            ordered = [cores[i] for i in order]
            args = [make_concat([c.args[k] for c in ordered], d) for k, d in dims]
            if not any(_joined(a, d) for a, (_, d) in zip(args, dims)):
                continue
            if first.op == "reduce_sum":
                return make_op("reduce_sum", tuple(args), first.attrs, first.shape,
                               first.dtype, linear_in=0)
            return make_dot(args[0], args[1], first.attrs, first.shape, first.dtype)
    return None


def _orders(cores: list[Term], dims: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Orders to try the pieces of a sum in (any order is exact; these are the ones in which a
    concatenation can meet): by the argument each piece's operand moves, where each moves
    another (`q @ wq + k @ wk` over concatenated weights: one order on both sides, whichever
    order the pieces came in); by the start of each operand piece's window along its summed
    dim, where the pieces are windows of one term; then by the first slice found under each
    operand piece (the same position in pieces computed alike), where those are windows of
    one term at distinct starts."""
    found: list[tuple[int, ...]] = []
    for k, _ in dims:
        weights = [_moved_argument_index(c.args[k]) for c in cores]
        if None not in weights and len(set(weights)) == len(weights):
            found.append(tuple(sorted(range(len(cores)), key=lambda i: weights[i])))
    for keyed in (_window_start, _first_slice_start):
        for k, d in dims:
            keys = [keyed(c.args[k], d) for c in cores]
            if any(key is None for key in keys) or len({key[0] for key in keys}) != 1 \
                    or len({key[1] for key in keys}) != len(keys):
                continue
            order = tuple(sorted(range(len(cores)), key=lambda i: keys[i][1]))
            if order not in found:
                found.append(order)
    for k, _ in dims:
        for starts in (_distinct_slice_starts([c.args[k] for c in cores]),
                       _unique_window_starts([c.args[k] for c in cores])):
            if starts is not None:
                order = tuple(sorted(range(len(cores)), key=lambda i: starts[i]))
                if order not in found:
                    found.append(order)
    return found


def _unique_window_starts(terms: list[Term]) -> list[tuple] | None:
    """The starts of the one window of some term that each of `terms` slices exactly once,
    at a distinct start in each (the micro-batch each of several like computations reads,
    wherever it stands among their subterms); None when no term is so sliced."""
    windows: list[dict[int, set]] = []
    for term in terms:
        mine: dict[int, set] = {}
        for t in first_slices(term, FIRST_SLICES_SEEN):
            mine.setdefault(t.args[0].serial, set()).add(t.attrs[0])
        windows.append(mine)
    common = set(windows[0]).intersection(*windows[1:])
    for base in sorted(common):
        if all(len(w[base]) == 1 for w in windows):
            starts = [next(iter(w[base])) for w in windows]
            if len(set(starts)) == len(starts):
                return starts
    return None


MAX_SLICES_SEEN = 4096
"""How many slices under each piece `_distinct_slice_starts` compares: the micro-batch a
loss piece reads comes after its stage's weights' slices, two or more a layer (32 layers
passed 64)."""
FIRST_SLICES_SEEN = 64
"""How many it compares first (most pieces differ early; the longer walk only where none of
these did)."""
_FIRST_SLICES: dict[tuple[int, int], tuple[Term, ...]] = {}
"""`first_slices` by (the term's serial, the count) (terms are interned and immutable)."""


def first_slices(term: Term, count: int = MAX_SLICES_SEEN) -> tuple[Term, ...]:
    """The first `count` slices under `term` in `subterms` order, memoized: joining a long
    sum asks for the same pieces' slices once per pair (a walk of the whole piece each time
    when it holds fewer slices than that)."""
    key = (term.serial, count)
    found = _FIRST_SLICES.get(key)
    if found is None:
        found = _FIRST_SLICES[key] = tuple(itertools.islice(
            (u for u in subterms([term]) if u.op == "slice"), count))
    return found


def _distinct_slice_starts(terms: list[Term]) -> list[tuple] | None:
    """The starts of the first slice, in `subterms` order, that is a window of one term at a
    distinct start in every one of `terms` (pieces computed alike from different rows: a
    slice of a weight every piece shares comes first, and is passed over); else None.
    The first `FIRST_SLICES_SEEN` slices of each are compared first, then up to
    `MAX_SLICES_SEEN` where some piece holds more."""
    for count in (FIRST_SLICES_SEEN, MAX_SLICES_SEEN):
        lists = [first_slices(term, count) for term in terms]
        for column in zip(*lists):
            if len({t.args[0].serial for t in column}) != 1:
                continue
            starts = [t.attrs[0] for t in column]
            if len(set(starts)) == len(starts):
                return starts
        if all(len(found) < count for found in lists):
            return None
    return None


def _window_start(term: Term, dim: int) -> tuple | None:
    """(base serial and the other dims' windows, start along `dim`) of a unit-stride window."""
    window = _window(term, dim)
    if window is None or term.op != "slice":
        return None
    base, start, _, rest = window
    return (base.serial, rest), start


_FIRST_SLICE: dict[int, tuple | None] = {}
"""serial -> `_first_slice_start` (by term, whatever the dim)."""


def _first_slice_start(term: Term, dim: int) -> tuple | None:
    """(base serial, starts) of the first slice among `term`'s subterms (depth first, in
    `subterms` order), or None."""
    if term.serial not in _FIRST_SLICE:
        first = next((t for t in subterms([term]) if t.op == "slice"), None)
        _FIRST_SLICE[term.serial] = None if first is None else (
            first.args[0].serial, first.attrs[0])
    return _FIRST_SLICE[term.serial]


def normal_form(term: Term, memo: dict[int, Term] | None = None) -> Term:
    """`term` rebuilt bottom-up through the builders and this module's identities; again
    (at most MAX_PASSES times) where a rewrite built new terms the builders left outside the
    normal form (a slice the builders pushed under a reshape)."""
    memo = {} if memo is None else memo
    result = _normal_pass(term, memo, chains=False)
    for count in range(1, MAX_PASSES):
        again = _normal_pass(result, memo, chains=count >= PASSES_BEFORE_CHAINS)
        if again is result:
            break
        memo[term.serial] = result = again
    return result


MAX_PASSES = 12
PASSES_BEFORE_CHAINS = 4
"""Passes made before a pass reads each operand at the end of its memo chain (`_latest`):
a term still moving after that many is a deep stack, which the chains normalize in a few
passes more; before it each pass reads its operands' results of the last pass only (the
forms two programs' pieces meet in, which an earlier chain end recorded for the other
program's terms can move apart)."""
"""How many bottom-up passes `normal_form` makes at most (each identity is exact, so
stopping early only leaves two forms unmet)."""


def _normal_pass(term: Term, memo: dict[int, Term], chains: bool) -> Term:
    read = _latest if chains else (lambda a, memo: memo[a.serial])
    for top in post_order(term, memo):
        args = tuple(read(a, memo) for a in top.args)
        memo[top.serial] = _normal_node(top, args, memo)
    return read(term, memo)


MAX_CHAIN = 64
"""How many memo entries `_latest` follows from one term."""


def _latest(term: Term, memo: dict[int, Term]) -> Term:
    """The last term of `term`'s chain in `memo` (`term` -> its pass's result -> that
    result's next pass's -> ...), at most MAX_CHAIN steps: a pass records a node's result
    of that pass only, so a node the builders make again later (a layer's residual stream,
    rebuilt while the layers above it are joined) would otherwise move one step a pass, and
    a stack of L layers would take L passes. Each step is an exact identity, so any point
    of the chain is the same value."""
    out = memo[term.serial]
    for _ in range(MAX_CHAIN):
        following = memo.get(out.serial)
        if following is None or following is out:
            break
        out = following
    if out is not memo[term.serial]:
        memo[term.serial] = out
    return out


MAX_BLOCKS = 64
"""The most blocks a sum over a split dim is written out as (`sum_of_blocks`)."""


def sum_of_blocks(term: Term, arg: Term) -> Term | None:
    """`reduce_sum(reshape(x, (..., a, b, ...)), the a dim)` with x's dim of size a * b
    split into (a, b) row-major: the sum of x's a consecutive blocks of b rows (the form a
    psum of a tiled value takes), for a <= MAX_BLOCKS; else None."""
    if term.op != "reduce_sum" or arg.op != "reshape" or len(term.attrs[0]) != 1:
        return None
    x, (d,) = arg.args[0], term.attrs[0]
    src, dst = x.shape, arg.shape
    if len(dst) != len(src) + 1 or d >= len(src) or x.dtype != term.dtype:
        return None
    a, b = dst[d], dst[d + 1]
    if dst[:d] != src[:d] or dst[d + 2:] != src[d + 1:] or a * b != src[d] or a > MAX_BLOCKS:
        return None
    blocks = [(Fraction(1), slice_term(x, d, k * b, (k + 1) * b)) for k in range(a)]
    return make_lin(blocks, Fraction(0), term.shape, term.dtype)


def reshape_of_concat(term: Term, arg: Term) -> Term | None:
    """`reshape(concat(p_i along c))` where c is the major (first non-unit) dim of the dims
    the reshape regroups it with: the concatenation of the pieces reshaped, along the major
    non-unit dim t of the group the reshape makes (row-major order keeps each piece's
    elements of the group one run, and a run whose bounds are multiples of what t's
    rows hold, the product of the group's dims after t, is whole rows of t: the merge of
    an untiled all_gather, the split of four copies of a (8, 2) table into (4, 8, 2));
    else None."""
    if term.op != "reshape" or arg.op != "concatenate":
        return None
    (c,) = arg.attrs
    groups = reshape_groups(arg.shape, term.shape)
    if groups is None:
        return None
    for src_dims, dst_dims in groups:
        if c not in src_dims:
            continue
        at = src_dims.index(c)
        wide = [t for t in dst_dims if term.shape[t] != 1]
        if any(arg.shape[i] != 1 for i in src_dims[:at]) or not wide:
            return None
        t = wide[0]
        inner = math.prod(arg.shape[i] for i in src_dims[at + 1:])
        row = math.prod(term.shape[d] for d in dst_dims[dst_dims.index(t) + 1:])
        pieces = []
        for piece in arg.args:
            if any(piece.shape[i] != arg.shape[i] for i in range(len(arg.shape)) if i != c):
                return None
            size = piece.shape[c] * inner
            if size % row:
                return None
            shape = list(term.shape)
            shape[t] = size // row
            pieces.append(make_reshape(piece, tuple(shape)))
        return make_concat(pieces, t)
    return None


def unsqueezed(term: Term, at: int) -> Term:
    """`term` given a unit dim at `at` (a reshape), a concatenation's pieces each given it
    (`reshape_of_concat`), so that pieces computed without a dim meet along it."""
    out = make_reshape(term, term.shape[:at] + (1,) + term.shape[at:])
    if out.op == "reshape" and term.op == "concatenate":
        pieces = reshape_of_concat(out, term)
        if pieces is not None:
            return pieces
    return out


def transpose_of_concat(concat: Term, perm: tuple[int, ...]) -> Term:
    """`transpose(concat(p_i along d), perm)` as the concatenation of the transposed pieces
    along the result dim d moves to (exact: a transpose only renames dims), so that a reshape
    or another concatenation above meets the pieces (an all_to_all's reassembled blocks)."""
    (dim,) = concat.attrs
    return make_concat([make_transpose(p, perm) for p in concat.args], perm.index(dim))


MAX_SCATTER_WINDOWS = 64
"""The most update windows a scatter at constant indices is written out as."""


def _constant_indices(indices: Term) -> Callable[[tuple[int, ...]], int] | None:
    """The values of a scatter's index tensor when they are known (a splat, or an integer
    table whose values the builders kept), as a function of the position; else None."""
    value = splat_value(indices)
    if isinstance(value, Fraction) and value.denominator == 1:
        return lambda _: int(value)
    if indices.op != "dense" or indices.attrs[0] not in DENSE_VALUES or \
            not indices.dtype.startswith(("i", "ui")) or indices.dtype == "i1":
        return None
    flat = list(getattr(DENSE_VALUES[indices.attrs[0]], "flat", ()))
    if len(flat) != math.prod(indices.shape):
        return None
    strides = [math.prod(indices.shape[d + 1:]) for d in range(len(indices.shape))]
    return lambda at: int(flat[sum(i * s for i, s in zip(at, strides))])


def _constant_windows(term: Term, args: tuple[Term, ...]
                      ) -> list[tuple[tuple[int, ...], Term]] | None:
    """The update windows of `scatter(operand, I, U)` with the indices I known and no
    batching dims: per scatter position of U (in row-major order), the start in the operand
    and that position's window of U reshaped to the operand's rank. None when it is not such
    a scatter, a window does not fit inside the operand (the op's out-of-bounds behaviour is
    implementation-defined) or there are more than MAX_SCATTER_WINDOWS windows."""
    if term.op != "stablehlo.scatter" or len(args) != 3:
        return None
    attrs = dict(term.attrs)
    operand, indices, updates = args
    if attrs.get("input_batching_dims") or attrs.get("scatter_indices_batching_dims"):
        return None
    values = _constant_indices(indices)
    if values is None:
        return None
    window_dims = tuple(attrs["update_window_dims"])
    inserted = tuple(attrs["inserted_window_dims"])
    to_operand = tuple(attrs["scatter_dims_to_operand_dims"])
    ivd = attrs["index_vector_dim"]
    rank = len(operand.shape)
    operand_window = [d for d in range(rank) if d not in inserted]
    if len(operand_window) != len(window_dims) or list(window_dims) != sorted(window_dims) \
            or any(d >= len(updates.shape) for d in window_dims):
        return None
    sizes = [1] * rank
    for k, d in enumerate(operand_window):
        sizes[d] = updates.shape[window_dims[k]]
    scatter_dims = [d for d in range(len(updates.shape)) if d not in window_dims]
    positions = list(itertools.product(*(range(updates.shape[d]) for d in scatter_dims)))
    if len(positions) > MAX_SCATTER_WINDOWS:
        return None
    windows = []
    for position in positions:
        at = list(position)
        if ivd < len(indices.shape):
            vector = [values(tuple(at[:ivd] + [k] + at[ivd:]))
                      for k in range(indices.shape[ivd])]
        else:
            vector = [values(tuple(at))]
        if len(vector) != len(to_operand):
            return None
        start = [0] * rank
        for k, d in enumerate(to_operand):
            start[d] = vector[k]
        if any(not 0 <= start[d] <= operand.shape[d] - sizes[d] for d in range(rank)):
            return None
        window = updates
        for d, p in zip(scatter_dims, position):
            window = slice_term(window, d, p, p + 1)
        windows.append((tuple(start), make_reshape(window, tuple(sizes))))
    return windows


def scatter_at_constants(term: Term, args: tuple[Term, ...]) -> Term | None:
    """`scatter_add(0, I, U)` with the indices I known and every update window inside the
    operand (no batching dims): the sum over U's scatter positions of that position's window
    of U, padded with zeros to where the scatter adds it. Exact: each element of the scatter
    is the sum of the updates landing on it (one addend per window that covers it), which is
    what the sum of the padded windows adds up; in the order-free reading of sums. None
    when it is not such a scatter, a window does not fit (the op's out-of-bounds behaviour
    is implementation-defined) or there are more than MAX_SCATTER_WINDOWS windows."""
    if term.op != "stablehlo.scatter" or len(args) != 3:
        return None
    if dict(term.attrs).get("reducer") != "add" or splat_value(args[0]) != 0:
        return None
    windows = _constant_windows(term, args)
    if windows is None:
        return None
    pieces = []
    for start, window in windows:
        low = start
        high = tuple(n - s - z for n, s, z in zip(term.shape, start, window.shape))
        if any(low) or any(high):
            window = make_op("pad", (window, make_splat(0, (), term.dtype)),
                             (low, high, (0,) * len(low)), term.shape, term.dtype, linear_in=0)
        pieces.append((Fraction(1), window))
    return make_lin(pieces, Fraction(0), term.shape, term.dtype)


_FOLDED = frozenset({"stablehlo.sqrt", "stablehlo.convert"})
"""Ops whose result on a constant IEEE 754 fixes exactly (`rounding.exact_value`)."""


def fold_constant(term: Term) -> Term | None:
    """A square root or float convert of a scalar constant (`jnp.sqrt(8.0)`) as the splat of
    its exact value in its dtype (the correctly rounded root, the rounded conversion), the form
    XLA's constant folding gives the sharded program; None when IEEE 754 does not fix the value
    (another op, a negative root, a conversion that overflows or is not to a float). A slice
    or reshape of an integer or boolean table whose values are kept: the table it gives
    (`_table_part`)."""
    if term.op in ("slice", "reshape") and term.args and term.args[0].op == "dense":
        return _table_part(term)
    if term.op not in _FOLDED:
        return None
    value = exact_value(term)
    return None if value is None else make_splat(value, term.shape, term.dtype)


def _table_part(term: Term) -> Term | None:
    """A slice or reshape of a constant table whose values are kept (`DENSE_VALUES`: small
    integer and boolean tables), as the splat of its value where it holds one (a scan's
    stored step mask read back at a known step), else as the table it is (exact: the same
    values)."""
    import hashlib  # lazy: only for a table sliced at known rows

    import numpy as np  # lazy: terms are pure Python; numpy only for a kept table

    table = DENSE_VALUES.get(term.args[0].attrs[0])
    if table is None:
        return None
    values = np.asarray(table).reshape(term.args[0].shape)
    if term.op == "slice":
        starts, limits, strides = term.attrs
        values = values[tuple(slice(a, b, c) for a, b, c in zip(starts, limits, strides))]
    values = values.reshape(term.shape)
    if values.size and (values == values.flat[0]).all():
        first = values.flat[0]
        return make_splat(bool(first) if values.dtype.kind == "b" else int(first), term.shape,
                          term.dtype)
    key = hashlib.sha1(repr((values.dtype.str, values.shape)).encode()
                       + values.tobytes()).digest()
    return make_dense(key, term.shape, term.dtype, values)


def update_slice(x: Term, update: Term, starts, *, joined: bool = True) -> Term:
    """`dynamic_update_slice(x, update, starts)` at in-range concrete starts, as the rows of
    `x` before and after the update concatenated around it, dim by dim (exact). `joined`:
    in normal form (`make_concat`, which may meet the pieces into one computation); else
    as plain slice and concatenate nodes, the op's own structure (what a rule instance
    states, so that Z3 checks it without re-deriving the normal form's identities)."""
    for dim, (n, k, s) in enumerate(zip(x.shape, update.shape, starts)):
        if (s, k) == (0, n):
            continue
        rows = _rows if joined else slice_term
        middle = update_slice(rows(x, dim, s, s + k), update,
                              [0 if d == dim else v for d, v in enumerate(starts)],
                              joined=joined)
        pieces = [p for p in (rows(x, dim, 0, s), middle, rows(x, dim, s + k, n))
                  if p.shape[dim]]
        if joined:
            return make_concat(pieces, dim)
        if len(pieces) == 1:
            return pieces[0]
        return intern("concatenate", tuple(pieces), (dim,), x.shape, x.dtype)
    return update


def _rows(term: Term, dim: int, start: int, stop: int) -> Term:
    """`slice_term`, also when the rows span several pieces of a concatenation (then the
    concatenation of the pieces' rows, `slice_of_concat`)."""
    if term.op == "concatenate" and start < stop:
        rank = len(term.shape)
        spanning = slice_of_concat(
            term, tuple(start if d == dim else 0 for d in range(rank)),
            tuple(stop if d == dim else n for d, n in enumerate(term.shape)), (1,) * rank)
        if spanning is not None:
            return spanning
    return slice_term(term, dim, start, stop)


def _overlap(a: tuple[tuple[int, ...], Term], b: tuple[tuple[int, ...], Term]) -> bool:
    """Whether two (start, window) boxes share an element."""
    return all(sa < sb + nb and sb < sa + na for sa, na, sb, nb in
               zip(a[0], a[1].shape, b[0], b[1].shape))


def scatter_replace_at_constants(term: Term, args: tuple[Term, ...]) -> Term | None:
    """`scatter(x, I, U)` writing (its region returns the update) at known indices whose
    windows fit inside x and are pairwise disjoint (no batching dims): x with each window
    replaced by its rows of U, the rows of x around each window concatenated with it dim by
    dim (`update_slice`; what `x.at[i].set(u)` is at a constant i). Exact: every element of
    the result is the one update landing on it, or x's where none does; disjoint windows
    write in any order alike. None where windows overlap (which write wins is then
    implementation-defined), a window does not fit, or the indices are unknown."""
    if term.op != "stablehlo.scatter" or len(args) != 3 or \
            dict(term.attrs).get("reducer") != "replace" or args[0].dtype != term.dtype:
        return None
    windows = _constant_windows(term, args)
    if windows is None or any(_overlap(a, b) for a, b in itertools.combinations(windows, 2)):
        return None
    out = args[0]
    for start, window in windows:
        out = update_slice(out, window, start)
    return out


class _KeptApart(Exception):
    """A squeeze meets, under a reduction, a unit dim that is a dot_general's batch dim."""


def _dropped(src: tuple[int, ...], dst: tuple[int, ...]) -> list[int] | None:
    """The dims of `src` to leave out, all of size 1, for `dst` to be what is left (the last
    unit dims of a run where several could go); None when `dst` is no such shape."""
    if len(dst) >= len(src) or 1 not in src:
        return None
    dropped, j = [], len(dst) - 1
    for i in range(len(src) - 1, -1, -1):
        if j >= 0 and src[i] == dst[j]:
            j -= 1
        elif src[i] == 1:
            dropped.append(i)
        else:
            return None
    return sorted(dropped) if j < 0 else None


def _without(dims, gone: list[int]) -> tuple[int, ...]:
    """Dim numbers `dims` renumbered once the dims `gone` are left out (none of them among
    `dims`)."""
    return tuple(d - sum(g < d for g in gone) for d in dims)


def squeeze(term: Term, shape: tuple[int, ...]) -> Term | None:
    """`reshape(term, shape)` where the reshape only leaves out unit dims, with the reshape
    pushed to the operands through the ops that keep those dims apart (each exact: a unit dim
    is one index, no element moves): a dot_general's unit batch dim (left out of both
    operands) or unit free dim (left out of its operand); a transpose; an elementwise op or a
    `lin`; a broadcast; a reduction or a reduce_window with a window of 1 and no padding on
    the dim; a slice, on the dims it keeps whole; a top_k (along another dim). None when `shape` is not `term.shape` less some unit dims."""
    gone = _dropped(term.shape, tuple(shape))
    if gone is None:
        return None
    try:
        out = _squeeze(term, tuple(shape), gone, False, {})
    except _KeptApart:
        return None
    return None if out.op == "reshape" and out.args[0] is term else out


def _squeeze_or_reshape(term: Term, shape: tuple[int, ...]) -> Term:
    out = squeeze(term, shape)
    return out if out is not None else make_reshape(term, shape)


def _less(shape: tuple[int, ...], gone) -> tuple[int, ...]:
    return tuple(n for d, n in enumerate(shape) if d not in gone)


def _squeeze(term: Term, shape: tuple[int, ...], gone: list[int], reduced: bool,
             memo: dict) -> Term:
    """`squeeze`'s recursion, once per shared subterm (`memo`: a program's terms are a DAG,
    and walking it as a tree is exponential in its depth); `reduced`: a reduction lies above
    (see `_KeptApart`)."""
    key = (term.serial, shape, tuple(gone), reduced)
    found = memo.get(key)
    if found is None:
        found = memo[key] = _squeeze_step(term, shape, gone, reduced, memo)
    return found


def _squeeze_step(term: Term, shape: tuple[int, ...], gone: list[int], reduced: bool,
                  memo: dict) -> Term:
    op = term.op
    if op == "lin":
        pairs, constant = linear_parts(term)
        return make_lin([(k, _squeeze(t, shape, gone, reduced, memo)) for k, t in pairs],
                        constant, shape, term.dtype)
    if op in _ELEMENTWISE and all(a.shape == term.shape for a in term.args):
        return _rebuilt(term, tuple(_squeeze(a, shape, gone, reduced, memo)
                                    for a in term.args))
    if op == "transpose":
        (perm,) = term.attrs
        inner_gone = sorted(perm[d] for d in gone)
        x = term.args[0]
        inner = _squeeze(x, _less(x.shape, inner_gone), inner_gone, reduced, memo)
        kept = [perm[d] for d in range(len(perm)) if d not in gone]
        return make_transpose(inner, _without(kept, inner_gone))
    if op == "broadcast":
        (dims,) = term.attrs
        x = term.args[0]
        inner_gone = [i for i, d in enumerate(dims) if d in gone]
        inner = x if not inner_gone else _squeeze(x, _less(x.shape, inner_gone), inner_gone,
                                                   reduced, memo)
        new_dims = _without([d for d in dims if d not in gone], gone)
        return make_broadcast(inner, new_dims, shape)
    if op == "stablehlo.dot_general":
        lhs, rhs = term.args
        lb, rb, lc, rc = term.attrs
        lf = [d for d in range(len(lhs.shape)) if d not in lb and d not in lc]
        rf = [d for d in range(len(rhs.shape)) if d not in rb and d not in rc]
        sources = [(0, lb[k], rb[k]) for k in range(len(lb))] + [(1, d, None) for d in lf] \
            + [(2, None, d) for d in rf]
        if reduced and any(d < len(lb) for d in gone):
            raise _KeptApart()
        lgone = sorted(sources[d][1] for d in gone if sources[d][1] is not None)
        rgone = sorted(sources[d][2] for d in gone if sources[d][2] is not None)
        keep = [k for k in range(len(lb)) if sources[k][1] not in lgone]
        left = _squeeze(lhs, _less(lhs.shape, lgone), lgone, reduced, memo) if lgone else lhs
        right = _squeeze(rhs, _less(rhs.shape, rgone), rgone, reduced, memo) if rgone else rhs
        attrs = (_without([lb[k] for k in keep], lgone), _without([rb[k] for k in keep], rgone),
                 _without(lc, lgone), _without(rc, rgone))
        return make_dot(left, right, attrs, shape, term.dtype)
    if op in _REDUCTIONS and len(term.args) == 1 and shape:
        x = term.args[0]
        kept = [d for d in range(len(x.shape)) if d not in term.attrs[0]]
        inner_gone = sorted(kept[d] for d in gone)
        inner = _squeeze(x, _less(x.shape, inner_gone), inner_gone, True, memo)
        return make_op(op, (inner,), (_without(term.attrs[0], inner_gone),) + term.attrs[1:],
                       shape, term.dtype, linear_in=0 if op == "reduce_sum" else None)
    if op == "reduce_window_sum" and len(term.args) == 1 \
            and all(a[d] == 1 for a in term.attrs[:4] for d in gone) \
            and all(a[d] == 0 for a in term.attrs[4:6] for d in gone):
        x = term.args[0]
        inner = _squeeze(x, _less(x.shape, gone), gone, reduced, memo)
        attrs = tuple(tuple(v for d, v in enumerate(a) if d not in gone) for a in term.attrs)
        return make_op(op, (inner,), attrs, shape, term.dtype, linear_in=0)
    if op == "slice" and any(term.args[0].shape[d] == 1 for d in gone):
        x = term.args[0]
        whole = [d for d in gone if x.shape[d] == 1]
        inner = _squeeze(x, _less(x.shape, whole), whole, reduced, memo)
        if inner.op == "reshape" and inner.args[0] is x:
            # Nothing to push the reshape into: `slice_of_reshape` would take the slice
            # back under it, and the two forms would alternate without end.
            return make_reshape(term, shape)
        cut = _slice(inner, *(tuple(v for d, v in enumerate(a) if d not in whole)
                              for a in term.attrs))
        return make_reshape(cut, shape)
    if op == selection.TOP_K and len(term.shape) - 1 not in gone:
        x = term.args[0]
        inner = _squeeze(x, _less(x.shape, gone), gone, reduced, memo)
        return make_op(op, (inner,), term.attrs, shape, term.dtype)
    return make_reshape(term, shape)


def generic_element(terms: list[Term]) -> list[Term] | None:
    """`terms` (all of one shape) at one generic position, as scalar terms, when every value
    under them is computed element by element: arguments of that shape (each becomes a
    scalar argument of its index), splats, broadcasts of scalars, elementwise ops and `lin`.
    Such a term's element at every position is the same function of the arguments' elements
    there, so two such terms are equal everywhere exactly when their generic elements are
    equal for all argument values: an equality of tensors of n elements is one of scalars.
    None when a value depends on the position (iota, a constant table, a movement, a
    reduction, a broadcast of a non-scalar) or the terms' shapes differ."""
    shape = terms[0].shape if terms else ()
    if not shape or any(t.shape != shape for t in terms):
        return None
    memo: dict[int, Term] = {}

    def element(term: Term) -> Term | None:
        found = memo.get(term.serial)
        if found is not None:
            return found
        if term.shape == ():
            out = term
        elif term.shape != shape:
            return None
        elif term.op == "arg":
            out = intern("arg", (), term.attrs, (), term.dtype)
        elif term.op == "splat":
            out = make_splat(term.attrs[0], (), term.dtype)
        elif term.op == "broadcast" and term.args[0].shape == ():
            out = term.args[0]
        elif term.op == "lin":
            pairs, constant = linear_parts(term)
            parts = [(k, element(t)) for k, t in pairs]
            if any(t is None for _, t in parts):
                return None
            out = make_lin(parts, constant, (), term.dtype)
        elif term.op in _ELEMENTWISE and all(a.shape == shape for a in term.args):
            args = [element(a) for a in term.args]
            if any(a is None for a in args):
                return None
            out = _rebuilt(term, tuple(args))
        else:
            return None
        memo[term.serial] = out
        return out

    out = [element(t) for t in terms]
    return None if any(t is None for t in out) else out


def reshape_through_reduction(arg: Term, shape: tuple[int, ...]) -> Term | None:
    """`reshape(arg, shape)` of a reduction `arg` with the groups of dims the reshape
    regroups that its operand can take pushed into the operand: a kept dim split into dims
    of size above 1, or kept dims adjacent in the operand (no reduced dim between them),
    at least two of size above 1, merged into one. The other groups (a merge across a
    reduced dim, unit dims alone) stay in a reshape above the reduction. Exact: each result
    element reduces the same elements of the same row, in the same order. One form for a
    reduction flattened or split after it was computed and one computed on the flattened or
    split rows, whichever part of the regrouping either side did first (the blocks of a
    flattened reduction joined; a GQA backward's sum over the copies of each kv head, its
    (rows, seq) dims merged before or after). None when no group goes in."""
    if arg.op not in _REDUCTIONS or len(arg.args) != 1:
        return None
    groups = reshape_groups(arg.shape, tuple(shape))
    if groups is None:
        return None
    (x,), reduced = arg.args, arg.attrs[0]
    kept = [d for d in range(len(x.shape)) if d not in reduced]
    inner: dict[int, tuple[int, list[int]]] = {}
    partial: list[int] = []
    for src, dst in groups:
        sizes = [shape[d] for d in dst]
        dims = [kept[d] for d in src]
        if len(src) == 1 and len(dst) > 1 and 1 not in sizes:
            inner[dims[0]] = (dims[0], sizes)
        elif len(dst) == 1 and src and dims == list(range(dims[0], dims[0] + len(dims))) \
                and sum(arg.shape[d] != 1 for d in src) > 1:
            inner[dims[0]] = (dims[-1], sizes)
        else:
            partial.extend(arg.shape[d] for d in src)
            continue
        partial.extend(sizes)
    if not inner:
        return None
    operand_shape, new_reduced, d = [], [], 0
    while d < len(x.shape):
        if d in inner:
            last, sizes = inner[d]
            operand_shape.extend(sizes)
            d = last + 1
            continue
        if d in reduced:
            new_reduced.append(len(operand_shape))
        operand_shape.append(x.shape[d])
        d += 1
    operand = make_reshape(x, tuple(operand_shape))
    out = make_op(arg.op, (operand,), (tuple(new_reduced),) + arg.attrs[1:], tuple(partial),
                  arg.dtype, linear_in=0 if arg.op == "reduce_sum" else None)
    return make_reshape(out, tuple(shape))


def reshape_through_dot(arg: Term, shape: tuple[int, ...]) -> Term | None:
    """`reshape(arg, shape)` of a dot_general with the groups of dims the reshape regroups
    within one operand's free dims pushed into that operand (the builders' `_reshape_dot`,
    which takes a reshape only when nothing else regroups), the other groups in a reshape
    above the dot: the lhs's first, then the rhs's. Exact: a free dim's rows are the
    operand's rows, in row-major order within the operand's free dims. A loss flattened
    over (micro-batch, row, seq) and (seq, feature) at once meets one whose rows were
    flattened before the last projection. None when no group goes in."""
    if arg.op != "stablehlo.dot_general":
        return None
    groups = reshape_groups(arg.shape, tuple(shape))
    if groups is None:
        return None
    lhs, _ = arg.args
    lb, _, lc, _ = arg.attrs
    n_lf = len(lhs.shape) - len(lb) - len(lc)
    for section in (range(len(lb), len(lb) + n_lf), range(len(lb) + n_lf, len(arg.shape))):
        partial: list[int] = []
        moved = False
        for src, dst in groups:
            sizes = [shape[d] for d in dst]
            if src and all(d in section for d in src) \
                    and [arg.shape[d] for d in src] != sizes:
                partial.extend(sizes)
                moved = True
            else:
                partial.extend(arg.shape[d] for d in src)
        if moved:
            inner = make_reshape(arg, tuple(partial))
            if inner.op != "reshape":
                return make_reshape(inner, tuple(shape))
    return None


def merge_summed_dims(term: Term, arg: Term) -> Term | None:
    """`reduce_sum(arg)` over runs of adjacent dims (none of size 1), some dim kept: the sum
    over the runs merged into one dim each of `arg` reshaped alike (exact: the same elements
    summed, a regrouping at most), so that a sum over the micro-batches and rows of a stacked
    batch meets the sum over the rows of the micro-batches flattened. None when no run has
    two dims, or nothing is kept (a sum over every element: `_full_sums_meet`)."""
    if term.op != "reduce_sum" or len(term.args) != 1:
        return None
    reduced = sorted(term.attrs[0])
    if len(reduced) == len(arg.shape) or any(arg.shape[d] == 1 for d in reduced):
        return None
    if not any(b == a + 1 for a, b in itertools.pairwise(reduced)):
        return None
    sizes: list[int] = []
    new_reduced: list[int] = []
    for d, n in enumerate(arg.shape):
        if d in reduced and d - 1 in reduced:
            sizes[-1] *= n
            continue
        if d in reduced:
            new_reduced.append(len(sizes))
        sizes.append(n)
    inner = make_reshape(arg, tuple(sizes))
    return make_op("reduce_sum", (inner,), (tuple(new_reduced),), term.shape, term.dtype,
                   linear_in=0)


def unit_kept_reduction(term: Term, arg: Term) -> Term | None:
    """A reduction keeping unit dims of its operand (every unit dim of the operand kept, some
    dim of size above 1 kept too) as the reduction of the operand without them, reshaped to
    add them back (exact: a unit dim is one index, so each result element reduces the same
    elements in the same order). The builders' form of a reduction whose result has a unit
    dim is the reshape above it; jax's backward of a stage's stacked layer (one layer a
    stage) keeps the layer's unit dim through the reduction instead. Only where `squeeze`
    moves the unit dims into the operand, and not to a dot's unit batch dim (`_KeptApart`:
    one row of a batch the other rows join along); else None."""
    if len(term.args) != 1:
        return None
    reduced = term.attrs[0]
    units = [d for d, n in enumerate(arg.shape) if n == 1]
    if not units or any(d in reduced for d in units) \
            or all(n == 1 for d, n in enumerate(arg.shape) if d not in reduced):
        return None
    try:  # under a reduction: a dot's unit batch dim stays (`_KeptApart`)
        inner = _squeeze(arg, _less(arg.shape, units), units, True, {})
    except _KeptApart:
        return None
    if inner.op == "reshape" and inner.args[0] is arg:
        return None
    shape = tuple(n for n in term.shape if n != 1)
    summed = make_op(term.op, (inner,), (_without(reduced, units),) + term.attrs[1:], shape,
                     term.dtype, linear_in=0 if term.op == "reduce_sum" else None)
    return make_reshape(summed, term.shape)


def merge_contracted_dims(term: Term, args: tuple[Term, ...]) -> Term | None:
    """A dot_general contracting runs of dims adjacent on both operands, in the same order
    (none of size 1), as the dot of the operands with each run merged into one dim
    (`merge_summed_dims` for contractions: the same products summed; a weight gradient over
    the micro-batches and rows of a stacked batch meets the one over the rows of the
    micro-batches flattened). None when no run has two dims."""
    lhs, rhs = args
    lb, rb, lc, rc = term.attrs
    pairs = sorted(zip(lc, rc))
    if any(lhs.shape[a] == 1 for a, _ in pairs):
        return None
    runs: list[list[tuple[int, int]]] = []
    for a, b in pairs:
        if runs and runs[-1][-1] == (a - 1, b - 1):
            runs[-1].append((a, b))
        else:
            runs.append([(a, b)])
    if all(len(r) == 1 for r in runs):
        return None
    firsts = {r[0]: r for r in runs}

    def merged(x: Term, side: int) -> tuple[Term, dict[int, int]]:
        heads = {r[0][side]: len(r) for r in runs}
        sizes, where, d = [], {}, 0
        while d < len(x.shape):
            where[d] = len(sizes)
            n = heads.get(d, 1)
            sizes.append(math.prod(x.shape[d:d + n]))
            d += n
        return make_reshape(x, tuple(sizes)), where

    left, lwhere = merged(lhs, 0)
    right, rwhere = merged(rhs, 1)
    heads = list(firsts)
    attrs = (tuple(lwhere[d] for d in lb), tuple(rwhere[d] for d in rb),
             tuple(lwhere[a] for a, _ in heads), tuple(rwhere[b] for _, b in heads))
    return make_dot(left, right, attrs, term.shape, term.dtype)


def merge_through_broadcast(arg: Term, shape: tuple[int, ...]) -> Term | None:
    """`reshape(arg, shape)` of a broadcast `arg` where the reshape merges dims the operand
    fills (at full size, adjacent in the operand) into one, and otherwise only regroups
    dims the broadcast creates: the broadcast of the operand with those dims merged alike
    (exact: no element moves relative to the operand's; the builders push a reshape into a
    broadcast only where it splits an operand dim or regroups created ones). None for any
    other reshape."""
    if arg.op != "broadcast":
        return None
    (dims,), y = arg.attrs, arg.args[0]
    groups = reshape_groups(arg.shape, tuple(shape))
    if groups is None:
        return None
    sizes: list[int] = []
    new_dims: list[int] = []
    merged = False
    at = 0
    for src, dst in groups:
        filled = [d for d in src if d in dims]
        if not filled:
            continue
        real_dst = [d for d in dst if shape[d] != 1]
        operand = [dims.index(d) for d in filled]
        if len(real_dst) != 1 or any(arg.shape[d] != 1 for d in src if d not in dims) \
                or operand != list(range(at, at + len(operand))) \
                or any(y.shape[i] != arg.shape[d] for i, d in zip(operand, filled)):
            return None
        at += len(operand)
        merged = merged or len([d for d in filled if arg.shape[d] != 1]) > 1
        sizes.append(math.prod(y.shape[i] for i in operand))
        new_dims.append(real_dst[0])
    if not merged or at != len(y.shape) or new_dims != sorted(set(new_dims)):
        return None
    return make_broadcast(make_reshape(y, tuple(sizes)), tuple(new_dims), tuple(shape))


def slice_through(arg: Term, starts, limits, strides) -> Term | None:
    """A slice of `arg` as the op of `arg` applied to slices of its operands, where the
    slice keeps whole every dim the op reads across (each exact: the result's rows along a
    dim the op maps one to one are computed from the operand's rows alone): a reduction
    over other dims (the operand sliced on the kept dims); a reduce_window with a window of 1,
    unit strides and dilations and no padding on the sliced dims; a top_k (along the last
    dim) sliced on the other dims. None for any other slice."""
    rank = len(arg.shape)
    cut = [d for d in range(rank) if (starts[d], limits[d], strides[d]) != (0, arg.shape[d], 1)]
    if not cut:
        return None
    shape = tuple(len(range(a, b, c)) for a, b, c in zip(starts, limits, strides))
    if arg.op in _REDUCTIONS and len(arg.args) == 1:
        x = arg.args[0]
        kept = [d for d in range(len(x.shape)) if d not in arg.attrs[0]]
        x_starts, x_limits, x_strides = [0] * len(x.shape), list(x.shape), [1] * len(x.shape)
        for d, k in enumerate(kept):
            x_starts[k], x_limits[k], x_strides[k] = starts[d], limits[d], strides[d]
        inner = _slice(x, x_starts, x_limits, x_strides)
        return make_op(arg.op, (inner,), arg.attrs, shape, arg.dtype,
                       linear_in=0 if arg.op == "reduce_sum" else None)
    if arg.op == "reduce_window_sum" and len(arg.args) == 1 \
            and arg.args[0].shape == arg.shape \
            and all(a[d] == 1 for a in arg.attrs[:4] for d in cut) \
            and all(a[d] == 0 for a in arg.attrs[4:6] for d in cut):
        inner = _slice(arg.args[0], starts, limits, strides)
        return make_op(arg.op, (inner,), arg.attrs, shape, arg.dtype, linear_in=0)
    if arg.op == selection.TOP_K and cut != [rank - 1]:
        x = arg.args[0]
        last = (0, x.shape[-1], 1)
        inner = _slice(x, (*starts[:-1], last[0]), (*limits[:-1], last[1]),
                       (*strides[:-1], last[2]))
        rows = (*shape[:-1], arg.shape[-1])
        top = make_op(arg.op, (inner,), arg.attrs, rows, arg.dtype)
        if rank - 1 not in cut:
            return top
        return _slice(top, (0,) * (rank - 1) + (starts[-1],), rows[:-1] + (limits[-1],),
                      (1,) * (rank - 1) + (strides[-1],))
    return None


def _slice(x: Term, starts, limits, strides) -> Term:
    shape = tuple(len(range(a, b, c)) for a, b, c in zip(starts, limits, strides))
    return make_op("slice", (x,), (tuple(starts), tuple(limits), tuple(strides)), shape,
                   x.dtype, linear_in=0)


def swapped_dot(term: Term, arg: Term) -> Term | None:
    """`transpose(dot_general(a, b), perm)` where perm keeps the batch dims and puts b's
    free dims before a's: `dot_general(b, a)` (exact: each element is the same sum, over the
    same contracted positions in the same order, of the same products, which commute). None
    for any other transpose."""
    if term.op != "transpose" or arg.op != "stablehlo.dot_general":
        return None
    (perm,) = term.attrs
    lhs, rhs = arg.args
    lb, rb, lc, rc = arg.attrs
    nb = len(lb)
    nl = len(lhs.shape) - nb - len(lc)
    nr = len(rhs.shape) - nb - len(rc)
    if not nl or not nr:
        return None
    want = tuple(range(nb)) + tuple(range(nb + nl, nb + nl + nr)) + tuple(range(nb, nb + nl))
    if tuple(perm) != want:
        return None
    return make_dot(rhs, lhs, (rb, lb, rc, lc), term.shape, term.dtype)


def _renormal(rewritten: Term, term: Term, args: tuple[Term, ...],
              memo: dict[int, Term]) -> Term | None:
    """The normal form of a node's rewrite, or None where the rewrite gave the node back
    (a slice of a reshape whose box squeezes back to that slice): normalizing it again
    would not end."""
    if rewritten is term or (rewritten.op == term.op and rewritten.args == args
                             and rewritten.attrs == term.attrs):
        return None
    return normal_form(rewritten, memo)


def _normal_node(term: Term, args: tuple[Term, ...], memo: dict[int, Term]) -> Term:
    out = _rewritten(term, args, memo)
    return out if out is not None else _rebuilt_node(term, args)


def _rewritten(term: Term, args: tuple[Term, ...], memo: dict[int, Term]) -> Term | None:
    """A node rewritten by one of this module's identities (in normal form), or None."""
    if term.op == "concatenate":
        return make_concat(args, term.attrs[0])
    if term.op == "slice":
        spanning = slice_of_concat(args[0], *term.attrs)
        if spanning is not None:
            return spanning
        for rewrite in (slice_of_reshape, slice_through):
            box = rewrite(args[0], *term.attrs)
            found = None if box is None else _renormal(box, term, args, memo)
            if found is not None:
                return found
        reduced = slice_of_reduction(args[0], *term.attrs)
        if reduced is not None:
            return reduced
    if term.op == "reduce_sum":
        blocks = sum_of_blocks(term, args[0])
        if blocks is not None:
            return join_sums(blocks)
        merged = merge_summed_dims(term, args[0])
        if merged is not None:
            return _renormal(merged, term, args, memo)
    if term.op in _REDUCTIONS and len(args) == 1:
        kept_apart = unit_kept_reduction(term, args[0])
        if kept_apart is not None:
            return _renormal(kept_apart, term, args, memo)
    if term.op == "stablehlo.dot_general":
        merged = merge_contracted_dims(term, args)
        if merged is not None:
            return _renormal(merged, term, args, memo)
    if term.op == "transpose" and args[0].op == "concatenate":
        return transpose_of_concat(args[0], term.attrs[0])
    if term.op == "reshape":
        pieces = reshape_of_concat(term, args[0])
        if pieces is not None:
            return pieces
        squeezed = squeeze(args[0], term.shape)
        if squeezed is None:
            squeezed = reshape_through_reduction(args[0], term.shape)
        if squeezed is None:
            squeezed = merge_through_broadcast(args[0], term.shape)
        if squeezed is None:
            squeezed = reshape_through_dot(args[0], term.shape)
        if squeezed is not None:
            return _renormal(squeezed, term, args, memo)
    if term.op == "transpose":
        swapped = swapped_dot(term, args[0])
        if swapped is not None:
            return swapped
    if term.op == "stablehlo.scatter":
        placed = scatter_at_constants(term, args)
        if placed is None:
            placed = scatter_replace_at_constants(term, args)
        if placed is not None:
            return placed
    return None


def _rebuilt_node(term: Term, args: tuple[Term, ...]) -> Term:
    """A node over its normal arguments, through the builders, constant folding, the joins
    of sums and the selection identities."""
    out = rebuild(term, args) if args != term.args else term
    folded = fold_constant(out)
    if folded is not None:
        return folded
    hoisted = broadcast_hoisted(out)
    if hoisted is not None:
        return hoisted
    if out.op == "lin":
        out = join_sums(out)
    for _ in range(_MAX_SELECTION_STEPS):
        selected = selection.rewrite(out, make_concat)
        if selected is None:
            break
        out = selected
    return out


def broadcast_hoisted(term: Term) -> Term | None:
    """An elementwise op whose every operand is a broadcast (or splat) that leaves some dims
    of more than one element unfilled, as the broadcast along those dims of the op on the
    operands without them (exact: no operand's element depends on its index along them, so
    neither does the op's). A table computed from copies of one row block (four micro-batches'
    RoPE angles, reshaped out of copies of one (seq, d) table) meets the reference's table
    computed once and broadcast. None for other terms."""
    if term.op not in _ELEMENTWISE or not term.args or any(
            a.shape != term.shape or a.op not in ("broadcast", "splat") for a in term.args):
        return None
    filled = {d for a in term.args if a.op == "broadcast" for d in a.attrs[0]}
    free = [d for d, n in enumerate(term.shape) if n > 1 and d not in filled]
    if not free:
        return None
    kept = [d for d in range(len(term.shape)) if d not in free]
    at = {d: i for i, d in enumerate(kept)}
    shape = tuple(term.shape[d] for d in kept)
    args = tuple(make_splat(a.attrs[0], shape, a.dtype) if a.op == "splat" else
                 make_broadcast(a.args[0], tuple(at[d] for d in a.attrs[0]), shape)
                 for a in term.args)
    return make_broadcast(_rebuilt_node(term, args), tuple(kept), term.shape)


_MAX_SELECTION_STEPS = 4
"""How many of `selection.py`'s identities one node is rewritten by in a row (a decided
predicate, then the select it picks)."""


def split_like(term: Term, other: Term) -> Term | None:
    """`term` with each of its contractions (sums) cut into the blocks `other` computes it
    in, where `other` is a sum whose parts are that contraction (sum) over n equal blocks of
    a summed dim: `dot(A, B)` contracting (a, b) is `sum_j dot(A[j-th block along a],
    B[j-th block along b])`, and `reduce_sum(X)` over d is `sum_j reduce_sum(X[j-th block
    along d])` (exact: a regrouping of the sum, which the semantics policy allows; integer
    sums wrap alike in any grouping). The blocks are cut with the term builders, which push
    the slices to the leaves, so that each block is built from the same windows of the
    inputs as `other`'s parts (and so canonicalized alike, where joining `other`'s parts
    would meet them in another order). None when no part of `term` is cut.

    Which blocks is read off the shapes alone: the summed dim on which `other`'s parts'
    operands are smaller, by one block size for all parts, n blocks covering the dim. Any
    cut is exact; a cut unlike `other`'s only fails to meet it."""
    if other.op == "lin":
        other_pairs, _ = linear_parts(other)
    else:
        other_pairs = [(Fraction(1), other)]
    counts: dict[tuple, list[Term]] = {}
    scaled: dict[tuple, list[Term]] = {}
    for coef, t in other_pairs:
        perms, core = _peel(t)
        key = _contraction_key(core)
        if key is not None:
            counts.setdefault((perms, key), []).append(core)
            scaled.setdefault((coef, perms, key), []).append(core)
    if term.op == "lin":
        pairs, constant = linear_parts(term)
    else:
        pairs, constant = [(Fraction(1), term)], Fraction(0)
    out, changed = [], False
    for k, t in pairs:
        perms, core = _peel(t)
        key = _contraction_key(core)
        members = counts.get((perms, key)) if key is not None else None
        blocks = _blocks_like(core, members) if members and len(members) > 1 else None
        alike = scaled.get((k, perms, key), [])
        if blocks is None and 1 < len(alike) < len(members or ()):
            blocks = _blocks_like(core, alike)
        if blocks is None and core.op == "reduce_sum":
            blocks = _rows_like(core, perms, counts)
        if blocks is None:
            out.append((k, t))
            continue
        changed = True
        for block in blocks:
            block = _wrap(block, perms)
            out.append((k, block))
    if not changed:
        return None
    return make_lin(out, constant, term.shape, term.dtype)


def _blocks_like(core: Term, members: list[Term]) -> list[Term] | None:
    """`core` (a contraction or sum) cut into blocks along a summed dim that the members'
    operands cover together (see `split_like`): blocks of the members' sizes along it, in
    the order `_orders` finds them in (equal sizes need no order), else None."""
    for pair in _summed_dims(core):
        dims = [(k, d) for k, d in enumerate(pair) if d is not None]
        (k0, d0) = dims[0]
        sizes = [m.args[k0].shape[d0] for m in members]
        if any(m.args[k].shape[d] != size for m, size in zip(members, sizes) for k, d in dims):
            continue
        if any(core.args[k].shape[d] != sum(sizes) for k, d in dims):
            continue
        if any(m.args[k].shape[e] != core.args[k].shape[e] for m in members for k, d in dims
               for e in range(len(core.args[k].shape)) if e != d):
            continue
        if len(set(sizes)) > 1:
            cut = _concatenated_sizes(core, dims)
            orders = _orders(members, dims)
            if cut is not None and sorted(cut) == sorted(sizes):
                sizes = cut
            elif orders:
                sizes = [sizes[i] for i in orders[0]]
            else:
                continue
        blocks, row = [], 0
        for size in sizes:
            cut = [slice_term(core.args[k], d, row, row + size) for k, d in dims]
            row += size
            if core.op == "reduce_sum":
                blocks.append(make_op("reduce_sum", tuple(cut), core.attrs, core.shape,
                                      core.dtype, linear_in=0))
            else:
                blocks.append(make_dot(cut[0], cut[1], core.attrs, core.shape, core.dtype))
        return blocks
    return None


def _concatenated_sizes(core: Term, dims: list[tuple[int, int]]) -> list[int] | None:
    """The sizes of the pieces of an operand of `core` that is a concatenation along its
    summed dim (`dims`: (operand, dim) pairs), the first found; None where none is. Where
    the other side's blocks are of those sizes, the cut there is the one that can meet
    (`dq @ wq^T + dk @ wk^T` against the contraction over `[wk wq]`), whatever order the
    other side's parts come in."""
    for k, d in dims:
        operand = core.args[k]
        if operand.op == "concatenate" and operand.attrs == (d,):
            return [p.shape[d] for p in operand.args]
    return None


def _rows_like(core: Term, perms: tuple, counts: dict) -> list[Term] | None:
    """`reduce_sum(X)` over dims including d, cut into its rows along d each summed with
    the dim squeezed out, where the other sum's parts are sums over X's shape without d,
    one per row (a loss summed micro-batch by micro-batch, each micro-batch read as
    `x[j]`): `sum_j reduce_sum(squeeze(X[j]))` (exact: a regrouping of the sum; the squeeze
    is a reshape the builders push to the leaves, as jax's indexing of one row is)."""
    (dims,) = core.attrs
    (x,) = core.args
    for d in dims:
        rows = x.shape[d]
        shape = x.shape[:d] + x.shape[d + 1:]
        kept = tuple(e - (e > d) for e in dims if e != d)
        members = counts.get((perms, ("reduce_sum", (kept,), core.shape, core.dtype)), [])
        if rows < 2 or len(members) != rows or any(m.args[0].shape != shape
                                                    for m in members):
            continue
        return [make_op("reduce_sum", (make_reshape(slice_term(x, d, j, j + 1), shape),),
                        (kept,), core.shape, core.dtype, linear_in=0) for j in range(rows)]
    return None


def _full_sums_meet_by_blocks(a: Term, b: Term, memo: dict[int, Term]) -> bool:
    """Whether `a` and `b` are the same multiple of a sum over every element of X and of Y,
    X and Y of one element count read in two shapes (a loss summed over micro-batches whose
    rows the normal form joined into one (micro-batches x rows) block, and the reference's
    sum over (micro-batches, rows)), and X read in Y's shape meets Y: a sum over all
    elements does not depend on the shape they are read in (exact)."""
    (pa, ca), (pb, cb) = linear_parts(a), linear_parts(b)
    if len(pa) != 1 or len(pb) != 1 or pa[0][0] != pb[0][0] or ca != cb:
        return False
    x, y = pa[0][1], pb[0][1]
    if x.op != "reduce_sum" or y.op != "reduce_sum" or x.dtype != y.dtype:
        return False
    (xs,), (ys,) = x.args, y.args
    if x.attrs[0] != tuple(range(len(xs.shape))) or y.attrs[0] != tuple(range(len(ys.shape))) \
            or xs.shape == ys.shape or math.prod(xs.shape) != math.prod(ys.shape):
        return False
    return blocks_meet(normal_form(make_reshape(xs, ys.shape), memo), ys, memo)


def blocks_meet(a: Term, b: Term, memo: dict[int, Term] | None = None) -> bool:
    """Whether the normal forms `a` and `b` meet once one of them is cut like the other:
    its contractions into the other's blocks (`split_like`), or, where one is a
    concatenation, the other's rows piece by piece (a concatenation equals a term exactly
    when every piece equals its rows). Structural only: nothing is evaluated."""
    memo = {} if memo is None else memo
    if a is b:
        return True
    if a.shape != b.shape:
        return False
    if _full_sums_meet_by_blocks(a, b, memo):
        return True
    for x, y in ((a, b), (b, a)):
        cut = split_like(x, y)
        if cut is not None and normal_form(cut, memo) is y:
            return True
    if _full_sums_meet(a, b, memo) or _tiled_sums_meet(a, b, memo) \
            or _tiled_sums_meet(b, a, memo):
        return True
    for x, y in ((a, b), (b, a)):
        cuts = _spine_cuts(y) if y.op != "concatenate" else None
        if cuts is not None:
            dim, sizes = cuts
            row = 0
            for size in sizes:
                rows_x = normal_form(slice_term(x, dim, row, row + size), memo)
                rows_y = normal_form(slice_term(y, dim, row, row + size), memo)
                if not blocks_meet(rows_x, rows_y, memo):
                    break
                row += size
            else:
                return True
    for x, y in ((a, b), (b, a)):
        if y.op == "concatenate" and x.op != "concatenate":
            return _meet_piecewise(x, y, memo)
    return congruent(a, b, memo, {})


def _meet_piecewise(x: Term, y: Term, memo: dict[int, Term]) -> bool:
    """Whether `x` meets the concatenation `y` piece by piece (its rows cut at `y`'s pieces,
    each meets its piece, `blocks_meet`): a concatenation equals a term exactly when every
    piece equals its rows."""
    (dim,) = y.attrs
    row = 0
    for piece in y.args:
        size = piece.shape[dim]
        rows = normal_form(slice_term(x, dim, row, row + size), memo)
        if not blocks_meet(rows, piece, memo):
            return False
        row += size
    return True


MAX_CONGRUENT_PAIRS = 4096
"""The most term pairs one `congruent` comparison visits (a bound on its walk; past it the
answer is "not shown", never "equal")."""


def congruent(a: Term, b: Term, memo: dict[int, Term], seen: dict[tuple[int, int], bool]
              ) -> bool:
    """Whether `a` and `b` are one op (same attributes, shape and element type) over operands
    that meet position by position: identical, a concatenation against a term whose rows
    meet its pieces (`_meet_piecewise`), or congruent again. Exact: a term is a function of
    its op, attributes and operands. Where the normal form cannot rebuild a whole tensor from
    its pieces (each piece's sums ordered, hence signed, by serial: `x - y` in one piece,
    `-(y - x)` in the next), the pieces nested inside one contraction or product still meet
    the reference's whole tensor there, as at the top (a pipeline's gradient through a layer
    norm, one micro-batch a piece). `seen` memoizes pairs (a DAG is walked once per pair) and
    bounds the walk (`MAX_CONGRUENT_PAIRS`)."""
    if a is b:
        return True
    key = (a.serial, b.serial)
    if key in seen:
        return seen[key]
    if len(seen) >= MAX_CONGRUENT_PAIRS or not a.args or a.op != b.op \
            or a.shape != b.shape or a.dtype != b.dtype or len(a.args) != len(b.args):
        return False
    pairs = _operand_pairs(a, b)
    if pairs is None:
        return False
    seen[key] = False
    found = True
    for x, y in pairs:
        if x is y:
            continue
        if x.shape != y.shape:
            found = False
        elif y.op == "concatenate" and x.op != "concatenate":
            found = _meet_piecewise(x, y, memo)
        elif x.op == "concatenate" and y.op != "concatenate":
            found = _meet_piecewise(y, x, memo)
        else:
            found = congruent(x, y, memo, seen) or _sums_cut_alike(x, y, memo, seen)
        if not found:
            break
    seen[key] = found
    return found


def _operand_pairs(a: Term, b: Term) -> list[tuple[Term, Term]] | None:
    """The operands of `a` and `b` (one op) paired for `congruent`: position by position,
    but for a product (or another op whose operands commute) and the parts of a sum, which
    the builders order by serial: each operand of `a` with the same term in `b` where it has
    it (a part at the same coefficient), the rest in order among the unpaired ones of one op,
    shape (and coefficient) each (exact: the same factors, or parts at the same
    coefficients, in any order are one value). None where no such pairing exists."""
    if a.op == "lin":
        (ca, ka), (cb, kb) = a.attrs, b.attrs
        if ca != cb or sorted(ka) != sorted(kb):
            return None
        mine, theirs = list(zip(ka, a.args)), list(zip(kb, b.args))
    elif a.op in _COMMUTES and a.attrs == b.attrs:
        mine, theirs = [(0, x) for x in a.args], [(0, y) for y in b.args]
    else:
        return list(zip(a.args, b.args)) if a.attrs == b.attrs else None
    rest = list(theirs)
    pairs, unpaired = [], []
    for k, x in mine:
        same = next((i for i, (c, y) in enumerate(rest) if c == k and y is x), None)
        if same is None:
            unpaired.append((k, x))
        else:
            pairs.append((x, rest.pop(same)[1]))
    for k, x in unpaired:
        like = [i for i, (c, y) in enumerate(rest)
                if c == k and y.op == x.op and y.shape == x.shape]
        if not like:
            return None
        best = max(like, key=lambda i: _likeness(x, rest[i][1]))
        pairs.append((x, rest.pop(best)[1]))
    return pairs


def _likeness(x: Term, y: Term) -> tuple:
    """How alike two terms of one op and shape are, for pairing (more is likelier the same
    value): operands of the same shapes, operands in common, one skeleton."""
    return ([a.shape for a in x.args] == [b.shape for b in y.args],
            sum(1 for a in x.args if any(a is b for b in y.args)), skeleton(x) == skeleton(y))


def _sums_cut_alike(x: Term, y: Term, memo: dict[int, Term],
                    seen: dict[tuple[int, int], bool]) -> bool:
    """Whether one of two sums, its contractions cut into the other's blocks
    (`split_like`, exact), has the other's normal form: `blocks_meet`'s cut, for sums
    nested inside one op (a weight gradient's joined q and k contractions, which the
    sharded side sums apart)."""
    if "lin" not in (x.op, y.op):
        return False
    for p, q in ((x, y), (y, x)):
        cut = split_like(p, q)
        if cut is None:
            continue
        cut = normal_form(cut, memo)
        if cut is q or congruent(cut, q, memo, seen):
            return True
    return False


def _full_sum(term: Term) -> tuple[Fraction, object, Term] | None:
    """(k, c, x) when `term` is `k * reduce_sum(x over every dim) + c`, else None."""
    k, c = Fraction(1), Fraction(0)
    if term.op == "lin":
        pairs, c = linear_parts(term)
        if len(pairs) != 1:
            return None
        k, term = pairs[0]
    x = _summed_whole(term)
    return None if x is None else (k, c, x)


def _summed_whole(term: Term) -> Term | None:
    """x when `term` is the sum of every element of x (a reshape dropping the unit dims a
    sum leaves is read through, `_sum_view`), else None."""
    if term.op == "reshape":
        term = _sum_view(term)
    if term.op != "reduce_sum" or len(term.args) != 1 \
            or tuple(term.attrs[0]) != tuple(range(len(term.args[0].shape))):
        return None
    return term.args[0]


def _tiled_sums_meet(a: Term, b: Term, memo: dict[int, Term]) -> bool:
    """Whether `a` is `k * (sum of every element of x) + c` and `b` is `k * (the sum of
    every element of each piece y_j) + c`, each y_j reading its own window of one input of
    x's shape, the windows tiling it, and x's rows in each window meet y_j (exact: a sum
    over every element is the sum of its tiles' sums, a regrouping; the micro-batches of a
    pipelined loss on dp-split rows, one tile per micro-batch and row block)."""
    whole = _full_sum(a)
    if whole is None or b.op != "lin":
        return False
    k, c, x = whole
    pairs, constant = linear_parts(b)
    if constant != c or len(pairs) < 2 or any(coef != k for coef, _ in pairs):
        return False
    pieces = [_summed_whole(t) for _, t in pairs]
    if any(y is None for y in pieces) or sum(math.prod(y.shape) for y in pieces) != \
            math.prod(x.shape):
        return False
    windows = _tiles(pieces, x.shape)
    if windows is None:
        return False
    for y, (starts, sizes) in zip(pieces, windows):
        rows = x
        for d, (start, size) in enumerate(zip(starts, sizes)):
            if size != x.shape[d]:
                rows = slice_term(rows, d, start, start + size)
        rows = normal_form(rows, memo)
        if rows.shape != y.shape:
            rows = normal_form(make_reshape(rows, y.shape), memo)
        if rows is not y and not blocks_meet(rows, y, memo):
            return False
    return True


def _tiles(pieces: list[Term], shape: tuple[int, ...]
           ) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """(starts, sizes) of the one window of some term of `shape` each piece slices, when
    they are of one size and tile the term (distinct, in bounds, as many as fill it); else
    None."""
    found: list[dict[int, set]] = []
    for piece in pieces:
        mine: dict[int, set] = {}
        for t in itertools.islice((u for u in subterms([piece]) if u.op == "slice"),
                                  MAX_SLICES_SEEN):
            starts, limits, strides = t.attrs
            if t.args[0].shape == shape and all(v == 1 for v in strides):
                mine.setdefault(t.args[0].serial, set()).add(
                    (starts, tuple(b - a for a, b in zip(starts, limits))))
        found.append(mine)
    for base in sorted(set(found[0]).intersection(*found[1:])):
        if any(len(w[base]) != 1 for w in found):
            continue
        windows = [next(iter(w[base])) for w in found]
        sizes = {size for _, size in windows}
        if len(sizes) != 1 or len({start for start, _ in windows}) != len(windows):
            continue
        (size,) = sizes
        if len(windows) * math.prod(size) == math.prod(shape) and all(
                start[d] % size[d] == 0 and start[d] + size[d] <= shape[d]
                for start, _ in windows for d in range(len(shape))):
            return windows
    return None


def _full_sums_meet(a: Term, b: Term, memo: dict[int, Term]) -> bool:
    """Whether `a` and `b` are the same multiple of sums over every element of operands of
    different shapes (the sum of micro-batch losses over rows flattened per micro-batch, the
    reference's loss over the stacked batch) whose operands meet once one is reshaped to the
    other's shape (exact: a sum over every element does not depend on the shape it is read
    in; the order it adds them in is a regrouping)."""
    fa, fb = _full_sum(a), _full_sum(b)
    if fa is None or fb is None or fa[:2] != fb[:2]:
        return False
    x, y = fa[2], fb[2]
    if x.shape == y.shape or x.dtype != y.dtype or math.prod(x.shape) != math.prod(y.shape):
        return False
    for p, q in ((x, y), (y, x)):
        if normal_form(make_reshape(p, q.shape), memo) is q:
            return True
    return False


MAX_SPINE = 64
"""How many terms `_spine_cuts` looks at."""


def _spine_cuts(term: Term) -> tuple[int, list[int]] | None:
    """(dim, piece sizes) of the first concatenation of `term`'s shape found among the terms
    `term` computes element by element from (through `lin` parts and elementwise operands of
    its shape), e.g. the layers' rows of a sum of gradients each concatenated over the
    pipeline's stages; None when there is none (within `MAX_SPINE` terms)."""
    stack, seen = [term], set()
    while stack and len(seen) < MAX_SPINE:
        t = stack.pop()
        if t.serial in seen:
            continue
        seen.add(t.serial)
        if t.op == "concatenate" and t is not term:
            (dim,) = t.attrs
            return dim, [p.shape[dim] for p in t.args]
        if t.op == "lin" or t.op in _ELEMENTWISE:
            stack.extend(a for a in t.args if a.shape == term.shape)
    return None
