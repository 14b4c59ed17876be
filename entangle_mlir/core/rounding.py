"""Exact rounding of rational constants to a float dtype (round to nearest, ties to even).

A proof compares constants exactly (DESIGN.md section 1). The one liberty taken with them is
XLA's (and jax's) rewrite of a division by a constant `x / c` into a multiplication by its
reciprocal rounded to the dtype, `x * fl(1 / c)`: a sharded constant is accepted for a reference
constant `r` only when it IS `round(r)` in the sharded value's dtype, computed here exactly on
rationals (no detour through float64, which would round twice for float32), never when it is
merely close. `FORMATS` is the one table of the float formats this knows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from entangle_mlir.core.terms import COMMUTATIVE, REGION_TERMS, Term


@dataclass(frozen=True)
class FloatFormat:
    """A binary IEEE-style format: `precision` significand bits (the implicit one included),
    normal exponents `emin..emax`, with subnormals and infinities."""

    precision: int
    emin: int
    emax: int

    @property
    def largest(self) -> Fraction:
        return (2 - Fraction(1, 1 << (self.precision - 1))) * Fraction(2) ** self.emax


FORMATS = {
    "f64": FloatFormat(53, -1022, 1023),
    "f32": FloatFormat(24, -126, 127),
    "f16": FloatFormat(11, -14, 15),
    "bf16": FloatFormat(8, -126, 127),
}
"""The float dtypes (as the term's dtype spells them) whose rounding is known exactly."""


def _floor_log2(value: Fraction) -> int:
    """floor(log2(value)) for a positive rational, exactly."""
    e = value.numerator.bit_length() - value.denominator.bit_length()
    if Fraction(2) ** e > value:
        e -= 1
    return e


def round_to(value: Fraction, dtype: str) -> Fraction | float | None:
    """`value` rounded to nearest (ties to even) in `dtype`: an exact Fraction, +-inf on
    overflow, None when `dtype` is not a float format of `FORMATS` or `value` is not a
    rational."""
    fmt = FORMATS.get(dtype)
    if fmt is None or not isinstance(value, Fraction):
        return None
    if value == 0:
        return value
    magnitude = abs(value)
    exponent = max(_floor_log2(magnitude), fmt.emin)
    ulp = Fraction(2) ** (exponent - fmt.precision + 1)
    rounded = round(magnitude / ulp) * ulp  # Fraction.__round__ rounds half to even
    if rounded > fmt.largest:
        rounded = float("inf")
    return rounded if value > 0 else -rounded


def is_rounding_of(sharded, reference, dtype: str) -> bool:
    """`sharded` is exactly `reference` rounded to `dtype` (and differs from it): the one
    relation between a sharded and a reference constant a proof accepts besides equality. A
    rounding that overflows to infinity or underflows to zero is not accepted: it changes what
    the value can be, not its last bits."""
    if not isinstance(reference, Fraction) or sharded == reference:
        return False
    rounded = round_to(reference, dtype)
    return isinstance(rounded, Fraction) and rounded != 0 and rounded == sharded


def _sqrt_rounded(value: Fraction, dtype: str) -> Fraction | None:
    """The correctly rounded square root of a non-negative rational in `dtype` (IEEE 754's
    sqrt), exactly: the integer square root on a grid finer than half an ulp, with a sticky
    half when the root is not on the grid (then it is not a rounding boundary either)."""
    fmt = FORMATS.get(dtype)
    if fmt is None or value < 0:
        return None
    if value == 0:
        return value
    bits = fmt.precision + 4 - (_floor_log2(value) // 2 - 1)
    scaled = value * Fraction(4) ** bits
    root = math.isqrt(scaled.numerator // scaled.denominator)
    on_grid = root * root == scaled
    rounded = round_to(Fraction(root if on_grid else 2 * root + 1,
                                1 if on_grid else 2) / Fraction(2) ** bits, dtype)
    return rounded if isinstance(rounded, Fraction) else None


def exact_value(term: Term, depth: int = 32) -> Fraction | None:
    """The exact value, in its dtype, of a scalar constant expression whose float value IEEE 754
    fixes (a splat, moved, converted, or its correctly rounded square root: `x / jnp.sqrt(8.0)`);
    None for anything else (an `exp` of a constant is not correctly rounded by XLA, so it has
    no exact value to compare with)."""
    if depth <= 0:
        return None
    if term.op == "splat":
        value = term.attrs[0]
        return value if isinstance(value, Fraction) else None
    if term.op in ("broadcast", "reshape", "transpose") and len(term.args) == 1:
        return exact_value(term.args[0], depth - 1)
    if term.op == "stablehlo.convert" and len(term.args) == 1:
        inner = exact_value(term.args[0], depth - 1)
        if inner is None or term.dtype not in FORMATS:
            return None
        rounded = round_to(inner, term.dtype)
        return rounded if isinstance(rounded, Fraction) else None
    if term.op == "stablehlo.sqrt" and len(term.args) == 1:
        inner = exact_value(term.args[0], depth - 1)
        return None if inner is None else _sqrt_rounded(inner, term.dtype)
    return None


def _scaled_view(term: Term) -> tuple[Fraction, Term] | None:
    """(k, t) with term == k * t for a scaled single term or a division by a constant
    expression (k is then the exact reciprocal of the divisor's value in its dtype)."""
    if term.op == "lin" and len(term.args) == 1 and term.attrs[0] == 0:
        k, inner = term.attrs[1][0], term.args[0]
        deeper = _scaled_view(inner)
        return (k * deeper[0], deeper[1]) if deeper else (k, inner)
    if term.op == "div" and term.dtype.startswith(("f", "bf")):  # an integer one truncates
        value = exact_value(term.args[1])
        if value is not None and value != 0:
            return 1 / value, term.args[0]
    return None


_UNORDERED = {"lin", "mul", *COMMUTATIVE}

Rounded = tuple[Fraction, Fraction, str]
"""(reference constant, sharded constant, dtype): the sharded one is the reference's rounded."""


class _Rounding:
    """`equal_up_to_rounding`'s search: memoized, depth- and size-bounded."""

    def __init__(self, limit: int, any_constant: bool = False) -> None:
        self.limit = limit
        self.any_constant = any_constant
        self.memo: dict[tuple[int, int], bool] = {}
        self.found: list[Rounded] = []

    def accepts(self, a, b, dtype: str) -> bool:
        return a == b or is_rounding_of(b, a, dtype) or (
            self.any_constant and isinstance(a, Fraction) and isinstance(b, Fraction))

    def close(self, a, b, dtype: str) -> bool:
        """`b` (sharded) is `a` (reference) or `a` rounded to `dtype` (then remembered); any
        other rational too, when looking for `constant_differences`."""
        if a == b:
            return True
        if not self.accepts(a, b, dtype):
            return False
        if (a, b, dtype) not in self.found:
            self.found.append((a, b, dtype))
        return True

    def equal(self, x: Term, y: Term, depth: int = 0) -> bool:
        if x is y:
            return True
        key = (x.serial, y.serial)
        if key in self.memo:
            return self.memo[key]
        if depth > 120 or len(self.memo) > self.limit:
            return False
        self.memo[key] = False
        result = self._equal(x, y, depth)
        self.memo[key] = result
        return result

    def _equal(self, x: Term, y: Term, depth: int) -> bool:
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        dtype = x.dtype
        if x.op != y.op or (x.op == "lin" and len(x.args) == 1 == len(y.args)):
            vx, vy = _scaled_view(x), _scaled_view(y)
            if vx or vy:
                kx, bx = vx or (Fraction(1), x)
                ky, by = vy or (Fraction(1), y)
                if (bx is x and by is y) or not self.close(kx, ky, dtype):
                    return False
                return self.equal(bx, by, depth + 1)
            if x.op != y.op:
                return False
        if len(x.args) != len(y.args):
            return False
        if x.op == "lin":
            (cx, kx), (cy, ky) = x.attrs, y.attrs
            if not self.close(cx, cy, dtype):
                return False
            left = [(k * (v[0] if v else 1), v[1] if v else a)
                    for k, a in zip(kx, x.args) for v in (_scaled_view(a),)]
            right = [(k * (v[0] if v else 1), v[1] if v else a)
                     for k, a in zip(ky, y.args) for v in (_scaled_view(a),)]
            return self._match(left, right, dtype, depth)
        if x.op == "splat":
            return self.close(x.attrs[0], y.attrs[0], dtype)
        if x.op == "region_result" and x.attrs != y.attrs:
            tx, ty = REGION_TERMS.get(x.attrs[0]), REGION_TERMS.get(y.attrs[0])
            return tx is not None and ty is not None and self.equal(tx, ty, depth + 1) and all(
                self.equal(a, b, depth + 1) for a, b in zip(x.args, y.args))
        if x.attrs != y.attrs:
            return False
        if x.op in _UNORDERED:
            return self._match([(1, a) for a in x.args], [(1, a) for a in y.args], dtype,
                               depth)
        return all(self.equal(a, b, depth + 1) for a, b in zip(x.args, y.args))

    def _match(self, left, right, dtype: str, depth: int) -> bool:
        """Every (coefficient, term) on the left pairs with one on the right."""
        unused = list(right)
        for k, a in left:
            for n, (m, b) in enumerate(unused):
                if a.op == b.op and a.shape == b.shape and self.accepts(k, m, dtype) and (
                        self.equal(a, b, depth + 1)):
                    self.close(k, m, dtype)
                    del unused[n]
                    break
            else:
                return False
        return not unused


def equal_up_to_rounding(a: Term, b: Term, limit: int = 200_000) -> list[Rounded] | None:
    """The constants in which sharded `b` differs from reference `a` when they are the same
    computation except that some constants of `b` are the exact ones of `a` rounded to their
    dtype (coefficients, addends, splats, and a division by a constant expression against a
    multiplication by its rounded reciprocal: XLA's `x / c -> x * fl(1 / c)`). None when they
    differ otherwise, by however little. Callers state the pairs as an assumption."""
    search = _Rounding(limit)
    if not search.equal(a, b):
        return None
    return search.found


NEAR = Fraction(1, 1 << 10)
"""For diagnostics only (never a proof): constants within this relative distance are named as
a near miss, where a 'k x the reference' message alone would hide that they are constants."""


def constant_differences(a: Term, b: Term, limit: int = 20_000) -> list[Rounded] | None:
    """For a diagnostic only: the constants in which sharded `b` differs from reference `a`
    when they are otherwise the same computation and every such constant is a near miss
    (`x * 0.00130208349` for `x / 768`: close, but not the float32 rounding of 1/768), else
    None."""
    search = _Rounding(limit, any_constant=True)
    if not search.equal(a, b):
        return None
    found = [p for p in search.found if not is_rounding_of(p[1], p[0], p[2])]
    if not all(abs(s - r) <= NEAR * max(abs(r), abs(s)) for r, s, _ in found):
        return None
    return found


def describe_difference(pair: Rounded) -> str:
    """Why a sharded constant is not the reference's, in words."""
    reference, sharded, dtype = pair
    rounded = round_to(reference, dtype)
    if rounded is None:
        return (f"the sharded constant {_exact_text(sharded)} is not the reference's "
                f"{_exact_text(reference)} ({dtype} constants compare exactly)")
    return (f"the sharded constant {float(sharded):.9g} is not the reference's "
            f"{_exact_text(reference)}, nor its rounding to {DTYPE_NAMES[dtype]} "
            f"({float(rounded):.9g}): constants compare exactly")


DTYPE_NAMES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16"}
"""numpy's names of the MLIR float types, as messages spell them."""

ASSUMPTION = "XLA's exact constant rounding"
"""How a proof that used `equal_up_to_rounding` names what it assumed."""


def _exact_text(value: Fraction) -> str:
    if value.denominator == 1 or value.denominator < 10**6 and value.numerator < 10**6:
        return str(value)
    return f"{float(value):.9g}"


def describe_rounded(pairs: list[Rounded], limit: int = 3) -> str:
    """`reference x / 768 vs sharded x * 0.00130208337 (float32(1/768))` for each pair."""
    shown = []
    for reference, sharded, dtype in pairs[:limit]:
        rounding = f"{DTYPE_NAMES.get(dtype, dtype)}({_exact_text(reference)})"
        if reference.numerator == 1 and reference.denominator != 1:
            shown.append(f"reference `x / {reference.denominator}` vs sharded "
                         f"`x * {float(sharded):.9g}` ({rounding})")
        else:
            shown.append(f"reference constant {_exact_text(reference)} vs sharded "
                         f"{float(sharded):.9g} ({rounding})")
    if len(pairs) > limit:
        shown.append(f"and {len(pairs) - limit} more")
    return "; ".join(shown)
