"""Order of values: a proof from the ops alone that one value is at most another, elementwise.

The online softmax's backward (`online_backward.py`) multiplies exponentials of differences
of shifts, `exp(a - b) * exp(b - c)` as `exp(a - c)`: exact only where no factor over- or
underflows alone, which the running maxes' order `a <= b <= c` guarantees (each factor in
[0, 1]). `at_most(x, m, placed)` proves such an order from how the values are computed:

* `x` is -inf everywhere, or `x` is `m` (computed alike);
* `m = maximum(p, q)`: `x <= p` or `x <= q` (a running max bounds the earlier ones); a max
  all_reduce (pmax) of `p` bounds `p`; a reshape that keeps `m`'s vector keeps the order;
* `x = maximum(p, q)`: `p <= m` and `q <= m`;
* `x = reduce_max(x', D)` from -inf (or from `m`'s init): `x' <= m` along `x`'s dims;
* `m = reduce_max(y, d)` (one dim d, any init): `x` holds only elements of `y`'s rows,
  `x = y[.., o:o+n, ..]` along d for some offset o (`slice_offsets`), `m` placed on `x`'s
  other dims in order.

`slice_offsets(x, y, d)` are the offsets o with `x = y[o:o+n]` along d, read off the ops
computing both: the same op (attributes) applied to operands that are slices at one offset
(elementwise ops, broadcast_in_dim, reshape and transpose that keep d, dot_general along a
free or batch dim, collective_permute) or that are the same where the op does not map d;
a concatenation along d holding the slice in one of its operands, or, for `x`, a
concatenation of consecutive slices; the same splat; and `x` and `y` computed alike. These are
the forms a ring's running maxes take once the online softmax's fold (`idioms._online_max`)
has put them over concatenated blocks and `idioms._sink_concat` has moved the
concatenations down to the keys and positions: `m_i = reduce_max(select(mask(concat(pos_1..
pos_i)), dot(q, concat(k_1..k_i)), -inf))`, each an earlier one's prefix. Every step is an
equality of values or the definition of max, so a proof holds for any inputs (no range is
assumed); NaN aside (a NaN is in no order), which the callers exclude (finite shifts).
`bounds._dominates` answers a narrower question for ranges (`x - max(x) <= 0`, over
concatenations not yet sunk).
"""

from __future__ import annotations

import math

from jaxlib.mlir import ir

from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import constant_value, reducer_kind
from entangle_mlir.normalize.bounds import computed_alike
from entangle_mlir.normalize.match import (
    attr_names,
    defining_op,
    dot_operand_dims,
    i64s,
    max_reduce,
    remembered,
    same_attribute,
    same_but,
    shape_of,
    splat_of,
)

_BUDGET = 4096
"""Pairs of values `slice_offsets` compares (and steps `at_most` takes) per question."""

_POSITIONWISE = frozenset({*ELEMENTWISE_OPS, "stablehlo.collective_permute"})
"""Ops that compute each element from the operands' elements at its position (a
collective_permute on every device alike): slicing commutes with them."""


def at_most(x, m, placed: tuple[int, ...] | None = None) -> bool:
    """Every element of `x` is at most the element of `m` a broadcast placing `m`'s non-unit
    dims on `placed` (dims of `x`, in order) puts there; `placed` None: `x` and `m` hold
    vectors of one shape (`x <= m` elementwise, unit dims aside). Proven structurally (module
    docstring); False when no proof is found."""
    if placed is None:
        if _vector(x) != _vector(m):
            return False
        placed = _non_unit(shape_of(x))
    placed = tuple(placed)
    return remembered(("at_most", x, m, placed), lambda: _at_most(x, m, placed, [_BUDGET]))


def _non_unit(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d, n in enumerate(shape) if n != 1)


