"""The reduced local shapes of a shape-uniform op: every dim > 1 shrinks to a small size, dims
tied by the op's attributes stay tied, and a dim a slice cuts or a pad pads keeps its parts."""

from __future__ import annotations

import math
from collections.abc import Sequence

from entangle_mlir.core.terms import reshape_groups
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.dispatch import TRANSPARENT
from entangle_mlir.semantics.ops import dimension_numbers

REDUCED_LOCAL = 2
"""The local size every dim > 1 gets at a reduced shape."""


def capped(size: int, cap: int = REDUCED_LOCAL) -> int:
    """A dim's size at a reduced shape: at most `cap`, a size of 0 or 1 kept."""
    return size if size <= 1 else min(size, cap)


_SAME_SHAPE_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.collective_permute")
_SAME_SHAPE = (*_SAME_SHAPE_COLLECTIVES, *TRANSPARENT)
"""Ops whose i-th result has the i-th operand's shape (collectives and the ops that pass
their operands through, a copy)."""


Where = tuple[str, int, int]
"""A dim of an operand ("in", index, dim) or of a result ("out", index, dim)."""


class _NotBlocks(Exception):
    """A dim of blocks whose size is no whole number of blocks."""


def reduced_types(info: OpInfo, cap: int, blocks: dict[Where, tuple[int, int]] | None = None
                  ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]] | None:
    """New local operand and result shapes for a shape-uniform op, else None.

    `blocks`: dims holding equal blocks (a `Reordered` or `Returning` value's dim), each with
    its block size b and the size p a block shrinks to: such a dim of size k*b becomes k*p
    (and a slice of whole blocks stays one), every other dim is capped at `cap`. Only for
    the ops whose dims are tied one to one (elementwise, collective_permute and all_reduce,
    transpose, broadcast_in_dim, dot_general, reduce, slice, concatenate, reshapes that keep
    the dims of blocks); None for the others."""
    try:
        return _reduced_types(info, cap, blocks or {})
    except _NotBlocks:
        return None


