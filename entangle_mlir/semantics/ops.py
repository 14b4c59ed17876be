"""What one StableHLO op computes on one device: the op table.

`OP_SEMANTICS[name](info, operands) -> results` is the LOCAL (per-device) semantics of an op,
driven by its `OpInfo` (attributes and result types): the elementwise ops (`ELEMENTWISE`: a
function of elements, `element.py`, applied across arrays) and the other local ops, each
reading its attributes and calling an array function of `tensor.py`. Integer results of the
ops in `WRAPPED_OPS` wrap around in their dtype. Ops whose result on one device depends on
other devices are in `collectives.py`; reference terms (`evaluate.py`) use this table for
their elementwise and indexed ops, so a term and its op share one semantics.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import z3

from entangle_mlir.core import precision
from entangle_mlir.core.terms import IOTA_POSITIONS
from entangle_mlir.mlir.opinfo import ARRAY_COMPARISONS, OpInfo, conv_attrs, scatter_kind
from entangle_mlir.semantics.element import (
    Element,
    SemanticsError,
    absolute,
    add,
    ceil,
    compare,
    compared_value,
    compared_values,
    convert,
    div,
    dtype_kind,
    floor,
    int_limits,
    is_bool_dtype,
    is_float_dtype,
    is_int_dtype,
    is_z3,
    logic,
    logical_not,
    maximum,
    minimum,
    mul,
    neg,
    power,
    pynum,
    reduce_precision,
    remainder,
    round_afz,
    round_even,
    select,
    sign,
    sub,
    sum_periods,
    transcendental,
    wrap_int,
    wrap_shift,
)
from entangle_mlir.semantics.tensor import (
    Array,
    apply,
    arg_reduce,
    broadcast_in_dim,
    concatenate,
    convolution,
    dot_general,
    dynamic_slice,
    dynamic_update_slice,
    gather,
    iota,
    obj_array,
    pad,
    reduce_dims,
    reduce_window,
    reshape,
    reverse,
    scatter,
    slice_,
    sort_ascending,
    top_k,
    transpose,
    wrap_array,
)

LocalFn = Callable[[OpInfo, list[Array]], list[Array]]


# ----- integer width ------------------------------------------------------------------------------

WRAPPED_OPS = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                "stablehlo.negate", "stablehlo.abs", "stablehlo.divide", "stablehlo.convert",
                "stablehlo.dot_general", "stablehlo.convolution", "stablehlo.reduce",
                "stablehlo.reduce_window",
                "stablehlo.scatter", "stablehlo.all_reduce", "stablehlo.reduce_scatter",
                "lin", "mul", "div", "reduce_sum", "reduce_window_sum", "reduce_window_mul",
                "reduce_mul")
"""Ops whose integer results are computed modulo 2^N (sums, products, quotients, converts);
`_wrapped_local` and `collectives._wrapped_collective` reduce their results into the
dtype's range."""


_NEAR_OPS = {"stablehlo.add": 1, "stablehlo.subtract": 1, "stablehlo.negate": 1,
             "stablehlo.abs": 1, "stablehlo.divide": 1}
"""Ops whose result on values of the dtype lies within one range of it (INT_MIN / -1)."""


def _shift_op(name: str, operands: list[Array], dtype: str) -> Array:
    """Integer add/subtract of two values of `dtype`, wrapped: with a concrete operand only
    the side it moves toward can overflow (`wrap_shift`)."""
    def one(a, b):
        if name == "stablehlo.subtract":
            b = neg(b) if not is_z3(b) else b
            if is_z3(b):
                return wrap_int(sub(a, b), dtype, 1)
        if not is_z3(b):
            return wrap_shift(a, b, dtype)
        if not is_z3(a):
            return wrap_shift(b, a, dtype)
        return wrap_int(add(a, b), dtype, 1)
    return apply(one, obj_array(operands[0]), obj_array(operands[1]))


