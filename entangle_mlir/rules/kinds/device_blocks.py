"""Per-device range tests and local indices of a range cut into device blocks over mesh axes
(device d's block: the part of a split dim it holds): the vocab-parallel embedding and
cross-entropy (Megatron), in both spellings:

    start = axis_index('tp') * V_local
    outside = (tokens < start) | (tokens >= start + V_local)      # InBlock, outside [0, V_local)
    local = where(outside, 0, tokens - start)                     # BlockIndex
    found = take(w_local, local)                                  # Masked: valid inside only
    psum(where(outside, 0, found))                                # partial sum of take(w, tokens)

    local = tokens - start                                        # Shifted (int32: it wraps)
    mask = (local >= 0) & (local < V_local)                       # InBlock, exactly the block
    found = take(w_local, clip(local, 0, V_local - 1))            # BlockIndex.clamp -> Masked
    psum(where(mask, found, 0))                                   # partial sum of take(w, tokens)

A test of `tokens - start` computed in the dtype is stated by the exact differences it
accepts (`compare_shifted`, `_wrapped_ranges`): a union of ranges, with the wrapped ids near
the dtype's minimum where a one-sided test accepts them.

Every step is exact, for every token value: a token inside device d's block is looked up at
its own row; outside every block (out of range) it contributes zeros on every device, so the
sum is `select(0 <= tokens < V, take(w, tokens), 0)`. The reference's `take` differs from that
only for out-of-range tokens, which `analysis/valid_indices.py` settles, with a note, when the
outputs are compared. The backward pass scatters the masked cotangent at the local index: each device
adds exactly the updates of its block (zeros elsewhere), the block of the global scatter-add.

Anything else done with these values is "not supported" (opaque) at the op that does it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from fractions import Fraction

from entangle_mlir.core import intervals
from entangle_mlir.core.intrange import value_range
from entangle_mlir.core.mesh import Mesh, axes_str
from entangle_mlir.core.ranges import fits, int_limits
from entangle_mlir.core.relations import (
    BlockIndex,
    InBlock,
    Masked,
    Opaque,
    Rel,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.core.terms import (
    FLIPPED,
    make_broadcast,
    make_elementwise,
    make_iota,
    make_reshape,
    make_splat,
    splat_value,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import COMPARISONS, freeze, iota_dim, resize, unify_dims
from entangle_mlir.rules.kinds import entries


def _accepted(direction: str, bound: int) -> intervals.Ranges | None:
    """The values v with `v direction bound`."""
    found = {"LT": (None, bound), "LE": (None, bound + 1), "GT": (bound + 1, None),
             "GE": (bound, None), "EQ": (bound, bound + 1)}
    if direction == "NE":
        return intervals.complement(intervals.interval(bound, bound + 1))
    return intervals.interval(*found[direction]) if direction in found else None


def unsupported(name: str) -> Opaque:
    return Opaque(f"device-dependent mask or index used by {name} (not supported yet)",
                  category="unsupported")


# ----- recognising the block offsets --------------------------------------------------------

def block_offsets(offsets, mesh: Mesh, rel: Rel, modulus: int | None = None
                  ) -> tuple[tuple[str, ...], int, int] | None:
    """(axes A, length L, k) with offsets[d] == -(block_index(A, d) * L + k) on every device
    (modulo `modulus` when given: offsets added in a dtype of that many values): `x + offsets`
    is `x - start - k` for the start of the device's block of a range cut in blocks of L over
    A. A must be axes `rel` is not split over."""
    free = [a for a in mesh.names if a not in rel.tiled_axes and mesh.size(a) > 1]
    values = [-int(o) for o in offsets]
    units = _unit_devices(mesh)
    for count in range(1, len(free) + 1):
        for axes in itertools.permutations(free, count):
            if not _fits_units(axes, values, units, mesh, modulus):
                continue
            blocks = [mesh.block_index(axes, d) for d in range(mesh.num_devices)]
            k = values[blocks.index(0)]
            length = values[blocks.index(1)] - k
            if modulus is None:
                if length > 0 and all(v == b * length + k for v, b in zip(values, blocks)):
                    return axes, length, k
                continue
            length %= modulus
            if length > 0 and all((v - b * length - k) % modulus == 0
                                  for v, b in zip(values, blocks)):
                return axes, length, k
    return None


def _unit_devices(mesh: Mesh) -> dict[str, int]:
    """Per axis of more than one device, the device at coordinate 1 along it, 0 elsewhere."""
    zero = {a: 0 for a in mesh.names}
    return {a: mesh.device({**zero, a: 1}) for a in mesh.names if mesh.size(a) > 1}


def _fits_units(axes: tuple[str, ...], values: list[int], units: dict[str, int], mesh: Mesh,
                modulus: int | None) -> bool:
    """`block_offsets`' condition at device 0 and the unit devices alone (a necessary one, a
    few devices instead of every device: the permutations it rules out need no full check;
    the ones it passes get it). Device 0 holds block 0 along any axes, the unit device of
    `axes`' last axis block 1 (the first device that does), a unit device of another axis of
    `axes` its stride, of an axis outside `axes` block 0."""
    k = values[0]
    length = values[units[axes[-1]]] - k
    stride, strides = 1, {}
    for a in reversed(axes):
        strides[a] = stride
        stride *= mesh.size(a)
    for a, d in units.items():
        want = strides.get(a, 0) * length + k
        if (values[d] - want if modulus is None else (values[d] - want) % modulus) != 0:
            return False
    return True


def _integral(value) -> int | None:
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    return None


def compare_shifted(info: OpInfo, shifted: Shifted, other: Rel, shifted_first: bool,
                    ctx: RuleContext, wrapped: bool = False) -> Value | None:
    """`compare(x + offset(d), c)` with a constant c and block offsets: an `InBlock` test.
    None when the operands are not of that form (the caller reports it).

    `wrapped`: the device computed `x + offset(d)` in x's dtype (`ids - start`), so the sum
    may have wrapped around; else the offset was only moved across the compare
    (`ids < start` read as `ids - start < 0`, exact). A compare of the wrapped difference
    accepts every exact difference congruent to an accepted value modulo the dtype's size
    (`_wrapped_ranges`): `ids - start >= 0` alone also holds for ids near the dtype's minimum
    on devices with start > 0, but `0 <= ids - start < L` is exactly the block when every
    block lies inside the dtype's range."""
    bound = _integral(splat_value(other.term))
    x = shifted.rel
    if bound is None or ctx.mesh is None or x.partial or not info.operand_types[0].is_int:
        return None
    limits = int_limits(x.term.dtype)
    if wrapped and limits is None:
        return None
    modulus = int(limits[1] - limits[0]) + 1 if wrapped else None
    found = block_offsets(shifted.offsets, ctx.mesh, x, modulus)
    direction = info.attrs["comparison_direction"]
    if found is None:
        return None
    if not shifted_first:
        direction = FLIPPED[direction]
    accepted = _accepted(direction, bound)
    if accepted is None:
        return None
    axes, length, k = found
    if not wrapped:
        return InBlock(freeze(x), axes, length, intervals.shift(accepted, k))
    return InBlock(freeze(x), axes, length, _wrapped_ranges(accepted, x, axes, length, k, ctx))


