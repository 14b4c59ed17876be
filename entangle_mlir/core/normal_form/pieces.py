"""Small shared pieces of the normal form: row slices of a term, windows and adjacent
slices, the op families the identities name, the inputs a term moves, first slices.

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

from entangle_mlir.core.terms import Term, intern, make_op, rebuild_elementwise
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


_COMMUTES = frozenset({"mul"} | {op for op, t in ELEMENTWISE_OPS.items() if t.commutes})


_MOVES = frozenset({"slice", "reshape", "broadcast", "transpose"})


def _rebuilt(term: Term, args: tuple[Term, ...]) -> Term:
    """`rebuild_elementwise`, but a product of operands of other element types than its own
    (an i1 mask times i32 values, an i32 product) keeps its element type: the builder would
    take the first operand's."""
    if term.op == "mul" and any(a.dtype != term.dtype for a in args):
        shape = args[0].shape
        return intern("mul", tuple(sorted(args, key=lambda t: t.serial)), (), shape,
                      term.dtype)
    return rebuild_elementwise(term, args)


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


_PROMISES = ("unique_indices", "indices_are_sorted")
"""Attributes promising something of the indices that joined indices need not keep (where
broken, the op's result is implementation-defined): no join is made under them."""


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
_SLICES: dict[int, tuple[tuple[Term, ...], bool]] = {}
"""serial -> (the first slices under the term in `subterms` order, whether they are all of
them): `first_slices` for the largest count asked (terms are interned and immutable)."""

MAX_SLICES_KEPT = 1 << 20
"""The most answers `_SLICES` keeps before it starts over (as `sums._JOIN_KEYS` and
`concat._NEAR_INPUTS` do: a long-lived process checks many programs)."""


def first_slices(term: Term, count: int = MAX_SLICES_SEEN) -> tuple[Term, ...]:
    """The first `count` slices under `term` in `subterms` order, memoized: joining a long
    sum asks for the same pieces' slices once per pair, and for pieces built around pieces
    asked before (`_walk_slices`)."""
    found = _SLICES.get(term.serial)
    if found is None or not (found[1] or len(found[0]) >= count):
        slices = _walk_slices(term, count)
        if len(_SLICES) > MAX_SLICES_KEPT:
            _SLICES.clear()
        found = _SLICES[term.serial] = (slices, len(slices) < count)
    return found[0][:count]


def _walk_slices(term: Term, count: int) -> tuple[Term, ...]:
    """`subterms([term])`'s first `count` slices, a subterm whose slices are known
    (`_SLICES`: all of them, or `count` at least) read from there instead of walked.

    Exact: `subterms` is a depth-first pre-order (a popped term's arguments are walked before
    anything pushed earlier), so when it first pops a subterm u, the terms it has seen under
    u are whole walked sub-DAGs; it then yields u's own walk less those, whose slices are
    u's first slices less the slices yielded so far. Terms under u are not marked seen here:
    met again, they yield only slices already yielded (they lie under u)."""
    out: list[Term] = []
    yielded: set[Term] = set()
    seen: set[Term] = set()
    stack = [term]
    while stack and len(out) < count:
        top = stack.pop()
        if top in seen:
            continue
        seen.add(top)
        known = _SLICES.get(top.serial) if top is not term else None
        if known is not None and (known[1] or len(known[0]) >= count):
            if not yielded.issuperset(known[0]):
                for u in known[0]:
                    if u not in yielded:
                        yielded.add(u)
                        out.append(u)
            continue
        if top.op == "slice" and top not in yielded:
            yielded.add(top)
            out.append(top)
        stack.extend(top.args)
    return tuple(out[:count])


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


def _first_slice_start(term: Term, dim: int) -> tuple | None:
    """(base serial, starts) of the first slice among `term`'s subterms (depth first, in
    `subterms` order), or None."""
    found = first_slices(term, 1)
    return (found[0].args[0].serial, found[0].attrs[0]) if found else None


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


def _less(shape: tuple[int, ...], gone) -> tuple[int, ...]:
    return tuple(n for d, n in enumerate(shape) if d not in gone)


def _slice(x: Term, starts, limits, strides) -> Term:
    shape = tuple(len(range(a, b, c)) for a, b, c in zip(starts, limits, strides))
    return make_op("slice", (x,), (tuple(starts), tuple(limits), tuple(strides)), shape,
                   x.dtype, linear_in=0)
