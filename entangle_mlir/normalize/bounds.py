"""Value ranges of float tensors in their dtype: which values can overflow.

A proof may assume that the program's inputs hold no NaN/Inf and that float sums and products
are reassociated (DESIGN.md, "Semantics policy"); nothing else. A product, a sum or an `exp` of
finite values is not finite in general: `exp(100.0)` is inf in float32. So where a rewrite is
exact only while values stay finite (`idioms.py`), or an analysis wants to know that a value
holds no infinity (`idioms._kinds`), the value's range decides.

`interval(value)` is `(lo, hi)`, the smallest and largest values it may hold, each a float or
-inf/+inf: an endpoint past the dtype's largest finite value is the infinity the value may
overflow to (no finite bound is known). Inputs lie within the dtype's finite range; constants,
iotas, bounded functions (tanh, logistic, sine, exp of a bounded value, `x - max(x) <= 0`)
and arithmetic on bounded values give bounds, with a sum over n elements n times its
elements' bounds (any order of summation stays within them). NaN is not tracked here
(`idioms._kinds` does).

`term_interval(term)` is the same analysis on reference terms (`terms.py`), from the same
table of elementwise bounds (`ELEMENTWISE_BOUNDS`); it also tracks NaN (an operand outside
an op's domain), since the term builder folds `0 * t` and a cancelled `t - t` to zero only
where `t` is finite (`term_finite`).
"""

from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir

INF = math.inf
UNBOUNDED = (-INF, INF)

_MAX = {"f64": float(np.finfo(np.float64).max), "f32": float(np.finfo(np.float32).max),
        "f16": float(np.finfo(np.float16).max), "bf16": 3.3895313892515355e38}
_TINY = {"f64": float(np.finfo(np.float64).tiny), "f32": float(np.finfo(np.float32).tiny),
         "f16": float(np.finfo(np.float16).tiny), "bf16": 1.1754943508222875e-38}
"""Largest finite and smallest normal value of each float dtype."""

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
    return text if text in _MAX else "other"


def largest(value) -> float:
    """The largest finite value of `value`'s float dtype (inf for other dtypes)."""
    return _MAX.get(dtype_name(value), INF)


def log_largest(value) -> float:
    return math.log(largest(value)) if largest(value) < INF else INF


def log_tiny(value) -> float:
    """log of the smallest normal value of `value`'s dtype (-inf for non-float dtypes)."""
    tiny = _TINY.get(dtype_name(value))
    return math.log(tiny) if tiny else -INF


def is_finite(value, memo: dict | None = None) -> bool:
    """`value` cannot overflow: both ends of its range are finite."""
    lo, hi = interval(value, memo)
    return -INF < lo and hi < INF


def interval(value, memo: dict | None = None) -> tuple[float, float]:
    """(lo, hi) of `value` (see the module docstring); `memo` is shared across calls.
    Iterative: a layer's cone is the whole program before it."""
    from entangle_mlir.normalize.idioms import operands_first

    memo = {} if memo is None else memo
    for top, op, outer in operands_first(value, memo):
        if outer is not None:
            memo[top] = memo[outer]
        else:
            try:
                found = _interval_of(top, op, memo)
            except (ValueError, TypeError, OverflowError, KeyError, IndexError):
                found = UNBOUNDED
            memo[top] = _clamp(found, largest(top)) if dtype_name(top) != "int" else found
    return memo[value]


def _clamp(bounds: tuple[float, float], top: float) -> tuple[float, float]:
    """Endpoints past the dtype's finite range become the infinity they overflow to."""
    lo, hi = bounds
    if math.isnan(lo) or math.isnan(hi):
        return UNBOUNDED
    return (-INF if lo < -top else lo, INF if hi > top else hi)


