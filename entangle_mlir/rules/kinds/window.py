"""Halo windows: the rows of a split dim that XLA's roll, shift, pad, slicing and cumsum
partitioning move between devices, and the micro-batches of a local batch (`Windowed`).

* A slice of the local block along a split dim is a window at an offset from the device's own
  block; a collective_permute moves it (a cyclic shift moves the offset; any other routing
  gives each device the start of the device it receives from); devices that receive nothing
  hold zeros (`holes`); concatenating consecutive windows joins them; a select on the device
  id picks each device's window; a window as long as a block is the global tensor rolled
  (`jnp.roll` lowers to slices and a concatenate, so the reference computes the same term).
* Zero-extended windows: a zero pad adds zero rows; reads whose zeros are exactly the rows
  outside the tensor are a block of the zero-padded tensor (`zero_extended_read`); a pad of a
  dim that is not split is the padded tensor as a window, which a dynamic_slice may read in
  overlapping windows (cumsum) that a reduce_window then reduces to a block.
* Elementwise ops and reduces over other dims keep a window; a sum over the window's dim is a
  summed window, and sums of complementary windows add up to the block's partial sum.
* Micro-batches (gradient accumulation): every op that computes each row of the window's dim
  from the same rows keeps the window (`window_rowwise`); a matmul contracting it sums its
  rows; summed windows go through moves, zero pads and replicated scalings (`summed_move`),
  and complementary ones complete in the reference's form (`sum_out`). A division by a
  micro-batch's own total is the per-micro-batch mean (`_per_window_mean`).

Every construct is a claim about each device's local value that the Z3 instance layer checks
(instance.local_values._window_rows). Only the ops above accept a window (and collective_permute a
`Permuted` value); `settle` turns either into the error it stands for when anything else uses
it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction

from entangle_mlir.core.mesh import Mesh, axes_str
from entangle_mlir.core.relations import (
    Opaque,
    Permuted,
    Rel,
    Shifted,
    Value,
    Windowed,
    is_padded,
    padded_rel,
    zero_pad,
)
from entangle_mlir.core.terms import (
    Term,
    indicator,
    intern,
    make_add,
    make_broadcast,
    make_div,
    make_dot,
    make_mul,
    make_op,
    make_reshape,
    make_roll,
    make_splat,
    make_transpose,
    map_linear,
    pretty,
    scale,
    single_scaled,
    splat_value,
    term_finite,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.rules.base import Rule, RuleContext
from entangle_mlir.rules.common import device_offsets, freeze, resize, sum_term

WINDOW_OPS = frozenset({"stablehlo.slice", "stablehlo.concatenate",
                        "stablehlo.collective_permute", "stablehlo.dynamic_slice",
                        "stablehlo.pad", "stablehlo.reduce_window"})
PERMUTED_OPS = frozenset({"stablehlo.collective_permute"})


ENTRY_OPS = frozenset({"stablehlo.dot_general"})
"""Ops besides `SUMMED_OPS` and elementwise ones that accept an entry (`is_entry`)."""


def is_entry(value: Value) -> bool:
    """One entry of each device's block (a window of one row summed over that row alone: the
    row, its dim dropped; rules/kinds/entries.py)."""
    return (isinstance(value, Windowed) and value.length == 1 and value.summed == (value.dim,)
            and not value.holes and not value.starts and not value.rel.partial
            and not is_padded(value))


def settle(value: Value, op_name: str = "") -> Value:
    """What an op sees: a `Permuted` or `Windowed` value is kept only for the ops that can
    complete it; for any other it is the error it stands for, at the op that made it. A
    zero-padded value (`padded_window`) is a window for dynamic_slice only, and its padded
    relation for every other op."""
    if isinstance(value, Permuted) and op_name not in PERMUTED_OPS:
        return Opaque(value.reason, origin=value.origin, category="wrong_order")
    if isinstance(value, Windowed) and is_padded(value) and op_name != "stablehlo.dynamic_slice":
        return padded_rel(value)
    if isinstance(value, Windowed) and value.summed and op_name not in SUMMED_OPS and (
            op_name not in ELEMENTWISE_OPS) and not (is_entry(value) and op_name in ENTRY_OPS):
        return Opaque(value.reason, origin=value.origin, category="layout_mismatch")
    if isinstance(value, Windowed) and op_name not in WINDOW_OPS | ROWWISE_OPS and not (
            op_name == "stablehlo.reduce" or op_name in ELEMENTWISE_OPS):
        return Opaque(value.reason, origin=value.origin, category="layout_mismatch")
    return value


def padded_window(x: Rel, dim: int, low: int, high: int, mesh: Mesh) -> Windowed:
    """`x` (not split along `dim`) zero-padded by `low` and `high` rows along `dim`, as a window
    of x's rows [-low, N + high) with the rows outside x zeros on every device. Padding is
    where XLA starts a cumsum of a split dim (all_gather, pad, then each device reads an
    overlapping window at its own offset: `window_dynamic_slice`); every other op sees the
    padded relation (`settle`)."""
    total = x.term.shape[dim]
    every = range(mesh.num_devices)
    holes = [(d, 0, low) for d in every if low]
    holes += [(d, low + total, low + total + high) for d in every if high]
    return Windowed(x, dim, -low, total + low + high, f"zero padding of dim {dim}",
                    holes=tuple(holes))


def block_rows(rel: Rel, dim: int, mesh: Mesh) -> int:
    return rel.term.shape[dim] // mesh.group_size(rel.tiling[dim])


def make_window(rel: Rel, dim: int, offset: int, length: int, mesh: Mesh, reason: str,
                holes: tuple = (), starts: tuple = ()) -> Value:
    """The window, or a Rel when it is a whole block without zeros: `rel` itself at offset 0,
    else `rel` rolled so that each device's block starts `offset` rows later. Per-device
    `starts` one offset from every device's block (devices holding only zeros aside) are that
    offset; without zeros, starts c + length * b (b the block index over `rel`'s axes of the
    dim) are a block of the rows [c, c + length * |axes|)."""
    size = rel.term.shape[dim]
    if starts:
        block = block_rows(rel, dim, mesh)
        axes = rel.tiling[dim]
        zero = _all_zero_devices(holes, length)
        offsets = {(s - mesh.block_index(axes, d) * block) % size
                   for d, s in enumerate(starts) if d not in zero}
        if len(offsets) <= 1:
            offset, starts = (offsets.pop() if offsets else 0), ()
        elif not holes:
            wrapped = [s % size for s in starts]
            base = _blocked(wrapped, 0, length, axes, mesh)
            if base is not None and base + length * mesh.group_size(axes) <= size:
                return _rows_block(rel, dim, rel.term, base, length, axes, mesh)
        if starts:
            return Windowed(rel, dim, 0, length, reason, holes=tuple(sorted(set(holes))),
                            starts=tuple(starts))
    offset %= size
    if length == block_rows(rel, dim, mesh) and not holes:
        return replace(rel, term=make_roll(rel.term, dim, -offset)) if offset else rel
    return Windowed(rel, dim, offset, length, reason, holes=tuple(sorted(set(holes))))


def _all_zero_devices(holes, length: int) -> set[int]:
    """Devices whose window rows are all zeros."""
    rows: dict[int, set[int]] = {}
    for d, a, b in holes:
        rows.setdefault(d, set()).update(range(a, b))
    return {d for d, r in rows.items() if len(r) >= length}


def first_rows(window: Windowed, mesh: Mesh) -> list[int]:
    """Per device, the (unwrapped) row of the window's tensor its window starts at."""
    if window.starts:
        return list(window.starts)
    axes = window.rel.tiling[window.dim]
    block = block_rows(window.rel, window.dim, mesh)
    return [mesh.block_index(axes, d) * block + window.offset for d in range(mesh.num_devices)]