def _wrapped_local(fn: LocalFn) -> LocalFn:
    def local(info: OpInfo, operands: list[Array]) -> list[Array]:
        if info.name in ("stablehlo.add", "stablehlo.subtract") and len(operands) == 2 and \
                int_limits(info.result_types[0].dtype) is not None and \
                all(t.dtype == info.result_types[0].dtype for t in info.operand_types):
            return [_shift_op(info.name, operands, info.result_types[0].dtype)]
        results = fn(info, operands)
        if info.attrs.get("reducer") in ("argmax", "argmin"):
            return results  # a selection of its operands' elements: nothing to wrap
        periods = _NEAR_OPS.get(info.name)
        if info.name == "stablehlo.reduce" and info.attrs.get("reducer") == "add" and len(
                info.operand_types) == 2:  # a sum of the reduced elements and the init
            shape = info.operand_types[0].shape
            periods = sum_periods(info.result_types[0].dtype, 1 + math.prod(
                shape[d] for d in info.attrs["dimensions"]))
        if periods is not None and any(int_limits(t.dtype) is None or t.dtype !=
                                       info.result_types[0].dtype for t in info.operand_types):
            periods = None
        return [wrap_array(r, t.dtype, periods) for r, t in zip(results, info.result_types)] + \
            results[len(info.result_types):]

    local.__doc__ = fn.__doc__
    return local


# ----- elementwise table ----------------------------------------------------------------------

ElementwiseFn = Callable[[list[Array], dict, str, list[str]], Array]


def _unary(fn: Callable[[Element], Element]) -> ElementwiseFn:
    return lambda args, attrs, dtype, src: apply(fn, args[0])


def _binary(fn: Callable[[Element, Element], Element]) -> ElementwiseFn:
    return lambda args, attrs, dtype, src: apply(fn, args[0], args[1])


def _discrete(fn: Callable[[Element], Element]) -> ElementwiseFn:
    """A unary op that jumps (floor, sign, ...): it reads its operand rounded to the operand's
    dtype (`compared_value`), as a compare does."""
    return lambda args, attrs, dtype, src: apply(
        lambda a: fn(compared_value(a, src[0] if src else dtype)), args[0])


def _transcendental(name: str) -> ElementwiseFn:
    return lambda args, attrs, dtype, src: apply(lambda *xs: transcendental(name, *xs), *args)


def _divide(args, attrs, dtype, src) -> Array:
    integer = is_int_dtype(dtype)
    return apply(lambda a, b: div(a, b, integer), args[0], args[1])


def _remainder(args, attrs, dtype, src) -> Array:
    integer = is_int_dtype(dtype)
    return apply(lambda a, b: remainder(*compared_values(a, b, src or [dtype]), integer),
                 args[0], args[1])


def _compare(args, attrs, dtype, src) -> Array:
    direction = attrs.get("comparison_direction")
    total = attrs.get("compare_type") == "TOTALORDER"
    kinds = (src or [dtype, dtype])[:2]
    if not any(is_float_dtype(k) for k in kinds):  # integers and booleans: nothing rounds
        at_once = integer_compare(args[0], args[1], direction)
        if at_once is not None:
            return at_once
        return apply(lambda a, b: compare(a, b, direction, total), args[0], args[1])
    return apply(lambda a, b: compare(*compared_values(a, b, kinds), direction, total),
                 args[0], args[1])


def integer_compare(a: Array, b: Array, direction: str) -> Array | None:
    """`compare` of two arrays of Python integers and booleans, all elements at once (numpy
    loops over Python's own comparisons of the elements: exact at any size, `compare`'s
    result element by element); None where an element is anything else (a Z3 term)."""
    compared = ARRAY_COMPARISONS.get(direction)
    if compared is None or not (_plain_integers(a) and _plain_integers(b)):
        return None
    return np.asarray(compared(a, b), dtype=bool).astype(object)


def _plain_integers(x: Array) -> bool:
    return all(type(v) is int or type(v) is bool for v in x.flat)


def _clamp(args, attrs, dtype, src) -> Array:
    lo, x, hi = args
    return apply(lambda lo_, x_, hi_: minimum(maximum(x_, lo_), hi_), lo, x, hi)


