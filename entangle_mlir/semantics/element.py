"""One element in its dtype's arithmetic: the values StableHLO ops compute with, exactly.

The lowest layer of the semantics (split as StableHLO's reference interpreter splits Element,
Tensor, Ops and ProcessGrid): dtypes; arithmetic, comparison and rounding of single elements;
transcendental functions; integer wrap-around; converts; folding elements with a reduction
kind. It knows no arrays and no ops, so the array functions (`tensor.py`), the op tables
(`ops.py`, `collectives.py`) and term evaluation (`evaluate.py`) all build on it.

An element is one of

* a Python `int` / `bool` / `Fraction` / `float` (exact rationals; floats only for infinities or
  when the caller feeds floats, as the grounding tests against XLA do);
* a z3 expression (`ArithRef` of sort Real or Int, `BoolRef` for `i1`).

The semantics is exact real arithmetic, as in the design: float sums and products may be
regrouped, NaN is out of scope. A convert that rounds (f32 -> bf16, i32 -> f32; see
`precision.py`) is the uninterpreted function `round_<dtype>` on symbolic elements and exact
rounding on numbers, never the identity. Transcendental functions (exp, log, tanh, ...) are z3
*uninterpreted functions* Real -> Real on symbolic elements, so a proof never depends on a
property of tanh that a rule did not state; on floats they are the `math` functions, and inside
`random_functions()` they are deterministic pseudo-random rational functions (an interpretation
of the uninterpreted function, used to look for concrete counterexamples with exact
arithmetic). Infinities in symbolic context become two named real constants (`+oo`, `-oo`);
`max(-oo, x)` and friends simplify away syntactically, anything else about them is not
provable (never wrongly proved).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from functools import reduce as _fold

import numpy as np
import z3

from entangle_mlir.core import precision, ranges

Element = object


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


_ROUNDINGS: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "entangle_roundings", default=None)


@contextlib.contextmanager
def collect_roundings() -> Iterator[list]:
    """Collect every rounding applied to a z3 term inside (a narrowing convert's
    `round_<dtype>`, a `reduce_precision`), as (function name, argument, result).

    The roundings are uninterpreted functions; what the instance checks may assume of them
    is what every rounding to nearest is: monotone (`monotone_hypotheses`)."""
    found: list = []
    token = _ROUNDINGS.set(found)
    try:
        yield found
    finally:
        _ROUNDINGS.reset(token)


MAX_MONOTONE_PAIRS = 4096
"""The most pairs of one rounding's applications `monotone_hypotheses` relates."""


def monotone_hypotheses(roundings: list) -> list:
    """`a <= b -> f(a) <= f(b)` for every pair of applications of one rounding function `f`
    (true of rounding to nearest, and of XLA's reduce_precision with its flush to zero and
    overflow to infinity). Past `MAX_MONOTONE_PAIRS` pairs of one function nothing is stated
    (fewer facts: fewer proofs, never a wrong one)."""
    by_name: dict[str, list] = {}
    for name, argument, result in roundings:
        by_name.setdefault(name, []).append((argument, result))
    out = []
    for applications in by_name.values():
        unique = list({(a.get_id(), r.get_id()): (a, r) for a, r in applications}.values())
        if len(unique) * (len(unique) - 1) // 2 > MAX_MONOTONE_PAIRS:
            continue
        for (a, fa), (b, fb) in itertools.combinations(unique, 2):
            out.append(z3.Implies(a <= b, fa <= fb))
            out.append(z3.Implies(b <= a, fb <= fa))
    return out


def _note_rounding(name: str, argument: z3.ExprRef, result: z3.ExprRef) -> None:
    found = _ROUNDINGS.get()
    if found is not None:
        found.append((name, argument, result))


def is_z3(x: Element) -> bool:
    return isinstance(x, z3.ExprRef)


def is_bool(x: Element) -> bool:
    return isinstance(x, (bool, np.bool_, z3.BoolRef))


def exact(x: Element) -> Element:
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
    x = exact(x)
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


def num(x: Element) -> z3.ExprRef:
    """A numeric z3 term (booleans as 0/1)."""
    x = to_z3(x)
    if isinstance(x, z3.BoolRef):
        return z3.If(x, z3.IntVal(1), z3.IntVal(0))
    return x


def pynum(x: Element) -> Element:
    """A non-symbolic element as a Python number (booleans as 0/1)."""
    x = exact(x)
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
        return pynum(b) if not is_z3(b) else num(b)
    if _is_zero(b):
        return pynum(a) if not is_z3(a) else num(a)
    if is_z3(a) or is_z3(b):
        return num(a) + num(b)
    return pynum(a) + pynum(b)


def sub(a: Element, b: Element) -> Element:
    if _is_zero(b):
        return pynum(a) if not is_z3(a) else num(a)
    if is_z3(a) or is_z3(b):
        return num(a) - num(b)
    return pynum(a) - pynum(b)


def mul(a: Element, b: Element) -> Element:
    if _is_one(a):
        return pynum(b) if not is_z3(b) else num(b)
    if _is_one(b):
        return pynum(a) if not is_z3(a) else num(a)
    if is_z3(a) or is_z3(b):
        if _is_zero(a) or _is_zero(b):
            return 0
        return num(a) * num(b)
    return pynum(a) * pynum(b)


def neg(a: Element) -> Element:
    return -num(a) if is_z3(a) else -pynum(a)