def as_window(x: Value, dim: int, mesh: Mesh) -> Windowed | None:
    """`x` as a window along `dim`: a window itself, or a Rel split (not partial) along `dim`
    seen as the window of its own block."""
    if isinstance(x, Windowed):
        return x if x.dim == dim else None
    if isinstance(x, Rel) and x.tiling[dim] and not x.partial and not x.poly:
        return Windowed(x, dim, 0, block_rows(x, dim, mesh))
    return None


def slice_window(x: Value, starts, limits, strides, local_shape, mesh: Mesh) -> Value | None:
    """A unit-stride slice along one split dim (every other dim whole): a window; None when the
    slice is not of that form (the slice rule decides)."""
    cut = [d for d in range(len(starts)) if (starts[d], limits[d]) != (0, local_shape[d])]
    if len(cut) != 1 or any(s != 1 for s in strides):
        return None
    (dim,) = cut
    window = as_window(x, dim, mesh)
    if window is None or window.rel.partial:
        return None
    axes = window.rel.tiling[dim]
    start, stop = starts[dim], limits[dim]
    holes = tuple((d, max(a, start) - start, min(b, stop) - start) for d, a, b in window.holes
                  if a < stop and start < b)
    reason = window.reason if holes else (
        f"slice of dim {dim}, which is split over {axes_str(axes)}: each device slices its own "
        "block, not the global tensor")
    return make_window(window.rel, dim, window.offset + start, stop - start, mesh, reason,
                       holes, tuple(s + start for s in window.starts))


def concat_windows(operands: list[Value], dim: int, mesh: Mesh) -> Value | None:
    """Consecutive windows of the same value joined along their dim; None when the operands
    are not all windows (or blocks) of one value."""
    windows = [as_window(x, dim, mesh) for x in operands]
    if any(w is None for w in windows) or not any(isinstance(x, Windowed) for x in operands):
        return None
    if any(w.starts for w in windows):
        return Opaque(f"concatenate along dim {dim} of halo windows routed per device (not "
                      "supported)", category="unsupported")
    first = windows[0]
    size = first.rel.term.shape[dim]
    length = 0
    holes: list[tuple[int, int, int]] = []
    for w in windows:
        if w.rel != first.rel or w.offset % size != (first.offset + length) % size:
            return _misplaced(windows, dim, size, block_rows(first.rel, dim, mesh))
        holes.extend((d, a + length, b + length) for d, a, b in w.holes)
        length += w.length
    reason = next((w.reason for w in windows if w.holes), None) or (
        f"concatenate along dim {dim} builds rows "
        f"{_rows(first.offset, length, size, block_rows(first.rel, dim, mesh))} around each "
        "device's block b: not a block of any global tensor")
    return make_window(first.rel, dim, first.offset, length, mesh, reason, tuple(holes))


def _misplaced(windows: list[Windowed], dim: int, size: int, block: int) -> Opaque:
    """Windows that do not line up: blamed on the one a collective_permute delivered (the halo
    came from the wrong neighbour), else on the concatenate."""
    for j, w in enumerate(windows):
        record = w.origin[0] if isinstance(w.origin, tuple) else None
        if getattr(getattr(record, "info", None), "name", "") != "stablehlo.collective_permute":
            continue
        if j + 1 < len(windows):
            want = windows[j + 1].offset - w.length
        elif j > 0:
            want = windows[j - 1].offset + windows[j - 1].length
        else:
            continue
        if w.rel == windows[0].rel and (want - w.offset) % size:
            return Opaque(f"collective_permute delivers rows {_rows(w.offset, w.length, size, block)}"
                          f" of dim {dim} to the device with block b, but the concatenate needs "
                          f"rows {_rows(want, w.length, size, block)}: the halo comes from the "
                          "wrong neighbour", origin=w.origin, category="wrong_order")
    return Opaque(f"concatenate along dim {dim} of rows that are not consecutive in the global "
                  "tensor (halo windows out of order or of different values)",
                  category="wrong_order")


def _rows(offset: int, length: int, size: int, block: int) -> str:
    """'[4b-1, 4b)': rows of a window relative to the device's block index b."""
    offset %= size
    if offset > size // 2:
        offset -= size
    return f"[{block}b{offset:+d}, {block}b{offset + length:+d})".replace("+0)", ")").replace(
        "+0,", ",")


