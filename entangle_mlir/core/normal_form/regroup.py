"""Dims regrouped through reductions and contractions: block sums (`sum_of_blocks`),
reshapes through reductions, contractions and broadcasts, adjacent summed or contracted
dims merged, a transpose of a contraction as the contraction with its operands swapped.

Part of `entangle_mlir.core.normal_form` (the package docstring lists every identity)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

from entangle_mlir.core.normal_form.pieces import _REDUCTIONS, slice_term
from entangle_mlir.core.terms import (
    Term,
    make_broadcast,
    make_dot,
    make_lin,
    make_op,
    make_reshape,
    reshape_groups,
)

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
