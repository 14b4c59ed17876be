"""Hash-consed reference terms over global tensors, kept in a canonical form.

A term names a global value of the reference computation: an argument, a constant, or an op
applied to terms. Construction goes through the `make_*` functions, which canonicalize so that
equal spellings intern to the same object and matching a sharded value to a reference value is
an identity test:

* linear combinations `lin` with `Fraction` coefficients and a splat constant addend (add,
  subtract, negate, scaling by constants, pmean's 1/n);
* scalars pulled through dot_general / reduce-sum / broadcast / reshape / transpose / slice;
* n-ary sorted multiply, sorted max/min/and/or; `x * x` for `chlo.square`;
* composed broadcast / reshape / transpose chains; unit-dim-only broadcasts become reshapes;
* `0 * t` and a cancelled `t - t` are 0 only where `t` is shown finite (`term_finite`):
  elsewhere they are NaN, and the zero multiple `mul(t, 0)` is kept (`zero_multiple`).

So the builders own the one value analysis they consult: `term_interval`, the range of a
term's elements (interval arithmetic from `ranges.py`, shared with the IR analysis
`normalize.bounds`). `rebuild` puts a term's node over new arguments through the builders.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from fractions import Fraction
from types import MappingProxyType

from entangle_mlir.core import precision
from entangle_mlir.core.ranges import (
    ELEMENTWISE_BOUNDS,
    FLOAT_MAX,
    INF,
    UNBOUNDED,
    Interval,
    add,
    div,
    fit,
    fits,
    hull,
    int_interval,
    integer_dtype,
    mul,
    times,
)
from entangle_mlir.core.ranges import (
    exact_convert as exact_int_convert,
)
from entangle_mlir.core.repeats import Plan, plan_of
from entangle_mlir.core.traits import ELEMENTWISE_OPS

Scalar = Fraction | float

_counter = itertools.count()
_TABLE: dict[tuple, Term] = {}

_SHAPES: dict[tuple[int, ...], tuple[int, ...]] = {}
"""Each shape -> the one tuple every term of that shape holds (a check's million terms have
a few thousand shapes; built one tuple each, they were ~20 MiB)."""

_KEYED_ATTRS: dict[tuple, tuple[tuple, tuple]] = {}
"""(op, key_attrs) -> the one (key_attrs, attrs) every term interned with equal `key_attrs`
holds (`intern`'s contract: equal key_attrs stand for equal attrs): a check's 0.2 M sums
have ~2 000 distinct coefficient lists, ~55 MiB held once a sum."""

INDEX_ATTRS_OPS = frozenset({"stablehlo.dot_general", "concatenate", "broadcast", "transpose",
                             "reduce_sum"})
"""Ops whose attrs are dims alone (tuples of ints): equal attrs are the same attrs, so their
terms share one tuple (`_INDEX_ATTRS`; 0.35 M such terms at 70B, a few dozen distinct)."""

_INDEX_ATTRS: dict[tuple, tuple] = {}
"""The attrs of `INDEX_ATTRS_OPS`' terms -> the one tuple holding them."""


class Term:
    """An interned term. Compare with `is`; `serial` orders operands of commutative ops."""

    __slots__ = ("__weakref__", "args", "attrs", "dtype", "op", "serial", "shape")

    op: str
    args: tuple[Term, ...]
    attrs: tuple
    shape: tuple[int, ...]
    dtype: str
    serial: int

    def __repr__(self) -> str:
        return pretty(self)


def intern(op: str, args: tuple[Term, ...], attrs: tuple, shape: tuple[int, ...],
           dtype: str, key_attrs: tuple | None = None,
           arg_serials: tuple[int, ...] | None = None) -> Term:
    """The unique term with these fields (no canonicalization: use the `make_*` functions).
    `key_attrs`, when given, stands for `attrs` in the table's key: it must be equal (==, and
    so hash alike) exactly when `attrs` are, and be cheaper to hash; `arg_serials`, when given,
    must be the serials of `args` (a long sum passes the ones it already has). The key is one
    flat tuple, the serials last: a million terms' keys, each without a tuple of its own for
    the serials, are ~40 MiB less (a check holds every key)."""
    key = (op, attrs if key_attrs is None else key_attrs, shape, dtype,
           *(arg_serials if arg_serials is not None else [a.serial for a in args]))
    term = _TABLE.get(key)
    if term is None:
        shape = _SHAPES.setdefault(shape, shape)
        if key_attrs is not None:
            key_attrs, attrs = _KEYED_ATTRS.setdefault((op, key_attrs), (key_attrs, attrs))
        elif op in INDEX_ATTRS_OPS:
            attrs = _INDEX_ATTRS.setdefault(attrs, attrs)
        key = (op, attrs if key_attrs is None else key_attrs, shape, dtype, *key[4:])
        term = Term()
        term.op, term.args, term.attrs, term.shape, term.dtype = op, args, attrs, shape, dtype
        term.serial = next(_counter)
        _TABLE[key] = term
    return term


def start_over() -> None:
    """Intern new terms from scratch: what is built next is equal to no term built before (the
    serials go on counting, so every memo keyed by serial keeps holding only true facts about
    the terms it names, old or new). Commuting operands and a sum's parts are ordered by
    serial, i.e. by when a term was first built, and the normal forms are not the same under
    every order; so a check that starts over reaches the same forms whatever was checked
    before in the process, as if it were the first. Terms built before stay valid values (a
    report's walks keep theirs), just never identical to new ones."""
    _TABLE.clear()
    _BUILT.clear()


_BUILT: dict[tuple, Term] = {}
"""Results of the canonicalizing constructors by their arguments (terms by serial). Each
constructor is a pure function of interned terms and plain values, so a repeat is a lookup:
the sharded walk rebuilds the reference's terms (a replicated layer norm, a Megatron matmul's
global term) and jax repeats subexpressions (a layer norm's `x - mean` twice)."""


def _built(name: str, key_of):
    """Memoize a term constructor in `_BUILT` under `(name, *key_of(*args))` (`key_of` returns
    a tuple; one flat key: ~45 MiB less for a check's million entries than a pair)."""
    def wrap(build):
        @functools.wraps(build)
        def memoized(*args):
            key = (name, *key_of(*args))
            try:
                found = _BUILT.get(key)
            except TypeError:  # an unhashable attribute: build it every time
                return build(*args)
            if found is None:
                found = _BUILT[key] = build(*args)
            return found
        return memoized
    return wrap


def _pair_key(a: Term, b: Term) -> tuple:
    return a.serial, b.serial


LOOP_BODY_TERMS: dict[int, Term] = {}
"""serial -> term for the condition and yields a `while_result` names by serial in its attrs
(they are not its arguments: the loop variables in them are bound by the loop)."""

REGION_TERMS: dict[int, Term] = {}
"""serial -> the template term a `region_result` (a summarized layer applied to its inputs,
`layer_reuse.region_result`) names by serial in its attrs."""

HOLE_BASE = 500_000_000
"""Argument indices of holes, the leaves standing for a summarized layer's inputs in its
template (`layer_reuse.fresh_hole`): below `instance.common.ABSTRACT_BASE`, far above real
arguments."""


def subterms(roots) -> Iterator[Term]:
    """Every distinct term under `roots` (themselves included), each once."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        term = stack.pop()
        if term.serial in seen:
            continue
        seen.add(term.serial)
        yield term
        stack.extend(term.args)


def post_order(term: Term, done: dict[int, object]) -> Iterator[Term]:
    """The terms under `term` (itself included) not yet in `done`, each after its arguments:
    the order in which a memoized fold over the DAG computes them. Iterative, since terms can
    be deep (whole transformer stacks); the caller records each term in `done` before asking
    for the next."""
    stack = [term]
    while stack:
        top = stack[-1]
        if top.serial in done:
            stack.pop()
            continue
        pending = [a for a in top.args if a.serial not in done]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        yield top


def scalar(value) -> Scalar:
    """A canonical scalar: an exact Fraction when finite, else a float (inf, nan)."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        return Fraction(int(value))
    if isinstance(value, int):
        return Fraction(value)
    value = float(value)
    if math.isfinite(value):
        return Fraction(value)
    if math.isnan(value):
        return NAN
    return value


NAN = float("nan")  # one object, so NaN constants intern to one term


# ----- leaves -------------------------------------------------------------------------------

UNBOUNDED_LEAF = "unbounded"
"""The mark of an argument leaf whose elements may be infinite or NaN (`make_arg`)."""


def make_arg(index: int, shape: tuple[int, ...], dtype: str, finite: bool = True) -> Term:
    """Argument `index`. `finite=False`: a leaf standing for a term not shown finite (the
    instance checker's abstraction of such a term): its interval is unbounded, so the
    builders keep `0 * leaf` and `leaf - leaf` as they keep them for the term it stands for,
    where a program input (finite by assumption) gives 0."""
    attrs = (index,) if finite else (index, UNBOUNDED_LEAF)
    return intern("arg", (), attrs, tuple(shape), dtype)


def arg_finite(term: Term) -> bool:
    """An argument leaf is finite (`make_arg`'s `finite`)."""
    return term.attrs[1:] != (UNBOUNDED_LEAF,)


def make_splat(value, shape: tuple[int, ...], dtype: str) -> Term:
    """A tensor whose elements all equal `value`."""
    value = scalar(value)
    return intern("splat", (), (value,), tuple(shape), dtype, key_attrs=(_cheap(value),))


DENSE_VALUES: dict[bytes, object] = {}


def make_dense(data_key: bytes, shape: tuple[int, ...], dtype: str, values=None) -> Term:
    """A non-splat constant, identified by its raw bytes; small integer tables keep their
    values (`DENSE_VALUES`) so device-indexed offset tables can be evaluated."""
    if values is not None:
        DENSE_VALUES[data_key] = values
    return intern("dense", (), (data_key,), tuple(shape), dtype)


def make_loopvar(depth: int, index: int, shape: tuple[int, ...], dtype: str) -> Term:
    """The value carried in position `index` of the loop at nesting `depth`, any iteration."""
    return intern("loopvar", (), (depth, index), tuple(shape), dtype)


IOTA_POSITIONS = "i64"
"""The dtype an iota's positions are counted in where its own dtype does not hold them."""


def make_iota(shape: tuple[int, ...], dim: int, dtype: str) -> Term:
    """An iota; a multi-dim one is the broadcast of the 1-D iota (one normal form for
    `broadcasted_iota` and `arange(...)[None, :]`). An iota term is its positions exactly, so
    an iota whose dtype does not hold every position (an i8 iota of 256 wraps to -128 at 128,
    a bf16 one of 512 rounds 257) is the convert of the positions' `IOTA_POSITIONS` iota to
    that dtype: a narrowing integer convert (wraps) or a rounding float one."""
    shape = tuple(shape)
    if not fits(Fraction(0), Fraction(max(shape[dim] - 1, 0)), dtype):
        positions = make_iota(shape, dim, IOTA_POSITIONS)
        rounding = (IOTA_POSITIONS,) if _is_float(dtype) else ()
        return make_elementwise("stablehlo.convert", (positions,), rounding, dtype)
    if len(shape) == 1:
        return intern("iota", (), (0,), shape, dtype)
    return make_broadcast(make_iota((shape[dim],), 0, dtype), (dim,), shape)


def splat_value(term: Term) -> Scalar | None:
    return term.attrs[0] if term.op == "splat" else None


# ----- linear combinations ------------------------------------------------------------------

def linear_parts(term: Term) -> tuple[list[tuple[Fraction, Term]], Scalar]:
    """`term` as (coefficient, term) pairs plus a constant addend."""
    if term.op == "lin":
        constant, coefs = term.attrs
        return list(zip(coefs, term.args)), constant
    if term.op == "splat":
        return [], term.attrs[0]
    return [(Fraction(1), term)], Fraction(0)


def make_lin(pairs, constant, shape: tuple[int, ...], dtype: str) -> Term:
    """The canonical form of `sum(k * t for k, t in pairs) + constant`.

    Hot on deep models (a residual stream is one growing `lin`), so unit coefficients skip
    the Fraction multiplication; the result is the same as multiplying. A sum into a long
    `lin` taken once (`x + f(x)` on the residual stream) only edits that lin's sorted arguments
    (`_extend_lin`): Python work per term added, not per term of the stream."""
    for coef, _ in pairs:
        if not coef:
            pairs, constant = _times_zero(pairs, constant)
            break
    base_at = _long_base(pairs)
    if base_at >= 0:
        extended = _extend_lin(pairs, base_at, constant, tuple(shape), dtype)
        if extended is not None:
            return extended
    coef_of: dict[int, Scalar] = {}
    term_of: dict[int, Term] = {}
    total = scalar(constant)
    for coef, term in pairs:
        if term.op != "lin" and term.op != "splat":
            # k * t: the coefficient itself (times one, as a Fraction when it is an int)
            add = coef if type(coef) is Fraction else coef * _ONE
            serial = term.serial
            old = coef_of.get(serial)
            if old is None:
                coef_of[serial] = add
                term_of[serial] = term
            else:
                coef_of[serial] = old + add
            continue
        unit = type(coef) is Fraction and coef == 1
        if term.op == "lin":
            inner_const, coefs = term.attrs
            inner = zip(coefs, term.args)
        else:
            inner_const, inner = term.attrs[0], ()
        if inner_const != 0:
            total = total + (inner_const if unit else coef * inner_const)
        for k, t in inner:
            serial = t.serial
            add = k if unit else coef * k
            old = coef_of.get(serial)
            if old is None:
                coef_of[serial] = add
                term_of[serial] = t
            else:
                coef_of[serial] = old + add
    serials = sorted(s for s, k in coef_of.items() if k != 0)
    if len(serials) != len(coef_of):
        cancelled = [term_of[s] for s, k in coef_of.items() if k == 0]
        if not all(_zero_exact(t) for t in cancelled):
            kept = [(coef_of[s], term_of[s]) for s in serials]
            return make_lin(kept + [(_ZERO, t) for t in cancelled], total, shape, dtype)
    if not serials:
        return make_splat(total, shape, dtype)
    if len(serials) == 1 and coef_of[serials[0]] == 1 and total == 0:
        return term_of[serials[0]]
    coefs = tuple(coef_of[s] for s in serials)
    args = tuple(term_of[s] for s in serials)
    serial_key = tuple(serials)
    coef_keys = tuple(_cheap(c) for c in coefs)
    term = intern("lin", args, (total, coefs), tuple(shape), dtype,
                  key_attrs=(_cheap(total), coef_keys), arg_serials=serial_key)
    if len(args) >= LONG_LIN:
        _LIN_KEYS[term.serial] = (serial_key, coef_keys)
    return term


LONG_LIN = 8
"""Sums into a `lin` with at least this many terms edit it in place (`_extend_lin`)."""

_LIN_KEYS: dict[int, tuple[tuple[int, ...], tuple]] = {}
"""serial -> (argument serials, coefficient keys) of the long lins built: what a sum into one
copies and edits instead of recomputing for every term of the stream."""


def _long_base(pairs) -> int:
    """The position of the longest `lin` taken once (coefficient exactly 1) among `pairs` when
    it has at least `LONG_LIN` terms, else -1."""
    best, length = -1, LONG_LIN - 1
    for i, (coef, term) in enumerate(pairs):
        if term.op == "lin" and len(term.args) > length and type(coef) is Fraction and coef == 1:
            best, length = i, len(term.args)
    return best


def _extend_lin(pairs, base_at: int, constant, shape: tuple[int, ...],
                dtype: str) -> Term | None:
    """`make_lin` when `pairs[base_at]` is `(1, base)` with `base` a long lin: the other pairs
    are merged into copies of base's sorted arguments by binary search. The result is the
    term the general loop builds (the same sum, exact arithmetic, the same canonical form);
    None when a term not shown finite cancels (the general loop keeps its zero multiple)."""
    base = pairs[base_at][1]
    known = lin_keys(base)
    serials, coef_keys = list(known[0]), list(known[1])
    base_const, base_coefs = base.attrs
    coefs, args = list(base_coefs), list(base.args)
    total = scalar(constant)
    if base_const != 0:
        total = total + base_const
    touched: set[int] = set()
    inserted: set[int] = set()
    changed_base = False

    def add(k, t: Term) -> None:
        nonlocal changed_base
        serial = t.serial
        at = bisect.bisect_left(serials, serial)
        if at < len(serials) and serials[at] == serial:
            coefs[at] = coefs[at] + k
            changed_base = changed_base or serial not in inserted
        else:
            serials.insert(at, serial)
            coefs.insert(at, k)
            args.insert(at, t)
            coef_keys.insert(at, None)
            inserted.add(serial)
        touched.add(serial)

    for i, (coef, term) in enumerate(pairs):
        if i == base_at:
            continue
        if term.op != "lin" and term.op != "splat":
            add(coef if type(coef) is Fraction else coef * _ONE, term)
            continue
        unit = type(coef) is Fraction and coef == 1
        if term.op == "lin":
            inner_const, inner_coefs = term.attrs
            inner = zip(inner_coefs, term.args)
        else:
            inner_const, inner = term.attrs[0], ()
        if inner_const != 0:
            total = total + (inner_const if unit else coef * inner_const)
        for k, t in inner:
            add(k if unit else coef * k, t)
    for serial in sorted(touched, reverse=True):
        at = bisect.bisect_left(serials, serial)
        if coefs[at] == 0:
            if not _zero_exact(args[at]):
                return None
            del serials[at], coefs[at], args[at], coef_keys[at]
        else:
            coef_keys[at] = _cheap(coefs[at])
    if not serials:
        return make_splat(total, shape, dtype)
    if len(serials) == 1 and coefs[0] == 1 and total == 0:
        return args[0]
    serial_key, key_tuple = tuple(serials), tuple(coef_keys)
    term = intern("lin", tuple(args), (total, tuple(coefs)), shape, dtype,
                  key_attrs=(_cheap(total), key_tuple), arg_serials=serial_key)
    if len(serial_key) >= LONG_LIN:
        _LIN_KEYS[term.serial] = (serial_key, key_tuple)
        if (not changed_base and term is not base and type(total) is Fraction
                and type(base_const) is Fraction and total == base_const):
            added = []
            for serial in sorted(inserted):
                at = bisect.bisect_left(serials, serial)
                if at < len(serials) and serials[at] == serial:
                    added.append((coefs[at], args[at]))
            if added:
                _DERIVED[term.serial] = (base, tuple(added))
    return term


_DERIVED: dict[int, tuple[Term, tuple[tuple[Scalar, Term], ...]]] = {}
"""serial of a long lin -> (base, pairs) when it is `base + sum(k * t for k, t in pairs)` with
terms `t` that base does not have (base's coefficients and constant as they are): a residual
stream after each add. Its content follows these steps (`_content_parts`) in work per step,
not per term of the stream."""


def _cheap(value: Scalar):
    """A key standing for the scalar `value`: equal to another's exactly when the scalars are
    equal, and hashed in C where a Fraction's hash takes a modular inverse in Python (a
    residual stream has a coefficient per layer). An integral Fraction is its int; another
    one, its (numerator, denominator) in lowest terms; a float (inf, nan) itself."""
    if type(value) is Fraction:
        return value.numerator if value.denominator == 1 else (value.numerator,
                                                                value.denominator)
    return value


_ZERO = Fraction(0)
_ONE = Fraction(1)


def _zero_exact(term: Term) -> bool:
    """`0 * term` is exactly zero: an integer term (two's complement: 0 * x = x - x = 0), or
    another (float) term shown finite (`term_finite`). For an infinite or NaN element
    it is NaN, so `exp(x) * 0` and `exp(x) - exp(x)` are not zero where exp overflows."""
    if integer_dtype(term.dtype):
        return True
    return not is_zero_multiple(term) and term_finite(term)


def zero_multiple(term: Term) -> Term:
    """The term `0 * term` when that is not exactly zero (see `_zero_exact`): a product with
    a zero factor, which is 0 where `term` is finite and NaN elsewhere. Products absorb it
    (`k * (0 * t)` and `0 * (0 * t)` are `0 * t` up to its coefficient), so it is one node."""
    if is_zero_multiple(term):
        return term
    zero = make_splat(0, term.shape, term.dtype)
    factors = tuple(sorted((term, zero), key=lambda t: t.serial))
    return intern("mul", factors, (), term.shape, term.dtype)


def is_zero_multiple(term: Term) -> bool:
    """`term` is a product with a zero factor (`zero_multiple`)."""
    return term.op == "mul" and any(splat_value(a) == 0 for a in term.args)


def _times_zero(pairs, constant) -> tuple[list, Scalar]:
    """`pairs` and `constant` with each zero coefficient applied: `0 * t` dropped where it is
    exactly zero, else `1 * zero_multiple(t)`; `0 * c` of a constant is 0, NaN for inf."""
    kept = []
    for coef, term in pairs:
        if coef:
            kept.append((coef, term))
        elif term.op == "splat":
            value = term.attrs[0]
            if not isinstance(value, Fraction):
                constant = scalar(constant) + NAN
        elif not _zero_exact(term):
            kept.append((_ONE, zero_multiple(term)))
    return kept, constant


def scale(term: Term, factor) -> Term:
    return make_lin([(scalar(factor), term)], Fraction(0), term.shape, term.dtype)


def single_scaled(term: Term) -> tuple[Scalar, Term]:
    """(k, t) with term == k * t when term is a scaled single term, else (1, term)."""
    if term.op == "lin" and len(term.args) == 1 and term.attrs[0] == 0:
        return term.attrs[1][0], term.args[0]
    return Fraction(1), term


def factor_content(term: Term) -> tuple[Scalar, Term]:
    """(k, t) with term == k * t where, for a sum, k is the content of its coefficients (the
    positive rational generating them, gcd of numerators over lcm of denominators, signed by
    `content_sign`): proportional sums get the same `t`, whatever order their parts are
    listed in. Products and linear ops are homogeneous, so `(c*a + c*b) * x` and
    `c * ((a + b) * x)` must meet: a local mean's `1/N_local` and a pmean's `1/n` then
    multiply out to the reference's `1/N` whichever side of the product (or of a pad,
    broadcast, reduction) they were applied on."""
    if term.op != "lin":
        return Fraction(1), term
    found = _CONTENT.get(term.serial)
    if found is None:
        found = _CONTENT[term.serial] = _factor_content(term)
    return found


_CONTENT: dict[int, tuple[Scalar, Term]] = {}
"""factor_content by term serial: a deep model's residual stream is one `lin` with a term per
layer, and every layer's norm and matmul asks for its content again."""


def _factor_content(term: Term) -> tuple[Scalar, Term]:
    constant, coefs = term.attrs
    if not isinstance(constant, Fraction):
        return Fraction(1), term
    if len(coefs) >= LONG_LIN:
        found = _long_content(term)
        if found is not None:
            return found
    values = [c for c in (*coefs, constant) if c != 0]
    numerator = math.gcd(*(v.numerator for v in values))
    denominator = math.lcm(*(v.denominator for v in values))
    sign = content_sign(coefs, term.args)
    if numerator == 1 and denominator == 1 and sign == 1:
        return Fraction(1), term
    k = Fraction(sign * numerator, denominator)

    def divided(c: Fraction) -> Fraction:
        return _divided(c, sign, numerator, denominator)

    inner = make_lin([(divided(c), t) for c, t in zip(coefs, term.args)], divided(constant),
                     term.shape, term.dtype)
    return k, inner


def content_sign(coefs: tuple[Fraction, ...], parts: tuple[Term, ...] = ()) -> int:
    """The sign of a sum's content: the one that makes its coefficient of greatest magnitude
    positive, so that it does not depend on the order the parts are listed in (by serial:
    the same sum built in another order, a pipeline's other micro-batch, pulls the same
    sign); for a difference of two parts (`x - y`, a coefficient and its negation), the one
    that makes positive the part whose `skeleton` is less (listed by serial, `x - y` and
    `y' - x'` computed alike from other rows would pull opposite signs; each now reads
    `x - y`); where the skeletons tie, or there are more parts (or `parts` is not given),
    the first coefficient's sign. Any sign is exact (`k * t`, `t` the sum divided by `k`):
    only the sign that two sums computed alike pull must agree."""
    top, bottom = max(coefs), min(coefs)
    if top != -bottom:
        return 1 if top > -bottom else -1
    if len(parts) == len(coefs) == 2:
        above, below = (skeleton(parts[coefs.index(c)]) for c in (top, bottom))
        if above != below:
            return 1 if above < below else -1
    return -1 if coefs[0] < 0 else 1


SKELETON_DEPTH = 4
"""How many levels of a term `skeleton` reads."""

_SKELETONS: tuple[dict[int, tuple], ...] = tuple({} for _ in range(SKELETON_DEPTH + 1))
"""`_skeleton` by depth, then by term serial (terms are interned and immutable; a dict a depth,
keyed by the serial itself, holds no key tuple of its own)."""


def skeleton(term: Term) -> tuple:
    """What `term` computes, read `SKELETON_DEPTH` levels down, without the inputs, windows,
    shapes or attributes it reads: (op, dtype, the operands' skeletons sorted, with their
    coefficients for a sum). Terms computed alike from other rows (a pipeline's
    micro-batches, a device's row, the whole batch) have one skeleton; it holds no serials,
    so it does not depend on the order terms were built in. Memoized by serial and depth: a
    DAG's shared subterm is read once per level."""
    return _skeleton(term, SKELETON_DEPTH)


def _skeleton(term: Term, depth: int, memos: tuple[dict[int, tuple], ...] = _SKELETONS,
              through: frozenset[str] = frozenset()) -> tuple:
    """`skeleton` with its memos (by depth); `through`: ops read through to their first
    operand, and then arguments keep their index (`orientation_key`)."""
    while term.op in through and term.args:
        term = term.args[0]
    memo = memos[depth]
    found = memo.get(term.serial)
    if found is not None:
        return found
    head = (term.op, term.dtype)
    if through and term.op == "arg":
        out = head + (term.attrs[:1],)
    elif depth == 0 or not term.args:
        out = head + ((),)
    elif term.op == "lin":
        out = head + (tuple(sorted((c, _skeleton(t, depth - 1, memos, through))
                                   for c, t in zip(term.attrs[1], term.args))),)
    else:
        out = head + (tuple(sorted(_skeleton(t, depth - 1, memos, through)
                                   for t in term.args)),)
    memo[term.serial] = out
    return out


def _divided(c: Fraction, sign: int, numerator: int, denominator: int) -> Fraction:
    """c / k for the content k = sign * numerator / denominator, in integers:
    (p/q) / (s*g/l) = s * p * (l/q) / g (q divides l)."""
    scaled = sign * c.numerator * (denominator // c.denominator)
    return Fraction(scaled) if numerator == 1 else Fraction(scaled, numerator)


def _long_content(term: Term) -> tuple[Scalar, Term] | None:
    """`_factor_content` of a long lin (the residual stream minus its mean): the content from
    `_content_parts`, the inner sum `_scaled(term, 1/k)` (the same canonical form `make_lin`
    gives the divided pairs). None when a coefficient is not exact (the general path
    decides)."""
    parts = _content_parts(term)
    if parts is None:
        return None
    numerator, denominator = parts
    sign = content_sign(term.attrs[1], term.args)
    if numerator == 1 and denominator == 1 and sign == 1:
        return Fraction(1), term
    return Fraction(sign * numerator, denominator), _scaled(
        term, Fraction(sign * denominator, numerator))


_PARTS: dict[int, tuple[int, int] | None] = {}
"""serial of a long lin -> `_content_parts`."""


def _content_parts(term: Term) -> tuple[int, int] | None:
    """(gcd of the numerators, lcm of the denominators) of a long lin's nonzero coefficients
    and constant; None when one is not an exact rational. Follows `_DERIVED` steps down to a
    lin already known, then folds each step's added coefficients in."""
    chain = []
    at = term
    while at.serial not in _PARTS:
        step = _DERIVED.get(at.serial)
        if step is None:
            _PARTS[at.serial] = _parts_of(at)
            break
        chain.append(at)
        at = step[0]
    for derived in reversed(chain):
        base, added = _DERIVED[derived.serial]
        parts = _PARTS[base.serial]
        if parts is not None and all(type(k) is Fraction for k, _ in added):
            parts = (math.gcd(parts[0], *(k.numerator for k, _ in added)),
                     math.lcm(parts[1], *(k.denominator for k, _ in added)))
        else:
            parts = None
        _PARTS[derived.serial] = parts
    return _PARTS[term.serial]


def _parts_of(term: Term) -> tuple[int, int] | None:
    """`_content_parts` from the lin's distinct coefficients."""
    constant, coefs = term.attrs
    values = [c for c in dict(zip(lin_keys(term)[1], coefs)).values() if c != 0]
    if constant != 0:
        values.append(constant)
    if not all(type(v) is Fraction for v in values):
        return None
    return (math.gcd(*(v.numerator for v in values)),
            math.lcm(*(v.denominator for v in values)))


def _scaled(term: Term, factor: Fraction) -> Term:
    """`make_lin([(factor, term)], 0)` for a long lin and a nonzero exact factor: its distinct
    coefficients times the factor, interned directly (the arguments, sorted and nonzero, do
    not change, so this is the canonical form)."""
    constant, coefs = term.attrs
    serials, keys = lin_keys(term)
    distinct = dict(zip(keys, coefs))
    if type(constant) is not Fraction or not all(type(c) is Fraction for c in distinct.values()):
        return make_lin([(factor, term)], _ZERO, term.shape, term.dtype)
    new_of = {k: c * factor for k, c in distinct.items()}
    new_key_of = {k: _cheap(c) for k, c in new_of.items()}
    new_keys = tuple(map(new_key_of.__getitem__, keys))
    new_constant = constant * factor
    scaled = intern("lin", term.args, (new_constant, tuple(map(new_of.__getitem__, keys))),
                    term.shape, term.dtype, key_attrs=(_cheap(new_constant), new_keys),
                    arg_serials=serials)
    _LIN_KEYS[scaled.serial] = (serials, new_keys)
    return scaled


def lin_keys(term: Term) -> tuple[tuple[int, ...], tuple]:
    """(argument serials, coefficient keys) of a lin, remembered for long ones."""
    known = _LIN_KEYS.get(term.serial)
    if known is None:
        known = (tuple(a.serial for a in term.args), tuple(_cheap(c) for c in term.attrs[1]))
        if len(term.args) >= LONG_LIN:
            _LIN_KEYS[term.serial] = known
    return known


def _single_term(term: Term) -> bool:
    """A scaled single term `k * t`: linear ops pull k out. Sums are not distributed over
    broadcasts, reductions and slices (that would grow a residual stream's terms with depth);
    reshapes and transposes, which only relabel elements, do distribute."""
    return len(term.args) == 1 and term.attrs[0] == 0


def map_linear(term: Term, build) -> Term:
    """Push a linear map `build(t) -> Term` through a linear combination (constants included)."""
    pairs, constant = linear_parts(term)
    mapped = [(k, build(t)) for k, t in pairs]
    if constant != 0 or not pairs:
        const_term = build(make_splat(constant, term.shape, term.dtype))
        mapped.append((Fraction(1), const_term))
    if not mapped:
        raise AssertionError("empty linear combination")
    shape, dtype = mapped[0][1].shape, mapped[0][1].dtype
    return make_lin(mapped, Fraction(0), shape, dtype)


# ----- elementwise ---------------------------------------------------------------------------

COMMUTATIVE = frozenset(op for op, traits in ELEMENTWISE_OPS.items()
                        if traits.commutes and traits.term is None)
"""Commutative and associative ops that are their own term node: their operands are flattened
and sorted (add and multiply become `lin` and `mul`, whose builders do the same)."""


@_built("add", _pair_key)
def make_add(a: Term, b: Term) -> Term:
    return make_lin([(Fraction(1), a), (Fraction(1), b)], Fraction(0), a.shape, a.dtype)


@_built("sub", _pair_key)
def make_sub(a: Term, b: Term) -> Term:
    return make_lin([(Fraction(1), a), (Fraction(-1), b)], Fraction(0), a.shape, a.dtype)


@_built("mul", _pair_key)
def make_mul(a: Term, b: Term) -> Term:
    for x, y in ((a, b), (b, a)):
        value = splat_value(x)
        if isinstance(value, Fraction):
            return scale(y, value)
    ka, ta = factor_content(a)
    kb, tb = factor_content(b)
    factors = []
    for t in (ta, tb):
        factors.extend(t.args if t.op == "mul" else (t,))
    factors.sort(key=lambda t: t.serial)
    product = intern("mul", tuple(factors), (), a.shape, a.dtype)
    return scale(product, ka * kb) if ka * kb != 1 else product


@_built("div", _pair_key)
def make_div(a: Term, b: Term) -> Term:
    value = splat_value(b)
    if not _is_float(a.dtype):
        # integer division truncates: no scale moves through it (trunc(x / 2) * 2 is not x)
        if value == 1:
            return a
        return intern("div", (a, b), (), a.shape, a.dtype)
    if isinstance(value, Fraction) and value != 0:
        return scale(a, 1 / value)
    numerator = splat_value(a)
    if isinstance(numerator, Fraction) and numerator not in (0, 1) and _power_of_two(numerator):
        return scale(make_div(make_splat(1, a.shape, a.dtype), b), numerator)
    ka, ta = factor_content(a)
    kb, tb = factor_content(b)
    if not _power_of_two(kb):
        kb, tb = Fraction(1), b
    quotient = intern("div", (ta, tb), (), a.shape, a.dtype)
    return scale(quotient, ka / kb) if ka / kb != 1 else quotient


def _power_of_two(k) -> bool:
    """`k` is +-2^e: a float divisor scaled by it divides exactly as by the unscaled divisor
    scaled after, `x / (2^e * m) == 2^-e * (x / m)` (both round the one exact quotient, away
    from the ends of the range; that the regrouping may move an overflow or an underflow is
    liberty 1's, as a psum's order is: README, "What a proof assumes"). For
    any other k the divisor `k * m` is rounded before the division and `x / (k * m)` is not
    `(x / m) / k` (`x / (m / 127)` and `127 * (x / m)` differ in the last bit): the factor
    stays in the divisor. A numerator's factor moves out as a product's does (liberty 1),
    but a constant numerator `k` is the whole product: `k / m` rounds once, `k * (1 / m)`
    rounds the reciprocal first (`3 / m` and `3 * (1 / m)` differ in the last bit, as `x / m`
    and `x * (1 / m)` do), so k leaves it only as +-2^e."""
    if not isinstance(k, Fraction) or k == 0:
        return False
    n, d = abs(k.numerator), k.denominator
    return n & (n - 1) == 0 and d & (d - 1) == 0


def make_elementwise(op: str, args: tuple[Term, ...], attrs: tuple = (),
                     dtype: str | None = None) -> Term:
    """Generic elementwise op; arithmetic ops route to their canonical builders."""
    return _make_elementwise(op, tuple(args), attrs, dtype)


BOOLEAN_MEANING = MappingProxyType({
    "stablehlo.add": "stablehlo.or",
    "stablehlo.multiply": "stablehlo.and",
    "stablehlo.maximum": "stablehlo.or",
    "stablehlo.minimum": "stablehlo.and",
})
"""What an arithmetic op computes on booleans (i1), as StableHLO defines it: add is logical
or, multiply logical and, and maximum and minimum are or and and in the order false < true.
A term of dtype i1 is built with the logical op, never as a number (`m + m` on i1 is `m`;
converted to f32 first it is `2m`)."""

BOOLEAN_UNDEFINED = frozenset({
    "stablehlo.subtract", "stablehlo.negate", "stablehlo.divide", "stablehlo.remainder",
    "stablehlo.abs", "stablehlo.sign", "stablehlo.power", "chlo.square"})
"""Arithmetic ops StableHLO does not define on booleans: no i1 term is built with them."""


def exact_conversion(source: str, target: str) -> bool:
    """Converting `source` to `target` keeps every value: `precision.exact_convert` (floats
    into wider floats, small integers into floats, booleans into anything) or an integer type
    into one whose range holds it. Narrowing integers wrap; floats to integers truncate; wider
    floats to narrower ones round."""
    if precision.exact_convert(source, target):
        return True
    return integer_dtype(source) and integer_dtype(target) and exact_int_convert(source, target)


def exact_origin(term: Term) -> Term:
    """The value under `term`'s exact converts (`make_convert`): `x` for `convert(x)` when
    every value of x's dtype is one of the convert's. A later convert to any dtype that holds
    every value of `x`'s is exact on it, whatever it does to other values (bf16 -> f32 ->
    bf16 rounds nothing; i8 -> f32 -> i32 truncates nothing)."""
    while True:
        if term.op == "stablehlo.convert" and len(term.args) == 1 and not term.attrs and \
                exact_conversion(term.args[0].dtype, term.dtype):
            term = term.args[0]
        elif is_indicator(term):
            return term.args[0]
        else:
            return term


def indicator(pred: Term, dtype: str) -> Term:
    """The boolean `pred` as the numbers 1 and 0 of `dtype` (a convert of a boolean, jax's
    `mask.astype(f32)`): `select(pred, 1, 0)`, one node for every spelling of it."""
    one, zero = make_splat(1, pred.shape, dtype), make_splat(0, pred.shape, dtype)
    return make_elementwise("stablehlo.select", (pred, one, zero), (), dtype)


def is_indicator(term: Term) -> bool:
    """`term` is `indicator(p, dtype)` for a boolean p."""
    return (term.op == "stablehlo.select" and term.args[0].dtype == "i1"
            and term.dtype != "i1" and splat_value(term.args[1]) == 1
            and splat_value(term.args[2]) == 0)


def make_convert(term: Term, dtype: str) -> Term:
    """`term` converted to `dtype` by a convert that keeps every value (`exact_conversion`:
    the caller's to decide). The values are the same but the term carries `dtype`, so the
    arithmetic over it is `dtype`'s (a boolean converted to f32 is the number 0 or 1 and adds
    as a number; converted to i8 it wraps as an i8). Canonical: a constant becomes the same
    constant in `dtype` (false and true as 0 and 1), a boolean its `indicator`, a chain of
    exact converts is one convert, a select of constants selects the converted constants, and
    the convert sinks below broadcasts and transposes (they move elements, it maps each), so
    the programs meet wherever they place it (a reshape moves inward itself,
    `make_reshape`)."""
    if term.dtype == dtype:
        return term
    if term.op == "splat":
        value = term.attrs[0]
        if term.dtype == "i1":
            value = Fraction(int(bool(value)))
        return make_splat(value, term.shape, dtype)
    origin = exact_origin(term)
    if origin is not term:
        return make_convert(origin, dtype)
    if term.op == "broadcast":
        return make_broadcast(make_convert(term.args[0], dtype), term.attrs[0], term.shape)
    if term.op == "transpose":
        return make_transpose(make_convert(term.args[0], dtype), term.attrs[0])
    if term.dtype == "i1":
        return indicator(term, dtype)
    if term.op == "stablehlo.select" and all(a.op == "splat" for a in term.args[1:]):
        branches = (make_convert(a, dtype) for a in term.args[1:])
        return make_elementwise("stablehlo.select", (term.args[0], *branches), (), dtype)
    return intern("stablehlo.convert", (term,), (), term.shape, dtype)


@_built("elementwise", lambda op, args, attrs, dtype: (op, tuple(a.serial for a in args), attrs,
                                                      dtype))
def _make_elementwise(op: str, args: tuple[Term, ...], attrs: tuple, dtype: str | None) -> Term:
    if dtype is None and op == "stablehlo.select":
        dtype = args[1].dtype  # a select's values are its branches', not its predicate's
    if (dtype or args[0].dtype) == "i1" and op in BOOLEAN_MEANING:
        op = BOOLEAN_MEANING[op]
    if op == "stablehlo.convert" and dtype is not None:
        origin = exact_origin(args[0])
        if exact_conversion(origin.dtype, dtype) and (origin is not args[0] or not attrs):
            return make_convert(origin, dtype)
    if op == "stablehlo.add":
        return make_add(*args)
    if op == "stablehlo.subtract":
        return make_sub(*args)
    if op == "stablehlo.negate":
        return scale(args[0], -1)
    if op == "stablehlo.multiply":
        return make_mul(*args)
    if op == "stablehlo.divide":
        return make_div(*args)
    if op == "chlo.square":
        return make_mul(args[0], args[0])
    if op == "stablehlo.select" and len(args) == 3:
        masked = _select_on_iota_mask(*args)
        if masked is not None:
            return masked
    if op == "stablehlo.select":
        pulled = _select_content(*args, dtype or args[1].dtype)
        if pulled is not None:
            return pulled
        spread = _select_constants(*args, dtype or args[1].dtype)
        if spread is not None:
            return spread
    if op in COMMUTATIVE:
        flat = []
        for arg in args:
            flat.extend(arg.args if arg.op == op else (arg,))
        if op == "stablehlo.xor":
            ordered = tuple(sorted(flat, key=lambda t: t.serial))
            return intern(op, ordered, attrs, ordered[0].shape, dtype or ordered[0].dtype)
        unique = {t.serial: t for t in flat}
        if op in ("stablehlo.maximum", "stablehlo.minimum"):
            neutral = float("-inf") if op == "stablehlo.maximum" else float("inf")
            unique = {s: t for s, t in unique.items() if splat_value(t) != neutral} or unique
        ordered = tuple(unique[s] for s in sorted(unique))
        if len(ordered) == 1:
            return ordered[0]
        args = ordered
    shape = args[0].shape
    return intern(op, tuple(args), attrs, shape, dtype or args[0].dtype)


FLIPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}
"""A comparison direction with its operands swapped."""


def iota_interval(pred: Term) -> tuple[int, int, int] | None:
    """(dim, lo, hi) when `pred` is true exactly at positions lo <= i < hi along dim: a compare
    of an iota (plus an integer constant) with an integer constant, as XLA masks the padding
    of uneven shards and jax masks a prefix; the `and` of such masks along one dim is their
    intersection (XLA masks both ends of a padded split dim)."""
    if pred.op == "stablehlo.and" and pred.args:
        parts = [iota_interval(arg) for arg in pred.args]
        if any(p is None for p in parts) or len({p[0] for p in parts}) != 1:
            return None
        return parts[0][0], max(p[1] for p in parts), min(p[2] for p in parts)
    if pred.op != "stablehlo.compare" or len(pred.args) != 2 or len(pred.attrs) != 1:
        return None
    a, b = pred.args
    direction = pred.attrs[0]
    if splat_value(a) is not None:
        a, b, direction = b, a, FLIPPED.get(direction)
    bound = splat_value(b)
    if not isinstance(bound, Fraction) or direction not in ("LT", "LE", "GT", "GE", "EQ"):
        return None
    pairs, constant = linear_parts(a)
    if len(pairs) != 1 or pairs[0][0] != 1 or not isinstance(constant, Fraction):
        return None
    base = pairs[0][1]
    if base.op == "iota":
        dim = 0
    elif base.op == "broadcast" and base.args[0].op == "iota" and len(base.args[0].shape) == 1:
        dim = base.attrs[0][0]
    else:
        return None
    size = base.shape[dim]
    if not _iota_plus_exact(size, constant, base.dtype, a.dtype):
        return None  # the iota or the add wraps around (ints) or rounds (floats)
    c = bound - constant
    if c.denominator != 1 and not base.dtype.startswith(("f", "bf")):
        return None
    if direction == "EQ" and c.denominator != 1:
        return dim, 0, 0
    lo, hi = {"LT": (0, math.ceil(c)), "LE": (0, math.floor(c) + 1),
              "GT": (math.floor(c) + 1, size), "GE": (math.ceil(c), size),
              "EQ": (int(c), int(c) + 1)}[direction]
    return dim, max(0, min(lo, size)), max(0, min(hi, size))


def _iota_plus_exact(size: int, constant: Fraction, iota_dtype: str, dtype: str) -> bool:
    """Every value of `iota + constant` (iota of `size` positions) is computed exactly: the
    iota's positions are values of its dtype, and the sums neither wrap (integers) nor round
    (floats: a constant with a power-of-two denominator 2^e scales the check by 2^e)."""
    if not fits(Fraction(0), Fraction(size - 1), iota_dtype):
        return False
    lo, hi = constant, constant + size - 1
    if constant.denominator == 1:
        return fits(lo, hi, dtype)
    den = constant.denominator
    if den & (den - 1) or not _is_float(dtype):
        return False
    return fits(lo * den, hi * den, dtype)


def _select_on_iota_mask(pred: Term, on_true: Term, on_false: Term) -> Term | None:
    """select on an iota interval mask with a constant on the other side: the kept interval
    of the other operand, padded with the constant (XLA's padding masks, jnp.pad of a split
    dim); an empty or full interval picks one operand."""
    found = iota_interval(pred)
    if found is None or on_true.shape != pred.shape or on_false.shape != pred.shape:
        return None
    dim, lo, hi = found
    size = pred.shape[dim]
    if lo >= hi:
        return on_false
    if lo == 0 and hi == size:
        return on_true
    if on_false.op == "splat":
        keep, value, (k_lo, k_hi) = on_true, on_false, (lo, hi)
    elif on_true.op == "splat" and (lo == 0 or hi == size):
        keep, value = on_false, on_true
        k_lo, k_hi = (hi, size) if lo == 0 else (0, lo)
    else:
        return None
    rank = len(pred.shape)
    starts = tuple(k_lo if d == dim else 0 for d in range(rank))
    limits = tuple(k_hi if d == dim else n for d, n in enumerate(pred.shape))
    kept = _sliced(keep, starts, limits, (1,) * rank)
    low = tuple(k_lo if d == dim else 0 for d in range(rank))
    high = tuple(size - k_hi if d == dim else 0 for d in range(rank))
    return make_pad(kept, make_splat(value.attrs[0], (), value.dtype), low, high, (0,) * rank)


def _select_content(pred: Term, a: Term, b: Term, dtype: str) -> Term | None:
    """`select(p, k*A, k*B)` (or a constant branch c, taken as k*(c/k)) as `k * select(p, A,
    B)`: a scale applied before a mask (the causal mask's gradient) meets one applied after."""
    if not _is_float(dtype):
        return None
    va, vb = splat_value(a), splat_value(b)
    if va is not None and vb is not None:
        return None
    ka, ta = factor_content(a) if va is None else (None, a)
    kb, tb = factor_content(b) if vb is None else (None, b)
    k = ka if ka is not None else kb
    if k == 1 or k == 0 or (ka is not None and kb is not None and ka != kb):
        return None
    for value in (va, vb):
        if value is not None and not isinstance(value, Fraction):
            return None
    ta = make_splat(va / k, a.shape, a.dtype) if va is not None else ta
    tb = make_splat(vb / k, b.shape, b.dtype) if vb is not None else tb
    inner = intern("stablehlo.select", (pred, ta, tb), (), a.shape, dtype)
    return scale(inner, k)


def _select_constants(pred: Term, a: Term, b: Term, dtype: str) -> Term | None:
    """`select(p, c1, c0)` of two finite float constants as `c0 + (c1 - c0) * indicator(p)`:
    exact (it is c1 where p holds, c0 elsewhere), and the form a scaled converted mask takes
    (`k * mask.astype(f32)`, a one-hot's cotangent), so the two spellings meet."""
    va, vb = splat_value(a), splat_value(b)
    if not (_is_float(dtype) and pred.dtype == "i1" and isinstance(va, Fraction)
            and isinstance(vb, Fraction)) or (va, vb) == (1, 0) or va == vb:
        return None
    return make_lin([(va - vb, indicator(pred, dtype))], vb, a.shape, dtype)


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("f", "bf"))