def sum_list(items: Sequence[Element]) -> Element:
    """Exact sum, flat (`z3.Sum`) when symbolic."""
    concrete = [pynum(x) for x in items if not is_z3(x)]
    symbolic = [num(x) for x in items if is_z3(x)]
    total = sum(concrete, 0)
    if not symbolic:
        return total
    if total != 0:
        symbolic.append(to_z3(total))
    return symbolic[0] if len(symbolic) == 1 else _z3_sum(symbolic)


_ARITH_SORTS = (z3.Z3_INT_SORT, z3.Z3_REAL_SORT)


def _z3_sum(terms: list) -> z3.ExprRef:
    """`z3.Sum(terms)`: built directly when the terms are all Int or all Real in one context
    (the same term; `z3.Sum` spends most of a large instance's time coercing its terms'
    sorts one by one)."""
    ctx = terms[0].ctx
    ref = ctx.ref()
    if all(isinstance(t, z3.ArithRef) and t.ctx is ctx for t in terms):
        kinds = {z3.Z3_get_sort_kind(ref, z3.Z3_get_sort(ref, t.as_ast())) for t in terms}
        if len(kinds) == 1 and kinds.pop() in _ARITH_SORTS:
            args = (z3.Ast * len(terms))(*(t.as_ast() for t in terms))
            return z3.ArithRef(z3.Z3_mk_add(ref, len(terms), args), ctx)
    return z3.Sum(terms)


def as_int(x: Element) -> Element:
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
        return pynum(a) if not is_z3(a) else num(a)
    _note_divisor(b)
    if is_z3(a) or is_z3(b):
        za, zb = num(a), num(b)
        if integer and za.is_int() and zb.is_int():
            return _z3_int_div(za, zb)
        if za.is_int() and zb.is_int():
            za = z3.ToReal(za)
        return za / zb
    a, b = pynum(a), pynum(b)
    if integer:
        a, b = as_int(a), as_int(b)
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
        za, zb = num(a), num(b)
        if za.is_int() and zb.is_int():
            return za - zb * _z3_int_div(za, zb)
        return za - zb * z3.ToReal(_z3_trunc(za / zb))
    a, b = pynum(a), pynum(b)
    if integer:
        a, b = as_int(a), as_int(b)
    if isinstance(a, int) and isinstance(b, int):
        return a if b == 0 else a - b * _c_div(a, b)
    if isinstance(a, float) or isinstance(b, float):
        return math.fmod(a, b) if b != 0 else math.nan
    if b == 0:
        return math.nan
    quotient = Fraction(a) / b
    return a - b * int(quotient)


class _FoldMemo:
    """What `_masked_parts` learned about the nodes of the terms a max or min fold builds
    (`_folding`): each step's operand holds the earlier steps' terms, so without it a fold
    over k elements costs k^2. Keyed by Z3 node id, each node kept alive with its entry (an
    id is reused only once its node is gone)."""

    def __init__(self) -> None:
        self.leaf: dict = {}
        self.parts: dict = {}
        self.nodes: list = []


_FOLD_MEMO: contextvars.ContextVar[_FoldMemo | None] = contextvars.ContextVar(
    "fold_memo", default=None)


@contextlib.contextmanager
def _folding() -> Iterator[None]:
    token = _FOLD_MEMO.set(_FoldMemo())
    try:
        yield
    finally:
        _FOLD_MEMO.reset(token)


def _masked_parts(x: Element, inf: z3.ExprRef) -> tuple | None:
    """(x is not `inf`, x's value where it is not) for a z3 term of nested `If`s with `inf`
    among its leaves (a value masked to -inf, as in a pmax of `where(mask, rows, -inf)`);
    None when `x` is no such term or a leaf mentions an infinity in arithmetic. Linear in the
    term's DAG (memoized by node; within `_folding`, across the fold's steps)."""
    shared = _FOLD_MEMO.get()
    if not isinstance(x, z3.ArithRef) or not z3.is_app_of(x, z3.Z3_OP_ITE) or \
            not _has_leaf(x, inf, {} if shared is None else shared.leaf, shared):
        return None
    memo: dict = {} if shared is None else shared.parts
    seen: dict[int, bool] = {}
    sign = inf.get_id()

    def parts(e: z3.ExprRef) -> tuple | None:
        key = (sign, e.get_id())
        if key not in memo:
            if z3.eq(e, inf):
                memo[key] = (z3.BoolVal(False), z3.RealVal(0))
            elif z3.is_app_of(e, z3.Z3_OP_ITE):
                then, other = parts(e.arg(1)), parts(e.arg(2))
                memo[key] = None if then is None or other is None else (
                    z3.If(e.arg(0), then[0], other[0]), z3.If(e.arg(0), then[1], other[1]))
            else:  # (a leaf remembered across the fold is judged on its own)
                memo[key] = None if _mentions_infinity(e, seen if shared is None else {}) \
                    else (z3.BoolVal(True), e)
            if shared is not None:
                shared.nodes.append(e)
        return memo[key]

    return parts(x)


def _has_leaf(e: z3.ExprRef, leaf: z3.ExprRef, memo: dict, shared: _FoldMemo | None = None
              ) -> bool:
    """`leaf` is a leaf of the `If` tree `e` (its branches, not its conditions)."""
    key = (leaf.get_id(), e.get_id())
    if key not in memo:
        memo[key] = z3.eq(e, leaf) or z3.is_app_of(e, z3.Z3_OP_ITE) and (
            _has_leaf(e.arg(1), leaf, memo, shared) or _has_leaf(e.arg(2), leaf, memo, shared))
        if shared is not None:
            shared.nodes.append(e)
    return memo[key]


