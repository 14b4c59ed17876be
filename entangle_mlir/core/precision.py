"""Float precision: which converts are exact, and rounding to a float format.

The semantics policy (DESIGN.md section 1): every value carries the dtype it was computed in,
and a value computed at lower precision than the reference's is not proven. A convert is the
identity on values only when every value of its source type is a value of its target type
(`exact_convert`); any other convert to a float type rounds (`round_to`), and the walk and
the Z3 encoding treat it as the rounding op it is.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

FLOAT_FORMATS: dict[str, tuple[int, int, int]] = {
    "f64": (53, -1022, 1023),
    "f32": (24, -126, 127),
    "tf32": (11, -126, 127),
    "bf16": (8, -126, 127),
    "f16": (11, -14, 15),
    "f8E5M2": (3, -14, 15),
    "f8E4M3FN": (4, -6, 8),
}
"""Float dtype -> (significand bits including the implicit one, least normal exponent,
greatest exponent). A float dtype missing here is never taken to hold another's values."""

FORMAT_BITS: dict[str, tuple[int, int]] = {
    "f64": (11, 52), "f32": (8, 23), "bf16": (8, 7), "f16": (5, 10),
}
"""Float dtype -> (exponent bits, explicit mantissa bits): the fields `reduce_precision`
compares its format with (XLA's `ReducePrecision` works on the bit pattern)."""

INT_BITS: dict[str, tuple[int, bool]] = {
    "i8": (8, True), "i16": (16, True), "i32": (32, True), "i64": (64, True),
    "si8": (8, True), "si16": (16, True), "si32": (32, True), "si64": (64, True),
    "ui8": (8, False), "ui16": (16, False), "ui32": (32, False), "ui64": (64, False),
}
"""Integer dtype -> (width, signed)."""


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_FORMATS or dtype.startswith(("f", "bf", "tf"))


def _holds_integers(dtype: str, magnitude_bits: int) -> bool:
    """Every integer of magnitude at most 2**magnitude_bits is a value of float `dtype`."""
    fmt = FLOAT_FORMATS.get(dtype)
    return fmt is not None and magnitude_bits <= fmt[0] and magnitude_bits <= fmt[2]


def exact_convert(source: str, target: str) -> bool:
    """Every value of `source` is a value of `target` (so the convert is the identity on
    values): the same type, booleans, a float format that contains the source's (bf16/f16 ->
    f32 -> f64), or integers whose range fits the float's significand (i8/i16 -> f32,
    i32 -> f64). Integer targets are not decided here (wrap-around is integer semantics)."""
    if source == target or source == "i1":
        return True
    if not is_float(target):
        return False
    if source in INT_BITS:
        width, signed = INT_BITS[source]
        return _holds_integers(target, width - 1 if signed else width)
    src, dst = FLOAT_FORMATS.get(source), FLOAT_FORMATS.get(target)
    if src is None or dst is None:
        return False
    # significand, range, and the source's least subnormal (2**(emin - p + 1)) all fit
    return dst[0] >= src[0] and dst[2] >= src[2] and dst[1] - dst[0] <= src[1] - src[0]


def rounds(source: str, target: str) -> bool:
    """A convert to a float type that is not exact: it rounds to the target's precision."""
    return is_float(target) and not exact_convert(source, target)


def lower_precision(dtype: str, than: str) -> bool:
    """`dtype` is a float format strictly contained in `than` (a value computed in it was
    rounded more coarsely)."""
    return (dtype != than and is_float(dtype) and is_float(than)
            and exact_convert(dtype, than) and not exact_convert(than, dtype))


def integer_exact_below(dtype: str) -> int | None:
    """The largest n such that every integer in [-n, n] is a value of float `dtype`."""
    fmt = FLOAT_FORMATS.get(dtype)
    return None if fmt is None else 1 << fmt[0]


FLUSHED = frozenset({"f64", "f32", "tf32", "bf16"})
"""Float dtypes whose subnormal values XLA may flush to zero (`subnormal`)."""