def cyclic_shifts(rel: Rel, moved_from: dict[int, int], mesh: Mesh) -> list[int] | None:
    """Per dim, how far (in rows) the blocks of the devices that receive data moved, when that
    is one cyclic shift of every split dim; else None."""
    shifts = []
    for dim, axes in enumerate(rel.tiling):
        if not axes:
            shifts.append(0)
            continue
        count = mesh.group_size(axes)
        moved = {(mesh.block_index(axes, t) - mesh.block_index(axes, s)) % count
                 for t, s in moved_from.items()}
        if len(moved) > 1:
            return None
        shifts.append(moved.pop() * (rel.term.shape[dim] // count) if moved else 0)
    return shifts


def permute_window(window: Windowed, moved_from: dict[int, int], mesh: Mesh,
                   moved: str) -> Value:
    """A window moved by a cyclic block shift; devices that receive nothing hold zeros. Moves
    by different amounts (point-to-point routing) give each device the rows of the device it
    receives from (per-device starts), when no other split dim moves."""
    shifts = cyclic_shifts(window.rel, moved_from, mesh)
    if shifts is None or window.starts:
        return _route_window(window, moved_from, mesh, moved)
    term = window.rel.term
    for dim, shift in enumerate(shifts):
        if dim != window.dim:
            term = make_roll(term, dim, shift)
    rel = replace(window.rel, term=term) if term is not window.rel.term else window.rel
    holes, reason = _moved_holes(window, moved_from, mesh)
    return make_window(rel, window.dim, window.offset - shifts[window.dim], window.length, mesh,
                       reason, holes)


def _moved_holes(window: Windowed, moved_from: dict[int, int],
                 mesh: Mesh) -> tuple[tuple, str]:
    """The zero rows of a window after a collective_permute (device t holds device
    `moved_from[t]`'s rows; devices that receive nothing hold zeros), and the reason to give
    when zeros appear where the window had none."""
    missing = sorted(set(range(mesh.num_devices)) - set(moved_from))
    holes = [(t, a, b) for t, s in moved_from.items() for d, a, b in window.holes if d == s]
    holes += [(t, 0, window.length) for t in missing]
    reason = window.reason
    if missing:
        reason = (f"collective_permute leaves devices {missing[:8]} without data (they receive "
                  "zeros)")
    return tuple(holes), reason


def _route_window(window: Windowed, moved_from: dict[int, int], mesh: Mesh,
                  moved: str) -> Value:
    """A window moved between devices in any order along its dim's axes: device t holds the
    rows device `moved_from[t]` held (zeros where it held zeros, and on devices that receive
    nothing). Refused when the blocks of another split dim move."""
    for dim, axes in enumerate(window.rel.tiling):
        if dim != window.dim and axes and any(
                mesh.block_index(axes, t) != mesh.block_index(axes, s)
                for t, s in moved_from.items()):
            return Opaque(f"{moved}: the halo rows reach devices in no cyclic order",
                          category="wrong_order")
    source = first_rows(window, mesh)
    starts = [source[moved_from.get(t, t)] for t in range(mesh.num_devices)]
    holes, reason = _moved_holes(window, moved_from, mesh)
    return make_window(window.rel, window.dim, 0, window.length, mesh, reason, holes,
                       tuple(starts))


def window_select(pred: Shifted, on_true: Value, on_false: Value, mesh: Mesh) -> Value | None:
    """select on a device predicate (`broadcast(partition_id == k)`) between two windows of one
    tensor along one dim (or a window and a block): each device holds the rows of the branch
    it takes (XLA picks, per device, the rows a point-to-point permute delivered). None when
    the operands are not of that form."""
    if pred.rel.term.op != "splat" or splat_value(pred.rel.term) != 0:
        return None
    dim = next((v.dim for v in (on_true, on_false) if isinstance(v, Windowed)), None)
    a, b = (as_window(v, dim, mesh) for v in (on_true, on_false))
    if a is None or b is None or a.rel != b.rel or a.length != b.length or a.summed or b.summed:
        return None
    keep = [bool(o) for o in pred.offsets]
    rows = (first_rows(a, mesh), first_rows(b, mesh))
    starts = tuple(rows[0][d] if keep[d] else rows[1][d] for d in range(mesh.num_devices))
    holes = tuple((d, lo, hi) for d, lo, hi in a.holes if keep[d]) + tuple(
        (d, lo, hi) for d, lo, hi in b.holes if not keep[d])
    return make_window(a.rel, dim, 0, a.length, mesh, _routed_reason(a, starts, holes, mesh),
                       holes, starts)


def _routed_reason(window: Windowed, starts: tuple[int, ...], holes: tuple, mesh: Mesh) -> str:
    """Why rows picked per device are no block: the device whose rows are off the block
    layout most devices follow (rows routed from the wrong device), or zeros some device
    holds."""
    dim, length, rel = window.dim, window.length, window.rel
    size = rel.term.shape[dim]
    axes = rel.tiling[dim]
    if holes:
        devices = sorted({d for d, _, _ in holes})
        return (f"select leaves devices {devices[:8]} with zero rows of dim {dim} (a "
                "collective_permute sent them nothing)")
    bases = [(s - length * mesh.block_index(axes, d)) % size for d, s in enumerate(starts)]
    base = max(set(bases), key=bases.count)
    bad = next((d for d in range(len(starts)) if bases[d] != base), 0)
    want = base + length * mesh.block_index(axes, bad)
    got = starts[bad] % size
    return (f"select gives device {bad} rows [{got}, {got + length}) of dim {dim} where the "
            f"other devices' rows put [{want}, {want + length}): rows routed from the wrong "
            "device")


def window_dynamic_slice(info, window: Windowed, starts: list[Value], mesh: Mesh,
                         plain: Rule) -> Value:
    """Each device reads rows of its window at its own offset (XLA's slicing of a split dim):
    a block layout again when device b's rows start at c + size * b, none of them zeros; or,
    when the rows it reads are zeros exactly where they fall outside the global tensor (the
    zeros of a pad and of a halo nobody sent), a block of the global tensor zero-padded
    (`jnp.pad` of a split dim: `zero_extended_read`). `plain` is the ordinary dynamic_slice
    rule (a zero-padded value is read through it first: `_padded_dynamic_slice`)."""
    if is_padded(window):
        return _padded_dynamic_slice(info, window, starts, mesh, plain)
    dim, sizes = window.dim, tuple(info.attrs["slice_sizes"])
    local = info.operand_types[0].shape
    count = mesh.num_devices
    table = [device_offsets(start, count) for start in starts]
    for d, (offsets, size) in enumerate(zip(table, sizes)):
        if d != dim and (offsets is None or size != local[d]):
            return Opaque(window.reason, category="layout_mismatch")
    if table[dim] is None:
        return Opaque("dynamic_slice of a halo window at a data-dependent offset",
                      category="unsupported")
    size = sizes[dim]
    reads = [min(max(o, 0), local[dim] - size) for o in table[dim]]
    for device, a, b in window.holes:
        if a < reads[device] + size and reads[device] < b:
            padded = zero_extended_read(window, reads, size, mesh)
            if isinstance(padded, Rel):
                return padded
            if padded is not None:
                return Opaque(f"dynamic_slice along dim {dim}: {padded}",
                              category="wrong_offset")
            return Opaque(f"dynamic_slice along dim {dim}: device {device} reads rows "
                          f"[{reads[device]}, {reads[device] + size}) of its window, which "
                          f"hold zeros ({window.reason})", category="wrong_offset")
    axes = window.rel.tiling[dim]
    total = window.rel.term.shape[dim]
    rows = first_rows(window, mesh)
    first = [(rows[d] + reads[d]) % total for d in range(count)]
    base = min(first)
    expected = [base + size * mesh.block_index(axes, d) for d in range(count)]
    blocks = size * mesh.group_size(axes)
    if first != expected or base + blocks > total:
        bad = next((d for d in range(count) if first[d] != expected[d]), 0)
        return Opaque(f"device-dependent offset is wrong along dim {dim}: device {bad} reads "
                      f"global rows [{first[bad]}, {first[bad] + size}) instead of "
                      f"[{expected[bad]}, {expected[bad] + size}) (offsets into its window "
                      f"{reads[:16]})", category="wrong_offset")
    return _rows_block(window.rel, dim, window.rel.term, base, size, axes, mesh)


def _padded_dynamic_slice(info, window: Windowed, starts: list[Value], mesh: Mesh,
                          rule: Rule) -> Value:
    """A dynamic_slice of a zero-padded value: what the dynamic_slice rule (`rule`) makes of
    the padded relation; when that is no layout, a window per device, longer than the stride
    of its device-dependent offsets (XLA's cumsum of a split dim: device b reads rows
    [c + s*b, c + s*b + L) with s*|A| = N, A the mesh axes its offsets step over). That window
    is rows c - low + s*b + [0, L) of x split over A (block s), zeros where they fall outside
    x: exactly the padded tensor's rows, so every later use is checked as a window."""
    plain = rule(info, [padded_rel(window), *starts], RuleContext(mesh, tuple(mesh.names)))[0]
    dim, rel = window.dim, window.rel
    sizes = tuple(info.attrs["slice_sizes"])
    local = info.operand_types[0].shape
    count = mesh.num_devices
    table = [device_offsets(start, count) for start in starts]
    if not isinstance(plain, Opaque) or any(t is None for t in table) or any(
            d != dim and (set(t) != {0} or sizes[d] != local[d]) for d, t in enumerate(table)):
        return plain
    size = sizes[dim]
    reads = [min(max(o, 0), local[dim] - size) for o in table[dim]]
    total = rel.term.shape[dim]
    free = [a for a in mesh.names if a not in rel.used_axes()]
    for axes in _axis_orders(free):
        if total % mesh.group_size(axes):
            continue
        stride = total // mesh.group_size(axes)
        base = _blocked(reads, 0, stride, axes, mesh)
        if base is None:
            continue
        holes = tuple((d, max(a - reads[d], 0), min(b - reads[d], size))
                      for d, a, b in window.holes if a < reads[d] + size and reads[d] < b)
        tiled = replace(rel, tiling=tuple(axes if d == dim else t
                                          for d, t in enumerate(rel.tiling)))
        reason = (f"dynamic_slice of dim {dim} reads {size} rows every {stride} rows: "
                  "overlapping windows, not a block of any global tensor")
        return make_window(tiled, dim, window.offset + base, size, mesh, reason, holes)
    return plain


def _axis_orders(free: list[str]):
    """Every ordering of every non-empty subset of `free` mesh axes, fewest first."""
    for count in range(1, len(free) + 1):
        yield from itertools.permutations(free, count)


def _rows_block(rel: Rel, dim: int, term: Term, base: int, size: int, axes: tuple[str, ...],
                mesh: Mesh) -> Rel:
    """`rel` with `term`'s rows [base, base + size * |axes|) along `dim`, split over `axes`."""
    blocks = size * mesh.group_size(axes)
    tiling = tuple(axes if d == dim else t for d, t in enumerate(rel.tiling))
    if (base, blocks) == (0, term.shape[dim]):
        return replace(rel, term=term, tiling=tiling)
    rank = len(term.shape)
    shape = tuple(blocks if d == dim else term.shape[d] for d in range(rank))
    sliced = make_op("slice", (term,), (
        tuple(base if d == dim else 0 for d in range(rank)),
        tuple(base + blocks if d == dim else term.shape[d] for d in range(rank)),
        (1,) * rank), shape, term.dtype, linear_in=0)
    return replace(rel, term=sliced, tiling=tiling)


def extended_starts(window: Windowed, reads: list[int], size: int, mesh: Mesh
                    ) -> list[int] | str:
    """Per device d, the position p_d in the window's tensor extended by zeros on both ends of
    its dim such that local rows [reads[d], reads[d] + size) of the window are the extended
    tensor's rows [p_d, p_d + size): each row outside [0, N) one of the window's zero rows,
    each row inside not. Else what the closest such reading gets wrong (a device reading rows
    that wrapped around where the padded tensor has zeros, or zeros where it has rows).

    Sound by construction: local row j of device d holds row (b*B + offset + j) mod N of the
    tensor unless it is a zero row; p_d is one of the unwrapped positions of that row
    (offset + k*N), kept only if every read row agrees with it."""
    dim, rel = window.dim, window.rel
    total = rel.term.shape[dim]
    rows = first_rows(window, mesh)
    zeros: dict[int, set[int]] = {}
    for device, a, b in window.holes:
        zeros.setdefault(device, set()).update(range(a, b))
    starts = []
    for d in range(mesh.num_devices):
        wrapped = (rows[d] + reads[d]) % total
        best: tuple[int, int, int] | None = None
        for k in range(-(size // total) - 1, 2):
            p = wrapped + k * total
            wrong = [i for i in range(size)
                     if (0 <= p + i < total) == (reads[d] + i in zeros.get(d, ()))]
            if best is None or len(wrong) < best[0]:
                best = (len(wrong), p, wrong[0] if wrong else -1)
        assert best is not None
        count, p, i = best
        if count:
            row = p + i
            if 0 <= row < total:
                return (f"device {d} reads zeros at row {row} of the global tensor (local row "
                        f"{reads[d] + i} of its window): a halo row nobody sent")
            return (f"device {d} reads row {row % total} of the global tensor at row {row}, "
                    f"outside it, where zero padding belongs (local row {reads[d] + i} of its "
                    "window: a halo that wrapped around the ends)")
        starts.append(p)
    return starts


def _extension(starts: list[int], size: int, total: int) -> tuple[int, int]:
    """(low, high): the zero rows before row 0 and after row N that reads of `size` rows at
    `starts` (positions in the tensor extended by zeros) cover."""
    return max(0, -min(starts)), max(0, max(starts) + size - total)


def _blocked(starts: list[int], low: int, stride: int, axes: tuple[str, ...], mesh: Mesh
             ) -> int | None:
    """base when starts[d] + low == base + stride * b for the block index b over `axes`."""
    base = min(starts) + low
    if any(starts[d] + low != base + stride * mesh.block_index(axes, d)
           for d in range(mesh.num_devices)):
        return None
    return base


def zero_extended_read(window: Windowed, reads: list[int], size: int, mesh: Mesh
                       ) -> Rel | str | None:
    """Device d reads local rows [reads[d], reads[d] + size) of `window`: a block of the
    global tensor zero-padded along the window's dim, when those rows are the consecutive rows
    [p_d, p_d + size) of the tensor extended by zeros (`extended_starts`) and p_d + lo =
    base + size * b for the window's split axes (lo: the zeros before row 0). XLA's `jnp.pad`
    of a split dim reads, at its ends, the zeros a non-cyclic halo exchange and a pad left.
    What a device reads wrong (a message), or None when the rows are right but form no block
    of the padded tensor."""
    dim, rel = window.dim, window.rel
    axes = rel.tiling[dim]
    total = rel.term.shape[dim]
    starts = extended_starts(window, reads, size, mesh)
    if isinstance(starts, str):
        return starts
    low, high = _extension(starts, size, total)
    base = _blocked(starts, low, size, axes, mesh)
    if base is None or base + size * mesh.group_size(axes) > total + low + high:
        return None
    return _rows_block(rel, dim, zero_pad(rel.term, dim, low, high), base, size, axes, mesh)


def pad_window(window: Windowed, low: int, high: int, mesh: Mesh) -> Value:
    """Zero padding of a window along its dim: the window extended by `low` rows before and
    `high` after, zeros on every device (the rows themselves stay the global tensor's: a pad
    adds zero rows, which only a read of exactly the rows outside the tensor may use)."""
    every = range(mesh.num_devices)
    holes = [(d, a + low, b + low) for d, a, b in window.holes]
    holes += [(d, 0, low) for d in every if low]
    holes += [(d, low + window.length, low + window.length + high) for d in every if high]
    reason = (f"pad of dim {window.dim} adds zeros around the halo window of each device's "
              "block: not a block of any global tensor")
    return make_window(window.rel, window.dim, window.offset - low,
                       window.length + low + high, mesh, reason, tuple(holes),
                       tuple(s - low for s in window.starts))


def reduce_window_of_window(info, window: Windowed, init: Rel, reducer: str,
                            attrs: tuple[tuple[int, ...], ...], mesh: Mesh) -> Value:
    """A reduce_window whose window runs along the dim of a zero-extended window (XLA's cumsum
    of a split dim: each device reduces L = s + W - 1 rows, the W - 1 before its block
    included): when device b's rows are the tensor's rows [p_b, p_b + L) extended by zeros
    (`extended_starts`), its results are rows [p_b + lo, p_b + lo + L - W + 1) of the same
    reduce_window of the tensor zero-padded by (lo, hi); a block of it when those start at
    base + (L - W + 1) * b. A sum folds the zeros into the window padding (its identity);
    other reducers keep the explicit zero pad. The window along `dim` must have stride and
    dilations 1 and no padding of its own; other dims follow the plain rule (a split dim
    must have the trivial window)."""
    window_dims, strides, base_dil, dilation, low, high = attrs
    dim, rel = window.dim, window.rel
    if (strides[dim], base_dil[dim], dilation[dim], low[dim], high[dim]) != (1, 1, 1, 0, 0):
        return Opaque(window.reason, origin=window.origin, category="layout_mismatch")
    for d, axes in enumerate(rel.tiling):
        if d != dim and axes and (window_dims[d], strides[d], base_dil[d], dilation[d], low[d],
                                  high[d]) != (1, 1, 1, 1, 0, 0):
            return Opaque(f"reduce_window with a window along dim {d}, which is split over "
                          f"{axes_str(axes)}", category="layout_mismatch")
    length = window.length
    out = length - window_dims[dim] + 1
    starts = extended_starts(window, [0] * mesh.num_devices, length, mesh)
    if isinstance(starts, str):
        return Opaque(f"reduce_window along dim {dim}: {starts}", category="wrong_offset")
    total = rel.term.shape[dim]
    pad_low, pad_high = _extension(starts, length, total)
    axes = rel.tiling[dim]
    base = _blocked(starts, pad_low, out, axes, mesh)
    reduced = total + pad_low + pad_high - window_dims[dim] + 1
    if base is None or out < 1 or base + out * mesh.group_size(axes) > reduced:
        return Opaque(f"reduce_window along dim {dim} of windows whose results are no block "
                      "of any global tensor", category="layout_mismatch")
    local = info.result_types[0].shape
    shape = tuple(reduced if d == dim else rel.term.shape[d] if rel.tiling[d] else local[d]
                  for d in range(len(local)))
    dtype = info.result_types[0].dtype
    if reducer == "add":
        lows = tuple(pad_low if d == dim else n for d, n in enumerate(low))
        highs = tuple(pad_high if d == dim else n for d, n in enumerate(high))
        term = make_op("reduce_window_sum", (rel.term,),
                       (window_dims, strides, base_dil, dilation, lows, highs), shape, dtype,
                       linear_in=0)
    else:
        term = intern(f"reduce_window_{reducer}", (zero_pad(rel.term, dim, pad_low, pad_high),),
                      attrs, shape, dtype)
    return _rows_block(rel, dim, term, base, out, axes, mesh)


def window_elementwise(info, operands: list[Value], ctx: RuleContext, plain) -> Value:
    """An elementwise op on windows (micro-batches: `tanh(x[:half])` of a split x). Taking rows
    commutes with elementwise ops, so windows of one geometry (same rows on every device, no
    zero rows, nothing summed) combined with splat constants are the same window of the op
    applied to the windows' tensors (`plain`: the ordinary rule on their relations). Sums of
    windows (`window_reduce`) add up when their rows are consecutive, and a sum over a whole
    block is a partial sum (`add_window_sums`); they scale by constants. Anything else is the
    error the first window stands for."""
    windows = [v for v in operands if isinstance(v, Windowed)]
    first = windows[0]
    refused = Opaque(first.reason, origin=first.origin, category="layout_mismatch")
    if (info.name == "stablehlo.select" and isinstance(operands[0], Shifted)
            and ctx.mesh is not None):
        return window_select(operands[0], operands[1], operands[2], ctx.mesh) or refused
    others = [v for v in operands if not isinstance(v, Windowed)]
    if ctx.mesh is None or any(not isinstance(v, Rel) or v.partial for v in others):
        return refused
    if any(w.summed for w in windows):
        return _scaled_sum(info, operands, ctx) or refused
    size = first.rel.term.shape[first.dim]
    geometry = {(w.dim, tuple(s % size for s in first_rows(w, ctx.mesh)), w.length,
                 w.rel.tiling, w.rel.partial, w.rel.scope) for w in windows}
    if len(geometry) != 1 or any(w.holes for w in windows) or first.rel.partial:
        return refused
    inner = [v.rel if isinstance(v, Windowed) else _along_window(v, first) for v in operands]
    if any(v is None for v in inner):
        return refused
    (out,) = plain(info, inner, ctx)
    if not isinstance(out, Rel) or out.partial or out.poly or out.tiling != first.rel.tiling:
        return refused
    return replace(first, rel=out)


def _along_window(value: Rel, window: Windowed) -> Rel | None:
    """A value combined with a window, as a relation on the window's tensor: a splat takes its
    shape and layout; a value the same along the window's dim and not split there (a
    broadcast per-row statistic) takes the tensor's size along it (every row of it is the
    value's row, so the window's rows of it are the value); else None."""
    shape, tiling, dim = window.rel.term.shape, window.rel.tiling, window.dim
    if value.term.op == "splat":
        return replace(value, term=make_splat(splat_value(value.term), shape, value.term.dtype),
                       tiling=tiling, poly=frozenset())
    if value.tiling[dim] or len(value.term.shape) != len(shape):
        return None
    resized = resize(value.term, dim, shape[dim])
    if resized is None:
        return None
    return replace(value, term=resized, poly=value.poly - {dim},
                   tiling=tuple(tiling[d] if d == dim else t for d, t in enumerate(value.tiling)))


def window_reduce(info, window: Windowed, init: Rel, reducer: str, ctx: RuleContext,
                  plain) -> Value:
    """A reduce of a window. Over other dims only: the same rows of the reduced tensor
    (`plain`: the ordinary rule on the window's relation; an RMSNorm's statistic of a
    micro-batch). Over dims that include the window's dim: each device sums its window's rows
    (a summed window, `Windowed.summed`); only sums with init 0, over dims that are not split
    apart from the window's. Windows with zero rows are refused."""
    refused = Opaque(window.reason, origin=window.origin, category="layout_mismatch")
    dims = tuple(sorted(info.attrs["dimensions"]))
    rel = window.rel
    if window.summed and not (window.holes or window.starts or rel.partial):
        kept = [d for d in range(len(rel.term.shape)) if d not in window.summed]
        more = [kept[d] for d in dims]
        if reducer == "add" and splat_value(init.term) == 0 and not any(
                rel.tiling[d] for d in more):
            return replace(window, summed=tuple(sorted((*window.summed, *more))))
        return refused
    if window.summed or window.holes or rel.partial or ctx.mesh is None:
        return refused
    if window.dim not in dims:
        (out,) = plain(info, [rel, init], ctx)
        dim = window.dim - sum(1 for d in dims if d < window.dim)
        if not isinstance(out, Rel) or out.partial or out.tiling[dim] != rel.tiling[window.dim]:
            return refused
        return replace(window, rel=out, dim=dim)
    mesh = ctx.mesh
    if (reducer != "add" or splat_value(init.term) != 0 or window.starts
            or any(rel.tiling[d] for d in dims if d != window.dim)):
        return refused
    return replace(window, summed=dims, reason=_sum_reason(window, mesh), origin=None)


def _sum_reason(window: Windowed, mesh: Mesh) -> str:
    rel, dim = window.rel, window.dim
    rows = _rows(window.offset, window.length, rel.term.shape[dim], block_rows(rel, dim, mesh))
    return (f"sum over rows {rows} of dim {dim}, which is split over "
            f"{axes_str(rel.tiling[dim])}, only: part of each device's block (the sum of the "
            "other rows is never added)")


def add_window_sums(a: Windowed, b: Windowed, info, mesh: Mesh,
                    reference: frozenset[int] | set[int] | None = None) -> Value | None:
    """Sums of two windows of one tensor over the same dims whose rows are consecutive: the sum
    over the joined rows; over a whole block, the block's sum: a partial sum over the axes
    splitting the window's dim (as a reduce over that dim makes). None when they do not join."""
    if a.dim != b.dim or a.summed != b.summed or a.holes or b.holes or a.starts or b.starts:
        return None
    if a.rel != b.rel:
        same_rows = (a.offset, a.length) == (b.offset, b.length) and replace(
            a.rel, term=b.rel.term) == b.rel and a.rel.term.shape == b.rel.term.shape
        if not same_rows or a.rel.partial:
            return None
        return replace(a, rel=replace(a.rel, term=make_add(a.rel.term, b.rel.term)),
                       origin=None)
    size = a.rel.term.shape[a.dim]
    if (a.offset + a.length - b.offset) % size == 0:
        offset = a.offset
    elif (b.offset + b.length - a.offset) % size == 0:
        offset = b.offset
    else:
        return None
    length = a.length + b.length
    block = block_rows(a.rel, a.dim, mesh)
    if length != block:
        joined = replace(a, offset=offset, length=length, origin=None)
        return replace(joined, reason=_sum_reason(joined, mesh))
    whole = make_window(a.rel, a.dim, offset, length, mesh, a.reason)
    if not isinstance(whole, Rel):
        return None
    dims = a.summed
    summed = sum_out(whole.term, dims, info.result_types[0].dtype, reference)
    order = mesh.names
    partial = tuple(sorted(set(whole.tiling[a.dim]), key=order.index))
    return Rel(summed, tuple(t for d, t in enumerate(whole.tiling) if d not in dims), partial,
               "sum", frozenset(), whole.scope, partial_origin=info)


def _scaled_sum(info, operands: list[Value], ctx: RuleContext) -> Value | None:
    """Linear ops on summed windows: the sum of two (`add_window_sums`), one times or divided
    by a constant, negated (the sum of the scaled rows)."""
    name = info.name
    if name == "stablehlo.add" and len(operands) == 2 and all(
            isinstance(v, Windowed) for v in operands):
        return add_window_sums(operands[0], operands[1], info, ctx.mesh, ctx.reference)
    if name == "stablehlo.add" and len(operands) == 2:
        window, other = operands if isinstance(operands[0], Windowed) else operands[::-1]
        return window if isinstance(other, Rel) and splat_value(other.term) == 0 else None
    if name == "stablehlo.negate":
        factor = Fraction(-1)
        (window,) = operands
    elif name in ("stablehlo.multiply", "stablehlo.divide") and len(operands) == 2:
        window, other = operands if isinstance(operands[0], Windowed) else operands[::-1]
        if name == "stablehlo.divide" and isinstance(operands[1], Windowed):
            return _per_window_mean(operands[1], ctx.mesh)
        if name == "stablehlo.divide" and window is not operands[0]:
            return None
        value = splat_value(other.term) if isinstance(other, Rel) else None
        if isinstance(other, Rel) and value is None and isinstance(window, Windowed):
            return _scaled_by_value(info, window, other)
        if not isinstance(value, Fraction) or value == 0:
            return None
        factor = value if name == "stablehlo.multiply" else 1 / value
    else:
        return None
    if not isinstance(window, Windowed):
        return None
    return replace(window, rel=replace(window.rel, term=scale(window.rel.term, factor)))


def _per_window_mean(totals: Windowed, mesh: Mesh) -> Value | None:
    """A division by a sum over a micro-batch's rows (`sum(loss * mask) / sum(mask)` per
    micro-batch, and its gradient): a mean per micro-batch. Averaging those weights
    micro-batch i by N / (m * N_i) (N the total over the whole batch, N_i the micro-batch's,
    m the number of micro-batches over all devices) where the reference's mean over the whole
    batch weights every row by 1 / N: the two agree only when every micro-batch has the same
    total (the same number of valid tokens). None for a divisor that is no such sum."""
    if not totals.summed or totals.starts or totals.holes:
        return None
    dim, length, rel = totals.dim, totals.length, totals.rel
    rows = _rows(totals.offset, length, rel.term.shape[dim], block_rows(rel, dim, mesh))
    count = rel.term.shape[dim] // length
    return Opaque(f"divide by the sum of {pretty(rel.term, 2)} over one micro-batch (rows "
                  f"{rows} of dim {dim}, split over {axes_str(rel.tiling[dim])}): a mean per "
                  f"micro-batch. Averaging the {count} micro-batch means scales micro-batch i "
                  f"by k = N/({count}*N_i) (N: the total over the whole batch, N_i: the "
                  "micro-batch's), so k = 1 only when every micro-batch has the same total "
                  "(the same number of valid tokens); the reference divides by N. Divide by "
                  "the total over the whole batch (summed over the micro-batches and "
                  "all-reduced)", category="scale")


ROWWISE_OPS = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.reshape",
                         "stablehlo.transpose", "stablehlo.dot_general"})
"""Ops that keep a micro-batch window when they treat its dim row by row
(`window_rowwise`); slice, pad and concatenate do too when they leave the window's dim alone."""


def window_rowwise(info, operands: list[Value], ctx: RuleContext, plain) -> list[Value] | None:
    """An op that computes each row of the window's dim from the same row of its operands (a
    micro-batch's broadcasts, reshapes, transposes, matmuls; slices, pads and concatenates
    along other dims): taking rows commutes with it, so windows of one geometry (the same rows
    of a dim of the same size, split alike, no zero rows, nothing summed) are the same window
    of the op applied to the windows' tensors. `plain` (the op's ordinary rule) runs on their
    relations as if each device held its whole block (`_widened`). A dot_general contracting
    the window's dim (a weight gradient summed over a micro-batch's tokens) sums the window's
    rows: a summed window of the dot_general that keeps that dim as a batch dim. None when the
    op does not treat the window's dim row by row (slices, pads and concatenates of it: the
    halo rules decide); the refusal when the operands do not fit."""
    windows = [v for v in operands if isinstance(v, Windowed)]
    if not windows:
        return None
    first = windows[0]
    refused = [Opaque(first.reason, origin=first.origin, category="layout_mismatch")]
    mesh = ctx.mesh
    if mesh is None or ctx.is_global:
        return refused
    if any(w.summed for w in windows):
        return [summed_move(info, operands)]
    rows = _row_map(info, operands)
    if rows is None:
        return None if info.name not in ROWWISE_OPS else refused
    in_dims, out_dim, contracted = rows
    size = first.rel.term.shape[first.dim]

    def geometry(w: Windowed) -> tuple:
        return (w.length, w.rel.term.shape[w.dim], w.rel.tiling[w.dim],
                tuple(r % size for r in first_rows(w, mesh)))

    if any(w.summed or w.holes or w.starts or w.rel.partial or w.rel.poly or is_padded(w)
           for w in windows):
        return refused
    if any((d is None) != (not isinstance(v, Windowed)) for v, d in zip(operands, in_dims)):
        return refused
    if any(v.dim != d for v, d in zip(operands, in_dims) if d is not None) or len(
            {geometry(v) for v in windows}) != 1:
        return refused
    widened = _widened(info, in_dims, out_dim, contracted, first.length,
                       block_rows(first.rel, first.dim, mesh))
    if widened is None:
        return refused
    inner = [v.rel if isinstance(v, Windowed) else v for v in operands]
    try:
        (out,) = plain(widened, inner, ctx)
    except (ValueError, TypeError):
        return refused
    if isinstance(out, Windowed) and is_padded(out):
        out = padded_rel(out)
    if not isinstance(out, Rel) or out_dim in out.poly:
        return refused
    out = freeze(out)
    if (out.partial or out.tiling[out_dim] != first.rel.tiling[first.dim]
            or out.term.shape[out_dim] != size):
        return refused
    window = replace(first, rel=out, dim=out_dim)
    if contracted:
        window = replace(window, summed=(out_dim,), origin=None)
        window = replace(window, reason=_sum_reason(window, mesh))
    return [window]


def _row_map(info, operands: list[Value]) -> tuple[list[int | None], int, bool] | None:
    """(per operand, the dim holding the window's rows (None: no such dim); the result's dim
    holding them; whether the op sums over them) when the op computes each row of the
    result from the same rows of its operands; else None."""
    windows = [v.dim if isinstance(v, Windowed) else None for v in operands]
    name, attrs = info.name, info.attrs
    local_in = [t.shape for t in info.operand_types]
    local_out = info.result_types[0].shape
    w = next(d for d in windows if d is not None)
    if name == "stablehlo.broadcast_in_dim":
        out = tuple(attrs["broadcast_dimensions"])[w]
        return (windows, out, False) if local_in[0][w] == local_out[out] else None
    if name == "stablehlo.transpose":
        return windows, tuple(attrs["permutation"]).index(w), False
    if name == "stablehlo.reshape":
        before = math.prod(local_in[0][:w])
        for j, n in enumerate(local_out):
            if n == local_in[0][w] and math.prod(local_out[:j]) == before:
                return windows, j, False
        return None
    if name == "stablehlo.slice":
        starts, limits = attrs["start_indices"], attrs["limit_indices"]
        strides = attrs.get("strides") or (1,) * len(starts)
        whole = (starts[w], limits[w], strides[w]) == (0, local_in[0][w], 1)
        return (windows, w, False) if whole else None
    if name == "stablehlo.pad":
        edges = (attrs["edge_padding_low"][w], attrs["edge_padding_high"][w],
                 attrs["interior_padding"][w])
        return ([w, None], w, False) if edges == (0, 0, 0) else None
    if name == "stablehlo.concatenate":
        return (windows, w, False) if attrs["dimension"] != w else None
    if name == "stablehlo.dot_general":
        lb, rb = tuple(attrs["lhs_batch"]), tuple(attrs["rhs_batch"])
        lc, rc = tuple(attrs["lhs_contract"]), tuple(attrs["rhs_contract"])
        left, right = windows
        lhs_free = [d for d in range(len(local_in[0])) if d not in lb + lc]
        rhs_free = [d for d in range(len(local_in[1])) if d not in rb + rc]
        if left is not None and left in lb:
            k = lb.index(left)
            return ([left, rb[k]], k, False) if right == rb[k] else None
        if left is not None and left in lc:
            k = lc.index(left)
            return ([left, rc[k]], 0, True) if right == rc[k] else None
        if left is not None:
            return (windows, len(lb) + lhs_free.index(left), False) if right is None else None
        if right in rb or right in rc:
            return None
        return windows, len(lb) + len(lhs_free) + rhs_free.index(right), False
    return None


def _widened(info, in_dims: list[int | None], out_dim: int, contracted: bool, length: int,
             block: int):
    """`info` as if every device held its whole block of `block` rows where it holds its
    window of `length` rows; a dot_general contracting the window's dims keeps them as the
    first batch dim instead. None when a local shape does not hold the window's rows."""
    operand_types = list(info.operand_types)
    for i, d in enumerate(in_dims):
        if d is None:
            continue
        shape = operand_types[i].shape
        if shape[d] != length:
            return None
        operand_types[i] = replace(operand_types[i],
                                   shape=tuple(block if k == d else n for k, n in enumerate(shape)))
    result = info.result_types[0]
    attrs = dict(info.attrs)
    if contracted:
        left, right = in_dims
        lc, rc = list(attrs["lhs_contract"]), list(attrs["rhs_contract"])
        k = lc.index(left)
        del lc[k], rc[rc.index(right)]
        attrs.update(lhs_batch=(left, *attrs["lhs_batch"]), rhs_batch=(right, *attrs["rhs_batch"]),
                     lhs_contract=tuple(lc), rhs_contract=tuple(rc))
        shape = (block, *result.shape)
    else:
        if result.shape[out_dim] != length:
            return None
        shape = tuple(block if k == out_dim else n for k, n in enumerate(result.shape))
        if info.name == "stablehlo.slice":
            attrs["limit_indices"] = tuple(block if k == out_dim else n
                                           for k, n in enumerate(attrs["limit_indices"]))
    return replace(info, attrs=attrs, operand_types=operand_types,
                   result_types=[replace(result, shape=shape), *info.result_types[1:]])


SUMMED_MOVES = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.reshape",
                          "stablehlo.transpose", "stablehlo.pad"})
