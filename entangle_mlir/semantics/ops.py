"""Exact semantics of StableHLO ops and reference terms on numpy object arrays.

Everything the Z3 checks (`instance.py`, the lemma tests) know about what an op computes is in
this module, in three explicit tables:

* `OP_SEMANTICS[name](info, operands) -> results`: the LOCAL (per-device) semantics of an op,
  driven by its `OpInfo` (attributes and result types);
* `COLLECTIVE_SEMANTICS[name](info, mesh, per_device_operands) -> per_device_results`: ops whose
  result on one device depends on other devices (collectives, `partition_id`);
* `evaluate_term(term, env)`: the value of a `terms.Term` (a GLOBAL reference value).

Index operands (gather/scatter indices, dynamic_slice/dynamic_update_slice offsets) may be
symbolic integers: the result is then an If-chain over every position the clamped index can
take, so sharded index arithmetic is checked exactly on small shapes.

Arrays are numpy arrays of dtype `object`. An element is one of

* a Python `int` / `bool` / `Fraction` / `float` (exact rationals; floats only for infinities or
  when the caller feeds floats, as the grounding tests against XLA do);
* a z3 expression (`ArithRef` of sort Real or Int, `BoolRef` for `i1`).

The semantics is exact real arithmetic, as in the design: float sums and products may be
regrouped, NaN is out of scope. A convert that rounds (f32 -> bf16, i32 -> f32; see
`precision.py`) is the uninterpreted function `round_<dtype>` on symbolic elements and exact
rounding on numbers, never the identity. Transcendental functions (exp, log, tanh, ...) are z3 *uninterpreted functions*
Real -> Real on symbolic elements, so a proof never depends on a property of tanh that a rule
did not state; on floats they are the `math` functions, and inside `random_functions()` they
are deterministic pseudo-random rational functions (an interpretation of the uninterpreted
function, used to look for concrete counterexamples with exact arithmetic). Infinities in
symbolic context become two named real constants (`+oo`, `-oo`); `max(-oo, x)` and friends
simplify away syntactically, anything else about them is not provable (never wrongly proved).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import math
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from functools import reduce as _fold

import numpy as np
import z3

from entangle_mlir.core import intrange, precision
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.terms import Term, post_order
from entangle_mlir.mlir.opinfo import OpInfo, TensorType, scatter_kind
from entangle_mlir.semantics.groups import GroupError, permute_pairs, process_groups

Element = object
Array = np.ndarray
LocalFn = Callable[[OpInfo, list[Array]], list[Array]]
CollectiveFn = Callable[[OpInfo, Mesh, list[list[Array]]], list[list[Array]]]


class SemanticsError(ValueError):
    """An op or term this module has no (exact) semantics for, or malformed input."""


# ----- dtypes -------------------------------------------------------------------------------

def is_bool_dtype(dtype: str) -> bool:
    return dtype == "i1"


def is_int_dtype(dtype: str) -> bool:
    return dtype.startswith(("i", "ui", "si")) and dtype != "i1"


def is_float_dtype(dtype: str) -> bool:
    return not is_bool_dtype(dtype) and not is_int_dtype(dtype)


# ----- element helpers ----------------------------------------------------------------------

_NAN = z3.Real("NaN")  # an unknown but fixed value: NaN fill constants are data, not math
_POS_INF = z3.Real("+oo")
_NEG_INF = z3.Real("-oo")

_RANDOM_FUNCTIONS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "entangle_random_functions", default=None)


@contextlib.contextmanager
def random_functions(seed: int = 0) -> Iterator[None]:
    """Interpret transcendental functions on rationals as fixed pseudo-random rational functions.

    Uninterpreted functions in the Z3 encoding may be any function; this picks one (the same
    input always gives the same output within a seed), so a concrete evaluation with exact
    rationals is a genuine model of the symbolic claim.
    """
    token = _RANDOM_FUNCTIONS.set(seed)
    try:
        yield
    finally:
        _RANDOM_FUNCTIONS.reset(token)


_DIVISORS: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "entangle_divisors", default=None)


@contextlib.contextmanager
def collect_divisors() -> Iterator[list]:
    """Collect the divisors of every division evaluated inside (symbolic ones as z3 terms,
    concrete zeros as the Python value 0).

    Exact real semantics leaves `x / 0` undefined (XLA gives inf or NaN): the instance checks
    assume every divisor they met is nonzero, and check that assumption is satisfiable.
    """
    found: list = []
    token = _DIVISORS.set(found)
    try:
        yield found
    finally:
        _DIVISORS.reset(token)


def _note_divisor(b: Element) -> None:
    found = _DIVISORS.get()
    if found is None:
        return
    if is_z3(b):
        found.append(b)
    elif not isinstance(b, float) and b == 0:
        found.append(0)


def is_z3(x: Element) -> bool:
    return isinstance(x, z3.ExprRef)


def is_bool(x: Element) -> bool:
    return isinstance(x, (bool, np.bool_, z3.BoolRef))


def _exact(x: Element) -> Element:
    """numpy scalars to Python numbers; finite floats stay floats (caller's choice)."""
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def to_z3(x: Element) -> z3.ExprRef:
    """A z3 term for an element (rationals exactly, infinities as the named constants)."""
    x = _exact(x)
    if isinstance(x, z3.ExprRef):
        return x
    if isinstance(x, bool):
        return z3.BoolVal(x)
    if isinstance(x, int):
        return z3.IntVal(x)
    if isinstance(x, float):
        if math.isinf(x):
            return _POS_INF if x > 0 else _NEG_INF
        if math.isnan(x):
            return _NAN
        x = Fraction(x)
    if isinstance(x, Fraction):
        return _rational(x.numerator, x.denominator)
    raise SemanticsError(f"cannot encode {x!r} for z3")


@functools.lru_cache(maxsize=1 << 16)
def _rational(numerator: int, denominator: int) -> z3.ExprRef:
    """z3 rationals are built once per value (instance checks repeat the same constants)."""
    return z3.Q(numerator, denominator)


def _num(x: Element) -> z3.ExprRef:
    """A numeric z3 term (booleans as 0/1)."""
    x = to_z3(x)
    if isinstance(x, z3.BoolRef):
        return z3.If(x, z3.IntVal(1), z3.IntVal(0))
    return x


def _pynum(x: Element) -> Element:
    x = _exact(x)
    return int(x) if isinstance(x, bool) else x


def _is_zero(x: Element) -> bool:
    return not is_z3(x) and not isinstance(x, bool) and x == 0


def _is_one(x: Element) -> bool:
    return not is_z3(x) and not isinstance(x, bool) and x == 1


def _is_inf(x: Element, sign: int) -> bool:
    if is_z3(x):
        return z3.eq(x, _POS_INF if sign > 0 else _NEG_INF)
    return isinstance(x, float) and math.isinf(x) and (x > 0) == (sign > 0)


def add(a: Element, b: Element) -> Element:
    if _is_zero(a):
        return _pynum(b) if not is_z3(b) else _num(b)
    if _is_zero(b):
        return _pynum(a) if not is_z3(a) else _num(a)
    if is_z3(a) or is_z3(b):
        return _num(a) + _num(b)
    return _pynum(a) + _pynum(b)


def sub(a: Element, b: Element) -> Element:
    if _is_zero(b):
        return _pynum(a) if not is_z3(a) else _num(a)
    if is_z3(a) or is_z3(b):
        return _num(a) - _num(b)
    return _pynum(a) - _pynum(b)


def mul(a: Element, b: Element) -> Element:
    if _is_one(a):
        return _pynum(b) if not is_z3(b) else _num(b)
    if _is_one(b):
        return _pynum(a) if not is_z3(a) else _num(a)
    if is_z3(a) or is_z3(b):
        if _is_zero(a) or _is_zero(b):
            return 0
        return _num(a) * _num(b)
    return _pynum(a) * _pynum(b)


def neg(a: Element) -> Element:
    return -_num(a) if is_z3(a) else -_pynum(a)


def sum_list(items: Sequence[Element]) -> Element:
    """Exact sum, flat (`z3.Sum`) when symbolic."""
    concrete = [_pynum(x) for x in items if not is_z3(x)]
    symbolic = [_num(x) for x in items if is_z3(x)]
    total = sum(concrete, 0)
    if not symbolic:
        return total
    if total != 0:
        symbolic.append(to_z3(total))
    return symbolic[0] if len(symbolic) == 1 else z3.Sum(symbolic)


def _as_int(x: Element) -> Element:
    """An integral Fraction as an int (integer-typed values may come from exact scalars)."""
    if isinstance(x, Fraction) and x.denominator == 1:
        return int(x)
    return x


def _c_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _z3_floor(x: z3.ArithRef) -> z3.ArithRef:
    return z3.ToInt(x) if x.is_real() else x


def _z3_trunc(x: z3.ArithRef) -> z3.ArithRef:
    if x.is_int():
        return x
    return z3.If(x >= 0, z3.ToInt(x), -z3.ToInt(-x))


def _z3_int_div(a: z3.ArithRef, b: z3.ArithRef) -> z3.ArithRef:
    """Integer division truncating toward zero (StableHLO), from z3's Euclidean `div`."""
    abs_a, abs_b = z3.If(a >= 0, a, -a), z3.If(b >= 0, b, -b)
    quotient = abs_a / abs_b
    return z3.If((a >= 0) == (b >= 0), quotient, -quotient)


def div(a: Element, b: Element, integer: bool = False) -> Element:
    """a / b; integer division truncates toward zero (StableHLO), real division is exact."""
    if _is_one(b):
        return _pynum(a) if not is_z3(a) else _num(a)
    _note_divisor(b)
    if is_z3(a) or is_z3(b):
        za, zb = _num(a), _num(b)
        if integer and za.is_int() and zb.is_int():
            return _z3_int_div(za, zb)
        if za.is_int() and zb.is_int():
            za = z3.ToReal(za)
        return za / zb
    a, b = _pynum(a), _pynum(b)
    if integer:
        a, b = _as_int(a), _as_int(b)
    if integer and isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return -1  # XLA's convention for integer division by zero
        return _c_div(a, b)
    if isinstance(a, float) or isinstance(b, float):
        if b == 0:
            return math.copysign(math.inf, a) if a != 0 else math.nan
        return a / b
    if b == 0:
        return math.copysign(math.inf, a) if a != 0 else math.nan
    return Fraction(a) / b


def remainder(a: Element, b: Element, integer: bool = False) -> Element:
    """a - b * trunc(a / b) (sign of the dividend, like C's fmod)."""
    _note_divisor(b)
    if is_z3(a) or is_z3(b):
        za, zb = _num(a), _num(b)
        if za.is_int() and zb.is_int():
            return za - zb * _z3_int_div(za, zb)
        return za - zb * z3.ToReal(_z3_trunc(za / zb))
    a, b = _pynum(a), _pynum(b)
    if integer:
        a, b = _as_int(a), _as_int(b)
    if isinstance(a, int) and isinstance(b, int):
        return a if b == 0 else a - b * _c_div(a, b)
    if isinstance(a, float) or isinstance(b, float):
        return math.fmod(a, b) if b != 0 else math.nan
    if b == 0:
        return math.nan
    quotient = Fraction(a) / b
    return a - b * int(quotient)


def maximum(a: Element, b: Element) -> Element:
    if _is_inf(a, -1) or _is_inf(b, 1):
        return b
    if _is_inf(b, -1) or _is_inf(a, 1):
        return a
    if is_z3(a) or is_z3(b):
        if isinstance(to_z3(a), z3.BoolRef):
            return z3.Or(to_z3(a), to_z3(b))
        za, zb = _num(a), _num(b)
        return z3.If(za >= zb, za, zb)
    return max(a, b)


def minimum(a: Element, b: Element) -> Element:
    if _is_inf(a, 1) or _is_inf(b, -1):
        return b
    if _is_inf(b, 1) or _is_inf(a, -1):
        return a
    if is_z3(a) or is_z3(b):
        if isinstance(to_z3(a), z3.BoolRef):
            return z3.And(to_z3(a), to_z3(b))
        za, zb = _num(a), _num(b)
        return z3.If(za <= zb, za, zb)
    return min(a, b)


def select(pred: Element, a: Element, b: Element) -> Element:
    pred = _exact(pred)
    if not is_z3(pred):
        return a if pred else b
    pred = to_z3(pred)
    if not isinstance(pred, z3.BoolRef):
        pred = pred != 0
    za, zb = to_z3(a), to_z3(b)
    if isinstance(za, z3.BoolRef) != isinstance(zb, z3.BoolRef):
        za, zb = _num(za), _num(zb)
    return z3.If(pred, za, zb)


_COMPARE: dict[str, Callable[[Element, Element], Element]] = {
    "EQ": lambda a, b: a == b, "NE": lambda a, b: a != b, "LT": lambda a, b: a < b,
    "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b, "GE": lambda a, b: a >= b,
}


def compare(a: Element, b: Element, direction: str, total: bool = False) -> Element:
    """`a direction b`; `total` is StableHLO's TOTALORDER (-0 < +0, NaNs ordered by sign).
    Exact numbers carry no sign of zero: a symbolic TOTALORDER compare of two zeros is an
    unknown boolean (one per direction), so it never equals the FLOAT compare there."""
    op = _COMPARE.get(direction)
    if op is None:
        raise SemanticsError(f"unknown comparison direction {direction!r}")
    if is_z3(a) or is_z3(b):
        za, zb = to_z3(a), to_z3(b)
        both_bool = isinstance(za, z3.BoolRef) and isinstance(zb, z3.BoolRef)
        if both_bool and direction in ("EQ", "NE"):
            return op(za, zb)
        za, zb = _num(za), _num(zb)
        if total:
            return z3.If(z3.And(za == 0, zb == 0), z3.Bool(f"totalorder_{direction}_of_zeros"),
                         op(za, zb))
        return op(za, zb)
    if total and isinstance(a, float) and isinstance(b, float):
        return bool(op(_total_key(a), _total_key(b)))
    return bool(op(_pynum(a), _pynum(b)))


def _total_key(x: float) -> int:
    """The position of a float in IEEE-754 totalOrder (the bits, sign-magnitude to two's
    complement): -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN."""
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits if bits >= 0 else -(bits & ((1 << 63) - 1)) - 1


def equal(a: Element, b: Element) -> Element:
    """Equality used by claims: booleans compare as 0/1 against numbers."""
    a, b = _exact(a), _exact(b)
    if not is_z3(a) and not is_z3(b):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True  # the same fill value on both sides (NaN is data here, not math)
        return _pynum(a) == _pynum(b)
    za, zb = to_z3(a), to_z3(b)
    if isinstance(za, z3.BoolRef) != isinstance(zb, z3.BoolRef):
        za, zb = _num(za), _num(zb)
    return za == zb


def _logic(name: str) -> Callable[[Element, Element], Element]:
    z3_fn = {"and": z3.And, "or": z3.Or, "xor": z3.Xor}[name]
    py_fn = {"and": lambda a, b: a & b, "or": lambda a, b: a | b,
             "xor": lambda a, b: a ^ b}[name]

    def fn(a: Element, b: Element) -> Element:
        a, b = _exact(a), _exact(b)
        if is_z3(a) or is_z3(b):
            za, zb = to_z3(a), to_z3(b)
            if not (isinstance(za, z3.BoolRef) and isinstance(zb, z3.BoolRef)):
                raise SemanticsError(f"bitwise {name} of symbolic integers is not supported")
            return z3_fn(za, zb)
        return py_fn(a, b)

    return fn


def logical_not(a: Element, dtype: str) -> Element:
    a = _exact(a)
    if is_z3(a):
        za = to_z3(a)
        if not isinstance(za, z3.BoolRef):
            raise SemanticsError("bitwise not of a symbolic integer is not supported")
        return z3.Not(za)
    if isinstance(a, bool) or is_bool_dtype(dtype):
        return not a
    return ~a


def absolute(a: Element) -> Element:
    if is_z3(a):
        za = _num(a)
        return z3.If(za >= 0, za, -za)
    return abs(_pynum(a))


def sign(a: Element) -> Element:
    if is_z3(a):
        za = _num(a)
        one = z3.IntVal(1) if za.is_int() else z3.RealVal(1)
        zero = z3.IntVal(0) if za.is_int() else z3.RealVal(0)
        return z3.If(za > 0, one, z3.If(za < 0, -one, zero))
    a = _pynum(a)
    return (a > 0) - (a < 0)


def floor(a: Element) -> Element:
    if is_z3(a):
        za = _num(a)
        return z3.ToReal(z3.ToInt(za)) if za.is_real() else za
    a = _pynum(a)
    return a if isinstance(a, float) and not math.isfinite(a) else math.floor(a)


def ceil(a: Element) -> Element:
    return neg(floor(neg(a)))


def round_afz(a: Element) -> Element:
    """Round half away from zero."""
    return mul(sign(a), floor(add(absolute(a), Fraction(1, 2))))


def round_even(a: Element) -> Element:
    """Round half to even."""
    if is_z3(a):
        za = _num(a)
        if za.is_int():
            return za
        shifted = za + z3.RealVal(1) / 2
        low = z3.ToInt(shifted)
        tie = z3.ToReal(low) == shifted
        return z3.ToReal(z3.If(z3.And(tie, low % 2 == 1), low - 1, low))
    a = _pynum(a)
    if isinstance(a, float) and not math.isfinite(a):
        return a
    return round(Fraction(a)) if not isinstance(a, float) else float(round(a))


# ----- transcendental functions ---------------------------------------------------------------

def _rsqrt(x: float) -> float:
    return 1.0 / math.sqrt(x)


def _logistic(x: float) -> float:
    if x < -700:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))