def _mentions_infinity(e: z3.ExprRef, seen: dict[int, bool] | None = None) -> bool:
    """`e` has an infinity constant anywhere in it (`seen`: a memo shared by the caller)."""
    seen = {} if seen is None else seen
    stack = [e]
    while stack:
        node = stack.pop()
        key = node.get_id()
        if key in seen:
            if seen[key]:
                return True
            continue
        seen[key] = False
        if z3.eq(node, _POS_INF) or z3.eq(node, _NEG_INF):
            seen[key] = True
            return True
        stack.extend(node.children())
    return False


def _unmasked(x: Element) -> tuple | None:
    """(True, x) for a finite value that is not masked (None for anything else)."""
    z = to_z3(x)
    if not isinstance(z, z3.ArithRef) or _mentions_infinity(z):
        return None
    return z3.BoolVal(True), num(z)


def _extreme_of_masked(a: Element, b: Element, inf: z3.ExprRef, keep_a) -> Element | None:
    """max (min) of two values of which one or both are masked to -inf (+inf), `inf`:
    the infinities are named constants Z3 does not order, so the masks are kept apart from
    the finite values (`max(-inf, y) = y`); the encoding grows linearly with the operands."""
    pa, pb = _masked_parts(a, inf), _masked_parts(b, inf)
    if pa is None and pb is None:
        return None
    pa, pb = pa or _unmasked(a), pb or _unmasked(b)
    if pa is None or pb is None:
        return None
    (fa, va), (fb, vb) = pa, pb
    both = z3.If(keep_a(va, vb), va, vb)
    return z3.If(z3.And(fa, fb), both, z3.If(fa, va, z3.If(fb, vb, inf)))


def maximum(a: Element, b: Element) -> Element:
    if _is_inf(a, -1) or _is_inf(b, 1):
        return b
    if _is_inf(b, -1) or _is_inf(a, 1):
        return a
    masked = _extreme_of_masked(a, b, _NEG_INF, lambda x, y: x >= y)
    if masked is not None:
        return masked
    if is_z3(a) or is_z3(b):
        if isinstance(to_z3(a), z3.BoolRef):
            return z3.Or(to_z3(a), to_z3(b))
        za, zb = num(a), num(b)
        return z3.If(za >= zb, za, zb)
    return max(a, b)


def minimum(a: Element, b: Element) -> Element:
    if _is_inf(a, 1) or _is_inf(b, -1):
        return b
    if _is_inf(b, 1) or _is_inf(a, -1):
        return a
    masked = _extreme_of_masked(a, b, _POS_INF, lambda x, y: x <= y)
    if masked is not None:
        return masked
    if is_z3(a) or is_z3(b):
        if isinstance(to_z3(a), z3.BoolRef):
            return z3.And(to_z3(a), to_z3(b))
        za, zb = num(a), num(b)
        return z3.If(za <= zb, za, zb)
    return min(a, b)


def select(pred: Element, a: Element, b: Element) -> Element:
    pred = exact(pred)
    if not is_z3(pred):
        return a if pred else b
    pred = to_z3(pred)
    if not isinstance(pred, z3.BoolRef):
        pred = pred != 0
    za, zb = to_z3(a), to_z3(b)
    if isinstance(za, z3.BoolRef) != isinstance(zb, z3.BoolRef):
        za, zb = num(za), num(zb)
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
        za, zb = num(za), num(zb)
        if total:
            return z3.If(z3.And(za == 0, zb == 0), z3.Bool(f"totalorder_{direction}_of_zeros"),
                         op(za, zb))
        return op(za, zb)
    if total and isinstance(a, float) and isinstance(b, float):
        return bool(op(_total_key(a), _total_key(b)))
    return bool(op(pynum(a), pynum(b)))


def compared_value(a: Element, dtype: str) -> Element:
    """The value a float compare of `dtype` reads for the operand `a`: `a` rounded to `dtype`.
    The semantics computes float arithmetic exactly (sums regrouped: liberty 1), but a
    comparison turns a rounding into a different boolean: `x + 1.0 > x` is true of the reals
    and false in f32 for |x| >= 2^24. So an operand that float arithmetic computed is
    compared rounded: exactly on numbers, as `round_<dtype>` (uninterpreted, monotone:
    `collect_roundings`) on z3 terms. Values no arithmetic computed (inputs, a function's
    result, a pick among such values) are values of the dtype, compared as they are; equal
    sums stay equal once rounded, so operands computed alike (regrouped) still compare
    alike."""
    if not is_float_dtype(dtype) or dtype not in precision.FLOAT_FORMATS:
        return a
    if not is_z3(a):
        value = pynum(a)
        if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
            return a
        if type(value) is int and abs(value) <= 1 << precision.FLOAT_FORMATS[dtype][0]:
            return a  # an integer the dtype holds (a position, a count): no rounding to do
        return _rounded_number(value, dtype)
    z = num(a)
    rounded = _quotients_rounded(z, dtype)
    if rounded is not z:
        a = z = rounded
    if z.is_int() or _held_exactly(z, dtype):
        return a
    return _unknown_rounding(z, dtype)