"""Linear movement ops a summed window goes through (`summed_move`)."""

SUMMED_OPS = SUMMED_MOVES | {"stablehlo.reduce"}
"""Every op besides elementwise ones that accepts a summed window (`settle`)."""


def summed_move(info, operands: list[Value]) -> Value:
    """A transpose, reshape, broadcast or zero pad of a summed window's local value (a
    micro-batch's weight gradient laid out for the optimizer, a layer's gradient padded into
    the stacked parameters' gradient): these move elements (or add zeros), which commutes
    with summing rows, so the result is the sum over the same rows of the moved tensor: its
    summed dims first, the op applied to the rest. Only when the rest is not split (local
    shapes are the global ones)."""
    window = operands[0]
    if not isinstance(window, Windowed):
        return Opaque(f"a summed micro-batch window used by {info.name}",
                      category="layout_mismatch")
    refused = Opaque(window.reason, origin=window.origin, category="layout_mismatch")
    term, summed = window.rel.term, window.summed
    kept = [d for d in range(len(term.shape)) if d not in summed]
    if info.name not in SUMMED_MOVES or window.holes or window.starts or window.rel.partial \
            or any(window.rel.tiling[d] for d in kept):
        return refused
    if info.name == "stablehlo.pad":
        value = operands[1]
        if not isinstance(value, Rel) or splat_value(value.term) != 0 or any(
                info.attrs["interior_padding"]):
            return refused
    local_in, local_out = info.operand_types[0].shape, info.result_types[0].shape
    head = tuple(term.shape[d] for d in summed)
    k = len(summed)
    if info.name == "stablehlo.transpose":
        perm = tuple(info.attrs["permutation"])
        moved = _plain_transpose(term, (*summed, *(kept[p] for p in perm)))
    else:
        front = _plain_transpose(term, (*summed, *kept))
        if tuple(front.shape[k:]) != tuple(local_in):
            return refused
        if info.name == "stablehlo.reshape":
            moved = front if front.shape == head + tuple(local_out) else intern(
                "reshape", (front,), (), head + tuple(local_out), term.dtype)
        elif info.name == "stablehlo.pad":
            low = (0,) * k + tuple(info.attrs["edge_padding_low"])
            high = (0,) * k + tuple(info.attrs["edge_padding_high"])
            if min(low + high) < 0:
                return refused
            moved = make_op("pad", (front, make_splat(0, (), term.dtype)),
                            (low, high, (0,) * len(low)), head + tuple(local_out), term.dtype,
                            linear_in=0)
        else:
            dims = tuple(info.attrs["broadcast_dimensions"])
            moved = intern("broadcast", (front,), ((*range(k), *(k + d for d in dims)),),
                           head + tuple(local_out), term.dtype)
    tiling = tuple(window.rel.tiling[d] for d in summed) + ((),) * len(local_out)
    rel = replace(window.rel, term=moved, tiling=tiling, poly=frozenset())
    return replace(window, rel=rel, dim=summed.index(window.dim), summed=tuple(range(k)))