# ----- data movement ------------------------------------------------------------------------

def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]
                    ) -> list[tuple[list[int], list[int]]] | None:
    """Pair up runs of dims with equal products; unit dims join the following group."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        src_dims, dst_dims = [], []
        while i < len(src) and src[i] == 1:
            src_dims.append(i)
            i += 1
        while j < len(dst) and dst[j] == 1:
            dst_dims.append(j)
            j += 1
        src_product = dst_product = 1
        if i < len(src):
            src_dims.append(i)
            src_product = src[i]
            i += 1
        if j < len(dst):
            dst_dims.append(j)
            dst_product = dst[j]
            j += 1
        while src_product != dst_product:
            if src_product < dst_product and i < len(src):
                src_product *= src[i]
                src_dims.append(i)
                i += 1
            elif dst_product < src_product and j < len(dst):
                dst_product *= dst[j]
                dst_dims.append(j)
                j += 1
            else:
                return None
        groups.append((src_dims, dst_dims))
    return groups


@_built("reshape", lambda term, shape: (term.serial, tuple(shape)))
def make_reshape(term: Term, shape: tuple[int, ...]) -> Term:
    """Reshapes are pushed inward (through elementwise ops, broadcasts of created dims and the
    free dims of a dot_general) so that flattening tokens before a matmul and reshaping after
    it meet the unflattened computation in one normal form."""
    shape = tuple(shape)
    if term.shape == shape:
        return term
    if term.op == "splat":
        return make_splat(term.attrs[0], shape, term.dtype)
    if term.op == "lin":
        return map_linear(term, lambda t: make_reshape(t, shape))
    if term.op == "reshape":
        return make_reshape(term.args[0], shape)
    if _is_elementwise(term):
        return rebuild_elementwise(term, tuple(make_reshape(a, shape) for a in term.args))
    pushed = None
    if term.op == "broadcast":
        pushed = _reshape_broadcast(term, shape) or _repeat_of_repeat(term, shape)
    elif term.op == "stablehlo.dot_general":
        pushed = _reshape_dot(term, shape)
    if pushed is not None:
        return pushed
    collapsed = _collapse_movement(term, None, shape)
    if collapsed is not None:
        return collapsed
    return intern("reshape", (term,), (), shape, term.dtype)


MOVEMENT_CHECK_ELEMENTS = 1 << 20
"""Reshape/transpose chains over at most this many elements are checked for collapsing."""


def _collapse_movement(term: Term, perm: tuple[int, ...] | None,
                       shape: tuple[int, ...]) -> Term | None:
    """A chain of reshapes and transposes (ending in `transpose(term, perm)` or
    `reshape(term, shape)`) that moves no element: a plain reshape of the chain's base. The
    chain is evaluated exactly on element positions (`np.arange`), so any spelling of a
    reshard through all_to_all + transpose + reshape meets its source again."""
    if term.op not in ("reshape", "transpose"):
        return None
    steps = [("transpose", perm) if perm is not None else ("reshape", shape)]
    base = term
    while base.op in ("reshape", "transpose") and len(steps) < 16:
        steps.append(("transpose", base.attrs[0]) if base.op == "transpose"
                     else ("reshape", base.shape))
        base = base.args[0]
    if not any(kind == "transpose" for kind, _ in steps) or math.prod(
            base.shape) > MOVEMENT_CHECK_ELEMENTS:
        return None
    if not _moves_no_element(base.shape, tuple(reversed(steps))):
        return None
    final = steps[0][1] if steps[0][0] == "reshape" else tuple(
        term.shape[p] for p in steps[0][1])
    return make_reshape(base, tuple(final))


@functools.lru_cache(maxsize=4096)
def _moves_no_element(shape: tuple[int, ...], steps: tuple[tuple[str, tuple], ...]) -> bool:
    """Whether applying `steps` (("transpose", perm) or ("reshape", shape), first to last) to a
    tensor of `shape` leaves every element at its row-major position. Memoized: a deep model
    repeats the same chains in every layer, and each evaluation walks every element."""
    import numpy as np  # lazy: terms are pure Python; numpy only to check a movement chain

    positions = np.arange(math.prod(shape)).reshape(shape)
    for kind, attr in steps:
        positions = (np.transpose(positions, attr) if kind == "transpose"
                     else positions.reshape(attr))
    return bool(np.array_equal(positions.reshape(-1), np.arange(positions.size)))


ARITHMETIC_TERM_OPS = ("lin", "mul", "div")
"""Term nodes (not StableHLO ops) for elementwise arithmetic, whose every argument has the
term's shape: `lin` a linear combination (add, subtract, negate, scaling by constants), `mul`
a product, `div` a quotient (`core/traits.py` `Traits.term` says which ops become which)."""


def typed_product(product: Term, dtype: str) -> Term:
    """A product rebuilt from factors of other element types than its own (an i1 mask times
    i32 values) in its own type `dtype`: `make_mul` takes its first factor's."""
    if product.op == "mul" and product.dtype != dtype:
        return intern("mul", product.args, (), product.shape, dtype)
    return product


