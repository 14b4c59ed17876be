"""Elementwise ops: operands share one layout; linear ops may keep a partial sum.

Every op here also evaluates device-dependent integer scalars (jax's `axis_index` arithmetic)
exactly, as a table over all devices.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from entangle_mlir.core import precision
from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.ranges import fits, saturate_integer, wrap_integer
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    DeviceScalar,
    Opaque,
    Rel,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.core.terms import (
    BOOLEAN_MEANING,
    BOOLEAN_UNDEFINED,
    Term,
    exact_conversion,
    exact_origin,
    make_broadcast,
    make_convert,
    make_elementwise,
    make_iota,
    make_reshape,
    make_splat,
    scale,
    splat_value,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo, compare_is_default
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import COMPARISONS, is_zero, splat_rel, unify_dims
from entangle_mlir.rules.kinds import device_blocks, entries
from entangle_mlir.rules.kinds.shifted import elementwise_shifted
from entangle_mlir.rules.kinds.window import window_elementwise

NONLINEAR_HINT = "missing all_reduce/psum before it"


def _c_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _c_rem(a: int, b: int) -> int:
    return a - b * _c_div(a, b)



_SCALAR_OPS = {
    "stablehlo.add": lambda a, b: a + b,
    "stablehlo.subtract": lambda a, b: a - b,
    "stablehlo.multiply": lambda a, b: a * b,
    "stablehlo.divide": _c_div,
    "stablehlo.remainder": _c_rem,
    "stablehlo.maximum": max,
    "stablehlo.minimum": min,
    "stablehlo.negate": lambda a: -a,
    "stablehlo.abs": abs,
    "stablehlo.sign": lambda a: (a > 0) - (a < 0),
    "stablehlo.and": lambda a, b: a & b,
    "stablehlo.or": lambda a, b: a | b,
    "stablehlo.xor": lambda a, b: a ^ b,
    "stablehlo.not": lambda a: int(not a),
    "stablehlo.select": lambda p, a, b: a if p else b,
    "stablehlo.clamp": lambda lo, x, hi: min(max(x, lo), hi),
    "stablehlo.convert": lambda a: a,
}


def _integer_fn(info: OpInfo):
    """The op on Python integers (device tables, integer constants), or None."""
    if info.name == "stablehlo.compare":
        compare = COMPARISONS.get(info.attrs.get("comparison_direction"))
        return None if compare is None else lambda a, b: int(compare(a, b))
    if info.name == "stablehlo.not" and info.operand_types[0].dtype != "i1":
        return lambda a: ~a
    if info.name == "stablehlo.convert" and info.operand_types[0].is_float:
        return lambda a: saturate_integer(a, info.result_types[0].dtype)  # (not a wrap)
    if info.result_types[0].dtype == "i1":
        if info.name in BOOLEAN_UNDEFINED:
            return None
        return _SCALAR_OPS.get(BOOLEAN_MEANING.get(info.name, info.name))
    return _SCALAR_OPS.get(info.name)


def _device_scalar(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """Evaluate an integer scalar op over the per-device tables."""
    rtype = info.result_types[0]
    if any(size != 1 for size in rtype.shape) or rtype.is_float:
        return [Opaque(f"device-dependent value used as tensor data in {info.name} "
                       "(not supported yet)", category="unsupported")]
    count = ctx.mesh.num_devices
    columns = []
    for value in operands:
        if isinstance(value, DeviceScalar):
            columns.append(value.values)
            continue
        constant = splat_value(value.term) if isinstance(value, Rel) else None
        if not isinstance(constant, Fraction) or constant.denominator != 1:
            return [Opaque(f"{info.name} mixes a device-dependent integer with a non-constant "
                           "value", category="unsupported")]
        columns.append((int(constant),) * count)
    fn = _integer_fn(info)
    if fn is None:
        return [Opaque(f"{info.name} on a device-dependent integer is not supported",
                       category="unsupported")]
    try:
        values = tuple(fn(*row) for row in zip(*columns))
    except ZeroDivisionError:
        return [Opaque(f"{info.name} divides by zero on some device", category="unrelated")]
    return [DeviceScalar(tuple(wrap_integer(v, rtype.dtype) for v in values), rtype.shape)]


def _shift_scalar(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """A device scalar combined with a tensor: the scalar becomes a shifted zero tensor."""
    rtype = info.result_types[0]
    converted = [Shifted(splat_rel(0, rtype.shape, rtype.dtype, ctx), v.values)
                 if isinstance(v, DeviceScalar) else v for v in operands]
    return elementwise_shifted(info, converted, ctx, elementwise)


def _partial_operands(rels: list[Rel]) -> list[int]:
    return [i for i, rel in enumerate(rels) if rel.partial]


def _mixed_partial(info: OpInfo, rels: list[Rel]) -> Opaque | None:
    """A partial sum combined with a value split over the same axes has no clean meaning."""
    for rel in rels:
        if not rel.partial:
            continue
        for other in rels:
            clash = set(other.tiled_axes) & set(rel.partial)
            if clash:
                return Opaque(
                    f"{info.name.split('.')[-1]} combines a partial {rel.kind} over "
                    f"{axes_str(sorted(clash))} (missing all_reduce/psum) with a value split "
                    f"over {axes_str(sorted(clash))}", category="partial_mixed")
    return None


def _partial_result(info: OpInfo, rels: list[Rel], ctx: RuleContext
                    ) -> tuple[list[Rel], tuple[str, ...], str] | Opaque:
    """Decide whether the op keeps a partial reduction, and rescale operands if it must."""
    partial_idx = _partial_operands(rels)
    if not partial_idx:
        return rels, (), ""
    name = info.name
    short = name.split(".")[-1]
    first = rels[partial_idx[0]]
    axes, kind = first.partial, first.kind
    if any(rels[i].partial != axes or rels[i].kind != kind for i in partial_idx):
        return Opaque(f"{short} combines partial reductions over different axes or of different "
                      "kinds", category="partial_mixed")
    nonlinear = Opaque(f"nonlinear op {short} applied to a partial {kind} over "
                       f"{axes_str(axes)}: {NONLINEAR_HINT}", category="nonlinear_partial")
    group = ctx.mesh.group_size(axes)
    others = [i for i in range(len(rels)) if i not in partial_idx]
    if name == "stablehlo.convert":
        if _convert_keeps_partial(info, kind):
            return rels, axes, kind
        source, target = info.operand_types[0].dtype, info.result_types[0].dtype
        if precision.rounds(source, target):
            if kind in ("max", "min"):
                return rels, axes, kind  # rounding is monotone: it commutes with max and min
            return Opaque(
                f"precision lost: convert {source} -> {target} rounds each device's partial "
                f"sum over {axes_str(axes)} to {target}, so the sum over devices is computed "
                f"in {target} where the reference computes it in {first.term.dtype}",
                category="precision_lost")
        return nonlinear
    if name == "stablehlo.reduce_precision":
        if _reduce_precision_kept(info) or kind in ("max", "min"):
            return rels, axes, kind  # the identity, or a monotone rounding
        if kind == "sum":
            return Opaque(
                f"precision lost: {_format(info)} rounds each device's partial sum over "
                f"{axes_str(axes)} before the sum over devices (rounded pieces do not add up to "
                "the rounded sum)", category="precision_lost")
        return nonlinear
    if kind in ("max", "min") and not info.result_types[0].is_float:
        return _ordered_partial(info, rels, partial_idx, kind, nonlinear)
    if name == "stablehlo.negate":
        flipped = {"sum": "sum", "max": "min", "min": "max"}[kind]
        return rels, axes, flipped
    if name in ("stablehlo.add", "stablehlo.subtract"):
        if kind != "sum":
            ok = name == "stablehlo.add" and len(partial_idx) == 1 or (
                name == "stablehlo.subtract" and partial_idx == [0])
            return (rels, axes, kind) if ok else nonlinear
        scaled = list(rels)
        for i in others:
            if not is_zero(rels[i]):
                scaled[i] = replace(rels[i], term=scale(rels[i].term, group))
                ctx.hint(f"adds a value replicated over {axes_str(axes)} to a partial sum over "
                         f"{axes_str(axes)}: after the all_reduce/psum it is counted {group} "
                         "times (add it after the reduction)")
        return scaled, axes, kind
    flipped = {"max": "min", "min": "max"}
    if name == "stablehlo.multiply" and len(partial_idx) == 1:
        if kind == "sum":
            return rels, axes, kind
        factor = splat_value(rels[others[0]].term)
        if isinstance(factor, Fraction) and factor != 0:
            return rels, axes, kind if factor > 0 else flipped[kind]
        return nonlinear
    if name == "stablehlo.divide" and partial_idx == [0] and not info.result_types[0].is_int:
        if kind == "sum":
            return rels, axes, kind
        factor = splat_value(rels[1].term)
        if isinstance(factor, Fraction) and factor != 0:
            return rels, axes, kind if factor > 0 else flipped[kind]
        return nonlinear
    if (name, kind) in (("stablehlo.maximum", "max"), ("stablehlo.minimum", "min")) and len(
            partial_idx) == 1:
        return rels, axes, kind
    if name == "stablehlo.select" and 0 not in partial_idx and kind == "sum" and (
            len(partial_idx) == 2 or any(is_zero(rels[i]) for i in (1, 2) if i in others)):
        return rels, axes, kind
    return nonlinear


def _ordered_partial(info: OpInfo, rels: list[Rel], partial_idx: list[int], kind: str,
                     nonlinear: Opaque) -> tuple[list[Rel], tuple[str, ...], str] | Opaque:
    """A partial max (min) of integers or booleans (any/all over split dims, an integer max):
    arithmetic may wrap around (-max(a) is not min(-a) when some a is the least integer), so
    only the order's own operations keep it. `not` reverses the order (~x = -1 - x on signed
    integers, MAX - x on unsigned ones, logical not on booleans): a max becomes a min. max and
    min (or and and of booleans, the same operations) distribute over each other: max(min_d a_d,
    c) = min_d max(a_d, c), and max(max_d a_d, max_d b_d) = max_d max(a_d, b_d); but the max of
    two partial minima is not a minimum over devices."""
    name = info.name
    axes = rels[partial_idx[0]].partial
    if name == "stablehlo.not":
        return rels, axes, {"max": "min", "min": "max"}[kind]
    lattice = {"stablehlo.maximum": "max", "stablehlo.minimum": "min"}
    if info.result_types[0].dtype == "i1":
        lattice.update({"stablehlo.or": "max", "stablehlo.and": "min"})
    if name in lattice and (len(partial_idx) == 1 or lattice[name] == kind):
        return rels, axes, kind
    return nonlinear


def _term_attrs(info: OpInfo) -> tuple:
    """A compare's term attributes: its direction, and its compare type unless it is the
    element type's default (a TOTALORDER compare is another op than a FLOAT one)."""
    if info.name == "stablehlo.compare":
        if compare_is_default(info):
            return (info.attrs["comparison_direction"],)
        return (info.attrs["comparison_direction"], info.attrs["compare_type"])
    return ()


