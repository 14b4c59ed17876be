"""Exact rewrites of numerical idioms that spell a computation another way.

Run by entangle-normalize on both programs, in place; each one is an identity of real arithmetic
(the verifier's semantics), so it is sound on any program, and it puts both programs in the
same form:

* gathered sum: `reduce_add(all_gather(y, dim g), dims D)`, `y` of size 1 along g in D, is
  `reduce_add(all_reduce_add(y), D)` (psum spelled as an all_gather on a new axis and a sum);
* rescaled exp-sum: `reduce_add(exp(x - broadcast(m)), D) * exp(m)` is `reduce_add(exp(x), D)`
  for any `m` constant along D, also one that differs between devices (each shard stabilising
  its log-sum-exp with its own max);
* shifted log-sum-exp: `log(reduce_add(exp(x - broadcast(m)), D)) + m` is
  `log(reduce_add(exp(x), D))`, with an all_reduce sum between the reduce and the log when `m`
  is itself the result of an all_reduce over the same devices (the same on all of them: the
  pmax of vocab-parallel cross-entropy).

"`broadcast(m)`" and "`m`" are recognised by the element each reads off a common root value
(through broadcast_in_dim and reshape): every element of the subtracted tensor must read the
same element of the root as the element it is reduced into.
"""

from __future__ import annotations

import math

import numpy as np
from jaxlib.mlir import ir

from .opinfo import constant_value, reducer_kind

_MOVES = ("stablehlo.broadcast_in_dim", "stablehlo.reshape")
_MAX_INDEX = 1 << 22
"""Largest tensor whose element-to-root index map is computed (to compare two views)."""


def rewrite_idioms(module: ir.Module) -> int:
    """Apply the rewrites in place until none applies; the number applied. (One rewrite per
    walk: a rewrite erases ops that a list collected before it would still hold.)"""
    count = 0
    with ir.Location.unknown():
        while _rewrite_one(module):
            count += 1
    return count


_REWRITES = {
    "stablehlo.reduce": lambda op: _gathered_sum(op),
    "stablehlo.multiply": lambda op: _rescaled_exp_sum(op),
    "stablehlo.add": lambda op: _shifted_lse(op),
}


def _rewrite_one(module: ir.Module) -> bool:
    ops: list[ir.Operation] = []

    def collect(op):
        if op.name in _REWRITES:
            ops.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return any(_REWRITES[op.name](op) for op in ops)