def _quotients_rounded(z: z3.ArithRef, dtype: str) -> z3.ArithRef:
    """`z` with every quotient by a divisor that is no numeral rounded (`quotient_<dtype>`
    of the exact quotient: uninterpreted, monotone): a float division rounds its quotient,
    so `x / d` and `x * (1 / d)` (the reciprocal rounded first) and `3 / d` and `3 * (1 / d)`
    are different numbers, which exact reals equate (a compare of them was proven and
    differs in float32). The rounding is a function of the exact quotient, so regrouped sums
    inside a quotient still meet; a numeral divisor is the normal form's scale
    (`terms.make_div`). Its own function, not the compared value's `round_<dtype>` (the
    quotient may be of another dtype than the compare, a convert between them): the exact
    quotient is one of its interpretations, so this proves nothing the exact reals did
    not. `z` itself where it holds no such quotient."""
    quotients = [node for node in _distinct_nodes(z) if z3.is_app(node)
                 and node.decl().kind() == z3.Z3_OP_DIV
                 and not z3.is_rational_value(node.arg(1)) and not z3.is_int_value(node.arg(1))]
    if not quotients:
        return z
    pairs: list[tuple[z3.ExprRef, z3.ExprRef]] = []
    name = f"quotient_{dtype}"
    heights = _heights(z)
    for node in sorted(quotients, key=lambda q: heights[q.get_id()]):
        inner = z3.substitute(node, *pairs) if pairs else node
        rounded = uninterpreted(name)(inner)
        _note_rounding(name, inner, rounded)
        pairs.append((node, rounded))
    return z3.substitute(z, *pairs)


def _heights(z: z3.ExprRef) -> dict[int, int]:
    """The height of each node of `z` by id (leaves 1), every node's children done before it
    (a node shared by two parents counts below both), so inner quotients are rounded before
    the ones around them."""
    heights: dict[int, int] = {}
    stack: list[tuple[z3.ExprRef, bool]] = [(z, False)]
    while stack:
        node, children_done = stack.pop()
        key = node.get_id()
        if key in heights:
            continue
        if children_done:
            heights[key] = 1 + max((heights[c.get_id()] for c in node.children()), default=0)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children() if c.get_id() not in heights)
    return heights


def _rounded_number(value, dtype: str) -> Element:
    """A number rounded to float `dtype`: exactly, except a subnormal result, which XLA may
    flush to zero or keep (`precision.subnormal`): that is `round_<dtype>` of it, an unknown
    that only monotonicity relates to other values."""
    rounded = precision.round_to(value, dtype)
    if not precision.subnormal(rounded, dtype):
        return rounded
    return _unknown_rounding(z3.RealVal(str(Fraction(value))), dtype)


def _unknown_rounding(argument: z3.ArithRef, dtype: str) -> z3.ArithRef:
    """`round_<dtype>(argument)`, uninterpreted, noted for the monotone hypotheses
    (`collect_roundings`)."""
    result = uninterpreted(f"round_{dtype}")(argument)
    _note_rounding(f"round_{dtype}", argument, result)
    return result


def compared_values(a: Element, b: Element, dtypes: Sequence[str]) -> tuple[Element, Element]:
    """`compared_value` of both operands of a compare. Where one is rounded and the other is
    a value of the dtype, that value is noted as rounding to itself, so that monotonicity
    (`monotone_hypotheses`) relates the two: `x + 1.0 >= x` holds in f32 (round(x + 1) >=
    round(x) = x), `x + 1.0 > x` does not."""
    ra, rb = compared_value(a, dtypes[0]), compared_value(b, dtypes[-1])
    wrapped_a, wrapped_b = (is_z3(r) and r is not x for r, x in ((ra, a), (rb, b)))
    if wrapped_a != wrapped_b:
        rounded, fixed = (ra, num(to_z3(rb))) if wrapped_a else (rb, num(to_z3(ra)))
        if not fixed.is_int():
            _note_rounding(rounded.decl().name(), fixed, fixed)
    return ra, rb


_PICKS = frozenset({z3.Z3_OP_ITE, z3.Z3_OP_UMINUS, z3.Z3_OP_TO_REAL})
"""z3 operations whose result is one of their numeric operands' values, up to sign: a value
of the dtype when those are."""


def _held_exactly(z: z3.ArithRef, dtype: str) -> bool:
    """Whether `z` is a value of `dtype` without rounding: a variable (an input, an unknown
    constant), a numeral of the dtype, an uninterpreted function's result (a transcendental
    function or a rounding: the value the op computes), or a pick among such values (select,
    max, min, negate, `-1 * v`)."""
    for top in _distinct_nodes(z, _picked):
        if z3.is_rational_value(top) or z3.is_int_value(top):
            value = Fraction(top.numerator_as_long(), top.denominator_as_long()) \
                if z3.is_rational_value(top) else Fraction(top.as_long())
            if precision.round_to(value, dtype) != value or precision.subnormal(value, dtype):
                return False
        elif z3.is_app(top) and top.num_args() and \
                top.decl().kind() not in _PICKS | {z3.Z3_OP_UNINTERPRETED} and \
                not _small_integer(top, dtype) and not _negation(top):
            return False
    return True


_INTEGER_ARITHMETIC = {z3.Z3_OP_ADD: sum, z3.Z3_OP_SUB: sum, z3.Z3_OP_MUL: math.prod}
"""Integer arithmetic whose result is bounded by its operands' bounds: the sum of them (add,
subtract) or their product (multiply)."""


