"""Value ranges of float tensors in their dtype: which values can overflow.

A proof may assume that the program's inputs hold no NaN/Inf and that float sums and products
are reassociated (DESIGN.md, "Semantics policy"); nothing else. A product, a sum or an `exp` of
finite values is not finite in general: `exp(100.0)` is inf in float32. So where a rewrite is
exact only while values stay finite (`idioms.py`), or an analysis wants to know that a value
holds no infinity (`finite.nonfinite_kinds`), the value's range decides.

`interval(value)` is `(lo, hi)`, the smallest and largest values it may hold, each a float or
-inf/+inf: an endpoint past the dtype's largest finite value is the infinity the value may
overflow to (no finite bound is known). Inputs lie within the dtype's finite range; constants,
iotas, bounded functions (tanh, logistic, sine, exp of a bounded value, `x - max(x) <= 0`)
and arithmetic on bounded values give bounds, with a sum over n elements n times its
elements' bounds (any order of summation stays within them). NaN is not tracked here
(`finite.nonfinite_kinds` does).

The interval arithmetic and each elementwise op's bounds (`ranges.ELEMENTWISE_BOUNDS`) are
shared with the same analysis on reference terms (`terms.term_interval`), which also tracks
NaN, since the term builder folds `0 * t` and a cancelled `t - t` to zero only where `t` is
finite.
"""

from __future__ import annotations

import math
import re

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.core.ranges import (
    ELEMENTWISE_BOUNDS,
    FLOAT_MAX,
    FLOAT_TINY,
    INF,
    UNBOUNDED,
    Interval,
    add,
    clamp,
    hull,
    mul,
    rounded,
    times,
)
from entangle_mlir.mlir.opinfo import constant_value, reducer_kind
from entangle_mlir.normalize.match import (
    defining_op,
    finite_test,
    i64s,
    index_map,
    max_reduce,
    operands_first,
    remembered,
    root_of,
    same_along,
    same_attribute,
    shape_of,
    splat_of,
)

_SAME = frozenset({
    "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose",
    "stablehlo.slice", "stablehlo.concatenate", "stablehlo.reverse",
    "stablehlo.collective_permute", "stablehlo.all_gather", "stablehlo.all_to_all",
    "stablehlo.optimization_barrier", "chlo.top_k"})
"""Ops whose result holds only values of their operands."""


def dtype_name(value) -> str:
    element = ir.RankedTensorType(value.type).element_type
    if isinstance(element, ir.IntegerType):
        return "int"
    text = str(element)
    return text if text in FLOAT_MAX else "other"


def largest(value) -> float:
    """The largest finite value of `value`'s float dtype (inf for other dtypes)."""
    return FLOAT_MAX.get(dtype_name(value), INF)


def log_largest(value) -> float:
    return math.log(largest(value)) if largest(value) < INF else INF


def log_tiny(value) -> float:
    """log of the smallest normal value of `value`'s dtype (-inf for non-float dtypes)."""
    tiny = FLOAT_TINY.get(dtype_name(value))
    return math.log(tiny) if tiny else -INF


def is_finite(value, memo: dict | None = None) -> bool:
    """`value` cannot overflow: both ends of its range are finite."""
    lo, hi = interval(value, memo)
    return -INF < lo and hi < INF


def interval(value, memo: dict | None = None) -> Interval:
    """(lo, hi) of `value` (see the module docstring); `memo` is shared across calls.
    Iterative: a layer's cone is the whole program before it."""
    memo = {} if memo is None else memo
    for top, op, outer in operands_first(value, memo):
        if outer is not None:
            memo[top] = memo[outer]
        else:
            try:
                found = _interval_of(top, op, memo)
            except (ValueError, TypeError, OverflowError, KeyError, IndexError):
                found = UNBOUNDED
            kind = dtype_name(top)
            memo[top] = clamp(rounded(found, kind), largest(top)) if kind != "int" else found
    return memo[value]


