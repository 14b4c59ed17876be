"""reduce: reducing a split dim leaves a partial reduction of the same kind over its axes."""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.core import precision
from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import DEVICE_BLOCK_VALUES, Masked, Opaque, Rel, Value, Windowed
from entangle_mlir.core.selection import make_arg_reduce
from entangle_mlir.core.terms import (
    Term,
    intern,
    make_elementwise,
    make_lin,
    make_op,
    make_splat,
    splat_value,
)
from entangle_mlir.mlir.opinfo import OpInfo, region_problem
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze, local_iota, sum_term, unify_dims
from entangle_mlir.rules.kinds import device_blocks, entries
from entangle_mlir.rules.kinds.window import reduce_window_of_window, window_reduce

_IDENTITY = {"add": Fraction(0), "max": float("-inf"), "min": float("inf")}
_KIND = {"add": "sum", "max": "max", "min": "min"}
_WINDOW_IDENTITY = {**_IDENTITY, "mul": Fraction(1)}
"""The init values a reduce_window is related with: its reducer's identity (a product window,
jnp.cumprod, starts from 1; padding is filled with it)."""
_COMBINE = {"max": "stablehlo.maximum", "min": "stablehlo.minimum"}
_BOOLEAN_KIND = {"or": "max", "max": "max", "and": "min", "min": "min"}
"""Reducers of booleans as the order false < true sees them: `or` is max, `and` is min
(StableHLO's maximum and minimum on i1 are or and and; jax's pmax of a boolean is an
all_reduce with `maximum`)."""


def reduction_kind(reducer: str, dtype: str) -> str | None:
    """The partial kind (`sum`, `max`, `min`) a reduction with `reducer` over elements of
    `dtype` leaves over split dims, or None (no rule: `mul`, `add` of booleans, ...)."""
    if dtype == "i1":
        return _BOOLEAN_KIND.get(reducer)
    return _KIND.get(reducer)


def identity(kind: str, dtype: str):
    """The identity of a reduction of `kind` on `dtype` (what a reduce over a split dim may
    start from: each device adds it once): 0 for sums; for max the least value (-inf, the
    integer type's least value, false), for min the greatest."""
    if kind == "sum":
        return Fraction(0)
    bounds = integer_range(dtype)
    if bounds is None:
        return _IDENTITY[kind]
    return Fraction(bounds[0] if kind == "max" else bounds[1])


def integer_range(dtype: str) -> tuple[int, int] | None:
    """(least, greatest) value of an integer or boolean dtype, else None."""
    if dtype == "i1":
        return 0, 1
    if dtype not in precision.INT_BITS:
        return None
    width, signed = precision.INT_BITS[dtype]
    return (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)


def reduce_term(kind: str, term: Term, dims: tuple[int, ...], shape: tuple[int, ...],
                dtype: str) -> Term:
    """The reference term of a reduction of `kind` over `dims` (no init): a sum, or the max
    (min) -- of booleans the `reduce_or` (`reduce_and`) a reference writes for any/all."""
    if kind == "sum":
        return sum_term(term, dims, shape, dtype)
    if dtype == "i1":
        return intern("reduce_or" if kind == "max" else "reduce_and", (term,), (dims,), shape,
                      dtype)
    return intern(f"reduce_{kind}", (term,), (dims,), shape, dtype)


def unsupported_reducer(info: OpInfo) -> str:
    """Why a reducer is refused: what its region does instead (`region_problem`), or the
    reduction no rule handles here."""
    reducer = info.attrs.get("reducer", "other")
    if reducer == "other":
        return f"not a supported reduction: {region_problem(info)}"
    return f"{info.name.split('.')[-1]} with a '{reducer}' reducer is not supported"


