"""A one-hot tensor contracted, picked or spread is a gather or a scatter (exact rewrites).

`one_hot(ids, n)` (jax.nn.one_hot: `ids[..., None] == iota(n)`, converted to a number, or the
predicate itself in a `where`) holds at position k of its class dim `c` the truth of
`ids == k`. Three things are done with it, each the same as an index operation:

* contracted with a table (`one_hot(ids) @ T`, the one-hot embedding): the row `T[ids]`
  where `0 <= ids < n`, zeros elsewhere: `where(0 <= ids < n, T[clip(ids, 0, n - 1)], 0)`;
* multiplied with X and summed over the class dim (`sum(X * one_hot(labels), -1)`, the
  cross-entropy pick): `where(0 <= ids < n, take_along_axis(X, clip(ids)), 0)`;
* multiplied with per-row values g constant along the class dim (`g[..., None] *
  one_hot(labels)`, the pick's gradient), or contracted with G over every dim but the classes
  (`one_hot(ids).T @ G`, the embedding's gradient): the scatter-add of g (G's rows) into
  zeros at ids, which drops an update whose index is out of range (XLA's and the verifier's
  scatter semantics), as the one-hot gives it no row. A one-hot times one value everywhere
  (`one_hot * c`, a mean loss's cotangent) is a scaled one-hot, kept elementwise: a scatter
  of it would only cost the general tier a symbolic scatter where both programs spell it so.

Each is exact for every id: the bounds test and the clip spell what the one-hot does with an
id outside [0, n). A product `0 * x` is 0 only for finite x, so the float value the one-hot
multiplies must hold no infinity or NaN (`finite.judge`: under --assume-no-overflow where only
an overflow could make one). The forms built are the ones jax lowers `T[ids]`,
`take_along_axis` and their gradients to, so a program spelled with one-hots and one spelled
with gathers meet; where the ids are out of range the two spellings differ (a gather clamps,
jax's `take_along_axis` fills NaN), which only the valid-index assumption
(`analysis/valid_indices.py`) settles, stated in the report. Where the ids are known in range
(`int_ranges.decided`: a vocab-parallel label masked to 0 first) the test and clip are left
out.

A one-hot is recognised as a compare EQ (integer) of a value broadcast along the class dim
(the ids) with an iota along it, either order, through broadcast_in_dim and unit reshapes, the
iota possibly shifted by scalars (XLA's per-device `iota + 16 * partition`: a one-hot of the
ids less the shift), and through a transpose of the converted one-hot. Ids that are positions
themselves (`iota == iota'`, a diagonal mask) are left alone: they index nothing, and the
walk reads such masks as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import compare_type, describe
from entangle_mlir.normalize.finite import judge, nonfinite_kinds
from entangle_mlir.normalize.int_ranges import decided
from entangle_mlir.normalize.match import (
    MOVES,
    defining_op,
    erase_and_prune,
    i64s,
    replace_uses,
    shape_of,
    splat_of,
    sum_reduce,
)


@dataclass(frozen=True)
class OneHot:
    """`ids == iota` along `dim` of a tensor of shape `shape`: `ids` is a value of that shape
    without `dim` (built on demand by `ids_value`), read from the operand of `broadcast` (a
    broadcast_in_dim creating the class dim) and transposed by `perm` (a transpose of the
    one-hot: result dim k is dim perm[k] of the broadcast), less the scalars `offsets` the
    iota was shifted by (`ids == iota + o` is `ids - o == iota`, both in wrapping integer
    arithmetic); `signed`: the compare's type."""

    broadcast: ir.Operation
    dim: int
    shape: tuple[int, ...]
    signed: bool
    perm: tuple[int, ...] | None = None
    offsets: tuple = ()

    @property
    def classes(self) -> int:
        return self.shape[self.dim]

    @property
    def ids_shape(self) -> tuple[int, ...]:
        return tuple(n for d, n in enumerate(self.shape) if d != self.dim)

    def transposed(self, perm: list[int]) -> OneHot:
        """This one-hot transposed by `perm`."""
        inner = self.perm or tuple(range(len(self.shape)))
        return OneHot(self.broadcast, perm.index(self.dim), tuple(self.shape[p] for p in perm),
                      self.signed, tuple(inner[p] for p in perm), self.offsets)

    def ids_value(self):
        """The ids at `ids_shape` (built at the current insertion point)."""
        source = self.broadcast.operands[0]
        dims = i64s(self.broadcast, "broadcast_dimensions")
        dim = self.dim if self.perm is None else self.perm[self.dim]
        kept = [i for i, d in enumerate(dims) if d != dim]
        element = ir.RankedTensorType(source.type).element_type
        if len(kept) != len(dims):
            squeezed = [shape_of(source)[i] for i in kept]
            source = stablehlo.ReshapeOp(ir.RankedTensorType.get(squeezed, element),
                                         source).result
        target = [d - (d > dim) for d in (dims[i] for i in kept)]
        inner = shape_of(self.broadcast.results[0])
        inner_ids = [n for d, n in enumerate(inner) if d != dim]
        if tuple(shape_of(source)) != tuple(inner_ids) or target != list(range(len(target))):
            source = stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(inner_ids, element),
                                                source, target).result
        for offset in self.offsets:
            spread = stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(inner_ids, element),
                                                offset, []).result
            source = stablehlo.SubtractOp(source, spread).result
        if self.perm is None:
            return source
        order = [p - (p > dim) for p in self.perm if p != dim]
        if order == sorted(order):
            return source
        return stablehlo.TransposeOp(source, order).result