def _at_most(x, m, placed: tuple[int, ...], budget: list[int]) -> bool:
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if splat_of(x, -math.inf):
        return True
    if placed == _non_unit(shape_of(x)) and shape_of(x) == shape_of(m) and computed_alike(x, m):
        return True
    ox, om = defining_op(x), defining_op(m)
    if om is not None and om.name == "stablehlo.maximum" and any(
            _at_most(x, v, placed, budget) for v in om.operands):
        return True
    if om is not None and _pmax(om) and _at_most(x, om.operands[0], placed, budget):
        return True
    if om is not None and om.name == "stablehlo.reshape" and _vector(om.operands[0]) == _vector(
            m) and _at_most(x, om.operands[0], placed, budget):
        return True
    if ox is not None and om is not None and ox.name == om.name == "stablehlo.transpose" and (
            shape_of(x) == shape_of(m) and placed == _non_unit(shape_of(x))
            and i64s(ox, "permutation") == i64s(om, "permutation")
            and _at_most(ox.operands[0], om.operands[0],
                         _non_unit(shape_of(ox.operands[0])), budget)):
        return True
    if ox is not None and ox.name == "stablehlo.maximum" and all(
            _at_most(v, m, placed, budget) for v in ox.operands):
        return True
    reduced = max_reduce(ox)
    if reduced is not None and _init_at_most(ox.operands[1], m):
        kept = [k for k in range(len(shape_of(ox.operands[0]))) if k not in reduced]
        if _at_most(ox.operands[0], m, tuple(kept[p] for p in placed), budget):
            return True
    return _within_rows(x, m, placed, budget)


def _pmax(op: ir.Operation) -> bool:
    return op.name == "stablehlo.all_reduce" and len(op.operands) == 1 and (
        reducer_kind(op) == "max")


def _vector(value) -> tuple[int, ...]:
    return tuple(n for n in shape_of(value) if n != 1)


def _init_at_most(init, m) -> bool:
    """A max reduction's init value is at most `m`: -inf, or `m`'s own reduction's init."""
    if splat_of(init, -math.inf):
        return True
    om = defining_op(m)
    return max_reduce(om) is not None and _same_constant(init, om.operands[1])


def _same_constant(a, b) -> bool:
    first, second = defining_op(a), defining_op(b)
    return (first is not None and second is not None and first.name == second.name
            == "stablehlo.constant" and same_attribute(first.attributes["value"],
                                                       second.attributes["value"]))


def _within_rows(x, m, placed: tuple[int, ...], budget: list[int]) -> bool:
    """`m = reduce_max(y, d)` and `x` a slice of `y` along d, `m`'s dims placed on `x`'s
    others: each element of `x` is an element of the row of `y` `m` is the max of."""
    om = defining_op(m)
    reduced = max_reduce(om)
    if reduced is None or len(reduced) != 1:
        return False
    y, d = om.operands[0], reduced[0]
    kept = [k for k in range(len(shape_of(y))) if k != d]
    if tuple(k for k in kept if shape_of(y)[k] != 1) != placed:
        return False
    return bool(slice_offsets(x, y, d, budget))


def slice_offsets(x, y, dim: int, budget: list[int] | None = None) -> set[int]:
    """The offsets o with `x = y[.., o:o+n, ..]` along `dim` (n: `x`'s size there) that the
    ops computing both show (module docstring); empty if none is found."""
    return _offsets(x, y, dim, [_BUDGET] if budget is None else budget, {})


def _offsets(x, y, dim: int, budget: list[int], memo: dict) -> set[int]:
    key = (x, y, dim)
    if key not in memo:
        memo[key] = _offsets_of(x, y, dim, budget, memo)
    return memo[key]