def _plain_transpose(term: Term, perm: tuple[int, ...]) -> Term:
    """A transpose kept as written (not pushed into `term`), so that `sum_out` finds the
    summed dims where the summed window put them."""
    if perm == tuple(range(len(perm))):
        return term
    return intern("transpose", (term,), (perm,), tuple(term.shape[p] for p in perm),
                  term.dtype)


def _scaled_by_value(info, window: Windowed, other: Rel) -> Value | None:
    """A summed window times (or divided by) a replicated value: the sum of the scaled rows
    (`loss_i / count`, the global valid-token count dividing a micro-batch's summed loss)."""
    if other.partial or other.tiled_axes or other.poly and other.term.op != "splat":
        return None
    term, summed = window.rel.term, window.summed
    kept = [d for d in range(len(term.shape)) if d not in summed]
    if tuple(other.term.shape) != tuple(term.shape[d] for d in kept):
        return None
    factor = make_broadcast(other.term, tuple(kept), term.shape)
    product = make_mul(term, factor) if info.name == "stablehlo.multiply" else make_div(
        term, factor)
    return replace(window, rel=replace(window.rel, term=product))


def completed_sums(plain: Term, reference: frozenset[int] | set[int] | None = None
                   ) -> list[Term]:
    """The forms `sum_out` may give the sum `plain` (a reduce_sum, possibly scaled, or
    reshaped where the canonical reduce dropped summed unit dims: each way of choosing those
    dims gives the same value). The instance layer accepts a completed micro-batch sum when
    the rule's generic output, rebuilt over the real terms, is `plain` and the real output is
    one of these (instance.abstraction._completed_sum)."""
    k, base = single_scaled(plain)
    found = []
    if base.op == "reduce_sum" and len(base.args) == 1:
        found.append(sum_out(base.args[0], tuple(base.attrs[0]), base.dtype, reference))
    elif base.op == "reshape" and base.args[0].op == "reduce_sum" and len(
            base.args[0].args) == 1:
        inner = base.args[0]
        source, done = inner.args[0], set(inner.attrs[0])
        units = [d for d, n in enumerate(source.shape) if n == 1 and d not in done]
        extra = len(source.shape) - len(done) - len(base.shape)
        for chosen in itertools.combinations(units, max(extra, 0)):
            dims = tuple(sorted(done | set(chosen)))
            if tuple(n for d, n in enumerate(source.shape) if d not in dims) == base.shape:
                found.append(sum_out(source, dims, base.dtype, reference))
    return [t if k == 1 else scale(t, k) for t in found]