def _positions(value) -> tuple[int, tuple] | None:
    """(d, offsets) when `value` holds at each element its index along dim d plus the sum of
    the scalars `offsets` (an iota, plus broadcast scalars, through broadcast_in_dim and
    reshapes that add or drop unit dims, never stretching d: XLA's per-device
    `iota + 16 * partition`), else None."""
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "stablehlo.iota":
        return ir.IntegerAttr(op.attributes["iota_dimension"]).value, ()
    if op.name == "stablehlo.add":
        for at in (0, 1):
            scalar = defining_op(op.operands[1 - at])
            if scalar is not None and scalar.name == "stablehlo.broadcast_in_dim" and \
                    not shape_of(scalar.operands[0]):
                inner = _positions(op.operands[at])
                if inner is not None:
                    return inner[0], (*inner[1], scalar.operands[0])
        return None
    if op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
        return None
    inner = _positions(op.operands[0])
    if inner is None:
        return None
    dim, offsets = inner
    source, result = shape_of(op.operands[0]), shape_of(op.results[0])
    if op.name == "stablehlo.broadcast_in_dim":
        target = i64s(op, "broadcast_dimensions")[dim]
        return (target, offsets) if result[target] == source[dim] else None
    if source[dim] < 2 or [n for n in source if n != 1] != [n for n in result if n != 1]:
        return None
    rank = [d for d, n in enumerate(source) if n != 1].index(dim)
    return [d for d, n in enumerate(result) if n != 1][rank], offsets