def _wrapped_ranges(accepted: intervals.Ranges, x: Rel, axes, length: int, k: int,
                    ctx: RuleContext) -> intervals.Ranges:
    """The exact differences z = x - b*length (b the device's block index) for which
    `wrap(z - k)`, computed in x's dtype, is in `accepted`: every z congruent to an accepted
    value plus k modulo the dtype's size M, kept where some device can hold it (x in its value
    range, b in [0, G)), the ends of that hull unbounded."""
    dtype = x.term.dtype
    low, high = (int(v) for v in int_limits(dtype))
    modulus = high - low + 1
    found = value_range(x.term)
    x_low, x_high = (int(v) for v in found) if found is not None else (low, high)
    groups = ctx.mesh.group_size(axes)
    hull_lo, hull_hi = x_low - (groups - 1) * length, x_high + 1
    wrapped = intervals.intersect(accepted, intervals.interval(low, high + 1))
    first = (hull_lo - high - 1 - k) // modulus - 1
    last = (hull_hi - low - k) // modulus + 1
    parts: intervals.Ranges = ()
    for j in range(first, last + 1):
        parts = intervals.union(parts, intervals.shift(wrapped, k + j * modulus))
    return intervals.clip(parts, hull_lo, hull_hi)


def _same_x(p: InBlock, q: InBlock) -> bool:
    return (p.rel.term is q.rel.term and p.rel.tiling == q.rel.tiling
            and (p.axes, p.length) == (q.axes, q.length))


def _logic(name: str, p: InBlock, q: InBlock) -> InBlock | None:
    if not _same_x(p, q):
        return None
    combine = intervals.intersect if name == "stablehlo.and" else intervals.union
    return replace(p, ranges=combine(p.ranges, q.ranges), origin=None)


# ----- elementwise ops ------------------------------------------------------------------------

def truth(value: Value) -> bool | None:
    if isinstance(value, Rel):
        constant = splat_value(value.term)
        if isinstance(constant, Fraction):
            return constant != 0
    return None