def _interval_of(value, op: ir.Operation | None, memo: dict) -> Interval:
    if op is None:
        return _input(value)
    name = op.name
    args = [memo[v] for v in op.operands]
    if name == "stablehlo.constant":
        array, _ = constant_value(op.attributes["value"])
        array = np.asarray(array, dtype=float)
        if array.size == 0 or np.isnan(array).any():
            return UNBOUNDED
        return float(array.min()), float(array.max())
    if name == "stablehlo.iota":
        size = shape_of(value)[ir.IntegerAttr(op.attributes["iota_dimension"]).value]
        return 0.0, float(max(size - 1, 0))
    if name in _SAME:
        return hull(args)
    if name == "stablehlo.bitcast_convert":
        return UNBOUNDED
    if name == "stablehlo.pad":
        return hull(args[:2])
    if name in ("stablehlo.dynamic_slice", "stablehlo.gather"):
        return args[0]
    if name == "stablehlo.dynamic_update_slice":
        return hull(args[:2])
    if name == "stablehlo.subtract":
        lo, hi = add(args[0], (-args[1][1], -args[1][0]))
        if _dominates(op.operands[1], op.operands[0]):
            hi = min(hi, 0.0)
        return lo, hi
    if name in ELEMENTWISE_BOUNDS:
        return ELEMENTWISE_BOUNDS[name][0](args)
    if name == "stablehlo.dot_general":
        dims = i64s(op, "lhs_contracting_dimensions") if "lhs_contracting_dimensions" in \
            op.attributes else _contracting(op)
        count = math.prod(shape_of(op.operands[0])[d] for d in dims)
        return times(mul(args[0], args[1]), count)
    if name == "stablehlo.reduce" and len(op.operands) == 2:
        kind = reducer_kind(op)
        count = math.prod(shape_of(op.operands[0])[d] for d in i64s(op, "dimensions"))
        if kind == "add":
            return add(times(args[0], count), args[1])
        if kind in ("max", "min"):
            pick = max if kind == "max" else min
            if count == 0:
                return args[1]
            return pick(args[0][0], args[1][0]), pick(args[0][1], args[1][1])
        return UNBOUNDED
    if name in ("stablehlo.all_reduce", "stablehlo.reduce_scatter") and len(op.operands) == 1:
        kind = reducer_kind(op)
        if kind in ("max", "min"):
            return args[0]
        if kind == "add":
            return times(args[0], group_size(op))
    return UNBOUNDED


def _input(value) -> Interval:
    """A function argument is a program input: finite by assumption, any finite value of its
    dtype. Loop carries and other block arguments are unbounded."""
    owner = value.owner
    op = owner.owner if isinstance(owner, ir.Block) else None
    if op is not None and op.operation.name == "func.func":
        top = largest(value)
        return -top, top
    return UNBOUNDED


def _contracting(op: ir.Operation) -> list[int]:
    text = str(op.attributes["dot_dimension_numbers"])
    found = re.search(r"lhs_contracting_dimensions = \[([\d, ]*)\]", text)
    return [int(d) for d in found.group(1).split(",") if d.strip()] if found else []


def group_size(op: ir.Operation) -> int:
    """The largest replica group of a collective (every device when it has none)."""
    groups = np.array(ir.DenseIntElementsAttr(op.attributes["replica_groups"])) \
        if "replica_groups" in op.attributes else np.zeros((0,))
    if groups.size == 0:
        module = op
        while module is not None and module.name != "builtin.module":
            parent = module.parent
            module = parent.operation if parent is not None else None
        if module is None:
            return 1 << 30
        attrs = module.attributes
        return max(ir.IntegerAttr(attrs[n]).value if n in attrs else 1
                   for n in ("mhlo.num_partitions", "mhlo.num_replicas")) or 1
    return int(groups.reshape(len(groups), -1).shape[1])


def _dominates(b, a) -> bool:
    """`b >= a` elementwise: `b` is a broadcast, along dims D, of a row max of `a` over D
    (`x - max(x)`), possibly through a running max `maximum(m_old, max(x))` (whose rows
    bound `m_old` and `x` alike, so blocks of a concatenation along D are bounded by the
    maxes of each), a pmax (an all_reduce max of the local max), or jax's
    `select(is_finite(m), m, 0)` guard."""
    root, chain = root_of(b)
    if not chain and _reached(root, a):
        return True
    maxima: dict[tuple[int, ...], list] = {}
    for reduce in _row_maxima(root):
        dims = tuple(max_reduce(reduce))
        maxima.setdefault(dims, []).append(reduce.operands[0])
    if not chain and shape_of(a) == shape_of(root):
        # `a` a row max too (a running max before the last block): rows of fewer elements
        mine = _row_maxima(a)
        return bool(mine) and _only_maxima(a) and all(
            splat_of(reduce.operands[1], -math.inf) and any(
                _covered(reduce.operands[0], dims, parts) for dims, parts in maxima.items()
                if tuple(max_reduce(reduce)) == dims) for reduce in mine)
    for dims, parts in maxima.items():
        sub_index = index_map(root, chain, list(dims))
        if sub_index is None or not same_along(sub_index, list(dims), index_map(root, [])):
            continue
        if _covered(a, dims, parts):
            return True
    return False


