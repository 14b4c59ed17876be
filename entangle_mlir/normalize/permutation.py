"""Rows permuted and put back: a gather by a permutation undone by its inverse (exact rewrites).

The sorted (dropless) MoE dispatch sorts the tokens by expert, computes each token's row, and
puts the rows back: `order = argsort(expert); ys = f(x[order]); out = ys[argsort(order)]` (or
`zeros.at[order].set(ys)`). The facts that make `out = f(x)` exact:

* the argsort of anything is a permutation of [0, n): a sort only permutes its operands, and
  argsort's payload is the iota (`sort((keys, iota))#1`); so is the iota itself, and so is an
  inverse below (`is_permutation`);
* the argsort of a permutation p is its inverse: `p[argsort(p)] = sort(p) = iota` (an
  ascending sort of the values 0..n-1, distinct, whatever the stability); and so is the
  scatter of the iota to p (`inv[p[i]] = i`) (`inverse_of`);
* a computation that makes row i of its result from row i of its operands (elementwise ops,
  contractions and reductions keeping the row dim, a gather whose index rows follow the row
  dim, broadcasts, transposes) commutes with permuting the rows: `f(Y[p]) = f(Y)[p]`, and a
  value constant along the row dim is its own permutation (`_plan`);
* then `f(Y)[p][inv] = f(Y)`, and a scatter of `f(Y)[p]` to the rows p (each row written once,
  p being onto) is `f(Y)` (`_unpermuted_gather`, `_unpermuted_scatter`).

A permutation p indexes within [0, n), so jax's wrap of negative indices `select(p < 0, p + n,
p)` is p itself. Only 1-D permutations of a whole dim are read (the flattened tokens of a
MoE). The rewrite fires only where the inverse meets the permutation, so it never moves a
gather away from where another rewrite wants it; it decides before it builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import describe, reducer_kind
from entangle_mlir.normalize.match import (
    defining_op,
    dot_operand_dims,
    erase_and_prune,
    i64s,
    replace_uses,
    set_operand,
    shape_of,
    splat_of,
)

MAX_PLAN = 256
"""The most ops one plan visits (a MoE layer's per-token computation is a few dozen)."""


def _int_attr(op: ir.Operation, name: str) -> int:
    return ir.IntegerAttr(op.attributes[name]).value


def _gather_numbers(op: ir.Operation):
    return stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])


def _index_vector(indices) -> object | None:
    """The 1-D index an (n, 1) or (n,) index operand holds (through broadcast_in_dim and
    reshape that only add the unit vector dim)."""
    value = indices
    while len(shape_of(value)) != 1:
        op = defining_op(value)
        if op is None or op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape") \
                or [n for n in shape_of(value) if n != 1] != [
                    n for n in shape_of(op.operands[0]) if n != 1]:
            return None
        value = op.operands[0]
    return value


def _unwrapped(value):
    """`value` without jax's wrap of negative indices `select(v < 0, v + n, v)` when v is a
    permutation (never negative)."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.select":
        return value
    pred, wrapped = defining_op(op.operands[0]), defining_op(op.operands[1])
    if pred is None or pred.name != "stablehlo.compare" or wrapped is None or \
            wrapped.name != "stablehlo.add" or op.operands[2] not in list(wrapped.operands) or \
            describe(pred).attrs.get("comparison_direction") != "LT" or \
            pred.operands[0] != op.operands[2] or not splat_of(pred.operands[1], 0.0):
        return value
    return op.operands[2] if is_permutation(op.operands[2]) else value


def _row_gather(op: ir.Operation) -> tuple[object, object, int] | None:
    """A gather of whole slices along one dim d at a 1-D index, keeping the dims in place
    (`Y[idx]` along d): (Y, the index unwrapped, d)."""
    if op.name != "stablehlo.gather" or len(op.operands) != 2:
        return None
    n = _gather_numbers(op)
    if list(n.operand_batching_dims) or list(n.start_index_map) != list(
            n.collapsed_slice_dims) or len(n.start_index_map) != 1:
        return None
    d = n.start_index_map[0]
    operand, indices = op.operands
    shape, result = shape_of(operand), shape_of(op.results[0])
    sizes = list(ir.DenseI64ArrayAttr(op.attributes["slice_sizes"]))
    if sizes != [1 if k == d else s for k, s in enumerate(shape)] or result != shape or \
            list(n.offset_dims) != [k for k in range(len(shape)) if k != d]:
        return None
    index = _index_vector(indices)
    if index is None or n.index_vector_dim != len(shape_of(indices)) - (
            1 if shape_of(indices)[-1] == 1 and len(shape_of(indices)) == 2 else 0):
        return None
    return operand, _unwrapped(index), d


def _sort_payload(value) -> tuple[ir.Operation, int] | None:
    """The 1-D sort whose result `value` is, with the result's index."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.sort" or len(shape_of(value)) != 1:
        return None
    return op, next(i for i, r in enumerate(op.results) if r == value)