def elementwise(info: OpInfo, operands: list[Value], ctx: RuleContext, plain) -> list[Value]:
    """An elementwise op with an `InBlock`, `BlockIndex` or `Masked` operand."""
    name = info.name
    if any(isinstance(v, Masked) and not v.zero for v in operands) and all(
            isinstance(v, Rel | Masked) for v in operands):
        return [carried(info, operands, ctx, plain)]
    if name == "stablehlo.not" and isinstance(operands[0], InBlock):
        return [replace(operands[0], ranges=intervals.complement(operands[0].ranges),
                        origin=None)]
    if name in CLIPS and any(isinstance(v, BlockIndex) for v in operands):
        return [clip(info, operands, ctx) or unsupported(name)]
    if name in ("stablehlo.and", "stablehlo.or") and len(operands) == 2:
        a, b = operands
        neutral = name == "stablehlo.and"
        for x, y in ((a, b), (b, a)):
            if isinstance(x, InBlock) and truth(y) is neutral:
                return [x]
        if isinstance(a, InBlock) and isinstance(b, InBlock):
            joined = _logic(name, a, b)
            if joined is not None:
                return [joined]
        if name == "stablehlo.and":
            for x, y in ((a, b), (b, a)):
                if isinstance(x, Masked) and not x.zero and isinstance(y, InBlock):
                    kept = _one_hot_in_block(x, y, ctx)
                    if kept is not None:
                        return [kept]
        return [unsupported(name)]
    if name == "stablehlo.convert" and info.result_types[0].is_int and \
            info.operand_types[0].is_int and isinstance(operands[0], BlockIndex):
        low, high = operands[0].bounds()
        if not fits(Fraction(low), Fraction(high), info.result_types[0].dtype):
            return [Opaque(f"convert of a local index to {info.result_types[0].dtype}, which "
                           "does not hold all its values (it wraps around; not proven)",
                           category="unsupported")]
        return [operands[0]]
    if name in ("stablehlo.add", "stablehlo.subtract") and isinstance(operands[0], BlockIndex):
        step = _integral(splat_value(operands[1].term)) if isinstance(operands[1], Rel) else None
        if step is not None:
            sign = -1 if name == "stablehlo.subtract" else 1
            moved = replace(operands[0], add=operands[0].add + sign * step)
            low, high = moved.bounds()
            if not fits(Fraction(low), Fraction(high), info.result_types[0].dtype):
                return [Opaque(f"{name} moves a local index out of the range of "
                               f"{info.result_types[0].dtype} (it wraps around; not proven)",
                               category="unsupported")]
            return [moved]
    if name == "stablehlo.compare" and len(operands) == 2:
        return [_compare_index(info, operands, ctx)]
    if name == "stablehlo.select" and isinstance(operands[0], InBlock) and (
            operands[0].is_block or _entry_lifted(operands, ctx) is None):
        return [select(info, operands, ctx, plain)]
    lifted = _entry_lifted(operands, ctx)
    entry = None if lifted is None else entries.elementwise(info, lifted, ctx, plain)
    return [entry if entry is not None else unsupported(name)]


def _entry_lifted(operands: list[Value], ctx: RuleContext) -> list[Value] | None:
    """The operands with one-value tests inside the block, and values zeroed outside one, as
    one-hot entries (`entries.lift_masks`), when some operand is such a test or value."""
    if not any(isinstance(v, InBlock) or isinstance(v, Masked) and v.zero for v in operands):
        return None
    return entries.lift_masks(operands, ctx)


CLIPS = ("stablehlo.maximum", "stablehlo.minimum", "stablehlo.clamp")
"""The ops `jnp.clip` lowers to (max then min, or one clamp)."""


def clip(info: OpInfo, operands: list[Value], ctx: RuleContext) -> Value | None:
    """`max(v, c)`, `min(v, c)` (either order) or `clamp(lo, v, hi)` with constant bounds of a
    local index v: `ids - start` (a `Shifted` of block offsets) or a `BlockIndex`. The result
    is `clamp(ids - start, lo, hi)` computed in the dtype: a `BlockIndex` with that clamp,
    which is `ids - start` inside the block as long as the bounds do not cut it
    (`jnp.clip(ids - start, 0, V_local - 1)`). A `BlockIndex` already in [lo, hi] is kept. None: not of this form."""
    name = info.name
    if name == "stablehlo.clamp":
        low_v, index, high_v = operands
        bounds = (_constant(low_v), _constant(high_v))
        if None in bounds:
            return None
    else:
        a, b = operands
        index, bound_v = (a, b) if isinstance(a, Shifted | BlockIndex) else (b, a)
        bound = _constant(bound_v)
        if bound is None:
            return None
        bounds = (bound, None) if name == "stablehlo.maximum" else (None, bound)
    if isinstance(index, Shifted):
        x = freeze(index.rel)
        found = block_offsets(index.offsets, ctx.mesh, x) if ctx.mesh else None
        if found is None or found[2] != 0 or x.partial or int_limits(x.term.dtype) is None:
            return None
        index = BlockIndex(x, found[0], found[1], clamp=(None, None))
    if not isinstance(index, BlockIndex):
        return None
    low, high = index.bounds()
    lo, hi = bounds
    if (lo is None or lo <= low) and (hi is None or hi >= high):
        return index
    if index.clamp is None:
        return None
    inner_lo, inner_hi = index.clamp
    if lo is not None:
        lo -= index.add
        inner_lo = lo if inner_lo is None else max(inner_lo, lo)
        inner_hi = None if inner_hi is None else max(inner_hi, lo)
    if hi is not None:
        hi -= index.add
        inner_hi = hi if inner_hi is None else min(inner_hi, hi)
        inner_lo = None if inner_lo is None else min(inner_lo, hi)
    if (inner_lo is not None and inner_lo > 0) or (
            inner_hi is not None and inner_hi < index.length - 1):
        return Opaque(f"{name} clamps a local index into [{inner_lo}, {inner_hi}], which cuts "
                      f"the device's block [0, {index.length}) (not supported)",
                      category="unsupported")
    return replace(index, clamp=(inner_lo, inner_hi))