def rebuild_elementwise(term: Term, args: tuple[Term, ...]) -> Term:
    """The same elementwise op on new operands, through the canonical builders (so sorted
    operands stay sorted and scalars are pulled out again)."""
    if term.op == "mul":
        product = args[0]
        for factor in args[1:]:
            product = make_mul(product, factor)
        return typed_product(product, term.dtype)
    if term.op == "div":
        return make_div(*args)
    return make_elementwise(term.op, args, term.attrs, dtype=term.dtype)


def _is_elementwise(term: Term) -> bool:
    """Terms whose every argument has the term's shape and which act elementwise, `lin`
    excepted (callers map through its terms, `map_linear`, first)."""
    if term.op in ARITHMETIC_TERM_OPS:
        return term.op != "lin"
    return term.op in ELEMENTWISE_STABLEHLO and all(a.shape == term.shape for a in term.args)


ELEMENTWISE_STABLEHLO = frozenset(op for op, traits in ELEMENTWISE_OPS.items()
                                  if traits.term is None)
"""Elementwise ops that are term nodes of their own name (the others become `lin`, `mul` or
`div`)."""


def _reshape_broadcast(term: Term, shape: tuple[int, ...]) -> Term | None:
    """reshape(broadcast(y)) as one broadcast when the reshape only regroups created dims,
    or splits a dim of y (then the broadcast of y reshaped alike)."""
    (dims,) = term.attrs
    operand = term.args[0]
    groups = reshape_groups(term.shape, shape)
    if groups is None:
        return None
    targets: list[list[int] | None] = [None for _ in dims]
    for src, dst in groups:
        kept = [d for d in src if d in dims]
        if not kept:
            continue
        real_src = [d for d in src if term.shape[d] != 1]
        real_dst = [d for d in dst if shape[d] != 1]
        if (len(kept) != 1 or len(real_src) > 1 or not real_dst
                or operand.shape[dims.index(kept[0])] != term.shape[kept[0]]
                or (len(real_dst) > 1 and real_src != kept)):
            return None
        targets[dims.index(kept[0])] = real_dst
    if any(target is None for target in targets):
        return None  # every kept dim lies in one group; defensive
    new_dims = [d for t in targets for d in t]
    if sorted(new_dims) != new_dims or len(set(new_dims)) != len(new_dims):
        return None
    if len(new_dims) != len(dims):
        operand = make_reshape(operand, tuple(
            n for i, n in enumerate(operand.shape)
            for n in ([shape[d] for d in targets[i]] if len(targets[i]) > 1 else [n])))
    return make_broadcast(operand, tuple(new_dims), shape)