def _reduced_types(info: OpInfo, cap: int, blocks: dict[Where, tuple[int, int]]
                   ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]] | None:
    ops = [tuple(t.shape) for t in info.operand_types]
    res = [tuple(t.shape) for t in info.result_types]
    name, a = info.name, info.attrs

    def c(s: int, *where: Where) -> int:
        for w in where:
            if w in blocks:
                size, kept = blocks[w]
                if s % size:
                    raise _NotBlocks
                return s // size * kept
        return capped(s, cap)

    if name in ELEMENTWISE_OPS or name in _SAME_SHAPE:
        if name in ELEMENTWISE_OPS:
            rank = len(res[0])
            tied = [i for i, o in enumerate(ops) if len(o) == rank]
            new_res = [tuple(c(s, ("out", 0, d), *(("in", i, d) for i in tied))
                             for d, s in enumerate(res[0]))]
            new_ops = [new_res[0] if len(o) == rank else o for o in ops]
            if any(len(o) == rank and o != res[0] for o in ops):
                return None
            return new_ops, new_res
        new_ops = [tuple(c(s, ("in", i, d), ("out", i, d)) for d, s in enumerate(o))
                   for i, o in enumerate(ops)]
        return new_ops, list(new_ops)
    if blocks and name not in _BLOCK_OPS:
        return None
    if name == "stablehlo.gather" and len(ops) == 2:
        return _reduced_gather(info, ops, res, c)
    if name == "stablehlo.scatter" and len(ops) == 3:
        return _reduced_scatter(info, ops, c)
    if name == "stablehlo.convolution" and len(ops) == 2 and "input_batch" in a:
        # batch and feature dims capped; spatial dims (the windows) kept
        lhs, rhs, out = list(ops[0]), list(ops[1]), list(res[0])
        lhs[a["input_batch"]] = out[a["output_batch"]] = c(lhs[a["input_batch"]])
        lhs[a["input_feature"]] = rhs[a["kernel_input_feature"]] = c(lhs[a["input_feature"]])
        rhs[a["kernel_output_feature"]] = out[a["output_feature"]] = c(
            rhs[a["kernel_output_feature"]])
        return [tuple(lhs), tuple(rhs)], [tuple(out)]
    if name == "stablehlo.sort" and ops and all(o == ops[0] for o in ops):
        dim = a["dimension"]  # the sorted dim kept whole, the others capped
        new = tuple(size if d == dim else c(size) for d, size in enumerate(ops[0]))
        return [new] * len(ops), [new] * len(res)
    if name == "stablehlo.case":  # the index, then each branch's results, each one a result's
        new_res = [tuple(c(s) for s in r) for r in res]
        branch = ops[1:]
        if not res or len(branch) % len(res) or any(
                o != res[k % len(res)] for k, o in enumerate(branch)):
            return None
        return [ops[0]] + [new_res[k % len(res)] for k in range(len(branch))], new_res
    if name in ("chlo.top_k", "mhlo.topk") and len(ops) == 1 and ops[0]:
        # the rows capped (the claim is per row); the selected dim kept whole: each result
        # reads the whole row, which k of its N entries are chosen depends on N (k = N
        # sorts), and the indices are positions in it: a smaller N is another instance
        lead = tuple(c(s) for s in ops[0][:-1])
        return [lead + ops[0][-1:]], [lead + r[-1:] for r in res]
    if name == "stablehlo.iota" or name == "stablehlo.constant" and a.get("splat"):
        return [], [tuple(c(size) for size in res[0])]
    if name == "stablehlo.reshape":
        pairs = _reduced_reshape(ops[0], res[0], c, blocks)
        return None if pairs is None else ([pairs[0]], [pairs[1]])
    if name == "stablehlo.slice":
        return _reduced_slice(a, ops[0], res[0],
                              lambda size, d: c(size, ("in", 0, d), ("out", 0, d)))
    if name == "stablehlo.pad" and len(ops) == 2:
        return _reduced_pad(a, ops, res, c)
    if name == "stablehlo.concatenate":
        dim = a["dimension"]
        new_ops = [tuple(c(size, ("in", i, d), *((("out", 0, d),) if d != dim else ()))
                         for d, size in enumerate(o)) for i, o in enumerate(ops)]
        if any(len(o) != len(res[0]) for o in ops):
            return None
        out = list(new_ops[0])
        out[dim] = sum(o[dim] for o in new_ops)
        return new_ops, [tuple(out)]
    if name == "stablehlo.transpose":
        perm = list(a["permutation"])
        new_op = tuple(c(s, ("in", 0, d), ("out", 0, perm.index(d)))
                       for d, s in enumerate(ops[0]))
        return [new_op], [tuple(new_op[p] for p in perm)]
    if name == "stablehlo.broadcast_in_dim":
        dims = list(a["broadcast_dimensions"])
        new_res = tuple(c(s, ("out", 0, d), *((("in", 0, dims.index(d)),) if d in dims else ()))
                        for d, s in enumerate(res[0]))
        new_op = tuple(new_res[d] if ops[0][i] == res[0][d] else ops[0][i]
                       for i, d in enumerate(dims))
        if any(ops[0][i] not in (1, res[0][d]) for i, d in enumerate(dims)):
            return None
        return [new_op], [new_res]
    if name == "stablehlo.dot_general":
        lb, rb, lc, rc = a.get("lhs_batch", ()), a.get("rhs_batch", ()), a["lhs_contract"], \
            a["rhs_contract"]
        lb, rb, lc, rc = list(lb), list(rb), list(lc), list(rc)
        lf = [d for d in range(len(ops[0])) if d not in lb and d not in lc]
        rf = [d for d in range(len(ops[1])) if d not in rb and d not in rc]

        def lhs_where(d: int) -> tuple[Where, ...]:
            if d in lb:
                return ("in", 0, d), ("in", 1, rb[lb.index(d)]), ("out", 0, lb.index(d))
            if d in lc:
                return ("in", 0, d), ("in", 1, rc[lc.index(d)])
            return ("in", 0, d), ("out", 0, len(lb) + lf.index(d))

        lhs = tuple(c(s, *lhs_where(d)) for d, s in enumerate(ops[0]))
        rhs = [c(s, ("in", 1, d), ("out", 0, len(lb) + len(lf) + rf.index(d))) if d in rf
               else 0 for d, s in enumerate(ops[1])]
        for x, y in zip(lb + lc, rb + rc):
            rhs[y] = lhs[x]
        out = tuple(lhs[d] for d in lb) + tuple(lhs[d] for d in lf) + tuple(rhs[d] for d in rf)
        return [lhs, tuple(rhs)], [out]
    if name == "stablehlo.reduce":
        if len(ops) not in (2, 4) or len(ops) == 4 and ops[0] != ops[1]:
            return None
        dims = a["dimensions"]
        out = [d for d in range(len(ops[0])) if d not in dims]
        x = tuple(c(s, ("in", 0, d), *((("out", 0, out.index(d)),) if d in out else ()))
                  for d, s in enumerate(ops[0]))
        kept = tuple(s for d, s in enumerate(x) if d not in dims)
        if len(ops) == 4:  # argmax / argmin: values and indices alike, scalar inits
            return [x, x, ops[2], ops[3]], [kept, kept]
        return [x, ops[1]], [kept]
    if name == "stablehlo.all_gather":
        dim = a["all_gather_dim"]
        new_ops, new_res = [], []
        for o, r in zip(ops, res):
            x = tuple(c(s) for s in o)
            factor = r[dim] // o[dim] if o[dim] else 0
            new_ops.append(x)
            new_res.append(x[:dim] + (x[dim] * factor,) + x[dim + 1:])
        return new_ops, new_res
    if name == "stablehlo.reduce_scatter":
        dim = a["scatter_dimension"]
        r = tuple(c(s) for s in res[0])
        factor = ops[0][dim] // res[0][dim] if res[0][dim] else 0
        return [r[:dim] + (r[dim] * factor,) + r[dim + 1:]], [r]
    if name == "stablehlo.all_to_all":
        split, concat = a["split_dimension"], a["concat_dimension"]
        count = a.get("split_count")
        new_ops, new_res = [], []
        for o in ops:
            if not count or o[split] % count:
                return None
            x = [c(s) for s in o]
            x[split] = c(o[split] // count) * count
            y = list(x)
            y[split] //= count
            y[concat] *= count
            new_ops.append(tuple(x))
            new_res.append(tuple(y))
        return new_ops, new_res
    return None


OFFSET_OPS = ("stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice")
"""Ops reading or writing a window at start indices given as operands (`reduced_offset_types`)."""


def reduced_offset_types(info: OpInfo, starts: Sequence[int], cap: int):
    """A dynamic_slice or dynamic_update_slice at constant starts, at a reduced shape, as
    `_reduced_slice` reduces a slice: a dim the window takes whole shrinks (window and result
    with it), a dim it cuts keeps its three parts (before, inside, after the window), each
    shrunk, and its start becomes the shrunk `before`. (operand shapes, result shapes,
    attributes, starts); None for a start outside [0, size - window] (the op clamps it: the
    reduced window would not be the clamped one's image) or an op of another arity."""
    ops = [tuple(t.shape) for t in info.operand_types]
    first = OFFSET_OPS.index(info.name) + 1  # the operand index of the first start
    operand = ops[0]
    window = tuple(info.attrs["slice_sizes"]) if first == 1 else ops[1]
    if len(window) != len(operand) or len(starts) != len(operand) or len(ops) != first + len(
            operand):
        return None
    new_operand, new_window, new_starts = [], [], []
    for size, width, start in zip(operand, window, starts):
        if not 0 <= start <= size - width:
            return None
        if (start, width) == (0, size):
            new_operand.append(capped(size, cap))
            new_window.append(capped(size, cap))
            new_starts.append(0)
            continue
        before, inside, after = segments(start, start + width, size, lambda n: capped(n, cap))
        new_operand.append(before + inside + after)
        new_window.append(inside)
        new_starts.append(before)
    scalars = ops[first:]
    if first == 1:
        return ([tuple(new_operand), *scalars], [tuple(new_window)],
                {"slice_sizes": tuple(new_window)}, new_starts)
    return [tuple(new_operand), tuple(new_window), *scalars], [tuple(new_operand)], {}, new_starts


def segments(start: int, stop: int, size: int, c) -> tuple[int, int, int]:
    """A cut [start, stop) of a dim of `size` as (before, inside, after), each capped: the
    reduced dim keeps which of the three parts exist and shrinks each to at most `cap`."""
    return c(start), c(stop - start), c(size - stop)


_BLOCK_OPS = frozenset({"stablehlo.transpose", "stablehlo.broadcast_in_dim",
                        "stablehlo.dot_general", "stablehlo.reduce", "stablehlo.slice",
                        "stablehlo.concatenate", "stablehlo.reshape"})
"""The ops besides elementwise ones and same-shape collectives `reduced_types` reduces with
dims of blocks."""


def _reduced_slice(attrs: dict, operand: tuple[int, ...], result: tuple[int, ...], c):
    """Dims the slice takes whole shrink (their limit with them); a dim it cuts with stride 1
    keeps its three parts (before, inside, after the window), each shrunk, so the reduced
    slice still drops rows on the same sides (a layer of a stacked weight, RoPE's halves).
    Other dims keep their size and window. `c(size, dim)`: a size of operand dim `dim`
    reduced."""
    starts, limits = tuple(attrs["start_indices"]), tuple(attrs["limit_indices"])
    strides = tuple(attrs.get("strides") or (1,) * len(starts))
    new_op, new_res, new_starts, new_limits = [], [], [], []
    for d, size in enumerate(operand):
        if (starts[d], limits[d], strides[d]) == (0, size, 1):
            new_op.append(c(size, d))
            new_res.append(c(size, d))
            new_starts.append(0)
            new_limits.append(c(size, d))
        elif strides[d] == 1 and 0 <= starts[d] <= limits[d] <= size:
            before, inside, after = segments(starts[d], limits[d], size,
                                             lambda s, d=d: c(s, d))
            new_op.append(before + inside + after)
            new_res.append(inside)
            new_starts.append(before)
            new_limits.append(before + inside)
        else:
            new_op.append(size)
            new_res.append(result[d])
            new_starts.append(starts[d])
            new_limits.append(limits[d])
    return [tuple(new_op)], [tuple(new_res)], {"start_indices": tuple(new_starts),
                                               "limit_indices": tuple(new_limits)}


def _reduced_pad(attrs: dict, ops, res, c):
    """Dims padded without interior padding keep their three parts (low padding, data, high
    padding), each shrunk; other dims keep their size and padding."""
    low, high = list(attrs["edge_padding_low"]), list(attrs["edge_padding_high"])
    interior = tuple(attrs["interior_padding"])
    new_op, new_res = [], []
    for d, size in enumerate(ops[0]):
        if interior[d] == 0 and low[d] >= 0 and high[d] >= 0:
            low[d], high[d] = c(low[d]), c(high[d])
            new_op.append(c(size))
            new_res.append(low[d] + c(size) + high[d])
        else:
            new_op.append(size)
            new_res.append(res[0][d])
    return ([tuple(new_op), ops[1]], [tuple(new_res)],
            {"edge_padding_low": tuple(low), "edge_padding_high": tuple(high)})


def _reduced_gather(info: OpInfo, ops, res, c):
    """Indexed operand dims and full windows shrink; partial windows keep their size."""
    dims = dimension_numbers(info.attrs, "dimension_numbers")
    sizes = tuple(info.attrs["slice_sizes"])
    operand, indices = ops
    ivd = dims.get("index_vector_dim", len(indices))
    if len(res[0]) != len(dims.get("offset_dims", ())) + (
            len(indices) - (1 if ivd < len(indices) else 0)):
        return None
    new_operand, new_sizes = list(operand), list(sizes)
    batching = dims.get("operand_batching_dims", ())
    for d, (size, window) in enumerate(zip(operand, sizes)):
        if d in batching:
            new_operand[d] = c(size)
        elif window == size:
            new_operand[d] = new_sizes[d] = c(size)
        elif d in dims.get("start_index_map", ()) and window <= c(size):
            new_operand[d] = c(size)
    new_indices = tuple(size if d == ivd else c(size) for d, size in enumerate(indices))
    batch = [size for d, size in enumerate(new_indices) if d != ivd]
    windows = [new_sizes[d] for d in range(len(operand))
               if d not in dims.get("collapsed_slice_dims", ())]
    out, batch_iter, window_iter = [], iter(batch), iter(windows)
    for d in range(len(res[0])):
        out.append(next(window_iter) if d in dims.get("offset_dims", ()) else next(batch_iter))
    return [tuple(new_operand), new_indices], [tuple(out)], {"slice_sizes": tuple(new_sizes)}


def _reduced_scatter(info: OpInfo, ops, c):
    """Scattered operand dims, the updates' scatter dims and full windows shrink."""
    dims = dimension_numbers(info.attrs, "scatter_dimension_numbers")
    operand, indices, updates = ops
    ivd = dims.get("index_vector_dim", len(indices))
    window_dims = dims.get("update_window_dims", ())
    batching = dims.get("input_batching_dims", ())
    operand_window = [d for d in range(len(operand))
                      if d not in dims.get("inserted_window_dims", ()) and d not in batching]
    new_operand, new_updates = list(operand), list(updates)
    for k, d in enumerate(operand_window):
        u = window_dims[k]
        if updates[u] == operand[d]:
            new_operand[d] = new_updates[u] = c(operand[d])
    for d in tuple(dims.get("inserted_window_dims", ())) + tuple(batching):
        new_operand[d] = c(operand[d])
    scatter_dims = [d for d in range(len(updates)) if d not in window_dims]
    batch = [d for d in range(len(indices)) if d != ivd]
    if len(scatter_dims) != len(batch):
        return None
    new_indices = list(indices)
    for u, i in zip(scatter_dims, batch):
        new_updates[u] = new_indices[i] = c(updates[u])
    return ([tuple(new_operand), tuple(new_indices), tuple(new_updates)],
            [tuple(new_operand)])


def _reduced_reshape(src: tuple[int, ...], dst: tuple[int, ...], c, blocks: dict
                     ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A reshape at a reduced shape when every dim group is a pure merge or a pure split
    (row-major structure kept: merged dims shrink, the merged dim is their product). A dim of
    blocks (`blocks`) only where it is kept (one dim to one dim)."""
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    new_src, new_dst = list(src), list(dst)
    for src_dims, dst_dims in groups:
        big_src = [d for d in src_dims if src[d] != 1]
        big_dst = [d for d in dst_dims if dst[d] != 1]
        if len(big_src) > 1 and len(big_dst) > 1:
            return None
        if len(big_src) == 1 and len(big_dst) == 1:
            tied = (("in", 0, big_src[0]), ("out", 0, big_dst[0]))
            new_src[big_src[0]] = new_dst[big_dst[0]] = c(src[big_src[0]], *tied)
            continue
        if any(("in", 0, d) in blocks for d in src_dims) or any(
                ("out", 0, d) in blocks for d in dst_dims):
            return None
        if len(big_src) <= 1 and len(big_dst) <= 1:
            for d in big_src:
                new_src[d] = c(src[d])
            for d in big_dst:
                new_dst[d] = c(dst[d])
        elif len(big_src) > 1:
            for d in big_src:
                new_src[d] = c(src[d])
            new_dst[big_dst[0]] = math.prod(new_src[d] for d in big_src)
        else:
            for d in big_dst:
                new_dst[d] = c(dst[d])
            new_src[big_src[0]] = math.prod(new_dst[d] for d in big_dst)
    return tuple(new_src), tuple(new_dst)
