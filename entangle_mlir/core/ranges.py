"""Ranges of values in their dtype: what each dtype holds, and interval arithmetic.

Two kinds of range, for two questions:

* `Range`, an exact `[lo, hi]` of Fractions, for integers in the arithmetic of their dtype:
  an integer op on iN/uiN computes modulo 2^N (two's complement), so an order fact about an
  integer value holds only where no element can wrap (`fits`, and `intrange.value_range` for
  a term's elements); an integer value converted to a float type is exact only while every
  value it takes is representable there (`exact_convert`).
* `Interval`, a float `(lo, hi)` with -inf/+inf ends, for float values that may overflow:
  interval arithmetic, clamped to a dtype's finite range (an end past the largest finite
  value is the infinity the value may overflow to), and `ELEMENTWISE_BOUNDS`, each
  elementwise op's range from its operands'. The IR analysis (`normalize.bounds.interval`)
  and the term analysis (`terms.term_interval`) share them.
"""

from __future__ import annotations

import math
from fractions import Fraction

from entangle_mlir.core import precision

# ----- integers in their dtype ----------------------------------------------------------------

INT_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "si8": 8, "si16": 16, "si32": 32,
            "si64": 64, "ui8": 8, "ui16": 16, "ui32": 32, "ui64": 64, "i4": 4, "ui4": 4,
            "si4": 4, "i2": 2, "ui2": 2}
"""Width of each integer dtype (i1, a boolean, is not an integer here)."""

FLOAT_PRECISION = {"f64": 53, "f32": 24, "tf32": 11, "f16": 11, "bf16": 8, "f8E4M3FN": 4,
                   "f8E4M3": 4, "f8E4M3FNUZ": 4, "f8E4M3B11FNUZ": 4, "f8E5M2": 3,
                   "f8E5M2FNUZ": 3, "f8E3M4": 5, "f4E2M1FN": 2, "f6E2M3FN": 4,
                   "f6E3M2FN": 3}
"""Significand bits of each float dtype (implicit bit included): every integer n with
|n| <= 2^p is exact in it (bf16: 256, f16: 2048, f32: 2^24)."""

Range = tuple[Fraction, Fraction]
"""An exact [lo, hi]."""


def wrap_integer(value: int, dtype: str) -> int:
    """The value a device computes in `dtype` (two's complement wrap-around, like XLA); other
    dtypes keep the value."""
    limits = int_limits(dtype)
    if limits is None:
        return value
    lo, hi = int(limits[0]), int(limits[1])
    return (value - lo) % (hi - lo + 1) + lo


def saturate_integer(value: int, dtype: str) -> int:
    """An integer-valued float converted to integer `dtype` as XLA converts it: clamped to the
    dtype's range (saturation, not wrap-around); other dtypes keep the value."""
    limits = int_limits(dtype)
    if limits is None:
        return value
    return min(max(value, int(limits[0])), int(limits[1]))


def int_limits(dtype: str) -> Range | None:
    """[min, max] of an integer dtype, None for other dtypes."""
    bits = INT_BITS.get(dtype)
    if bits is None:
        return None
    if dtype.startswith("ui"):
        return Fraction(0), Fraction((1 << bits) - 1)
    return Fraction(-(1 << (bits - 1))), Fraction((1 << (bits - 1)) - 1)


def exact_float_limit(dtype: str) -> int | None:
    """The largest n such that every integer in [-n, n] is exact in a float dtype."""
    bits = FLOAT_PRECISION.get(dtype)
    return None if bits is None else 1 << bits


def fits(lo: Fraction, hi: Fraction, dtype: str) -> bool:
    """Every integer of [lo, hi] is a value of `dtype` exactly (no wrap, no rounding)."""
    limits = int_limits(dtype)
    if limits is not None:
        return limits[0] <= lo and hi <= limits[1]
    if dtype == "i1":
        return 0 <= lo and hi <= 1
    limit = exact_float_limit(dtype)
    return limit is not None and -limit <= lo and hi <= limit