def reduce(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """A reduce over unsplit dims keeps the other dims' layout; over split dims (or of a
    partial value of the same kind) it leaves a partial reduction over their axes: a sum, a
    max or a min (booleans: `or` is max, `and` min), the init the reduction's identity (every
    device adds it once). A product (jnp.prod) is related over unsplit dims only
    (`reduce_product`)."""
    half = len(operands) // 2
    if half == 2 and info.attrs.get("reducer") in ARG_REDUCERS:
        return arg_reduce(info, operands, ctx)
    if half != 1:
        why = (unsupported_reducer(info) if info.attrs.get("reducer", "other") == "other"
               else "variadic reduce (argmax/argmin) is not supported yet")
        return [Opaque(why, category="unsupported")] * len(info.result_types)
    x, init = operands
    reducer = info.attrs.get("reducer", "other")
    if reducer in _LOGICAL and isinstance(x, DEVICE_BLOCK_VALUES):
        neutral = _LOGICAL[reducer]
        if not isinstance(init, Rel) or splat_value(init.term) != neutral:
            return [device_blocks.unsupported(info.name)]
        return [device_blocks.reduce_unit_dims(info, x, ctx)]
    if isinstance(x, Masked):
        return [device_blocks.carried(info, operands, ctx, reduce)]
    dtype = info.result_types[0].dtype
    kind = reduction_kind(reducer, dtype)
    if kind is None and reducer == "mul":
        return [reduce_product(info, x, init)]
    if kind is None:
        return [Opaque(unsupported_reducer(info),
                       category="unsupported")]
    if isinstance(x, Windowed) and isinstance(init, Rel) and ctx.mesh is not None:
        entry = entries.reduce(info, x, init, reducer, ctx, reduce)
        return [entry if entry is not None else window_reduce(info, x, init, reducer, ctx,
                                                              reduce)]
    if not isinstance(x, Rel) or not isinstance(init, Rel):
        return [Opaque("reduce of a device-dependent scalar", category="unsupported")]
    x = freeze(x)
    init_value = splat_value(init.term)
    if init_value is None:
        return [Opaque("reduce with a non-constant init value", category="unsupported")]
    dims = tuple(info.attrs["dimensions"])
    new_axes = tuple(ax for d in dims for ax in x.tiling[d])
    if x.partial and x.kind != kind:
        return [Opaque(f"reduce ({reducer}) of a partial {x.kind}: missing all_reduce before it",
                       category="nonlinear_partial")]
    neutral = identity(kind, dtype)
    if (new_axes or x.partial) and init_value != neutral:
        return [Opaque(f"reduce over a split dim with init value {init_value} (not the identity "
                       f"of {reducer}): every device adds it once", category="unrelated")]
    shape = tuple(s for d, s in enumerate(x.term.shape) if d not in dims)
    tiling = tuple(t for d, t in enumerate(x.tiling) if d not in dims)
    nonempty = all(x.term.shape[d] for d in dims)
    if kind != "sum" and nonempty and splat_value(x.term) is not None:
        term = make_splat(splat_value(x.term), shape, dtype)  # all/any/max of a constant
    else:
        term = reduce_term(kind, x.term, dims, shape, dtype)
    if kind == "sum" and init_value != 0:
        term = make_lin([(Fraction(1), term)], init_value, shape, dtype)
    elif kind != "sum" and (init_value != neutral or not nonempty and neutral != _IDENTITY[kind]):
        # an init that is not the identity, or the integer identity over an empty dim (the
        # term's reduction of nothing is +-inf, the op's is the init)
        term = make_elementwise(_COMBINE[kind], (term, make_splat(init_value, shape, dtype)))
    mesh_order = ctx.mesh.names if ctx.mesh else ()
    partial = tuple(sorted(set(x.partial) | set(new_axes), key=mesh_order.index))
    origin = x.partial_origin if x.partial else (info if new_axes else None)
    return [Rel(term, tiling, partial, kind if partial else "", frozenset(), x.scope,
                partial_origin=origin)]


def reduce_product(info: OpInfo, x: Value, init: Value) -> Value:
    """A product (jnp.prod) over dims that are not split, of a value that is no partial
    reduction: every device multiplies whole rows of its block, so the layout is kept. A
    product over a split dim would leave a partial product, which no collective here
    completes, and a product of a partial value is not the product of the reference's: both
    are refused. The init value is multiplied in once (a `mul` node) unless it is 1."""
    if not isinstance(x, Rel) or not isinstance(init, Rel):
        return Opaque(unsupported_reducer(info), category="unsupported")
    x = freeze(x)
    init_value = splat_value(init.term)
    dims = tuple(info.attrs["dimensions"])
    if init_value is None or x.partial or any(x.tiling[d] for d in dims):
        return Opaque(unsupported_reducer(info), category="unsupported")
    dtype = info.result_types[0].dtype
    shape = tuple(s for d, s in enumerate(x.term.shape) if d not in dims)
    tiling = tuple(t for d, t in enumerate(x.tiling) if d not in dims)
    term = intern("reduce_mul", (x.term,), (dims,), shape, dtype)
    if init_value != 1:
        term = make_elementwise("stablehlo.multiply", (term, make_splat(init_value, shape,
                                                                        dtype)))
    return Rel(term, tiling, (), "", frozenset(), x.scope)


ARG_REDUCERS = ("argmax", "argmin")
"""A reduce over (values, indices) whose region is jax's argmax / argmin comparator
(`opinfo.arg_reduction_kind`)."""


def arg_reduce(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """argmax / argmin (a reduce over (values, indices) with jax's comparator, read whole:
    `opinfo.arg_reduction_kind`) over dims that are not split: each device picks within whole
    rows of its block, so the other dims keep their layout (values and indices laid out alike;
    a local iota along an unsplit dim is the global one). Refused: a reduced dim split (each
    device would pick within its own block, its indices local to it) and a partial operand."""
    kind = info.attrs["reducer"]
    count = len(info.result_types)

    def refuse(why: str, category: str = "unsupported") -> list[Value]:
        return [Opaque(why, category=category)] * count

    if count != 2 or not all(isinstance(v, Rel) for v in operands):
        return refuse(f"{kind} of a device-dependent value")
    values, indices, init_value, init_index = (freeze(v) for v in operands)
    if splat_value(init_value.term) is None or splat_value(init_index.term) is None or \
            init_value.partial or init_index.partial:
        return refuse(f"{kind} with a non-constant init value")
    rank = len(values.term.shape)
    pending = next((r for r in (values, indices) if r.partial), None)
    if pending is not None:
        return refuse(f"{kind} of a partial {pending.kind} over {axes_str(pending.partial)}: "
                      "missing all_reduce/psum before it", "nonlinear_partial")
    dims = tuple(info.attrs["dimensions"])
    for d in dims:
        split = values.tiling[d] or indices.tiling[d]
        if split:
            return refuse(
                f"{kind} over dim {d}, which is split over {axes_str(split)}: the answer "
                "within one block (with indices local to it); the layout tier does not relate "
                "per-block answers yet")
    indices = local_iota(indices, ctx)
    unified = unify_dims([values, indices], [list(range(rank))] * 2, ctx, kind)
    if isinstance(unified, Opaque):
        return [unified] * count
    (values, indices), joint, still_poly = unified
    for d in dims:
        if d in still_poly:
            return refuse(f"{kind} over dim {d}, a dim of local size only")
    kept = [d for d in range(rank) if d not in dims]
    tiling = tuple(joint[d][1] for d in kept)
    poly = frozenset(i for i, d in enumerate(kept) if d in still_poly)
    terms = [make_arg_reduce(kind, values.term, indices.term, init_value.term, init_index.term,
                             dims, r) for r in (0, 1)]
    return [Rel(t, tiling, (), "", poly, values.scope) for t in terms]


_LOGICAL = {"and": 1, "or": 0}
"""The identities of all/any (the init of XLA's index bounds checks on device masks)."""


def window_attrs(info: OpInfo) -> tuple[tuple[int, ...], ...]:
    """(window, strides, base_dilations, window_dilations, padding low, padding high) of a
    reduce_window, defaults filled in (StableHLO's defaults: 1s and no padding)."""
    a = info.attrs
    window = tuple(a["window_dimensions"])
    ones = (1,) * len(window)
    padding = a.get("padding") or [[0, 0]] * len(window)
    return (window, tuple(a.get("window_strides") or ones), tuple(a.get("base_dilations") or ones),
            tuple(a.get("window_dilations") or ones), tuple(int(p[0]) for p in padding),
            tuple(int(p[1]) for p in padding))


def reduce_window(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """A window over dims that are not split keeps the layout (jnp.cumsum along an unsplit
    dim): every device reduces whole windows of its block. A split dim must have the trivial
    window (size 1, stride 1, no padding or dilation). A partial sum (max) stays partial
    through a sum (max) window: windowing is linear (monotone) when the init value is the
    reducer's identity, which it must be (padding is filled with it). A window along the dim
    of a zero-extended halo window (XLA's cumsum of a split dim) is a block of the reference's
    windows when its rows are the right ones (window.reduce_window_of_window). A product
    window (jnp.cumprod, init 1) is related only whole, along dims that are not split and of
    a value that is no partial reduction: a product of partial sums is not the sum of the
    products, and a cumprod of a split dim is the general tier's (each device's running
    product times the products of the blocks before it)."""
    if len(operands) != 2:
        return [Opaque("variadic reduce_window is not supported", category="unsupported")
                ] * len(info.result_types)
    x, init = operands
    reducer = info.attrs.get("reducer", "other")
    if reducer not in _KIND and reducer != "mul":
        return [Opaque(unsupported_reducer(info),
                       category="unsupported")]
    if not isinstance(x, Rel | Windowed) or not isinstance(init, Rel):
        return [Opaque("reduce_window of a device-dependent value", category="unsupported")]
    init_value = splat_value(init.term)
    if init_value != _WINDOW_IDENTITY[reducer]:
        return [Opaque(f"reduce_window with init value {init_value} (not the identity of "
                       f"{reducer}) is not supported", category="unsupported")]
    if isinstance(x, Windowed):
        if ctx.mesh is None or reducer == "mul":
            return [Opaque(x.reason, category="layout_mismatch")]
        return [reduce_window_of_window(info, x, init, reducer, window_attrs(info), ctx.mesh)]
    x = freeze(x)
    kind = _KIND.get(reducer, "prod")
    if x.partial and x.kind != kind:
        return [Opaque(f"reduce_window ({reducer}) of a partial {x.kind}: missing all_reduce "
                       "before it", category="nonlinear_partial")]
    window, strides, base, dilation, low, high = window_attrs(info)
    for d, axes in enumerate(x.tiling):
        if axes and (window[d], strides[d], base[d], dilation[d], low[d], high[d]) != (
                1, 1, 1, 1, 0, 0):
            return [Opaque(f"reduce_window with a window along dim {d}, which is split over "
                           f"{axes_str(axes)}: each device's windows stop at its block edge",
                           category="layout_mismatch")]
    local = info.result_types[0].shape
    shape = tuple(x.term.shape[d] if axes else local[d] for d, axes in enumerate(x.tiling))
    attrs = (window, strides, base, dilation, low, high)
    dtype = info.result_types[0].dtype
    if reducer == "add":
        term = make_op("reduce_window_sum", (x.term,), attrs, shape, dtype, linear_in=0)
    else:
        term = intern(f"reduce_window_{reducer}", (x.term,), attrs, shape, dtype)
    return [Rel(term, x.tiling, x.partial, x.kind, frozenset(), x.scope,
                partial_origin=x.partial_origin)]


REDUCTION_RULES = {
    "stablehlo.reduce": reduce,
    "stablehlo.reduce_window": reduce_window,
}
