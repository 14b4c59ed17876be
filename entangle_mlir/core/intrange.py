"""Integer values of terms in the arithmetic of their dtype: `value_range`.

An integer op on a term of dtype iN/uiN computes modulo 2^N (two's complement). A linear form
over integers (`terms.make_lin`) is therefore exact modulo 2^N: fine for equality of wrapped
values, but an ORDER fact about it (a compare, an interval, a clamp) holds only where no
element can wrap. `value_range` proves that: the smallest interval every element of a term
lies in, from its leaves (an argument takes any value of its dtype, an iota its positions),
and never a mathematical range that the dtype's arithmetic could leave. An integer value
converted to a float type is exact only while every value it takes is representable there
(`ranges.fits`, with the dtypes' widths and limits).
"""

from __future__ import annotations

from fractions import Fraction

from entangle_mlir.core.ranges import INT_BITS, Range, fits, int_limits
from entangle_mlir.core.terms import Term, splat_value


def value_range(term: Term, assumed: dict[int, Range] | None = None,
                memo: dict[int, Range | None] | None = None) -> Range | None:
    """[lo, hi] holding every element of an integer-valued term, in the arithmetic its dtype
    computes (None when unknown). `assumed` maps term serials to ranges taken as given (the
    valid-index assumption)."""
    memo = {} if memo is None else memo
    if term.serial in memo:
        return memo[term.serial]
    memo[term.serial] = None  # cycles cannot occur; this also bounds recursion on repeats
    found = _range(term, assumed or {}, memo)
    memo[term.serial] = found
    return found


def _range(term: Term, assumed: dict[int, Range], memo) -> Range | None:
    if term.serial in assumed:
        return assumed[term.serial]
    exact = _exact_range(term, assumed, memo)
    limits = int_limits(term.dtype)
    if limits is not None:
        return exact if exact is not None and fits(exact[0], exact[1], term.dtype) else limits
    if exact is None or not fits(exact[0], exact[1], term.dtype):
        return None  # a float or boolean value: only an exactly representable range
    return exact


def _exact_range(term: Term, assumed: dict[int, Range], memo) -> Range | None:
    """The range in exact integer arithmetic (the caller checks that the dtype holds it)."""
    op = term.op
    value = splat_value(term)
    if op == "splat":
        if isinstance(value, Fraction) and value.denominator == 1:
            return value, value
        return None
    if op == "iota":
        return Fraction(0), Fraction(max(term.shape[term.attrs[0]] - 1, 0))
    if op == "arg":
        return int_limits(term.dtype)
    if op in ("reshape", "broadcast", "transpose", "slice") and term.args:
        return value_range(term.args[0], assumed, memo)
    if op == "stablehlo.convert":
        inner = value_range(term.args[0], assumed, memo)
        if inner is None or term.args[0].dtype not in INT_BITS and term.args[0].dtype != "i1":
            return None
        return inner if fits(inner[0], inner[1], term.dtype) else None
    if op == "lin":
        constant, coefs = term.attrs
        if not isinstance(constant, Fraction) or constant.denominator != 1:
            return None
        lo = hi = constant
        float_sum = abs(constant)
        for k, arg in zip(coefs, term.args):
            if not isinstance(k, Fraction) or k.denominator != 1:
                return None
            inner = value_range(arg, assumed, memo)
            if inner is None:
                return None
            ends = (k * inner[0], k * inner[1])
            lo, hi = lo + min(ends), hi + max(ends)
            float_sum += max(abs(e) for e in ends)
        if int_limits(term.dtype) is None and not fits(-float_sum, float_sum, term.dtype):
            return None  # a float sum in some order: every partial sum must be exact
        return lo, hi
    if op in ("stablehlo.maximum", "stablehlo.minimum"):
        parts = [value_range(a, assumed, memo) for a in term.args]
        if any(p is None for p in parts):
            return None
        pick = max if op == "stablehlo.maximum" else min
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    if op == "stablehlo.clamp":
        lo, x, hi = (value_range(a, assumed, memo) for a in term.args)
        if lo is None or hi is None:
            return None
        if x is None:
            return min(lo[0], hi[0]), hi[1]
        return min(max(x[0], lo[0]), hi[0]), min(max(x[1], lo[1]), hi[1])
    if op == "stablehlo.select":
        a, b = (value_range(t, assumed, memo) for t in term.args[1:])
        if a is None or b is None:
            return None
        return min(a[0], b[0]), max(a[1], b[1])
    if op == "stablehlo.compare" or term.dtype == "i1":
        return Fraction(0), Fraction(1)
    return None
