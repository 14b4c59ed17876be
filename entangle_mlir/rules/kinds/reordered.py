"""Blocks in a device-dependent order (`Reordered`): ring attention's keys, values and key
positions, each device's own block and the blocks the ring brought it, concatenated in arrival
order.

* A concatenation along dim c of blocks of one tensor X (each operand a block of X along c: a
  value split along c, possibly X rolled by whole blocks after collective_permutes, or a
  block of an iota at a device offset `axis_index * B`), where every device gets every block
  once, is X with its blocks in a per-device order; in the natural order on every device it
  is X itself (an all_gather).
* Ops that treat the positions along the dim alike keep the order: elementwise ops between
  values in the same order (or constant along the dim), broadcast_in_dim, transpose and
  reshape that keep the dim whole, reductions over other dims, dot_general along a free dim.
* A sum, max or min over the dim, and a dot_general contracting it with a value in the same
  order, are what they are in the natural order (they add up / compare every block once).
* A dot_general keeping the dim free and contracting a split dim gives a partial value in
  the order (each device's piece, `Reordered.pieces`): a transpose, a reshape keeping the dim
  and a reduce over other dims keep it (the plain rule judges the partial sum: a max of it is
  the error); the slices, collective_permutes and adds sending its blocks back to their
  owners are `returning.py`'s.
* Values in different orders meeting in one op are the error ("blocks assembled in different
  orders"), shown with both orders and blamed on the collective_permute that brought the
  blocks (the ring turning the wrong way).

Every construct is a claim about each device's local value that the Z3 instance layer checks
(instance.local_values.derived_local).
"""

from __future__ import annotations

import math
from dataclasses import replace

from entangle_mlir.core.relations import Opaque, Rel, Reordered, Returning, Shifted, Value
from entangle_mlir.core.terms import roll_parts
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import Rule, RuleContext
from entangle_mlir.rules.common import iota_dim, widen_iota
from entangle_mlir.rules.kinds import returning

ORDER_FREE_REDUCERS = frozenset({"add", "max", "min", "mul", "and", "or"})
"""Reducers whose result does not depend on the order of the reduced elements."""


def ring_concat(info: OpInfo, operands: list[Value], ctx: RuleContext) -> Value | None:
    """The concatenation as blocks of one tensor in a per-device order, or None when its
    operands are not blocks of one tensor along the concatenated dim (the plain rule then
    decides)."""
    mesh = ctx.mesh
    if mesh is None or ctx.is_global or len(operands) < 2:
        return None
    dim = info.attrs["dimension"]
    count = len(operands)
    pieces = [_block_of(x, dim, count, ctx) for x in operands]
    if any(p is None for p in pieces):
        return None
    template = pieces[0][0]
    if any(p[0] != template for p in pieces):
        return None
    orders = tuple(tuple(p[1][d] for p in pieces) for d in range(mesh.num_devices))
    for device, order in enumerate(orders):
        if sorted(order) != list(range(count)):
            return Opaque(f"concatenate assembles blocks {list(order)} of dim {dim} on device "
                          f"{device}: not every block once (blocks assembled from the wrong "
                          "devices)", category="wrong_order")
    if all(order == tuple(range(count)) for order in orders):
        return template
    return Reordered(template, dim, orders)


