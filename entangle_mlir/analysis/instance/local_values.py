"""Each device's local value of a global value under its relation (`core/relations.py`
gives their meaning): its block (tiled dims split, poly dims whole), another device's block, a
halo window, a shifted or reordered block, a device mask; and a term evaluated on one block only
(`region_value`), which keeps the cost nearly flat in mesh size."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import z3

from entangle_mlir.analysis.instance.sources import Failure, LazyLeaves
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import (
    BlockIndex,
    InBlock,
    Masked,
    Permuted,
    Rel,
    Reordered,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.core.terms import (
    ARITHMETIC_TERM_OPS,
    ELEMENTWISE_STABLEHLO,
    Term,
    reshape_groups,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.semantics.element import (
    add,
    compare,
    int_limits,
    is_z3,
    maximum,
    minimum,
    mul,
    range_periods,
    select,
    sub,
    to_z3,
    wrap_int,
    wrap_shift,
)
from entangle_mlir.semantics.evaluate import evaluate_node, evaluate_term, wrap_node
from entangle_mlir.semantics.ops import WRAPPED_OPS, dimension_numbers
from entangle_mlir.semantics.tensor import (
    apply,
    broadcast_in_dim,
    concatenate,
    dot_general,
    full,
    reduce_dims,
    take,
    top_k,
    transpose,
)


def derived_local(global_value: np.ndarray, value: Permuted | Windowed | Shifted | Reordered,
                  mesh: Mesh, device: int) -> np.ndarray:
    """Device `device`'s local value of a value derived from a Rel whose global value is
    `global_value`: another device's block, a halo window, the block plus a device constant, or the
    blocks of a dim in the device's order."""
    if isinstance(value, Permuted):
        return device_block(global_value, value.rel, mesh, value.sources[device], False)
    if isinstance(value, Reordered):
        whole = device_block(global_value, value.rel, mesh, device, False)
        order = value.orders[device]
        size = whole.shape[value.dim] // len(order)
        return np.concatenate([np.take(whole, range(b * size, (b + 1) * size), axis=value.dim)
                               for b in order], axis=value.dim)
    if isinstance(value, Windowed):
        return _window_rows(global_value, value, mesh, device)
    block = device_block(global_value, value.rel, mesh, device, False)
    dtype = value.rel.term.dtype  # the device adds in its dtype: integers wrap around
    return apply(lambda x, o=value.offsets[device]: wrap_shift(x, o, dtype), block)


