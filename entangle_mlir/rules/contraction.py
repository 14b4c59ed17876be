"""dot_general: batch dims carry their split, split contracting dims become a partial sum."""

from __future__ import annotations

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import Masked, Opaque, Rel, Value, Windowed
from entangle_mlir.core.terms import make_dot
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze, unify_dims
from entangle_mlir.rules.kinds import device_blocks
from entangle_mlir.rules.kinds.window import window_rowwise


def dot_general(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    lhs, rhs = operands
    if isinstance(lhs, Windowed) or isinstance(rhs, Windowed):
        return window_rowwise(info, operands, ctx, dot_general)
    if isinstance(lhs, Masked) or isinstance(rhs, Masked):
        return [device_blocks.carried(info, operands, ctx, dot_general)]
    if not isinstance(lhs, Rel) or not isinstance(rhs, Rel):
        return [Opaque("dot_general of a device-dependent scalar", category="unsupported")]
    a = info.attrs
    lb, rb, lc, rc = a["lhs_batch"], a["rhs_batch"], a["lhs_contract"], a["rhs_contract"]
    paired = unify_dims([lhs, rhs], [list(lb) + list(lc), list(rb) + list(rc)], ctx,
                        "dot_general")
    if isinstance(paired, Opaque):
        return [paired]
    (lhs, rhs), joint, _ = paired
    lhs, rhs = freeze(lhs), freeze(rhs)
    if lhs.partial and rhs.partial:
        return [Opaque(f"dot_general multiplies two partial sums (over {axes_str(lhs.partial)} "
                       f"and {axes_str(rhs.partial)}): missing all_reduce/psum before it",
                       category="nonlinear_partial")]
    carried = lhs if lhs.partial else rhs
    other = rhs if lhs.partial else lhs
    if carried.partial and carried.kind != "sum":
        return [Opaque(f"dot_general of a partial {carried.kind}: missing all_reduce before it",
                       category="nonlinear_partial")]
    if carried.partial and set(other.tiled_axes) & set(carried.partial):
        return [Opaque(f"dot_general multiplies a partial sum over {axes_str(carried.partial)} "
                       f"with a value split over {axes_str(carried.partial)}",
                       category="partial_mixed")]
    contract_axes = tuple(ax for _, axes in joint[len(lb):] for ax in axes)
    lhs_free = [d for d in range(len(lhs.term.shape)) if d not in lb and d not in lc]
    rhs_free = [d for d in range(len(rhs.term.shape)) if d not in rb and d not in rc]
    tiling = ([axes for _, axes in joint[:len(lb)]] + [lhs.tiling[d] for d in lhs_free]
              + [rhs.tiling[d] for d in rhs_free])
    shape = ([size for size, _ in joint[:len(lb)]] + [lhs.term.shape[d] for d in lhs_free]
             + [rhs.term.shape[d] for d in rhs_free])
    partial = tuple(carried.partial) + contract_axes
    used = [ax for axes in tiling for ax in axes] + list(partial)
    repeated = sorted({ax for ax in used if used.count(ax) > 1})
    if repeated:
        return [Opaque(f"dot_general: mesh axis {axes_str(repeated)} splits more than one "
                       "dim of the result (each device only computes diagonal blocks)",
                       category="layout_mismatch")]
    mesh_order = ctx.mesh.names if ctx.mesh else ()
    partial = tuple(sorted(partial, key=mesh_order.index)) if partial else ()
    term = make_dot(lhs.term, rhs.term, (tuple(lb), tuple(rb), tuple(lc), tuple(rc)),
                    tuple(shape), info.result_types[0].dtype)
    origin = carried.partial_origin if carried.partial else (info if contract_axes else None)
    return [Rel(term, tuple(tiling), partial, "sum" if partial else "", frozenset(), lhs.scope,
                partial_origin=origin)]


CONTRACTION_RULES = {
    "stablehlo.dot_general": dot_general,
}