def sum_out(term: Term, dims: tuple[int, ...], dtype: str,
            reference: frozenset[int] | set[int] | None = None) -> Term:
    """`reduce_sum(term, dims)` in the form the unsharded program computes it: the sum pushed
    through transposes, factors constant along `dims` (broadcasts of other dims) pulled out,
    and a dot_general whose batch dims are summed contracts them instead (a weight gradient
    summed over micro-batches is the gradient over the whole batch). With `reference` (serials
    of the terms the reference computes), a sum the reference computes as it stands is kept
    so: the reference sums the same tensor there (a bias gradient over a whole batch's
    tokens), and pushing the sum further in would miss it."""
    dims = tuple(sorted(dims))
    shape = tuple(n for d, n in enumerate(term.shape) if d not in dims)
    if reference is not None:
        k, base = single_scaled(term)
        plain = sum_term(base, dims, shape, dtype)
        if single_scaled(plain)[1].serial in reference:
            return plain if k == 1 else scale(plain, k)
    if term.op == "lin" and len(term.args) > 1 and term.attrs[0] == 0:
        return map_linear(term, lambda t: sum_out(t, dims, dtype, reference))
    k, base = single_scaled(term)
    out = None
    prefix = dims == tuple(range(len(dims)))
    source = base.args[0].shape if base.args else ()
    head = math.prod(base.shape[:len(dims)])
    inner = next((j for j in range(len(source) + 1) if math.prod(source[:j]) == head), None)
    if base.op == "reshape" and prefix and inner is not None:
        out = make_reshape(sum_out(base.args[0], tuple(range(inner)), dtype, reference), shape)
    elif base.op == "broadcast" and set(dims) <= set(base.attrs[0]) and all(
            source[i] == base.shape[d] for i, d in enumerate(base.attrs[0]) if d in dims):
        bdims = base.attrs[0]
        inner_dims = tuple(i for i, d in enumerate(bdims) if d in dims)
        kept = [d for d in range(len(base.shape)) if d not in dims]
        out = make_broadcast(sum_out(base.args[0], inner_dims, dtype, reference),
                             tuple(kept.index(d) for d in bdims if d not in dims), shape)
    elif base.op == "pad" and splat_value(base.args[1]) == 0 and not any(
            base.attrs[j][d] for j in range(3) for d in dims):
        inner = sum_out(base.args[0], dims, dtype, reference)
        attrs = tuple(tuple(n for d, n in enumerate(a) if d not in dims) for a in base.attrs)
        out = make_op("pad", (inner, base.args[1]), attrs, shape, dtype, linear_in=0)
    elif base.op == "div" and base.args[1].op == "broadcast" and not set(
            base.args[1].attrs[0]) & set(dims):
        kept = [d for d in range(len(term.shape)) if d not in dims]
        divisor = base.args[1]
        out = make_div(sum_out(base.args[0], dims, dtype, reference), make_broadcast(
            divisor.args[0], tuple(kept.index(d) for d in divisor.attrs[0]), shape))
    elif base.op == "transpose":
        (perm,) = base.attrs
        inner = tuple(sorted(perm[d] for d in dims))
        rest = [perm[d] for d in range(len(perm)) if d not in dims]
        remaining = [d for d in range(len(perm)) if d not in inner]
        out = make_transpose(sum_out(base.args[0], inner, dtype, reference),
                             tuple(remaining.index(p) for p in rest))
    elif base.op == "mul":
        constant = [f for f in base.args if f.op == "broadcast"
                    and not set(f.attrs[0]) & set(dims)]
        if constant and len(constant) < len(base.args):
            rest = [f for f in base.args if f not in constant]
            out = sum_out(_product(rest), dims, dtype, reference)
            kept = [d for d in range(len(term.shape)) if d not in dims]
            for f in constant:
                out = make_mul(out, make_broadcast(f.args[0], tuple(kept.index(d)
                                                                    for d in f.attrs[0]), shape))
    elif base.op == "stablehlo.dot_general":
        out = _contract_batch(base, dims, shape, dtype)
    if out is None and reference is not None:
        out = _product_dot(base, dims, shape, dtype, reference)
    if out is None:
        out = sum_term(base, dims, shape, dtype)
    return out if k == 1 else scale(out, k)