def _is_iota(value) -> bool:
    op = defining_op(value)
    return op is not None and op.name == "stablehlo.iota" and len(shape_of(value)) == 1


def _comparator(sort: ir.Operation) -> str | None:
    """The direction of a sort's comparator when it is one compare of operand 0's pair
    (`compare(dir, a0, b0)`, the keys alone), else None."""
    block = sort.regions[0].blocks[0]
    ops = list(block.operations)
    if len(ops) != 2 or ops[0].operation.name != "stablehlo.compare":
        return None
    compare = ops[0].operation
    if list(compare.operands) != [block.arguments[0], block.arguments[1]] or \
            list(ops[1].operation.operands) != [compare.results[0]]:
        return None
    return describe(compare).attrs.get("comparison_direction")


def is_permutation(value) -> bool:
    """`value` (1-D, length n) holds each of 0..n-1 once: an iota, a sort's result whose
    operand is the iota (argsort), an inverse of a permutation (`inverse_of`)."""
    if _is_iota(value):
        return True
    found = _sort_payload(value)
    if found is not None:
        sort, at = found
        return _comparator(sort) is not None and _is_iota(sort.operands[at])
    return inverse_of(value) is not None


def inverse_of(value) -> object | None:
    """The permutation p whose inverse `value` is: `argsort(p)` (an ascending sort of p with
    the iota as payload) or the iota scattered to p (`zeros.at[p].set(iota)`); None."""
    found = _sort_payload(value)
    if found is not None:
        sort, at = found
        if at == 1 and len(sort.operands) == 2 and _is_iota(sort.operands[1]) and \
                _comparator(sort) == "LT" and is_permutation(sort.operands[0]):
            return sort.operands[0]
        return None
    op = defining_op(value)
    if op is None or op.name != "stablehlo.scatter" or len(shape_of(value)) != 1:
        return None
    row = _row_scatter(op)
    if row is None or reducer_kind(op) != "replace" or not _is_iota(op.operands[2]):
        return None
    return row[0]


def _row_scatter(op: ir.Operation) -> tuple[object, int] | None:
    """A scatter of whole slices along one dim d at a 1-D index that is a permutation of d,
    updates shaped as the operand: (the permutation, d)."""
    if op.name != "stablehlo.scatter" or len(op.operands) != 3:
        return None
    n = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    to_operand = list(n.scattered_dims_to_operand_dims)
    if list(n.input_batching_dims) or len(to_operand) != 1 or \
            list(n.inserted_window_dims) != to_operand:
        return None
    d = to_operand[0]
    operand, indices, updates = op.operands
    shape = shape_of(operand)
    if shape_of(updates) != shape or list(n.update_window_dims) != [
            k for k in range(len(shape)) if k != d]:
        return None
    index = _index_vector(indices)
    if index is None or shape_of(index)[0] != shape[d]:
        return None
    index = _unwrapped(index)
    return (index, d) if is_permutation(index) else None


@dataclass
class _Plan:
    """How to build `f(Y)` from `f(Y)[p]`: `value` as it stands (`keep`), the operand of a
    gather by p (`source`), or a clone of `op` with the operands planned in `operands`."""

    keep: object = None
    source: object = None
    op: ir.Operation | None = None
    operands: dict[int, _Plan] = field(default_factory=dict)


class _Planner:
    def __init__(self, perm, block) -> None:
        self.perm = perm
        self.block = block
        self.budget = MAX_PLAN
        self.memo: dict = {}

    def plan(self, value, dim: int | None) -> _Plan | None:
        """`value` unpermuted along `dim` (None: `value` has no such dim, it is kept)."""
        if dim is None:
            return _Plan(keep=value)
        key = (value, dim)
        if key not in self.memo:
            self.memo[key] = self._plan(value, dim)
        return self.memo[key]

    def _plan(self, value, dim: int) -> _Plan | None:
        self.budget -= 1
        op = defining_op(value)
        if self.budget < 0 or op is None or op.block != self.block:
            return None
        if splat_of(value, 0.0) or splat_of(value, 1.0):
            return _Plan(keep=value)
        row = _row_gather(op)
        if row is not None and row[1] == self.perm and row[2] == dim:
            return _Plan(source=row[0])
        dims = _operand_dims(op, dim)
        if dims is None:
            return None
        if all(d is None for d in dims):
            return _Plan(keep=value)  # constant along the row dim
        operands = {}
        for at, d in enumerate(dims):
            planned = self.plan(op.operands[at], d)
            if planned is None:
                return None
            operands[at] = planned
        return _Plan(op=op, operands=operands)