def _block_of(x: Value, dim: int, count: int, ctx: RuleContext
              ) -> tuple[Rel, tuple[int, ...]] | None:
    """(X as a Rel not split along dim, X's block index along dim on every device) when `x`
    is one of `count` blocks of X along dim on every device."""
    mesh = ctx.mesh
    devices = range(mesh.num_devices)
    if isinstance(x, Rel) and x.tiling[dim] and not x.partial and dim not in x.poly:
        axes = x.tiling[dim]
        if mesh.group_size(axes) != count:
            return None
        base, shift = roll_parts(x.term, dim) or (x.term, 0)
        block = x.term.shape[dim] // count
        if shift % block:
            return None
        tiling = list(x.tiling)
        tiling[dim] = ()
        template = replace(x, term=base, tiling=tuple(tiling), partial_origin=None)
        return template, tuple((mesh.block_index(axes, d) - shift // block) % count
                               for d in devices)
    if isinstance(x, Shifted) and not x.rel.partial and not x.rel.tiling[dim] and (
            dim not in x.rel.poly):
        found = iota_dim(x.rel.term)
        block = x.rel.term.shape[dim]
        if found != (dim, 1) or any(o % block or not 0 <= o // block < count
                                    for o in x.offsets):
            return None
        term = widen_iota(x.rel.term, dim, block * count)
        if term is None:
            return None
        return (replace(x.rel, term=term, partial_origin=None),
                tuple(o // block for o in x.offsets))
    return None


def with_orders(rule: Rule) -> Rule:
    """`rule` extended to blocks in a device-dependent order: what the walk does
    (`infer.Walker._op`), for the instance checker's re-runs of a rule."""
    def run(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
        if info.name == "stablehlo.concatenate":
            ring = ring_concat(info, operands, ctx)
            if ring is not None:
                return [ring]
        if any(isinstance(v, Reordered) for v in operands):
            return apply(info, operands, ctx, rule)
        if any(isinstance(v, Returning) for v in operands):
            return returning.apply(info, operands, ctx)
        return rule(info, operands, ctx)
    return run


def apply(info: OpInfo, operands: list[Value], ctx: RuleContext, rule: Rule) -> list[Value]:
    """An op with a `Reordered` operand (see the module docstring for what is kept, what
    forgets the order and what is an error); `rule` is the op's ordinary rule, which judges
    the values with their blocks in the natural order."""
    moved = [v for v in operands if isinstance(v, Reordered)]
    name = info.name
    first = moved[0]
    plain = [v.rel if isinstance(v, Reordered) else v for v in operands]
    if any(v.rel.partial for v in moved):
        if name == "stablehlo.transpose":
            return _wrap(rule(info, plain, ctx),
                         list(info.attrs["permutation"]).index(first.dim), first, partial=True)
        kept = _partial_view_dim(info, operands, first)
        if kept is not None:
            return _wrap(rule(info, plain, ctx), kept, first, partial=True)
        return returning.apply(info, operands, ctx)
    if name in ELEMENTWISE_OPS:
        dims = _elementwise_dims(info, operands)
        if isinstance(dims, Opaque):
            return [dims] * len(info.result_types)
        return _wrap(rule(info, plain, ctx), dims, first)
    if name == "stablehlo.broadcast_in_dim":
        return _wrap(rule(info, plain, ctx),
                     info.attrs["broadcast_dimensions"][first.dim], first)
    if name == "stablehlo.transpose":
        return _wrap(rule(info, plain, ctx),
                     list(info.attrs["permutation"]).index(first.dim), first)
    if name == "stablehlo.reshape":
        dim = _reshaped_dim(info, first)
        if dim is None:
            return [_unsupported(name, first, "regroups the reordered dim")]
        return _wrap(rule(info, plain, ctx), dim, first)
    if name == "stablehlo.reduce" and len(operands) == 2 and not isinstance(operands[1],
                                                                             Reordered):
        reduced = tuple(info.attrs["dimensions"])
        if first.dim not in reduced:
            return _wrap(rule(info, plain, ctx),
                         first.dim - sum(d < first.dim for d in reduced), first)
        if info.attrs.get("reducer") not in ORDER_FREE_REDUCERS:
            return [_unsupported(name, first, "reduces it with an order-dependent body")]
        return rule(info, plain, ctx)
    if name == "stablehlo.dot_general":
        return _dot(info, operands, plain, ctx, rule)
    return [_unsupported(name, first, "")]


def _partial_view_dim(info: OpInfo, operands: list[Value], value: Reordered) -> int | None:
    """Where a reshape keeping the reordered dim, or a reduce over other dims, puts the
    reordered dim of a partial value (each device's piece keeps its arrival order; the plain
    rule judges the partial sum: a sum over other dims stays a partial sum, a max does not);
    None for other ops. Grouped-query attention's key and value cotangents: the contraction
    over the keys, reshaped to (kv heads, repeat) and summed over the repeat."""
    if info.name == "stablehlo.reshape":
        return _reshaped_dim(info, value)
    if info.name == "stablehlo.reduce" and len(operands) == 2 and not isinstance(
            operands[1], Reordered):
        reduced = tuple(info.attrs["dimensions"])
        if value.dim not in reduced:
            return value.dim - sum(d < value.dim for d in reduced)
    return None


def _elementwise_dims(info: OpInfo, operands: list[Value]) -> int | Opaque:
    """The reordered dim shared by an elementwise op's operands (the others must be constant
    along it), or the error."""
    moved = [v for v in operands if isinstance(v, Reordered)]
    first = moved[0]
    for other in moved[1:]:
        if (other.dim, other.orders) != (first.dim, first.orders):
            return mismatch(info.name, first, other)
    for v in operands:
        if isinstance(v, Reordered) or isinstance(v, Rel) and (
                not v.term.shape or first.dim in v.poly or v.term.op == "splat"):
            continue
        return _unsupported(info.name, first, "meets a value that is not in the same order")
    return first.dim


MIXED_ORDERS = "combines blocks assembled in different orders"
"""The words of a mismatch of orders. Values at the collective_permute it is blamed on hold
other devices' blocks by design (a ring), so no op-level evidence is taken there."""


def mismatch(op_name: str, a: Reordered, b: Reordered) -> Opaque:
    """Two values whose blocks are in different orders meet: the first device where they
    differ and both orders, blamed on whichever was brought by a collective_permute."""
    device = next((d for d, (x, y) in enumerate(zip(a.orders, b.orders)) if x != y), 0)
    moved, other = (b, a) if _is_permute(b.origin) or not _is_permute(a.origin) else (a, b)
    if _is_permute(moved.origin):
        which = (f"the blocks that came through the collective_permute here are "
                 f"{list(moved.orders[device])}, the other operand's "
                 f"{list(other.orders[device])}")
    else:
        which = (f"one operand's blocks are {list(a.orders[device])}, the other's "
                 f"{list(b.orders[device])}")
    reason = (f"{op_name} {MIXED_ORDERS} (blocks assembled in the wrong order or from the "
              f"wrong devices): on device {device}, position by position, {which}")
    return Opaque(reason, origin=moved.origin if _is_permute(moved.origin) else None,
                  category="wrong_order")


def _is_permute(origin) -> bool:
    record = origin[0] if isinstance(origin, tuple) else None
    return record is not None and record.info.name == "stablehlo.collective_permute"


def _unsupported(op_name: str, value: Reordered, what: str) -> Opaque:
    detail = f" ({what})" if what else ""
    return Opaque(f"{op_name} of a value whose blocks along dim {value.dim} are in a "
                  f"device-dependent order{detail} is not supported", origin=None,
                  category="unsupported")


def _wrap(outputs: list[Value], dim: int, like: Reordered, partial: bool = False
          ) -> list[Value]:
    """The plain rule's outputs with `like`'s order along `dim` (a Rel not split along it,
    with no pending reduction unless `partial`: a contraction's result, whose pieces each
    device holds in its own order, `Reordered.pieces`)."""
    wrapped: list[Value] = []
    for out in outputs:
        if isinstance(out, Opaque):
            wrapped.append(out)
        elif isinstance(out, Rel) and (partial or not out.partial) and not out.tiling[dim] and (
                dim not in out.poly) and out.term.shape[dim] == like.rel.term.shape[like.dim]:
            wrapped.append(Reordered(out, dim, like.orders, like.reason, like.origin))
        else:
            wrapped.append(_unsupported("this op", like, "the result's layout changes the dim"))
    return wrapped


def _reshaped_dim(info: OpInfo, value: Reordered) -> int | None:
    """The result dim a reshape keeps the reordered dim as (same size, same elements before
    it), or None."""
    source = info.operand_types[0].shape
    target = info.result_types[0].shape
    before = math.prod(source[:value.dim])
    for d, size in enumerate(target):
        if size == source[value.dim] and math.prod(target[:d]) == before:
            return d
    return None


def _dot(info: OpInfo, operands: list[Value], plain: list[Value], ctx: RuleContext,
         rule: Rule) -> list[Value]:
    attrs = info.attrs
    batch = (tuple(attrs["lhs_batch"]), tuple(attrs["rhs_batch"]))
    contract = (tuple(attrs["lhs_contract"]), tuple(attrs["rhs_contract"]))
    ranks = [len(t.shape) for t in info.operand_types]
    free = [[d for d in range(ranks[s]) if d not in batch[s] + contract[s]] for s in (0, 1)]
    sides = [v if isinstance(v, Reordered) else None for v in operands]
    lhs, rhs = sides
    if lhs is not None and rhs is not None:
        if lhs.orders != rhs.orders:
            return [mismatch(info.name, lhs, rhs)]
        for pair in range(len(contract[0])):
            if (contract[0][pair], contract[1][pair]) == (lhs.dim, rhs.dim):
                return rule(info, plain, ctx)
        for pair in range(len(batch[0])):
            if (batch[0][pair], batch[1][pair]) == (lhs.dim, rhs.dim):
                return _wrap(rule(info, plain, ctx), pair, lhs)
        return [_unsupported(info.name, lhs, "both operands reordered along unpaired dims")]
    side = 0 if lhs is not None else 1
    value = sides[side]
    if value.dim not in free[side]:
        return [_unsupported(info.name, value, "contracted or batched with a value in the "
                             "natural order")]
    position = len(batch[0]) + (0 if side == 0 else len(free[0])) + free[side].index(value.dim)
    return _wrap(rule(info, plain, ctx), position, value, partial=True)