def _movement_chain(term: Term) -> tuple[Term, list[tuple[str, tuple]]]:
    """(base, steps): `term` as reshapes, transposes and broadcasts (first to last) of the
    first term down its chain that is none of them."""
    steps: list[tuple[str, tuple]] = []
    while term.op in ("reshape", "transpose", "broadcast"):
        steps.append(("reshape", term.shape) if term.op == "reshape" else
                     (term.op, term.attrs[0]) if term.op == "transpose" else
                     ("broadcast", (term.attrs[0], term.shape)))
        term = term.args[0]
    steps.reverse()
    return term, steps


def _spell(base: Term, plan: Plan) -> Term:
    """`plan` over `base`: reshape to the moving digits, transpose, broadcast the repeats in,
    reshape to the result (`repeats.Plan`)."""
    moved = make_transpose(make_reshape(base, plan.split), plan.perm)
    return make_reshape(make_broadcast(moved, plan.dims, plan.wide), plan.out)


def _repeat_of_repeat(term: Term, shape: tuple[int, ...]) -> Term | None:
    """reshape(broadcast(...)) over a chain holding another broadcast (a repeat of a repeat:
    a coarse block of K/V heads repeated locally, `jnp.repeat` of a repeat) in the one
    spelling of its index map (`repeats.plan_of`), as the single repeat is spelled."""
    base, steps = _movement_chain(term)
    if sum(kind == "broadcast" for kind, _ in steps) < 2:
        return None
    plan = plan_of(base.shape, (*steps, ("reshape", tuple(shape))))
    if plan is None or len(plan.dims) == len(plan.wide):
        return None
    return _spell(base, plan)