def _convert(args, attrs, dtype, src) -> Array:
    """A convert to an integer reads its operand rounded (`compared_value`), as a compare
    does. So does a float convert that rounds, on numbers: it rounds the value its source
    dtype holds (`1.01171875 - 2^-25` is 1.01171875 in f32 and 1.015625 in bf16, not the
    single rounding's 1.0078125). On z3 terms `round_<dtype>` of the exact value is kept:
    rounding twice is monotone and keeps the values of the target dtype, all that is stated
    of `round_<dtype>`."""
    source = src[0] if src else dtype
    if is_int_dtype(dtype) or is_bool_dtype(dtype):
        return apply(lambda a: convert(compared_value(a, source), source, dtype), args[0])
    if is_float_dtype(source) and precision.rounds(source, dtype):
        return apply(lambda a: convert(a if is_z3(a) else compared_value(a, source), source,
                                       dtype), args[0])
    return apply(lambda a: convert(a, source, dtype), args[0])


def _reduce_precision(args, attrs, dtype, src) -> Array:
    e, m = int(attrs["exponent_bits"]), int(attrs["mantissa_bits"])
    return apply(lambda a: reduce_precision(a if is_z3(a) else compared_value(a, dtype), dtype,
                                            e, m), args[0])  # (numbers: as `_convert`)


def _not(args, attrs, dtype, src) -> Array:
    return apply(lambda a: logical_not(a, dtype), args[0])


def _is_finite(a: Element) -> Element:
    if is_z3(a):
        return z3.BoolVal(True)  # exact reals are finite (see element.py)
    a = pynum(a)
    return not isinstance(a, float) or math.isfinite(a)


def _arithmetic(fn: Callable[[Element, Element], Element], boolean: str) -> ElementwiseFn:
    """`fn` on numbers; on booleans (result i1) the logical op StableHLO defines it as
    (`terms.BOOLEAN_MEANING`: add is or, multiply is and)."""
    logical = logic(boolean)
    return lambda args, attrs, dtype, src: apply(logical if is_bool_dtype(dtype) else fn,
                                                 args[0], args[1])


ELEMENTWISE: dict[str, ElementwiseFn] = {
    "stablehlo.add": _arithmetic(add, "or"),
    "stablehlo.subtract": _binary(sub),
    "stablehlo.multiply": _arithmetic(mul, "and"),
    "stablehlo.divide": _divide,
    "stablehlo.remainder": _remainder,
    "stablehlo.maximum": _binary(maximum),
    "stablehlo.minimum": _binary(minimum),
    "stablehlo.power": _binary(power),
    "stablehlo.atan2": _transcendental("atan2"),
    "stablehlo.negate": _unary(neg),
    "stablehlo.abs": _unary(absolute),
    "stablehlo.sign": _discrete(sign),
    "stablehlo.floor": _discrete(floor),
    "stablehlo.ceil": _discrete(ceil),
    "stablehlo.round_nearest_afz": _discrete(round_afz),
    "stablehlo.round_nearest_even": _discrete(round_even),
    "stablehlo.is_finite": _unary(_is_finite),
    "stablehlo.exponential": _transcendental("exponential"),
    "stablehlo.exponential_minus_one": _transcendental("exponential_minus_one"),
    "stablehlo.log": _transcendental("log"),
    "stablehlo.log_plus_one": _transcendental("log_plus_one"),
    "stablehlo.tanh": _transcendental("tanh"),
    "stablehlo.logistic": _transcendental("logistic"),
    "stablehlo.rsqrt": _transcendental("rsqrt"),
    "stablehlo.sqrt": _transcendental("sqrt"),
    "stablehlo.cbrt": _transcendental("cbrt"),
    "stablehlo.sine": _transcendental("sine"),
    "stablehlo.cosine": _transcendental("cosine"),
    "stablehlo.tan": _transcendental("tan"),
    "chlo.erf": _transcendental("erf"),
    "chlo.square": lambda args, attrs, dtype, src: apply(lambda a: mul(a, a), args[0]),
    "stablehlo.compare": _compare,
    "stablehlo.select": lambda args, attrs, dtype, src: apply(select, *args),
    "stablehlo.clamp": _clamp,
    "stablehlo.and": _binary(logic("and")),
    "stablehlo.or": _binary(logic("or")),
    "stablehlo.xor": _binary(logic("xor")),
    "stablehlo.not": _not,
    "stablehlo.convert": _convert,
    "stablehlo.reduce_precision": _reduce_precision,
}
"""Elementwise ops: `fn(operands, attrs, result dtype, operand dtypes) -> result`."""