def _small_integer(node: z3.ExprRef, dtype: str) -> bool:
    """Whether `node` is an integer that `dtype` holds exactly for every value of its
    variables: integer arithmetic over integer numerals and ifs among them (`3 * indicator`,
    a count of booleans), bounded by 2^p for p significand bits."""
    bound = _integer_bound(node, 2 ** precision.FLOAT_FORMATS[dtype][0])
    return bound is not None


def _integer_bound(node: z3.ExprRef, limit: int) -> int | None:
    """A bound on |node| when `node` is integer-valued and that bound is at most `limit`."""
    if z3.is_int_value(node) or (z3.is_rational_value(node)
                                 and node.denominator_as_long() == 1):
        value = abs(node.numerator_as_long() if z3.is_rational_value(node) else node.as_long())
        return value if value <= limit else None
    if not z3.is_app(node) or not node.num_args():
        return None
    kind = node.decl().kind()
    children = node.children()
    if kind == z3.Z3_OP_ITE:
        children = children[1:]
    elif kind in (z3.Z3_OP_UMINUS, z3.Z3_OP_TO_REAL):
        pass
    elif kind not in _INTEGER_ARITHMETIC:
        return None
    bounds = []
    for child in children:
        bound = _integer_bound(child, limit)
        if bound is None:
            return None
        bounds.append(bound)
    total = _INTEGER_ARITHMETIC[kind](bounds) if kind in _INTEGER_ARITHMETIC else max(bounds)
    return total if total <= limit else None


def _negation(node: z3.ExprRef) -> bool:
    """`node` is `-1 * v` (a `lin` scaled by -1): a negation, exact."""
    children = node.children()
    return node.decl().kind() == z3.Z3_OP_MUL and len(children) == 2 and any(
        z3.is_rational_value(c) and c.as_fraction() == -1 for c in children)


def _picked(node: z3.ExprRef) -> list[z3.ExprRef]:
    """The operands whose values `node` may take (an if's branches, a negation's operand,
    `-1 * v`'s); none for an uninterpreted function's result or an exact integer
    (`_small_integer`)."""
    kind = node.decl().kind()
    if kind == z3.Z3_OP_UNINTERPRETED:
        return []
    if _negation(node):
        return node.children()
    if kind not in _PICKS:
        return []
    children = node.children()
    return children[1:] if kind == z3.Z3_OP_ITE else children


def _distinct_nodes(expr: z3.ExprRef, children=lambda node: node.children()
                    ) -> Iterator[z3.ExprRef]:
    """`expr` and the nodes `children` reaches from it, each once."""
    stack, seen = [expr], set()
    while stack:
        top = stack.pop()
        key = top.get_id()
        if key in seen:
            continue
        seen.add(key)
        yield top
        stack.extend(children(top))


def _total_key(x: float) -> int:
    """The position of a float in IEEE-754 totalOrder (the bits, sign-magnitude to two's
    complement): -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN."""
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits if bits >= 0 else -(bits & ((1 << 63) - 1)) - 1


def equal(a: Element, b: Element) -> Element:
    """Equality used by claims: booleans compare as 0/1 against numbers."""
    a, b = exact(a), exact(b)
    if not is_z3(a) and not is_z3(b):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True  # the same fill value on both sides (NaN is data here, not math)
        return pynum(a) == pynum(b)
    za, zb = to_z3(a), to_z3(b)
    if isinstance(za, z3.BoolRef) != isinstance(zb, z3.BoolRef):
        za, zb = num(za), num(zb)
    return _eq(za, zb)


def _eq(a: z3.ExprRef, b: z3.ExprRef) -> z3.BoolRef | bool:
    """`a == b`, built directly for two terms of one sort (`==` first checks and merges
    their sorts: most of a large claim's cost); True for one term (z3 shares equal terms:
    a claim whose two sides were built alike holds for every value, no solver needed)."""
    ctx = a.ctx
    if b.ctx is ctx:
        ref, x, y = ctx.ref(), a.as_ast(), b.as_ast()
        if z3.Z3_is_eq_ast(ref, x, y):
            return True
        if z3.Z3_is_eq_sort(ref, z3.Z3_get_sort(ref, x), z3.Z3_get_sort(ref, y)):
            return z3.BoolRef(z3.Z3_mk_eq(ref, x, y), ctx)
    return a == b


def logic(name: str) -> Callable[[Element, Element], Element]:
    """The bitwise `name` ("and", "or", "xor") of two elements (z3 only on booleans)."""
    z3_fn = {"and": z3.And, "or": z3.Or, "xor": z3.Xor}[name]
    py_fn = {"and": lambda a, b: a & b, "or": lambda a, b: a | b,
             "xor": lambda a, b: a ^ b}[name]

    def fn(a: Element, b: Element) -> Element:
        a, b = exact(a), exact(b)
        if is_z3(a) or is_z3(b):
            za, zb = to_z3(a), to_z3(b)
            if not (isinstance(za, z3.BoolRef) and isinstance(zb, z3.BoolRef)):
                raise SemanticsError(f"bitwise {name} of symbolic integers is not supported")
            return z3_fn(za, zb)
        return py_fn(a, b)

    return fn