def _constant(value: Value) -> int | None:
    return _integral(splat_value(value.term)) if isinstance(value, Rel) else None


def _compare_index(info: OpInfo, operands: list[Value], ctx: RuleContext) -> Value:
    """A local index against a constant: decided by the index's bounds on every device.
    Against the positions of the device's block (`local == arange(V_local)`): the one-hot
    rows of the global index, valid inside the block (`one_hot_rows`)."""
    a, b = operands
    direction = info.attrs["comparison_direction"]
    if isinstance(b, BlockIndex):
        a, b, direction = b, a, FLIPPED[direction]
    if direction == "EQ" and isinstance(a, BlockIndex) and isinstance(b, Rel) and \
            splat_value(b.term) is None:
        return _one_hot_rows(info, a, b, ctx)
    bound = _integral(splat_value(b.term)) if isinstance(b, Rel) else None
    if not isinstance(a, BlockIndex) or bound is None:
        return unsupported(info.name)
    low, high = a.bounds()
    outcomes = {COMPARISONS[direction](v, bound) for v in (low, high)}
    monotone = direction in ("LT", "LE", "GT", "GE") or bound < low or bound > high
    if len(outcomes) != 1 or not monotone:
        return unsupported(info.name)
    (outcome,) = outcomes
    rel = a.rel
    return replace(rel, term=make_splat(int(outcome), rel.term.shape, "i1"))


def _one_hot_rows(info: OpInfo, index: BlockIndex, positions: Rel, ctx: RuleContext) -> Value:
    """`local == iota(L)` along a dim k the index is broadcast along: on device b, inside the
    block, `x == b*L + j` for j < L, the block over the index's axes of `x == iota(V)`; outside
    it the fill's row, which `and` with the block test removes."""
    found = iota_dim(positions.term)
    x = index.rel
    if found is None or found[1] != 1 or index.add or positions.partial or ctx.mesh is None:
        return unsupported(info.name)
    k = found[0]
    if (positions.tiling[k] or positions.term.shape[k] != index.length
            or k not in x.poly or x.term.shape[k] != index.length):
        return unsupported(info.name)
    total = index.length * ctx.mesh.group_size(index.axes)
    widened = resize(x.term, k, total)
    if widened is None:
        return unsupported(info.name)
    tiling = list(x.tiling)
    tiling[k] = index.axes
    shape = widened.shape
    iota = make_iota(shape, k, positions.term.dtype)
    term = make_elementwise("stablehlo.compare", (widened, iota), ("EQ",), "i1")
    rel = Rel(term, tuple(tiling), (), "", frozenset(x.poly - {k}), x.scope)
    pred = InBlock.block(Rel(widened, tuple(tiling), (), "", frozenset(x.poly - {k}), x.scope),
                         index.axes, index.length)
    return Masked(rel, pred)


def _one_hot_in_block(mask: Masked, pred: InBlock, ctx: RuleContext) -> Value | None:
    """`one_hot_rows & inside`: the one-hot rows are false outside the block anyway."""
    term = mask.rel.term
    if term.op != "stablehlo.compare" or term.attrs != ("EQ",) or not pred.inside:
        return None
    aligned = _aligned(pred, mask.pred.rel, ctx)
    if aligned is None or not _same_pred(aligned, mask.pred):
        return None
    return mask.rel


def select(info: OpInfo, operands: list[Value], ctx: RuleContext, plain) -> Value:
    """select on an `InBlock` predicate that is 'x is (not) in the device's block':

    * the constant c where outside, `x - start` inside: the local index (`BlockIndex`);
    * zeros where outside, a gather at the local index inside: each device keeps the rows of
      its own block, so over the block axes the values add up to the global lookup (a partial
      sum of `select(0 <= x < V, lookup(x), 0)`);
    * -inf where outside, a gather at the local index inside: the same as a partial max
      (`pmax(where(mask, rows, -inf))`);
    * zeros where outside, any other value inside: that value masked (`Masked`, for the
      scatter of the backward pass).
    """
    pred, on_true, on_false = operands
    if not pred.is_block:
        return _not_the_block(pred)
    inside = replace(pred, ranges=((0, pred.length),))
    kept, dropped = (on_false, on_true) if pred.outside else (on_true, on_false)
    if isinstance(kept, Shifted) and isinstance(dropped, Rel):
        fill = _integral(splat_value(dropped.term))
        x = freeze(kept.rel)
        found = block_offsets(kept.offsets, ctx.mesh, x) if ctx.mesh else None
        if fill is None or found != (pred.axes, pred.length, 0) or x.term is not pred.rel.term:
            return unsupported(info.name)
        return BlockIndex(x, pred.axes, pred.length, fill)
    fill = splat_value(dropped.term) if isinstance(dropped, Rel) else None
    lowest = fill == float("-inf") and isinstance(kept, Masked) and not kept.zero
    if fill != 0 and not lowest:
        return unsupported(info.name)
    if isinstance(kept, Masked) and not kept.zero:
        inside = _aligned(inside, kept.pred.rel, ctx)
        if inside is None or not _same_pred(kept.pred, inside):
            return unsupported(info.name)
        return _sum_of_blocks(kept, ctx, "max" if lowest else "sum")
    if isinstance(kept, Rel) and not kept.partial and not set(kept.tiled_axes) & set(pred.axes):
        masked = _mask(kept, inside, ctx)
        return masked if masked is not None else unsupported(info.name)
    return unsupported(info.name)