def _view(term: Term) -> tuple[Term, tuple[int, ...]] | None:
    """(source, where): `term` is `source` moved by broadcasts and transposes, source dim i at
    dim where[i] of `term` (the same size there). None: a broadcast widens a source dim."""
    if term.op == "transpose":
        inner = _view(term.args[0])
        if inner is None:
            return None
        (perm,) = term.attrs
        return inner[0], tuple(perm.index(p) for p in inner[1])
    if term.op == "broadcast":
        inner = _view(term.args[0])
        if inner is None:
            return None
        (dims,) = term.attrs
        source, where = inner[0], tuple(dims[p] for p in inner[1])
        if any(source.shape[i] != term.shape[d] for i, d in enumerate(where)):
            return None
        return source, where
    return term, tuple(range(len(term.shape)))


def _two_factors(term: Term) -> tuple[Term, Term] | None:
    """`a * b` as (a, b); `select(p, a, 0)` of a finite `a` as (a, indicator(p)): a finite
    number times 1 or 0 is itself or 0 (`jnp.sum(w * mask)` normalized to a select)."""
    if term.op == "mul" and len(term.args) == 2:
        return term.args[0], term.args[1]
    if term.op == "stablehlo.select" and splat_value(term.args[2]) == 0 and splat_value(
            term.args[1]) is None and term.args[0].dtype == "i1" and term_finite(term.args[1]):
        return term.args[1], indicator(term.args[0], term.dtype)
    return None