def _cbrt(x: float) -> float:
    return math.copysign(abs(x) ** (1.0 / 3.0), x)


_UNARY_MATH: dict[str, Callable[[float], float]] = {
    "exponential": math.exp, "exponential_minus_one": math.expm1, "log": math.log,
    "log_plus_one": math.log1p, "tanh": math.tanh, "logistic": _logistic, "rsqrt": _rsqrt,
    "sqrt": math.sqrt, "cbrt": _cbrt, "sine": math.sin, "cosine": math.cos, "tan": math.tan,
    "erf": math.erf,
}

_BINARY_MATH: dict[str, Callable[[float, float], float]] = {
    "atan2": math.atan2, "power": math.pow,
}


def uninterpreted(name: str, arity: int = 1) -> z3.FuncDeclRef:
    """The z3 function standing for a transcendental op (same name -> same function)."""
    return z3.Function(name, *([z3.RealSort()] * (arity + 1)))


def _random_value(name: str, args: tuple[Element, ...], seed: int) -> Fraction:
    key = hash((seed, name) + tuple(Fraction(a) if not isinstance(a, float) else a
                                    for a in args))
    return Fraction(key % 2001 - 1000, 97)


def transcendental(name: str, *args: Element) -> Element:
    """`name` applied to elements: UF on z3, `math` on floats, random rational if asked."""
    args = tuple(_pynum(a) if not is_z3(a) else a for a in args)
    if any(is_z3(a) for a in args):
        real = []
        for a in args:
            z = _num(a)
            real.append(z3.ToReal(z) if z.is_int() else z)
        return uninterpreted(name, len(args))(*real)
    seed = _RANDOM_FUNCTIONS.get()
    if seed is not None and not any(isinstance(a, float) for a in args):
        return _random_value(name, args, seed)
    fn = _UNARY_MATH.get(name) if len(args) == 1 else _BINARY_MATH.get(name)
    if fn is None:
        raise SemanticsError(f"no numeric semantics for {name}")
    try:
        return fn(*(float(a) for a in args))
    except (ValueError, ZeroDivisionError):
        return math.nan
    except OverflowError:
        return math.inf