def _reshape_dot(term: Term, shape: tuple[int, ...]) -> Term | None:
    """reshape(dot_general(a, b)) as dot_general(reshape(a), b) when only a's free dims regroup
    (and likewise for b's)."""
    lhs, rhs = term.args
    lb, rb, lc, rc = term.attrs
    lhs_free = [d for d in range(len(lhs.shape)) if d not in lb and d not in lc]
    rhs_free = [d for d in range(len(rhs.shape)) if d not in rb and d not in rc]
    n_batch, n_lf = len(lb), len(lhs_free)
    groups = reshape_groups(term.shape, shape)
    if groups is None:
        return None
    sections = {"batch": range(n_batch), "lhs": range(n_batch, n_batch + n_lf),
                "rhs": range(n_batch + n_lf, len(term.shape))}
    changed = None
    for src, dst in groups:
        owner = {name for name, rng in sections.items() for d in src if d in rng}
        if len(owner) != 1:
            return None
        if [term.shape[d] for d in src] == [shape[d] for d in dst]:
            continue
        if "batch" in owner or (changed and changed != owner):
            return None
        changed = owner
    if changed is None:
        return None
    side = changed.pop()
    operand, free = (lhs, lhs_free) if side == "lhs" else (rhs, rhs_free)
    if free != list(range(free[0], free[0] + len(free))) if free else True:
        return None
    rng = sections[side]
    new_out_dims = [d for src, dst in groups for d in dst if any(s in rng for s in src)]
    new_free_sizes = [shape[d] for d in new_out_dims]
    start = free[0]
    new_shape = operand.shape[:start] + tuple(new_free_sizes) + operand.shape[start + len(free):]
    delta = len(new_free_sizes) - len(free)

    def shift(ds):
        return tuple(d + delta if d > start else d for d in ds)

    new_operand = make_reshape(operand, new_shape)
    if side == "lhs":
        attrs = (shift(lb), rb, shift(lc), rc)
        return make_dot(new_operand, rhs, attrs, shape, term.dtype)
    attrs = (lb, shift(rb), lc, shift(rc))
    return make_dot(lhs, new_operand, attrs, shape, term.dtype)


@_built("transpose", lambda term, perm: (term.serial, tuple(perm)))
def make_transpose(term: Term, perm: tuple[int, ...]) -> Term:
    perm = tuple(perm)
    shape = tuple(term.shape[p] for p in perm)
    if perm == tuple(range(len(perm))):
        return term
    if term.op == "splat":
        return make_splat(term.attrs[0], shape, term.dtype)
    if term.op == "lin":
        return map_linear(term, lambda t: make_transpose(t, perm))
    if term.op == "transpose":
        inner = term.attrs[0]
        return make_transpose(term.args[0], tuple(inner[p] for p in perm))
    if term.op == "stablehlo.dot_general":
        swapped = _transposed_dot(term, perm)
        if swapped is not None:
            return swapped
    collapsed = _collapse_movement(term, perm, shape)
    if collapsed is not None:
        return collapsed
    return intern("transpose", (term,), (perm,), shape, term.dtype)


@_built("broadcast", lambda term, dims, shape: (term.serial, tuple(dims), tuple(shape)))
def make_broadcast(term: Term, dims: tuple[int, ...], shape: tuple[int, ...]) -> Term:
    """broadcast_in_dim: operand dim i becomes result dim dims[i] (size equal or from 1)."""
    dims, shape = tuple(dims), tuple(shape)
    if term.op == "splat":
        return make_splat(term.attrs[0], shape, term.dtype)
    if term.op == "lin" and _single_term(term):
        return map_linear(term, lambda t: make_broadcast(t, dims, shape))
    if term.op == "lin":
        k, inner = factor_content(term)
        if k != 1:
            return scale(make_broadcast(inner, dims, shape), k)
    if dims == tuple(range(len(shape))) and term.shape == shape:
        return term
    widened = [i for i, d in enumerate(dims) if term.shape[i] == 1]
    if widened and math.prod(term.shape) != math.prod(shape):
        keep = [i for i in range(len(dims)) if i not in widened]
        operand = make_reshape(term, tuple(term.shape[i] for i in keep))
        return make_broadcast(operand, tuple(dims[i] for i in keep), shape)
    expanding = math.prod(term.shape) != math.prod(shape)
    if not expanding and list(dims) == sorted(dims):
        return make_reshape(term, shape)
    if term.op == "broadcast":
        inner_dims = term.attrs[0]
        return make_broadcast(term.args[0], tuple(dims[d] for d in inner_dims), shape)
    return intern("broadcast", (term,), (dims,), shape, term.dtype)


def make_op(op: str, args: tuple[Term, ...], attrs: tuple, shape: tuple[int, ...],
            dtype: str, linear_in: int | None = None) -> Term:
    """A generic op; when `linear_in` is given, the op is linear in that operand and scalars
    and sums are pulled out of it (slice, pad with zero, reduce-sum). Slices are pushed toward
    the leaves (`push_slice`) and a reduce-sum drops zero padding of the dims it reduces."""
    return _make_op(op, tuple(args), attrs, tuple(shape), dtype, linear_in)


@_built("op", lambda op, args, attrs, shape, dtype, linear_in: (
    op, tuple(a.serial for a in args), attrs, shape, dtype, linear_in))
def _make_op(op: str, args: tuple[Term, ...], attrs: tuple, shape: tuple[int, ...],
             dtype: str, linear_in: int | None) -> Term:
    if op == "slice" and linear_in == 0:
        pushed = push_slice(args[0], *attrs)
        if pushed is not None:
            return pushed
    if op == "reduce_sum" and linear_in == 0:
        merged = _merge_sums(args[0], attrs[0], shape, dtype)
        if merged is not None:
            return merged
    if op == "reduce_sum" and linear_in == 0 and args[0].op == "pad":
        dropped = _reduce_sum_of_pad(args[0], attrs[0], shape, dtype)
        if dropped is not None:
            return dropped
    if op in _ZERO_OF_ZERO and linear_in == 0 and splat_value(args[0]) == 0 and (
            op != "pad" or splat_value(args[1]) == 0):
        return make_splat(0, tuple(shape), dtype)
    if linear_in is not None:
        arg = args[linear_in]
        if arg.op == "lin" and _single_term(arg) or arg.op == "splat" and splat_value(arg) != 0:
            pairs, constant = linear_parts(arg)
            if constant == 0:
                mapped = [(k, make_op(op, args[:linear_in] + (t,) + args[linear_in + 1:],
                                      attrs, shape, dtype, linear_in)) for k, t in pairs]
                return make_lin(mapped, Fraction(0), shape, dtype)
        value = splat_value(arg)
        if isinstance(value, Fraction) and value not in (0, 1):
            one = make_splat(1, arg.shape, arg.dtype)
            inner_op = make_op(op, args[:linear_in] + (one,) + args[linear_in + 1:], attrs,
                               shape, dtype, linear_in)
            return scale(inner_op, value)
        if arg.op == "lin":
            k, inner = factor_content(arg)
            if k != 1:
                inner_op = make_op(op, args[:linear_in] + (inner,) + args[linear_in + 1:], attrs,
                                   shape, dtype, linear_in)
                return scale(inner_op, k)
    return intern(op, tuple(args), attrs, tuple(shape), dtype)


_ZERO_OF_ZERO = frozenset({"reduce_sum", "slice", "reduce_window_sum", "stablehlo.gather",
                           "pad"})