def _constant_along(value, dim: int) -> ir.Operation | None:
    """The broadcast_in_dim that makes `value` constant along `dim` (it creates `dim` from no
    operand dim or a unit one), else None."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.broadcast_in_dim":
        return None
    dims = i64s(op, "broadcast_dimensions")
    if dim in dims and shape_of(op.operands[0])[dims.index(dim)] != 1:
        return None
    return op


def predicate_one_hot(pred) -> OneHot | None:
    """`pred` is `ids == iota` along one dim (an integer compare EQ, either order)."""
    op = defining_op(pred)
    if op is None or op.name != "stablehlo.compare" or \
            describe(op).attrs.get("comparison_direction") != "EQ":
        return None
    kind = compare_type(op)
    if kind not in ("SIGNED", "UNSIGNED"):
        return None
    element = ir.IntegerType(ir.RankedTensorType(op.operands[0].type).element_type)
    for ids_at in (0, 1):
        found = _positions(op.operands[1 - ids_at])
        if found is None:
            continue
        dim, offsets = found
        if shape_of(pred)[dim] >= 1 << (element.width - 1):
            continue  # the iota's positions wrap around in its type
        broadcast = _constant_along(op.operands[ids_at], dim)
        if broadcast is not None and _positions(op.operands[ids_at]) is None:
            return OneHot(broadcast, dim, shape_of(pred), kind == "SIGNED", offsets=offsets)
    return None


def numeric_one_hot(value) -> OneHot | None:
    """`value` is a one-hot as numbers: `convert(pred)` or `select(pred, 1, 0)`."""
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "stablehlo.transpose":
        inner = numeric_one_hot(op.operands[0])
        return None if inner is None else inner.transposed(i64s(op, "permutation"))
    if op.name == "stablehlo.convert" and \
            ir.RankedTensorType(op.operands[0].type).element_type == ir.IntegerType.get_signless(1):
        return predicate_one_hot(op.operands[0])
    if op.name == "stablehlo.select" and splat_of(op.operands[1], 1.0) and \
            splat_of(op.operands[2], 0.0):
        return predicate_one_hot(op.operands[0])
    return None


def _finite(value, at: ir.Operation) -> bool:
    """A float value multiplied by the one-hot's zeros holds no infinity or NaN (integers:
    always)."""
    if isinstance(ir.RankedTensorType(value.type).element_type, ir.IntegerType):
        return True
    return judge(lambda memo: not nonfinite_kinds(value, memo), at)


def _splat(shape, element, number):
    tensor = ir.RankedTensorType.get(list(shape), element)
    attr = ir.IntegerAttr.get(element, int(number)) if isinstance(element, ir.IntegerType) \
        else ir.FloatAttr.get(element, float(number))
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(tensor, attr)).result


def _compare(a, b, direction: str, signed: bool):
    kind = stablehlo.ComparisonTypeAttr.get("SIGNED" if signed else "UNSIGNED")
    return stablehlo.CompareOp(a, b, stablehlo.ComparisonDirectionAttr.get(direction),
                               compare_type=kind).result


@dataclass
class _Index:
    """The ids of a one-hot as an index: `ids` clipped into [0, n) where needed, and the test
    `0 <= ids < n` (None where it always holds)."""

    ids: object
    inside: object | None


def _index(hot: OneHot) -> _Index:
    """The ids, their bounds test and their clip (built at the current insertion point; the
    test and the clip left out where the ids' range is known inside [0, n))."""
    ids = hot.ids_value()
    element = ir.RankedTensorType(ids.type).element_type
    shape = hot.ids_shape
    upper = _compare(ids, _splat(shape, element, hot.classes), "LT", hot.signed)
    inside = stablehlo.AndOp(_compare(ids, _splat(shape, element, 0), "GE", hot.signed),
                             upper).result if hot.signed else upper
    if decided(inside) is True:
        erase_and_prune(defining_op(inside))
        return _Index(ids, None)
    low = stablehlo.MaxOp(_splat(shape, element, 0), ids).result
    clipped = stablehlo.MinOp(_splat(shape, element, hot.classes - 1), low).result
    return _Index(clipped, inside)


def _masked(index: _Index, rows, ids_dims: list[int]):
    """`where(inside, rows, 0)`, the test broadcast along `ids_dims` of `rows`."""
    if index.inside is None:
        return rows
    rows_type = ir.RankedTensorType(rows.type)
    pred_type = ir.RankedTensorType.get(rows_type.shape, ir.IntegerType.get_signless(1))
    pred = stablehlo.BroadcastInDimOp(pred_type, index.inside, ids_dims).result
    zeros = _splat(rows_type.shape, rows_type.element_type, 0)
    return stablehlo.SelectOp(pred, rows, zeros).result


def _with_vector_dim(ids, shape: list[int]):
    """`ids` reshaped to `shape` (the index shape with its index vector dim of size 1)."""
    element = ir.RankedTensorType(ids.type).element_type
    return stablehlo.ReshapeOp(ir.RankedTensorType.get(shape, element), ids).result


def _dot_numbers(op: ir.Operation):
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    return (list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions),
            list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions))


def _one_hot_matmul(dot: ir.Operation) -> int:
    """`dot_general(one_hot(ids), T)` contracting the class dim alone with a dim t of T (either
    operand order, no batch dims) is `where(0 <= ids < n, T[clip(ids)] along t, 0)`; a
    contraction of every dim but the classes with G is the scatter-add of G at ids
    (`_one_hot_scatter_matmul`). T (G) finite, the result of T's (G's) type."""
    lhs_batch, _, lhs_contract, rhs_contract = _dot_numbers(dot)
    if lhs_batch:
        return 0
    for hot_at in (0, 1):
        hot = numeric_one_hot(dot.operands[hot_at])
        table = dot.operands[1 - hot_at]
        if hot is None or ir.RankedTensorType(table.type).element_type != \
                ir.RankedTensorType(dot.results[0].type).element_type:
            continue
        hot_contract, table_contract = (lhs_contract, rhs_contract) if hot_at == 0 else (
            rhs_contract, lhs_contract)
        tokens = [d for d in range(len(hot.shape)) if d != hot.dim]
        if hot_contract == [hot.dim] and _finite(table, dot):
            return _replace_by_gather(dot, hot, hot_at, table, table_contract[0])
        if sorted(hot_contract) == tokens and _finite(table, dot):
            return _replace_by_scatter(dot, hot, hot_at, table, hot_contract, table_contract)
    return 0