def _operand_dims(op: ir.Operation, dim: int) -> list[int | None] | None:
    """For each operand of `op`, the dim whose rows make result dim `dim`'s rows (None: the
    operand has none, it is the same for every row); None where `op` does not compute row i
    from rows i alone."""
    name = op.name
    if len(op.results) != 1 or not len(op.operands):
        return None
    if name in ELEMENTWISE_OPS or name in ("stablehlo.convert", "stablehlo.select"):
        if any(shape_of(v) != shape_of(op.results[0]) for v in op.operands):
            return None
        return [dim] * len(op.operands)
    if name == "stablehlo.broadcast_in_dim":
        dims = i64s(op, "broadcast_dimensions")
        if dim not in dims or shape_of(op.operands[0])[dims.index(dim)] == 1:
            return [None]
        return [dims.index(dim)]
    if name == "stablehlo.transpose":
        return [i64s(op, "permutation")[dim]]
    if name == "stablehlo.dot_general":
        return dot_operand_dims(op, dim)
    if name == "stablehlo.reduce" and len(op.operands) == 2:
        reduced = i64s(op, "dimensions")
        kept = [k for k in range(len(shape_of(op.operands[0]))) if k not in reduced]
        return [kept[dim], None]
    if name == "stablehlo.gather" and len(op.operands) == 2:
        n = _gather_numbers(op)
        if dim in list(n.offset_dims) or list(n.operand_batching_dims):
            return None
        batch = [k for k in range(len(shape_of(op.results[0]))) if k not in n.offset_dims]
        index_dims = [k for k in range(len(shape_of(op.operands[1])))
                      if k != n.index_vector_dim]
        return [None, index_dims[batch.index(dim)]]
    return None


def _build(plan: _Plan, built: dict):
    """The value a plan stands for (clones inserted at the current insertion point)."""
    if plan.keep is not None:
        return plan.keep
    if plan.source is not None:
        return plan.source
    key = plan.op.results[0]
    if key not in built:
        values = {at: _build(p, built) for at, p in plan.operands.items()}
        clone = plan.op.clone()
        for at, value in values.items():
            if value != clone.operands[at]:
                set_operand(clone, at, value)
        built[key] = clone.results[0]
    return built[key]


def _unpermuted(op: ir.Operation, value, perm, dim: int):
    """`f(Y)` for `value = f(Y)[perm]` along `dim`, built before `op`; None."""
    plan = _Planner(perm, op.block).plan(value, dim)
    if plan is None or plan.keep is not None:
        return None
    with ir.InsertionPoint(op), op.location:
        return _build(plan, {})


def _unpermuted_gather(op: ir.Operation) -> int:
    """`Z[q]` along d, q the inverse of a permutation p and `Z = f(Y)[p]` along d: `f(Y)`."""
    row = _row_gather(op)
    if row is None:
        return 0
    value, index, dim = row
    perm = inverse_of(index)
    if perm is None or shape_of(perm)[0] != shape_of(value)[dim]:
        return 0
    new = _unpermuted(op, value, perm, dim)
    if new is None:
        return 0
    replace_uses(op.results[0], new)
    erase_and_prune(op)
    return 1


def _unpermuted_scatter(op: ir.Operation) -> int:
    """A scatter of `Z = f(Y)[p]` to the rows p (a permutation: every row written once):
    `f(Y)` where it replaces, `operand + f(Y)` where it adds (`f(Y)` into zeros)."""
    row = _row_scatter(op)
    kind = reducer_kind(op)
    if row is None or kind not in ("replace", "add"):
        return 0
    perm, dim = row
    new = _unpermuted(op, op.operands[2], perm, dim)
    if new is None:
        return 0
    if kind == "add" and not splat_of(op.operands[0], 0.0):
        with ir.InsertionPoint(op), op.location:
            new = stablehlo.AddOp(op.operands[0], new).result
    replace_uses(op.results[0], new)
    erase_and_prune(op)
    return 1


REWRITES = {
    "stablehlo.gather": _unpermuted_gather,
    "stablehlo.scatter": _unpermuted_scatter,
}
"""The permutation rewrites by op name (joined with `idioms.REWRITES` by `rewrites.py`)."""