def block_local(value: Value, env: dict, memo: dict, mesh: Mesh, device: int,
                junk: np.ndarray | None, regions: dict | None = None,
                index: Callable[[tuple[str, ...]], object] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(local value, where it is defined) on `device` of an `InBlock`, `BlockIndex` or
    `Masked` value (core/relations.py gives their exact meaning). A masked value that is unspecified
    outside its predicate takes `junk` there (an input), or is left open (a result: only the
    defined positions are claimed). Each relation's term is evaluated on the device's block
    only (`region_value`; `regions` its memo): the cost stays flat in the mesh size.
    `index`: the device's block index along some mesh axes (default `device`'s; a z3 term
    for every device of a class at once, `symbolic_device`)."""
    regions = {} if regions is None else regions

    def block(rel: Rel) -> np.ndarray:
        return region_value(rel.term, block_region(rel, mesh, device), env, memo, regions)

    def start_of(axes: tuple[str, ...], length: int):
        if index is None:
            return mesh.block_index(axes, device) * length
        return mul(index(axes), length)

    def test(pred: InBlock) -> np.ndarray:
        x = block(pred.rel)
        start = start_of(pred.axes, pred.length)

        def holds(v):
            y = sub(v, start)
            parts = [([compare(y, lo, "GE")] if lo is not None else []) + (
                [compare(y, hi, "LT")] if hi is not None else []) for lo, hi in pred.ranges]
            if any(is_z3(c) for conds in parts for c in conds):
                return z3.Or(*[z3.And(*[to_z3(c) for c in conds]) for conds in parts])
            return any(all(conds) for conds in parts)
        return apply(holds, x)

    if isinstance(value, InBlock):
        out = test(value)
        return out, full(out.shape, True)
    if isinstance(value, BlockIndex):
        x = block(value.rel)
        start = start_of(value.axes, value.length)
        dtype = value.rel.term.dtype
        if value.clamp is not None:
            last = (mesh.group_size(value.axes) - 1) * value.length
            out = apply(lambda v: add(_clamped_difference(v, start, dtype, value.clamp,
                                                          value.length, last), value.add), x)
            return out, full(out.shape, True)
        inside = test(InBlock.block(value.rel, value.axes, value.length))
        # inside the block x - start does not wrap (0 <= x - start < length): the exact
        # difference is the device's, and Z3 decides it without the wrap-around's cases
        out = apply(lambda v, p: add(select(p, sub(v, start), value.fill), value.add),
                    x, inside)
        return out, full(out.shape, True)
    assert isinstance(value, Masked)
    data = block(value.rel)
    pred = test(value.pred)
    if value.zero:
        out = apply(lambda p, v: select(p, v, 0), pred, data)
        return out, full(out.shape, True)
    if junk is not None:
        return apply(select, pred, data, junk), full(data.shape, True)
    return data, pred


def _clamped_difference(v, start, dtype: str, bounds: tuple, length: int,
                        last: int) -> object:
    """`clamp(x - start, lo, hi)` with the difference computed in `dtype` (wrapping around),
    for `x` a value of the dtype (`BlockIndex.clamp`): the exact difference y, except where
    it leaves the dtype's range (y < min for start > 0, y > max for start < 0), where the
    wrapped value is y +- 2^N, clamped; a constant bound when that range of wrapped values
    lies beyond it. Equal to clamping `wrap_shift(x, -start)`, with fewer cases for Z3; the
    common clip to the block, [0, length - 1], is spelled with the block test the masks
    use (`block_local`'s `test`: `0 <= y < length`), which Z3 then shares. A symbolic
    `start` (every device of a class, `symbolic_device`) lies in [0, `last`]."""
    lo, hi = bounds
    limits = int_limits(dtype)
    y = sub(v, start)
    least, most = (0, last) if is_z3(start) else (start, start)
    if (lo, hi) == (0, length - 1) and limits is not None and is_z3(y) and \
            most + length <= limits[1] + 1 and least >= 0:
        inside = z3.And(to_z3(compare(y, 0, "GE")), to_z3(compare(y, length, "LT")))
        wrapped = to_z3(y) < limits[0]  # wraps around to a value above the block
        above = z3.Or(to_z3(compare(y, length, "GE")), wrapped)
        return z3.If(inside, to_z3(y), z3.If(above, z3.IntVal(hi), z3.IntVal(0)))

    def clamp(y):
        if is_z3(y) and lo is not None and hi is not None and lo <= hi:
            z = to_z3(y)
            return z3.If(z < lo, z3.IntVal(lo), z3.If(z > hi, z3.IntVal(hi), z))
        y = y if lo is None else maximum(y, lo)
        return y if hi is None else minimum(y, hi)

    if is_z3(start) and limits is not None:  # y lies in [min - last, max]: wrap it exactly
        return clamp(wrap_int(y, dtype, range_periods(dtype, limits[0] - last, limits[1])))
    if limits is None or not is_z3(y) or start == 0:
        return clamp(wrap_shift(v, -start, dtype))
    low, high = limits
    span = high - low + 1
    if start > 0:  # wrapped values lie in [high + 1 - start, high]
        wrapped = hi if hi is not None and hi <= high + 1 - start else clamp(add(y, span))
        return z3.If(to_z3(y) < low, to_z3(wrapped), to_z3(clamp(y)))
    # start < 0: wrapped values lie in [low, low - start - 1]
    wrapped = lo if lo is not None and lo >= low - start - 1 else clamp(sub(y, span))
    return z3.If(to_z3(y) > high, to_z3(wrapped), to_z3(clamp(y)))


def _window_rows(value: np.ndarray, window: Windowed, mesh: Mesh, device: int) -> np.ndarray:
    """Device `device`'s rows of a halo window (the other dims blocked as in its relation),
    starting at its own start when the window has one per device, zeros in its holes, summed
    over the window's `summed` dims."""
    dim, axes = window.dim, window.rel.tiling[window.dim]
    others = list(window.rel.tiling)
    others[dim] = ()
    block = device_block(value, replace(window.rel, tiling=tuple(others)), mesh, device, False)
    size = value.shape[dim]
    start = (window.starts[device] if window.starts else
             mesh.block_index(axes, device) * (size // mesh.group_size(axes)) + window.offset)
    rows = [(start + i) % size for i in range(window.length)]
    out = np.take(block, rows, axis=dim)
    for hole_device, a, b in window.holes:
        if hole_device == device:
            index = [slice(None)] * out.ndim
            index[dim] = slice(a, b)
            out[tuple(index)] = full(out[tuple(index)].shape, 0)
    if window.summed:
        return reduce_dims(out, window.summed, "sum")
    return out


def device_block(value: np.ndarray, rel: Rel, mesh: Mesh | None, device: int, single: bool
           ) -> np.ndarray:
    """Device `device`'s block of a global value under `rel`'s tiling (poly dims whole)."""
    if single:
        return value
    index = []
    for dim, axes in enumerate(rel.tiling):
        if not axes or dim in rel.poly:
            index.append(slice(None))
            continue
        count = mesh.group_size(axes)
        if value.shape[dim] % count:
            raise Failure("unknown", f"dim {dim} of size {value.shape[dim]} is not split "
                          f"evenly into {count} blocks")
        size = value.shape[dim] // count
        b = mesh.block_index(axes, device)
        index.append(slice(b * size, (b + 1) * size))
    return take(value, tuple(index))


def block_region(rel: Rel, mesh: Mesh, device: int) -> tuple[tuple[int, int], ...]:
    """The [start, stop) ranges of `device`'s block of `rel`'s global value (`device_block`)."""
    region = []
    for dim, (n, axes) in enumerate(zip(rel.term.shape, rel.tiling)):
        if not axes or dim in rel.poly:
            region.append((0, n))
            continue
        count = mesh.group_size(axes)
        if n % count:
            raise Failure("unknown", f"dim {dim} of size {n} is not split evenly into "
                          f"{count} blocks")
        size = n // count
        b = mesh.block_index(axes, device)
        region.append((b * size, (b + 1) * size))
    return tuple(region)


_REGION_REDUCTIONS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min",
                      "reduce_and": "and", "reduce_or": "or"}


def _concatenate_region(term: Term, region: tuple[tuple[int, int], ...], env: dict,
                        memo: dict, regions: dict) -> np.ndarray:
    """A concatenation's window: along its dim, each operand's part the window overlaps (at
    the operand's own positions), in order; the other dims' window in every operand."""
    (dim,) = term.attrs
    lo, hi = region[dim]
    pieces, offset = [], 0
    for operand in term.args:
        n = operand.shape[dim]
        first, last = max(lo, offset), min(hi, offset + n)
        if first < last:
            inner = region[:dim] + ((first - offset, last - offset),) + region[dim + 1:]
            pieces.append(region_value(operand, inner, env, memo, regions))
        offset += n
    return concatenate(pieces, dim)


def region_value(term: Term, region: tuple[tuple[int, int], ...], env: dict, memo: dict,
                 regions: dict) -> np.ndarray:
    """`evaluate_term(term)[region]`, computed from the regions of the operands it reads:
    a leaf's variables in the region; an elementwise op on its operands' same region; a
    broadcast, transpose, dot_general or reduction on the operand positions those output
    positions read (whole contracted and reduced dims); a top_k on the window's rows (whole
    along its last dim); a reshape on the smallest box of operand positions holding the
    window's elements (row-major); a slice on the operand positions its window's elements
    come from (strided), a concatenation on the part of each operand the window overlaps.
    Anything else, and a whole region, is evaluated in full and sliced. Each rule restates
    the op's definition on a window."""
    shape = term.shape
    if all(r == (0, n) for r, n in zip(region, shape)):
        return evaluate_term(term, env, memo)
    key = (term.serial, region)
    found = regions.get(key)
    if found is not None:
        return found
    op, args = term.op, term.args
    sub = [hi - lo for lo, hi in region]
    if op == "arg" and isinstance(env, LazyLeaves) and term.attrs[0] in env.leaves:
        value = env.region(term.attrs[0], region)
    elif op in ARITHMETIC_TERM_OPS or (op in ELEMENTWISE_STABLEHLO and all(
            a.shape == shape for a in args)):
        values = [region_value(a, region, env, memo, regions) for a in args]
        window = Term()
        window.op, window.args, window.attrs = op, args, term.attrs
        window.shape, window.dtype, window.serial = tuple(sub), term.dtype, -1
        value = evaluate_node(window, values, env)
    elif op == "broadcast":
        (dims,) = term.attrs
        operand = args[0]
        inner = tuple(region[d] if operand.shape[i] == shape[d] else (0, operand.shape[i])
                      for i, d in enumerate(dims))
        value = broadcast_in_dim(region_value(operand, inner, env, memo, regions), dims,
                                 tuple(sub))
    elif op == "reshape" and args[0].shape and all(sub):
        operand = args[0]
        wanted = np.indices(sub).reshape(len(sub), -1) + np.array(
            [lo for lo, _ in region]).reshape(-1, 1)
        read = np.unravel_index(np.ravel_multi_index(tuple(wanted), shape), operand.shape)
        box = tuple((int(p.min()), int(p.max()) + 1) for p in read)
        part = region_value(operand, box, env, memo, regions)
        value = part[tuple(p - lo for p, (lo, _) in zip(read, box))].reshape(sub)
    elif op == "transpose":
        (perm,) = term.attrs
        inner = [None] * len(perm)
        for k, p in enumerate(perm):
            inner[p] = region[k]
        value = transpose(region_value(args[0], tuple(inner), env, memo, regions), perm)
    elif op == "stablehlo.dot_general" and len(args) == 2:
        lb, rb, lc, rc = term.attrs
        lhs, rhs = args
        lhs_free = [d for d in range(len(lhs.shape)) if d not in lb and d not in lc]
        rhs_free = [d for d in range(len(rhs.shape)) if d not in rb and d not in rc]
        left = [(0, n) for n in lhs.shape]
        right = [(0, n) for n in rhs.shape]
        position = 0
        for x, y in zip(lb, rb):
            left[x] = right[y] = region[position]
            position += 1
        for d in lhs_free:
            left[d] = region[position]
            position += 1
        for d in rhs_free:
            right[d] = region[position]
            position += 1
        value = dot_general(region_value(lhs, tuple(left), env, memo, regions),
                            region_value(rhs, tuple(right), env, memo, regions),
                            lb, rb, lc, rc)
    elif op == "slice" and all(sub):
        starts, _, strides = term.attrs
        steps = tuple(strides) if strides else (1,) * len(shape)
        inner = tuple((s + lo * st, s + (hi - 1) * st + 1)
                      for (lo, hi), s, st in zip(region, starts, steps))
        part = region_value(args[0], inner, env, memo, regions)
        value = take(part, tuple(slice(0, None, st) for st in steps))
    elif op == "concatenate" and all(sub):
        value = _concatenate_region(term, region, env, memo, regions)
    elif op == "stablehlo.gather" and _gather_window(term, region) is not None:
        value = _gather_region(term, region, env, memo, regions)
    elif op == "chlo.top_k" and len(args) == 1 and shape:
        k, result = term.attrs  # row by row: the window's rows, whole along the last dim
        rows = tuple(region[:-1]) + ((0, args[0].shape[-1]),)
        lo, hi = region[-1]
        value = top_k(region_value(args[0], rows, env, memo, regions), k,
                      args[0].dtype)[result][..., lo:hi]
    elif op in _REGION_REDUCTIONS and len(args) == 1:
        dims = term.attrs[0]
        kept = iter(region)
        inner = tuple((0, n) if d in dims else next(kept) for d, n in enumerate(args[0].shape))
        value = reduce_dims(region_value(args[0], inner, env, memo, regions), dims,
                            _REGION_REDUCTIONS[op])
    else:
        whole = evaluate_term(term, env, memo)
        value = take(whole, tuple(slice(lo, hi) for lo, hi in region))
    if op in WRAPPED_OPS and int_limits(term.dtype) is not None:
        value = wrap_node(term, value)  # the window of an integer sum wraps like the whole
    if tuple(value.shape) != tuple(sub):
        raise Failure("unknown", f"internal: {op} evaluated on a window gave shape "
                      f"{value.shape}, not {tuple(sub)}")
    regions[key] = value
    return value


def _gather_window(term: Term, region: tuple[tuple[int, int], ...]
                   ) -> tuple[list[int], tuple[tuple[int, int], ...]] | None:
    """For a gather whose result `region` is evaluated from the start indices of its batch
    positions alone (the operand whole, no operand batching dims): its result batch dims and
    the region of the start indices; else None."""
    attrs = dict(term.attrs)
    dims = dimension_numbers(attrs, "dimension_numbers")
    if dims.get("operand_batching_dims") or len(term.args) != 2:
        return None
    indices = term.args[1].shape
    ivd = dims.get("index_vector_dim", len(indices))
    offset = dims.get("offset_dims", ())
    batch = [d for d in range(len(term.shape)) if d not in offset]
    if len(batch) != len(indices) - (1 if ivd < len(indices) else 0):
        return None
    rows = iter(region[d] for d in batch)
    return batch, tuple((0, n) if d == ivd else next(rows) for d, n in enumerate(indices))


def _gather_region(term: Term, region: tuple[tuple[int, int], ...], env: dict, memo: dict,
                   regions: dict) -> np.ndarray:
    """A gather on a region of its result: the gather of the operand (whole) at the start
    indices of the region's batch positions, cut to the region's window positions. (Each
    result element reads the start index at its own batch position: the definition, on a
    window of batch positions.)"""
    batch, index_region = _gather_window(term, region)
    operand = evaluate_term(term.args[0], env, memo)
    indices = region_value(term.args[1], index_region, env, memo, regions)
    window = Term()
    window.op, window.args, window.attrs = term.op, term.args, term.attrs
    window.shape = tuple(hi - lo if d in batch else n
                         for d, ((lo, hi), n) in enumerate(zip(region, term.shape)))
    window.dtype, window.serial = term.dtype, -1
    whole = evaluate_node(window, [operand, indices], env)
    return take(whole, tuple(slice(None) if d in batch else slice(lo, hi)
                             for d, (lo, hi) in enumerate(region)))


def operand_window_dims(info: OpInfo, dim: int) -> list[int | None] | None:
    """For each operand of `info`, the dim whose positions are result dim `dim`'s one for
    one (None: an operand without such a dim, read whole by every position), when the op
    computes each position along `dim` from the operands at that position alone: an
    elementwise op, a transpose, a broadcast_in_dim, a reshape keeping the dim whole, a
    reduce over other dims, a dot_general along a batch or free dim. Then the op on windows
    of the operands along those dims is the window of its result (the op's definition
    restated on a window, as `region_value` restates terms'); None for any other op."""
    name = info.name
    ops = [tuple(t.shape) for t in info.operand_types]
    out = tuple(info.result_types[0].shape) if info.result_types else ()
    if len(info.result_types) != 1 or not 0 <= dim < len(out):
        return None
    if name in ELEMENTWISE_OPS:
        if any(o and o != out for o in ops):
            return None
        return [dim if o else None for o in ops]
    if name == "stablehlo.transpose":
        return [tuple(info.attrs["permutation"])[dim]]
    if name == "stablehlo.broadcast_in_dim":
        dims = list(info.attrs["broadcast_dimensions"])
        if dim in dims and ops[0][dims.index(dim)] == out[dim]:
            return [dims.index(dim)]
        return [None]
    if name == "stablehlo.reshape":
        for src_dims, dst_dims in reshape_groups(ops[0], out) or ():
            if dim in dst_dims:
                big_src = [d for d in src_dims if ops[0][d] != 1]
                big_dst = [d for d in dst_dims if out[d] != 1]
                if big_dst == [dim] and len(big_src) == 1 and ops[0][big_src[0]] == out[dim]:
                    return [big_src[0]]
                return None
        return None
    if name == "stablehlo.reduce" and len(ops) == 2:
        kept = [d for d in range(len(ops[0])) if d not in tuple(info.attrs["dimensions"])]
        return [kept[dim], None] if dim < len(kept) else None
    if name == "stablehlo.dot_general" and len(ops) == 2:
        a = info.attrs
        lb, rb = list(a.get("lhs_batch", ())), list(a.get("rhs_batch", ()))
        lc, rc = list(a["lhs_contract"]), list(a["rhs_contract"])
        lfree = [d for d in range(len(ops[0])) if d not in lb and d not in lc]
        rfree = [d for d in range(len(ops[1])) if d not in rb and d not in rc]
        if dim < len(lb):
            return [lb[dim], rb[dim]]
        if dim < len(lb) + len(lfree):
            return [lfree[dim - len(lb)], None]
        return [None, rfree[dim - len(lb) - len(lfree)]]
    return None


def window_info(info: OpInfo, dims: list[int | None], dim: int, size: int) -> OpInfo:
    """`info` on windows of `size` positions along `dim` of its result and `dims` of its
    operands (`operand_window_dims`)."""
    def narrowed(shape: tuple[int, ...], d: int | None) -> tuple[int, ...]:
        return shape if d is None else shape[:d] + (size,) + shape[d + 1:]

    return replace(info, op=None,
                   operand_types=[TensorType(narrowed(tuple(t.shape), d), t.dtype)
                                  for t, d in zip(info.operand_types, dims)],
                   result_types=[TensorType(narrowed(tuple(t.shape), dim), t.dtype)
                                 for t in info.result_types])
