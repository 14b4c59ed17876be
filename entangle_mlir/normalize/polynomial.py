"""Einsum polynomials over the values of an MLIR function: a decision procedure for "this
value is zero in real arithmetic" by algebra alone.

A value computed by adds, subtracts, negations, products, divisions, sums over dims,
contractions and moves (broadcast_in_dim, unit-dim reshapes, transposes) of other values is a
sum of monomials: a rational coefficient times a product of *atoms* (the values it reads that
are not expanded, each at an index tuple), summed over bound index variables. Two monomials
that differ only by the names of their bound variables are one. When every monomial cancels,
the value is zero for every content of the atoms, so for the program's; nothing about the
atoms' meaning is used.

A division `a / b` is `a * b^-1` with `b^-1` an atom (b is nonzero: the verifier takes a
division where it is defined, `nonfinite_kinds`). When some monomials keep such an inverse
and `b` is a computed sum, the whole polynomial is multiplied by the power of `b` that clears
it (nonzero, so zero stays zero) and `b` is then expanded. Every atom must be finite
(`nonfinite_kinds`): `x - x = 0` and `0 * x = 0` fail for infinities. This decides zero in
real arithmetic: a floating-point evaluation of the same value is a rounding residue only
while none of its sums and products of finite atoms overflows, which is not checked here
(the caller's concern, `max_cotangent.py`).

Which values are expanded is decided per value (so a value is one atom wherever it occurs):
those within `depth` arithmetic ops of the root. `is_zero` tries growing depths: a value read
from far away (the cotangent entering an attention block from the rest of the network) stays
an atom."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.mlir.opinfo import constant_value, reducer_kind
from entangle_mlir.normalize.finite import active, nonfinite_kinds
from entangle_mlir.normalize.match import (
    Memo,
    attr_names,
    defining_op,
    i64s,
    shape_of,
    sum_reduce,
)

_ARITHMETIC = frozenset({
    "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
    "stablehlo.reduce", "stablehlo.dot_general"})
MOVES = frozenset({
    "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose",
    "stablehlo.negate", "stablehlo.convert"})
_MAX_MONOMIALS = 4096
_MAX_BOUND = 6
_DEPTHS = (2, 4, 6, 8, 12, 16)
_FIRST_DEPTH = 8
"""Tried before the growing `_DEPTHS`: where a ring's running max's cotangent cancels (the
forward's recurrence and the backward's step: every such cotangent of ring attention
training is zero at depth 8, after failing at 2, 4 and 6). A zero over finite atoms at any
depth is a proof; where the first try finds none, the depths are tried in order as without
it (`_FIRST_DEPTH` again only where its zero's atoms were not known finite)."""
_KEY_HEIGHT = 8

_LIT = ("c", 0)
"""The index of a unit dim."""


class _TooBig(Exception):
    """The polynomial outgrew the budget, or a value is outside what it models."""


def _free(i: int) -> tuple[str, int]:
    return ("f", i)


def _bound(j: int) -> tuple[str, int]:
    return ("b", j)


class _Monomial:
    """`coef * prod(atom[idx] ** power)` summed over bound variables `0..len(sizes)-1`."""

    __slots__ = ("coef", "factors", "sizes")

    def __init__(self, coef: Fraction, factors: tuple, sizes: tuple[int, ...]):
        self.coef, self.factors, self.sizes = coef, factors, sizes


def _rename(index, free: dict, bound_offset: int):
    kind, n = index
    if kind == "f":
        return free[n]
    if kind == "b":
        return ("b", n + bound_offset)
    return index


def _mapped(m: _Monomial, free: dict, new_sizes: tuple[int, ...] = ()) -> _Monomial:
    """`m` with its free variables replaced (`free`: old free number -> index) and
    `new_sizes` bound variables placed before its own."""
    offset = len(new_sizes)
    factors = tuple((atom, tuple(_rename(i, free, offset) for i in idx), power)
                    for atom, idx, power in m.factors)
    return _Monomial(m.coef, factors, new_sizes + m.sizes)


def _canonical(m: _Monomial) -> tuple[tuple, Fraction] | None:
    """(key, coefficient): the key names the monomial up to its bound variables' names and its
    factors' order; None for a zero monomial."""
    if m.coef == 0:
        return None
    powers: dict = defaultdict(int)
    for atom, idx, power in m.factors:
        powers[atom, idx] += power
    factors = [(atom, idx, p) for (atom, idx), p in powers.items() if p]
    used = {n for _, idx, _ in factors for kind, n in idx if kind == "b"}
    coef = m.coef
    for j, size in enumerate(m.sizes):
        if j not in used:
            coef *= size
    live = sorted(used)
    if len(live) > _MAX_BOUND:
        raise _TooBig
    best = None
    groups = defaultdict(list)
    for j in live:
        groups[m.sizes[j]].append(j)
    sizes = sorted(groups)
    for choice in itertools.product(*(itertools.permutations(groups[s]) for s in sizes)):
        order = [j for perm in choice for j in perm]
        name = {j: ("b", k) for k, j in enumerate(order)}
        key = tuple(sorted((atom, tuple(name.get(n, (kind, n)) if kind == "b" else (kind, n)
                                        for kind, n in idx), p) for atom, idx, p in factors))
        if best is None or key < best:
            best = key
    bound_sizes = tuple(s for s in sizes for _ in groups[s])
    return (best, bound_sizes), coef


def _normal(monomials: list[_Monomial]) -> list[_Monomial]:
    if len(monomials) > _MAX_MONOMIALS:
        raise _TooBig
    sums: dict = defaultdict(Fraction)
    for m in monomials:
        found = _canonical(m)
        if found is not None:
            sums[found[0]] += found[1]
    return [_Monomial(c, factors, sizes) for (factors, sizes), c in sums.items() if c]


class _Builder:
    """The polynomials of the values around one root, with the atoms they read."""

    def __init__(self, depth: int, distance: dict, keys: dict, interned: dict):
        """`keys` and `interned`: the structural keys' tables (`key`), shared by the builders
        of one root at every depth (a key does not depend on the depth)."""
        self.depth, self.distance = depth, distance
        self.memo: dict = {}
        self.inverse_memo: dict = {}
        self.atoms: dict = {}
        self.atom_values: dict = {}
        self.keys, self.interned = keys, interned

    def key(self, value, height: int = _KEY_HEIGHT) -> int:
        """A structural key: the same op applied to the same operands (jax repeats ops) is
        one atom. Ops more than `height` levels down are told apart by identity (equal keys
        always mean equal values; a missed match only costs a cancellation)."""
        known = self.keys.get(value)
        if known is None:
            known = self.keys[value] = {}
        found = known.get(height)
        if found is not None:
            return found
        op = defining_op(value)
        if height == 0 or op is None or (op.regions and op.name != "stablehlo.reduce"):
            key = ("value", value)
        else:
            local = known.get("op")  # the op's own part, the same at every height
            if local is None:
                attrs = tuple((n, str(op.attributes[n])) for n in sorted(attr_names(op)))
                result = next(i for i, r in enumerate(op.results) if r == value)
                local = known["op"] = (
                    op.name, str(value.type), attrs, result,
                    reducer_kind(op) if op.name == "stablehlo.reduce" else "")
            key = (local, tuple(self.key(v, height - 1) for v in op.operands))
        number = self.interned.setdefault(key, len(self.interned))
        known[height] = number
        return number

    def atom(self, value, power: int) -> list[_Monomial]:
        number = self.atoms.setdefault(self.key(value), len(self.atoms))
        self.atom_values[number] = value
        idx = tuple(_LIT if n == 1 else _free(i) for i, n in enumerate(shape_of(value)))
        return [_Monomial(Fraction(1), ((number, idx, power),), ())]

    def expands(self, value) -> bool:
        op = defining_op(value)
        if op is None:
            return False
        if op.name in MOVES:
            return True
        return op.name in _ARITHMETIC and self.distance.get(value, self.depth + 1) <= self.depth

    def poly(self, value) -> list[_Monomial]:
        found = self.memo.get(value)
        if found is None:
            found = _normal(self._poly(value))
            self.memo[value] = found
        return found

    def _poly(self, value) -> list[_Monomial]:
        op = defining_op(value)
        element = ir.RankedTensorType(value.type).element_type
        if not isinstance(element, ir.FloatType):
            raise _TooBig
        if op is not None and op.name == "stablehlo.constant":
            array, splat = constant_value(op.attributes["value"])
            if splat:
                c = float(np.asarray(array).reshape(-1)[0])
                if not np.isfinite(c):
                    raise _TooBig
                return [_Monomial(Fraction(c), (), ())] if c else []
        if not self.expands(value):
            return self.atom(value, 1)
        name, shape = op.name, shape_of(value)
        operands = list(op.operands)
        if name == "stablehlo.add":
            return self.poly(operands[0]) + self.poly(operands[1])
        if name == "stablehlo.subtract":
            return self.poly(operands[0]) + _scaled(self.poly(operands[1]), -1)
        if name == "stablehlo.negate":
            return _scaled(self.poly(operands[0]), -1)
        if name == "stablehlo.multiply":
            return _times(self.poly(operands[0]), self.poly(operands[1]))
        if name == "stablehlo.divide":
            return _times(self.poly(operands[0]), self.inverse(operands[1]))
        if name == "stablehlo.convert":
            if operands[0].type != value.type:
                return self.atom(value, 1)
            return self.poly(operands[0])
        if name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose"):
            free = _move_map(op, shape)
            if free is None:
                return self.atom(value, 1)
            return [_mapped(m, free) for m in self.poly(operands[0])]
        if name == "stablehlo.reduce":
            if not sum_reduce(op):
                return self.atom(value, 1)
            return self._summed(op)
        return self._contracted(op)

    def _summed(self, op) -> list[_Monomial]:
        source = shape_of(op.operands[0])
        dims = i64s(op, "dimensions")
        free, sizes, out = {}, [], 0
        for d, n in enumerate(source):
            if d in dims:
                if n != 1:
                    free[d] = _bound(len(sizes))
                    sizes.append(n)
                else:
                    free[d] = _LIT
            else:
                free[d] = _LIT if n == 1 else _free(out)
                out += 1
        return [_mapped(m, free, tuple(sizes)) for m in self.poly(op.operands[0])]

    def _contracted(self, op) -> list[_Monomial]:
        numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        lb, rb = list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)
        lc, rc = list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)
        lhs, rhs = op.operands
        ls, rs = shape_of(lhs), shape_of(rhs)
        lfree = [d for d in range(len(ls)) if d not in lb and d not in lc]
        rfree = [d for d in range(len(rs)) if d not in rb and d not in rc]
        out = 0
        lmap: dict = {}
        rmap: dict = {}
        for a, b in zip(lb, rb, strict=True):
            lmap[a] = rmap[b] = _LIT if ls[a] == 1 else _free(out)
            out += 1
        for d in lfree:
            lmap[d] = _LIT if ls[d] == 1 else _free(out)
            out += 1
        for d in rfree:
            rmap[d] = _LIT if rs[d] == 1 else _free(out)
            out += 1
        sizes = []
        for a, b in zip(lc, rc, strict=True):
            if ls[a] == 1:
                lmap[a] = rmap[b] = _LIT
            else:
                lmap[a] = rmap[b] = _bound(len(sizes))
                sizes.append(ls[a])
        shared = tuple(sizes)
        left = [_mapped(m, lmap, shared) for m in self.poly(lhs)]
        right = [_mapped(m, rmap, shared) for m in self.poly(rhs)]
        out_monomials = []
        for a in left:
            for b in right:
                out_monomials.append(_product_shared(a, b, len(shared)))
                if len(out_monomials) > _MAX_MONOMIALS:
                    raise _TooBig
        return out_monomials

    def inverse(self, value) -> list[_Monomial]:
        """`1 / value` as one monomial."""
        found = self.inverse_memo.get(value)
        if found is not None:
            return found
        op = defining_op(value)
        name = op.name if op is not None else ""
        if name == "stablehlo.constant":
            array, splat = constant_value(op.attributes["value"])
            c = float(np.asarray(array).reshape(-1)[0]) if splat else 0.0
            if splat and c and np.isfinite(c):
                found = [_Monomial(1 / Fraction(c), (), ())]
        elif name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose"):
            free = _move_map(op, shape_of(value))
            if free is not None:
                found = [_mapped(m, free) for m in self.inverse(op.operands[0])]
        elif name == "stablehlo.negate":
            found = _scaled(self.inverse(op.operands[0]), -1)
        elif name == "stablehlo.multiply":
            found = _times(self.inverse(op.operands[0]), self.inverse(op.operands[1]))
        elif name == "stablehlo.divide":
            found = _times(self.inverse(op.operands[0]), self.poly(op.operands[1]))
        elif name == "stablehlo.convert" and op.operands[0].type == value.type:
            found = self.inverse(op.operands[0])
        if found is None:
            found = self.atom(value, -1)
        found = _normal(found)
        self.inverse_memo[value] = found
        return found


