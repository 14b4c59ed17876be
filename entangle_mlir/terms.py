"""Hash-consed reference terms over global tensors, kept in a canonical form.

A term names a global value of the reference computation: an argument, a constant, or an op
applied to terms. Construction goes through the `make_*` functions, which canonicalize so that
equal spellings intern to the same object and matching a sharded value to a reference value is
an identity test:

* linear combinations `lin` with `Fraction` coefficients and a splat constant addend (add,
  subtract, negate, scaling by constants, pmean's 1/n);
* scalars pulled through dot_general / reduce-sum / broadcast / reshape / transpose / slice;
* n-ary sorted multiply, sorted max/min/and/or; `x * x` for `chlo.square`;
* composed broadcast / reshape / transpose chains; unit-dim-only broadcasts become reshapes.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

Scalar = Fraction | float

_counter = itertools.count()
_TABLE: dict[tuple, Term] = {}


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
           dtype: str) -> Term:
    """The unique term with these fields (no canonicalization: use the `make_*` functions)."""
    key = (op, tuple(a.serial for a in args), attrs, shape, dtype)
    term = _TABLE.get(key)
    if term is None:
        term = Term()
        term.op, term.args, term.attrs, term.shape, term.dtype = op, args, attrs, shape, dtype
        term.serial = next(_counter)
        _TABLE[key] = term
    return term


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

def make_arg(index: int, shape: tuple[int, ...], dtype: str) -> Term:
    return intern("arg", (), (index,), tuple(shape), dtype)


def make_splat(value, shape: tuple[int, ...], dtype: str) -> Term:
    """A tensor whose elements all equal `value`."""
    return intern("splat", (), (scalar(value),), tuple(shape), dtype)


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


def make_iota(shape: tuple[int, ...], dim: int, dtype: str) -> Term:
    """An iota; a multi-dim one is the broadcast of the 1-D iota (one normal form for
    `broadcasted_iota` and `arange(...)[None, :]`)."""
    shape = tuple(shape)
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
    """The canonical form of `sum(k * t for k, t in pairs) + constant`."""
    merged: dict[int, list] = {}
    total = scalar(constant)
    for coef, term in pairs:
        inner, inner_const = linear_parts(term)
        total = total + coef * inner_const if inner_const != 0 else total
        for k, t in inner:
            slot = merged.setdefault(t.serial, [Fraction(0), t])
            slot[0] += coef * k
    items = sorted((t.serial, k, t) for k, t in merged.values() if k != 0)
    if not items:
        return make_splat(total, shape, dtype)
    if len(items) == 1 and items[0][1] == 1 and total == 0:
        return items[0][2]
    coefs = tuple(k for _, k, _ in items)
    args = tuple(t for _, _, t in items)
    return intern("lin", args, (total, coefs), tuple(shape), dtype)


def scale(term: Term, factor) -> Term:
    return make_lin([(scalar(factor), term)], Fraction(0), term.shape, term.dtype)


def single_scaled(term: Term) -> tuple[Scalar, Term]:
    """(k, t) with term == k * t when term is a scaled single term, else (1, term)."""
    if term.op == "lin" and len(term.args) == 1 and term.attrs[0] == 0:
        return term.attrs[1][0], term.args[0]
    return Fraction(1), term


def factor_content(term: Term) -> tuple[Scalar, Term]:
    """(k, t) with term == k * t where, for a sum, k is the content of its coefficients (the
    positive rational generating them, gcd of numerators over lcm of denominators, signed like
    the first coefficient): proportional sums get the same `t`. Products and linear ops are
    homogeneous, so `(c*a + c*b) * x` and `c * ((a + b) * x)` must meet: a local mean's
    `1/N_local` and a pmean's `1/n` then multiply out to the reference's `1/N` whichever side
    of the product (or of a pad, broadcast, reduction) they were applied on."""
    if term.op != "lin":
        return Fraction(1), term
    constant, coefs = term.attrs
    if not isinstance(constant, Fraction):
        return Fraction(1), term
    values = [c for c in (*coefs, constant) if c != 0]
    k = Fraction(math.gcd(*(v.numerator for v in values)),
                 math.lcm(*(v.denominator for v in values)))
    k = -k if coefs[0] < 0 else k
    if k == 1:
        return Fraction(1), term
    inner = make_lin([(c / k, t) for c, t in zip(coefs, term.args)], constant / k, term.shape,
                     term.dtype)
    return k, inner


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

COMMUTATIVE = {"stablehlo.maximum", "stablehlo.minimum", "stablehlo.and", "stablehlo.or",
               "stablehlo.xor"}


def make_add(a: Term, b: Term) -> Term:
    return make_lin([(Fraction(1), a), (Fraction(1), b)], Fraction(0), a.shape, a.dtype)


def make_sub(a: Term, b: Term) -> Term:
    return make_lin([(Fraction(1), a), (Fraction(-1), b)], Fraction(0), a.shape, a.dtype)


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


def make_div(a: Term, b: Term) -> Term:
    value = splat_value(b)
    if isinstance(value, Fraction) and value != 0:
        return scale(a, 1 / value)
    if not _is_float(a.dtype):
        ka, ta = single_scaled(a)
        kb, tb = single_scaled(b)
    else:
        numerator = splat_value(a)
        if isinstance(numerator, Fraction) and numerator not in (0, 1):
            return scale(make_div(make_splat(1, a.shape, a.dtype), b), numerator)
        ka, ta = factor_content(a)
        kb, tb = factor_content(b)
    quotient = intern("div", (ta, tb), (), a.shape, a.dtype)
    return scale(quotient, ka / kb) if ka / kb != 1 else quotient


def make_elementwise(op: str, args: tuple[Term, ...], attrs: tuple = (),
                     dtype: str | None = None) -> Term:
    """Generic elementwise op; arithmetic ops route to their canonical builders."""
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
    if op == "stablehlo.select":
        pulled = _select_content(*args, dtype or args[1].dtype)
        if pulled is not None:
            return pulled
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
        pushed = _reshape_broadcast(term, shape)
    elif term.op == "stablehlo.dot_general":
        pushed = _reshape_dot(term, shape)
    if pushed is not None:
        return pushed
    return intern("reshape", (term,), (), shape, term.dtype)


ELEMENTWISE_TERM_OPS = {"mul", "div"}


def rebuild_elementwise(term: Term, args: tuple[Term, ...]) -> Term:
    """The same elementwise op on new operands, through the canonical builders (so sorted
    operands stay sorted and scalars are pulled out again)."""
    if term.op == "mul":
        product = args[0]
        for factor in args[1:]:
            product = make_mul(product, factor)
        return product
    if term.op == "div":
        return make_div(*args)
    return make_elementwise(term.op, args, term.attrs, dtype=term.dtype)


def _is_elementwise(term: Term) -> bool:
    """Terms whose every argument has the term's shape and which act elementwise."""
    if term.op in ELEMENTWISE_TERM_OPS:
        return True
    return term.op in ELEMENTWISE_STABLEHLO and all(a.shape == term.shape for a in term.args)