def exact_convert(source: str, target: str, known: Range | None = None) -> bool:
    """A convert from integer dtype `source` to `target` keeps every value (`known`: a proven
    range of the values, else the whole range of `source`)."""
    span = known if known is not None else int_limits(source)
    if source == "i1":
        span = (Fraction(0), Fraction(1))
    return span is not None and fits(span[0], span[1], target)


# ----- float intervals ------------------------------------------------------------------------

INF = math.inf
UNBOUNDED = (-INF, INF)

Interval = tuple[float, float]
"""(lo, hi), each a float or -inf/+inf."""

FLOAT_MAX = {"f64": 1.7976931348623157e308, "f32": 3.4028234663852886e38, "f16": 65504.0,
             "bf16": 3.3895313892515355e38}
FLOAT_TINY = {"f64": 2.2250738585072014e-308, "f32": 1.1754943508222875e-38,
              "f16": 6.103515625e-05, "bf16": 1.1754943508222875e-38}
"""Largest finite and smallest normal value of each float dtype (numpy's `finfo`)."""


def integer_dtype(dtype: str) -> bool:
    """An integer or i1 dtype (two's complement: no infinity, no NaN)."""
    return int_interval(dtype) is not None


def int_interval(dtype: str) -> Interval | None:
    """The values of an integer (or i1) dtype of `precision.INT_BITS`; None for a float
    dtype. (That table has no i4 or i2: their terms are not taken for integers here.)"""
    if dtype == "i1":
        return 0.0, 1.0
    if dtype not in precision.INT_BITS:
        return None
    width, signed = precision.INT_BITS[dtype]
    return (float(-(1 << (width - 1))), float((1 << (width - 1)) - 1)) if signed else (
        0.0, float((1 << width) - 1))


def fit(bounds: Interval, dtype: str) -> Interval:
    """`bounds` as a value of `dtype` holds them: integers wrap within their range, floats
    overflow past their largest finite value (an unknown float dtype: unbounded)."""
    ints = int_interval(dtype)
    if ints is not None:
        lo, hi = bounds
        return (lo, hi) if ints[0] <= lo and hi <= ints[1] else ints
    if dtype not in FLOAT_MAX:
        return UNBOUNDED
    return clamp(bounds, FLOAT_MAX[dtype])


def rounded(bounds: Interval, dtype: str) -> Interval:
    """The range of a float `dtype` value whose exact result lies in `bounds`: each end
    rounded to nearest in the dtype (`precision.round_to`). Rounding is monotone, so the
    value the op computes lies between the rounded ends, and not always between the exact
    ones: `2^24 + 1.0` is 2^24 in f32, so its range is not above 2^24 (a compare decided on
    the exact range was a false proof); a subnormal end takes zero in (`_flushed_end`).
    Other dtypes, and infinite or NaN ends, as they are."""
    if dtype not in precision.FLOAT_FORMATS:
        return bounds
    lo, hi = bounds if dtype == "f64" else (_rounded_end(bounds[0], dtype),
                                            _rounded_end(bounds[1], dtype))
    return _flushed_end(lo, dtype, low=True), _flushed_end(hi, dtype, low=False)


def _flushed_end(end: float, dtype: str, low: bool) -> float:
    """A subnormal range end widened to take zero in (`precision.subnormal`: XLA's CPU
    flushes subnormal results to zero; a positive product of 1e-20 and 1e-20 is 0 there, and
    a compare decided on its range `> 0` was a false proof)."""
    if not precision.subnormal(end, dtype):
        return end
    return min(end, 0.0) if low else max(end, 0.0)


def _rounded_end(end: float, dtype: str) -> float:
    if not math.isfinite(end):
        return end
    return float(precision.round_to(end, dtype))