def _product_shared(a: _Monomial, b: _Monomial, shared: int) -> _Monomial:
    """a * b where both number their first `shared` bound variables alike."""
    offset = len(a.sizes) - shared
    factors = a.factors + tuple(
        (atom, tuple(("b", n if n < shared else n + offset) if kind == "b" else (kind, n)
                     for kind, n in idx), power)
        for atom, idx, power in b.factors)
    return _Monomial(a.coef * b.coef, factors, a.sizes + b.sizes[shared:])


def _scaled(monomials: list[_Monomial], c) -> list[_Monomial]:
    return [_Monomial(m.coef * c, m.factors, m.sizes) for m in monomials]


def _times(left: list[_Monomial], right: list[_Monomial]) -> list[_Monomial]:
    if len(left) * len(right) > _MAX_MONOMIALS:
        raise _TooBig
    return [_product_shared(a, b, 0) for a in left for b in right]


def _move_map(op, shape: tuple[int, ...]) -> dict | None:
    """For a broadcast_in_dim, unit-dim reshape or transpose: operand dim -> result index."""
    source = shape_of(op.operands[0])
    if op.name == "stablehlo.broadcast_in_dim":
        dims = i64s(op, "broadcast_dimensions")
        return {i: _LIT if n == 1 else _free(dims[i]) for i, n in enumerate(source)}
    if op.name == "stablehlo.transpose":
        perm = i64s(op, "permutation")
        return {p: _LIT if source[p] == 1 else _free(i) for i, p in enumerate(perm)}
    kept = [d for d, n in enumerate(source) if n != 1]
    placed = [d for d, n in enumerate(shape) if n != 1]
    if [source[d] for d in kept] != [shape[d] for d in placed]:
        return None
    free = {d: _LIT for d, n in enumerate(source) if n == 1}
    free.update({d: _free(p) for d, p in zip(kept, placed, strict=True)})
    return free


