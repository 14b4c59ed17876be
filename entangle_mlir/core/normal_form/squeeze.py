"""A reshape that only leaves out unit dims, taken to the operands (`squeeze`), and a
reduction keeping its operand's unit dims (`unit_kept_reduction`).

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

from entangle_mlir.core import selection
from entangle_mlir.core.normal_form.pieces import (
    _ELEMENTWISE,
    _REDUCTIONS,
    _dropped,
    _KeptApart,
    _less,
    _rebuilt,
    _slice,
    _without,
)
from entangle_mlir.core.terms import (
    Term,
    linear_parts,
    make_broadcast,
    make_dot,
    make_lin,
    make_op,
    make_reshape,
    make_transpose,
)


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
        out = _squeeze(term, tuple(shape), gone, False, _squeezed())
    except _KeptApart:
        return None
    return None if out.op == "reshape" and out.args[0] is term else out


def _squeeze_or_reshape(term: Term, shape: tuple[int, ...]) -> Term:
    out = squeeze(term, shape)
    return out if out is not None else make_reshape(term, shape)


def _squeeze(term: Term, shape: tuple[int, ...], gone: list[int], reduced: bool,
             memo: dict) -> Term:
    """`squeeze`'s recursion, once per shared subterm (`memo`: a program's terms are a DAG,
    and walking it as a tree is exponential in its depth); `reduced`: a reduction lies above
    (see `_KeptApart`). A walk that raised `_KeptApart` is remembered as such (it depends on
    the key only)."""
    key = (term.serial, shape, tuple(gone), reduced)
    found = memo.get(key)
    if found is None:
        try:
            found = _squeeze_step(term, shape, gone, reduced, memo)
        except _KeptApart:
            memo[key] = _KEPT_APART
            raise
        memo[key] = found
    elif found is _KEPT_APART:
        raise _KeptApart()
    return found


def _squeezed() -> dict:
    """The memo every `squeeze` walk shares (`_SQUEEZED`), emptied first when full."""
    if len(_SQUEEZED) >= MAX_SQUEEZED:
        _SQUEEZED.clear()
    return _SQUEEZED


_SQUEEZED: dict[tuple, object] = {}
"""`_squeeze`'s answers by (serial, shape, dims left out, under a reduction), kept across
walks (interned terms: a serial is never reused; each answer is the same builders' term of
the same arguments a new walk would build, or `_KEPT_APART`): a stack's backward reduces
each layer's terms keeping a unit batch row (`unit_kept_reduction`), and a walk of its own
for each would walk every layer below again (quadratic in the layers)."""

MAX_SQUEEZED = 1 << 18
"""The most answers `_SQUEEZED` keeps before it starts over."""

_KEPT_APART = object()
"""`_SQUEEZED`'s mark of a walk that raised `_KeptApart`."""


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
        inner = _squeeze(arg, _less(arg.shape, units), units, True, _squeezed())
    except _KeptApart:
        return None
    if inner.op == "reshape" and inner.args[0] is arg:
        return None
    shape = tuple(n for n in term.shape if n != 1)
    summed = make_op(term.op, (inner,), (_without(reduced, units),) + term.attrs[1:], shape,
                     term.dtype, linear_in=0 if term.op == "reduce_sum" else None)
    return make_reshape(summed, term.shape)