def clamp(bounds: Interval, top: float) -> Interval:
    """Endpoints past the dtype's finite range (`top`, its largest finite value) become the
    infinity they overflow to."""
    lo, hi = bounds
    if math.isnan(lo) or math.isnan(hi):
        return UNBOUNDED
    return (-INF if lo < -top else lo, INF if hi > top else hi)


def hull(args: list[Interval]) -> Interval:
    """The smallest interval holding every one of `args`."""
    return min(a[0] for a in args), max(a[1] for a in args)


def add(a: Interval, b: Interval) -> Interval:
    """The range of `x + y` for x in `a`, y in `b` (an end where inf - inf occurs: unbounded)."""
    lo, hi = a[0] + b[0], a[1] + b[1]
    return (-INF if math.isnan(lo) else lo), (INF if math.isnan(hi) else hi)


def _products(a, b) -> list[float]:
    out = []
    for x in a:
        for y in b:
            out.append(math.nan if (x == 0 and math.isinf(y)) or (y == 0 and math.isinf(x))
                       else x * y)
    return out


def mul(a: Interval, b: Interval) -> Interval:
    """The range of `x * y` for x in `a`, y in `b` (unbounded where 0 * inf may occur)."""
    products = _products(a, b)
    if any(math.isnan(p) for p in products):
        return UNBOUNDED
    return min(products), max(products)


def div(a: Interval, b: Interval) -> Interval:
    """The range of `x / y` for x in `a`, y in `b` (unbounded where `b` holds 0)."""
    if b[0] <= 0 <= b[1]:
        return UNBOUNDED
    inverse = (1 / b[1], 1 / b[0])
    return mul(a, inverse)


def times(a: Interval, count: int) -> Interval:
    """The range of a sum of `count` values of range `a` (in any order)."""
    if count == 0:
        return 0.0, 0.0
    return a[0] * count, a[1] * count


def _power(base: Interval, exponent: Interval) -> Interval:
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


def _abs(a: Interval) -> Interval:
    lo, hi = a
    return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))


def _log(a: Interval) -> Interval:
    lo, hi = a
    return (math.log(lo) if lo > 0 else -INF), (math.log(hi) if hi > 0 else -INF)


def _rsqrt(a: Interval) -> Interval:
    lo, hi = a
    return (1 / math.sqrt(hi) if 0 < hi < INF else 0.0), (1 / math.sqrt(lo) if lo > 0 else INF)


def _erf(end: float) -> float:
    """erf at a range end; at an infinite end its limit +-1 made inexact (XLA's erf exceeds
    it: `_approximate` then widens it as every other end)."""
    if math.isfinite(end):
        return math.erf(end)
    return math.copysign(1.0 + 2.0 ** -40, end)


def _clamp_op(args: list[Interval]) -> Interval:
    """`clamp(min, x, max) = min(max(x, min), max)`, endpoint by endpoint (monotonic)."""
    low, x, high = args
    return min(max(x[0], low[0]), high[0]), min(max(x[1], low[1]), high[1])


APPROXIMATE = 2.0 ** -12
"""How far (relative) XLA's exp, log, tanh, expm1, log1p, rsqrt, power and erf may be from
the exact function: they are not correctly rounded (exp(-9.9999) in f32 is 4.5404478e-05 on
CPU, the correct rounding 4.5404475e-05; tanh(9.0109) is 1.0, not 0.99999994; erf(3.7) is
1.0000001 on CPU, beyond the exact function's bound), so a range of one of them is its exact
range widened by this much (`_approximate`). A compare decided on the exact range was a
false proof (`exp(x * 0 - 9.9999) > 4.5404475e-05`)."""


def _approximate(bounds: Interval, floor: float | None = None) -> Interval:
    """`bounds` of an approximated function widened by `APPROXIMATE` of each end and by the
    smallest normal f32 (an absolute error near zero), never below `floor` (a bound the
    implementation keeps: exp >= 0, tanh >= -1). An end that is a value of f32 is kept: the
    function is exact there (exp(0) = 1, log(1) = 0, tanh(0) = 0: these functions take no
    other rational value at a rational point)."""
    lo, hi = bounds
    if _inexact(lo):
        lo = lo - abs(lo) * APPROXIMATE - FLOAT_TINY["f32"]
    if _inexact(hi):
        hi = hi + abs(hi) * APPROXIMATE + FLOAT_TINY["f32"]
    return (lo if floor is None else max(lo, floor)), hi


