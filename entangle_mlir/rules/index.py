"""Device identity and device-dependent indexing: partition_id, dynamic_slice.

`partition_id` starts a per-device integer table; jax's `axis_index` arithmetic is evaluated
exactly on it (see elementwise.py). A `dynamic_slice` whose offsets are such tables is a tiling
when offset(d) == block_index(axes, d) * size for some mesh axes, and also when
offset(d) == (block_index(axes, d) // r) * size (a coarser split: groups of r devices read one
block, K/V heads fewer than tp): then each device holds its block of the tensor whose blocks
are repeated r times in place (`repeat_blocks`).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from entangle_mlir.core.mesh import Mesh, axes_str
from entangle_mlir.core.relations import DeviceScalar, Opaque, Rel, Value, Windowed
from entangle_mlir.core.terms import (
    DENSE_VALUES,
    Term,
    intern,
    make_broadcast,
    make_op,
    make_reshape,
    make_splat,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import device_offsets, freeze
from entangle_mlir.rules.kinds.window import window_dynamic_slice

MAX_TABLE_DEVICES = 1 << 22


def partition_id(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """The device's id (partition_id; replica_id in programs run as replicas): a device
    scalar tabulated over every device."""
    if ctx.is_global or ctx.mesh is None:
        return [Opaque("partition_id outside a manual computation", category="unsupported")]
    if set(ctx.manual_axes) != set(ctx.mesh.names):
        return [Opaque("partition_id in a partially manual computation is not supported",
                       category="unsupported")]
    if ctx.mesh.num_devices > MAX_TABLE_DEVICES:
        return [Opaque(f"partition_id on {ctx.mesh.num_devices} devices: device tables are "
                       f"limited to {MAX_TABLE_DEVICES} devices", category="unsupported")]
    return [DeviceScalar(tuple(range(ctx.mesh.num_devices)), info.result_types[0].shape)]




def _candidate_axes(mesh: Mesh, free: list[str], offsets=None):
    """Orderings of the axes along which the offsets vary (all free axes if unknown)."""
    if offsets is not None:
        varying = []
        for axis in free:
            for d in range(mesh.num_devices):
                coords = mesh.coords(d)
                if coords[axis] and offsets[d] != offsets[mesh.device({**coords, axis: 0})]:
                    varying.append(axis)
                    break
        if varying:
            yield from itertools.permutations(varying)
            lengths = range(1, len(varying)) if len(varying) <= 4 else (1,)
            for count in lengths:
                yield from itertools.permutations(varying, count)
            return
    for count in range(1, min(len(free), 3) + 1):
        yield from itertools.permutations(free, count)


def _match_axes(mesh: Mesh, offsets: tuple[int, ...], size: int, free: list[str],
                global_size: int) -> tuple[tuple[str, ...] | None, tuple]:
    """Axes A with offsets[d] == block_index(A, d) * size, else the closest candidate."""
    best, best_bad, best_score = None, None, None
    for axes in _candidate_axes(mesh, free, offsets):
        if size * mesh.group_size(axes) > global_size:
            continue
        index = [mesh.block_index(axes, d) for d in range(mesh.num_devices)]
        expected = [i * size for i in index]
        bad = [d for d in range(mesh.num_devices) if offsets[d] != expected[d]]
        if not bad:
            return axes, ()
        score = (not _affine(offsets, index, "i"), len(bad))
        if best_score is None or score < best_score:
            best, best_bad, best_score = axes, (bad, expected), score
    return None, (best, best_bad)


def _match_coarse(mesh: Mesh, offsets: tuple[int, ...], size: int, free: list[str],
                  global_size: int) -> tuple[tuple[str, ...], int] | None:
    """(axes A, r) with offsets[d] == (block_index(A, d) // r) * size, r > 1 dividing A's
    group size: device d reads block d // r of the dim split into |A| / r blocks (a coarser
    split than A's, MaxText's K/V heads replicated over groups of r devices)."""
    for axes in _candidate_axes(mesh, free, offsets):
        group = mesh.group_size(axes)
        for repeat in range(2, group + 1):
            if group % repeat or (group // repeat) * size > global_size:
                continue
            if all(offsets[d] == mesh.block_index(axes, d) // repeat * size
                   for d in range(mesh.num_devices)):
                return axes, repeat
    return None


def repeat_blocks(term: Term, dim: int, size: int, blocks: int, repeat: int) -> Term:
    """`term`'s first `blocks` blocks of `size` along `dim`, each repeated `repeat` times in
    place: block b of the result is block b // repeat of `term`."""
    shape = term.shape
    if blocks * size != shape[dim]:
        starts = (0,) * len(shape)
        limits = shape[:dim] + (blocks * size,) + shape[dim + 1:]
        term = make_op("slice", (term,), (starts, limits, (1,) * len(shape)), limits,
                       term.dtype, linear_in=0)
    split = shape[:dim] + (blocks, size) + shape[dim + 1:]
    wide = shape[:dim] + (blocks, repeat, size) + shape[dim + 1:]
    dims = tuple(i if i <= dim else i + 1 for i in range(len(split)))
    wide_term = make_broadcast(make_reshape(term, split), dims, wide)
    return make_reshape(wide_term, shape[:dim] + (blocks * repeat * size,) + shape[dim + 1:])


