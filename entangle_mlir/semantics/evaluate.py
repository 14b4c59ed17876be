"""The value of a reference term: `evaluate_term(term, env)`, the GLOBAL value of a
`core.terms.Term` given arrays for its leaves.

Every op string a term can carry (`TERM_OPS`) is handled explicitly: by an array function of
`tensor.py`, or by the op table of `ops.py` for elementwise and indexed (gather, scatter,
dynamic_update_slice) terms, so a term and the op it stands for share one semantics. Integer
terms wrap around in their dtype as the op does (`wrap_node`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import reduce as _fold

from entangle_mlir.core.terms import COMMUTATIVE, Term, post_order
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from entangle_mlir.semantics.element import (
    SemanticsError,
    add,
    as_int,
    div,
    dtype_kind,
    int_limits,
    is_bool_dtype,
    is_int_dtype,
    mul,
    range_periods,
    sum_periods,
)
from entangle_mlir.semantics.ops import ELEMENTWISE, OP_SEMANTICS, WRAPPED_OPS
from entangle_mlir.semantics.tensor import (
    Array,
    apply,
    arg_reduce,
    broadcast_in_dim,
    concatenate,
    dot_general,
    dynamic_slice,
    full,
    iota,
    obj_array,
    pad,
    reduce_dims,
    reduce_window,
    reshape,
    reverse,
    slice_,
    sort_ascending,
    top_k,
    transpose,
    wrap_array,
)

TermEnv = dict
"""`{arg index: array}`; optional `("dense", key): array` entries give dense constants, and the
key `"dense"` may map to a callable `(term) -> array` used for dense constants not listed.
Loop terms are values the semantics does not compute: `("loopvar", depth, index): array` for a
loop variable, `("term", serial): array` for a `while_result` or a `region_result`, else the
callable under
`"opaque"`."""

_INDEXED_TERM_OPS = ("stablehlo.gather", "stablehlo.scatter", "stablehlo.dynamic_update_slice",
                     "stablehlo.convolution")
"""Terms evaluated by their op's own semantics, attributes given as (name, value) pairs."""

ARG_TERM_OPS = ("argmax", "argmin")
"""Result `result` (0 the values, 1 the indices) of a reduce over (values, indices, init value,
init index) with jax's argmax / argmin comparator; attrs (dims, result)."""

_WINDOW_TERM_OPS = {"reduce_window_sum": "sum", "reduce_window_max": "max",
                    "reduce_window_min": "min", "reduce_window_mul": "mul"}
"""reduce_window terms (init value: the reducer's identity); attrs as `rules/reduction`
builds them: (window, strides, base dilations, window dilations, padding low, high)."""

_OPAQUE_LEAVES = ("loopvar", "while_result", "region_result")
"""Terms evaluated as given values (a loop's carried value / result, a summarized layer's
result), not computed."""


def wrap_node(term: Term, value: Array) -> Array:
    """A term node's value in its dtype: integer sums, products, quotients and converts wrap
    around (`WRAPPED_OPS`)."""
    if term.op not in WRAPPED_OPS or int_limits(term.dtype) is None:
        return value
    return wrap_array(value, term.dtype, _lin_periods(term))


def _lin_periods(term: Term) -> int | None:
    """How many ranges of its dtype a `lin` or `reduce_sum` of values of the dtype can leave
    (None: unknown, or not such a node): a few exact corrections then replace z3's modulo."""
    limits = int_limits(term.dtype)
    if limits is None:
        return None
    if term.op == "reduce_sum":
        if term.args[0].dtype != term.dtype:
            return None
        return sum_periods(term.dtype, math.prod(term.args[0].shape[d] for d in term.attrs[0]))
    if term.op != "lin":
        return None
    constant, coefs = term.attrs
    lo, hi = limits
    if not all(isinstance(k, Fraction) and k.denominator == 1 for k in (constant, *coefs)):
        return None
    low = high = int(constant)
    for k in coefs:
        low += min(k * lo, k * hi)
        high += max(k * lo, k * hi)
    return range_periods(term.dtype, low, high)


def evaluate_term(term: Term, env: TermEnv, memo: dict[int, Array] | None = None) -> Array:
    """The value of a reference term (global shape), given arrays for its `arg` leaves.

    Every op string a term can carry is handled explicitly; an unknown one raises
    `SemanticsError` naming it.
    """
    memo = {} if memo is None else memo
    for top in post_order(term, memo):
        value = evaluate_node(top, [memo[a.serial] for a in top.args], env)
        value = wrap_node(top, value)
        if value.shape != tuple(top.shape):
            raise SemanticsError(f"term {top.op} evaluated to shape {value.shape}, "
                                 f"expected {top.shape}")
        memo[top.serial] = value
    return memo[term.serial]