"""Ops linear in their first operand that give zeros from zeros (a pad only with a zero
padding value): their result is the zero splat, exactly."""


def make_roll(term: Term, dim: int, shift: int) -> Term:
    """`jnp.roll(term, shift, dim)` as jax lowers it: the last `shift` rows then the rest,
    `concatenate(slice(term, N-shift:N), slice(term, 0:N-shift))`; rolls of rolls add up."""
    size = term.shape[dim]
    shift %= size
    if shift == 0 or term.op == "splat":
        return term
    rolled = roll_parts(term, dim)
    if rolled is not None:
        return make_roll(rolled[0], dim, rolled[1] + shift)
    rank = len(term.shape)

    def rows(start: int, stop: int) -> Term:
        starts = tuple(start if d == dim else 0 for d in range(rank))
        limits = tuple(stop if d == dim else term.shape[d] for d in range(rank))
        shape = tuple(stop - start if d == dim else term.shape[d] for d in range(rank))
        return make_op("slice", (term,), (starts, limits, (1,) * rank), shape, term.dtype,
                       linear_in=0)

    rolled = intern("concatenate", (rows(size - shift, size), rows(0, size - shift)), (dim,),
                    term.shape, term.dtype)
    _ROLLS[(rolled.serial, dim)] = (term, shift)
    return rolled


_ROLLS: dict[tuple[int, int], tuple[Term, int]] = {}
"""(roll serial, dim) -> (base, shift) for every roll `make_roll` built: slices are pushed
into the rolled term's operands, so its written-out form is not always recognisable."""


def roll_parts(term: Term, dim: int) -> tuple[Term, int] | None:
    """(base, shift) when `term` is `make_roll(base, dim, shift)` written out, else None."""
    if (term.serial, dim) in _ROLLS:
        return _ROLLS[(term.serial, dim)]
    if term.op != "concatenate" or term.attrs != (dim,) or len(term.args) != 2:
        return None
    first, second = term.args
    if first.op != "slice" or second.op != "slice" or first.args != second.args:
        return None
    base = first.args[0]
    size, rank = base.shape[dim], len(base.shape)
    shift = first.shape[dim]
    for part, start in ((first, size - shift), (second, 0)):
        starts, limits, strides = part.attrs
        for d in range(rank):
            want = (start, start + part.shape[d]) if d == dim else (0, base.shape[d])
            if (starts[d], limits[d]) != want or strides[d] != 1:
                return None
    return base, shift


def make_pad(term: Term, value: Term, low: tuple[int, ...], high: tuple[int, ...],
             interior: tuple[int, ...]) -> Term:
    """stablehlo.pad of `term` with the scalar term `value` (no padding: the term itself)."""
    low, high, interior = tuple(low), tuple(high), tuple(interior)
    if not any(low) and not any(high) and not any(interior):
        return term
    shape = tuple(lo + n + max(n - 1, 0) * k + hi
                  for lo, n, hi, k in zip(low, term.shape, high, interior))
    return intern("pad", (term, value), (low, high, interior), shape, term.dtype)


def _squeezed(shape: tuple[int, ...]) -> list[int]:
    """The positions of the non-unit dims of `shape`."""
    return [d for d, n in enumerate(shape) if n != 1]


def _merge_sums(arg: Term, dims: tuple[int, ...], shape: tuple[int, ...],
                dtype: str) -> Term | None:
    """One normal form for sums of sums (exact: finite sums commute and associate):

    * a sum over unit dims only is a reshape (it drops them);
    * a sum of a reshape that only adds or drops unit dims sums its operand over the
      corresponding dims, then reshapes;
    * a sum of a sum is one sum over both sets of dims.

    jax's transpose of a broadcast sums a gradient in pieces (over batch and sequence, then
    over the unit dims a keepdims broadcast added), and where the batch is split over dp with
    one row per device the pieces are cut differently (seq locally, batch by the all_reduce):
    both meet as one sum over batch and sequence. None: not such a sum."""
    dims = tuple(sorted(set(dims)))
    real = [d for d in dims if arg.shape[d] != 1]
    base, base_dims = arg, real
    if arg.op == "reshape" and _squeezed(arg.shape) and len(_squeezed(arg.shape)) == len(
            _squeezed(arg.args[0].shape)) and all(
            arg.shape[a] == arg.args[0].shape[b]
            for a, b in zip(_squeezed(arg.shape), _squeezed(arg.args[0].shape))):
        position = dict(zip(_squeezed(arg.shape), _squeezed(arg.args[0].shape)))
        base, base_dims = arg.args[0], [position[d] for d in real]
    if base.op == "reduce_sum" and base_dims:
        inner = base.args[0]
        kept = [d for d in range(len(inner.shape)) if d not in base.attrs[0]]
        base_dims = sorted(set(base.attrs[0]) | {kept[d] for d in base_dims})
        base = inner
    if base is arg and tuple(base_dims) == dims:
        return None
    if not base_dims:
        return make_reshape(base, shape)
    summed_shape = tuple(n for d, n in enumerate(base.shape) if d not in base_dims)
    if [summed_shape[d] for d in _squeezed(summed_shape)] != [shape[d] for d in _squeezed(
            shape)]:
        return None
    summed = make_op("reduce_sum", (base,), (tuple(base_dims),), summed_shape, dtype,
                     linear_in=0)
    return make_reshape(summed, shape)


def _reduce_sum_of_pad(pad: Term, dims: tuple[int, ...], shape: tuple[int, ...],
                       dtype: str) -> Term | None:
    """reduce_sum over `dims` of a zero-padded term: the padding of reduced dims adds zeros,
    so it is dropped; the padding of kept dims pads the (smaller) sum."""
    inner, value = pad.args
    low, high, interior = pad.attrs
    if splat_value(value) != 0 or any(interior):
        return None
    summed = make_op("reduce_sum", (inner,), (tuple(dims),), tuple(
        s for d, s in enumerate(inner.shape) if d not in dims), dtype, linear_in=0)
    kept = [d for d in range(len(pad.shape)) if d not in dims]
    return make_pad(summed, value, tuple(low[d] for d in kept), tuple(high[d] for d in kept),
                    (0,) * len(kept))


_SLICE_MEMO: dict[tuple, Term] = {}


def _sliced(term: Term, starts, limits, strides) -> Term:
    shape = tuple(len(range(s, lim, st)) for s, lim, st in zip(starts, limits, strides))
    return make_op("slice", (term,), (tuple(starts), tuple(limits), tuple(strides)), shape,
                   term.dtype, linear_in=0)


def push_slice(term: Term, starts, limits, strides) -> Term | None:
    """slice(term) pushed toward the leaves, so that slicing before or after a computation
    meets in one normal form (XLA computes uneven shapes padded and slices at the end):
    through elementwise ops and sums, broadcasts, transposes, the free and batch dims of a
    dot_general, into one piece of a concatenate or the unpadded part of a pad; slices of
    slices compose and a slice of a constant is a constant. None: nothing to push (the
    caller interns the slice)."""
    starts, limits, strides = tuple(starts), tuple(limits), tuple(strides)
    if starts == (0,) * len(starts) and limits == term.shape and all(s == 1 for s in strides):
        return term
    key = (term.serial, starts, limits, strides)
    found = _SLICE_MEMO.get(key)
    if found is None:
        found = _push_slice(term, starts, limits, strides)
        if found is not None:
            _SLICE_MEMO[key] = found
    return found


def _push_slice(term: Term, starts, limits, strides) -> Term | None:
    shape = tuple(len(range(s, lim, st)) for s, lim, st in zip(starts, limits, strides))
    op = term.op
    if op == "splat":
        return make_splat(term.attrs[0], shape, term.dtype)
    if op == "iota":
        # a window of the 1-D iota is stride * iota + start
        fresh = make_iota(shape, 0, term.dtype)
        return make_lin([(Fraction(strides[0]), fresh)], Fraction(starts[0]), shape, term.dtype)
    if op == "lin":
        return map_linear(term, lambda t: _sliced(t, starts, limits, strides))
    if _is_elementwise(term):
        return rebuild_elementwise(term, tuple(_sliced(a, starts, limits, strides)
                                               for a in term.args))
    if op == "slice":
        s0, _, st0 = term.attrs
        new_starts = tuple(a + b * c for a, b, c in zip(s0, starts, st0))
        new_strides = tuple(a * b for a, b in zip(st0, strides))
        new_limits = tuple(s + (n - 1) * st + 1 if n else s
                           for s, n, st in zip(new_starts, shape, new_strides))
        return _sliced(term.args[0], new_starts, new_limits, new_strides)
    if op == "broadcast":
        (dims,) = term.attrs
        operand = term.args[0]
        o_starts, o_limits, o_strides = [], [], []
        for i, d in enumerate(dims):
            if operand.shape[i] == term.shape[d]:
                o_starts.append(starts[d])
                o_limits.append(limits[d])
                o_strides.append(strides[d])
            else:
                o_starts.append(0)
                o_limits.append(1)
                o_strides.append(1)
        return make_broadcast(_sliced(operand, o_starts, o_limits, o_strides), dims, shape)
    if op == "transpose":
        (perm,) = term.attrs
        inverse = [0] * len(perm)
        for i, p in enumerate(perm):
            inverse[p] = i
        return make_transpose(_sliced(term.args[0], [starts[inverse[j]] for j in range(len(perm))],
                                      [limits[inverse[j]] for j in range(len(perm))],
                                      [strides[inverse[j]] for j in range(len(perm))]), perm)
    if op == "stablehlo.dot_general":
        return _slice_dot(term, starts, limits, strides, shape)
    if op == "pad":
        return _slice_pad(term, starts, limits, strides, shape)
    if op == "concatenate":
        (dim,) = term.attrs
        if strides[dim] != 1:
            return None
        offset = 0
        for piece in term.args:
            size = piece.shape[dim]
            if offset <= starts[dim] and limits[dim] <= offset + size:
                p_starts = list(starts)
                p_limits = list(limits)
                p_starts[dim] -= offset
                p_limits[dim] -= offset
                return _sliced(piece, p_starts, p_limits, strides)
            offset += size
    return None


def _slice_dot(term: Term, starts, limits, strides, shape) -> Term:
    lhs, rhs = term.args
    lb, rb, lc, rc = term.attrs
    lhs_free = [d for d in range(len(lhs.shape)) if d not in lb and d not in lc]
    rhs_free = [d for d in range(len(rhs.shape)) if d not in rb and d not in rc]
    out_of = ([("l", d) for d in lb], [("l", d) for d in lhs_free], [("r", d) for d in rhs_free])
    sides = {"l": [[0, n, 1] for n in lhs.shape], "r": [[0, n, 1] for n in rhs.shape]}
    position = 0
    for k, d in enumerate(lb):
        window = [starts[position], limits[position], strides[position]]
        sides["l"][d] = window
        sides["r"][rb[k]] = list(window)
        position += 1
    for side, d in out_of[1] + out_of[2]:
        sides[side][d] = [starts[position], limits[position], strides[position]]
        position += 1

    def cut(operand: Term, windows) -> Term:
        return _sliced(operand, [w[0] for w in windows], [w[1] for w in windows],
                       [w[2] for w in windows])

    return make_dot(cut(lhs, sides["l"]), cut(rhs, sides["r"]), term.attrs, shape, term.dtype)


def _slice_pad(term: Term, starts, limits, strides, shape) -> Term | None:
    """A window inside the unpadded part, or entirely inside the padding of some dim."""
    inner, value = term.args
    low, _, interior = term.attrs
    if any(interior):
        return None
    inside = True
    for d, n in enumerate(inner.shape):
        lo = low[d]
        last = starts[d] + (shape[d] - 1) * strides[d] if shape[d] else starts[d]
        if shape[d] and (last < lo or starts[d] >= lo + n) and value.op == "splat":
            return make_splat(value.attrs[0], shape, term.dtype)
        if starts[d] < lo or last >= lo + n:
            inside = False
    if not inside:
        return _slice_across_pad(term, starts, limits, strides, shape)
    return _sliced(inner, [s - lo for s, lo in zip(starts, low)],
                   [lim - lo for lim, lo in zip(limits, low)], strides)


def _slice_across_pad(term: Term, starts, limits, strides, shape) -> Term | None:
    """A unit-stride window of a pad reaching into both its operand and its padding: the pad
    of the operand's part inside the window, padded to the window (exact: the same
    elements, the padding value where the window leaves the operand)."""
    inner, value = term.args
    low = term.attrs[0]
    if any(st != 1 for st in strides):
        return None
    lows, highs, in_starts, in_limits = [], [], [], []
    for d, n in enumerate(inner.shape):
        a, b = max(starts[d] - low[d], 0), min(limits[d] - low[d], n)
        if a >= b:
            return None
        in_starts.append(a)
        in_limits.append(b)
        lows.append(max(low[d] - starts[d], 0))
        highs.append(shape[d] - lows[-1] - (b - a))
    part = _sliced(inner, in_starts, in_limits, [1] * len(shape))
    attrs = (tuple(lows), tuple(highs), (0,) * len(shape))
    linear = 0 if splat_value(value) == 0 else None
    return make_op("pad", (part, value), attrs, tuple(shape), term.dtype, linear_in=linear)