def _inexact(end: float) -> bool:
    """A finite range end that f32 does not hold (an implementation rounds it, perhaps not
    to nearest)."""
    return math.isfinite(end) and precision.round_to(end, "f32") != end


def _bounded(fn, floor: float | None = None, ceiling: float | None = None):
    """The range of an approximated function: `fn`'s exact range, `_approximate`d, within
    [floor, ceiling] (the bounds every implementation keeps)."""
    def bounds(a: list[Interval]) -> Interval:
        lo, hi = _approximate(fn(a), floor)
        return lo, (hi if ceiling is None else min(hi, ceiling))
    return bounds


ELEMENTWISE_BOUNDS: dict[str, tuple[object, float | None]] = {
    "stablehlo.negate": (lambda a: (-a[0][1], -a[0][0]), None),
    "stablehlo.abs": (lambda a: _abs(a[0]), None),
    "stablehlo.add": (lambda a: add(a[0], a[1]), None),
    "stablehlo.subtract": (lambda a: add(a[0], (-a[1][1], -a[1][0])), None),
    "stablehlo.multiply": (lambda a: mul(a[0], a[1]), None),
    "stablehlo.divide": (lambda a: div(a[0], a[1]), None),
    "stablehlo.maximum": (lambda a: (max(x[0] for x in a), max(x[1] for x in a)), None),
    "stablehlo.minimum": (lambda a: (min(x[0] for x in a), min(x[1] for x in a)), None),
    "stablehlo.clamp": (_clamp_op, None),
    "stablehlo.select": (lambda a: hull(a[1:]), None),
    "stablehlo.convert": (lambda a: a[0], None),
    "stablehlo.exponential": (_bounded(lambda a: (_exp(a[0][0]), _exp(a[0][1])), 0.0), None),
    "stablehlo.exponential_minus_one": (
        _bounded(lambda a: (_exp(a[0][0]) - 1, _exp(a[0][1]) - 1), -1.0), None),
    "stablehlo.log": (_bounded(lambda a: _log(a[0])), 0.0),
    "stablehlo.tanh": (_bounded(lambda a: (math.tanh(a[0][0]), math.tanh(a[0][1])), -1.0,
                                1.0), None),
    "stablehlo.logistic": (lambda a: (0.0, 1.0), None),
    "stablehlo.sine": (lambda a: (-1.0, 1.0), None),
    "stablehlo.cosine": (lambda a: (-1.0, 1.0), None),
    "chlo.erf": (_bounded(lambda a: (_erf(a[0][0]), _erf(a[0][1]))), None),
    "stablehlo.sign": (lambda a: (-1.0, 1.0), None),
    "stablehlo.sqrt": (lambda a: (math.sqrt(max(a[0][0], 0.0)), math.sqrt(max(a[0][1], 0.0))),
                       0.0),
    "stablehlo.rsqrt": (_bounded(lambda a: _rsqrt(a[0]), 0.0), 0.0),
    "stablehlo.power": (_bounded(lambda a: _power(a[0], a[1])), None),
    "chlo.square": (lambda a: mul(a[0], a[0]), None),
}
"""Elementwise op -> (its range from its operands' ranges, the least first operand for which
it is a number: below it the op gives NaN, e.g. `sqrt(-1)`; None when every finite operand
gives a number or NaN only comes from ranges the function already calls unbounded). Shared by
the IR analysis (`normalize.bounds.interval`) and the term analysis (`terms.term_interval`);
NaN matters to the latter only (`0 * sqrt(x)` is NaN for x < 0), so the IR analysis ignores
the domain."""