def _elementwise_op(name: str) -> LocalFn:
    fn = ELEMENTWISE[name]

    def local(info: OpInfo, operands: list[Array]) -> list[Array]:
        dtype = info.result_types[0].dtype if info.result_types else "f32"
        src = [t.dtype for t in info.operand_types]
        return [fn([obj_array(x) for x in operands], info.attrs, dtype, src)]

    local.__doc__ = f"Local semantics of {name} (elementwise)."
    return local


# ----- other local ops ------------------------------------------------------------------------

def result_shape(info: OpInfo, index: int = 0) -> tuple[int, ...]:
    """The shape of the op's result `index` (its type must be known)."""
    if len(info.result_types) <= index:
        raise SemanticsError(f"{info.name}: result type {index} is missing")
    return tuple(info.result_types[index].shape)


def _constant_value(value, dtype: str) -> Array:
    raw = np.asarray(value)
    out = np.empty(raw.shape, dtype=object)
    for idx in np.ndindex(raw.shape):
        item = raw[idx].item() if hasattr(raw[idx], "item") else raw[idx]
        if is_bool_dtype(dtype):
            out[idx] = bool(item)
        elif is_int_dtype(dtype):
            out[idx] = int(item)
        else:
            item = float(item)
            out[idx] = Fraction(item) if math.isfinite(item) else item
    return out


def _op_constant(info: OpInfo, operands: list[Array]) -> list[Array]:
    shape = result_shape(info)
    value = _constant_value(info.attrs["value"], info.result_types[0].dtype)
    if value.shape != shape:
        value = np.broadcast_to(value.reshape(-1)[:1].reshape(()) if info.attrs.get("splat")
                                else value, shape).copy()
    return [value]


def _op_iota(info: OpInfo, operands: list[Array]) -> list[Array]:
    """The positions along the iota dimension as values of the result dtype: an integer
    dtype that does not hold them wraps them, a float one rounds them (`terms.make_iota`)."""
    positions = iota(result_shape(info), info.attrs["iota_dimension"])
    dtype = info.result_types[0].dtype
    values = apply(lambda a: convert(a, IOTA_POSITIONS, dtype), positions)
    return [wrap_array(values, dtype) if int_limits(dtype) is not None else values]