def _replace_by_gather(dot: ir.Operation, hot: OneHot, hot_at: int, table, t: int) -> int:
    table_shape = shape_of(table)
    free = len(table_shape) - 1
    rank = len(hot.ids_shape)
    offsets = list(range(rank, rank + free)) if hot_at == 0 else list(range(free))
    ids_dims = list(range(rank)) if hot_at == 0 else list(range(free, free + rank))
    with ir.InsertionPoint(dot), dot.location:
        index = _index(hot)
        start = _with_vector_dim(index.ids, [*hot.ids_shape, 1])
        numbers = stablehlo.GatherDimensionNumbers.get(
            offset_dims=offsets, collapsed_slice_dims=[t], operand_batching_dims=[],
            start_indices_batching_dims=[], start_index_map=[t], index_vector_dim=rank)
        sizes = [1 if d == t else n for d, n in enumerate(table_shape)]
        rows = stablehlo.GatherOp(table, start, numbers, sizes, indices_are_sorted=False,
                                  results=[dot.results[0].type]).result
        new = _masked(index, rows, ids_dims)
    replace_uses(dot.results[0], new)
    erase_and_prune(dot)
    return 1


def _add_region(op: ir.Operation, element) -> None:
    scalar = ir.RankedTensorType.get([], element)
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.ReturnOp([stablehlo.AddOp(*block.arguments).result])


def _scatter_add(operand_shape, element, start, updates, numbers):
    """`scatter(zeros, start, updates)` adding (built at the current insertion point)."""
    zeros = _splat(operand_shape, element, 0)
    op = stablehlo.ScatterOp([ir.RankedTensorType.get(list(operand_shape), element)], [zeros],
                             start, [updates], numbers, indices_are_sorted=False,
                             unique_indices=False)
    _add_region(op.operation, element)
    return op.results[0]


def _replace_by_scatter(dot: ir.Operation, hot: OneHot, hot_at: int, table,
                        hot_contract: list[int], table_contract: list[int]) -> int:
    """`one_hot(ids)` contracted with G over every ids dim: G's rows scattered (added) into
    zeros at ids, an id out of range dropped (the embedding's gradient)."""
    rank = len(hot.ids_shape)
    table_shape = shape_of(table)
    pairs = dict(zip(hot_contract, table_contract))
    token_dims = [pairs[d] for d in range(len(hot.shape)) if d != hot.dim]
    free = [d for d in range(len(table_shape)) if d not in table_contract]
    order = token_dims + free
    element = ir.RankedTensorType(table.type).element_type
    operand_shape = [hot.classes] + [table_shape[d] for d in free]
    with ir.InsertionPoint(dot), dot.location:
        updates = table
        if order != list(range(len(table_shape))):
            updates = stablehlo.TransposeOp(table, order).result
        start = _with_vector_dim(hot.ids_value(), [*hot.ids_shape, 1])
        numbers = stablehlo.ScatterDimensionNumbers.get(
            update_window_dims=list(range(rank, rank + len(free))), inserted_window_dims=[0],
            input_batching_dims=[], scatter_indices_batching_dims=[],
            scattered_dims_to_operand_dims=[0], index_vector_dim=rank)
        new = _scatter_add(operand_shape, element, start, updates, numbers)
        if hot_at == 1:
            new = stablehlo.TransposeOp(new, [*range(1, len(operand_shape)), 0]).result
    replace_uses(dot.results[0], new)
    erase_and_prune(dot)
    return 1


def _picked(value) -> tuple[OneHot, object, bool] | None:
    """`value` as `x * one_hot` (either order) or `where(one_hot, x, 0)`: the one-hot, x, and
    whether x needs to be finite (the product)."""
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "stablehlo.select" and splat_of(op.operands[2], 0.0):
        hot = predicate_one_hot(op.operands[0])
        return None if hot is None else (hot, op.operands[1], False)
    if op.name == "stablehlo.multiply":
        for hot_at in (0, 1):
            hot = numeric_one_hot(op.operands[hot_at])
            if hot is not None:
                return hot, op.operands[1 - hot_at], True
    return None


def _along_shape(hot: OneHot) -> list[int]:
    return [1 if d == hot.dim else n for d, n in enumerate(hot.shape)]