def _def(value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _shape(value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def _i64s(op, name) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _zero_init(op: ir.Operation) -> bool:
    init = _def(op.operands[1])
    if init is None or init.name != "stablehlo.constant":
        return False
    value, _ = constant_value(init.attributes["value"])
    return value.size == 1 and float(value.reshape(-1)[0]) == 0.0


def _sum_reduce(op: ir.Operation | None) -> bool:
    return (op is not None and op.name == "stablehlo.reduce" and len(op.operands) == 2
            and reducer_kind(op) == "add" and _zero_init(op))


def _erase_dead(op: ir.Operation) -> None:
    """Erase `op` and then its operands' producers that it left without uses."""
    pending = [op]
    while pending:
        op = pending.pop()
        if any(True for r in op.results for _ in r.uses) or op.name.startswith(
                ("func.", "sdy.")):
            continue
        producers = [_def(v) for v in op.operands]
        op.erase()
        pending += [p for p in producers if p is not None]


def _copy_attr(src: ir.Operation, dst: ir.Operation, name: str) -> None:
    if name in src.attributes:
        dst.attributes[name] = src.attributes[name]


def _gathered_sum(reduce: ir.Operation) -> int:
    from jaxlib.mlir.dialects import stablehlo

    if not _sum_reduce(reduce):
        return 0
    gather = _def(reduce.operands[0])
    if gather is None or gather.name != "stablehlo.all_gather" or len(gather.operands) != 1:
        return 0
    g = gather.attributes["all_gather_dim"].value
    y = gather.operands[0]
    if _shape(y)[g] != 1 or g not in _i64s(reduce, "dimensions"):
        return 0
    element = ir.RankedTensorType(y.type).element_type
    with ir.InsertionPoint(reduce), reduce.location:
        summed = stablehlo.AllReduceOp([y.type], [y], gather.attributes["replica_groups"])
        for name in ("channel_handle", "use_global_device_ids"):
            _copy_attr(gather, summed.operation, name)
        scalar = ir.RankedTensorType.get([], element)
        body = summed.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(body):
            stablehlo.ReturnOp([stablehlo.AddOp(*body.arguments).result])
        squeezed = [n for d, n in enumerate(_shape(y)) if d != g]
        flat = stablehlo.ReshapeOp(ir.RankedTensorType.get(squeezed, element),
                                   summed.results[0]).result
    dims = [d - (d > g) for d in _i64s(reduce, "dimensions") if d != g]
    if dims:
        reduce.operands[0] = flat
        reduce.attributes["dimensions"] = ir.DenseI64ArrayAttr.get(dims)
        _erase_dead(gather)
    else:
        reduce.results[0].replace_all_uses_with(flat)
        _erase_dead(reduce)
    return 1


def _root(value) -> tuple[object, list[ir.Operation]]:
    """The value under a chain of broadcast_in_dim / reshape ops, and the chain (outermost
    first)."""
    chain = []
    op = _def(value)
    while op is not None and op.name in _MOVES:
        chain.append(op)
        value = op.operands[0]
        op = _def(value)
    return value, chain


def _index_map(root, chain: list[ir.Operation], created: list[int] = ()) -> np.ndarray | None:
    """For each element of the chain's result, the flat index of the root element it reads.

    Dims in `created` that the outermost broadcast_in_dim creates (from no operand dim or a
    unit one) are computed at size 1: the map does not vary along them, so their slice at 0
    is the map, and a vocab-wide broadcast of a per-token max stays small."""
    shape = _shape(root)
    if math.prod(shape) > _MAX_INDEX:
        return None
    index = np.arange(math.prod(shape)).reshape(shape)
    for op in reversed(chain):
        out = _shape(op.results[0])
        if op is chain[0] and created and op.name == "stablehlo.broadcast_in_dim" and all(
                _created_by(op, d) for d in created):
            out = tuple(1 if d in created else size for d, size in enumerate(out))
        if math.prod(out) > _MAX_INDEX:
            return None
        if op.name == "stablehlo.reshape":
            index = index.reshape(out)
        else:
            dims = _i64s(op, "broadcast_dimensions")
            expanded = [1] * len(out)
            for i, d in enumerate(dims):
                expanded[d] = index.shape[i]
            order = sorted(range(len(dims)), key=lambda i: dims[i])
            index = np.broadcast_to(index.transpose(order).reshape(expanded), out)
    return index


def _created_by(broadcast: ir.Operation, dim: int) -> bool:
    """Result dim `dim` of a broadcast_in_dim reads no operand dim, or a unit one."""
    dims = _i64s(broadcast, "broadcast_dimensions")
    return dim not in dims or _shape(broadcast.operands[0])[dims.index(dim)] == 1


def _same_along(sub_index: np.ndarray, dims: list[int], kept_index: np.ndarray) -> bool:
    """Every element of `sub_index` reads the root element that `kept_index` (the reduced
    shape) reads at the position it is reduced into."""
    kept = [d for d in range(sub_index.ndim) if d not in dims]
    first = sub_index[tuple(slice(None) if d in kept else slice(0, 1)
                            for d in range(sub_index.ndim))]
    if not (sub_index == first).all():
        return False
    return first.reshape([sub_index.shape[d] for d in kept]).shape == kept_index.shape and (
        first.reshape(kept_index.shape) == kept_index).all()


def _shifted_exp_sum(value):
    """(reduce, x, root of m, root's index map in the reduced shape's terms) when `value` is
    `reduce_add(exp(x - broadcast(m)), D)`; else None. The subtracted tensor's index map is
    checked against `m_value` by the caller."""
    reduce = _def(value)
    if not _sum_reduce(reduce):
        return None
    exp = _def(reduce.operands[0])
    if exp is None or exp.name != "stablehlo.exponential":
        return None
    sub = _def(exp.operands[0])
    if sub is None or sub.name != "stablehlo.subtract":
        return None
    return reduce, exp, sub


def _shift_matches(sub: ir.Operation, reduce: ir.Operation, m_value) -> bool:
    """The tensor `sub` subtracts is `m_value` broadcast along the reduced dims."""
    root, chain = _root(sub.operands[1])
    m_root, m_chain = _root(m_value)
    if root != m_root:
        return False
    sub_index = _index_map(root, chain, _i64s(reduce, "dimensions"))
    m_index = _index_map(root, m_chain)
    if sub_index is None or m_index is None:
        return False
    return _same_along(sub_index, _i64s(reduce, "dimensions"), m_index)


def _unshifted(reduce: ir.Operation, sub: ir.Operation, at: ir.Operation):
    """`reduce_add(exp(x), D)`, built before `at`."""
    from jaxlib.mlir.dialects import stablehlo

    with ir.InsertionPoint(at), at.location:
        exp = stablehlo.ExpOp(sub.operands[0]).result
        clone = reduce.clone(ir.InsertionPoint(at))
    clone.operands[0] = exp
    return clone.results[0]


def _rescaled_exp_sum(mul: ir.Operation) -> int:
    for s, e in ((0, 1), (1, 0)):
        found = _shifted_exp_sum(mul.operands[s])
        scale = _def(mul.operands[e])
        if found is None or scale is None or scale.name != "stablehlo.exponential":
            continue
        reduce, _, sub = found
        if not _shift_matches(sub, reduce, scale.operands[0]):
            continue
        new = _unshifted(reduce, sub, mul)
        mul.results[0].replace_all_uses_with(new)
        _erase_dead(mul)
        return 1
    return 0


def _shifted_lse(add: ir.Operation) -> int:
    for s, m in ((0, 1), (1, 0)):
        log = _def(add.operands[s])
        if log is None or log.name != "stablehlo.log":
            continue
        summed = log.operands[0]
        collective = _def(summed)
        if collective is not None and collective.name == "stablehlo.all_reduce":
            if len(collective.operands) != 1 or reducer_kind(collective) != "add":
                continue
            summed = collective.operands[0]
        else:
            collective = None
        found = _shifted_exp_sum(summed)
        if found is None:
            continue
        reduce, _, sub = found
        if not _shift_matches(sub, reduce, add.operands[m]):
            continue
        if collective is not None and not _same_on_group(add.operands[m], collective):
            continue
        from jaxlib.mlir.dialects import stablehlo

        new = _unshifted(reduce, sub, add)
        if collective is not None:
            gathered = collective.clone(ir.InsertionPoint(add))
            gathered.operands[0] = new
            new = gathered.results[0]
        with ir.InsertionPoint(add), add.location:
            new = stablehlo.LogOp(new).result
        add.results[0].replace_all_uses_with(new)
        _erase_dead(add)
        return 1
    return 0


def _same_on_group(m_value, collective: ir.Operation) -> bool:
    """`m` is read off the result of an all_reduce over the same replica groups as
    `collective`: every device that `collective` sums over holds the same `m`."""
    root, _ = _root(m_value)
    producer = _def(root)
    if producer is None or producer.name != "stablehlo.all_reduce":
        return False
    return all(_attr_text(producer, name) == _attr_text(collective, name)
               for name in ("replica_groups", "use_global_device_ids"))


def _attr_text(op: ir.Operation, name: str) -> str | None:
    return str(op.attributes[name]) if name in op.attributes else None