def logical_not(a: Element, dtype: str) -> Element:
    """Logical not of a boolean; bitwise not of an integer of `dtype`, which in two's
    complement (or unsigned) is `least + greatest - a` (-1 - a signed, MAX - a unsigned)."""
    a = exact(a)
    if is_z3(a):
        za = to_z3(a)
        if isinstance(za, z3.BoolRef):
            return z3.Not(za)
    elif isinstance(a, bool) or is_bool_dtype(dtype):
        return not a
    limits = int_limits(dtype)
    if limits is None:
        raise SemanticsError(f"bitwise not of a {dtype} value")
    if is_z3(a):
        return (limits[0] + limits[1]) - num(a)
    return limits[0] + limits[1] - int(pynum(a))


def absolute(a: Element) -> Element:
    if is_z3(a):
        za = num(a)
        return z3.If(za >= 0, za, -za)
    return abs(pynum(a))


def sign(a: Element) -> Element:
    if is_z3(a):
        za = num(a)
        one = z3.IntVal(1) if za.is_int() else z3.RealVal(1)
        zero = z3.IntVal(0) if za.is_int() else z3.RealVal(0)
        return z3.If(za > 0, one, z3.If(za < 0, -one, zero))
    a = pynum(a)
    return (a > 0) - (a < 0)


def floor(a: Element) -> Element:
    if is_z3(a):
        za = num(a)
        return z3.ToReal(z3.ToInt(za)) if za.is_real() else za
    a = pynum(a)
    return a if isinstance(a, float) and not math.isfinite(a) else math.floor(a)


def ceil(a: Element) -> Element:
    return neg(floor(neg(a)))


def round_afz(a: Element) -> Element:
    """Round half away from zero."""
    return mul(sign(a), floor(add(absolute(a), Fraction(1, 2))))


def round_even(a: Element) -> Element:
    """Round half to even."""
    if is_z3(a):
        za = num(a)
        if za.is_int():
            return za
        shifted = za + z3.RealVal(1) / 2
        low = z3.ToInt(shifted)
        tie = z3.ToReal(low) == shifted
        return z3.ToReal(z3.If(z3.And(tie, low % 2 == 1), low - 1, low))
    a = pynum(a)
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
    args = tuple(pynum(a) if not is_z3(a) else a for a in args)
    if any(is_z3(a) for a in args):
        real = []
        for a in args:
            z = num(a)
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
    b = pynum(b) if not is_z3(b) else b
    if not is_z3(b) and not isinstance(b, float) and Fraction(b).denominator == 1:
        n = int(b)
        if not is_z3(a) and not isinstance(pynum(a), float):
            base = Fraction(pynum(a))
            if base == 0 and n < 0:
                return math.inf
            result = base ** n
            return int(result) if isinstance(pynum(a), int) and n >= 0 else result
        if n == 0:
            return 1
        result = _fold(mul, [a] * abs(n))
        return result if n > 0 else div(1, result)
    return transcendental("power", a, b)


# ----- integer width ----------------------------------------------------------------------------

def int_limits(dtype: str) -> tuple[int, int] | None:
    """[min, max] of an integer dtype (two's complement, or unsigned), None otherwise."""
    found = ranges.int_limits(dtype)
    return None if found is None else (int(found[0]), int(found[1]))


def wrap_shift(x: Element, offset: Element, dtype: str) -> Element:
    """`x + offset` in integer `dtype` for `x` a value of the dtype and a concrete `offset`:
    only one side can overflow, so one exact correction (z3 decides it far faster than a
    modulo or a two-sided chain)."""
    limits = int_limits(dtype)
    total = add(x, offset)
    if limits is None or not is_z3(total) or is_z3(offset) or not num(total).is_int():
        return wrap_int(total, dtype)
    lo, hi = limits
    c = int(pynum(offset))
    span = hi - lo + 1
    if not lo <= c <= hi:
        return wrap_shift(x, (c - lo) % span + lo, dtype)
    total = num(total)
    if c >= 0:
        return z3.If(total > hi, total - span, total)
    return z3.If(total < lo, total + span, total)


_WRAPPED: dict[int, tuple[z3.ArithRef, z3.ArithRef, int, int]] = {}
"""Symbolic wrapped integers by z3 id: (the wrapped expression, its integer preimage, lo,
span). The entry holds the expression, so its id is not reused while it is listed."""

MAX_WRAPPED = 1 << 17
"""Entries kept (oldest dropped first): a dropped entry only loses the simplification."""

_RING_OPS = frozenset({z3.Z3_OP_ADD, z3.Z3_OP_SUB, z3.Z3_OP_MUL, z3.Z3_OP_UMINUS})


_WRAP_OF: dict[tuple[int, int, int], tuple[z3.ArithRef, z3.ArithRef, int | None]] = {}
"""The wrapped expression made for an integer expression (by z3 id; simplified), lo and span:
(the expression, its wrap, the periods that wrap is exact for; None: the modulo, exact for
every integer). A later wrap of the same expression returns it when it is exact for the
periods asked, so spellings that reach the same integer meet in one term. The entry holds
both expressions, so neither id is reused while it is listed."""


def _known_wrap(x: z3.ArithRef, lo: int, span: int, periods: int | None) -> z3.ArithRef | None:
    known = _WRAP_OF.get((x.get_id(), lo, span))
    if known is None or not known[0].eq(x):
        return None
    exact_for = known[2]
    if exact_for is None or (periods is not None and periods <= exact_for):
        return known[1]
    return None


