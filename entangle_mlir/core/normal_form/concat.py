"""Concatenations in normal form (`make_concat`) and the lifts of a concatenation of one op
applied piece by piece into that op of the concatenated operands (elementwise ops,
contractions, movements, reshapes, gathers, slices); a slice spanning pieces of a
concatenation (`slice_of_concat`) and a term with rows replaced (`update_slice`).

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

import math
from fractions import Fraction

from entangle_mlir.core.normal_form.pieces import (
    _COMMUTES,
    _ELEMENTWISE,
    _MOVES,
    _PROMISES,
    _REDUCTIONS,
    _joined,
    _joins,
    _moved_argument,
    _moved_base,
    _moved_input,
    _rebuilt,
    _same,
    _slice,
    _without,
    slice_term,
)
from entangle_mlir.core.normal_form.slices import slice_of_reshape
from entangle_mlir.core.ranges import fits
from entangle_mlir.core.terms import (
    Term,
    intern,
    linear_parts,
    make_broadcast,
    make_dot,
    make_iota,
    make_lin,
    make_op,
    make_reshape,
    make_splat,
    make_transpose,
    reshape_groups,
    splat_value,
)

_CONCATS: dict[tuple, Term] = {}
"""make_concat by (dim, *piece serials) (one flat tuple a key: a check holds ~0.3 M), also
by the serials of the pieces once flattened and their adjacent slices joined (what the rest
of `make_concat` reads): terms are interned for the whole run, lifting a concatenation
through a chain of ops asks for the same inner concatenations again, and a concatenation
built flattened (a stack's layers, one appended at a time) is asked for again by its own
pieces when its node is normalized."""

_UNMET: set[tuple] = set()
"""Keys of `_CONCATS` (dim, *serials of the pieces flattened and joined) whose concatenation
is those pieces as they are and in which no two adjacent pieces meet (`_unmet_tail`): what a
concatenation with pieces appended to them reads instead of lifting all of its pieces again."""

APPEND_REACH = 16
"""How many pieces after a concatenation known not to meet (`_UNMET`) `_unmet_tail` looks
for it across (one layer's tp column blocks; several micro-batches')."""


def make_concat(pieces, dim: int) -> Term:
    """The concatenation of `pieces` along `dim`, in normal form (see the module docstring)."""
    pieces = tuple(pieces)
    key = (dim, *[p.serial for p in pieces])
    found = _CONCATS.get(key)
    if found is not None:
        return found
    if key in _BUILDING:  # asked again while lifting itself (`_stacked_rows`)
        at = _BUILDING.index(key)
        for frame in range(at + 1, len(_BUILDING)):
            _TAINTED.add(_BUILDING[frame])
        return _plain_concat(list(pieces), dim)
    joined = _flat_joined(pieces, dim)
    inner = (dim, *[p.serial for p in joined])
    found = _CONCATS.get(inner)
    if found is not None:
        _CONCATS[key] = found
        return found
    _BUILDING.append(key)
    try:
        found, unmet = _make_concat(joined, dim)
    finally:
        _BUILDING.pop()
    if key in _TAINTED:
        _TAINTED.discard(key)
    else:
        _CONCATS[key] = _CONCATS[inner] = found
        if unmet:
            _UNMET.add(inner)
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


def _flat_joined(pieces: tuple[Term, ...], dim: int) -> list[Term]:
    """The pieces with concatenations along `dim` read as their pieces, empty ones left out
    and adjacent slices of one term joined into one (exact: a concatenation is associative)."""
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
    return joined


def _make_concat(joined: list[Term], dim: int) -> tuple[Term, bool]:
    """The normal form of the concatenation of `joined` (`_flat_joined`'s pieces), and
    whether it is those pieces as they are with no two adjacent ones meeting (`_UNMET`)."""
    if len(joined) == 1:
        return joined[0], False
    constant = _joined_constant(joined, dim)
    if constant is not None:
        return constant, False
    if all(p is joined[0] for p in joined) and joined[0].shape[dim] == 1:
        return _copies(joined[0], dim, len(joined)), False
    scaled = _common_scale(joined, dim)
    if scaled is not None:
        return scaled, False
    runs_allowed = _runs_may_join(joined, dim)
    tail = _unmet_tail(joined, dim) if runs_allowed else None
    if tail is not None:
        start, out = tail
        if len(out) == len(joined) - start:
            return _plain_concat(joined, dim), True
        return make_concat(joined[:start] + out, dim), False
    lifted = _lift_elementwise(joined, dim)
    if lifted is None:
        lifted = _lift_movement(joined, dim)
    if lifted is None:
        lifted = _swap_blocks(joined, dim)
    if lifted is not None:
        return lifted, False
    runs = _adjacent_runs_joined(joined, dim) if runs_allowed else _even_runs_joined(joined, dim)
    if runs is not None:
        return make_concat(runs, dim), False
    stacked = _stacked_rows(joined, dim)
    if stacked is not None:
        return stacked, False
    return _plain_concat(joined, dim), len(joined) == 2 or runs_allowed


def _unmet_tail(pieces: list[Term], dim: int) -> tuple[int, list[Term]] | None:
    """(m, the pieces from m - 1 on with runs of adjacent ones joined, left to right) where
    the first m pieces are a concatenation known not to meet (`_UNMET`, m the longest such
    within `APPEND_REACH` of the end); None when there is none. A concatenation that did not
    meet does not meet with pieces appended but where they meet the last of its pieces or
    one another (every lift needs some column of all the pieces to meet, and a column of
    pieces that do not meet gains only its last pieces' joins); so the pieces of a stack's
    layers, appended one layer at a time, join only the new layer's runs (exact whatever it
    finds: a concatenation is associative)."""
    key = (dim, *[p.serial for p in pieces])
    for m in range(len(pieces) - 1, max(1, len(pieces) - 1 - APPEND_REACH), -1):
        if key[:m + 1] in _UNMET:
            return m - 1, _runs_of(pieces[m - 1:], dim)
    return None


def _runs_of(pieces: list[Term], dim: int) -> list[Term]:
    """The pieces with each run of adjacent ones that `make_concat` meets into something
    other than a concatenation along `dim` joined, left to right."""
    out = [pieces[0]]
    for piece in pieces[1:]:
        merged = make_concat([out[-1], piece], dim)
        if _joined(merged, dim):
            out[-1] = merged
        else:
            out.append(piece)
    return out


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
    ...]`, join layer by layer where the layers' inputs differ); None when no two adjacent
    pieces meet. Only where `_runs_may_join`."""
    if len(pieces) <= 2:
        return None
    out = _runs_of(pieces, dim)
    return out if len(out) < len(pieces) else None


def _even_runs_joined(pieces: list[Term], dim: int) -> list[Term] | None:
    """The pieces (some one row along `dim`, so `_runs_may_join` keeps them from joining in
    runs, and not all of one size along it) with each maximal run of adjacent pieces of one
    size concatenated all at once, where some run of several meets into something other than
    a concatenation along `dim`; None otherwise. Rows of one size still join all at once, in
    the form the lifts give them together; a piece of another size (two rows a device, a
    run joined before) no longer keeps them from it: six one-row blocks and a two-row block
    of `f(x)` meet as `f(x[:6])` and `f(x[6:])`, which then meet as `f(x)` (exact: a
    concatenation is associative)."""
    groups: list[list[Term]] = []
    for piece in pieces:
        if groups and groups[-1][-1].shape[dim] == piece.shape[dim]:
            groups[-1].append(piece)
        else:
            groups.append([piece])
    if len(groups) in (1, len(pieces)):
        return None
    out = [make_concat(g, dim) if len(g) > 1 else g[0] for g in groups]
    if not any(len(g) > 1 and _joined(o, dim) for g, o in zip(groups, out)):
        return None
    return out


def _runs_may_join(pieces: list[Term], dim: int) -> bool:
    """Whether `_adjacent_runs_joined` may join runs of `pieces`: not where some piece is one
    row along `dim` computed from the inputs (rows, such as a stage's layers or a
    micro-batch's rows, join in the forms the lifts give them all at once: joined in runs,
    they meet other rows in other forms); rows that are moves of one input (a grid of
    micro-batch x row slices, flattened) do join in runs, and so do one-column
    contractions (`_heads_of_contractions`)."""
    return not any(p.shape[dim] == 1 for p in pieces) or (
        _moved_argument(pieces[0], dim) is not None
        and len({_moved_argument(p, dim) for p in pieces}) == 1) \
        or _heads_of_contractions(pieces, dim)


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


def _common_scale(pieces: list[Term], dim: int) -> Term | None:
    """`c * concat(t_i)` when every piece is `c * t_i` (a `lin` of one part, no constant) with
    one coefficient `c`: exact (each element is scaled by c either way), and one form for a
    scaled concatenation whichever side negated its blocks (a RoPE backward's rotated half,
    `-sin * ct`, negated per tp block on the devices, as a whole in the reference). None
    otherwise."""
    first = pieces[0]
    if first.op != "lin" or len(first.args) != 1 or first.attrs[0] != 0:
        return None
    if any(p.op != "lin" or len(p.args) != 1 or p.attrs != first.attrs for p in pieces):
        return None
    inner = make_concat([p.args[0] for p in pieces], dim)
    return make_lin([(first.attrs[1][0], inner)], first.attrs[0], inner.shape, first.dtype)


def _lift_elementwise(pieces: list[Term], dim: int) -> Term | None:
    """`op(concat(a_i), concat(b_i))` when every piece is `op(a_i, b_i)` with one op and
    attributes (operands of the piece's shape): exact, the op works element by element. Only
    when some operand then joins (a slice meets its neighbour), so the form stays smaller."""
    first = pieces[0]
    if first.op == "lin" and all(p.op == "lin" and p.attrs[0] == first.attrs[0]
                                 and len(p.args) == len(first.args) for p in pieces):
        rows = [_aligned_parts(first, p, dim) for p in pieces]
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


def _broadcast_off(term: Term, dim: int) -> tuple | None:
    """The dims a broadcast fills other than `dim`, numbered as if `dim` were not there
    (None for other ops): what tells a broadcast of one row along `dim` (which leaves the
    unit dim out of its operand) and one of several rows apart from another broadcast."""
    if term.op != "broadcast":
        return None
    return _without([d for d in term.attrs[0] if d != dim], [dim])


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
             lambda t, dim: (t.dtype, _moved_input(_leading(t, dim))),
             lambda t, dim: (t.dtype, _near_inputs(t)))
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
kinds and broadcasts all differ; last, by the inputs each reads a few levels down
(`_near_inputs`: a SwiGLU's `up * gate * sigmoid(gate)`, its gate and up projections of a
stage's layers joined in part, which no key above tells apart)."""


NEAR_INPUTS_DEPTH = 4
"""How many levels down `_near_inputs` reads (as `terms.SKELETON_DEPTH`)."""

_NEAR_INPUTS: dict[tuple[int, int], frozenset[int]] = {}
"""`_near_inputs`'s answers by (serial, depth) (interned terms: a serial is never reused)."""

MAX_NEAR_INPUTS = 1 << 20
"""The most answers `_NEAR_INPUTS` keeps before it starts over."""


def _near_inputs(term: Term, depth: int = NEAR_INPUTS_DEPTH) -> frozenset[int]:
    """The indices of the arguments `term` reads within `depth` levels, a chain of slices,
    reshapes, broadcasts and transposes counting as none (`_moved_input`), and so a
    concatenation (its pieces read at its own level): which weights a contraction reads,
    where every layer's activations read all of them further down, alike in pieces of
    other row counts."""
    key = (term.serial, depth)
    found = _NEAR_INPUTS.get(key)
    if found is not None:
        return found
    if len(_NEAR_INPUTS) > MAX_NEAR_INPUTS:
        _NEAR_INPUTS.clear()
    kind, index = _moved_input(term)
    base = _moved_base(term)
    if kind == "arg":
        out = frozenset((index,))
    elif base.op == "concatenate":
        out = frozenset().union(*(_near_inputs(a, depth) for a in base.args))
    elif depth == 0:
        out = frozenset()
    else:
        out = frozenset().union(*(_near_inputs(a, depth - 1) for a in base.args))
    _NEAR_INPUTS[key] = out
    return out


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
    return _aligned_in_part(pieces, dim) or plain


def _aligned_in_part(pieces: list[Term], dim: int) -> list[tuple[Term, ...]] | None:
    """The pieces' commuting operands lined up where no one key tells them all apart: under
    each key in turn, an operand of the first piece whose kind is unique among its operands not
    yet lined up, with the one operand of that kind in every other piece; the last one left by
    elimination (`x * bcast(sin)` of one piece and `bcast(sin) * tanh(y)` of another: the
    broadcasts line up, then `x` with `tanh(y)`). None when some operand stays alone."""
    count = len(pieces[0].args)
    if any(len(p.args) != count for p in pieces):
        return None
    partners: list[dict[int, int]] = [{} for _ in pieces]
    for by in _ARG_KEYS:
        for k in range(count):
            if k in partners[0]:
                continue
            mine = by(pieces[0].args[k], dim)
            if [by(pieces[0].args[o], dim) for o in range(count)
                    if o not in partners[0]].count(mine) != 1:
                continue
            found = []
            for p, taken in zip(pieces, partners):
                alike = [j for j, a in enumerate(p.args)
                         if j not in taken.values() and by(a, dim) == mine]
                if len(alike) != 1:
                    break
                found.append(alike[0])
            else:
                for taken, j in zip(partners, found):
                    taken[k] = j
        left = [k for k in range(count) if k not in partners[0]]
        if len(left) == 1:
            for p, taken in zip(pieces, partners):
                taken[left[0]] = next(j for j in range(count) if j not in taken.values())
        if len(partners[0]) == count:
            return [tuple(p.args[taken[k]] for k in range(count))
                    for p, taken in zip(pieces, partners)]
    return None


def _aligned_parts(first: Term, other: Term, dim: int) -> list[Term] | None:
    """`other`'s parts (a `lin` like `first`) paired with `first`'s: each part of `first`
    with the same term in `other` at the same coefficient, where it has it; then each other
    part in turn with an unpaired part of the same coefficient, one with the same op first,
    then of the same op once a concatenation along `dim` is read by its first piece
    (`_leading`: a residual stream's input rows, joined in part, next to one row's, each
    beside the attention's contraction), then with arguments of the same ops (`_arg_ops`), with the most factors alike
    (`_factor_keys`: a rotary embedding's halves by their tables), over the same arguments
    (a broadcast of one bias at another piece's rows), with the same attributes (the
    builders order parts by serial, so pieces computed alike can list them in different
    orders); None when some part has no partner. Candidates are kept by coefficient, so
    that a sum of hundreds of parts (a residual stream) is not scanned once per part.
    Any pairing with equal coefficients is exact (a sum of concatenations is the
    concatenation of the sums, column by column); this one is the pairing that can meet."""
    (_, mine), (_, theirs) = first.attrs, other.attrs
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
    by_coef: dict = {}
    for j in range(len(other.args)):
        if j not in taken:
            by_coef.setdefault(theirs[j], []).append(j)
    features = {j: _pairing_features(other.args[j], dim)
                for free in by_coef.values() for j in free}
    for slot, (coef, part) in enumerate(zip(mine, first.args)):
        if out[slot] is not None:
            continue
        free = by_coef.get(coef)
        if not free:
            return None
        mine_of = _pairing_features(part, dim)
        best = min(free, key=lambda j: (*_pairing_rank(features[j], mine_of), j))
        free.remove(best)
        out[slot] = other.args[best]
    return out  # type: ignore[return-value]


def _pairing_features(term: Term, dim: int) -> tuple:
    """What `_aligned_parts` ranks a partner by, computed once per part: the term, its op,
    its leading piece's op along `dim`, its arguments' ops, its movement chain, its factor
    keys, its arguments and attributes."""
    return (term, term.op, _leading(term, dim).op, _arg_ops(term), _moved_by(term),
            _factor_keys(term), tuple(a.serial for a in term.args), term.attrs)


def _pairing_rank(theirs: tuple, mine: tuple) -> tuple:
    """How well a part (`_pairing_features`) pairs with one of the first piece's, least
    best: the same term, the same op, the same leading piece's op, arguments of the same
    ops, the same movements, the most factors alike, the same arguments, the same
    attributes."""
    term, op, leading, arg_ops, moved, factors, args, attrs = theirs
    return (term is not mine[0], op != mine[1], leading != mine[2], arg_ops != mine[3],
            moved != mine[4], -len(factors & mine[5]), args != mine[6], attrs != mine[7])


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
    as `slice_of_reshape` builds it, that candidate's row j along `dim`, and a concatenation
    of a term's rows is the term. None otherwise."""
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
    candidate = _reshape_sliced(slice_term(read, dim, first, first + len(pieces)))
    if any(_reshape_sliced(slice_term(candidate, dim, j, j + 1)) is not p
           for j, p in enumerate(pieces)):
        return None
    return candidate


def _reshape_sliced(term: Term) -> Term:
    """A slice of a reshape as the reshape of its operand's box (`slice_of_reshape`), else the
    term: the one identity `_strided_rows` needs to read its candidate's rows."""
    if term.op == "slice" and term.args[0].op == "reshape":
        pushed = slice_of_reshape(term.args[0], *term.attrs)
        if pushed is not None:
            return pushed
    return term


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


def reshape_of_concat(term: Term, arg: Term) -> Term | None:
    """`reshape(concat(p_i along c))` where c is the major (first non-unit) dim of the dims
    the reshape regroups it with: the concatenation of the pieces reshaped, along the major
    non-unit dim t of the group the reshape makes (row-major order keeps each piece's
    elements of the group one run, and a run whose bounds are multiples of what t's
    rows hold, the product of the group's dims after t, is whole rows of t: the merge of
    an untiled all_gather, the split of four copies of a (8, 2) table into (4, 8, 2));
    pieces dividing a row of t are joined, consecutive ones, into runs of one row each (the
    reshape of each run's concatenation, whose split then falls on the next dim: one row a
    device, two rows a micro-batch); else None."""
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
        pieces, run, size = [], [], 0
        for piece in arg.args:
            if any(piece.shape[i] != arg.shape[i] for i in range(len(arg.shape)) if i != c):
                return None
            own = piece.shape[c] * inner
            if own % row and row % own:
                return None
            run.append(piece)
            size += own
            if size % row:
                continue
            if len(run) > 1 and size != row:
                return None
            shape = list(term.shape)
            shape[t] = size // row
            joined = run[0] if len(run) == 1 else make_concat(run, c)
            pieces.append(make_reshape(joined, tuple(shape)))
            run, size = [], 0
        return make_concat(pieces, t) if not run else None
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