def _not_the_block(pred: InBlock) -> Opaque:
    """A mask that is not a device's block: the values it tests, and the block's. One range
    (or the outside of one) whose ends lie near the block is called an off-by-one bound;
    anything else (a one-sided test of a difference that wraps around near the dtype's
    limits, a union of ranges) is only not related."""
    column = _one_hot_column(pred)
    if column is not None:
        return column
    diff = f"x - {pred.length}*axis_index({', '.join(pred.axes)})"
    hole = intervals.complement(pred.ranges)
    near = all(end is None or -pred.length <= end <= 2 * pred.length
               for part in pred.ranges for end in part)
    if near and (len(pred.ranges) == 1 or len(hole) == 1):
        (lo, hi), kept = (pred.ranges[0], "inside") if len(pred.ranges) == 1 else (
            hole[0], "outside")
        lo = "-inf" if lo is None else lo
        hi = "inf" if hi is None else hi
        return Opaque(f"the mask is not the device's block: it tests ids x with {lo} <= "
                      f"{diff} < {hi} ({kept} kept as the block), but each device's block "
                      f"holds [0, {pred.length}) (an off-by-one bound?)",
                      category="wrong_offset")
    return Opaque(f"the mask is not the device's block: it holds for ids x with "
                  f"{intervals.describe(pred.ranges, diff)} (exactly, where the difference "
                  f"computed in {pred.rel.term.dtype} wraps around), and each device's block "
                  f"is [0, {pred.length}): not related", category="unrelated")


def _one_hot_column(pred: InBlock) -> Opaque | None:
    """A test of one value j inside the device's block, `x == start + j` (0 <= j < L): entry
    j of each device's block of `one_hot(x)` over all the blocks (dense expert parallelism's
    mask of a device's local expert j, `ids == axis_index * E_local + j`). That is exact, but
    the layout tier relates whole blocks (`x[..., None] == start + arange(L)`, `_one_hot_rows`),
    not one entry of every device's block: not supported yet. With L = 2 the same test is also
    a block bound off by one, which the message says. None: not such a test."""
    if len(pred.ranges) != 1 or pred.length < 2:
        return None
    lo, hi = pred.ranges[0]
    if lo is None or hi != lo + 1 or not 0 <= lo < pred.length:
        return None
    axes = ", ".join(pred.axes)
    also = (f" (or the block [0, {pred.length}) with a bound off by one)"
            if pred.length == 2 else "")
    return Opaque(f"the mask tests x == {pred.length}*axis_index({axes}) + {lo}: entry {lo} of "
                  f"each device's block of one_hot(x) split over {axes}{also}, one step of a "
                  "loop over the block's entries by a scalar index; relating one entry of "
                  "every device's block (rather than the whole block, `x[..., None] == start "
                  "+ arange(L)`) is not supported yet", category="unsupported")


def _same_pred(p: InBlock, q: InBlock) -> bool:
    return (p.rel.term is q.rel.term and _fixed_tiling(p.rel) == _fixed_tiling(q.rel)
            and (p.axes, p.length, p.ranges) == (q.axes, q.length, q.ranges))


def _aligned(pred: InBlock, like: Rel, ctx: RuleContext) -> InBlock | None:
    """`pred` with the dims it was broadcast along at the local shape sized like `like`'s."""
    rank = len(like.term.shape)
    if len(pred.rel.term.shape) != rank:
        return None
    unified = unify_dims([pred.rel, like], [list(range(rank))] * 2, ctx, "select")
    if isinstance(unified, Opaque):
        return None
    return replace(pred, rel=freeze(unified[0][0]))


def _fixed_tiling(rel: Rel) -> tuple:
    return tuple(() if d in rel.poly else axes for d, axes in enumerate(rel.tiling))


def _mask(value: Rel, pred: InBlock, ctx: RuleContext) -> Masked | None:
    """`value` where `pred`, zeros elsewhere, with the predicate laid out like the value."""
    rank = len(value.term.shape)
    unified = unify_dims([pred.rel, value], [list(range(rank))] * 2, ctx, "select")
    if isinstance(unified, Opaque):
        return None
    (pred_rel, value_rel), _, _ = unified
    pred_rel, value_rel = freeze(pred_rel), freeze(value_rel)
    if pred_rel.tiling != value_rel.tiling:
        return None
    return Masked(value_rel, replace(pred, rel=pred_rel), zero=True)


