"""Constants, iota and data movement: broadcast_in_dim, reshape, transpose, reverse, slice,
concatenate, pad. Data movement keeps partial sums (it is linear) and moves tilings with the dims."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import replace

import numpy as np

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    DeviceScalar,
    Opaque,
    Rel,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.core.terms import (
    Term,
    intern,
    make_broadcast,
    make_dense,
    make_iota,
    make_op,
    make_reshape,
    make_splat,
    make_transpose,
    reshape_groups,
    scale,
    single_scaled,
    splat_value,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze, replicated, splat_rel, uniform_rel, unify_dims
from entangle_mlir.rules.kinds import device_blocks, entries, shifted
from entangle_mlir.rules.kinds.window import (
    concat_windows,
    pad_window,
    padded_window,
    slice_window,
    window_rowwise,
)


def constant(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    rtype = info.result_types[0]
    value = info.attrs["value"]
    if info.attrs.get("splat"):
        if _negative_zero(value):
            scalar = make_dense(hashlib.sha1(b"-0.0 " + rtype.dtype.encode()).digest(), (),
                                rtype.dtype)
            return [uniform_rel(make_broadcast(scalar, (), rtype.shape), ctx)]
        return [splat_rel(value.flat[0] if value.size else 0, rtype.shape, rtype.dtype, ctx)]
    return [replicated(constant_term(value, rtype.shape, rtype.dtype), ctx)]


def constant_term(value: np.ndarray, shape: tuple[int, ...], dtype: str) -> Term:
    """The term of a non-splat constant of `shape` and element type `dtype` holding `value` (a numpy
    array): identified by its contents, so equal constants are one term; small integer tables
    keep their values (device-indexed offset tables are evaluated)."""
    key = hashlib.sha1(repr((value.dtype.str, value.shape)).encode() + value.tobytes()).digest()
    table = value if value.dtype.kind in "iub" and value.size <= 65536 else None
    return make_dense(key, tuple(shape), dtype, table)


def _negative_zero(value) -> bool:
    """A float splat of -0.0: a splat's value is an exact rational, where -0.0 would be +0.0,
    so it is a broadcast scalar constant of its own (`x + -0.0` and `x + 0.0` differ on
    x = -0.0; a select or pad value of -0.0 gives zeros of the other sign)."""
    if value.dtype.kind != "f" or not value.size:
        return False
    first = value.flat[0]
    return bool(first == 0 and np.signbit(first))


def iota(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    rtype = info.result_types[0]
    return [replicated(make_iota(rtype.shape, info.attrs["iota_dimension"], rtype.dtype), ctx)]


def _scalar_passthrough(info: OpInfo, value: DeviceScalar) -> list[Value]:
    if math.prod(info.result_types[0].shape) != 1:
        return [Opaque(f"device-dependent scalar broadcast into a tensor by {info.name} "
                       "(not supported yet)", category="unsupported")]
    return [DeviceScalar(value.values, info.result_types[0].shape)]


def broadcast_in_dim(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    (x,) = operands
    if isinstance(x, DeviceScalar):
        if math.prod(info.result_types[0].shape) != 1 and not ctx.is_global:
            return [shifted.from_scalar(info, x, ctx)]
        return _scalar_passthrough(info, x)
    if isinstance(x, Shifted):
        return shifted.moved(info, x, broadcast_in_dim, ctx)
    if isinstance(x, DEVICE_BLOCK_VALUES):
        return device_blocks.moved(info, x, broadcast_in_dim, ctx)
    if isinstance(x, Windowed):
        return window_rowwise(info, operands, ctx, broadcast_in_dim)
    dims = tuple(info.attrs["broadcast_dimensions"])
    local_out = info.result_types[0].shape
    local_in = info.operand_types[0].shape
    shape, tiling, poly = list(local_out), [()] * len(local_out), set(range(len(local_out)))
    for i, d in enumerate(dims):
        if local_in[i] == local_out[d]:
            shape[d], tiling[d] = x.term.shape[i], x.tiling[i]
            if i not in x.poly:
                poly.discard(d)
        elif x.tiling[i]:
            return [Opaque(f"broadcast widens dim {i}, which is split over "
                           f"{axes_str(x.tiling[i])}", category="layout_mismatch")]
    if ctx.is_global:
        poly = set()
    term = make_broadcast(x.term, dims, tuple(shape))
    return [Rel(term, tuple(tiling), x.partial, x.kind, frozenset(poly), x.scope,
                x.partial_origin)]


def reshape(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    (x,) = operands
    if isinstance(x, DeviceScalar):
        return _scalar_passthrough(info, x)
    if isinstance(x, Shifted):
        return shifted.moved(info, x, reshape, ctx)
    if isinstance(x, DEVICE_BLOCK_VALUES):
        return device_blocks.moved(info, x, reshape, ctx)
    if isinstance(x, Windowed):
        entry = entries.squeezed(info, x)
        return [entry] if entry is not None else window_rowwise(info, operands, ctx, reshape)
    local_in = info.operand_types[0].shape
    local_out = info.result_types[0].shape
    if ctx.is_global or not x.tiled_axes:
        x = freeze(x)
        if x.tiled_axes:
            return [Opaque("internal: tiled global value", category="internal")]
        term = make_reshape(x.term, local_out)
        return [Rel(term, ((),) * len(local_out), x.partial, x.kind, frozenset(), x.scope,
                    x.partial_origin)]
    groups = reshape_groups(local_in, local_out)
    if groups is None:
        return [Opaque("reshape: cannot match dims", category="internal")]
    groups = _peel_unit_dims(groups, local_in, local_out, x.tiling)
    choices = []
    for src_dims, dst_dims in groups:
        split = [d for d in src_dims if x.tiling[d]]
        if not split:
            continue
        major = [d for d in src_dims if local_in[d] != 1 or x.tiling[d]]
        axes = _merged_tiling(src_dims, split, local_in, x.tiling)
        if axes is None or not major or split[0] != major[0] or not dst_dims:
            return [Opaque(f"reshape regroups dim {split[0]}, which is split over "
                           f"{axes_str(x.tiling[split[0]])}, in a way that mixes blocks",
                           category="layout_mismatch")]
        non_unit = [d for d in dst_dims if local_out[d] != 1]
        targets = [dst_dims[0], *(non_unit[:1] if non_unit else dst_dims[1:])]
        choices.append((axes, list(dict.fromkeys(targets))))
    placements = itertools.islice(itertools.product(*(targets for _, targets in choices)),
                                  _RESHAPE_CANDIDATES)
    candidates = [_reshape_result(x, local_out, list(zip((axes for axes, _ in choices), placed)),
                                  ctx) for placed in placements]
    if ctx.reference is not None:
        for candidate in candidates:
            if single_scaled(candidate.term)[1].serial in ctx.reference:
                return [candidate]
        shapes = getattr(ctx.reference, "shapes", ())
        for candidate in candidates:
            if candidate.term.shape in shapes:
                return [candidate]
        squeezed = [d for d in x.term.shape if d != 1]
        for candidate in candidates:
            if [d for d in candidate.term.shape if d != 1] == squeezed:
                return [candidate]
    return [candidates[0]]


def _merged_tiling(src_dims, split, local_in, tiling) -> tuple[str, ...] | None:
    """The tiling of a reshape group's source dims read as one merged dim (row-major), or None
    where the devices' blocks are not blocks of it.

    One split dim: its axes. Several: every dim before the last split one must hold one element
    per device (local size 1), so the merged dim's global index is, major first, each split
    dim's block index times the minor dims' global size plus the last split dim's local
    offset: a contiguous block of the merged dim, tiled over the split dims' axes in order
    ((K split over Y, local 1) x (M split over Z) merged is split over (Y, Z)). A split dim of
    local size > 1 before another split dim interleaves blocks (None)."""
    if len(split) == 1:
        return tiling[split[0]]
    last = src_dims.index(split[-1])
    if any(local_in[d] != 1 for d in src_dims[:last]):
        return None
    return tuple(a for d in split for a in tiling[d])


def _peel_unit_dims(groups, local_in, local_out, tiling):
    """A split dim of local size 1 leading a group pairs with a leading unit dim of the result,
    in a group of its own (it keeps its global dim: (1, 8) -> (1, 4, 2) with dim 0 split), so
    that another split dim of the group can regroup on its own."""
    out = []
    for src_dims, dst_dims in groups:
        while (len(src_dims) > 1 and len(dst_dims) > 1 and local_in[src_dims[0]] == 1
               and tiling[src_dims[0]] and local_out[dst_dims[0]] == 1):
            out.append(([src_dims[0]], [dst_dims[0]]))
            src_dims, dst_dims = src_dims[1:], dst_dims[1:]
        out.append((src_dims, dst_dims))
    return out


_RESHAPE_CANDIDATES = 16
"""The most global views of an ambiguous reshape (split dims among unit dims) compared with
the reference's terms."""


