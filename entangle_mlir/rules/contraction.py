"""dot_general and convolution: batch dims carry their split, split contracting dims become a
partial sum."""

from __future__ import annotations

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import Masked, Opaque, Rel, Value, Windowed
from entangle_mlir.core.terms import Term, intern, make_dot, make_reshape, make_transpose
from entangle_mlir.mlir.opinfo import OpInfo, conv_attrs
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze, unify_dims
from entangle_mlir.rules.kinds import device_blocks, entries
from entangle_mlir.rules.kinds.window import window_rowwise


def dot_general(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    lhs, rhs = operands
    if isinstance(lhs, Windowed) or isinstance(rhs, Windowed):
        return (entries.dot_general(info, operands, ctx, dot_general)
                or window_rowwise(info, operands, ctx, dot_general))
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


def convolution(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """A convolution as a member of the dot_general family: the input's batch dim and the
    kernel's output feature dim carry their split to the output's batch and feature dims; the
    input feature dim split alike with the kernel's input feature dim makes a partial sum over
    those axes (each device sums its features); a partial operand stays partial (the
    convolution is linear in each operand). Spatial dims must not be split (each device's
    windows would stop at its block edge), nor may features be grouped. A window of one
    element with unit strides, no padding and no dilation is a dot (`conv_term`)."""
    lhs, rhs = operands
    if not isinstance(lhs, Rel) or not isinstance(rhs, Rel):
        return [Opaque("convolution of a device-dependent value", category="unsupported")]
    dims = conv_attrs(info)
    if dims["feature_group_count"] != 1 or dims["batch_group_count"] != 1:
        return [Opaque("grouped convolution (feature_group_count or batch_group_count > 1) "
                       "is not supported", category="unsupported")]
    lhs, rhs = freeze(lhs), freeze(rhs)
    for which, value, spatial in (("input", lhs, dims["input_spatial"]),
                                  ("kernel", rhs, dims["kernel_spatial"])):
        for d in spatial:
            if value.tiling[d]:
                return [Opaque(f"convolution windows along dim {d} of the {which}, which is "
                               f"split over {axes_str(value.tiling[d])}: each device's windows "
                               "stop at its block edge", category="layout_mismatch")]
    f_in, k_in = dims["input_feature"], dims["kernel_input_feature"]
    if lhs.tiling[f_in] != rhs.tiling[k_in] or lhs.term.shape[f_in] != rhs.term.shape[k_in]:
        return [Opaque(f"convolution: the input features (dim {f_in}) and the kernel's input "
                       f"features (dim {k_in}) are split differently", category="layout_mismatch")]
    if lhs.partial and rhs.partial:
        return [Opaque("convolution of two partial sums: missing all_reduce/psum before it",
                       category="nonlinear_partial")]
    carried = lhs if lhs.partial else rhs
    other = rhs if lhs.partial else lhs
    if carried.partial and carried.kind != "sum":
        return [Opaque(f"convolution of a partial {carried.kind}: missing all_reduce before it",
                       category="nonlinear_partial")]
    if carried.partial and set(other.tiled_axes) & set(carried.partial):
        return [Opaque(f"convolution of a partial sum over {axes_str(carried.partial)} with a "
                       f"value split over {axes_str(carried.partial)}", category="partial_mixed")]
    rank = len(info.result_types[0].shape)
    tiling: list[tuple[str, ...]] = [()] * rank
    shape = list(info.result_types[0].shape)
    tiling[dims["output_batch"]] = lhs.tiling[dims["input_batch"]]
    shape[dims["output_batch"]] = lhs.term.shape[dims["input_batch"]]
    tiling[dims["output_feature"]] = rhs.tiling[dims["kernel_output_feature"]]
    shape[dims["output_feature"]] = rhs.term.shape[dims["kernel_output_feature"]]
    contract = tuple(lhs.tiling[f_in])
    partial = tuple(carried.partial) + contract
    used = [ax for axes in tiling for ax in axes] + list(partial)
    repeated = sorted({ax for ax in used if used.count(ax) > 1})
    if repeated:
        return [Opaque(f"convolution: mesh axis {axes_str(repeated)} splits more than one dim "
                       "of the result (each device only computes diagonal blocks)",
                       category="layout_mismatch")]
    mesh_order = ctx.mesh.names if ctx.mesh else ()
    partial = tuple(sorted(partial, key=mesh_order.index)) if partial else ()
    term = conv_term(info, lhs.term, rhs.term, tuple(shape), info.result_types[0].dtype)
    origin = carried.partial_origin if carried.partial else (info if contract else None)
    return [Rel(term, tuple(tiling), partial, "sum" if partial else "", frozenset(), lhs.scope,
                partial_origin=origin)]


def conv_term(info: OpInfo, lhs: Term, rhs: Term, shape: tuple[int, ...], dtype: str) -> Term:
    """The term of a convolution of `lhs` by `rhs` with result `shape`: a dot_general over the
    input features (transposed into the output's dim order) when every window is one element
    (kernel spatial dims of size 1, unit strides and dilations, no padding), else a
    `stablehlo.convolution` node with the op's complete attributes (`opinfo.conv_attrs`)."""
    dims = conv_attrs(info)
    n = len(dims["input_spatial"])
    pointwise = (all(rhs.shape[d] == 1 for d in dims["kernel_spatial"])
                 and dims["window_strides"] == (1,) * n and dims["lhs_dilation"] == (1,) * n
                 and dims["rhs_dilation"] == (1,) * n and dims["padding"] == ((0, 0),) * n)
    if not pointwise:
        return intern("stablehlo.convolution", (lhs, rhs), tuple(sorted(dims.items())), shape,
                      dtype)
    k_in, k_out = dims["kernel_input_feature"], dims["kernel_output_feature"]
    kernel = make_reshape(rhs, tuple(rhs.shape[d] for d in sorted((k_in, k_out))))
    kernel_in = 0 if k_in < k_out else 1
    f_in = dims["input_feature"]
    kept = [d for d in range(len(lhs.shape)) if d != f_in]  # the dot's lhs dims, in order
    dot_shape = tuple(lhs.shape[d] for d in kept) + (rhs.shape[k_out],)
    dot = make_dot(lhs, kernel, ((), (), (f_in,), (kernel_in,)), dot_shape, dtype)
    source = {dims["output_batch"]: kept.index(dims["input_batch"]),
              dims["output_feature"]: len(kept)}
    for out_d, in_d in zip(dims["output_spatial"], dims["input_spatial"]):
        source[out_d] = kept.index(in_d)
    perm = tuple(source[d] for d in range(len(shape)))
    return make_transpose(dot, perm) if perm != tuple(range(len(perm))) else dot


CONTRACTION_RULES = {
    "stablehlo.dot_general": dot_general,
    "stablehlo.convolution": convolution,
}
