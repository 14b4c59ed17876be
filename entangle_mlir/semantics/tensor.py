"""Arrays of elements: the data movement, contraction and indexing that StableHLO ops and
reference terms share.

Arrays are numpy arrays of dtype `object` whose items are elements (`element.py`). This module
holds what both one op's semantics (`ops.py`) and a term's value (`evaluate.py`) compute on
whole arrays: building and mapping arrays, reductions over dims, integer wrap-around of an
array, broadcast_in_dim / reshape / transpose / slice / concatenate / pad / reduce_window /
iota / dot_general, dynamic_slice and dynamic_update_slice, gather, scatter and top_k. Its
functions take plain parameters (dims, sizes, a reduction kind), never an `OpInfo`: reading an
op's attributes is the op table's job.

Index operands (gather/scatter indices, dynamic_slice/dynamic_update_slice offsets) may be
symbolic integers: the result is then an If-chain over every position the clamped index can
take, so sharded index arithmetic is checked exactly on small shapes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import z3

from entangle_mlir.semantics.element import (
    Element,
    SemanticsError,
    add,
    arg_combine,
    combine,
    compare,
    compared_value,
    exact,
    int_limits,
    is_z3,
    mul,
    num,
    select,
    sum_list,
    to_z3,
    wrap_int,
)

Array = np.ndarray


# ----- array helpers --------------------------------------------------------------------------

def obj_array(values, shape: tuple[int, ...] | None = None) -> Array:
    """An object array from a numpy array, nested lists or a scalar (elements kept as is)."""
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values if shape is None else values.reshape(shape)
    if isinstance(values, np.ndarray):
        out = np.empty(values.shape, dtype=object)
        for idx in np.ndindex(values.shape):
            out[idx] = exact(values[idx].item() if hasattr(values[idx], "item")
                             else values[idx])
        return out if shape is None else out.reshape(shape)
    if isinstance(values, (list, tuple)):
        return obj_array(np.array(values, dtype=object), shape)
    out = np.empty((), dtype=object)
    out[()] = exact(values)
    return out if shape is None else np.broadcast_to(out, shape).copy()


def full(shape: tuple[int, ...], value: Element) -> Array:
    out = np.empty(tuple(shape), dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = value
    return out


def apply(fn: Callable[..., Element], *arrays: Array) -> Array:
    """`fn` element by element over arrays broadcast together (numpy rules)."""
    arrays = tuple(obj_array(a) for a in arrays)
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    spread = [np.broadcast_to(a, shape) for a in arrays]
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        out[idx] = fn(*(a[idx] for a in spread))
    return out


def reduce_dims(x: Array, dims: Sequence[int], kind: str, init: Element | None = None) -> Array:
    """Reduce `x` over `dims` with `kind` ("sum", "max", "min", "mul", "and", "or")."""
    dims = tuple(sorted({int(d) for d in dims}))
    keep = [d for d in range(x.ndim) if d not in dims]
    moved = np.transpose(x, keep + list(dims))
    out_shape = tuple(x.shape[d] for d in keep)
    count = math.prod(x.shape[d] for d in dims)
    flat = moved.reshape(out_shape + (count,))
    out = np.empty(out_shape, dtype=object)
    for idx in np.ndindex(out_shape):
        items = list(flat[idx])
        if init is not None:
            items = [init] + items
        out[idx] = combine(kind, items)
    return out


# ----- integer width ------------------------------------------------------------------------------

def wrap_array(value: Array, dtype: str, periods: int | None = None) -> Array:
    """`value` as integer `dtype` holds it, element by element (`wrap_int`); other dtypes
    keep it."""
    if int_limits(dtype) is None:
        return value
    return apply(lambda x: wrap_int(x, dtype, periods), value)


def wrap_node_dtype(value: Array, dtype: str) -> Array:
    """`value` (a sum of values of integer `dtype`) as the dtype holds it."""
    return wrap_array(value, dtype)


# ----- data movement and contraction (shared by ops and terms) --------------------------------

def broadcast_in_dim(x: Array, dims: Sequence[int], shape: Sequence[int]) -> Array:
    """Operand dim i becomes result dim dims[i] (equal size or size 1)."""
    dims, shape = tuple(dims), tuple(shape)
    if len(dims) != x.ndim:
        raise SemanticsError(f"broadcast_in_dim: {len(dims)} dims for a rank-{x.ndim} operand")
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    moved = np.transpose(x, order)
    expanded = [1] * len(shape)
    for i in order:
        expanded[dims[i]] = x.shape[i]
    for i, d in enumerate(dims):
        if x.shape[i] not in (1, shape[d]):
            raise SemanticsError(f"broadcast_in_dim: operand dim {i} of size {x.shape[i]} "
                                 f"into result dim {d} of size {shape[d]}")
    return np.broadcast_to(moved.reshape(expanded), shape).copy()


def reshape(x: Array, shape: Sequence[int]) -> Array:
    shape = tuple(shape)
    if math.prod(shape) != x.size:
        raise SemanticsError(f"reshape of {x.shape} into {shape}")
    return x.reshape(shape)


def transpose(x: Array, perm: Sequence[int]) -> Array:
    return np.transpose(x, tuple(perm))


def reverse(x: Array, dims: Sequence[int]) -> Array:
    """`x` with the order of its elements along each of `dims` reversed."""
    return np.flip(x, tuple(dims)) if len(dims) else x


def take(x: Array, index: tuple) -> Array:
    """`x[index]` as an array (a 0-d array indexed by `()` stays an array)."""
    if x.ndim == 0:
        return x.copy()
    return x[index].copy()


def slice_(x: Array, starts: Sequence[int], limits: Sequence[int],
           strides: Sequence[int] | None = None) -> Array:
    strides = tuple(strides) if strides else (1,) * x.ndim
    return take(x, tuple(slice(s, e, st) for s, e, st in zip(starts, limits, strides)))


def concatenate(arrays: Sequence[Array], dim: int) -> Array:
    return np.concatenate([obj_array(a) for a in arrays], axis=dim)


def pad(x: Array, value: Element, low: Sequence[int], high: Sequence[int],
        interior: Sequence[int]) -> Array:
    """StableHLO pad: interior padding, then edge padding (negative edges crop)."""
    out = x
    for d in range(x.ndim):
        n = out.shape[d]
        step = interior[d] + 1
        size = n + max(n - 1, 0) * interior[d]
        shape = list(out.shape)
        shape[d] = size
        spread = full(tuple(shape), value)
        index = [slice(None)] * out.ndim
        index[d] = slice(0, size, step)
        spread[tuple(index)] = out
        lo, hi = low[d], high[d]
        shape_lo, shape_hi = list(spread.shape), list(spread.shape)
        shape_lo[d], shape_hi[d] = max(lo, 0), max(hi, 0)
        spread = np.concatenate([full(tuple(shape_lo), value), spread,
                                 full(tuple(shape_hi), value)], axis=d)
        start = max(-lo, 0)
        stop = spread.shape[d] - max(-hi, 0)
        index = [slice(None)] * out.ndim
        index[d] = slice(start, stop)
        out = spread[tuple(index)]
    return out.copy()


def reduce_window(x: Array, kind: str, init: Element, window: Sequence[int],
                  strides: Sequence[int], base_dilations: Sequence[int],
                  window_dilations: Sequence[int], low: Sequence[int],
                  high: Sequence[int]) -> Array:
    """reduce_window (one operand) as XLA runs it: padding and base-dilation holes contribute
    nothing, every window is folded starting from `init` once (the StableHLO spec fills them
    with `init`; the two agree when `init` is the reducer's identity, the only case the rule
    relates, and XLA's behaviour is what tests/test_semantics grounds)."""
    rank = x.ndim
    padded = pad(obj_array(x), None, low, high, [b - 1 for b in base_dilations])
    spans = [(w - 1) * wd + 1 for w, wd in zip(window, window_dilations)]
    out_shape = tuple(max((padded.shape[d] - spans[d]) // strides[d] + 1, 0)
                      for d in range(rank))
    out = np.empty(out_shape, dtype=object)
    for idx in np.ndindex(out_shape):
        index = tuple(slice(i * st, i * st + span, wd)
                      for i, st, span, wd in zip(idx, strides, spans, window_dilations))
        out[idx] = combine(kind, [init, *(v for v in padded[index].reshape(-1)
                                          if v is not None)])
    return out


def iota(shape: Sequence[int], dim: int) -> Array:
    out = np.empty(tuple(shape), dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = idx[dim]
    return out


def dot_general(lhs: Array, rhs: Array, lhs_batch: Sequence[int], rhs_batch: Sequence[int],
                lhs_contract: Sequence[int], rhs_contract: Sequence[int]) -> Array:
    """Result dims: batch dims, then lhs free dims, then rhs free dims (StableHLO order)."""
    lb, rb, lc, rc = map(tuple, (lhs_batch, rhs_batch, lhs_contract, rhs_contract))
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
    for a, b in zip(lb + lc, rb + rc):
        if lhs.shape[a] != rhs.shape[b]:
            raise SemanticsError(f"dot_general: lhs dim {a} ({lhs.shape[a]}) vs rhs dim {b} "
                                 f"({rhs.shape[b]})")
    batch = math.prod(lhs.shape[d] for d in lb)
    k = math.prod(lhs.shape[d] for d in lc)
    m = math.prod(lhs.shape[d] for d in lf)
    n = math.prod(rhs.shape[d] for d in rf)
    left = np.transpose(lhs, lb + tuple(lf) + lc).reshape(batch, m, k)
    right = np.transpose(rhs, rb + rc + tuple(rf)).reshape(batch, k, n)
    if k and _exact_numbers(left) and _exact_numbers(right):
        out = _exact_matmul(left, right)
    else:
        out = np.empty((batch, m, n), dtype=object)
        for b in range(batch):
            for i in range(m):
                for j in range(n):
                    out[b, i, j] = sum_list([mul(left[b, i, t], right[b, t, j])
                                             for t in range(k)])
    shape = (tuple(lhs.shape[d] for d in lb) + tuple(lhs.shape[d] for d in lf)
             + tuple(rhs.shape[d] for d in rf))
    return out.reshape(shape)


MAX_COMMON_DENOMINATOR_BITS = 256


def _exact_matmul(left: Array, right: Array) -> Array:
    """`left @ right` of exact Python numbers, exactly. Rationals are brought over one common
    denominator per operand, the sums of products taken on integers, and each result divided
    once: sum_t (a_t / p)(b_t / q) = (sum_t a_t b_t) / (p q). The same values as a matmul on
    Fractions (which normalizes by a gcd at every product and every sum: ~20x slower), kept
    to operands whose common denominator is small (`MAX_COMMON_DENOMINATOR_BITS`)."""
    p, q = _common_denominator(left), _common_denominator(right)
    if p is None or q is None:
        return np.matmul(left, right)
    if p == 1 and q == 1:
        return np.matmul(left, right)
    sums = np.matmul(_scaled(left, p), _scaled(right, q))
    out = np.empty(sums.shape, dtype=object)
    for index, total in np.ndenumerate(sums):
        out[index] = Fraction(total, p * q)
    return out


def _common_denominator(x: Array) -> int | None:
    """The lcm of the denominators of `x`'s exact numbers, None when it is too large."""
    common = 1
    for v in x.flat:
        if type(v) is Fraction and common % v.denominator:
            common = math.lcm(common, v.denominator)
            if common.bit_length() > MAX_COMMON_DENOMINATOR_BITS:
                return None
    return common


def _scaled(x: Array, denominator: int) -> Array:
    """`x * denominator` as Python ints (`denominator` a multiple of every denominator)."""
    out = np.empty(x.shape, dtype=object)
    for index, v in np.ndenumerate(x):
        out[index] = (v.numerator * (denominator // v.denominator) if type(v) is Fraction
                      else v * denominator)
    return out


def _exact_numbers(x: Array) -> bool:
    """Every element an exact Python number (int or Fraction; no bool, float or Z3 term):
    arithmetic on them is exact in any order."""
    return all(type(v) is int or type(v) is Fraction for v in x.flat)


def dynamic_slice(x: Array, starts: Sequence[Element], sizes: Sequence[int]) -> Array:
    """Offsets are clamped into [0, dim - size] (StableHLO)."""
    clamped = [_clamped(start, x.shape[d] - size)
               for d, (start, size) in enumerate(zip(starts, sizes))]
    if not any(is_z3(c) for c in clamped):
        return take(x, tuple(slice(c, c + size) for c, size in zip(clamped, sizes)))
    out = np.empty(tuple(sizes), dtype=object)
    for index in np.ndindex(out.shape):
        out[index] = _pick(x, [add(c, i) if i else c for c, i in zip(clamped, index)])
    return out


def dynamic_update_slice(x: Array, update: Array, starts: Sequence[Element]) -> Array:
    """Offsets are clamped so the update fits; symbolic offsets select among every placement."""
    clamped = [_clamped(start, x.shape[d] - update.shape[d]) for d, start in enumerate(starts)]
    choices = [range(x.shape[d] - update.shape[d] + 1) if is_z3(c) else (c,)
               for d, c in enumerate(clamped)]
    result = None
    for placement in reversed(list(itertools.product(*choices))):
        out = x.copy()
        out[tuple(slice(p, p + n) for p, n in zip(placement, update.shape))] = update
        if result is None:
            result = out
            continue
        chosen = z3.And([c == p for c, p in zip(clamped, placement) if is_z3(c)])
        result = apply(lambda a, b, chosen=chosen: select(chosen, a, b), out, result)
    return result


# ----- gather / scatter (indices may be symbolic) -------------------------------------------------

def _index_vector(indices: Array, batch_index: tuple[int, ...], index_vector_dim: int
                  ) -> list[Element]:
    if index_vector_dim >= indices.ndim:
        return [indices[batch_index]]
    return [indices[batch_index[:index_vector_dim] + (k,) + batch_index[index_vector_dim:]]
            for k in range(indices.shape[index_vector_dim])]


def _clamped(start: Element, high: int) -> Element:
    """min(max(start, 0), high) for a concrete or symbolic integer."""
    start = exact(start)
    if not is_z3(start):
        return min(max(int(start), 0), high)
    z = num(start)
    z = z if z.is_int() else z3.ToInt(z)
    return z3.If(z < 0, 0, z3.If(z > high, high, z))


def _pick(array: Array, position: list[Element]) -> Element:
    """array[position] where some coordinates may be symbolic (an If-chain over the range)."""
    for d, p in enumerate(position):
        if is_z3(p):
            options = []
            for candidate in range(array.shape[d]):
                fixed = position[:d] + [candidate] + position[d + 1:]
                options.append((candidate, _pick(array, fixed)))
            value = options[-1][1]
            for candidate, option in reversed(options[:-1]):
                value = select(p == candidate, option, value)
            return value
    return array[tuple(int(p) for p in position)]


def gather(operand: Array, indices: Array, dims: dict, slice_sizes: Sequence[int],
           result_shape: Sequence[int]) -> Array:
    """StableHLO gather: start indices are clamped so the slice stays inside the operand."""
    offset_dims = dims.get("offset_dims", ())
    collapsed = dims.get("collapsed_slice_dims", ())
    operand_batching = dims.get("operand_batching_dims", ())
    indices_batching = dims.get("start_indices_batching_dims", ())
    start_index_map = dims.get("start_index_map", ())
    index_vector_dim = dims.get("index_vector_dim", indices.ndim)
    batch_dims = [d for d in range(len(result_shape)) if d not in offset_dims]
    window_dims = [d for d in range(operand.ndim) if d not in collapsed
                   and d not in operand_batching]
    out = np.empty(tuple(result_shape), dtype=object)
    for result_index in np.ndindex(out.shape):
        batch_index = tuple(result_index[d] for d in batch_dims)
        start = _index_vector(indices, batch_index, index_vector_dim)
        position: list[Element] = [0] * operand.ndim
        for k, d in enumerate(start_index_map):
            position[d] = _clamped(start[k], operand.shape[d] - slice_sizes[d])
        for d_operand, d_start in zip(operand_batching, indices_batching):
            position[d_operand] = batch_index[d_start - (0 if d_start < index_vector_dim else 1)]
        for k, d in enumerate(window_dims):
            offset = result_index[offset_dims[k]]
            position[d] = add(position[d], offset) if offset else position[d]
        out[result_index] = _pick(operand, position)
    return out


def scatter(operand: Array, indices: Array, updates: Array, dims: dict, kind: str) -> Array:
    """StableHLO scatter with `kind` "replace" or a reduction ("add", "max", ...). An update
    window that does not fit inside the operand is skipped as a whole (what XLA does; the spec
    leaves it implementation-defined). Duplicate targets of "replace" are applied in update
    order (the spec leaves that order unspecified)."""
    window_dims = dims.get("update_window_dims", ())
    inserted = dims.get("inserted_window_dims", ())
    input_batching = dims.get("input_batching_dims", ())
    indices_batching = dims.get("scatter_indices_batching_dims", ())
    to_operand = dims.get("scatter_dims_to_operand_dims", ())
    index_vector_dim = dims.get("index_vector_dim", indices.ndim)
    scatter_dims = [d for d in range(updates.ndim) if d not in window_dims]
    operand_window = [d for d in range(operand.ndim) if d not in inserted
                      and d not in input_batching]
    sizes = [1] * operand.ndim
    for k, d in enumerate(operand_window):
        sizes[d] = updates.shape[window_dims[k]]
    out = operand.copy()
    for update_index in np.ndindex(updates.shape):
        scatter_index = tuple(update_index[d] for d in scatter_dims)
        start = _index_vector(indices, scatter_index, index_vector_dim)
        target: list[Element] = [0] * operand.ndim
        for k, d in enumerate(to_operand):
            target[d] = exact(start[k])
        for d_operand, d_start in zip(input_batching, indices_batching):
            target[d_operand] = scatter_index[d_start - (0 if d_start < index_vector_dim else 1)]
        fits: list = []
        for d, (t, n) in enumerate(zip(target, operand.shape)):
            if is_z3(t):
                fits.append(z3.And(num(t) >= 0, num(t) + sizes[d] <= n))
            elif not 0 <= int(t) <= n - sizes[d]:
                fits.append(z3.BoolVal(False))
        for k, d in enumerate(operand_window):
            target[d] = add(target[d], update_index[window_dims[k]])
        value = updates[update_index]
        if not any(is_z3(t) for t in target) and not fits:
            index = tuple(int(t) for t in target)
            out[index] = value if kind == "replace" else combine(kind, [out[index], value])
            continue
        if any(z3.is_false(f) for f in fits):
            continue
        # Only positions whose known coordinates match can be hit (elsewhere `hit` is False
        # and the element is left as it is), so only they are visited.
        candidates = [range(n) if is_z3(t) else ([int(t)] if 0 <= int(t) < n else [])
                      for t, n in zip(target, out.shape)]
        for index in itertools.product(*candidates):
            hit = z3.And([num(t) == i for t, i in zip(target, index) if is_z3(t)] + fits)
            if kind == "add":
                out[index] = add(out[index], select(hit, value, 0))
                continue
            new = value if kind == "replace" else combine(kind, [out[index], value])
            out[index] = select(hit, new, out[index])
    return out


# ----- convolution --------------------------------------------------------------------------------

def convolution(lhs: Array, rhs: Array, dims: dict) -> Array:
    """StableHLO's convolution (one feature group, one batch group) exactly, as its spec
    defines it: the input dilated (`lhs_dilation`) and padded (negative padding crops), the
    kernel dilated (`rhs_dilation`) and reversed (`window_reversal`) along its spatial dims;
    output position p of spatial dim k reads input positions p * stride + w * rhs_dilation;
    each output element sums the products over the window and the input features. `dims`:
    `opinfo.conv_attrs`."""
    if dims["feature_group_count"] != 1 or dims["batch_group_count"] != 1:
        raise SemanticsError("grouped convolution has no semantics here")
    lhs, rhs = obj_array(lhs), obj_array(rhs)
    spatial = list(dims["input_spatial"])
    n = len(spatial)
    x = np.transpose(lhs, [dims["input_batch"], *spatial, dims["input_feature"]])
    k = np.transpose(rhs, [*dims["kernel_spatial"], dims["kernel_input_feature"],
                           dims["kernel_output_feature"]])
    for s, reverse in enumerate(dims["window_reversal"]):
        if reverse:
            k = np.flip(k, axis=s)
    x = _dilated_padded(x, dims["lhs_dilation"], dims["padding"])
    window = k.shape[:n]
    reach = [(w - 1) * d + 1 for w, d in zip(window, dims["rhs_dilation"])]
    sizes = [max((x.shape[1 + s] - reach[s]) // dims["window_strides"][s] + 1, 0)
             if x.shape[1 + s] >= reach[s] else 0 for s in range(n)]
    batch, features, outs = x.shape[0], x.shape[-1], k.shape[-1]
    out = np.empty((batch, *sizes, outs), dtype=object)
    for b in range(batch):
        for pos in np.ndindex(*sizes):
            for o in range(outs):
                terms = []
                for w in np.ndindex(*window):
                    at = tuple(p * st + wi * d for p, st, wi, d in
                               zip(pos, dims["window_strides"], w, dims["rhs_dilation"]))
                    for i in range(features):
                        terms.append(mul(x[(b, *at, i)], k[(*w, i, o)]))
                out[(b, *pos, o)] = sum_list(terms)
    order = [dims["output_batch"], *dims["output_spatial"], dims["output_feature"]]
    return np.transpose(out, np.argsort(order))


def _dilated_padded(x: Array, dilation, padding) -> Array:
    """`x` (batch, spatial..., feature) with zeros between its spatial positions and padding
    at both ends (negative padding removes positions)."""
    for s, (d, (low, high)) in enumerate(zip(dilation, padding)):
        axis = 1 + s
        size = x.shape[axis]
        stretched = (size - 1) * d + 1 if size else 0
        shape = list(x.shape)
        shape[axis] = stretched
        grown = np.empty(shape, dtype=object)
        grown[...] = 0
        index = [slice(None)] * x.ndim
        index[axis] = slice(0, stretched, d)
        grown[tuple(index)] = x
        pads = [(0, 0)] * x.ndim
        pads[axis] = (max(low, 0), max(high, 0))
        grown = np.pad(grown, pads, constant_values=0)
        keep = [slice(None)] * x.ndim
        keep[axis] = slice(max(-low, 0), grown.shape[axis] - max(-high, 0))
        x = grown[tuple(keep)]
    return x


# ----- argmax / argmin ----------------------------------------------------------------------------

def compared_keys(keys: Array, dtype: str) -> Array:
    """The keys an op that orders elements reads (argmax / argmin, sort, top_k): each
    `element.compared_value` of `dtype`, rounded where float arithmetic computed it, as a
    compare reads its operands. Over the reals `argmax(x + 2.0)` is `argmax(x)`; in f32
    `x + 2.0` rounds 2^24 - 2 and 2^24 - 1 to one value and the first index wins. The picked
    values are these keys: the values the op orders and returns."""
    return apply(lambda a: compared_value(a, dtype), obj_array(keys))


def arg_reduce(values: Array, indices: Array, init_value: Element, init_index: Element,
               dims: Sequence[int], kind: str, dtype: str) -> tuple[Array, Array]:
    """A reduce over (values, indices) with jax's argmax / argmin comparator (`kind`): the
    pair folded from (init_value, init_index) over the reduced dims' elements in row-major
    order (`arg_combine`; the comparator selects, so any order gives the same pair). The
    values are read as `compared_keys` of `dtype`."""
    values, indices = compared_keys(values, dtype), obj_array(indices)
    if values.shape != indices.shape:
        raise SemanticsError(f"{kind}: values {values.shape} and indices {indices.shape}")
    dims = tuple(sorted({int(d) for d in dims}))
    keep = [d for d in range(values.ndim) if d not in dims]
    out_shape = tuple(values.shape[d] for d in keep)
    count = math.prod(values.shape[d] for d in dims)
    flat_v = np.transpose(values, keep + list(dims)).reshape(out_shape + (count,))
    flat_i = np.transpose(indices, keep + list(dims)).reshape(out_shape + (count,))
    out_v, out_i = np.empty(out_shape, dtype=object), np.empty(out_shape, dtype=object)
    for idx in np.ndindex(out_shape):
        v, i = init_value, init_index
        for w, j in zip(flat_v[idx], flat_i[idx]):
            v, i = arg_combine(kind, v, i, w, j)
        out_v[idx], out_i[idx] = v, i
    return out_v, out_i


# ----- sort ---------------------------------------------------------------------------------------

def sort_ascending(operands: Sequence[Array], dim: int, dtype: str) -> list[Array]:
    """A stable sort along `dim` by the first operand (its `compared_keys` of `dtype`) in
    ascending order (jax's comparator: -0 and +0 equal, NaNs last and equal), every operand
    permuted alike.

    Concrete rows are sorted directly; rows with symbolic keys go through a stable bubble
    network (compare-exchange of adjacent positions, swapping only when the later key is
    strictly smaller), so every element is an If-term."""
    keyed = [compared_keys(operands[0], dtype), *operands[1:]]
    arrays = [np.moveaxis(obj_array(x), dim, -1) for x in keyed]
    if any(a.shape != arrays[0].shape for a in arrays) or not arrays[0].ndim:
        raise SemanticsError("sort: operands of different shapes")
    outs = [np.empty(a.shape, dtype=object) for a in arrays]
    for idx in np.ndindex(arrays[0].shape[:-1]):
        rows = [list(a[idx]) for a in arrays]
        keys = rows[0]
        if not any(is_z3(k) for k in keys):
            order = sorted(range(len(keys)), key=lambda j: _sort_key(keys[j]))
            rows = [[row[j] for j in order] for row in rows]
        else:
            n = len(keys)
            for p in range(n):
                for j in range(n - 1, p, -1):
                    swap = compare(rows[0][j], rows[0][j - 1], "LT")
                    for row in rows:
                        row[j - 1], row[j] = (select(swap, row[j], row[j - 1]),
                                              select(swap, row[j - 1], row[j]))
        for out, row in zip(outs, rows):
            for j, value in enumerate(row):
                out[idx + (j,)] = value
    return [np.moveaxis(out, -1, dim) for out in outs]


def _sort_key(x: Element) -> tuple:
    value = x
    if isinstance(value, float) and math.isnan(value):
        return (1, 0)
    return (0, value)


# ----- top_k --------------------------------------------------------------------------------------

def _exchange(first: tuple[Element, Element], second: tuple[Element, Element]
              ) -> tuple[tuple[Element, Element], tuple[Element, Element]]:
    """One compare-exchange of `top_k`'s stable network on (value, index) pairs: the second
    pair moves first only when its value is strictly larger. Where both values are z3
    arithmetic terms of one sort (and so the indices, once symbolic), the same If-terms are
    built with the C API directly (`z3.If` and `>` cast and merge the sorts first: most of
    the cost of a symbolic top_k over 256 entries); otherwise by `compare` and `select`."""
    (a, ia), (b, ib) = first, second
    if isinstance(a, z3.ArithRef) and isinstance(b, z3.ArithRef) and a.ctx is b.ctx:
        ctx = a.ctx
        ref = ctx.ref()
        za, zb = a.as_ast(), b.as_ast()
        sort = z3.Z3_get_sort(ref, za)
        if z3.Z3_is_eq_sort(ref, sort, z3.Z3_get_sort(ref, zb)):
            ya, yb = (to_z3(i) for i in (ia, ib))
            if isinstance(ya, z3.ArithRef) and isinstance(yb, z3.ArithRef) and \
                    ya.ctx is ctx and yb.ctx is ctx and z3.Z3_is_eq_sort(
                        ref, z3.Z3_get_sort(ref, ya.as_ast()), z3.Z3_get_sort(ref, yb.as_ast())):
                swap = z3.Z3_mk_gt(ref, zb, za)
                xa, xb = ya.as_ast(), yb.as_ast()
                return ((z3.ArithRef(z3.Z3_mk_ite(ref, swap, zb, za), ctx),
                         z3.ArithRef(z3.Z3_mk_ite(ref, swap, xb, xa), ctx)),
                        (z3.ArithRef(z3.Z3_mk_ite(ref, swap, za, zb), ctx),
                         z3.ArithRef(z3.Z3_mk_ite(ref, swap, xa, xb), ctx)))
    swap = compare(b, a, "GT")
    return (select(swap, b, a), select(swap, ib, ia)), (select(swap, a, b), select(swap, ia, ib))


def top_k(x: Array, k: int, dtype: str) -> tuple[Array, Array]:
    """The k largest elements (`compared_keys` of `dtype`) along the last dim, largest first,
    and their indices; equal values keep their order (the lower index first, as `lax.top_k`
    documents).

    Concrete rows are sorted directly; rows with symbolic elements go through k passes of a
    stable bubble network (compare-exchange of adjacent (value, index) pairs, swapping only when
    the later value is strictly larger), so the result is an If-term per element.
    """
    x = compared_keys(x, dtype)
    if not x.ndim or k > x.shape[-1] or k < 0:
        raise SemanticsError(f"top_k: k={k} does not fit a dim of size "
                             f"{x.shape[-1] if x.ndim else 0}")
    lead = x.shape[:-1]
    values, indices = np.empty(lead + (k,), dtype=object), np.empty(lead + (k,), dtype=object)
    for idx in np.ndindex(lead):
        row = list(x[idx])
        if not any(is_z3(v) for v in row):
            order = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
            picked = [(row[j], j) for j in order]
        else:
            pairs: list[tuple[Element, Element]] = [(v, j) for j, v in enumerate(row)]
            for p in range(k):
                for j in range(len(pairs) - 1, p, -1):
                    pairs[j - 1], pairs[j] = _exchange(pairs[j - 1], pairs[j])
            picked = pairs[:k]
        for j, (v, i) in enumerate(picked):
            values[idx + (j,)], indices[idx + (j,)] = v, i
    return values, indices