def _interval_of(value, op: ir.Operation | None, memo: dict) -> tuple[float, float]:
    from entangle_mlir.mlir.opinfo import constant_value, reducer_kind
    from entangle_mlir.normalize.idioms import _i64s, _shape

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
        size = _shape(value)[ir.IntegerAttr(op.attributes["iota_dimension"]).value]
        return 0.0, float(max(size - 1, 0))
    if name in _SAME:
        return _hull(args)
    if name == "stablehlo.bitcast_convert":
        return UNBOUNDED
    if name == "stablehlo.pad":
        return _hull(args[:2])
    if name in ("stablehlo.dynamic_slice", "stablehlo.gather"):
        return args[0]
    if name == "stablehlo.dynamic_update_slice":
        return _hull(args[:2])
    if name == "stablehlo.subtract":
        lo, hi = _add(args[0], (-args[1][1], -args[1][0]))
        if _dominates(op.operands[1], op.operands[0]):
            hi = min(hi, 0.0)
        return lo, hi
    if name in ELEMENTWISE_BOUNDS:
        return ELEMENTWISE_BOUNDS[name][0](args)
    if name == "stablehlo.dot_general":
        dims = _i64s(op, "lhs_contracting_dimensions") if "lhs_contracting_dimensions" in \
            op.attributes else _contracting(op)
        count = math.prod(_shape(op.operands[0])[d] for d in dims)
        return _times(_mul(args[0], args[1]), count)
    if name == "stablehlo.reduce" and len(op.operands) == 2:
        kind = reducer_kind(op)
        count = math.prod(_shape(op.operands[0])[d] for d in _i64s(op, "dimensions"))
        if kind == "add":
            return _add(_times(args[0], count), args[1])
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
            return _times(args[0], _group_size(op))
    return UNBOUNDED


def _input(value) -> tuple[float, float]:
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
    import re

    found = re.search(r"lhs_contracting_dimensions = \[([\d, ]*)\]", text)
    return [int(d) for d in found.group(1).split(",") if d.strip()] if found else []


def _group_size(op: ir.Operation) -> int:
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


def _hull(args: list[tuple[float, float]]) -> tuple[float, float]:
    return min(a[0] for a in args), max(a[1] for a in args)