@_built("dot", lambda lhs, rhs, attrs, shape, dtype: (lhs.serial, rhs.serial, attrs,
                                                       tuple(shape), dtype))
def make_dot(lhs: Term, rhs: Term, attrs: tuple, shape: tuple[int, ...], dtype: str) -> Term:
    """dot_general, bilinear: scalar factors of either side are pulled out; a contraction
    with zeros is zero where the other side is shown finite (`_zero_exact`: a sum of
    `0 * x`), else kept (NaN where the other side is not finite)."""
    for zero, other in ((lhs, rhs), (rhs, lhs)):
        if splat_value(zero) == 0 and _zero_exact(other):
            return make_splat(0, tuple(shape), dtype)
    pulled = _dot_of_repeat(lhs, rhs, attrs, tuple(shape), dtype)
    if pulled is not None:
        return pulled
    absorbed = _dot_of_transposed(lhs, rhs, attrs)
    if absorbed is not None:
        return make_dot(*absorbed, tuple(shape), dtype)
    kl, tl = factor_content(lhs)
    kr, tr = factor_content(rhs)
    dot = intern("stablehlo.dot_general", (tl, tr), attrs, tuple(shape), dtype)
    return scale(dot, kl * kr) if kl * kr != 1 else dot


def _dot_of_transposed(lhs: Term, rhs: Term, attrs: tuple
                       ) -> tuple[Term, Term, tuple] | None:
    """dot_general of a transposed operand as the dot_general of the operand itself, its
    contracting dims read through the permutation: the same products summed in the same order
    (`A.T @ B` is a contraction of A's dim 0 with B's), where the operand keeps the blocks
    the normal form reads it in (`_read_in_blocks`; the result's dims are the same)."""
    lb, rb, lc, rc = attrs
    operands = [lhs, rhs]
    dims = [[tuple(lb), tuple(lc)], [tuple(rb), tuple(rc)]]
    changed = False
    for side in (0, 1):
        operand = _oriented(operands[side])
        if operand.op != "transpose":
            continue
        (perm,) = operand.attrs
        batch, contract = dims[side]
        free = [d for d in range(len(perm)) if d not in batch and d not in contract]
        if not _read_in_blocks(perm, free, batch, contract, dims[1 - side][1]):
            continue
        operands[side] = operand.args[0]
        dims[side] = [tuple(perm[d] for d in batch), tuple(perm[d] for d in contract)]
        changed = True
    if not changed:
        return None
    (nlb, nlc), (nrb, nrc) = dims
    return operands[0], operands[1], (nlb, nrb, nlc, nrc)