def power(a: Element, b: Element) -> Element:
    """a ** b: repeated multiplication for a concrete integer exponent, else uninterpreted."""
    b = _pynum(b) if not is_z3(b) else b
    if not is_z3(b) and not isinstance(b, float) and Fraction(b).denominator == 1:
        n = int(b)
        if not is_z3(a) and not isinstance(_pynum(a), float):
            base = Fraction(_pynum(a))
            if base == 0 and n < 0:
                return math.inf
            result = base ** n
            return int(result) if isinstance(_pynum(a), int) and n >= 0 else result
        if n == 0:
            return 1
        result = _fold(mul, [a] * abs(n))
        return result if n > 0 else div(1, result)
    return transcendental("power", a, b)


# ----- integer width ----------------------------------------------------------------------------

def int_limits(dtype: str) -> tuple[int, int] | None:
    """[min, max] of an integer dtype (two's complement, or unsigned), None otherwise."""
    found = intrange.int_limits(dtype)
    return None if found is None else (int(found[0]), int(found[1]))


def wrap_shift(x: Element, offset: Element, dtype: str) -> Element:
    """`x + offset` in integer `dtype` for `x` a value of the dtype and a concrete `offset`:
    only one side can overflow, so one exact correction (z3 decides it far faster than a
    modulo or a two-sided chain)."""
    limits = int_limits(dtype)
    total = add(x, offset)
    if limits is None or not is_z3(total) or is_z3(offset) or not _num(total).is_int():
        return wrap_int(total, dtype)
    lo, hi = limits
    c = int(_pynum(offset))
    span = hi - lo + 1
    if not lo <= c <= hi:
        return wrap_shift(x, (c - lo) % span + lo, dtype)
    total = _num(total)
    if c >= 0:
        return z3.If(total > hi, total - span, total)
    return z3.If(total < lo, total + span, total)


