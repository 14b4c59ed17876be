"""Collectives: how all_reduce, all_gather, reduce_scatter, all_to_all and collective_permute
change a layout. Replica groups are read as mesh axes; groups that match no axes are opaque."""

from __future__ import annotations

import math
from dataclasses import replace

from entangle_mlir.core import precision
from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import Opaque, Permuted, Rel, Value, Windowed
from entangle_mlir.core.terms import make_reshape, make_roll, make_transpose, scale
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze
from entangle_mlir.rules.kinds.window import as_window, cyclic_shifts, permute_window
from entangle_mlir.rules.reduction import reduce_term, reduction_kind
from entangle_mlir.rules.reduction import unsupported_reducer as _unsupported_reducer
from entangle_mlir.semantics.groups import GroupError, permute_pairs, process_groups


def group_axes(info: OpInfo, ctx: RuleContext, ordered: bool = True
               ) -> tuple[str, ...] | Opaque:
    """The mesh axes a collective's replica groups run over (ordered as in the groups)."""
    if ctx.is_global or ctx.mesh is None:
        return Opaque(f"{info.name} outside a manual computation", category="unsupported")
    try:
        groups = process_groups(info.name, info.attrs, ctx.mesh.replicas, ctx.mesh.partitions)
    except GroupError as err:
        return Opaque(str(err), category="wrong_groups")
    axes = ctx.mesh.axes_of_groups(groups, ordered)
    if axes is None:
        return Opaque(f"{info.name}: replica groups {groups} do not correspond to any mesh axes "
                      f"of {ctx.mesh.describe()}", category="wrong_groups")
    if not axes:
        return ()
    return axes


def _needs_rel(info: OpInfo, x: Value) -> Rel | Opaque:
    if not isinstance(x, Rel):
        return Opaque(f"{info.name} of a device-dependent scalar", category="unsupported")
    return freeze(x)


def _order(axes, ctx: RuleContext) -> tuple[str, ...]:
    return tuple(sorted(axes, key=ctx.mesh.names.index))