def _read_in_blocks(perm: tuple[int, ...], free: list[int], batch: tuple[int, ...],
                    contract: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """Whether a transposed operand read through `perm` keeps the blocks the normal form
    reads a contraction's operand in: its batch dims where they are (moved, the general
    tier's joins of attention's per-head contractions no longer meet: test_frontier_pipeline),
    its free dims one run, in order (the result's dims are the same), and each run of
    contracted dims adjacent, in order, on both operands
    (`contract` against the other operand's `other`) still one run in order
    (`normal_form.regroup.merge_contracted_dims` merges it into one dim). Otherwise a
    device's block, whose batch dim of one row the normal form takes out and puts back
    next to its other free dims (`normal_form.squeeze`), is read in a layout the whole
    batch is not (the FSDP attention of `cookbook_loss_and_grads`: `transpose(out)` puts
    batch and query rows side by side, heads last, where `out` has them apart)."""
    placed = [perm[d] for d in free]
    if placed and placed != list(range(placed[0], placed[0] + len(placed))):
        return False
    if any(perm[d] != d for d in batch):
        return False
    pairs = sorted(zip(contract, other))
    return all(perm[b[0]] == perm[a[0]] + 1 for a, b in itertools.pairwise(pairs)
               if b == (a[0] + 1, a[1] + 1))


def _oriented(operand: Term) -> Term:
    """An operand of a dot_general that is itself a dot_general of two operands with free
    dims, in the orientation whose first operand has the lesser `orientation_key`: `dot(B,
    A)` read as `transpose(dot(A, B))` (the same values), so that a dot of `(A @ B).T` (its
    transpose swapped away by `make_transpose`) and of the transpose of `A @ B` meet. The key
    is read off what the operands compute, never the order they were built in (a per-device
    program builds its values in another order than the reference); where it ties, the dot
    is read as built."""
    if operand.op != "stablehlo.dot_general" or \
            orientation_key(operand.args[0]) <= orientation_key(operand.args[1]):
        return operand
    lb, rb, lc, rc = operand.attrs
    lhs, rhs = operand.args
    batch = len(lb)
    lhs_free = len(lhs.shape) - batch - len(lc)
    rhs_free = len(rhs.shape) - batch - len(rc)
    if lhs_free == 0 or rhs_free == 0:
        return operand
    flipped_shape = (operand.shape[:batch] + operand.shape[batch + lhs_free:]
                     + operand.shape[batch:batch + lhs_free])
    flipped = intern("stablehlo.dot_general", (rhs, lhs), (rb, lb, rc, lc),
                     tuple(flipped_shape), operand.dtype)
    perm = (tuple(range(batch)) + tuple(range(batch + rhs_free, batch + rhs_free + lhs_free))
            + tuple(range(batch, batch + rhs_free)))
    return intern("transpose", (flipped,), (perm,), operand.shape, operand.dtype)


_ORIENTATION_KEYS: tuple[dict[int, tuple], ...] = tuple({} for _ in range(SKELETON_DEPTH + 1))
"""`orientation_key` by depth, then by term serial."""

_KEY_MOVES = frozenset({"slice", "reshape", "transpose", "broadcast", "concatenate"})
"""Ops `orientation_key` reads through (a concatenation through its first piece): they move
or pick elements, and a device's rows of a value are the value's under them."""


def orientation_key(term: Term) -> tuple:
    """A key ordering a contraction's two operands by what they compute, alike in every
    program that computes them and in a device's rows of them: like `skeleton` (op, dtype,
    the operands' keys sorted, with their coefficients for a sum, `SKELETON_DEPTH` levels
    down), through movements (`_KEY_MOVES`), with each argument's index (`x @ w`: x is
    argument 0). Holds no serials and no shapes, so it does not depend on the order terms
    were built in."""
    return _skeleton(term, SKELETON_DEPTH, _ORIENTATION_KEYS, _KEY_MOVES)


def _transposed_dot(term: Term, perm: tuple[int, ...]) -> Term | None:
    """A transpose of a dot_general that swaps its lhs-free and rhs-free dims (batch dims in
    place, each side's free dims in order) as the dot_general with its operands swapped: the
    same products (`(A @ B).T` is `B.T @ A.T`, contracted as `dot_general(B, A)`)."""
    lb, rb, lc, rc = term.attrs
    lhs, rhs = term.args
    batch = len(lb)
    lhs_free = len(lhs.shape) - batch - len(lc)
    rhs_free = len(rhs.shape) - batch - len(rc)
    swapped = (tuple(range(batch)) + tuple(range(batch + lhs_free, batch + lhs_free + rhs_free))
               + tuple(range(batch, batch + lhs_free)))
    if perm != swapped or lhs_free == 0 or rhs_free == 0:
        return None
    shape = tuple(term.shape[p] for p in perm)
    return make_dot(rhs, lhs, (rb, lb, rc, lc), shape, term.dtype)


def _dot_of_repeat(lhs: Term, rhs: Term, attrs: tuple, shape: tuple[int, ...],
                   dtype: str) -> Term | None:
    """dot_general of an operand that repeats elements along its free dims only (a
    reshape(broadcast(w)), read by `repeats.plan_of`) as the same repeat of the dot of `w`:
    each output element is the dot of the rows the repeat copies, so the repeat moves out
    (the reference repeats K/V heads after projecting them; a device holding one head of a
    coarser split projects the repeated weight block)."""
    lb, rb, lc, rc = attrs
    for side, operand, batch, contract in ((0, lhs, lb, lc), (1, rhs, rb, rc)):
        if operand.op != "reshape" or operand.args[0].op != "broadcast":
            continue
        base, steps = _movement_chain(operand)
        plan = plan_of(base.shape, tuple(steps))
        if (plan is None or len(plan.dims) == len(plan.wide)
                or plan.perm != tuple(range(len(plan.perm)))):
            continue
        starts = [sum(plan.counts[:k]) for k in range(len(plan.counts))]
        kept = list(batch) + list(contract)
        if any(plan.counts[k] != 1 or starts[k] not in plan.dims for k in kept):
            continue
        new_dim = {k: plan.dims.index(starts[k]) for k in kept}
        inner = make_reshape(base, plan.split)
        free = [k for k in range(len(operand.shape)) if k not in kept]
        digits = [i for k in free for i in range(starts[k], starts[k] + plan.counts[k])]
        other = rhs if side == 0 else lhs
        other_free = [other.shape[k] for k in range(len(other.shape))
                      if k not in (rb if side == 0 else lb) and k not in (rc if side == 0 else lc)]
        batch_sizes = [operand.shape[k] for k in batch]
        moving_free = [plan.wide[i] for i in digits if i in plan.dims]
        mapped = (tuple(new_dim[k] for k in batch), tuple(new_dim[k] for k in contract))
        if side == 0:
            new_attrs = (mapped[0], rb, mapped[1], rc)
            dot_shape = tuple(batch_sizes + moving_free + other_free)
            wide = batch_sizes + [plan.wide[i] for i in digits] + other_free
            moving = [len(batch_sizes) + j for j, i in enumerate(digits) if i in plan.dims]
            dims = list(range(len(batch_sizes))) + moving + [
                len(wide) - len(other_free) + j for j in range(len(other_free))]
            dot = make_dot(inner, rhs, new_attrs, dot_shape, dtype)
        else:
            new_attrs = (lb, mapped[0], lc, mapped[1])
            dot_shape = tuple(batch_sizes + other_free + moving_free)
            wide = batch_sizes + other_free + [plan.wide[i] for i in digits]
            head = len(batch_sizes) + len(other_free)
            moving = [head + j for j, i in enumerate(digits) if i in plan.dims]
            dims = list(range(head)) + moving
            dot = make_dot(lhs, inner, new_attrs, dot_shape, dtype)
        return make_reshape(make_broadcast(dot, tuple(dims), tuple(wide)), shape)
    return None


# ----- value facts: the range of a term's elements ------------------------------------------

_INTERVAL_SAME = frozenset({"broadcast", "reshape", "transpose", "slice", "concatenate", "pad",
                            "stablehlo.reverse"})
"""Term ops whose result holds only values of their arguments (a pad's value included)."""

_INTERVAL_FIRST = frozenset({"dynamic_slice", "stablehlo.gather", "chlo.top_k"})
"""Term ops whose result holds only values of their first argument (the others index)."""

_INTERVAL_OPAQUE = frozenset({"loopvar", "while_result", "region_result"})
"""Term leaves standing for values computed elsewhere (a loop's, a summarized layer's)."""

_INTERVALS: dict[int, Interval] = {}
"""term serial -> `term_interval` (terms are interned for the whole run)."""


def term_interval(term: Term) -> Interval:
    """(lo, hi) of a term's elements, as `normalize.bounds.interval` for IR values: arguments
    are program inputs (finite by assumption, any value of their dtype), constants and iotas
    their values, arithmetic by interval arithmetic clamped to the dtype (an endpoint past
    its largest finite value is the infinity it may overflow to). An operand outside an
    op's domain (`sqrt` of a possibly negative value) makes the result unbounded: NaN
    matters here. Integers are any value of their width unless known tighter (they wrap)."""
    found = _INTERVALS.get(term.serial)
    if found is not None:
        return found
    for top in post_order(term, _INTERVALS):
        try:
            bounds = _term_interval_of(top, [_INTERVALS[a.serial] for a in top.args])
        except (ValueError, TypeError, OverflowError, KeyError, IndexError, ZeroDivisionError):
            bounds = UNBOUNDED
        _INTERVALS[top.serial] = fit(bounds, top.dtype)
    return _INTERVALS[term.serial]


def term_finite(term: Term) -> bool:
    """Every element of `term` is a finite number (no overflow, no NaN) on every input the
    proof admits, shown by `term_interval`; integer terms always are."""
    lo, hi = term_interval(term)
    return -INF < lo and hi < INF


_TOTAL_OPS = frozenset({
    "lin", "mul", "iota", "broadcast", "reshape", "transpose", "slice", "concatenate", "pad",
    "stablehlo.reverse", "dynamic_slice", "stablehlo.dynamic_update_slice", "stablehlo.gather",
    "stablehlo.scatter", "stablehlo.select", "stablehlo.compare", "stablehlo.and",
    "stablehlo.or", "stablehlo.not", "stablehlo.xor", "stablehlo.maximum", "stablehlo.minimum",
    "stablehlo.clamp", "stablehlo.convert", "reduce_sum", "reduce_window_sum",
    "stablehlo.dot_general", "stablehlo.exponential", "stablehlo.exponential_minus_one",
    "stablehlo.tanh", "stablehlo.logistic", "stablehlo.sine", "stablehlo.cosine", "chlo.erf",
    "stablehlo.sign", "stablehlo.abs", "stablehlo.negate", "chlo.square", "reduce_and",
    "reduce_or"})
"""Term ops that give a number for every finite operand unless a sum or product overflows
(`finite_unless_overflow`)."""

_BELOW = {"div": 1, "stablehlo.rsqrt": 0, "stablehlo.log": 0, "stablehlo.sqrt": 0,
          "stablehlo.log_plus_one": 0}
"""Term ops finite only for some finite operands: the operand to test (a divisor, the
argument of rsqrt, log, sqrt, log1p)."""

_FINITE_UNLESS_OVERFLOW: dict[int, bool] = {}
"""term serial -> `finite_unless_overflow`."""


def finite_unless_overflow(term: Term) -> bool:
    """Every element of `term` is a finite number wherever no sum or product overflows
    (what `--assume-no-overflow` takes): built from finite inputs and constants by ops that
    are total on finite numbers (`_TOTAL_OPS`), and by divisions, square roots and
    logarithms whose operand `term_interval` keeps inside their domain (a divisor without 0,
    a logarithm's or rsqrt's operand above 0, a square root's at least 0); a max or min over
    no element is not finite. Memoized; each shared subterm is visited once."""
    for top in post_order(term, _FINITE_UNLESS_OVERFLOW):
        _FINITE_UNLESS_OVERFLOW[top.serial] = all(
            _FINITE_UNLESS_OVERFLOW[a.serial] for a in top.args) and _total_here(top)
    return _FINITE_UNLESS_OVERFLOW[term.serial]


def _total_here(term: Term) -> bool:
    """`term`'s own op gives a number for its operands (`finite_unless_overflow`)."""
    op = term.op
    if op == "arg":
        return arg_finite(term)
    if op == "splat":
        return isinstance(term.attrs[0], Fraction)
    if op == "dense":
        lo, hi = term_interval(term)
        return integer_dtype(term.dtype) or (-INF < lo and hi < INF)
    if op in ("reduce_max", "reduce_min"):
        return all(term.args[0].shape[d] for d in term.attrs[0])
    if op in _BELOW:
        lo, hi = term_interval(term.args[_BELOW[op]])
        if op == "div":
            return lo > 0 or hi < 0
        if op == "stablehlo.sqrt":
            return lo >= 0
        if op == "stablehlo.log_plus_one":
            return lo > -1
        return lo > 0
    return op in _TOTAL_OPS or integer_dtype(term.dtype)


def _shifted_by_its_max(term: Term) -> bool:
    """`term` is `x - broadcast(reduce_max(x)) + c` (the softmax shift), so at most `c`: the
    term-level `bounds._dominates` (the broadcast restores exactly the reduced dims)."""
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


def _term_interval_of(term: Term, args: list[Interval]) -> Interval:
    op, dtype = term.op, term.dtype
    if op == "arg":
        if not arg_finite(term):
            return int_interval(dtype) or UNBOUNDED
        return int_interval(dtype) or (-FLOAT_MAX.get(dtype, INF), FLOAT_MAX.get(dtype, INF))
    if op == "splat":
        value = float(term.attrs[0])
        return UNBOUNDED if math.isnan(value) else (value, value)
    if op == "iota":
        return 0.0, float(max(term.shape[0] - 1, 0))
    if op == "dense":
        import numpy as np  # lazy: terms are pure Python; numpy only for a dense table

        values = DENSE_VALUES.get(term.attrs[0])
        if values is None or not np.size(values):
            return int_interval(dtype) or UNBOUNDED
        return float(np.min(values)), float(np.max(values))
    if op in _INTERVAL_OPAQUE:
        return int_interval(dtype) or UNBOUNDED
    if op == "lin":
        constant, coefs = term.attrs
        total = (float(constant), float(constant))
        if math.isnan(total[0]):
            return UNBOUNDED
        for k, arg in zip(coefs, args):
            total = add(total, mul((float(k), float(k)), arg))
        if _shifted_by_its_max(term):
            total = total[0], min(total[1], float(constant))
        return total
    if op == "mul":
        return _product_interval(term, args)
    if op == "div":
        return div(args[0], args[1])
    if op in _INTERVAL_SAME:
        return hull(args)
    if op == "chlo.top_k" and term.attrs[1] == 1:  # positions along the operand's last dim
        return 0.0, float(max(term.args[0].shape[-1] - 1, 0))
    if op in _INTERVAL_FIRST:
        return args[0]
    if op in ("argmax", "argmin"):  # a value (an index) of the operand, or the init's
        result = term.attrs[1]
        return hull([args[result], args[result + 2]])
    if op == "stablehlo.dynamic_update_slice":
        return hull(args[:2])
    if op == "reduce_sum":
        return times(args[0], math.prod(term.args[0].shape[d] for d in term.attrs[0]))
    if op in ("reduce_max", "reduce_min"):
        empty = any(term.args[0].shape[d] == 0 for d in term.attrs[0])
        return UNBOUNDED if empty else args[0]
    if op == "reduce_window_sum":
        return times(hull([args[0], (0.0, 0.0)]), math.prod(term.attrs[0]))
    if op == "stablehlo.dot_general":
        count = math.prod(term.args[0].shape[d] for d in term.attrs[2])
        return times(mul(args[0], args[1]), count)
    entry = ELEMENTWISE_BOUNDS.get(op)
    if entry is not None:
        compute, domain = entry
        if domain is not None and args[0][0] < domain:
            return UNBOUNDED
        return compute(args)
    return int_interval(dtype) or UNBOUNDED


def _product_interval(term: Term, args: list[Interval]) -> Interval:
    """A product's range, a factor repeated an even number of times taken as a square (at
    least 0: `x * x` of one x, which interval arithmetic alone would let be negative)."""
    counts: dict[int, int] = {}
    first: dict[int, Interval] = {}
    for arg, bounds in zip(term.args, args):
        counts[arg.serial] = counts.get(arg.serial, 0) + 1
        first.setdefault(arg.serial, bounds)
    total = (1.0, 1.0)
    for serial, count in counts.items():
        bounds = first[serial]
        if count % 2 == 0:
            lo, hi = bounds
            low = 0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)
            square = (low, max(lo * lo, hi * hi))
            for _ in range(count // 2):
                total = mul(total, square)
        else:
            for _ in range(count):
                total = mul(total, bounds)
    return total


# ----- rebuilding -----------------------------------------------------------------------------

ARITHMETIC_STABLEHLO = frozenset(op for op, traits in ELEMENTWISE_OPS.items()
                                 if traits.term is not None)
"""The elementwise ops `make_elementwise` builds as `lin`, `mul` or `div` terms: with
`ELEMENTWISE_STABLEHLO`, every elementwise op of `core/traits.py`."""

_LINEAR_IN = {"reduce_sum": 0, "slice": 0, "stablehlo.gather": 0, "reduce_window_sum": 0}
"""Term ops built by `make_op(..., linear_in=k)`: rebuilt the same way."""


def rebuild(term: Term, args: tuple[Term, ...]) -> Term:
    """`term`'s node over new arguments, through the canonicalizing constructors."""
    op, attrs, shape, dtype = term.op, term.attrs, term.shape, term.dtype
    if op == "lin":
        constant, coefs = attrs
        out = make_lin(list(zip(coefs, args)), constant, shape, dtype)
    elif op == "mul":
        out = typed_product(functools.reduce(make_mul, args), dtype)
    elif op == "div":
        out = make_div(*args)
    elif op == "broadcast":
        out = make_broadcast(args[0], attrs[0], shape)
    elif op == "reshape":
        out = make_reshape(args[0], shape)
    elif op == "transpose":
        out = make_transpose(args[0], attrs[0])
    elif op == "stablehlo.dot_general":
        out = make_dot(args[0], args[1], attrs, shape, dtype)
    elif op in _LINEAR_IN:
        out = make_op(op, args, attrs, shape, dtype, linear_in=_LINEAR_IN[op])
    elif op == "pad" and splat_value(args[1]) == 0:
        out = make_op(op, args, attrs, shape, dtype, linear_in=0)
    elif op == "stablehlo.scatter" and ("reducer", "add") in attrs:
        out = make_op(op, args, attrs, shape, dtype, linear_in=2)
    elif op in ELEMENTWISE_STABLEHLO or op in ARITHMETIC_STABLEHLO:
        out = make_elementwise(op, args, attrs, dtype)
    else:
        out = intern(op, args, attrs, shape, dtype)
    return out


# ----- printing -----------------------------------------------------------------------------

def _fmt_scalar(value: Scalar) -> str:
    """A constant as a person reads it: an integer or a small fraction as it is (`2147483000`,
    `1/768`), any other in decimal (`-2.82843e+09`, not `-23170474609375/8192`)."""
    if isinstance(value, Fraction):
        readable = value.denominator == 1 or (abs(value.numerator) < 10**5
                                              and value.denominator < 10**4)
        return str(value) if readable else f"{float(value):.6g}"
    return str(value)


ARG_NAMES: ContextVar[Mapping[int, str]] = ContextVar("entangle_arg_names",
                                                    default=MappingProxyType({}))
"""The names terms print for the program's inputs, by index (`params['w1']` where jax
recorded one; `%argN` otherwise). `entangle-import-shardings` sets them for each check."""


def pretty(term: Term, depth: int = 6, names: dict[int, str] | None = None) -> str:
    """A readable, depth-limited rendering (`...` past `depth`)."""
    if names and term.serial in names:
        return names[term.serial]
    if term.op == "arg":
        return ARG_NAMES.get().get(term.attrs[0]) or f"%arg{term.attrs[0]}"
    if term.op == "splat":
        return _fmt_scalar(term.attrs[0])
    if term.op == "iota":
        return f"iota(dim {term.attrs[0]})"
    if term.op == "broadcast" and term.args[0].op == "iota" and len(term.args[0].shape) == 1:
        return f"iota(dim {term.attrs[0][0]})"
    if term.op == "loopvar":
        return f"%loop{term.attrs[0]}.{term.attrs[1]}"
    if term.op == "while_result":
        return f"while_result#{term.attrs[0]}(...)"
    if term.op == "dense":
        return f"dense<{term.dtype}>"
    if term.op == "lin" and len(term.args) == 1 and term.attrs[0] == 0:
        (k,) = term.attrs[1]  # a scaled term: the factor is not a level of the depth
        inner = pretty(term.args[0], depth, names)
        return inner if k == 1 else f"({_fmt_scalar(k)}*{inner})"
    if depth <= 0:
        return "..."
    sub = [pretty(a, depth - 1, names) for a in term.args]
    if term.op == "lin":
        constant, coefs = term.attrs
        parts = [(s if k == 1 else f"{_fmt_scalar(k)}*{s}") for k, s in zip(coefs, sub)]
        if constant != 0:
            parts.append(_fmt_scalar(constant))
        return "(" + " + ".join(parts) + ")"
    if term.op == "mul":
        return "(" + " * ".join(sub) + ")"
    if term.op == "div":
        return f"({sub[0]} / {sub[1]})"
    if term.op == "chlo.top_k":
        k, result = term.attrs
        return f"top_k({sub[0]}, k={k}).{'indices' if result else 'values'}"
    if term.op in ("argmax", "argmin"):
        dims, result = term.attrs
        return (f"{term.op}({sub[0]}, {sub[1]}, dims={list(dims)}, init=({sub[2]}, {sub[3]}))"
                f".{'indices' if result else 'values'}")
    name = term.op.split(".")[-1]
    if term.op == "stablehlo.compare" and len(term.attrs) > 1:
        name += f"[{term.attrs[1]}]"  # a compare type other than the element type's default
    return f"{name}({', '.join(sub)})"


def structural_diff(a: Term, b: Term, path: str = "", depth: int = 0) -> str | None:
    """The first position where two terms differ, as a short description (None if equal)."""
    if a is b:
        return None
    if depth > 100:
        return f"below {path[-120:]}: the terms differ deeper than 100 levels"
    if a.op != b.op or len(a.args) != len(b.args) or a.attrs != b.attrs or a.shape != b.shape:
        where = path or "top level"
        return f"at {where}: {pretty(a, 2)} vs {pretty(b, 2)}"
    for i, (x, y) in enumerate(zip(a.args, b.args)):
        found = structural_diff(x, y, f"{path}/{a.op.split('.')[-1]}#{i}", depth + 1)
        if found:
            return found
    return None