def _one_hot_pick(reduce: ir.Operation) -> int:
    """`sum(x * one_hot(ids), c)` over the class dim c alone is `where(0 <= ids < n,
    take_along_axis(x, clip(ids), c), 0)` (the cross-entropy's target logit), spelled as jax
    lowers take_along_axis: a gather batched over every other dim."""
    if not sum_reduce(reduce):
        return 0
    found = _picked(reduce.operands[0])
    if found is None:
        return 0
    hot, x, needs_finite = found
    if i64s(reduce, "dimensions") != [hot.dim] or (needs_finite and not _finite(x, reduce)):
        return 0
    rank = len(hot.shape)
    others = [d for d in range(rank) if d != hot.dim]
    along = _along_shape(hot)
    element = ir.RankedTensorType(x.type).element_type
    with ir.InsertionPoint(reduce), reduce.location:
        index = _index(hot)
        start = _with_vector_dim(index.ids, [*along, 1])
        numbers = stablehlo.GatherDimensionNumbers.get(
            offset_dims=[], collapsed_slice_dims=[hot.dim], operand_batching_dims=others,
            start_indices_batching_dims=others, start_index_map=[hot.dim],
            index_vector_dim=rank)
        picked = stablehlo.GatherOp(x, start, numbers, [1] * rank, indices_are_sorted=False,
                                    results=[ir.RankedTensorType.get(along, element)]).result
        rows = stablehlo.ReshapeOp(reduce.results[0].type, picked).result
        new = _masked(index, rows, list(range(rank - 1)))
    replace_uses(reduce.results[0], new)
    erase_and_prune(reduce)
    return 1


def _one_hot_spread(select: ir.Operation) -> int:
    """`where(one_hot(ids), g, 0)` with g constant along the class dim is the scatter-add of
    g into zeros at ids along the class dim, batched over the other dims (take_along_axis's
    gradient as jax lowers it; an id out of range is dropped, as the one-hot's zero row)."""
    if not splat_of(select.operands[2], 0.0):
        return 0
    hot = predicate_one_hot(select.operands[0])
    if hot is None:
        return 0
    return _spread(select, hot, select.operands[1])


def _one_hot_spread_product(mul: ir.Operation) -> int:
    """`g * one_hot(ids)` (either order), g finite and constant along the class dim (the
    pick's gradient `g[..., None] * one_hot`): `_one_hot_spread`'s scatter."""
    for hot_at in (0, 1):
        hot = numeric_one_hot(mul.operands[hot_at])
        if hot is not None and hot.perm is None and _finite(mul.operands[1 - hot_at], mul):
            return _spread(mul, hot, mul.operands[1 - hot_at])
    return 0


def _same_everywhere(value, depth: int = 8) -> bool:
    """`value` is one number everywhere: a scalar or a splat, broadcast, reshaped, converted
    or combined elementwise with others such (a mean loss's cotangent `-1/n`)."""
    if all(n == 1 for n in shape_of(value)) or splat_of(value, 0.0) or splat_of(value, 1.0):
        return True
    op = defining_op(value)
    if op is None or depth == 0:
        return False
    if op.name == "stablehlo.constant":
        return bool(ir.DenseElementsAttr(op.attributes["value"]).is_splat)
    if op.name in (*MOVES, "stablehlo.convert") or op.name in ELEMENTWISE_OPS:
        return all(_same_everywhere(v, depth - 1) for v in op.operands)
    return False


def _spread(select: ir.Operation, hot: OneHot, value) -> int:
    """`value` (constant along the class dim) scattered into zeros at the one-hot's ids in
    place of `select`'s result."""
    broadcast = _constant_along(value, hot.dim)
    if broadcast is None or _same_everywhere(value):
        return 0  # a scaled one-hot: no row to scatter
    rank = len(hot.shape)
    others = [d for d in range(rank) if d != hot.dim]
    along = _along_shape(hot)
    result_type = ir.RankedTensorType(select.results[0].type)
    with ir.InsertionPoint(select), select.location:
        # Broadcast straight to the updates' shape: the dims the broadcast creates stay
        # visibly created (a splat cotangent built at a device's local shape).
        updates = stablehlo.BroadcastInDimOp(
            ir.RankedTensorType.get(along, result_type.element_type), broadcast.operands[0],
            i64s(broadcast, "broadcast_dimensions")).result
        start = _with_vector_dim(hot.ids_value(), [*along, 1])
        numbers = stablehlo.ScatterDimensionNumbers.get(
            update_window_dims=[], inserted_window_dims=[hot.dim], input_batching_dims=others,
            scatter_indices_batching_dims=others, scattered_dims_to_operand_dims=[hot.dim],
            index_vector_dim=rank)
        new = _scatter_add(result_type.shape, result_type.element_type, start, updates,
                           numbers)
    replace_uses(select.results[0], new)
    erase_and_prune(select)
    return 1


REWRITES = {
    "stablehlo.multiply": _one_hot_spread_product,
    "stablehlo.dot_general": _one_hot_matmul,
    "stablehlo.reduce": _one_hot_pick,
    "stablehlo.select": _one_hot_spread,
}
"""The one-hot rewrites by op name (joined before `idioms.REWRITES` by `rewrites.py`: a
product by a one-hot is spread here before `idioms._masked_product` makes it a select)."""