def _reshape_result(x: Rel, local_out: tuple[int, ...], targets, ctx: RuleContext) -> Rel:
    """The reshaped relation with each split group's tiling on its chosen result dim.

    Where a split dim regroups with unit dims (local 8 -> 1x8) the global view is ambiguous
    (4x8 or 1x32 for 4 blocks); both are valid descriptions of the same local data. Chosen in
    order: the one whose term the reference computes (heads split over tp), one with the shape
    of a reference term, one that only adds or drops unit dims of the global value (XLA's
    reshapes around a bias); else (and without a reference) the major dim.
    """
    shape, tiling = list(local_out), [()] * len(local_out)
    for axes, target in targets:
        tiling[target] = axes
        shape[target] = local_out[target] * ctx.mesh.group_size(axes)
    term = make_reshape(x.term, tuple(shape))
    return replace(x, term=term, tiling=tuple(tiling), poly=frozenset())


def transpose(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    (x,) = operands
    if isinstance(x, Shifted):
        return shifted.moved(info, x, transpose, ctx)
    if isinstance(x, DEVICE_BLOCK_VALUES):
        return device_blocks.moved(info, x, transpose, ctx)
    if isinstance(x, Windowed):
        return window_rowwise(info, operands, ctx, transpose)
    perm = tuple(info.attrs["permutation"])
    poly = frozenset(i for i, p in enumerate(perm) if p in x.poly)
    return [replace(x, term=make_transpose(x.term, perm),
                    tiling=tuple(x.tiling[p] for p in perm), poly=poly)]


def reverse(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """`reverse` (`jnp.flip`) along dims that are not split: each device reverses its whole
    rows, the same as the global tensor's (a partial sum stays one: reversing is linear). A
    split dim (device d's block would be device n-1-d's reversed) or a dim a broadcast left
    polymorphic is not related."""
    (x,) = operands
    dims = tuple(info.attrs["dimensions"])
    if not isinstance(x, Rel):
        return [Opaque(f"reverse of a {type(x).__name__} value (not supported yet)",
                       category="unsupported")]
    for d in dims:
        if x.tiling[d]:
            return [Opaque(f"reverse of dim {d}, which is split over {axes_str(x.tiling[d])}: "
                           "each device reverses its own block (not supported yet)",
                           category="unsupported")]
    x = freeze(x) if any(d in x.poly for d in dims) else x
    return [replace(x, term=make_reverse(x.term, dims))]


def make_reverse(x: Term, dims: tuple[int, ...]) -> Term:
    """The term of `x` reversed along `dims`: a splat, or no dim of size above one, is `x`."""
    dims = tuple(sorted(d for d in dims if x.shape[d] > 1))
    if not dims or splat_value(x) is not None:
        return x
    return make_op("stablehlo.reverse", (x,), (dims,), x.shape, x.dtype, linear_in=0)


def slice_(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    (x,) = operands
    if isinstance(x, DeviceScalar):
        return _scalar_passthrough(info, x)
    a = info.attrs
    starts, limits = tuple(a["start_indices"]), tuple(a["limit_indices"])
    strides = tuple(a.get("strides") or (1,) * len(starts))
    local = info.operand_types[0].shape
    lifted = window_rowwise(info, operands, ctx, slice_) if isinstance(x, Windowed) else None
    if lifted is not None:
        return lifted
    if isinstance(x, Windowed) or ctx.mesh is not None and not ctx.is_global and any(
            axes and (starts[d], limits[d]) != (0, local[d]) for d, axes in enumerate(x.tiling)):
        window = slice_window(x if isinstance(x, Windowed) else freeze(x), starts, limits,
                              strides, local, ctx.mesh)
        if window is not None:
            return [window]
        if isinstance(x, Windowed):
            return [Opaque(x.reason, category="layout_mismatch")]
    x = freeze(x)
    for d, axes in enumerate(x.tiling):
        if axes and (starts[d], limits[d], strides[d]) != (0, local[d], 1):
            return [Opaque(f"slice of dim {d}, which is split over {axes_str(axes)}: each "
                           "device slices its own block, not the global tensor",
                           category="layout_mismatch")]
    shape = tuple(x.term.shape[d] if axes else info.result_types[0].shape[d]
                  for d, axes in enumerate(x.tiling))
    if shape == x.term.shape:
        return [x]
    term = make_op("slice", (x.term,), (starts, tuple(
        limits[d] if not axes else x.term.shape[d] for d, axes in enumerate(x.tiling)), strides),
        shape, x.term.dtype, linear_in=0)
    return [replace(x, term=term)]


def concatenate(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    dim = info.attrs["dimension"]
    lifted = window_rowwise(info, operands, ctx, concatenate)
    if lifted is not None:
        return lifted
    if ctx.mesh is not None and not ctx.is_global:
        joined = concat_windows(list(operands), dim, ctx.mesh)
        if joined is not None:
            return [joined]
    windowed = next((x for x in operands if isinstance(x, Windowed)), None)
    if windowed is not None:
        return [Opaque(windowed.reason, category="layout_mismatch")]
    rels = list(operands)
    if not all(isinstance(x, Rel) for x in rels):
        return [Opaque("concatenate of device-dependent scalars", category="unsupported")]
    rank = len(info.result_types[0].shape)
    others = [d for d in range(rank) if d != dim]
    unified = unify_dims(rels, [others] * len(rels), ctx, "concatenate")
    if isinstance(unified, Opaque):
        return [unified]
    rels = [freeze(x) for x in unified[0]]
    for x in rels:
        if x.tiling[dim]:
            return [Opaque(f"concatenate along dim {dim}, which is split over "
                           f"{axes_str(x.tiling[dim])}: blocks interleave",
                           category="layout_mismatch")]
    partials = {(x.partial, x.kind) for x in rels}
    if len(partials) != 1:
        return [Opaque("concatenate of values with different partial reductions",
                       category="partial_mixed")]
    shape = list(rels[0].term.shape)
    shape[dim] = sum(x.term.shape[dim] for x in rels)
    term = rejoined([x.term for x in rels], dim) or intern(
        "concatenate", tuple(x.term for x in rels), (dim,), tuple(shape), rels[0].term.dtype)
    return [replace(rels[0], term=term)]


def rejoined(pieces: list[Term], dim: int) -> Term | None:
    """The tensor itself when `pieces` are its consecutive slices along `dim`, from its first
    row to its last (blockwise code concatenating the blocks it cut: an online softmax's keys),
    else None."""
    base = pieces[0].args[0] if pieces[0].op == "slice" else None
    if base is None:
        return None
    row = 0
    for piece in pieces:
        if piece.op != "slice" or piece.args[0] is not base:
            return None
        starts, limits, strides = piece.attrs
        for d, size in enumerate(base.shape):
            want = (row, row + piece.shape[dim]) if d == dim else (0, size)
            if (starts[d], limits[d]) != want or strides[d] != 1:
                return None
        row += piece.shape[dim]
    return base if row == base.shape[dim] else None


def pad(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    x, value = operands
    lifted = window_rowwise(info, operands, ctx, pad) if isinstance(x, Windowed) else None
    if lifted is not None:
        return lifted
    if isinstance(x, Windowed):
        return [_pad_window(info, x, value, ctx)]
    if not isinstance(x, Rel) or not isinstance(value, Rel) or value.tiled_axes:
        return [Opaque("pad with a device-dependent value", category="unsupported")]
    x = freeze(x)
    a = info.attrs
    low, high, interior = (tuple(a["edge_padding_low"]), tuple(a["edge_padding_high"]),
                           tuple(a["interior_padding"]))
    for d, axes in enumerate(x.tiling):
        if axes and (low[d], high[d], interior[d]) != (0, 0, 0):
            return [Opaque(f"pad of dim {d}, which is split over {axes_str(axes)}: every "
                           "device pads its own block", category="layout_mismatch")]
    padded = [d for d in range(len(low)) if (low[d], high[d], interior[d]) != (0, 0, 0)]
    if (len(padded) == 1 and ctx.mesh is not None and not ctx.is_global and not x.partial
            and not interior[padded[0]] and low[padded[0]] >= 0 and high[padded[0]] >= 0
            and value.term is make_splat(0, (), x.term.dtype)):
        return [padded_window(x, padded[0], low[padded[0]], high[padded[0]], ctx.mesh)]
    pad_term = value.term
    if x.partial:
        constant = splat_value(value.term)
        if constant is None or value.partial:
            return [Opaque("pad of a partial value with a computed pad value",
                           category="nonlinear_partial")]
        if x.kind == "sum" and constant != 0:
            # every device pads with the value, so the reduced padding is |group| x it
            pad_term = scale(value.term, ctx.mesh.group_size(x.partial))
    shape = tuple(s + low[d] + high[d] + max(s - 1, 0) * interior[d]
                  for d, s in enumerate(x.term.shape))
    # Padding with zero is linear (the transpose of a slice in a gradient): scalars are pulled
    # out, as for slice, so a pmean's 1/n meets the reference's coefficient.
    linear = 0 if splat_value(pad_term) == 0 else None
    term = make_op("pad", (x.term, pad_term), (low, high, interior), shape, x.term.dtype,
                   linear_in=linear)
    return [replace(x, term=term)]


def _pad_window(info: OpInfo, x: Windowed, value: Value, ctx: RuleContext) -> Value:
    """Zero padding of a halo window along its dim only (XLA's `jnp.pad` of a split dim):
    a longer window whose new rows are zeros (window.pad_window)."""
    a = info.attrs
    low, high, interior = (tuple(a["edge_padding_low"]), tuple(a["edge_padding_high"]),
                           tuple(a["interior_padding"]))
    others = [d for d in range(len(low)) if d != x.dim]
    if (ctx.mesh is None or not isinstance(value, Rel) or splat_value(value.term) != 0
            or any(interior) or low[x.dim] < 0 or high[x.dim] < 0
            or any(low[d] or high[d] for d in others)):
        return Opaque(x.reason, origin=x.origin, category="layout_mismatch")
    return pad_window(x, low[x.dim], high[x.dim], ctx.mesh)


MOVEMENT_RULES = {
    "stablehlo.constant": constant,
    "stablehlo.iota": iota,
    "stablehlo.broadcast_in_dim": broadcast_in_dim,
    "stablehlo.reshape": reshape,
    "stablehlo.transpose": transpose,
    "stablehlo.reverse": reverse,
    "stablehlo.slice": slice_,
    "stablehlo.concatenate": concatenate,
    "stablehlo.pad": pad,
}