def wrap_int(x: Element, dtype: str, periods: int | None = None) -> Element:
    """`x` reduced into the range of integer `dtype` modulo 2^N (the value a device computes:
    integer arithmetic wraps around). Symbolic values in range are kept as they are.
    `periods`: x is known to lie within that many ranges of the dtype's own (a sum of two
    values of the dtype: 1), so a few exact corrections replace z3's harder modulo."""
    limits = int_limits(dtype)
    if limits is None or is_bool(x):
        return x
    lo, hi = limits
    span = hi - lo + 1
    if is_z3(x):
        if not x.is_int():
            if not x.is_real():
                return x
            x = z3.ToInt(x)  # an integer value built with rational constants
        if z3.is_int_value(x):
            return z3.IntVal((x.as_long() - lo) % span + lo)
        if periods is None:
            return z3.If(z3.And(x >= lo, x <= hi), x, (x - lo) % span + lo)
        out = x
        for q in range(1, periods + 1):
            out = z3.If(x > hi + (q - 1) * span, x - q * span, out) if q > 1 else \
                z3.If(x > hi, x - span, out)
        wrapped = out
        for q in range(1, periods + 1):
            wrapped = z3.If(x < lo - (q - 1) * span, x + q * span, wrapped) if q > 1 else \
                z3.If(x < lo, x + span, wrapped)
        return wrapped
    if isinstance(x, Fraction) and x.denominator == 1:
        x = int(x)
    if isinstance(x, int):
        return (x - lo) % span + lo
    return x


WRAPPED_OPS = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                "stablehlo.negate", "stablehlo.abs", "stablehlo.divide", "stablehlo.convert",
                "stablehlo.dot_general", "stablehlo.reduce", "stablehlo.reduce_window",
                "stablehlo.scatter", "stablehlo.all_reduce", "stablehlo.reduce_scatter",
                "lin", "mul", "div", "reduce_sum", "reduce_window_sum")
"""Ops whose integer results are computed modulo 2^N (sums, products, quotients, converts);
`_wrapped` reduces their results into the dtype's range."""


_NEAR_OPS = {"stablehlo.add": 1, "stablehlo.subtract": 1, "stablehlo.negate": 1,
             "stablehlo.abs": 1, "stablehlo.divide": 1}
"""Ops whose result on values of the dtype lies within one range of it (INT_MIN / -1)."""


def _wrap_array(value: Array, dtype: str, periods: int | None = None) -> Array:
    if int_limits(dtype) is None:
        return value
    return apply(lambda x: wrap_int(x, dtype, periods), value)


def wrap_node(term: Term, value: Array) -> Array:
    """A term node's value in its dtype: integer sums, products, quotients and converts wrap
    around (`WRAPPED_OPS`)."""
    if term.op not in WRAPPED_OPS or int_limits(term.dtype) is None:
        return value
    return _wrap_array(value, term.dtype, _lin_periods(term))