def _remember_wrap(wrapped: z3.ArithRef, raw: z3.ArithRef, lo: int, span: int,
                   periods: int | None) -> z3.ArithRef:
    for table in (_WRAPPED, _WRAP_OF):
        if len(table) >= MAX_WRAPPED:
            del table[next(iter(table))]
    _WRAPPED[wrapped.get_id()] = (wrapped, raw, lo, span)
    _WRAP_OF[(raw.get_id(), lo, span)] = (raw, wrapped, periods)
    return wrapped


def _ring_preimage(x: z3.ArithRef, lo: int, span: int,
                   memo: dict[int, z3.ArithRef] | None = None) -> z3.ArithRef:
    """`x` with every operand of its sums, differences and products that is a value wrapped
    modulo the same `span` replaced by the integer it wrapped; `x` itself when none is.
    Reduction modulo `span` is a ring homomorphism of the integers, so wrapping the result
    gives the same value either way, and two spellings that wrap at different steps (`5 *
    wrap(9 * a)` and `wrap(45 * a)`) meet in one expression instead of two modulos z3 must
    relate. Only integer-sorted +, -, * are looked through (never a division, a comparison or
    a wrap to another width)."""
    if not z3.is_app(x) or not x.is_int():
        return x
    found = _WRAPPED.get(x.get_id())
    if found is not None and found[2] == lo and found[3] == span:
        return found[1]
    if x.decl().kind() not in _RING_OPS:
        return x
    memo = {} if memo is None else memo
    if x.get_id() in memo:
        return memo[x.get_id()]
    children = x.children()
    raws = [_ring_preimage(child, lo, span, memo) for child in children]
    out = x if all(r is c for r, c in zip(raws, children)) else x.decl()(*raws)
    memo[x.get_id()] = out
    return out


MAX_PERIODS = 4
"""The most ranges of its dtype a value may span for `wrap_int` to correct it by If-chains
(beyond: z3's modulo)."""