def _row_maxima(root) -> list:
    """The max reductions `root` is the max of (elementwise, through maximum, pmax and
    jax's is_finite guard), each with the shape of `root`."""
    return [op for _, op in _max_leaves(root, same_shape=True)
            if max_reduce(op) is not None]


def _only_maxima(value) -> bool:
    """`value` is built by maximum ops (and the guards `_row_maxima` passes through) from
    row maxima alone, so it is at most the largest of them."""
    return all(op is not None and (max_reduce(op) is not None
                                   or splat_of(leaf, -math.inf))
               for leaf, op in _max_leaves(value, same_shape=False))


def _max_leaves(root, same_shape: bool) -> list:
    """(value, defining op or None) of the values `root` takes the max of: the walk goes
    through maximum, a max all_reduce (pmax) and jax's is_finite guard; with `same_shape`,
    values of another shape than `root`'s (and block arguments) are left out."""
    leaves, pending, seen = [], [root], set()
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        op = defining_op(value)
        if same_shape and (op is None or shape_of(value) != shape_of(root)):
            continue
        if op is not None and op.name == "stablehlo.maximum":
            pending.extend(op.operands)
        elif op is not None and op.name == "stablehlo.all_reduce" and \
                len(op.operands) == 1 and reducer_kind(op) == "max":
            pending.append(op.operands[0])
        elif op is not None and op.name == "stablehlo.select" and \
                finite_test(op.operands[0], op.operands[1]):
            pending.append(op.operands[1])
        else:
            leaves.append((value, op))
    return leaves


def _reached(root, a) -> bool:
    """`root` is `maximum(..., a, ...)` (through maxima of the same shape)."""
    pending, seen = [root], set()
    while pending:
        value = pending.pop()
        if _same_value(value, a):
            return True
        if value in seen:
            continue
        seen.add(value)
        op = defining_op(value)
        if op is not None and op.name == "stablehlo.maximum":
            pending.extend(op.operands)
    return False


def _covered(a, dims: tuple[int, ...], parts: list) -> bool:
    """Every element of `a` lies in one of `parts` (each reduced over `dims` into the same
    rows): `a` is one of them or a concatenation of covered blocks along one of `dims`."""
    if any(_same_value(a, p) for p in parts):
        return True
    op = defining_op(a)
    if op is None or op.name != "stablehlo.concatenate" or \
            ir.IntegerAttr(op.attributes["dimension"]).value not in dims:
        return False
    return all(_covered(v, dims, parts) for v in op.operands)


def computed_alike(x, y) -> bool:
    """`x` and `y` are the same value, or computed alike (`_same_value`): equal on every
    device. (Remembered across rewrite attempts: the ring's backward asks about the same
    pairs of blocks after every rewrite.)"""
    if x == y:
        return True
    return remembered(("computed_alike", x, y), lambda: _same_value(x, y))


def _same_value(x, y, budget: list[int] | None = None) -> bool:
    """`x` and `y` are the same value, or computed alike (the same ops, attributes and types
    over the same values: jax recomputes a masked score block for the softmax's max and its
    exponent). At most 256 ops are compared."""
    if x == y:
        return True
    budget = [4096] if budget is None else budget
    budget[0] -= 1
    ox, oy = defining_op(x), defining_op(y)
    if budget[0] < 0 or ox is None or oy is None or ox.name != oy.name or x.type != y.type:
        return False
    if len(ox.operands) != len(oy.operands) or len(ox.regions) or len(oy.regions):
        return False
    if ox.name == "stablehlo.constant":
        return same_attribute(ox.attributes["value"], oy.attributes["value"])
    if not _same_attributes(ox, oy):
        return False
    if list(ox.results).index(x) != list(oy.results).index(y):
        return False
    return all(_same_value(p, q, budget) for p, q in zip(ox.operands, oy.operands))


def _same_attributes(a: ir.Operation, b: ir.Operation) -> bool:
    """`a` and `b` have the same attributes: the same names, each printing alike."""
    first, second = a.attributes, b.attributes
    if len(first) != len(second):
        return False
    named = {first[i].name: first[i].attr for i in range(len(first))}
    for i in range(len(second)):
        other = second[i]
        mine = named.get(other.name)
        if mine is None or not same_attribute(mine, other.attr):
            return False
    return True