def wrap_node_dtype(value: Array, dtype: str) -> Array:
    """`value` (a sum of values of integer `dtype`) as the dtype holds it."""
    return _wrap_array(value, dtype)


def _lin_periods(term: Term) -> int | None:
    """How many ranges of its dtype a `lin` of values of the dtype can leave (None: unknown
    or not a lin): a few exact corrections then replace z3's modulo."""
    limits = int_limits(term.dtype)
    if term.op != "lin" or limits is None:
        return None
    constant, coefs = term.attrs
    lo, hi = limits
    if not all(isinstance(k, Fraction) and k.denominator == 1 for k in (constant, *coefs)):
        return None
    low = high = int(constant)
    for k in coefs:
        low += min(k * lo, k * hi)
        high += max(k * lo, k * hi)
    span = hi - lo + 1
    periods = max(-((low - lo) // span), -((hi - high) // span), 0)
    return periods if periods <= 4 else None


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
        periods = _NEAR_OPS.get(info.name)
        if periods is not None and any(int_limits(t.dtype) is None or t.dtype !=
                                       info.result_types[0].dtype for t in info.operand_types):
            periods = None
        return [_wrap_array(r, t.dtype, periods) for r, t in zip(results, info.result_types)] + \
            results[len(info.result_types):]

    local.__doc__ = fn.__doc__
    return local


def _wrapped_collective(fn: CollectiveFn) -> CollectiveFn:
    def collective(info: OpInfo, mesh: Mesh, operands: list[list[Array]]
                   ) -> list[list[Array]]:
        per_device = fn(info, mesh, operands)
        return [[_wrap_array(r, t.dtype) for r, t in zip(rs, info.result_types)]
                + rs[len(info.result_types):] for rs in per_device]

    collective.__doc__ = fn.__doc__
    return collective


# ----- convert --------------------------------------------------------------------------------

def convert(a: Element, src: str, dst: str) -> Element:
    """Exact conversion: bool <-> 0/1, float -> int truncates, everything else is identity."""
    a = _exact(a)
    if is_bool_dtype(dst):
        if is_bool(a):
            return a
        return (_num(a) != 0) if is_z3(a) else bool(a != 0)
    if is_bool(a):
        if is_z3(a):
            one = z3.IntVal(1) if is_int_dtype(dst) else z3.RealVal(1)
            zero = z3.IntVal(0) if is_int_dtype(dst) else z3.RealVal(0)
            return z3.If(a, one, zero)
        return int(a)
    if is_int_dtype(dst):
        if is_z3(a):
            return _z3_trunc(a)
        if isinstance(a, float) and not math.isfinite(a):
            return a
        return int(a)
    if is_z3(a) and a.is_int():
        a = z3.ToReal(a)
    if precision.rounds(src, dst):
        return round_to(a, dst)
    return a


def round_to(a: Element, dtype: str) -> Element:
    """`a` rounded to float `dtype` (a narrowing convert): exactly on numbers, an
    uninterpreted function `round_<dtype>` on z3 terms, so no proof takes it for the
    identity."""
    if is_z3(a):
        z = _num(a)
        return uninterpreted(f"round_{dtype}")(z3.ToReal(z) if z.is_int() else z)
    value = _pynum(a)
    if isinstance(value, float) and not math.isfinite(value):
        return value
    rounded = precision.round_to(value, dtype)
    return rounded if isinstance(rounded, float) else (
        float(rounded) if isinstance(value, float) else rounded)


# ----- array helpers --------------------------------------------------------------------------

def obj_array(values, shape: tuple[int, ...] | None = None) -> Array:
    """An object array from a numpy array, nested lists or a scalar (elements kept as is)."""
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values if shape is None else values.reshape(shape)
    if isinstance(values, np.ndarray):
        out = np.empty(values.shape, dtype=object)
        for idx in np.ndindex(values.shape):
            out[idx] = _exact(values[idx].item() if hasattr(values[idx], "item")
                              else values[idx])
        return out if shape is None else out.reshape(shape)
    if isinstance(values, (list, tuple)):
        return obj_array(np.array(values, dtype=object), shape)
    out = np.empty((), dtype=object)
    out[()] = _exact(values)
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


_KIND_ALIASES = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "mul"}


def combine(kind: str, items: Sequence[Element]) -> Element:
    """Fold items with a reduction kind (the identity element when empty)."""
    kind = _KIND_ALIASES.get(kind, kind)
    if kind == "sum":
        return sum_list(items)
    if not items:
        identity = {"max": -math.inf, "min": math.inf, "mul": 1, "and": True, "or": False}
        if kind not in identity:
            raise SemanticsError(f"unknown reduction kind {kind!r}")
        return identity[kind]
    fns = {"max": maximum, "min": minimum, "mul": mul, "and": _logic("and"),
           "or": _logic("or")}
    if kind not in fns:
        raise SemanticsError(f"unsupported reducer {kind!r}")
    if kind in ("max", "min"):
        items = sorted(items, key=_order_key)
    return _fold(fns[kind], items)


def _order_key(item: Element) -> tuple[int, str, int]:
    """A canonical order for the operands of a max or min (commutative and associative, so
    the order is immaterial): the same elements in any order give the same formula, and Z3
    need not case-split to see that a max over blocks in a permuted order is the max.
    Numbers first (in their order), then variables by name, then other formulas."""
    if not is_z3(item):
        return (0, "", 0)
    if z3.is_const(item):
        return (1, str(item), 0)
    return (2, "", item.get_id())


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
    out = np.empty((batch, m, n), dtype=object)
    for b in range(batch):
        for i in range(m):
            for j in range(n):
                out[b, i, j] = sum_list([mul(left[b, i, t], right[b, t, j]) for t in range(k)])
    shape = (tuple(lhs.shape[d] for d in lb) + tuple(lhs.shape[d] for d in lf)
             + tuple(rhs.shape[d] for d in rf))
    return out.reshape(shape)


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


def _index_vector(indices: Array, batch_index: tuple[int, ...], index_vector_dim: int
                  ) -> list[Element]:
    if index_vector_dim >= indices.ndim:
        return [indices[batch_index]]
    return [indices[batch_index[:index_vector_dim] + (k,) + batch_index[index_vector_dim:]]
            for k in range(indices.shape[index_vector_dim])]


def _clamped(start: Element, high: int) -> Element:
    """min(max(start, 0), high) for a concrete or symbolic integer."""
    start = _exact(start)
    if not is_z3(start):
        return min(max(int(start), 0), high)
    z = _num(start)
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
            target[d] = _exact(start[k])
        for d_operand, d_start in zip(input_batching, indices_batching):
            target[d_operand] = scatter_index[d_start - (0 if d_start < index_vector_dim else 1)]
        fits: list = []
        for d, (t, n) in enumerate(zip(target, operand.shape)):
            if is_z3(t):
                fits.append(z3.And(_num(t) >= 0, _num(t) + sizes[d] <= n))
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
        for index in np.ndindex(out.shape):
            hit = z3.And([_num(t) == i if is_z3(t) else z3.BoolVal(int(t) == i)
                          for t, i in zip(target, index)] + fits)
            new = value if kind == "replace" else combine(kind, [out[index], value])
            out[index] = select(hit, new, out[index])
    return out



def top_k(x: Array, k: int) -> tuple[Array, Array]:
    """The k largest elements along the last dim, largest first, and their indices; equal
    values keep their order (the lower index first, as `lax.top_k` documents).

    Concrete rows are sorted directly; rows with symbolic elements go through k passes of a
    stable bubble network (compare-exchange of adjacent (value, index) pairs, swapping only when
    the later value is strictly larger), so the result is an If-term per element.
    """
    x = obj_array(x)
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
                    (a, ia), (b, ib) = pairs[j - 1], pairs[j]
                    swap = compare(b, a, "GT")
                    pairs[j - 1] = (select(swap, b, a), select(swap, ib, ia))
                    pairs[j] = (select(swap, a, b), select(swap, ia, ib))
            picked = pairs[:k]
        for j, (v, i) in enumerate(picked):
            values[idx + (j,)], indices[idx + (j,)] = v, i
    return values, indices


# ----- elementwise table ----------------------------------------------------------------------

ElementwiseFn = Callable[[list[Array], dict, str, list[str]], Array]


def _unary(fn: Callable[[Element], Element]) -> ElementwiseFn:
    return lambda args, attrs, dtype, src: apply(fn, args[0])


def _binary(fn: Callable[[Element, Element], Element]) -> ElementwiseFn:
    return lambda args, attrs, dtype, src: apply(fn, args[0], args[1])


def _transcendental(name: str) -> ElementwiseFn:
    return lambda args, attrs, dtype, src: apply(lambda *xs: transcendental(name, *xs), *args)


def _divide(args, attrs, dtype, src) -> Array:
    integer = is_int_dtype(dtype)
    return apply(lambda a, b: div(a, b, integer), args[0], args[1])


def _remainder(args, attrs, dtype, src) -> Array:
    integer = is_int_dtype(dtype)
    return apply(lambda a, b: remainder(a, b, integer), args[0], args[1])


def _compare(args, attrs, dtype, src) -> Array:
    direction = attrs.get("comparison_direction")
    total = attrs.get("compare_type") == "TOTALORDER"
    return apply(lambda a, b: compare(a, b, direction, total), args[0], args[1])


def _clamp(args, attrs, dtype, src) -> Array:
    lo, x, hi = args
    return apply(lambda lo_, x_, hi_: minimum(maximum(x_, lo_), hi_), lo, x, hi)


def _convert(args, attrs, dtype, src) -> Array:
    source = src[0] if src else dtype
    return apply(lambda a: convert(a, source, dtype), args[0])


def _not(args, attrs, dtype, src) -> Array:
    return apply(lambda a: logical_not(a, dtype), args[0])


def _is_finite(a: Element) -> Element:
    if is_z3(a):
        return z3.BoolVal(True)  # exact reals are finite (see the module docstring)
    a = _pynum(a)
    return not isinstance(a, float) or math.isfinite(a)


ELEMENTWISE: dict[str, ElementwiseFn] = {
    "stablehlo.add": _binary(add),
    "stablehlo.subtract": _binary(sub),
    "stablehlo.multiply": _binary(mul),
    "stablehlo.divide": _divide,
    "stablehlo.remainder": _remainder,
    "stablehlo.maximum": _binary(maximum),
    "stablehlo.minimum": _binary(minimum),
    "stablehlo.power": _binary(power),
    "stablehlo.atan2": _transcendental("atan2"),
    "stablehlo.negate": _unary(neg),
    "stablehlo.abs": _unary(absolute),
    "stablehlo.sign": _unary(sign),
    "stablehlo.floor": _unary(floor),
    "stablehlo.ceil": _unary(ceil),
    "stablehlo.round_nearest_afz": _unary(round_afz),
    "stablehlo.round_nearest_even": _unary(round_even),
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
    "stablehlo.and": _binary(_logic("and")),
    "stablehlo.or": _binary(_logic("or")),
    "stablehlo.xor": _binary(_logic("xor")),
    "stablehlo.not": _not,
    "stablehlo.convert": _convert,
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

def _result_shape(info: OpInfo, index: int = 0) -> tuple[int, ...]:
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
    shape = _result_shape(info)
    value = _constant_value(info.attrs["value"], info.result_types[0].dtype)
    if value.shape != shape:
        value = np.broadcast_to(value.reshape(-1)[:1].reshape(()) if info.attrs.get("splat")
                                else value, shape).copy()
    return [value]


def _op_iota(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [iota(_result_shape(info), info.attrs["iota_dimension"])]


def _op_broadcast(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [broadcast_in_dim(obj_array(operands[0]), info.attrs["broadcast_dimensions"],
                             _result_shape(info))]


def _op_reshape(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [reshape(obj_array(operands[0]), _result_shape(info))]


def _op_transpose(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [transpose(obj_array(operands[0]), info.attrs["permutation"])]


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


def _op_reduce(info: OpInfo, operands: list[Array]) -> list[Array]:
    half = len(operands) // 2
    if half != 1:
        raise SemanticsError("variadic reduce has no semantics here (single operand only)")
    x, init = obj_array(operands[0]), obj_array(operands[1]).reshape(-1)[0]
    reducer = info.attrs.get("reducer", "other")
    if reducer not in ("add", "max", "min", "mul", "and", "or"):
        raise SemanticsError(f"reduce with a '{reducer}' reducer")
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


def _op_gather(info: OpInfo, operands: list[Array]) -> list[Array]:
    dims = dimension_numbers(info.attrs, "dimension_numbers")
    return [gather(obj_array(operands[0]), obj_array(operands[1]), dims,
                   info.attrs["slice_sizes"], _result_shape(info))]


def _op_scatter(info: OpInfo, operands: list[Array]) -> list[Array]:
    if len(operands) != 3:
        raise SemanticsError("variadic scatter has no semantics here (single input only)")
    dims = dimension_numbers(info.attrs, "scatter_dimension_numbers")
    kind = scatter_kind(info)
    if kind not in ("replace", "add", "max", "min", "mul"):
        raise SemanticsError(f"scatter with a '{kind}' update computation")
    return [scatter(obj_array(operands[0]), obj_array(operands[1]), obj_array(operands[2]),
                    dims, kind)]


def _op_top_k(info: OpInfo, operands: list[Array]) -> list[Array]:
    return list(top_k(obj_array(operands[0]), int(info.attrs["k"])))


def _op_identity(info: OpInfo, operands: list[Array]) -> list[Array]:
    return [obj_array(x) for x in operands]


OP_SEMANTICS: dict[str, LocalFn] = {
    **{name: _elementwise_op(name) for name in ELEMENTWISE},
    "stablehlo.constant": _op_constant,
    "stablehlo.iota": _op_iota,
    "stablehlo.broadcast_in_dim": _op_broadcast,
    "stablehlo.reshape": _op_reshape,
    "stablehlo.transpose": _op_transpose,
    "stablehlo.slice": _op_slice,
    "stablehlo.concatenate": _op_concatenate,
    "stablehlo.pad": _op_pad,
    "stablehlo.dot_general": _op_dot_general,
    "stablehlo.reduce": _op_reduce,
    "stablehlo.reduce_window": _op_reduce_window,
    "stablehlo.dynamic_slice": _op_dynamic_slice,
    "stablehlo.dynamic_update_slice": _op_dynamic_update_slice,
    "stablehlo.gather": _op_gather,
    "stablehlo.scatter": _op_scatter,
    "chlo.top_k": _op_top_k,
    "mhlo.copy": _op_identity,
    "stablehlo.optimization_barrier": _op_identity,
}
"""Local (per-device) semantics: `fn(info, operands) -> results`, keyed by op name."""
OP_SEMANTICS.update({name: _wrapped_local(OP_SEMANTICS[name]) for name in WRAPPED_OPS
                     if name in OP_SEMANTICS})


# ----- collectives ----------------------------------------------------------------------------

def replica_groups(info: OpInfo, mesh: Mesh) -> list[list[int]]:
    """The groups of device ids a collective combines, as StableHLO defines them from its
    channel, use_global_device_ids and replica_groups (`groups.process_groups`)."""
    try:
        return process_groups(info.name, info.attrs, mesh.replicas, mesh.partitions)
    except GroupError as err:
        raise SemanticsError(str(err)) from None


def _group_of(groups: list[list[int]]) -> dict[int, list[int]]:
    return {d: g for g in groups for d in g}


def _all_reduce(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    kind = info.attrs.get("reducer", "add")
    results: list[list[Array]] = []
    for d in range(n):
        members = groups[d]
        per_operand = []
        for k in range(len(operands[d])):
            arrays = [obj_array(operands[m][k]) for m in members]
            out = np.empty(arrays[0].shape, dtype=object)
            for idx in np.ndindex(out.shape):
                out[idx] = combine(kind, [a[idx] for a in arrays])
            per_operand.append(out)
        results.append(per_operand)
    return results


def _all_gather(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    dim = info.attrs["all_gather_dim"]
    return [[concatenate([operands[m][k] for m in groups[d]], dim)
             for k in range(len(operands[d]))] for d in range(n)]


def _reduce_scatter(info: OpInfo, mesh: Mesh, operands: list[list[Array]]
                    ) -> list[list[Array]]:
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    summed = _all_reduce(info, mesh, operands)
    dim = info.attrs["scatter_dimension"]
    results = []
    for d in range(n):
        members = groups[d]
        position = members.index(d)
        per_operand = []
        for array in summed[d]:
            if array.shape[dim] % len(members):
                raise SemanticsError("reduce_scatter: dim not divisible by the group size")
            part = array.shape[dim] // len(members)
            index = [slice(None)] * array.ndim
            index[dim] = slice(position * part, (position + 1) * part)
            per_operand.append(array[tuple(index)].copy())
        results.append(per_operand)
    return results


def _all_to_all(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    """Device j of a group sends the i-th split block to device i, which concatenates the
    blocks it receives in group order."""
    n = mesh.num_devices
    groups = _group_of(replica_groups(info, mesh))
    split, concat = info.attrs["split_dimension"], info.attrs["concat_dimension"]
    count = info.attrs.get("split_count")
    results = []
    for d in range(n):
        members = groups[d]
        if count is not None and count != len(members):
            raise SemanticsError("all_to_all: split_count differs from the group size")
        position = members.index(d)
        per_operand = []
        for k in range(len(operands[d])):
            blocks = []
            for m in members:
                array = obj_array(operands[m][k])
                part = array.shape[split] // len(members)
                index = [slice(None)] * array.ndim
                index[split] = slice(position * part, (position + 1) * part)
                blocks.append(array[tuple(index)])
            per_operand.append(concatenate(blocks, concat))
        results.append(per_operand)
    return results


def _collective_permute(info: OpInfo, mesh: Mesh, operands: list[list[Array]]
                        ) -> list[list[Array]]:
    """result[target] = operand[source]; devices nobody sends to get zeros."""
    n = mesh.num_devices
    try:
        source_of = {t: s for s, t in permute_pairs(info.attrs, mesh.replicas,
                                                    mesh.partitions)}
    except GroupError as err:
        raise SemanticsError(str(err)) from None
    results = []
    for d in range(n):
        if d in source_of:
            results.append([obj_array(x).copy() for x in operands[source_of[d]]])
        else:
            results.append([full(obj_array(x).shape, 0) for x in operands[d]])
    return results


def _partition_id(info: OpInfo, mesh: Mesh, operands: list[list[Array]]) -> list[list[Array]]:
    shape = _result_shape(info) if info.result_types else ()
    return [[full(shape, d)] for d in range(mesh.num_devices)]


COLLECTIVE_SEMANTICS: dict[str, CollectiveFn] = {
    "stablehlo.all_reduce": _all_reduce,
    "stablehlo.all_gather": _all_gather,
    "stablehlo.reduce_scatter": _reduce_scatter,
    "stablehlo.all_to_all": _all_to_all,
    "stablehlo.collective_permute": _collective_permute,
    "stablehlo.partition_id": _partition_id,
    "stablehlo.replica_id": _partition_id,
}
"""Cross-device semantics: `fn(info, mesh, operands per device) -> results per device`."""
COLLECTIVE_SEMANTICS.update({name: _wrapped_collective(COLLECTIVE_SEMANTICS[name])
                             for name in WRAPPED_OPS if name in COLLECTIVE_SEMANTICS})


def run_op(info: OpInfo, operands: list[list[Array]], mesh: Mesh | None) -> list[list[Array]]:
    """Results per device (one "device" when `mesh` is None) of any op in either table."""
    if info.name in COLLECTIVE_SEMANTICS:
        if mesh is None:
            raise SemanticsError(f"{info.name} needs a mesh")
        return COLLECTIVE_SEMANTICS[info.name](info, mesh, operands)
    fn = OP_SEMANTICS.get(info.name)
    if fn is None:
        raise SemanticsError(f"no semantics for op {info.name}")
    return [fn(info, ops) for ops in operands]


# ----- terms ----------------------------------------------------------------------------------

TermEnv = dict
"""`{arg index: array}`; optional `("dense", key): array` entries give dense constants, and the
key `"dense"` may map to a callable `(term) -> array` used for dense constants not listed.
Loop terms are values the semantics does not compute: `("loopvar", depth, index): array` for a
loop variable, `("term", serial): array` for a `while_result` or a `region_result`, else the
callable under
`"opaque"`."""

_INDEXED_TERM_OPS = ("stablehlo.gather", "stablehlo.scatter", "stablehlo.dynamic_update_slice")
"""Terms evaluated by their op's own semantics, attributes given as (name, value) pairs."""

_WINDOW_TERM_OPS = {"reduce_window_sum": "sum", "reduce_window_max": "max",
                    "reduce_window_min": "min"}
"""reduce_window terms (init value: the reducer's identity); attrs as `rules/reduction`
builds them: (window, strides, base dilations, window dilations, padding low, high)."""

_OPAQUE_LEAVES = ("loopvar", "while_result", "region_result")
"""Terms evaluated as given values (a loop's carried value / result, a summarized layer's
result), not computed."""

_LINEAR_OPS = ("lin", "mul", "div")


def evaluate_term(term: Term, env: TermEnv, memo: dict[int, Array] | None = None) -> Array:
    """The value of a reference term (global shape), given arrays for its `arg` leaves.

    Every op string a term can carry is handled explicitly; an unknown one raises
    `SemanticsError` naming it.
    """
    memo = {} if memo is None else memo
    for top in post_order(term, memo):
        value = _evaluate_node(top, [memo[a.serial] for a in top.args], env)
        value = wrap_node(top, value)
        if value.shape != tuple(top.shape):
            raise SemanticsError(f"term {top.op} evaluated to shape {value.shape}, "
                                 f"expected {top.shape}")
        memo[top.serial] = value
    return memo[term.serial]


def _evaluate_node(term: Term, args: list[Array], env: TermEnv) -> Array:
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
            value = _as_int(value)
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
    if op == "lin":
        constant, coefs = attrs
        if is_int_dtype(term.dtype):  # integer coefficients stay in z3's Int sort
            constant, coefs = _as_int(constant), tuple(_as_int(k) for k in coefs)
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
    if op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or"):
        return reduce_dims(args[0], attrs[0], op.split("_")[1])
    if op in _WINDOW_TERM_OPS:
        window, strides, base, dilation, low, high = attrs
        kind = _WINDOW_TERM_OPS[op]
        identity = {"sum": 0, "max": -math.inf, "min": math.inf}[kind]
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
        return top_k(args[0], k)[result]
    if op in _INDEXED_TERM_OPS:
        # attrs: the op's normalized attributes as sorted (name, value) pairs.
        info = OpInfo(op, dict(attrs), [TensorType(a.shape, a.dtype) for a in term.args],
                      [TensorType(shape, term.dtype)])
        return OP_SEMANTICS[op](info, args)[0]
    if op in ELEMENTWISE:
        named = {"comparison_direction": attrs[0]} if op == "stablehlo.compare" and attrs else {}
        if op == "stablehlo.compare" and len(attrs) > 1:
            named["compare_type"] = attrs[1]
        src = [a.dtype for a in term.args]
        if op == "stablehlo.convert" and attrs:
            src = [attrs[0]]  # the dtype the operand was computed in (its term may say less)
        if op in ("stablehlo.maximum", "stablehlo.minimum", "stablehlo.and", "stablehlo.or",
                  "stablehlo.xor") and len(args) > 2:
            fn = ELEMENTWISE[op]
            return _fold(lambda a, b: fn([a, b], named, term.dtype, src), args)
        return ELEMENTWISE[op](args, named, term.dtype, src)
    raise SemanticsError(f"evaluate_term: unknown term op {op!r}")


TERM_OPS = ("arg", "splat", "dense", "iota", "lin", "mul", "div", "broadcast", "reshape",
            "transpose", "reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or", "slice", "concatenate", "pad",
            "dynamic_slice", "stablehlo.dot_general", "chlo.top_k", *_INDEXED_TERM_OPS,
            *_OPAQUE_LEAVES, *_WINDOW_TERM_OPS,
            *ELEMENTWISE)
"""Every term op `evaluate_term` knows (for the coverage test against the rules)."""