def _sum_of_blocks(value: Masked, ctx: RuleContext, kind: str = "sum") -> Value:
    """Rows masked to the device's block of x, added over the block axes: every x in
    [0, L * |A|) lies in exactly one block, any other x in none. `kind` "max": the rows are
    -inf outside the block instead of zeros, and the max over the block axes keeps the one
    device's row (max(r, -inf) = r for every r but NaN, which inputs do not hold)."""
    pred = value.pred
    rel = value.rel
    if rel.partial:
        return unsupported("stablehlo.select")
    x = pred.rel.term
    total = pred.length * ctx.mesh.group_size(pred.axes)
    if not fits(Fraction(total), Fraction(total), x.dtype):
        return unsupported("stablehlo.select")
    zero_i = make_splat(0, x.shape, x.dtype)
    top = make_splat(total, x.shape, x.dtype)
    in_range = make_elementwise("stablehlo.and", (
        make_elementwise("stablehlo.compare", (x, zero_i), ("GE",), "i1"),
        make_elementwise("stablehlo.compare", (x, top), ("LT",), "i1")), (), "i1")
    fill = make_splat(0 if kind == "sum" else float("-inf"), rel.term.shape, rel.term.dtype)
    term = make_elementwise("stablehlo.select", (in_range, rel.term, fill), (),
                            rel.term.dtype)
    return Rel(term, rel.tiling, tuple(pred.axes), kind, frozenset(), rel.scope)


# ----- ops that compute each masked position from the same position --------------------------

CARRIERS = ("stablehlo.dot_general", "stablehlo.reduce")
"""Non-elementwise ops whose rules carry a lookup valid only inside the block (`carried`)."""


def carried(info: OpInfo, operands: list[Value], ctx: RuleContext, plain) -> Value:
    """An op on a lookup valid only inside the device's block (`Masked`, unspecified
    elsewhere) and plain values, computing each result position from positions where the
    mask is the same: the op on the lookup's relation, valid where the mask holds (MoE's
    `einsum(tokens, w[clip(local)])`, later zeroed by `where(mine, ., 0)`). Elementwise ops
    keep the mask; a dot_general or reduce needs it constant along the dims it contracts or
    reduces, and moves it onto the result's dims. Exact inside the mask for any values
    outside it."""
    masks = [v for v in operands if isinstance(v, Masked)]
    if any(m.zero for m in masks) and all(isinstance(v, Rel | Masked) for v in operands):
        return _masked_entries(info, operands, ctx, plain) or unsupported(info.name)
    if any(m.zero for m in masks) or not all(isinstance(v, Rel | Masked) for v in operands):
        return unsupported(info.name)
    rels = [v.rel if isinstance(v, Masked) else v for v in operands]
    (out,) = plain(info, rels, ctx)[:1]
    if not isinstance(out, Rel):
        return out
    if out.partial:
        return unsupported(info.name)
    preds = []
    for position, value in enumerate(operands):
        if not isinstance(value, Masked):
            continue
        mapping = _result_dims(info, position, len(value.rel.term.shape))
        pred = _pred_on(value.pred, mapping, out) if mapping is not None else None
        if pred is None:
            return unsupported(info.name)
        preds.append(pred)
    if any(not _same_pred(p, preds[0]) for p in preds[1:]):
        return unsupported(info.name)
    return Masked(out, preds[0], origin=masks[0].origin)


def _masked_entries(info: OpInfo, operands: list[Value], ctx: RuleContext, plain
                    ) -> Value | None:
    """A reduce or dot_general of values zeroed outside a one-value test (`where(x == b*L + i,
    v, 0)`): the op on their one-hot entries (`entries.masked_entry`). None: not of this
    form."""
    lifted = entries.lift_masks(operands, ctx)
    if lifted is None:
        return None
    if info.name == "stablehlo.reduce" and isinstance(lifted[0], Windowed) and \
            isinstance(lifted[1], Rel):
        return entries.reduce(info, lifted[0], lifted[1], info.attrs.get("reducer", "other"),
                              ctx, plain)
    if info.name == "stablehlo.dot_general":
        found = entries.dot_general(info, lifted, ctx, plain)
        return found[0] if found else None
    return None


def _result_dims(info: OpInfo, position: int, rank: int) -> list[int | None] | None:
    """For each dim of operand `position`, the result dim it becomes (None: contracted or
    reduced away); None when the op is not one that keeps positions apart."""
    if info.name == "stablehlo.dot_general":
        a = info.attrs
        batch = a["lhs_batch"] if position == 0 else a["rhs_batch"]
        contract = a["lhs_contract"] if position == 0 else a["rhs_contract"]
        lhs_rank = len(info.operand_types[0].shape)
        lhs_free = lhs_rank - len(a["lhs_batch"]) - len(a["lhs_contract"])
        free = [d for d in range(rank) if d not in batch and d not in contract]
        first = len(batch) + (lhs_free if position == 1 else 0)
        return [list(batch).index(d) if d in batch else None if d in contract
                else first + free.index(d) for d in range(rank)]
    if info.name == "stablehlo.reduce":
        if position != 0:
            return None
        reduced = list(info.attrs["dimensions"])
        kept = [d for d in range(rank) if d not in reduced]
        return [None if d in reduced else kept.index(d) for d in range(rank)]
    return list(range(rank))