def _distances(root) -> dict:
    """Each value's least number of arithmetic ops from `root` (moves count nothing), up to
    one more than the deepest expansion (`_DEPTHS`): `is_zero` reads no farther (a value
    beyond is an atom at every depth, and one at the last distance shows there is more to
    expand), so the walk stays near the root, not the whole program above it."""
    limit = _DEPTHS[-1] + 1
    distance = {root: 0}
    frontier = [root]
    while frontier:
        nxt = []
        for value in frontier:
            op = defining_op(value)
            if op is None or (op.name not in _ARITHMETIC and op.name not in MOVES):
                continue
            step = 1 if op.name in _ARITHMETIC else 0
            for operand in op.operands:
                d = distance[value] + step
                if d <= limit and d < distance.get(operand, 1 << 30):
                    distance[operand] = d
                    nxt.append(operand)
        frontier = nxt
    return distance


def _cleared(builder: _Builder, monomials: list[_Monomial]) -> list[_Monomial]:
    """Multiply by the computed denominators' powers and expand them, one at a time."""
    for _ in range(8):
        inverses = {}
        for m in monomials:
            for atom, idx, power in m.factors:
                value = builder.atom_values[atom]
                if power < 0 and builder.expands(value):
                    if any(kind == "b" for kind, _ in idx):
                        raise _TooBig
                    inverses.setdefault((atom, idx), 0)
                    inverses[atom, idx] = max(inverses[atom, idx], -power)
        if not inverses:
            return monomials
        (atom, idx), k = next(iter(inverses.items()))
        value = builder.atom_values[atom]
        free = {i: index for i, index in enumerate(idx)}
        expansion = [_mapped(m, free) for m in builder.poly(value)]
        out = []
        for m in monomials:
            power = sum(p for a, i, p in m.factors if (a, i) == (atom, idx)) + k
            rest = tuple(f for f in m.factors if (f[0], f[1]) != (atom, idx))
            terms = [_Monomial(m.coef, rest, m.sizes)]
            for _ in range(power):
                terms = _times(terms, expansion)
            out += terms
        monomials = _normal(out)
    raise _TooBig