def subnormal(value: Fraction | float, dtype: str) -> bool:
    """Whether `value` is a nonzero finite value below float `dtype`'s smallest normal
    (2^emin). XLA may flush such a value to zero, and does so in some places only: its CPU
    flushes subnormal results of f32 / bf16 arithmetic and reads subnormal operands as zero
    (`1e-20 * 1e-20` is 0, `x * 1e-39 > 0` false), while a compare it folds at compile time
    reads the constant as it is (`full(1e-39) > 0` is true). No decision may rest on one.
    f16 and the f8 formats are computed in f32, where their subnormals are normal: XLA keeps
    them (`f16(1e-5) * x > 0` is true), so they are not flushed (`FLUSHED`)."""
    fmt = FLOAT_FORMATS.get(dtype)
    if dtype not in FLUSHED or (isinstance(value, float) and not math.isfinite(value)):
        return False
    return 0 < abs(Fraction(value)) < Fraction(2) ** fmt[1]


def round_to(value: Fraction | float, dtype: str) -> Fraction | float:
    """`value` rounded to float `dtype`, to nearest with ties to even, exactly (no double
    rounding through float64); beyond the largest finite value, +-inf. Infinities and NaN
    are returned as they are."""
    if isinstance(value, float) and not math.isfinite(value):
        return value
    fmt = FLOAT_FORMATS.get(dtype)
    if fmt is None:
        raise ValueError(f"no float format for {dtype}")
    precision, emin, emax = fmt
    x = Fraction(value)
    if x == 0:
        return Fraction(0)
    sign = -1 if x < 0 else 1
    rounded = _round_significand(abs(x), precision, emin)
    if rounded > _largest(dtype, precision, emax):
        return sign * math.inf
    return sign * rounded


@functools.cache
def _largest(dtype: str, precision: int, emax: int) -> Fraction:
    """The largest finite value of `dtype`."""
    if dtype == "f8E4M3FN":
        return Fraction(448)
    return (2 - Fraction(2) ** (1 - precision)) * Fraction(2) ** emax


def _round_significand(x: Fraction, precision: int, emin: int) -> Fraction:
    """Positive `x` rounded to `precision` significant bits (ties to even), at the quantum of
    exponent `emin` below it (subnormals); no upper limit. In integers: `x = n / d` and the
    quantum 2^q, so x / 2^q is `n * 2^-q / d`, divided with its remainder."""
    n, d = x.numerator, x.denominator
    exponent = n.bit_length() - d.bit_length()
    if (n << max(0, -exponent)) < (d << max(0, exponent)):  # 2^exponent > x
        exponent -= 1
    q = max(exponent, emin) - precision + 1
    num, den = (n, d << q) if q >= 0 else (n << -q, d)
    whole, rest = divmod(num, den)
    if 2 * rest > den or (2 * rest == den and whole % 2 == 1):
        whole += 1
    return Fraction(whole) * Fraction(2) ** q if q >= 0 else Fraction(whole, 1 << -q)


def reduce_precision_is_identity(dtype: str, exponent_bits: int, mantissa_bits: int) -> bool:
    """`reduce_precision` to (exponent_bits, mantissa_bits) keeps every value of `dtype`: the
    format has at least the dtype's exponent and mantissa bits (XLA then leaves the bits as
    they are). A dtype missing from `FORMAT_BITS` is never taken to be kept."""
    bits = FORMAT_BITS.get(dtype)
    return bits is not None and exponent_bits >= bits[0] and mantissa_bits >= bits[1]


