"""Unit dims in jax's transposes: reductions over dims of size 1 are reshapes.

jax transposes `broadcast_in_dim` by summing over every operand dim of size 1 and expanding
again; inside shard_map a split dim of local size 1 (one sequence, head or kv head per device)
is such a dim. Locally that sum is a no-op, but read as a reduction it is a reduction over a
split dim (a partial sum), which the gradient never meant. Two exact local rewrites put these
programs in the form the reference has (`fold_unit_dims`, run by entangle-normalize on both
programs):

* `reduce(x, D)` with identity init, some dims U of D of size 1 and only broadcast_in_dim
  users (the transpose pattern) is `reshape(reduce(x, D \\ U))` (or `reshape(x)` when
  D == U); a reduction that is not broadcast back stays a reduction (a partial sum);
* `broadcast_in_dim(reshape(y))`, where the reshape only drops unit dims of `y`, is
  `broadcast_in_dim(y')` with the dropped dims put back on result dims of size 1 at the same
  place (in order between their neighbours), so a split unit dim keeps its identity;
* a gather with batching dims (`take_along_axis`) whose operand has a unit dim taken whole as
  an offset dim (jax squeezes a local batch of one sequence out of the indices) is the gather
  with that dim as one more batching dim, paired with a unit dim inserted into the indices
  (both read element 0 of the dim; the result keeps its shape); likewise a scatter (its
  gradient) with a unit update window dim. The indices then keep the batch dim the
  reference has, instead of a flattened `(batch * seq)` view of it.
"""

from __future__ import annotations

import math

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.mlir.opinfo import constant_value, reducer_kind

_IDENTITY = {"add": 0.0, "max": -math.inf, "min": math.inf}


def fold_unit_dims(module: ir.Module, ops: list | None = None) -> int:
    """Rewrite unit-dim reductions and re-broadcasts in place; the number of ops rewritten.
    `ops`: the module's ops as `ir.ops_in_order` lists them now (saves the walk)."""
    reduces: list[ir.Operation] = []
    broadcasts: list[ir.Operation] = []
    gathers: list[ir.Operation] = []

    def collect(op):
        if op.name == "stablehlo.reduce":
            reduces.append(op)
        elif op.name == "stablehlo.broadcast_in_dim":
            broadcasts.append(op)

        elif op.name in ("stablehlo.gather", "stablehlo.scatter"):
            gathers.append(op)
        return ir.WalkResult.ADVANCE

    if ops is None:
        module.operation.walk(collect)
    else:
        for name, op in ops:
            if name in _FOLDED:
                collect(op)
    forwards = {_signature(op) for op in broadcasts}
    count = sum(_fold_reduce(op, forwards) for op in reduces)
    count += sum(_fold_broadcast(op) for op in broadcasts)
    count += sum(_fold_gather(op) if op.name == "stablehlo.gather" else _fold_scatter(op)
                 for op in gathers)
    return count


_FOLDED = frozenset({"stablehlo.reduce", "stablehlo.broadcast_in_dim", "stablehlo.gather",
                     "stablehlo.scatter"})
"""The ops `fold_unit_dims` looks at."""


def _shape(value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def _tensor(shape, like) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), ir.RankedTensorType(like.type).element_type)


def _identity_init(op: ir.Operation, kind: str) -> bool:
    owner = op.operands[1].owner
    if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
        owner = owner.operation
    if getattr(owner, "name", "") != "stablehlo.constant":
        return False
    value, _ = constant_value(owner.attributes["value"])
    return value.size == 1 and float(value.reshape(-1)[0]) == _IDENTITY[kind]