class Keys:
    """The structural keys (`_Builder.key`) of one module's values, shared by the questions
    asked of it (roots near one another read the same values): per value, its key at each
    height and its op's own part (`memo`, a `match.Memo`), and the keys' numbers
    (`interned`). A value's key describes the ops within `_KEY_HEIGHT` levels above it, so
    `forget_downstream` must be told the ops given other operands or attributes since."""

    def __init__(self) -> None:
        self.memo = Memo()
        self.interned: dict = {}

    def forget_downstream(self, ops: list) -> None:
        """Drop the keys of the values computed from `ops` (changed), and of those computed
        from them."""
        self.memo.forget_downstream(ops)


def is_zero(value, atoms_finite: Callable[[list], bool] | None = None,
            keys: Keys | None = None) -> bool:
    """`value` is zero in real arithmetic, for any content of the values it reads beyond the
    expanded ones; every atom finite, as `atoms_finite(atoms)` decides (the caller's
    `finite.judge`; by default `nonfinite_kinds` in the active judge's mode, strict outside
    one). False when undecided. `keys`: structural keys found by earlier questions about
    the module as it is (`Keys`)."""
    distance = _distances(value)
    table = keys if keys is not None else Keys()
    keys, interned = table.memo, table.interned
    tried: tuple[int, str] | None = None  # the first try: its depth and outcome
    for depth in (_FIRST_DEPTH, *_DEPTHS):
        if tried is not None and depth == tried[0]:
            outcome = tried[1]  # known by now
        else:
            builder = _Builder(depth, distance, keys, interned)
            try:
                outcome = "nonzero" if _cleared(builder, builder.poly(value)) else "zero"
            except _TooBig:
                outcome = "too big"
            if outcome == "zero":
                atoms = list(builder.atom_values.values())
                if atoms_finite is None:
                    memo = active().memo()
                    finite = all(nonfinite_kinds(v, memo) == 0 for v in atoms)
                else:
                    finite = atoms_finite(atoms)
                if finite:
                    return True
                outcome = "not finite"
            if tried is None:
                tried = (depth, outcome)
                continue
        if outcome in ("too big", "not finite"):
            return False
        if all(distance.get(v, depth + 1) <= depth for v in distance
               if defining_op(v) is not None and defining_op(v).name in _ARITHMETIC):
            return False
    return False