def _op_broadcast(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [broadcast_in_dim(obj_array(operands[0]), info.attrs["broadcast_dimensions"],
                             result_shape(info))]


def _op_reshape(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [reshape(obj_array(operands[0]), result_shape(info))]


def _op_transpose(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [transpose(obj_array(operands[0]), info.attrs["permutation"])]


def _op_reverse(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [reverse(obj_array(operands[0]), info.attrs["dimensions"])]


def _op_slice(info: OpInfo, operands: list[Array]) -> list[Array]:
    a = info.attrs
    return [slice_(obj_array(operands[0]), a["start_indices"], a["limit_indices"],
                   a.get("strides"))]


def _op_concatenate(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [concatenate(operands, info.attrs["dimension"])]


def _op_pad(info: OpInfo, operands: list[Array]) -> list[Array]:
    a = info.attrs
    value = obj_array(operands[1]).reshape(-1)[0]
    return [pad(obj_array(operands[0]), value, a["edge_padding_low"], a["edge_padding_high"],
                a["interior_padding"])]


def _op_dot_general(info: OpInfo, operands: list[Array]) -> list[Array]:
    a = info.attrs
    return [dot_general(obj_array(operands[0]), obj_array(operands[1]), a.get("lhs_batch", ()),
                        a.get("rhs_batch", ()), a["lhs_contract"], a["rhs_contract"])]


def _op_convolution(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [convolution(obj_array(operands[0]), obj_array(operands[1]), conv_attrs(info))]


def _op_reduce(info: OpInfo, operands: list[Array]) -> list[Array]:
    half = len(operands) // 2
    reducer = info.attrs.get("reducer", "other")
    if half == 2 and reducer in ("argmax", "argmin"):
        values, indices, init_value, init_index = (obj_array(x) for x in operands)
        return list(arg_reduce(values, indices, init_value.reshape(-1)[0],
                               init_index.reshape(-1)[0], info.attrs["dimensions"], reducer,
                               info.operand_types[0].dtype))
    if half != 1:
        raise SemanticsError("variadic reduce has no semantics here but argmax / argmin")
    x, init = obj_array(operands[0]), obj_array(operands[1]).reshape(-1)[0]
    reducer = info.attrs.get("reducer", "other")
    if reducer not in ("add", "max", "min", "mul", "and", "or"):
        raise SemanticsError(f"reduce with a '{reducer}' reducer")
    reducer = dtype_kind(reducer, info.result_types[0].dtype)
    return [reduce_dims(x, info.attrs["dimensions"], reducer, init)]


def _op_reduce_window(info: OpInfo, operands: list[Array]) -> list[Array]:
    if len(operands) != 2:
        raise SemanticsError("variadic reduce_window has no semantics here")
    reducer = info.attrs.get("reducer", "other")
    if reducer not in ("add", "max", "min", "mul", "and", "or"):
        raise SemanticsError(f"reduce_window with a '{reducer}' reducer")
    a = info.attrs
    window = tuple(a["window_dimensions"])
    ones = (1,) * len(window)
    padding = a.get("padding") or [[0, 0]] * len(window)
    init = obj_array(operands[1]).reshape(-1)[0]
    reducer = dtype_kind(reducer, info.result_types[0].dtype)
    return [reduce_window(obj_array(operands[0]), reducer, init, window,
                          a.get("window_strides") or ones, a.get("base_dilations") or ones,
                          a.get("window_dilations") or ones, [p[0] for p in padding],
                          [p[1] for p in padding])]


def _scalar_of(x: Array) -> Element:
    arr = obj_array(x)
    if arr.size != 1:
        raise SemanticsError("expected a scalar index operand")
    return arr.reshape(-1)[0]


def _op_dynamic_slice(info: OpInfo, operands: list[Array]) -> list[Array]:
    x, *starts = operands
    return [dynamic_slice(obj_array(x), [_scalar_of(s) for s in starts],
                          info.attrs["slice_sizes"])]


def _op_dynamic_update_slice(info: OpInfo, operands: list[Array]) -> list[Array]:
    x, update, *starts = operands
    return [dynamic_update_slice(obj_array(x), obj_array(update),
                                 [_scalar_of(s) for s in starts])]


_DIM_LIST = re.compile(r"(\w+)\s*=\s*\[([\d,\s]*)\]")
_DIM_INT = re.compile(r"index_vector_dim\s*=\s*(\d+)")


def dimension_numbers(attrs: dict, key: str) -> dict:
    """Gather/scatter dimension numbers as a dict of tuples: taken from normalized attributes
    when present, else parsed from the attribute's text (`#stablehlo.gather<...>`)."""
    names = ("offset_dims", "collapsed_slice_dims", "operand_batching_dims",
             "start_indices_batching_dims", "start_index_map", "update_window_dims",
             "inserted_window_dims", "input_batching_dims", "scatter_indices_batching_dims",
             "scatter_dims_to_operand_dims")
    out: dict = {name: tuple(attrs[name]) for name in names if name in attrs}
    if "index_vector_dim" in attrs:
        out["index_vector_dim"] = int(attrs["index_vector_dim"])
    text = attrs.get(key)
    if isinstance(text, str):
        for name, values in _DIM_LIST.findall(text):
            out.setdefault(name, tuple(int(v) for v in values.replace(" ", "").split(",") if v))
        match = _DIM_INT.search(text)
        if match:
            out.setdefault("index_vector_dim", int(match.group(1)))
        # StableHLO prints attributes at their default value not at all: a dimension-numbers
        # attribute without index_vector_dim has it at 0 (as rules/gather_scatter.dims_of reads).
        out.setdefault("index_vector_dim", 0)
    return out


def _op_gather(info: OpInfo, operands: list[Array]) -> list[Array]:
    dims = dimension_numbers(info.attrs, "dimension_numbers")
    return [gather(obj_array(operands[0]), obj_array(operands[1]), dims,
                   info.attrs["slice_sizes"], result_shape(info))]


def _op_scatter(info: OpInfo, operands: list[Array]) -> list[Array]:
    if len(operands) != 3:
        raise SemanticsError("variadic scatter has no semantics here (single input only)")
    dims = dimension_numbers(info.attrs, "scatter_dimension_numbers")
    kind = scatter_kind(info)
    if kind not in ("replace", "add", "max", "min", "mul"):
        raise SemanticsError(f"scatter with a '{kind}' update computation")
    return [scatter(obj_array(operands[0]), obj_array(operands[1]), obj_array(operands[2]),
                    dims, kind)]


def _op_sort(info: OpInfo, operands: list[Array]) -> list[Array]:
    if info.attrs.get("comparator") != "ascending":
        raise SemanticsError("sort with a comparator other than jax's ascending order")
    if not info.attrs.get("is_stable"):
        raise SemanticsError("an unstable sort (ties in an unspecified order)")
    return sort_ascending([obj_array(x) for x in operands], int(info.attrs["dimension"]),
                          info.operand_types[0].dtype)


def _op_top_k(info: OpInfo, operands: list[Array]) -> list[Array]:
    if not info.attrs.get("largest", True):
        raise SemanticsError(f"{info.name} of the k smallest values has no semantics here")
    return list(top_k(obj_array(operands[0]), int(info.attrs["k"]), info.operand_types[0].dtype))


def _op_case(info: OpInfo, operands: list[Array]) -> list[Array]:
    """A case given its branches' results (`rules/control.py`: the walker walks the branches;
    operands are the index, then each branch's results): branch `index`, the last when the
    index is out of range, as a select chain on a symbolic index."""
    branches = int(info.attrs["branches"])
    count = len(info.result_types)
    if len(operands) != 1 + branches * count:
        raise SemanticsError("case: expected the index and every branch's results")
    index = obj_array(operands[0]).reshape(-1)[0]
    flat = [obj_array(x) for x in operands[1:]]
    out = []
    for j in range(count):
        result = flat[(branches - 1) * count + j]
        for b in range(branches - 2, -1, -1):
            hit = compare(index, b, "EQ")
            result = apply(lambda x, y, hit=hit: select(hit, x, y), flat[b * count + j], result)
        out.append(result)
    return out


def _op_identity(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [obj_array(x) for x in operands]


OP_SEMANTICS: dict[str, LocalFn] = {
    **{name: _elementwise_op(name) for name in ELEMENTWISE},
    "stablehlo.constant": _op_constant,
    "stablehlo.iota": _op_iota,
    "stablehlo.broadcast_in_dim": _op_broadcast,
    "stablehlo.reshape": _op_reshape,
    "stablehlo.transpose": _op_transpose,
    "stablehlo.reverse": _op_reverse,
    "stablehlo.slice": _op_slice,
    "stablehlo.concatenate": _op_concatenate,
    "stablehlo.pad": _op_pad,
    "stablehlo.dot_general": _op_dot_general,
    "stablehlo.convolution": _op_convolution,
    "stablehlo.reduce": _op_reduce,
    "stablehlo.reduce_window": _op_reduce_window,
    "stablehlo.dynamic_slice": _op_dynamic_slice,
    "stablehlo.dynamic_update_slice": _op_dynamic_update_slice,
    "stablehlo.gather": _op_gather,
    "stablehlo.scatter": _op_scatter,
    "chlo.top_k": _op_top_k,
    "mhlo.topk": _op_top_k,
    "stablehlo.sort": _op_sort,
    "stablehlo.case": _op_case,
    "mhlo.copy": _op_identity,
    "stablehlo.optimization_barrier": _op_identity,
}
"""Local (per-device) semantics: `fn(info, operands) -> results`, keyed by op name."""
OP_SEMANTICS.update({name: _wrapped_local(OP_SEMANTICS[name]) for name in WRAPPED_OPS
                     if name in OP_SEMANTICS})