def _offsets_of(x, y, dim: int, budget: list[int], memo: dict) -> set[int]:
    budget[0] -= 1
    sx, sy = shape_of(x), shape_of(y)
    if budget[0] < 0 or not same_but(sx, sy, dim) or sx[dim] > sy[dim] or (
            ir.RankedTensorType(x.type).element_type != ir.RankedTensorType(y.type).element_type):
        return set()
    if sx == sy:
        return {0} if computed_alike(x, y) else set()
    every = set(range(sy[dim] - sx[dim] + 1))
    ox, oy = defining_op(x), defining_op(y)
    if oy is None:
        return set()
    found: set[int] = set()
    if oy.name == "stablehlo.concatenate" and _concat_dim(oy) == dim:
        start = 0
        for operand in oy.operands:
            if shape_of(operand)[dim] >= sx[dim]:
                found |= {start + o for o in _offsets(x, operand, dim, budget, memo)}
            start += shape_of(operand)[dim]
    if ox is None:
        return found
    if _splat(x) is not None and _splat(x) == _splat(y):
        return every
    if ox.name == "stablehlo.concatenate" and _concat_dim(ox) == dim:
        # the offsets of the first block, kept where every other block sits at its place
        operands, starts = list(ox.operands), [0]
        for operand in operands[:-1]:
            starts.append(starts[-1] + shape_of(operand)[dim])
        found |= {o for o in every & _offsets(operands[0], y, dim, budget, memo)
                  if all(_holds_at(operand, y, dim, o + start, budget, memo)
                         for operand, start in zip(operands[1:], starts[1:]))}
    dims = _operand_dims(ox, oy, dim)
    if dims is not None:
        joint = every
        for a, b, d in zip(ox.operands, oy.operands, dims, strict=True):
            if d is None:
                if shape_of(a) != shape_of(b) or not computed_alike(a, b):
                    joint = set()
            else:
                joint = joint & _offsets(a, b, d, budget, memo)
            if not joint:
                break
        found |= joint
    return found


def _holds_at(x, y, dim: int, offset: int, budget: list[int], memo: dict) -> bool:
    """`offset in _offsets(x, y, dim)`, looked up in the one block of a concatenation `y`
    holding the window where it is there (a ring's prefix of blocks against a longer one:
    one pair per block, where all their offsets pair every block with every other)."""
    oy = defining_op(y)
    if oy is not None and oy.name == "stablehlo.concatenate" and _concat_dim(oy) == dim:
        start, size = 0, shape_of(x)[dim]
        for operand in oy.operands:
            stop = start + shape_of(operand)[dim]
            if start <= offset and offset + size <= stop:
                if _holds_at(x, operand, dim, offset - start, budget, memo):
                    return True
                break
            start = stop
    return offset in _offsets(x, y, dim, budget, memo)


def _concat_dim(op: ir.Operation) -> int:
    return ir.IntegerAttr(op.attributes["dimension"]).value


def _splat(value) -> float | None:
    """The value a splat constant (or a broadcast of one) holds everywhere; None otherwise."""
    op = defining_op(value)
    while op is not None and op.name == "stablehlo.broadcast_in_dim":
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.constant":
        return None
    array, _ = constant_value(op.attributes["value"])
    try:
        values = set(array.astype(float).reshape(-1).tolist())
    except (TypeError, ValueError):
        return None
    return values.pop() if len(values) == 1 and not math.isnan(next(iter(values))) else None


def _operand_dims(ox: ir.Operation, oy: ir.Operation, dim: int) -> list[int | None] | None:
    """When `ox` and `oy` are the same op (name, attributes, operand count, no regions): for
    each operand, the dim that becomes result dim `dim` (None: it has no such dim, the two
    operands must be the same), so that slicing the results along `dim` slices the operands
    there; None when the op mixes elements along `dim` or the two differ."""
    if ox.name != oy.name or len(ox.operands) != len(oy.operands) or ox.regions or oy.regions:
        return None
    names = attr_names(ox)
    if names != attr_names(oy) or any(not same_attribute(ox.attributes[n], oy.attributes[n])
                                      for n in names):
        return None
    out = shape_of(oy.results[0])
    if ox.name in _POSITIONWISE:
        return [dim if shape_of(v) == out else None for v in oy.operands]
    if ox.name == "stablehlo.transpose":
        return [i64s(oy, "permutation")[dim]]
    if ox.name == "stablehlo.broadcast_in_dim":
        dims = i64s(oy, "broadcast_dimensions")
        if dim not in dims:
            return [None]
        d = dims.index(dim)
        x_maps = shape_of(ox.operands[0])[d] == shape_of(ox.results[0])[dim]
        if shape_of(oy.operands[0])[d] == out[dim]:
            return [d] if x_maps else None
        return [None]
    if ox.name == "stablehlo.reshape":
        source, before = shape_of(oy.operands[0]), math.prod(out[:dim])
        for d in range(len(source)):
            if math.prod(source[:d]) == before and source[d] == out[dim]:
                return [d]
        return None
    if ox.name == "stablehlo.dot_general" and len(ox.operands) == 2:
        return dot_operand_dims(oy, dim)
    return None