def evaluate_node(term: Term, args: list[Array], env: TermEnv) -> Array:
    """The value of one term node from its arguments' values (before `wrap_node`)."""
    op, attrs, shape = term.op, term.attrs, tuple(term.shape)
    if op == "arg":
        index = attrs[0]
        if index not in env:
            raise SemanticsError(f"no value for %arg{index}")
        value = obj_array(env[index])
        if value.shape != shape:
            raise SemanticsError(f"%arg{index} has shape {value.shape}, expected {shape}")
        return value
    if op == "splat":
        value = attrs[0]
        if is_int_dtype(term.dtype):
            value = as_int(value)
        elif is_bool_dtype(term.dtype) and not isinstance(value, float):
            value = bool(value)
        return full(shape, value)
    if op == "dense":
        key = ("dense", attrs[0])
        if key in env:
            return obj_array(env[key]).reshape(shape)
        resolver = env.get("dense")
        if resolver is None:
            raise SemanticsError("dense constant without a value (pass ('dense', key) in env)")
        return obj_array(resolver(term))
    if op == "iota":
        return iota(shape, attrs[0])
    if op in _OPAQUE_LEAVES:
        key = (op, *attrs[:2]) if op == "loopvar" else ("term", term.serial)
        if key in env:
            return obj_array(env[key]).reshape(shape)
        resolver = env.get("opaque")
        if resolver is None:
            raise SemanticsError(f"{op} term without a value (pass {key!r} or an 'opaque' "
                                 "resolver in env)")
        return obj_array(resolver(term))
    if op == "dynamic_slice":
        (sizes,) = attrs
        return dynamic_slice(args[0], [obj_array(a).reshape(-1)[0] for a in args[1:]], sizes)
    if op in ("lin", "mul", "div") and is_bool_dtype(term.dtype):
        raise SemanticsError(f"a {op} term of booleans (i1): arithmetic on i1 is logical "
                             "(`terms.BOOLEAN_MEANING`), no term should carry it")
    if op == "lin":
        constant, coefs = attrs
        if is_int_dtype(term.dtype):  # integer coefficients stay in z3's Int sort
            constant, coefs = as_int(constant), tuple(as_int(k) for k in coefs)
        out = full(shape, constant) if constant != 0 else None
        for k, value in zip(coefs, args):
            scaled = value if k == 1 else apply(lambda x, k=k: mul(k, x), value)
            out = scaled if out is None else apply(add, out, scaled)
        return out if out is not None else full(shape, 0)
    if op == "mul":
        return _fold(lambda a, b: apply(mul, a, b), args)
    if op == "div":
        integer = is_int_dtype(term.dtype)
        return apply(lambda a, b: div(a, b, integer), args[0], args[1])
    if op == "broadcast":
        return broadcast_in_dim(args[0], attrs[0], shape)
    if op == "reshape":
        return reshape(args[0], shape)
    if op == "transpose":
        return transpose(args[0], attrs[0])
    if op == "stablehlo.reverse":
        return reverse(args[0], attrs[0])
    if op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or", "reduce_mul"):
        return reduce_dims(args[0], attrs[0], dtype_kind(op.split("_")[1], term.dtype))
    if op in _WINDOW_TERM_OPS:
        window, strides, base, dilation, low, high = attrs
        kind = dtype_kind(_WINDOW_TERM_OPS[op], term.dtype)
        identity = {"sum": 0, "mul": 1, "max": -math.inf, "min": math.inf, "or": False,
                    "and": True}[kind]
        return reduce_window(args[0], kind, identity, window, strides, base, dilation, low,
                             high)
    if op == "slice":
        starts, limits, strides = attrs
        return slice_(args[0], starts, limits, strides)
    if op == "concatenate":
        return concatenate(args, attrs[0])
    if op == "pad":
        low, high, interior = attrs
        value = obj_array(args[1]).reshape(-1)[0]
        return pad(args[0], value, low, high, interior)
    if op == "stablehlo.dot_general":
        lb, rb, lc, rc = attrs
        return dot_general(args[0], args[1], lb, rb, lc, rc)
    if op == "chlo.top_k":
        k, result = attrs
        return top_k(args[0], k, term.args[0].dtype)[result]
    if op == "sort":
        dim, result = attrs
        return sort_ascending(args, dim, term.args[0].dtype)[result]
    if op in ARG_TERM_OPS:
        dims, result = attrs
        return arg_reduce(args[0], args[1], obj_array(args[2]).reshape(-1)[0],
                          obj_array(args[3]).reshape(-1)[0], dims, op,
                          term.args[0].dtype)[result]
    if op in _INDEXED_TERM_OPS:
        # attrs: the op's normalized attributes as sorted (name, value) pairs.
        info = OpInfo(op, dict(attrs), [TensorType(a.shape, a.dtype) for a in term.args],
                      [TensorType(shape, term.dtype)])
        return OP_SEMANTICS[op](info, args)[0]
    if op in ELEMENTWISE:
        named = {"comparison_direction": attrs[0]} if op == "stablehlo.compare" and attrs else {}
        if op == "stablehlo.compare" and len(attrs) > 1:
            named["compare_type"] = attrs[1]
        if op == "stablehlo.reduce_precision":
            named = {"exponent_bits": attrs[0], "mantissa_bits": attrs[1]}
        src = [a.dtype for a in term.args]
        if op == "stablehlo.convert" and attrs:
            src = [attrs[0]]  # the dtype the operand was computed in (its term may say less)
        if op in COMMUTATIVE and len(args) > 2:  # flattened by the term builder
            fn = ELEMENTWISE[op]
            return _fold(lambda a, b: fn([a, b], named, term.dtype, src), args)
        return ELEMENTWISE[op](args, named, term.dtype, src)
    raise SemanticsError(f"evaluate_term: unknown term op {op!r}")


TERM_OPS = ("arg", "splat", "dense", "iota", "lin", "mul", "div", "broadcast", "reshape",
            "transpose", "stablehlo.reverse", "reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or", "reduce_mul", "slice", "concatenate", "pad",
            "dynamic_slice", "stablehlo.dot_general", "chlo.top_k", "sort", *ARG_TERM_OPS,
            *_INDEXED_TERM_OPS,
            *_OPAQUE_LEAVES, *_WINDOW_TERM_OPS,
            *ELEMENTWISE)
"""Every term op `evaluate_term` knows (for the coverage test against the rules)."""
