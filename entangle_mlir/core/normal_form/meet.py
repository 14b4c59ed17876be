"""Meeting two normal forms without Z3: `blocks_meet` (sums over every element across
shapes and tiles, row block by row block, `congruent` operands position by position,
`split_like` cutting one side's contraction into the other's parts) and `generic_element`
(an elementwise equality decided at one generic element).

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

from entangle_mlir.core.normal_form.concat import _near_inputs
from entangle_mlir.core.normal_form.pieces import (
    _COMMUTES,
    _ELEMENTWISE,
    MAX_SLICES_SEEN,
    _contraction_key,
    _rebuilt,
    _sum_view,
    _summed_dims,
    slice_term,
)
from entangle_mlir.core.normal_form.rewrite import normal_form
from entangle_mlir.core.normal_form.sums import _orders, _peel, _wrap
from entangle_mlir.core.terms import (
    Term,
    intern,
    linear_parts,
    make_dot,
    make_lin,
    make_op,
    make_reshape,
    make_splat,
    skeleton,
    subterms,
)


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
    value): operands of the same shapes, operands in common, the same inputs read (a SwiGLU's
    `gate` and `up` contractions, whose skeletons tie, read different weights), one
    skeleton."""
    return ([a.shape for a in x.args] == [b.shape for b in y.args],
            sum(1 for a in x.args if any(a is b for b in y.args)),
            _near_inputs(x) == _near_inputs(y), skeleton(x) == skeleton(y))




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