def range_periods(dtype: str, low: int, high: int) -> int | None:
    """How many ranges of integer `dtype` a value known to lie in [low, high] can leave (the
    `periods` of `wrap_int`), or None: unknown dtype, or more than `MAX_PERIODS`."""
    limits = int_limits(dtype)
    if limits is None:
        return None
    lo, hi = limits
    span = hi - lo + 1
    periods = max(-((low - lo) // span), -((hi - high) // span), 0)
    return periods if periods <= MAX_PERIODS else None


def sum_periods(dtype: str, count: int) -> int | None:
    """`range_periods` of a sum of `count` values of integer `dtype`."""
    limits = int_limits(dtype)
    if limits is None:
        return None
    return range_periods(dtype, count * limits[0], count * limits[1])


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
        raw = _ring_preimage(x, lo, span)
        if raw is not x:
            x, periods = raw, None  # the preimage's range is not the operands' range
        x = z3.simplify(x)
        if z3.is_int_value(x):
            return z3.IntVal((x.as_long() - lo) % span + lo)
        known = _known_wrap(x, lo, span, periods)
        if known is not None:
            return known
        if periods is None:
            return _remember_wrap(z3.If(z3.And(x >= lo, x <= hi), x, (x - lo) % span + lo),
                                  x, lo, span, None)
        out = x
        for q in range(1, periods + 1):
            out = z3.If(x > hi + (q - 1) * span, x - q * span, out) if q > 1 else \
                z3.If(x > hi, x - span, out)
        wrapped = out
        for q in range(1, periods + 1):
            wrapped = z3.If(x < lo - (q - 1) * span, x + q * span, wrapped) if q > 1 else \
                z3.If(x < lo, x + span, wrapped)
        return _remember_wrap(wrapped, x, lo, span, periods)
    if isinstance(x, Fraction) and x.denominator == 1:
        x = int(x)
    if isinstance(x, int):
        return (x - lo) % span + lo
    return x


# ----- convert --------------------------------------------------------------------------------

def convert(a: Element, src: str, dst: str) -> Element:
    """Exact conversion: bool <-> 0/1, float -> int truncates toward zero and saturates at
    the integer type's limits (XLA's convert: f16(-5) -> ui8 is 0, 1e10 -> i32 is INT_MAX;
    never the wrap-around of an integer convert), everything else is identity (an integer
    result of another integer wraps afterwards, `wrap_int`)."""
    a = exact(a)
    if is_bool_dtype(dst):
        if is_bool(a):
            return a
        return (num(a) != 0) if is_z3(a) else bool(a != 0)
    if is_bool(a):
        if is_z3(a):
            one = z3.IntVal(1) if is_int_dtype(dst) else z3.RealVal(1)
            zero = z3.IntVal(0) if is_int_dtype(dst) else z3.RealVal(0)
            return z3.If(a, one, zero)
        return int(a)
    if is_int_dtype(dst):
        if is_float_dtype(src):
            return _saturated(a, dst)
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


def _saturated(a: Element, dtype: str) -> Element:
    """A float truncated toward zero and clamped to integer `dtype`'s range (a float -> int
    convert, as XLA computes it)."""
    limits = ranges.int_limits(dtype)
    if is_z3(a):
        t = _z3_trunc(num(a))
        if limits is None:
            return t
        lo, hi = (z3.IntVal(int(v)) for v in limits)
        return z3.If(t < lo, lo, z3.If(t > hi, hi, t))
    value = pynum(a)
    if isinstance(value, float) and math.isnan(value):
        return 0
    if isinstance(value, float) and math.isinf(value):
        return value if limits is None else int(limits[0] if value < 0 else limits[1])
    return ranges.saturate_integer(int(value), dtype)


def round_to(a: Element, dtype: str) -> Element:
    """`a` rounded to float `dtype` (a narrowing convert): exactly on numbers (a subnormal
    result: unknown, `_rounded_number`), an uninterpreted function `round_<dtype>` on z3
    terms, so no proof takes it for the identity."""
    if is_z3(a):
        z = num(a)
        return _unknown_rounding(z3.ToReal(z) if z.is_int() else z, dtype)
    value = pynum(a)
    if isinstance(value, float) and not math.isfinite(value):
        return value
    rounded = _rounded_number(value, dtype)
    return rounded if isinstance(rounded, float) or is_z3(rounded) else (
        float(rounded) if isinstance(value, float) else rounded)


def reduce_precision(a: Element, dtype: str, exponent_bits: int, mantissa_bits: int
                     ) -> Element:
    """`reduce_precision` of an element of float `dtype` to (exponent_bits, mantissa_bits):
    the identity when the format keeps every value of the dtype
    (`precision.reduce_precision_is_identity`), else a rounding: exact on numbers
    (`precision.reduce_precision`, as XLA computes it), the uninterpreted function
    `reduce_precision_<dtype>_e<E>m<M>` on z3 terms (never the identity, and another function
    than a convert's `round_<dtype>`: no subnormals, its own exponent range)."""
    if precision.reduce_precision_is_identity(dtype, exponent_bits, mantissa_bits):
        return a
    if is_z3(a):
        z = num(a)
        name = f"reduce_precision_{dtype}_e{exponent_bits}m{mantissa_bits}"
        argument = z3.ToReal(z) if z.is_int() else z
        result = uninterpreted(name)(argument)
        _note_rounding(name, argument, result)
        return result
    value = pynum(a)
    if isinstance(value, float) and not math.isfinite(value):
        return value
    try:
        rounded = precision.reduce_precision(value, dtype, exponent_bits, mantissa_bits)
    except ValueError as err:
        raise SemanticsError(str(err)) from None
    return rounded if isinstance(rounded, float) else (
        float(rounded) if isinstance(value, float) else rounded)


def _may_mention_infinity(expr: z3.ExprRef, budget: int = 2000) -> bool:
    """`expr` (a z3 term) may be one of the infinity constants: it mentions `+oo` or `-oo`
    (or is too large to tell within `budget` nodes)."""
    for count, top in enumerate(_distinct_nodes(expr), 1):
        if count > budget or z3.eq(top, _NEG_INF) or z3.eq(top, _POS_INF):
            return True
    return False


def arg_combine(kind: str, v: Element, i: Element, w: Element, j: Element
                ) -> tuple[Element, Element]:
    """jax's argmax (`kind` "argmax") / argmin comparator on the accumulator (v, i) and a new
    pair (w, j), exactly as its region computes it: `p = v > w or v != v` (`<` for argmin;
    NaN wins), the value `select(p, v, w)`, the index `select(p or (v == w and i < j), i, j)`
    (on ties the first index). On numbers the pair larger in (value, -index) order (NaN above
    all), so a reduction gives the same pair in any order; z3 reals hold no NaN."""
    if _is_inf(v, -1 if kind == "argmax" else 1) and is_z3(w) and \
            not _may_mention_infinity(to_z3(w)):
        # the init (-inf) against a finite real: the new pair, as the comparator picks it (on
        # z3 the infinities are free constants, so the comparison would stay undecided)
        return w, j
    first = compare(v, w, "GT" if kind == "argmax" else "LT")
    picked = logic("or")(first, compare(v, v, "NE"))
    tie = logic("and")(compare(v, w, "EQ"), compare(i, j, "LT"))
    return select(picked, v, w), select(logic("or")(picked, tie), i, j)


# ----- reductions ---------------------------------------------------------------------------------

_KIND_ALIASES = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "mul"}

_BOOLEAN_KINDS = {"add": "or", "sum": "or", "max": "or", "maximum": "or", "or": "or",
                  "mul": "and", "multiply": "and", "min": "and", "minimum": "and",
                  "and": "and", "xor": "xor"}
"""A reduction of booleans (i1) as StableHLO defines it: add is logical or, multiply logical
and, max and min are or and and in the order false < true (`terms.BOOLEAN_MEANING` for the
elementwise ops)."""


def dtype_kind(kind: str, dtype: str) -> str:
    """The reduction `kind` (a reducer's name) computes on elements of `dtype`: on booleans
    its logical meaning (`_BOOLEAN_KINDS`), else `kind` itself."""
    if not is_bool_dtype(dtype):
        return kind
    if kind not in _BOOLEAN_KINDS:
        raise SemanticsError(f"a '{kind}' reduction of booleans is not defined")
    return _BOOLEAN_KINDS[kind]


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
    fns = {"max": maximum, "min": minimum, "mul": mul, "and": logic("and"),
           "or": logic("or")}
    if kind not in fns:
        raise SemanticsError(f"unsupported reducer {kind!r}")
    if kind in ("max", "min"):
        items = sorted(items, key=_order_key)
        with _folding():
            return _fold(fns[kind], items)
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