def all_reduce(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    axes = group_axes(info, ctx, ordered=False)
    if isinstance(axes, Opaque):
        return [axes] * len(operands)
    reducer = info.attrs.get("reducer", "other")
    kind = reduction_kind(reducer, info.result_types[0].dtype) if info.result_types else None
    if kind is None:
        return [Opaque(_unsupported_reducer(info),
                       category="unsupported")] * len(operands)
    return [_all_reduce_one(info, x, axes, kind, ctx) for x in operands]


def _all_reduce_one(info: OpInfo, x: Value, axes: tuple[str, ...], kind: str,
                    ctx: RuleContext) -> Value:
    """One operand's all_reduce. Its poly dims stay poly: each device's value is constant
    along them (a broadcast built at the local shape), and so is any sum or max of such
    values (jax's gradient psums a loss's broadcast cotangent over 'tp' when shard_map's
    check_vma is off)."""
    if not isinstance(x, Rel):
        return _needs_rel(info, x)
    verb = {"sum": "sums", "max": "takes the max", "min": "takes the min"}[kind]
    x, consumed = _reduce_unit_blocks(x, axes, kind, ctx)
    axes = tuple(a for a in axes if a not in consumed)
    split = set(axes) & set(x.tiled_axes)
    if split:
        return Opaque(f"all_reduce {verb} over {axes_str(axes)} of a value split over "
                      f"{axes_str(sorted(split))}: it combines different blocks",
                      category="wrong_axis")
    reduced = set(axes) & set(x.partial)
    if reduced and x.kind != kind:
        return Opaque(f"all_reduce {verb} over {axes_str(axes)} but the value is a partial "
                      f"{x.kind}: the reduction kind is wrong", category="wrong_reducer")
    if reduced and kind == "sum":
        lost = _sum_precision(info, x, axes, ctx)
        if lost is not None:
            return lost
    replicated_axes = [a for a in axes if a not in reduced]
    if x.partial and replicated_axes and (kind != "sum" or x.kind != "sum"):
        return Opaque(f"all_reduce {verb} over {axes_str(replicated_axes)} mixes the pieces of "
                      f"a partial {x.kind} over {axes_str(x.partial)}", category="wrong_reducer")
    term = x.term
    if replicated_axes and kind == "sum":
        factor = ctx.mesh.group_size(replicated_axes)
        term = scale(term, factor)
        pending = (f"; the value is still a partial sum over {axes_str(x.partial)}"
                   if x.partial else "")
        ctx.hint(f"all_reduce sums over {axes_str(replicated_axes)}, but the value is already "
                 f"replicated over {axes_str(replicated_axes)}: the result is {factor} x the "
                 f"value{pending}", "duplicate_reduction")
    remaining = tuple(a for a in x.partial if a not in reduced)
    return replace(x, term=term, partial=remaining, kind=x.kind if remaining else "",
                   partial_origin=x.partial_origin if remaining else None)


def _sum_precision(info: OpInfo, x: Rel, axes, ctx: RuleContext) -> Opaque | None:
    """A collective summing partial sums in `info`'s element type: lower precision than the
    type the reference computes the sum in is precision lost; a sum in a narrow float type
    that the reference also computes in it is regrouped (liberty 1), and the report says so."""
    dtype, wanted = info.result_types[0].dtype, x.term.dtype
    name = info.name.split(".")[-1]
    if precision.lower_precision(dtype, wanted):
        return Opaque(f"precision lost: {name} sums over {axes_str(axes)} in {dtype} where the "
                      f"reference sums in {wanted}", category="precision_lost")
    if precision.lower_precision(dtype, "f32"):
        ctx.note(f"float sums regrouped in {dtype}: {name} adds {dtype} partial sums of a "
                 f"sum the reference also computes in {dtype} (float sums may be regrouped)")
    return None


def _reduce_unit_blocks(x: Rel, axes: tuple[str, ...], kind: str, ctx: RuleContext
                        ) -> tuple[Rel, set[str]]:
    """Dims split over (some of) the reduced axes into blocks of one row: the all_reduce
    combines the rows, a keepdims reduction of the global dim (jax's sum over a size-1 local
    dim is a reshape after entangle-normalize), and the axes that did it. Else `x`, none."""
    dims = [d for d, t in enumerate(x.tiling) if t and set(t) <= set(axes)
            and x.term.shape[d] == ctx.mesh.group_size(t) and d not in x.poly]
    if not dims or x.partial:
        return x, set()
    shape = tuple(n for d, n in enumerate(x.term.shape) if d not in dims)
    term = reduce_term(kind, x.term, tuple(dims), shape, x.term.dtype)
    kept = tuple(1 if d in dims else n for d, n in enumerate(x.term.shape))
    tiling = tuple(() if d in dims else t for d, t in enumerate(x.tiling))
    consumed = {a for d in dims for a in x.tiling[d]}
    return replace(x, term=make_reshape(term, kept), tiling=tiling), consumed


def all_gather(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    axes = group_axes(info, ctx)
    if isinstance(axes, Opaque):
        return [axes] * len(operands)
    dim = info.attrs["all_gather_dim"]
    results = []
    for x in operands:
        x = _needs_rel(info, x)
        if isinstance(x, Opaque):
            results.append(x)
            continue
        results.append(_all_gather_one(x, dim, axes, ctx))
    return results


def _all_gather_one(x: Rel, dim: int, axes: tuple[str, ...], ctx: RuleContext) -> Value:
    tiling = x.tiling[dim]
    if tiling[len(tiling) - len(axes):] == axes and len(tiling) >= len(axes):
        new = list(x.tiling)
        new[dim] = tiling[:len(tiling) - len(axes)]
        return replace(x, tiling=tuple(new))
    if set(axes) & set(x.partial):
        if x.kind != "sum":
            return Opaque(f"all_gather over {axes_str(axes)} of a partial {x.kind} over "
                          f"{axes_str(x.partial)}: missing all_reduce before it",
                          category="partial_mixed")
        return Opaque(f"all_gather over {axes_str(axes)} of a partial sum over "
                      f"{axes_str(x.partial)}: missing all_reduce/psum (or use reduce_scatter)",
                      category="partial_mixed")
    for other, other_axes in enumerate(x.tiling):
        if other != dim and set(axes) & set(other_axes):
            return Opaque(f"all_gather concatenates along dim {dim} but the value is split "
                          f"along dim {other} over {axes_str(other_axes)}", category="wrong_dim")
    if set(axes) & set(tiling):
        return Opaque(f"all_gather over {axes_str(axes)} along dim {dim}, which is split over "
                      f"{axes_str(tiling)} (major first): it concatenates the blocks in the "
                      f"wrong order (only the minor-most axes {axes_str(tiling[-len(axes):])} "
                      "can be gathered)", category="wrong_order")
    return Opaque(f"all_gather over {axes_str(axes)} of a value replicated over "
                  f"{axes_str(axes)}: it concatenates {ctx.mesh.group_size(axes)} identical "
                  "copies", category="duplicate")


def reduce_scatter(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    axes = group_axes(info, ctx)
    if isinstance(axes, Opaque):
        return [axes]
    (x,) = operands
    x = _needs_rel(info, x)
    if isinstance(x, Opaque):
        return [x]
    reducer = info.attrs.get("reducer", "other")
    if reducer != "add":
        return [Opaque(_unsupported_reducer(info),
                       category="unsupported")]
    dim = info.attrs["scatter_dimension"]
    split = set(axes) & set(x.tiled_axes)
    if split:
        return [Opaque(f"reduce_scatter sums over {axes_str(axes)} a value split over "
                       f"{axes_str(sorted(split))}: it combines different blocks",
                       category="wrong_axis")]
    if x.partial and x.kind != "sum":
        return [Opaque(f"reduce_scatter sums a partial {x.kind}", category="wrong_reducer")]
    reduced = [a for a in axes if a in x.partial]
    if reduced:
        lost = _sum_precision(info, x, axes, ctx)
        if lost is not None:
            return [lost]
    replicated_axes = [a for a in axes if a not in x.partial]
    term = x.term
    if replicated_axes:
        factor = ctx.mesh.group_size(replicated_axes)
        term = scale(term, factor)
        ctx.hint(f"reduce_scatter sums over {axes_str(replicated_axes)}, but the value is "
                 f"already replicated over {axes_str(replicated_axes)}: the result is "
                 f"{factor} x the value", "duplicate_reduction")
    tiling = list(x.tiling)
    tiling[dim] = tiling[dim] + axes
    remaining = tuple(a for a in x.partial if a not in reduced)
    return [replace(x, term=term, tiling=tuple(tiling), partial=remaining,
                    kind=x.kind if remaining else "",
                    partial_origin=x.partial_origin if remaining else None)]


def all_to_all(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    axes = group_axes(info, ctx)
    if isinstance(axes, Opaque):
        return [axes] * len(operands)
    split, concat = info.attrs["split_dimension"], info.attrs["concat_dimension"]
    results = []
    for x in operands:
        x = _needs_rel(info, x)
        if isinstance(x, Opaque):
            results.append(x)
            continue
        tiling = x.tiling[concat]
        if set(axes) & set(x.partial):
            results.append(Opaque(f"all_to_all over {axes_str(axes)} of a partial sum",
                                  category="partial_mixed"))
        elif split == concat:
            results.append(_all_to_all_same_dim(info, x, axes, split, ctx))
        elif split != concat and tiling[len(tiling) - len(axes):] == axes and not (
                set(axes) & set(x.tiling[split])):
            new = list(x.tiling)
            new[concat] = tiling[:len(tiling) - len(axes)]
            new[split] = x.tiling[split] + axes
            results.append(replace(x, tiling=tuple(new)))
        else:
            results.append(Opaque(
                f"all_to_all concatenates along dim {concat} but the value is not split along "
                f"dim {concat} over {axes_str(axes)}", category="wrong_dim"))
    return results


def _all_to_all_same_dim(info: OpInfo, x: Rel, axes: tuple[str, ...], k: int,
                         ctx: RuleContext) -> Value:
    """all_to_all with split_dimension == concat_dimension == k over axes A (XLA's reshard
    from a dim j split over A to dim k): device b's chunk i along k (of n = |A| chunks) is
    chunk b of the device with block index i along A. So A leaves dim j, whose block index i
    becomes a sub-block of dim k: with dim j = (B, i, r) and dim k = (C, b, q) in the global
    term E (B, C the other axes of j and k), the result is E regrouped as j = (B, r) and
    k = (C, b, i, q), split over B and C + A. Needs A to be the minor-most axes of exactly one
    other dim."""
    n = ctx.mesh.group_size(axes)
    local_k = info.operand_types[0].shape[k]
    holders = [d for d, t in enumerate(x.tiling) if set(t) & set(axes)]
    if (len(holders) != 1 or holders[0] == k or local_k % n
            or x.tiling[holders[0]][len(x.tiling[holders[0]]) - len(axes):] != axes):
        return Opaque(f"all_to_all splits and concatenates dim {k} over {axes_str(axes)}, but "
                      f"the value is not split over {axes_str(axes)} along exactly one other "
                      "dim (as the minor-most axes)", category="wrong_dim")
    j = holders[0]
    outer = x.tiling[j][:len(x.tiling[j]) - len(axes)]
    b_size = ctx.mesh.group_size(outer)
    c_size = ctx.mesh.group_size(x.tiling[k])
    term = x.term
    rows = term.shape[j] // (b_size * n)
    chunk = local_k // n
    nxt = k + 1
    tiling = list(x.tiling)
    tiling[j] = outer
    if chunk == 1 and not x.tiling[k] and nxt < len(term.shape) and nxt != j and not x.tiling[
            nxt]:
        # One element per chunk: XLA split the target dim into (n, rest) at dims k, k + 1
        # (or reshaped a unit dim in after k), so the block index b goes back to the major
        # part of dim k + 1, split over A, and dim k keeps the source block index i.
        layout = {j: (((j, "B"), b_size), ((j, "i"), n), ((j, "r"), rows)),
                  k: (((k, "b"), n),)}
        target = {j: ((j, "B"), (j, "r")), k: ((j, "i"),), nxt: ((k, "b"), (nxt, ""))}
        tiling[nxt] = axes
    else:
        layout = {j: (((j, "B"), b_size), ((j, "i"), n), ((j, "r"), rows)),
                  k: (((k, "C"), c_size), ((k, "b"), n), ((k, "q"), chunk))}
        target = {j: ((j, "B"), (j, "r")), k: ((k, "C"), (k, "b"), (j, "i"), (k, "q"))}
        tiling[k] = x.tiling[k] + axes
    expanded, ids = [], {}
    for d, size in enumerate(term.shape):
        for key, part in layout.get(d, (((d, ""), size),)):
            ids[key] = len(expanded)
            expanded.append(part)
    order, merged = [], []
    for d in range(len(term.shape)):
        keys = target.get(d, ((d, ""),))
        order.extend(ids[key] for key in keys)
        merged.append(math.prod(expanded[ids[key]] for key in keys))
    regrouped = make_reshape(make_transpose(make_reshape(term, tuple(expanded)), tuple(order)),
                             tuple(merged))
    return replace(x, term=regrouped, tiling=tuple(tiling))


def collective_permute(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """Moving blocks between devices. A move along axes the value does not depend on is the
    identity; a cyclic shift of the blocks of split dims is a roll of the global tensor; any
    other order is kept as `Permuted` so a later permute can undo it (ppermute and its inverse,
    ring steps that come full circle)."""
    (x,) = operands
    if isinstance(x, Permuted):
        base, sources = x.rel, x.sources
    elif isinstance(x, Windowed):
        base, sources = x.rel, None
    else:
        base = _needs_rel(info, x)
        if isinstance(base, Opaque):
            return [base]
        sources = None
    if ctx.is_global or ctx.mesh is None:
        return [Opaque("collective_permute outside a manual computation",
                       category="unsupported")]
    mesh = ctx.mesh
    try:
        pairs = permute_pairs(info.attrs, mesh.replicas, mesh.partitions)
    except GroupError as err:
        return [Opaque(str(err), category="wrong_groups")]
    moved_from = {target: source for source, target in pairs}
    order = [t for _, t in pairs]
    window = x if isinstance(x, Windowed) else None
    if window is None and len(moved_from) != mesh.num_devices and not base.partial:
        split = [d for d, axes in enumerate(base.tiling) if axes]
        window = as_window(base, split[0], mesh) if len(split) == 1 else None
    if window is not None:
        shifts = cyclic_shifts(window.rel, moved_from, mesh)
        moved = ("" if shifts is not None else
                 _moved_blocks(window.rel, tuple(moved_from.get(t, t)
                                                 for t in range(mesh.num_devices)), mesh, order))
        return [permute_window(window, moved_from, mesh, moved)]
    if len(moved_from) != mesh.num_devices:
        missing = sorted(set(range(mesh.num_devices)) - set(moved_from))
        return [Opaque(f"collective_permute leaves devices {missing[:8]} without data "
                       "(they receive zeros)", category="wrong_order")]
    composed = tuple(moved_from[t] if sources is None else sources[moved_from[t]]
                     for t in range(mesh.num_devices))
    placed = place_blocks(base, composed, mesh, order)
    if isinstance(placed, Rel) and placed.term is not base.term:
        shifts = cyclic_shifts(base, dict(enumerate(composed)), mesh) or []
        rolled = ", ".join(f"{rows} along dim {dim}" for dim, rows in enumerate(shifts) if rows)
        ctx.hint(f"{_moved_blocks(base, composed, mesh, order)}: the global tensor is rolled "
                 f"by {rolled}", "wrong_order")
    return [placed]


def place_blocks(x: Rel, sources: tuple[int, ...], mesh, order=()) -> Value:
    """`x` with device d holding what `x` places on device `sources[d]`: `x` itself when every
    device gets its own block, a roll of the split dims when the blocks shift cyclically,
    else `Permuted` (an error for a partial value, whose pieces must stay in their group)."""
    if x.partial:
        free = [a for a in mesh.names if a not in x.partial]
        groups: dict[tuple, tuple] = {}
        for target, source in enumerate(sources):
            key = tuple(mesh.coords(target)[a] for a in free)
            origin = tuple(mesh.coords(source)[a] for a in free)
            if groups.setdefault(key, origin) != origin:
                return Opaque(f"collective_permute mixes the pieces of a partial {x.kind} over "
                              f"{axes_str(x.partial)} between groups: device {target} "
                              f"receives device {source}'s piece", category="wrong_order")
    shifts = cyclic_shifts(x, dict(enumerate(sources)), mesh)
    if shifts is None:
        reason = _moved_blocks(x, sources, mesh, order)
        if x.partial:
            return Opaque(reason, category="wrong_order")
        return Permuted(x, sources, reason)
    term = x.term
    for dim, shift in enumerate(shifts):
        term = make_roll(term, dim, shift)
    return replace(x, term=term) if term is not x.term else x


def _moved_blocks(x: Rel, sources: tuple[int, ...], mesh, order=()) -> str:
    """The first device (in `order`, then by id) that receives another block, in words."""
    target = next(t for t in [*order, *range(len(sources))]
                  if any(mesh.block_index(axes, t) != mesh.block_index(axes, sources[t])
                         for axes in x.tiling if axes))
    moved = [a for a in x.tiled_axes if mesh.coords(sources[target])[a] != mesh.coords(target)[a]]
    return (f"collective_permute moves blocks along {axes_str(moved)}: device {target} "
            f"receives device {sources[target]}'s block")


COLLECTIVE_RULES = {
    "stablehlo.all_reduce": all_reduce,
    "stablehlo.all_gather": all_gather,
    "stablehlo.reduce_scatter": reduce_scatter,
    "stablehlo.all_to_all": all_to_all,
    "stablehlo.collective_permute": collective_permute,
}