def _add(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    lo, hi = a[0] + b[0], a[1] + b[1]
    return (-INF if math.isnan(lo) else lo), (INF if math.isnan(hi) else hi)


def _products(a, b) -> list[float]:
    out = []
    for x in a:
        for y in b:
            out.append(math.nan if (x == 0 and math.isinf(y)) or (y == 0 and math.isinf(x))
                       else x * y)
    return out


def _mul(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    products = _products(a, b)
    if any(math.isnan(p) for p in products):
        return UNBOUNDED
    return min(products), max(products)


def _div(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    if b[0] <= 0 <= b[1]:
        return UNBOUNDED
    inverse = (1 / b[1], 1 / b[0])
    return _mul(a, inverse)


def _times(a: tuple[float, float], count: int) -> tuple[float, float]:
    if count == 0:
        return 0.0, 0.0
    return a[0] * count, a[1] * count


def _power(base: tuple[float, float], exponent: tuple[float, float]) -> tuple[float, float]:
    """`base ** exponent` for a positive base (monotonic in each argument); else unbounded."""
    if base[0] <= 0 or math.isinf(base[1]) or math.isinf(exponent[0]) or math.isinf(
            exponent[1]):
        return UNBOUNDED
    ends = []
    for b in base:
        for e in exponent:
            try:
                ends.append(b ** e)
            except OverflowError:
                ends.append(INF)
    return min(ends), max(ends)


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def _abs(a: tuple[float, float]) -> tuple[float, float]:
    lo, hi = a
    return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))


def _log(a: tuple[float, float]) -> tuple[float, float]:
    lo, hi = a
    return (math.log(lo) if lo > 0 else -INF), (math.log(hi) if hi > 0 else -INF)


def _rsqrt(a: tuple[float, float]) -> tuple[float, float]:
    lo, hi = a
    return (1 / math.sqrt(hi) if 0 < hi < INF else 0.0), (1 / math.sqrt(lo) if lo > 0 else INF)


def _clamp_op(args: list[tuple[float, float]]) -> tuple[float, float]:
    """`clamp(min, x, max) = min(max(x, min), max)`, endpoint by endpoint (monotonic)."""
    low, x, high = args
    return min(max(x[0], low[0]), high[0]), min(max(x[1], low[1]), high[1])


Interval = tuple[float, float]

ELEMENTWISE_BOUNDS: dict[str, tuple[object, float | None]] = {
    "stablehlo.negate": (lambda a: (-a[0][1], -a[0][0]), None),
    "stablehlo.abs": (lambda a: _abs(a[0]), None),
    "stablehlo.add": (lambda a: _add(a[0], a[1]), None),
    "stablehlo.subtract": (lambda a: _add(a[0], (-a[1][1], -a[1][0])), None),
    "stablehlo.multiply": (lambda a: _mul(a[0], a[1]), None),
    "stablehlo.divide": (lambda a: _div(a[0], a[1]), None),
    "stablehlo.maximum": (lambda a: (max(x[0] for x in a), max(x[1] for x in a)), None),
    "stablehlo.minimum": (lambda a: (min(x[0] for x in a), min(x[1] for x in a)), None),
    "stablehlo.clamp": (_clamp_op, None),
    "stablehlo.select": (lambda a: _hull(a[1:]), None),
    "stablehlo.convert": (lambda a: a[0], None),
    "stablehlo.exponential": (lambda a: (_exp(a[0][0]), _exp(a[0][1])), None),
    "stablehlo.exponential_minus_one": (lambda a: (_exp(a[0][0]) - 1, _exp(a[0][1]) - 1),
                                        None),
    "stablehlo.log": (lambda a: _log(a[0]), 0.0),
    "stablehlo.tanh": (lambda a: (max(-1.0, math.tanh(a[0][0])), min(1.0, math.tanh(a[0][1]))),
                       None),
    "stablehlo.logistic": (lambda a: (0.0, 1.0), None),
    "stablehlo.sine": (lambda a: (-1.0, 1.0), None),
    "stablehlo.cosine": (lambda a: (-1.0, 1.0), None),
    "chlo.erf": (lambda a: (-1.0, 1.0), None),
    "stablehlo.sign": (lambda a: (-1.0, 1.0), None),
    "stablehlo.sqrt": (lambda a: (math.sqrt(max(a[0][0], 0.0)), math.sqrt(max(a[0][1], 0.0))),
                       0.0),
    "stablehlo.rsqrt": (lambda a: _rsqrt(a[0]), 0.0),
    "stablehlo.power": (lambda a: _power(a[0], a[1]), None),
    "chlo.square": (lambda a: _mul(a[0], a[0]), None),
}
"""Elementwise op -> (its range from its operands' ranges, the least first operand for which
it is a number: below it the op gives NaN, e.g. `sqrt(-1)`; None when every finite operand
gives a number or NaN only comes from ranges the function already calls unbounded). Shared by
the IR analysis (`interval`) and the term analysis (`term_interval`); NaN matters to the
latter only (`0 * sqrt(x)` is NaN for x < 0), so the IR analysis ignores the domain."""


def _dominates(b, a) -> bool:
    """`b >= a` elementwise: `b` is a broadcast, along dims D, of a row max of `a` over D
    (`x - max(x)`), possibly through a running max `maximum(m_old, max(x))` (whose rows
    bound `m_old` and `x` alike, so blocks of a concatenation along D are bounded by the
    maxes of each), a pmax (an all_reduce max of the local max), or jax's
    `select(is_finite(m), m, 0)` guard."""
    from entangle_mlir.normalize import idioms

    root, chain = idioms._root(b)
    if not chain and _reached(root, a):
        return True
    maxima: dict[tuple[int, ...], list] = {}
    for reduce in _row_maxima(root):
        dims = tuple(idioms._max_reduce(reduce))
        maxima.setdefault(dims, []).append(reduce.operands[0])
    if not chain and idioms._shape(a) == idioms._shape(root):
        # `a` a row max too (a running max before the last block): rows of fewer elements
        mine = _row_maxima(a)
        return bool(mine) and _only_maxima(a) and all(
            idioms._splat_of(reduce.operands[1], -math.inf) and any(
                _covered(reduce.operands[0], dims, parts) for dims, parts in maxima.items()
                if tuple(idioms._max_reduce(reduce)) == dims) for reduce in mine)
    for dims, parts in maxima.items():
        sub_index = idioms._index_map(root, chain, list(dims))
        if sub_index is None or not idioms._same_along(sub_index, list(dims),
                                                       idioms._index_map(root, [])):
            continue
        if _covered(a, dims, parts):
            return True
    return False


def _row_maxima(root) -> list:
    """The max reductions `root` is the max of (elementwise, through maximum, pmax and
    jax's is_finite guard), each with the shape of `root`."""
    from entangle_mlir.normalize import idioms

    return [op for _, op in _max_leaves(root, same_shape=True)
            if idioms._max_reduce(op) is not None]


def _only_maxima(value) -> bool:
    """`value` is built by maximum ops (and the guards `_row_maxima` passes through) from
    row maxima alone, so it is at most the largest of them."""
    from entangle_mlir.normalize import idioms

    return all(op is not None and (idioms._max_reduce(op) is not None
                                   or idioms._splat_of(leaf, -math.inf))
               for leaf, op in _max_leaves(value, same_shape=False))


def _max_leaves(root, same_shape: bool) -> list:
    """(value, defining op or None) of the values `root` takes the max of: the walk goes
    through maximum, a max all_reduce (pmax) and jax's is_finite guard; with `same_shape`,
    values of another shape than `root`'s (and block arguments) are left out."""
    from entangle_mlir.normalize import idioms

    leaves, pending, seen = [], [root], set()
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        op = idioms._def(value)
        if same_shape and (op is None or idioms._shape(value) != idioms._shape(root)):
            continue
        if op is not None and op.name == "stablehlo.maximum":
            pending.extend(op.operands)
        elif op is not None and op.name == "stablehlo.all_reduce" and \
                len(op.operands) == 1 and idioms.reducer_kind(op) == "max":
            pending.append(op.operands[0])
        elif op is not None and op.name == "stablehlo.select" and \
                idioms._finite_test(op.operands[0], op.operands[1]):
            pending.append(op.operands[1])
        else:
            leaves.append((value, op))
    return leaves


def _reached(root, a) -> bool:
    """`root` is `maximum(..., a, ...)` (through maxima of the same shape)."""
    from entangle_mlir.normalize import idioms

    pending, seen = [root], set()
    while pending:
        value = pending.pop()
        if _same_value(value, a):
            return True
        if value in seen:
            continue
        seen.add(value)
        op = idioms._def(value)
        if op is not None and op.name == "stablehlo.maximum":
            pending.extend(op.operands)
    return False


def _covered(a, dims: tuple[int, ...], parts: list) -> bool:
    """Every element of `a` lies in one of `parts` (each reduced over `dims` into the same
    rows): `a` is one of them or a concatenation of covered blocks along one of `dims`."""
    from entangle_mlir.normalize import idioms

    if any(_same_value(a, p) for p in parts):
        return True
    op = idioms._def(a)
    if op is None or op.name != "stablehlo.concatenate" or \
            ir.IntegerAttr(op.attributes["dimension"]).value not in dims:
        return False
    return all(_covered(v, dims, parts) for v in op.operands)


def _same_value(x, y, budget: list[int] | None = None) -> bool:
    """`x` and `y` are the same value, or computed alike (the same ops, attributes and types
    over the same values: jax recomputes a masked score block for the softmax's max and its
    exponent). At most 256 ops are compared."""
    from entangle_mlir.normalize import idioms

    if x == y:
        return True
    budget = [4096] if budget is None else budget
    budget[0] -= 1
    ox, oy = idioms._def(x), idioms._def(y)
    if budget[0] < 0 or ox is None or oy is None or ox.name != oy.name or x.type != y.type:
        return False
    if len(ox.operands) != len(oy.operands) or len(ox.regions) or len(oy.regions):
        return False
    if ox.name == "stablehlo.constant":
        return str(ox.attributes["value"]) == str(oy.attributes["value"])
    if _attributes(ox) != _attributes(oy):
        return False
    if list(ox.results).index(x) != list(oy.results).index(y):
        return False
    return all(_same_value(p, q, budget) for p, q in zip(ox.operands, oy.operands))


def _attributes(op: ir.Operation) -> dict[str, str]:
    attrs = op.attributes
    return {attrs[i].name: str(attrs[i].attr) for i in range(len(attrs))}


# ----- reference terms ----------------------------------------------------------------------

_TERM_SAME = frozenset({"broadcast", "reshape", "transpose", "slice", "concatenate", "pad",
                        "stablehlo.reverse"})
"""Term ops whose result holds only values of their arguments (a pad's value included)."""

_TERM_FIRST = frozenset({"dynamic_slice", "stablehlo.gather", "chlo.top_k"})
"""Term ops whose result holds only values of their first argument (the others index)."""

_TERM_OPAQUE = frozenset({"loopvar", "while_result", "region_result"})
"""Term leaves standing for values computed elsewhere (a loop's, a summarized layer's)."""

_TERM_MEMO: dict[int, Interval] = {}
"""term serial -> `term_interval` (terms are interned for the whole run)."""


def term_interval(term) -> Interval:
    """(lo, hi) of a reference term's elements, as `interval` for IR values: arguments are
    program inputs (finite by assumption, any value of their dtype), constants and iotas
    their values, arithmetic by interval arithmetic clamped to the dtype (an endpoint past
    its largest finite value is the infinity it may overflow to). An operand outside an
    op's domain (`sqrt` of a possibly negative value) makes the result unbounded: NaN
    matters here. Integers are any value of their width unless known tighter (they wrap)."""
    from entangle_mlir.core.terms import post_order

    found = _TERM_MEMO.get(term.serial)
    if found is not None:
        return found
    for top in post_order(term, _TERM_MEMO):
        try:
            bounds = _term_interval_of(top, [_TERM_MEMO[a.serial] for a in top.args])
        except (ValueError, TypeError, OverflowError, KeyError, IndexError, ZeroDivisionError):
            bounds = UNBOUNDED
        _TERM_MEMO[top.serial] = _fit(bounds, top.dtype)
    return _TERM_MEMO[term.serial]


def term_finite(term) -> bool:
    """Every element of `term` is a finite number (no overflow, no NaN) on every input the
    proof admits, shown by `term_interval`; integer terms always are."""
    lo, hi = term_interval(term)
    return -INF < lo and hi < INF


def integer_dtype(dtype: str) -> bool:
    """An integer or i1 dtype (two's complement: no infinity, no NaN)."""
    return _int_range(dtype) is not None


def _int_range(dtype: str) -> Interval | None:
    """The values of an integer (or i1) dtype; None for a float dtype."""
    from entangle_mlir.core.precision import INT_BITS

    if dtype == "i1":
        return 0.0, 1.0
    if dtype not in INT_BITS:
        return None
    width, signed = INT_BITS[dtype]
    return (float(-(1 << (width - 1))), float((1 << (width - 1)) - 1)) if signed else (
        0.0, float((1 << width) - 1))


def _fit(bounds: Interval, dtype: str) -> Interval:
    """`bounds` as a value of `dtype` holds them: integers wrap within their range, floats
    overflow past their largest finite value (an unknown float dtype: unbounded)."""
    ints = _int_range(dtype)
    if ints is not None:
        lo, hi = bounds
        return (lo, hi) if ints[0] <= lo and hi <= ints[1] else ints
    if dtype not in _MAX:
        return UNBOUNDED
    return _clamp(bounds, _MAX[dtype])


def _shifted_by_its_max(term) -> bool:
    """`term` is `x - broadcast(reduce_max(x)) + c` (the softmax shift), so at most `c`: the
    term-level `_dominates` (the broadcast restores exactly the reduced dims)."""
    from entangle_mlir.core.terms import make_broadcast

    if len(term.args) != 2 or sorted(term.attrs[1]) != [-1, 1]:
        return False
    x, shift = term.args if term.attrs[1][0] == 1 else term.args[::-1]
    below = shift
    while below.op in ("broadcast", "reshape"):
        below = below.args[0]
    if below.op != "reduce_max" or below.args[0] is not x:
        return False
    reduced = below.attrs[0]
    kept = tuple(d for d in range(len(x.shape)) if d not in reduced)
    return make_broadcast(below, kept, x.shape) is shift


def _term_interval_of(term, args: list[Interval]) -> Interval:
    from entangle_mlir.core.terms import DENSE_VALUES

    op, dtype = term.op, term.dtype
    if op == "arg":
        return _int_range(dtype) or (-_MAX.get(dtype, INF), _MAX.get(dtype, INF))
    if op == "splat":
        value = float(term.attrs[0])
        return UNBOUNDED if math.isnan(value) else (value, value)
    if op == "iota":
        return 0.0, float(max(term.shape[0] - 1, 0))
    if op == "dense":
        values = DENSE_VALUES.get(term.attrs[0])
        if values is None or not np.size(values):
            return _int_range(dtype) or UNBOUNDED
        return float(np.min(values)), float(np.max(values))
    if op in _TERM_OPAQUE:
        return _int_range(dtype) or UNBOUNDED
    if op == "lin":
        constant, coefs = term.attrs
        total = (float(constant), float(constant))
        if math.isnan(total[0]):
            return UNBOUNDED
        for k, arg in zip(coefs, args):
            total = _add(total, _mul((float(k), float(k)), arg))
        if _shifted_by_its_max(term):
            total = total[0], min(total[1], float(constant))
        return total
    if op == "mul":
        total = args[0]
        for arg in args[1:]:
            total = _mul(total, arg)
        return total
    if op == "div":
        return _div(args[0], args[1])
    if op in _TERM_SAME:
        return _hull(args)
    if op in _TERM_FIRST:
        return args[0]
    if op == "stablehlo.dynamic_update_slice":
        return _hull(args[:2])
    if op == "reduce_sum":
        return _times(args[0], math.prod(term.args[0].shape[d] for d in term.attrs[0]))
    if op in ("reduce_max", "reduce_min"):
        empty = any(term.args[0].shape[d] == 0 for d in term.attrs[0])
        return UNBOUNDED if empty else args[0]
    if op == "reduce_window_sum":
        return _times(_hull([args[0], (0.0, 0.0)]), math.prod(term.attrs[0]))
    if op == "stablehlo.dot_general":
        count = math.prod(term.args[0].shape[d] for d in term.attrs[2])
        return _times(_mul(args[0], args[1]), count)
    entry = ELEMENTWISE_BOUNDS.get(op)
    if entry is not None:
        compute, domain = entry
        if domain is not None and args[0][0] < domain:
            return UNBOUNDED
        return compute(args)
    return _int_range(dtype) or UNBOUNDED