def _product_dot(term: Term, dims: tuple[int, ...], shape: tuple[int, ...], dtype: str,
                 reference: frozenset[int] | set[int]) -> Term | None:
    """`reduce_sum(a * b, dims)` of two factors (`_two_factors`) that both vary along `dims` as the
    dot_general contracting them (dims both vary along and are kept: batch dims), in the
    operand order the reference computes (a dense expert loop's `sum(w * mask_i)` summed over
    the experts meets the reference's einsum). None: not such a sum, or a dot_general the
    reference does not compute."""
    factors = _two_factors(term)
    if factors is None:
        return None
    views = [_view(f) for f in factors]
    if None in views:
        return None
    kept = [d for d in range(len(term.shape)) if d not in dims]
    for (f, fw), (g, gw) in (views, views[::-1]):
        if not set(dims) <= set(fw) & set(gw) or not set(kept) <= set(fw) | set(gw):
            continue
        batch = [d for d in kept if d in fw and d in gw]
        free_f = [i for i, d in enumerate(fw) if d not in batch and d not in dims]
        free_g = [i for i, d in enumerate(gw) if d not in batch and d not in dims]
        attrs = (tuple(fw.index(d) for d in batch), tuple(gw.index(d) for d in batch),
                 tuple(fw.index(d) for d in dims), tuple(gw.index(d) for d in dims))
        order = [*batch, *(fw[i] for i in free_f), *(gw[i] for i in free_g)]
        out_shape = tuple(term.shape[d] for d in order)
        dot = make_dot(f, g, attrs, out_shape, dtype)
        out = make_transpose(dot, tuple(order.index(d) for d in kept))
        if out.shape == shape and single_scaled(out)[1].serial in reference:
            return out
    return None


def _product(factors: list[Term]) -> Term:
    out = factors[0]
    for f in factors[1:]:
        out = make_mul(out, f)
    return out


def _contract_batch(dot: Term, dims: tuple[int, ...], shape: tuple[int, ...], dtype: str
                    ) -> Term | None:
    """A dot_general summed over some of its batch dims (result dims < number of batch dims):
    the dot_general contracting them, contraction pairs in lhs order."""
    lb, rb, lc, rc = dot.attrs
    if not dims or max(dims) >= len(lb):
        return None
    pairs = sorted([*zip(lc, rc), *((lb[d], rb[d]) for d in dims)])
    keep = [d for d in range(len(lb)) if d not in dims]
    attrs = (tuple(lb[d] for d in keep), tuple(rb[d] for d in keep),
             tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
    return make_dot(dot.args[0], dot.args[1], attrs, shape, dtype)