def reduce_precision(value: Fraction | float, dtype: str, exponent_bits: int,
                     mantissa_bits: int) -> Fraction | float:
    """StableHLO's `reduce_precision` of a value of float `dtype`, exactly as XLA computes it
    on the bit pattern: the significand rounded to `mantissa_bits` (ties to even; the
    dtype's subnormals at their own quantum), then, when the format has fewer exponent bits
    than the dtype, magnitudes at or above 2^(bias + 1) become +-inf and those below the
    format's least normal 2^(1 - bias) become zero (no subnormals; bias = 2^(e-1) - 1).
    Infinities and NaN are returned as they are (the sign of a zero is not kept: values are
    exact numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return value
    bits, fmt = FORMAT_BITS.get(dtype), FLOAT_FORMATS.get(dtype)
    if bits is None or fmt is None:
        raise ValueError(f"no float format for {dtype}")
    x = Fraction(value)
    if x == 0:
        return Fraction(0)
    sign = -1 if x < 0 else 1
    x = abs(x)
    if mantissa_bits < bits[1]:
        x = _round_significand(x, mantissa_bits + 1, fmt[1])
    if exponent_bits < bits[0]:
        bias = (1 << (exponent_bits - 1)) - 1
        if x >= Fraction(2) ** (bias + 1):
            return sign * math.inf
        if x < Fraction(2) ** (1 - bias):
            return Fraction(0)
    elif x >= Fraction(2) ** (fmt[2] + 1):
        return sign * math.inf
    return sign * x


DTYPE_NAMES = {"f64": "float64", "f32": "float32", "bf16": "bfloat16", "f16": "float16"}
"""Float dtypes by the names jax users write."""


def shortest_decimal(value: Fraction, dtype: str, max_digits: int = 9) -> str | None:
    """The shortest decimal (at most `max_digits` significant digits) that rounds to `value`
    in `dtype`, when `value` is one of its values: `0.1` for float32's 13421773/134217728."""
    if dtype not in FLOAT_FORMATS or round_to(value, dtype) != value:
        return None
    for digits in range(1, max_digits + 1):
        text = f"{float(value):.{digits}g}"
        if round_to(Fraction(text), dtype) == value:
            return text
    return None


def readable_factor(k: Fraction, dtype: str = "f32", constants: tuple = ()) -> str:
    """A scale factor as a person reads it: a small fraction as it is (`4`, `1/4`, `3/128`), else a
    value of a float type, or a small multiple or divisor of one, by its shortest decimal
    (`0.4 (float32)` for 13421773/33554432, which is not 2/5; `3 x 0.7 (float32)`), the
    fewest digits first; else its decimal value to 9 digits (`~2.66666675`). A small
    multiple of one of `constants` (the program's own, e.g. its float32 0.1) is spelled with
    it: `4 x 0.1 (float32)`, a psum over 4 devices of a value the program scaled by 0.1."""
    k = Fraction(k)
    if abs(k.numerator) <= 10_000 and k.denominator <= 64:
        return str(k)
    for c in constants if dtype in DTYPE_NAMES else ():
        if not isinstance(c, Fraction) or c == 0 or c.denominator <= 64:
            continue
        ratio = k / c
        text = shortest_decimal(abs(c), dtype)
        if text is not None and abs(ratio.numerator) <= 64 and ratio.denominator <= 64:
            sign = "-" if c < 0 else ""
            return (f"{ratio} x {sign}{text} ({DTYPE_NAMES[dtype]})" if ratio != 1
                    else f"{sign}{text} ({DTYPE_NAMES[dtype]})")
    plain = abs(k.numerator) <= 10_000 and k.denominator <= 1024
    dtypes = [dtype] if dtype in DTYPE_NAMES else []
    if not plain:
        dtypes += [d for d in ("f32", "bf16", "f16", "f64") if d not in dtypes]
    best: tuple[int, str] | None = None
    for d in dtypes:
        for m in range(1, 2 if plain else 65):
            for constant, spelled in ((k / m, f"{m} x {{}}"), (k * m, f"{{}} / {m}")):
                text = shortest_decimal(constant, d, max_digits=3 if plain else 6)
                if text is None:
                    continue
                shown = (text if m == 1 else spelled.format(text)) + f" ({DTYPE_NAMES[d]})"
                digits = len(text.lstrip("-").replace(".", "").strip("0"))
                score = digits * 100 + (m > 1) * 150 + m
                if best is None or score < best[0]:
                    best = (score, shown)
        if best is not None:
            return best[1]
    return str(k) if plain else f"~{float(k):.9g}"