def elementwise(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """Shared layout in, shared layout out; see `_partial_result` for partial sums."""
    if info.name in BOOLEAN_UNDEFINED and info.result_types[0].dtype == "i1":
        return [Opaque(f"{info.name} on booleans (i1) is not defined", category="unsupported")]
    constant_pred = device_blocks.truth(operands[0]) if info.name == "stablehlo.select" else None
    if constant_pred is not None:
        return [operands[1] if constant_pred else operands[2]]
    if info.name == "stablehlo.select":
        operands = [_scalar_pred_broadcast(info, operands[0]), *operands[1:]]
    if not all(type(v) is Rel for v in operands):
        if info.name == "stablehlo.compare" and not compare_is_default(info):
            return [Opaque(f"compare ({info.attrs['compare_type']}) of device-dependent values "
                           "is not supported", category="unsupported")]
        if any(isinstance(v, DEVICE_BLOCK_VALUES) for v in operands):
            return device_blocks.elementwise(info, operands, ctx, elementwise)
        if any(isinstance(v, Windowed) for v in operands):
            entry = entries.elementwise(info, operands, ctx, elementwise)
            return [entry if entry is not None else
                    window_elementwise(info, operands, ctx, elementwise)]
        if any(isinstance(v, Shifted) for v in operands):
            return elementwise_shifted(info, operands, ctx, elementwise)
        if any(isinstance(v, DeviceScalar) for v in operands):
            if math.prod(info.result_types[0].shape) != 1 and any(
                    isinstance(v, Rel) and splat_value(v.term) is None for v in operands):
                return _shift_scalar(info, operands, ctx)
            return _device_scalar(info, operands, ctx)
    rels: list[Rel] = list(operands)  # type: ignore[arg-type]
    if not ctx.is_global:
        mixed = _mixed_partial(info, rels)
        if mixed:
            return [mixed]
    rank = len(info.result_types[0].shape)
    for rel in rels:
        if len(rel.term.shape) != rank:
            return [Opaque(f"{info.name}: operand ranks differ", category="internal")]
    unified = unify_dims(rels, [list(range(rank))] * len(rels), ctx, _short_name(info.name))
    if isinstance(unified, Opaque):
        return [unified]
    rels, joint, still_poly = unified
    decided = _partial_result(info, rels, ctx)
    if isinstance(decided, Opaque):
        return [decided]
    rels, partial, kind = decided
    term = _folded(info, rels) or _build_term(info, [rel.term for rel in rels], ctx)
    origin = next((rel.partial_origin for rel in rels if rel.partial), None)
    return [Rel(term, tuple(axes for _, axes in joint), partial, kind, frozenset(still_poly),
                rels[0].scope, partial_origin=origin)]


def _scalar_pred_broadcast(info: OpInfo, pred: Value) -> Value:
    """A select's scalar predicate (StableHLO picks whole operands by it) as that predicate
    broadcast to the operands' shape, every dim taking the operands' size and layout (exact:
    the same choice at every element). Other predicates are left as they are."""
    shape = info.result_types[0].shape
    if len(info.operand_types[0].shape) or not shape or type(pred) is not Rel \
            or pred.partial or pred.tiled_axes:
        return pred
    term = make_broadcast(pred.term, (), tuple(shape))
    return Rel(term, ((),) * len(shape), poly=frozenset(range(len(shape))), scope=pred.scope)


def _short_name(name: str) -> str:
    """`add` for `stablehlo.add` (remembered: every elementwise op names itself)."""
    short = _SHORT_NAMES.get(name)
    if short is None:
        short = _SHORT_NAMES[name] = name.split(".")[-1]
    return short


_SHORT_NAMES: dict[str, str] = {}


def _folded(info: OpInfo, rels: list[Rel]) -> Term | None:
    """An integer or boolean op on integer constants is a constant (jax's `%` on a device
    index guards its divisor with `where(n == 0, 1, n)`). A float operand (a compare, a
    convert to an integer) is read as its dtype holds it (`_held`): a folded sum of f32
    constants 2^24 + 1 is 2^24 in f32, so it is not greater than 2^24."""
    rtype = info.result_types[0]
    if rtype.is_float or any(r.partial for r in rels):
        return None
    values = [_held(splat_value(r.term), r.term.dtype) for r in rels]
    if not all(isinstance(v, Fraction) and v.denominator == 1 for v in values):
        return None
    fn = _integer_fn(info)
    if fn is None:
        return None
    try:
        out = fn(*(int(v) for v in values))
    except (ZeroDivisionError, TypeError):
        return None
    shape = rels[0].term.shape
    return make_splat(wrap_integer(int(out), rtype.dtype), shape, rtype.dtype)


def _reduce_precision_kept(info: OpInfo) -> bool:
    """A reduce_precision whose format holds every value of its dtype: the identity."""
    return precision.reduce_precision_is_identity(
        info.result_types[0].dtype, int(info.attrs["exponent_bits"]),
        int(info.attrs["mantissa_bits"]))


def _format(info: OpInfo) -> str:
    """`reduce_precision to e5m10 (in f32)`: the op and the format it rounds to."""
    return (f"reduce_precision to e{info.attrs['exponent_bits']}m{info.attrs['mantissa_bits']} "
            f"(in {info.result_types[0].dtype})")


def _reduce_precision_term(info: OpInfo, term: Term, ctx: RuleContext) -> Term:
    """The identity when the format keeps every value of the dtype; else a rounding (a
    constant rounded to the value it becomes; any other term under a `reduce_precision`
    node with its format as attributes, which Z3 reads as an uninterpreted rounding)."""
    if _reduce_precision_kept(info):
        return term
    e, m = int(info.attrs["exponent_bits"]), int(info.attrs["mantissa_bits"])
    dtype = info.result_types[0].dtype
    value = splat_value(term)
    if value is not None and precision.is_float(dtype) and dtype in precision.FORMAT_BITS:
        rounded = precision.reduce_precision(_held(value, dtype), dtype, e, m)
        return make_splat(rounded, term.shape, dtype)
    ctx.hint(f"precision lost: {_format(info)} rounds where the reference does not",
             "precision_lost")
    return make_elementwise(info.name, (term,), (e, m), dtype=dtype)


def _exact_convert(info: OpInfo) -> bool:
    """Converts that keep every value (`terms.exact_conversion`: bf16 -> f32, i16 -> f32,
    booleans, an integer type into one whose range holds it); their term is the operand's in
    the result dtype (`terms.make_convert`). Float -> int truncates (a nonlinear op); f32 ->
    bf16 and i32 -> f32 round; a narrowing integer convert wraps."""
    return exact_conversion(info.operand_types[0].dtype, info.result_types[0].dtype)


def _convert_keeps_partial(info: OpInfo, kind: str) -> bool:
    """A convert of a partial max (min) is the partial max (min) of the converted pieces when
    it keeps every value (it is then monotone); a convert of a partial sum between float
    types is the sum of the converted pieces in real arithmetic. A convert of a partial
    integer sum is not: a widening one reads the pieces' sum wrapped in the narrow type, a
    narrowing one is a ring morphism mod 2^N -> mod 2^M but not taken here (Z3 cannot check
    it cheaply, and no program needs it)."""
    source = info.operand_types[0]
    if (source.is_int or source.dtype == "i1") and kind == "sum":
        return False
    return _exact_convert(info)


_STORED = frozenset({"arg", "splat", "dense", "iota", "stablehlo.convert"})
_MOVES = frozenset({"broadcast", "reshape", "transpose", "slice", "concatenate", "pad",
                    "reverse"})


def _computed(term: Term) -> bool:
    """The term is arithmetic (not only stored values moved around): widening it leaves a
    value computed in the narrower type, which a proof must not take for one computed in the
    wider type."""
    stack, seen = [term], set()
    while stack:
        top = stack.pop()
        if top.serial in seen or top.op in _STORED:
            continue
        if top.op not in _MOVES:
            return True
        seen.add(top.serial)
        stack.extend(top.args)
    return False


def _build_term(info: OpInfo, terms: list[Term], ctx: RuleContext) -> Term:
    rtype = info.result_types[0]
    if info.name == "stablehlo.reduce_precision":
        return _reduce_precision_term(info, terms[0], ctx)
    if info.name == "stablehlo.convert":
        source = info.operand_types[0].dtype
        origin = exact_origin(terms[0])
        if origin is not terms[0] and exact_conversion(origin.dtype, rtype.dtype):
            return make_convert(origin, rtype.dtype)  # a round trip: nothing rounds
        if _exact_convert(info):
            if precision.lower_precision(source, rtype.dtype) and _computed(terms[0]):
                # the boundary where bf16 arithmetic enters f32: exact, but kept in the term
                ctx.hint(f"precision lost: the value was computed in {source} (convert "
                         f"{source} -> {rtype.dtype} after it) where the reference computes it "
                         f"in {rtype.dtype}", "precision_lost")
                return make_elementwise(info.name, (terms[0],), (source,), dtype=rtype.dtype)
            return _retyped(terms[0], rtype.dtype, source) or make_convert(terms[0],
                                                                            rtype.dtype)
        if precision.rounds(source, rtype.dtype):
            constant = _retyped(terms[0], rtype.dtype, source)
            if constant is not None:
                return constant
            ctx.hint(f"precision lost: convert {source} -> {rtype.dtype} rounds to "
                     f"{rtype.dtype} where the reference does not", "precision_lost")
            return make_elementwise(info.name, (terms[0],), (source,), dtype=rtype.dtype)
    return make_elementwise(info.name, tuple(terms), _term_attrs(info), dtype=rtype.dtype)


def _held(value, dtype: str):
    """The value a float constant of `dtype` holds: a splat's value rounded to its dtype
    (`precision.round_to`). Constants are folded exactly (a sum of f32 constants is its exact
    sum: liberty 1 for values), but an op that jumps or rounds again reads the value the
    program computed: `(2^24 + 1.0).astype(i32)` is 2^24, and `1.01171875 - 2^-25` in f32 is
    1.01171875 before it rounds to bf16 (1.015625, not the single rounding's 1.0078125).
    Other values (integers, infinities, non-float dtypes) as they are."""
    if not isinstance(value, Fraction) or dtype not in precision.FLOAT_FORMATS:
        return value
    return precision.round_to(value, dtype)


def _retyped(term: Term, dtype: str, source: str) -> Term | None:
    """A converted constant position (iota, splat, and their broadcasts and reshapes) in the
    new dtype, when the convert keeps its values or rounds them to known constants:
    `arange(n).astype(f32)` is jax's float iota (exact while n <= 2^24), `f32(0.1)` in bf16
    is the rounded constant."""
    if term.dtype == dtype or dtype == "i1" or term.dtype == "i1":
        return None
    if term.op == "iota":
        if not fits(Fraction(0), Fraction(max(term.shape[0] - 1, 0)), term.dtype):
            return None  # (an iota of 512 positions in bf16 holds rounded values)
        limit = precision.integer_exact_below(dtype) if precision.is_float(dtype) else None
        if precision.exact_convert(source, dtype) or (
                limit is not None and max(term.shape) <= limit):
            return make_iota(term.shape, term.attrs[0], dtype)
        return None
    if term.op == "splat":
        value = splat_value(term)
        if precision.rounds(source, dtype):
            value = precision.round_to(_held(value, source), dtype)
            if precision.subnormal(value, dtype):
                return None  # XLA may flush it to zero, or fold it as it is
        elif not (isinstance(value, Fraction) and fits(value, value, dtype)) and \
                not precision.is_float(dtype):
            return None  # an integer constant the narrower type wraps
        return make_splat(value, term.shape, dtype)
    if term.op in ("broadcast", "reshape") and len(term.args) == 1:
        inner = _retyped(term.args[0], dtype, source)
        if inner is None:
            return None
        if term.op == "broadcast":
            return make_broadcast(inner, term.attrs[0], term.shape)
        return make_reshape(inner, term.shape)
    return None


def is_float_type(dtype: str) -> bool:
    return dtype.startswith(("f", "bf"))


ELEMENTWISE_RULES = {name: elementwise for name in sorted(ELEMENTWISE_OPS)}
"""One rule for every op of the traits table (`core/traits.py`)."""