ELEMENTWISE_STABLEHLO = {
    "stablehlo.maximum", "stablehlo.minimum", "stablehlo.power", "stablehlo.remainder",
    "stablehlo.atan2", "stablehlo.abs", "stablehlo.exponential", "stablehlo.exponential_minus_one",
    "stablehlo.log", "stablehlo.log_plus_one", "stablehlo.tanh", "stablehlo.logistic",
    "stablehlo.rsqrt", "stablehlo.sqrt", "stablehlo.cbrt", "stablehlo.sine", "stablehlo.cosine",
    "stablehlo.tan", "stablehlo.sign", "stablehlo.floor", "stablehlo.ceil",
    "stablehlo.round_nearest_even", "stablehlo.round_nearest_afz", "stablehlo.is_finite",
    "chlo.erf", "stablehlo.compare", "stablehlo.select", "stablehlo.clamp", "stablehlo.and",
    "stablehlo.or", "stablehlo.xor", "stablehlo.not", "stablehlo.convert",
}


def _reshape_broadcast(term: Term, shape: tuple[int, ...]) -> Term | None:
    """reshape(broadcast(y)) as one broadcast when the reshape only regroups created dims."""
    (dims,) = term.attrs
    operand = term.args[0]
    groups = reshape_groups(term.shape, shape)
    if groups is None:
        return None
    new_dims = [0] * len(dims)
    for src, dst in groups:
        kept = [d for d in src if d in dims]
        if not kept:
            continue
        real_src = [d for d in src if term.shape[d] != 1]
        real_dst = [d for d in dst if shape[d] != 1]
        if (len(kept) != 1 or len(real_src) > 1 or len(real_dst) != 1
                or operand.shape[dims.index(kept[0])] != term.shape[kept[0]]):
            return None
        new_dims[dims.index(kept[0])] = real_dst[0]
    if any(operand.shape[i] != 1 and new_dims[i] == 0 and dims[i] != 0 for i in range(len(dims))):
        return None
    if sorted(new_dims) != new_dims or len(set(new_dims)) != len(new_dims):
        return None
    return make_broadcast(operand, tuple(new_dims), shape)


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
    return intern("transpose", (term,), (perm,), shape, term.dtype)


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
    and sums are pulled out of it (slice, pad with zero, reduce-sum)."""
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


def make_dot(lhs: Term, rhs: Term, attrs: tuple, shape: tuple[int, ...], dtype: str) -> Term:
    """dot_general, bilinear: scalar factors of either side are pulled out."""
    kl, tl = factor_content(lhs)
    kr, tr = factor_content(rhs)
    dot = intern("stablehlo.dot_general", (tl, tr), attrs, tuple(shape), dtype)
    return scale(dot, kl * kr) if kl * kr != 1 else dot


# ----- printing -----------------------------------------------------------------------------

def _fmt_scalar(value: Scalar) -> str:
    if isinstance(value, Fraction):
        return str(value) if value.denominator < 10**6 else f"{float(value):.6g}"
    return str(value)


def pretty(term: Term, depth: int = 6, names: dict[int, str] | None = None) -> str:
    """A readable, depth-limited rendering (`...` past `depth`)."""
    if names and term.serial in names:
        return names[term.serial]
    if term.op == "arg":
        return f"%arg{term.attrs[0]}"
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
    name = term.op.split(".")[-1]
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