def _signature(op: ir.Operation) -> tuple:
    """(operand shape, result shape, broadcast dims) of a broadcast_in_dim."""
    return (_shape(op.operands[0]), _shape(op.results[0]),
            tuple(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"])))


def _fold_reduce(op: ir.Operation, forwards: set[tuple] = frozenset()) -> int:
    if len(op.operands) != 2 or len(op.results) != 1:
        return 0
    kind = reducer_kind(op)
    if kind not in _IDENTITY or not _identity_init(op, kind):
        return 0
    x = op.operands[0]
    shape = _shape(x)
    dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    unit = [d for d in dims if shape[d] == 1]
    result = op.results[0]
    users = [use.owner for use in result.uses]
    # Only the transpose pattern (the reduced dims are broadcast back): a reduction of a split
    # unit dim that is not re-expanded is a genuine partial sum (a per-device loss term).
    if not unit or not users or not all(_puts_back(u, shape, dims, unit, forwards)
                                        for u in users):
        return 0
    with ir.InsertionPoint(op), op.location:
        if len(unit) == len(dims):
            new = stablehlo.ReshapeOp(result.type, x).result
        else:
            kept = [d for d in dims if d not in unit]
            clone = op.clone(ir.InsertionPoint(op))
            clone.attributes["dimensions"] = ir.DenseI64ArrayAttr.get(kept)
            partial = [s for d, s in enumerate(shape) if d not in kept]
            clone.results[0].set_type(_tensor(partial, result))
            new = stablehlo.ReshapeOp(result.type, clone.results[0]).result
    result.replace_all_uses_with(new)
    op.erase()
    return 1


def _puts_back(user, shape: tuple[int, ...], dims: list[int], unit: list[int],
               forwards: set[tuple] = frozenset()) -> bool:
    """`user` is a broadcast_in_dim that puts the reduced unit dims back where they were: with
    the genuinely reduced (non-unit) dims taken out of `shape`, every kept dim lands on its own
    index (jax's transpose of a broadcast re-expands exactly the dims it summed). Or the pair
    is exactly jax's transpose of a broadcast_in_dim of the module (`forwards`: their
    signatures), from `user`'s result shape to `shape`: with one sequence a device, the key
    part `k[:, :, None]` broadcast to every head sums the unit batch dim and the heads and puts
    both back as unit dims, and the transpose of `k[:, :, None]` drops the inserted dim. (A
    reduction followed by another op's expand_dims, a norm gain's gradient put back into its
    layer stack, is not one: its unit dim is the layer slot, not the batch.)"""
    if getattr(user, "name", "") != "stablehlo.broadcast_in_dim":
        return False
    squeezed = [d for d in range(len(shape)) if d not in dims or d in unit]
    position = {d: i for i, d in enumerate(squeezed)}
    kept = [d for d in range(len(shape)) if d not in dims]
    targets = list(ir.DenseI64ArrayAttr(user.attributes["broadcast_dimensions"]))
    result = _shape(user.results[0])
    if targets == [position[d] for d in kept] and len(result) >= len(kept):
        return True
    return any(_transposes(forward, dims, targets)
               for forward in forwards if forward[0] == result and forward[1] == shape)


def _transposes(forward: tuple, dims: list[int], targets: list[int]) -> bool:
    """Whether reducing over `dims` then broadcasting with `targets` is jax's transpose of
    the broadcast_in_dim `forward` (operand shape, result shape, dims): the sum over every
    result dim but those of the operand's non-unit dims, expanded at the operand's unit dims."""
    operand, _, mapped = forward
    wide = [i for i, size in enumerate(operand) if size != 1]
    summed = sorted(set(range(len(forward[1]))) - {mapped[i] for i in wide})
    return sorted(dims) == summed and targets == wide


def _fold_broadcast(op: ir.Operation) -> int:
    source = op.operands[0].owner
    if not isinstance(source, ir.Operation) and hasattr(source, "operation"):
        source = source.operation
    if getattr(source, "name", "") != "stablehlo.reshape":
        return 0
    y = source.operands[0]
    y_shape, r_shape, z_shape = _shape(y), _shape(source.results[0]), _shape(op.results[0])
    kept = _dropped_unit_dims(y_shape, r_shape)
    if kept is None or len(kept) == len(y_shape):
        return 0
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    target: dict[int, int] = {i: dims[j] for j, i in enumerate(kept)}
    if sorted(target.values()) != [target[i] for i in sorted(target)]:
        return 0
    used = set(target.values())
    for i in range(len(y_shape)):
        if i in target:
            continue
        low = max([target[k] for k in target if k < i], default=-1)
        high = min([target[k] for k in target if k > i], default=len(z_shape))
        free = [t for t in range(low + 1, high) if z_shape[t] == 1 and t not in used]
        if free:
            target[i] = free[0]
            used.add(free[0])
    if len(target) == len(kept):
        return 0
    order = sorted(target)
    with ir.InsertionPoint(op), op.location:
        operand = y
        if len(order) != len(y_shape):
            operand = stablehlo.ReshapeOp(_tensor([y_shape[i] for i in order], y), y).result
        new = stablehlo.BroadcastInDimOp(op.results[0].type, operand,
                                         [target[i] for i in order]).result
    op.results[0].replace_all_uses_with(new)
    op.erase()
    return 1


def _dropped_unit_dims(src: tuple[int, ...], dst: tuple[int, ...]) -> list[int] | None:
    """The dims of `src` that `dst` keeps, when `dst` is `src` without some unit dims."""
    kept, j = [], 0
    for i, size in enumerate(src):
        if j < len(dst) and dst[j] == size:
            kept.append(i)
            j += 1
        elif size != 1:
            return None
    return kept if j == len(dst) else None



def _fold_gather(op: ir.Operation) -> int:
    """Make each unit offset dim of a batched gather's operand a batching dim (see above)."""
    if len(op.operands) != 2 or "dimension_numbers" not in op.attributes:
        return 0
    n = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    sizes = list(ir.DenseI64ArrayAttr(op.attributes["slice_sizes"]))
    folded = _unit_window_to_batch(
        op, _shape(op.operands[0]), _shape(op.results[0]), list(n.offset_dims),
        list(n.collapsed_slice_dims), list(n.operand_batching_dims),
        list(n.start_indices_batching_dims), list(n.start_index_map), n.index_vector_dim,
        lambda d, position: sizes[d] == 1)
    if folded is None:
        return 0
    window, operand_batch, indices_batch, vector_dim = folded
    op.attributes["dimension_numbers"] = stablehlo.GatherDimensionNumbers.get(
        offset_dims=window, collapsed_slice_dims=list(n.collapsed_slice_dims),
        operand_batching_dims=operand_batch, start_indices_batching_dims=indices_batch,
        start_index_map=list(n.start_index_map), index_vector_dim=vector_dim)
    return 1 + _fold_gather(op)


def _fold_scatter(op: ir.Operation) -> int:
    """The scatter twin of `_fold_gather` (take_along_axis's gradient): a unit update window
    dim of a batched scatter's operand becomes a batching dim."""
    if len(op.operands) != 3 or "scatter_dimension_numbers" not in op.attributes:
        return 0
    n = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    updates = _shape(op.operands[2])
    folded = _unit_window_to_batch(
        op, _shape(op.operands[0]), updates, list(n.update_window_dims),
        list(n.inserted_window_dims), list(n.input_batching_dims),
        list(n.scatter_indices_batching_dims), list(n.scattered_dims_to_operand_dims),
        n.index_vector_dim, lambda d, position: updates[position] == 1)
    if folded is None:
        return 0
    window, input_batch, indices_batch, vector_dim = folded
    op.attributes["scatter_dimension_numbers"] = stablehlo.ScatterDimensionNumbers.get(
        update_window_dims=window, inserted_window_dims=list(n.inserted_window_dims),
        input_batching_dims=input_batch, scatter_indices_batching_dims=indices_batch,
        scattered_dims_to_operand_dims=list(n.scattered_dims_to_operand_dims),
        index_vector_dim=vector_dim)
    return 1 + _fold_scatter(op)


def _unit_window_to_batch(op: ir.Operation, operand_shape, result_shape, window_positions,
                          collapsed, operand_batch, indices_batch, index_map, vector_dim, whole):
    """The dimension numbers of a batched gather/scatter with its first unit window dim made a
    batching dim, the indices (operand 1 of `op`) reshaped in place to carry its unit partner.

    A window dim is an operand dim taken whole (`whole(dim, position)`: its slice or update
    window is 1 wide) that is not collapsed/inserted, not batching and never indexed;
    `window_positions[k]` is where the k-th window dim sits in the result (gather) or the
    updates (scatter). The other result/update dims take the indices' dims (but the index
    vector dim) in order, so the new unit indices dim goes where that position falls among
    them. Returns (window positions, operand batching dims, indices batching dims, index vector
    dim), or None (nothing to fold, or an index vector dim that is not trailing)."""
    indices = op.operands[1]
    indices_shape = _shape(indices)
    if not operand_batch or vector_dim < len(indices_shape) - 1:
        return None
    window = [d for d in range(len(operand_shape)) if d not in collapsed + operand_batch]
    if len(window) != len(window_positions):
        return None
    found = next((k for k, d in enumerate(window) if operand_shape[d] == 1
                  and d not in index_map and whole(d, window_positions[k])), None)
    if found is None:
        return None
    dim, position = window[found], window_positions[found]
    kept = window_positions[:found] + window_positions[found + 1:]
    batch_positions = [r for r in range(len(result_shape)) if r not in kept]
    labels: list = [i for i in range(len(indices_shape)) if i != vector_dim]
    labels.insert(batch_positions.index(position), "unit")
    explicit = vector_dim < len(indices_shape)
    if explicit:
        labels.append(vector_dim)
    where = {label: i for i, label in enumerate(labels)}
    shape = [1 if label == "unit" else indices_shape[label] for label in labels]
    pairs = sorted([*zip(operand_batch, (where[i] for i in indices_batch)),
                    (dim, where["unit"])])
    # A reshape of a reshape, or of a transpose that only moves unit dims, reads the source.
    squeeze = _producer(indices)
    if getattr(squeeze, "name", "") not in ("stablehlo.reshape", "stablehlo.transpose") or (
            squeeze.name == "stablehlo.transpose" and not _moves_units_only(squeeze)):
        squeeze = None
    source = squeeze.operands[0] if squeeze is not None else indices
    with ir.InsertionPoint(op), op.location:
        op.operands[1] = stablehlo.ReshapeOp(_tensor(shape, indices), source).result
    if squeeze is not None and squeeze.name == "stablehlo.reshape":
        _unit_moves_as_transpose(squeeze)
    return (kept, [a for a, _ in pairs], [b for _, b in pairs],
            where[vector_dim] if explicit else len(labels))


def _producer(value) -> ir.Operation | None:
    owner = value.owner
    if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
        owner = owner.operation
    return owner if isinstance(owner, ir.Operation) else None


def _moves_units_only(op: ir.Operation) -> bool:
    """The op's result has the operand's non-unit dims in the same order (and the same rank):
    it moves only unit dims, so no element changes place."""
    source, result = _shape(op.operands[0]), _shape(op.results[0])
    return len(source) == len(result) and (
        [d for d in source if d != 1] == [d for d in result if d != 1])


def _unit_moves_as_transpose(reshape: ir.Operation) -> None:
    """A reshape that only moves unit dims (the squeezed indices, still read by jax's bounds
    check) is the transpose that moves them: the same elements in the same order, and a split
    unit dim keeps its own dim instead of being flattened into its neighbour."""
    source, result = _shape(reshape.operands[0]), _shape(reshape.results[0])
    if source == result or not _moves_units_only(reshape) or not list(reshape.results[0].uses):
        return
    units = [d for d, size in enumerate(source) if size == 1]
    others = [d for d, size in enumerate(source) if size != 1]
    perm = [others.pop(0) if size != 1 else units.pop(0) for size in result]
    with ir.InsertionPoint(reshape), reshape.location:
        moved = stablehlo.TransposeOp(reshape.operands[0], perm).result
    reshape.results[0].replace_all_uses_with(moved)
    reshape.erase()