def _pred_on(pred: InBlock, mapping: list[int | None], like: Rel) -> InBlock | None:
    """`pred` moved onto a result's dims by `mapping` (operand dim -> result dim), laid out
    like the result `like`; None when it varies along a dim that has no result dim."""
    term = pred.rel.term
    src, dims = (term.args[0], term.attrs[0]) if term.op == "broadcast" else (
        term, tuple(range(len(term.shape))))
    moved = [mapping[d] for d in dims]
    if None in moved or moved != sorted(moved):
        return None
    placed = make_broadcast(src, tuple(moved), like.term.shape)
    return replace(pred, rel=Rel(placed, like.tiling, scope=like.scope))


# ----- data movement --------------------------------------------------------------------------

def moved(info: OpInfo, value: Value, rule, ctx: RuleContext) -> list[Value]:
    """broadcast_in_dim, reshape, transpose: the underlying relations move alike."""
    def move(rel: Rel) -> Rel | None:
        (out,) = rule(info, [rel], ctx)
        return out if isinstance(out, Rel) else None

    if isinstance(value, InBlock | BlockIndex):
        rel = move(value.rel)
        return [replace(value, rel=rel) if rel is not None else unsupported(info.name)]
    if isinstance(value, Masked):
        rel, pred_rel = move(value.rel), move(value.pred.rel)
        if rel is None or pred_rel is None:
            return [unsupported(info.name)]
        return [replace(value, rel=rel, pred=replace(value.pred, rel=pred_rel))]
    return [unsupported(info.name)]


def reduce_unit_dims(info: OpInfo, value: Value, ctx: RuleContext) -> Value:
    """all/any over dims of size 1 (XLA's index bounds check) of a mask or index: a reshape."""
    dims = tuple(info.attrs["dimensions"])
    if not isinstance(value, InBlock | BlockIndex) or any(
            value.rel.term.shape[d] != 1 for d in dims):
        return unsupported(info.name)
    rel = freeze(value.rel)
    shape = tuple(s for d, s in enumerate(rel.term.shape) if d not in dims)
    tiling = tuple(t for d, t in enumerate(rel.tiling) if d not in dims)
    return replace(value, rel=replace(rel, term=make_reshape(rel.term, shape), tiling=tiling))


# ----- gather and scatter at the local index ---------------------------------------------------

def gather_shifted(info: OpInfo, operand: Value, indices: Shifted, dims: dict, plain,
                   ctx: RuleContext) -> Value:
    """XLA's lookup into a table split along the indexed dim: ids minus the device's block
    start, clamped by the gather itself. Inside the block the row is the id's own; outside it
    is a clamped row nothing may use (`Masked`, to be zeroed by the mask XLA builds)."""
    x = freeze(indices.rel)
    found = block_offsets(indices.offsets, ctx.mesh, x) if ctx.mesh else None
    if found is None or found[2] != 0 or x.partial:
        return Opaque("gather at ids shifted by a device-dependent offset that is not the "
                      "device's block start", category="wrong_offset")
    axes, length, _ = found
    return gather(info, operand, BlockIndex(x, axes, length), dims, plain, ctx, bounded=False)


def gather(info: OpInfo, operand: Value, indices: BlockIndex, dims: dict, plain,
           ctx: RuleContext, bounded: bool = True) -> Value:
    """A lookup into the device's block of a table split over the index's block axes, at the
    local index: inside the block it is the global lookup at x (`Masked`). `bounded`: the
    index never leaves the block (else the gather's clamping makes the outside unspecified,
    which `Masked` allows)."""
    if not isinstance(operand, Rel) or operand.partial:
        return unsupported(info.name)
    index_map = list(dims["start_index_map"])
    local_operand = info.operand_types[0].shape
    if len(index_map) != 1:
        return unsupported(info.name)
    g = index_map[0]
    low, high = indices.bounds() if bounded else (0, 0)
    if (g not in dims["collapsed_slice_dims"] or operand.tiling[g] != indices.axes
            or local_operand[g] != indices.length or low < 0 or high >= indices.length):
        return Opaque(f"gather at a local index of blocks of {indices.length} over "
                      f"{axes_str(indices.axes)} from dim {g} of an operand "
                      f"{'split over ' + axes_str(operand.tiling[g]) if operand.tiling[g] else 'not split'}"
                      f" with {local_operand[g]} local rows: the index and the table's blocks "
                      "do not match", category="wrong_offset")
    tiling = list(operand.tiling)
    tiling[g] = ()
    (found,) = plain(info, [replace(freeze(operand), tiling=tuple(tiling)), indices.rel], ctx)
    if not isinstance(found, Rel):
        return found
    pred = _block_test_on(indices, found, dims["offset_dims"], dims)
    if pred is None:
        return unsupported(info.name)
    return Masked(found, pred)


def _block_test_on(indices: BlockIndex, like: Rel, window_dims, dims: dict) -> InBlock | None:
    """The index's block test laid out on a gather's result or a scatter's updates (`like`):
    the indices' batch dims are `like`'s dims outside `window_dims`, and the test is constant
    along the window dims."""
    x = indices.rel
    ivd = dims["index_vector_dim"]
    rank = len(x.term.shape)
    batch = [d for d in range(rank) if d != ivd]
    if ivd < rank and x.term.shape[ivd] != 1:
        return None
    term = make_reshape(x.term, tuple(x.term.shape[d] for d in batch))
    positions = [d for d in range(len(like.term.shape)) if d not in window_dims]
    if len(positions) != len(batch):
        return None
    term = make_broadcast(term, tuple(positions), like.term.shape)
    return InBlock.block(Rel(term, like.tiling, scope=like.scope), indices.axes, indices.length)


