"""Slices taken into the ops under them: a slice of a reshape as the reshape of a box of
its operand (`slice_of_reshape`), of a reduction as the reduction of the operand's rows
(`slice_through`, `slice_of_reduction`).

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

import math

from entangle_mlir.core import selection
from entangle_mlir.core.normal_form.pieces import _REDUCTIONS, _slice
from entangle_mlir.core.normal_form.squeeze import squeeze
from entangle_mlir.core.terms import Term, make_op, make_reshape, reshape_groups


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