def dynamic_slice(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    x, *starts = operands
    if isinstance(x, Windowed) and ctx.mesh is not None:
        return [window_dynamic_slice(info, x, starts, ctx.mesh, dynamic_slice)]
    if not isinstance(x, Rel):
        return [Opaque("dynamic_slice of a device-dependent scalar", category="unsupported")]
    x = freeze(x)
    sizes = tuple(info.attrs["slice_sizes"])
    if any(isinstance(s, DeviceScalar) for s in starts) and x.term.op == "dense" and all(
            size == 1 for size in sizes) and x.term.attrs[0] in DENSE_VALUES:
        return [_table_lookup(info, x, starts, ctx)]
    local = info.operand_types[0].shape
    count = ctx.mesh.num_devices if ctx.mesh and not ctx.is_global else 1
    tiling = list(x.tiling)
    lo, hi = [0] * len(sizes), list(x.term.shape)
    shape = list(x.term.shape)
    free = [a for a in (ctx.mesh.names if ctx.mesh else ()) if a not in x.used_axes()]
    if any(device_offsets(start, count) is None for start in starts):
        return [_symbolic_dynamic_slice(info, x, starts, sizes)]
    for d, (start, size) in enumerate(zip(starts, sizes)):
        raw = device_offsets(start, count)
        offsets = tuple(min(max(o, 0), local[d] - size) for o in raw)
        if len(set(offsets)) == 1:
            if x.tiling[d] and (offsets[0], size) != (0, local[d]):
                return [Opaque(f"dynamic_slice of dim {d}, which is split over "
                               f"{axes_str(x.tiling[d])}: each device slices its own block",
                               category="layout_mismatch")]
            if not x.tiling[d]:
                lo[d], hi[d] = offsets[0], offsets[0] + size
                shape[d] = size
            continue
        if x.tiling[d]:
            axes, _ = _match_axes(ctx.mesh, offsets, size, free, local[d])
            if axes is None or size * ctx.mesh.group_size(axes) != local[d]:
                return [Opaque(f"dynamic_slice with a device-dependent offset in dim {d}, "
                               f"which is already split over {axes_str(x.tiling[d])}, that "
                               "selects no sub-block of it", category="wrong_offset")]
            free = [a for a in free if a not in axes]
            tiling[d] = x.tiling[d] + axes
            continue
        axes, closest = _match_axes(ctx.mesh, offsets, size, free, x.term.shape[d])
        coarse = None if axes else _match_coarse(ctx.mesh, offsets, size, free,
                                                 x.term.shape[d])
        if axes is None and coarse is None:
            return [_pending_reduction(d, offsets, size, x, ctx)
                    or _wrong_offset(d, offsets, size, closest, ctx)]
        if coarse is not None:
            axes, repeat = coarse
            blocks = ctx.mesh.group_size(axes) // repeat
            x = replace(x, term=repeat_blocks(x.term, d, size, blocks, repeat))
        free = [a for a in free if a not in axes]
        tiling[d] = axes
        lo[d], hi[d] = 0, size * ctx.mesh.group_size(axes)
        shape[d] = hi[d]
    term = x.term
    if tuple(shape) != x.term.shape:
        term = make_op("slice", (x.term,), (tuple(lo), tuple(hi), (1,) * len(lo)), tuple(shape),
                       x.term.dtype, linear_in=0)
    return [replace(x, term=term, tiling=tuple(tiling))]


def _table_lookup(info: OpInfo, x: Rel, starts: list[Value], ctx: RuleContext) -> Value:
    """An integer constant table indexed by device-dependent offsets: a device scalar."""
    table = DENSE_VALUES[x.term.attrs[0]]
    count = ctx.mesh.num_devices
    columns = [device_offsets(s, count) for s in starts]
    if any(c is None for c in columns):
        return Opaque("table lookup with a data-dependent offset", category="unsupported")
    values = []
    for device in range(count):
        index = tuple(min(max(c[device], 0), table.shape[d] - 1) for d, c in enumerate(columns))
        values.append(int(table[index]))
    return DeviceScalar(tuple(values), info.result_types[0].shape)


def _symbolic_dynamic_slice(info: OpInfo, x: Rel, starts: list[Value],
                            sizes: tuple[int, ...]) -> Value:
    """Offsets that are values of the computation (a loop counter, a computed index): the same
    on every device, so the slice is the reference's slice of untiled dims."""
    offsets = []
    for d, (start, size) in enumerate(zip(starts, sizes)):
        if not isinstance(start, Rel) or start.partial or start.tiled_axes:
            return Opaque("dynamic_slice offset differs between devices in a way that is not a "
                          "device table", category="unsupported")
        if x.tiling[d] and size != info.operand_types[0].shape[d]:
            return Opaque(f"dynamic_slice with a computed offset in dim {d}, which is split "
                          f"over {axes_str(x.tiling[d])}", category="layout_mismatch")
        if x.tiling[d]:
            offsets.append(make_splat(0, (), start.term.dtype))
        else:
            offsets.append(start.term)
    shape = tuple(x.term.shape[d] if axes else size
                  for d, (axes, size) in enumerate(zip(x.tiling, sizes)))
    term = intern("dynamic_slice", (x.term, *offsets), (shape,), shape, x.term.dtype)
    return replace(x, term=term)


def _pending_reduction(dim: int, offsets, size: int, x: Rel, ctx: RuleContext
                       ) -> Opaque | None:
    """Offsets that are the blocks of the axes `x` is still a partial sum over: each device
    picks its block of a value the reduction never finished (ZeRO's shard of a gradient that
    was not psum_scatter'd). None where the offsets are no such blocks."""
    if not x.partial:
        return None
    axes, _ = _match_axes(ctx.mesh, offsets, size, list(x.partial), x.term.shape[dim])
    if axes is None:
        return None
    return Opaque(f"dynamic_slice picks each device's block along dim {dim} (offset = {size} "
                  f"* axis_index({axes_str(axes)})) of a value that is still a partial "
                  f"{x.kind} over {axes_str(x.partial)}: missing psum_scatter/psum before it",
                  category="missing_reduction")


def _wrong_offset(dim: int, offsets, size: int, closest, ctx: RuleContext) -> Opaque:
    axes, found = closest
    if axes is None:
        return Opaque(f"dynamic_slice offsets {list(offsets)[:16]} along dim {dim} are no block "
                      "offsets of any mesh axes", category="wrong_offset")
    bad, expected = found
    device = bad[0]
    got, want = offsets[device], expected[device]
    index = [ctx.mesh.block_index(axes, d) for d in range(ctx.mesh.num_devices)]
    name = f"axis_index({axes_str(axes)})"
    formula = _affine(offsets, index, name)
    found_text = f"offset = {formula}" if formula else f"offsets {list(offsets)[:16]}"
    return Opaque(f"device-dependent offset is wrong along dim {dim}: device {device} reads "
                  f"[{got}, {got + size}) instead of its own block [{want}, {want + size}); "
                  f"found {found_text}, expected offset = {size} * {name}",
                  category="wrong_offset")


def _affine(values, index, name: str) -> str:
    """`a * name + b` when values[d] == a * index[d] + b for every device, else ''."""
    points = {}
    for v, i in zip(values, index):
        if points.setdefault(i, v) != v:
            return ""
    if len(points) < 2:
        return ""
    (i0, v0), (i1, v1) = sorted(points.items())[:2]
    if (v1 - v0) % (i1 - i0):
        return ""
    a = (v1 - v0) // (i1 - i0)
    b = v0 - a * i0
    if any(v != a * i + b for i, v in points.items()):
        return ""
    text = name if a == 1 else f"{a} * {name}"
    return text + (f" + {b}" if b > 0 else f" - {-b}" if b < 0 else "")


INDEX_RULES = {
    "stablehlo.partition_id": partition_id,
    "stablehlo.replica_id": partition_id,
    "stablehlo.dynamic_slice": dynamic_slice,
}