def scatter(info: OpInfo, operand: Value, indices: BlockIndex, updates: Value, dims: dict,
            kind: str, make_scatter_term, ctx: RuleContext) -> Value:
    """The transpose of `gather`: updates masked to the device's block, scatter-added at the
    local index into the device's block of a table split over the block axes. Updates of
    other blocks are zeros added at row `fill`, so each block is the global scatter-add's.
    Batching dims (take_along_axis) pair operand and indices dims split alike; indices split
    along their other dims (tokens split over dp) leave a partial sum over those axes."""
    to_operand = list(dims["scatter_dims_to_operand_dims"])
    if (kind != "add" or not isinstance(updates, Masked) or not updates.zero
            or not isinstance(operand, Rel) or operand.partial or len(to_operand) != 1):
        return unsupported(info.name)
    g = to_operand[0]
    low, high = indices.bounds()
    if g not in dims["inserted_window_dims"] or info.operand_types[0].shape[g] != \
            indices.length or low < 0 or high >= indices.length:
        return unsupported(info.name)
    pred = _block_test_on(indices, updates.rel, dims["update_window_dims"], dims)
    pred = _aligned(pred, updates.pred.rel, ctx) if pred is not None else None
    if pred is None or not _same_pred(pred, updates.pred):
        return Opaque("scatter of updates masked by another test than the block of its "
                      "indices", category="wrong_offset")
    rel, x = freeze(updates.rel), freeze(indices.rel)
    ivd = dims["index_vector_dim"]
    x_batch = [d for d in range(len(x.term.shape)) if d != ivd]
    window = list(dims["update_window_dims"])
    u_scatter = [d for d in range(len(rel.term.shape)) if d not in window]
    batching = dict(zip(dims["input_batching_dims"], dims["scatter_indices_batching_dims"]))
    operand_window = [d for d in range(len(operand.tiling))
                      if d not in dims["inserted_window_dims"] and d not in batching]
    if (rel.partial or set(rel.tiled_axes + x.tiled_axes) & set(indices.axes)
            or len(u_scatter) != len(x_batch) or len(window) != len(operand_window)
            or any(rel.tiling[u] != x.tiling[i] for u, i in zip(u_scatter, x_batch))):
        return unsupported(info.name)
    want = {g: (indices.length * ctx.mesh.group_size(indices.axes), indices.axes)}
    want.update({o: (x.term.shape[i], x.tiling[i]) for o, i in batching.items()})
    want.update({o: (rel.term.shape[u], rel.tiling[u]) for o, u in zip(operand_window, window)})
    operand = freeze(operand)
    if splat_value(operand.term) is not None:
        shape = tuple(want[d][0] for d in range(len(operand.tiling)))
        tiling = tuple(want[d][1] for d in range(len(operand.tiling)))
        operand = replace(operand, term=make_splat(splat_value(operand.term), shape,
                                                   operand.term.dtype), tiling=tiling)
    if any((operand.term.shape[d], operand.tiling[d]) != want[d]
           for d in range(len(operand.tiling))):
        return unsupported(info.name)
    paired = set(batching.values())
    spread = tuple(a for i in x_batch if i not in paired for a in x.tiling[i])
    if spread and (splat_value(operand.term) != 0 or set(spread) & set(operand.tiled_axes)):
        return unsupported(info.name)
    term = make_scatter_term(operand.term, x.term, rel.term, dims, "add")
    if spread:
        ordered = tuple(a for a in ctx.mesh.names if a in spread)
        return replace(operand, term=term, partial=ordered, kind="sum")
    return replace(operand, term=term)


# ----- device-dependent values between manual computations ----------------------------------

def varying_axes(value: Value, mesh: Mesh) -> frozenset[str]:
    """The mesh axes (of size > 1) along which the local content of a device-dependent value
    may differ between devices: its block axes, the axes its values are split or partial over,
    the axes its offsets change along. A lookup not yet zeroed outside its block
    (`Masked`, not `zero`) holds values nothing describes there: every axis."""
    if isinstance(value, Rel):
        found = value.used_axes()
    elif isinstance(value, InBlock | BlockIndex):
        found = set(value.axes) | varying_axes(value.rel, mesh)
    elif isinstance(value, Masked):
        found = set(mesh.names) if not value.zero else \
            varying_axes(value.rel, mesh) | varying_axes(value.pred, mesh)
    elif isinstance(value, Shifted):
        found = set(varying_axes(value.rel, mesh))
        for device in range(mesh.num_devices):
            coords = mesh.coords(device)
            for axis in mesh.names:
                other = mesh.device({**coords, axis: 0})
                if value.offsets[device] != value.offsets[other]:
                    found.add(axis)
    else:
        found = set(mesh.names)
    return frozenset(a for a in found if mesh.size(a) > 1)
