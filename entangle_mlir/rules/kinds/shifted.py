"""Tensors offset by a device-dependent constant (`Shifted`): jax's `axis_index(...) * n`
broadcast into a tensor, as in sequence-shard positions (`axis_index * S + arange(S)`) and
vocab ranges (`tokens - axis_index * V == arange(V)`).

Only exact rewrites are used: the offset travels with add/subtract/scaling/converts and data
movement, a compare moves it to the other side, and `iota(L) + block_index(A) * L` *is* the
block of the global iota split over A. Anything else is "not supported" (opaque).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from fractions import Fraction

from entangle_mlir.core import precision
from entangle_mlir.core.intrange import value_range
from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.ranges import INT_BITS, fits, int_limits, wrap_integer
from entangle_mlir.core.relations import DeviceScalar, Opaque, Rel, Shifted, Value
from entangle_mlir.core.terms import make_lin, splat_value
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze, iota_dim, splat_rel, widen_iota
from entangle_mlir.rules.kinds import device_blocks

_LINEAR = ("stablehlo.add", "stablehlo.subtract")


def from_scalar(info: OpInfo, value: DeviceScalar, ctx: RuleContext) -> Value:
    """broadcast_in_dim of a device scalar: zeros of the result shape, shifted per device."""
    rtype = info.result_types[0]
    return Shifted(splat_rel(0, rtype.shape, rtype.dtype, ctx), tuple(value.values))


def normalize(value: Shifted, ctx: RuleContext) -> Value:
    """A plain relation where the offsets allow it (all equal, or the blocks of an iota)."""
    offsets = value.offsets
    rel = value.rel
    if len(set(offsets)) == 1:
        return replace(rel, term=make_lin([(Fraction(1), rel.term)], Fraction(offsets[0]),
                                          rel.term.shape, rel.term.dtype))
    found = iota_dim(rel.term)
    if found is None or rel.partial or ctx.mesh is None:
        return value
    dim, factor = found
    if rel.tiling[dim] or dim in rel.poly or not _exact_shift(value):
        return value  # (the global iota holds values that wrap or round on some device)
    local = rel.term.shape[dim]
    free = [a for a in ctx.mesh.names if a not in rel.tiled_axes]
    for count in range(1, len(free) + 1):
        for axes in itertools.permutations(free, count):
            step = factor * local
            if all(offsets[d] == ctx.mesh.block_index(axes, d) * step
                   for d in range(ctx.mesh.num_devices)):
                size = local * ctx.mesh.group_size(axes)
                term = widen_iota(rel.term, dim, size)
                if term is None:
                    return value
                tiling = list(rel.tiling)
                tiling[dim] = axes
                return replace(rel, term=term, tiling=tuple(tiling))
    return value


def elementwise_shifted(info: OpInfo, operands: list[Value], ctx: RuleContext,
                        plain) -> list[Value]:
    """An elementwise op with a Shifted operand; `plain` is the ordinary elementwise rule."""
    name = info.name
    unsupported = [Opaque(f"device-dependent offset tensor used by {name} (not supported "
                          "yet)", category="unsupported")]
    if any(isinstance(v, (DeviceScalar, Opaque)) for v in operands):
        return unsupported
    if name == "stablehlo.select" and len(operands) == 3 and isinstance(operands[0], Shifted):
        return [device_select(info, operands, ctx, plain)]
    if name == "stablehlo.convert" and (info.result_types[0].is_int or (
            info.result_types[0].is_float
            and not precision.rounds(info.operand_types[0].dtype, info.result_types[0].dtype))):
        (x,) = operands
        offsets = _converted_offsets(info, x)
        if offsets is None:
            return [Opaque(f"convert {info.operand_types[0].dtype} -> "
                           f"{info.result_types[0].dtype} of a value plus a device offset "
                           "that the new type may not hold exactly (it may wrap around or "
                           "round; not proven)", category="unsupported")]
        inner = plain(info, [x.rel], ctx)
        return _wrap(inner, offsets, ctx)
    if name in _LINEAR and len(operands) == 2:
        a, b = operands
        sign = -1 if name == "stablehlo.subtract" else 1
        rels = [v.rel if isinstance(v, Shifted) else v for v in (a, b)]
        offsets = [v.offsets if isinstance(v, Shifted) else None for v in (a, b)]
        inner = plain(info, rels, ctx)
        total = tuple(
            (offsets[0][d] if offsets[0] else 0) + sign * (offsets[1][d] if offsets[1] else 0)
            for d in range(len(next(o for o in offsets if o))))
        return _wrap(inner, total, ctx)
    if name == "stablehlo.multiply" and len(operands) == 2:
        a, b = operands
        shifted, other = (a, b) if isinstance(a, Shifted) else (b, a)
        factor = splat_value(other.term) if isinstance(other, Rel) else None
        if isinstance(other, Shifted) or not isinstance(factor, Fraction):
            return unsupported
        inner = plain(info, [shifted.rel, other] if shifted is a else [other, shifted.rel], ctx)
        return _wrap(inner, tuple(o * factor for o in shifted.offsets), ctx)
    if name in device_blocks.CLIPS:
        return [device_blocks.clip(info, operands, ctx) or unsupported[0]]
    if name == "stablehlo.compare" and len(operands) == 2:
        a, b = operands
        if isinstance(a, Shifted) and isinstance(b, Shifted):
            return unsupported
        shifted, other = (a, b) if isinstance(a, Shifted) else (b, a)
        if isinstance(other, Rel) and splat_value(other.term) is not None:
            # the device computed `x + offset` in the dtype: a test of the wrapped sum
            test = device_blocks.compare_shifted(info, shifted, other, shifted is a, ctx,
                                                 wrapped=True)
            if test is not None:
                return [test]
        # x + c == y iff x == y - c in wrapped arithmetic too (adding c is a bijection mod
        # 2^N); an order compare moves the offset only where nothing wraps
        ordered = info.attrs.get("comparison_direction") not in ("EQ", "NE")
        wrapping = next((v for v in operands if isinstance(v, Shifted) and may_wrap(v)), None)
        if ordered and wrapping is not None:
            return [Opaque(f"compare of {wrapping.rel.term.dtype} values plus a device offset "
                           "that may wrap around (the order of wrapped values is not the "
                           "order of the values; not proven)", category="unsupported")]
        shifted, other = (a, b) if isinstance(a, Shifted) else (b, a)
        opposite = Shifted(other, tuple(-o for o in shifted.offsets))
        moved = normalize(opposite, ctx)
        if ordered and isinstance(moved, Rel) and splat_value(moved.term) is None and \
                may_wrap(opposite):
            # compare(x + c, y) is compare(x, y - c) only where y - c does not wrap
            return [Opaque(f"compare moves a device offset onto {other.term.dtype} values "
                           "where it may wrap around (not proven)", category="unsupported")]
        pair = [shifted.rel, moved] if shifted is a else [moved, shifted.rel]
        if any(isinstance(v, Shifted) for v in pair):
            shifted = a if isinstance(a, Shifted) else b
            wrong = _wrong_iota_offsets(shifted, ctx)
            if wrong is not None:
                return [wrong]
            first = isinstance(pair[0], Shifted)
            moved_x, other = (pair[0], pair[1]) if first else (pair[1], pair[0])
            test = device_blocks.compare_shifted(info, moved_x, other, first, ctx) if isinstance(
                other, Rel) else None
            return [test or _ring_step_compare(name, shifted, ctx)
                    or _diagonal_entry(info, moved_x, other, ctx) or unsupported[0]]
        return plain(info, pair, ctx)
    return unsupported


def device_select(info: OpInfo, operands: list[Value], ctx: RuleContext, plain) -> Value:
    """select on a per-device predicate (`broadcast(partition_id != 0)`):

    * both branches the same value: that value;
    * the predicate the same on every device: the branch it picks;
    * one branch zero, the other a value R that does not use axes A, where every group of
      devices differing only on A keeps R on exactly one device (XLA keeps a scatter-add's
      operand on one device so that the all_reduce counts it once): a partial sum of R over A.
    """
    pred, on_true, on_false = operands
    unsupported = Opaque("select on a device-dependent predicate that keeps a value on no "
                         "single device of any group of mesh axes (not supported)",
                         category="unsupported")
    if pred.rel.term.op != "splat" or splat_value(pred.rel.term) != 0 or not all(
            isinstance(v, Rel) for v in (on_true, on_false)) or ctx.mesh is None:
        return unsupported
    if on_true.term is on_false.term and (on_true.tiling, on_true.partial) == (
            on_false.tiling, on_false.partial):
        return freeze(on_true) if on_true.poly != on_false.poly else on_true
    keep = [bool(v) for v in pred.offsets]
    if all(keep) or not any(keep):
        return on_true if all(keep) else on_false
    zero_true = splat_value(on_true.term) == 0
    zero_false = splat_value(on_false.term) == 0
    if zero_true == zero_false:
        return unsupported
    value = on_false if zero_true else on_true
    kept = [not k for k in keep] if zero_true else keep
    mesh = ctx.mesh
    varying = [a for a in mesh.names if any(
        kept[d] != kept[mesh.device({**mesh.coords(d), a: 0})] for d in range(mesh.num_devices))]
    if value.partial or set(varying) & set(value.tiled_axes) or not varying:
        return unsupported
    groups: dict[tuple, int] = {}
    for d in range(mesh.num_devices):
        coords = mesh.coords(d)
        key = tuple(coords[a] for a in mesh.names if a not in varying)
        groups[key] = groups.get(key, 0) + kept[d]
    if any(count != 1 for count in groups.values()):
        return unsupported
    value = freeze(value)
    axes = tuple(a for a in mesh.names if a in varying)
    return replace(value, partial=axes, kind="sum", partial_origin=info)


def _wrong_iota_offsets(value: Shifted, ctx: RuleContext) -> Opaque | None:
    """An iota plus per-device offsets that are almost, but not, the block offsets of some mesh
    axes (a wrong entry in the offset table a padding mask is built from): which device
    numbers its block from where, and where it should."""
    mesh = ctx.mesh
    best = None
    for dim, step, axes in _iota_offset_candidates(value, ctx):
        expected = [mesh.block_index(axes, d) * step for d in range(mesh.num_devices)]
        bad = [d for d in range(mesh.num_devices) if value.offsets[d] != expected[d]]
        if best is None or len(bad) < len(best[3]):
            best = (dim, step, axes, bad, expected)
    if best is None or not best[3] or len(best[3]) * 2 > mesh.num_devices:
        return None
    dim, step, axes, bad, expected = best
    device = bad[0]
    return Opaque(f"device-dependent offset is wrong along dim {dim}: device {device} numbers "
                  f"its block from {value.offsets[device]} instead of {expected[device]} "
                  f"(expected offset = {step} * axis_index({', '.join(axes)}))",
                  category="wrong_offset")


def ring_step_hops(value: Shifted, ctx: RuleContext) -> tuple[int, tuple[str, ...], int] | None:
    """(dim, axes, hops) when `value` is an iota plus the block offsets of the block `hops`
    devices back along `axes` (`((me - hops) % n) * B + arange(B)`: the positions of the K/V
    block a ring has passed `hops` times), hops in [1, n); else None."""
    mesh = ctx.mesh
    for dim, step, axes in _iota_offset_candidates(value, ctx):
        size = mesh.group_size(axes)
        for hops in range(1, size):
            if all(value.offsets[d] == (mesh.block_index(axes, d) - hops) % size * step
                   for d in range(mesh.num_devices)):
                return dim, axes, hops
    return None


def _iota_offset_candidates(value: Shifted, ctx: RuleContext):
    """(dim, step, axes) for an iota plus per-device offsets along `dim`: `step` is the block
    length the offsets would count in, `axes` every ordered choice of mesh axes the iota is not
    split over (the axes the offsets could number blocks along)."""
    found = iota_dim(value.rel.term)
    if found is None or ctx.mesh is None or value.rel.partial:
        return
    dim, factor = found
    step = factor * value.rel.term.shape[dim]
    free = [a for a in ctx.mesh.names if a not in value.rel.tiled_axes]
    for count in range(1, len(free) + 1):
        for axes in itertools.permutations(free, count):
            yield dim, step, axes


def _ring_step_compare(name: str, value: Shifted, ctx: RuleContext) -> Opaque | None:
    """The reason a compare of one ring step's key positions with the (split) query positions
    is not related: each device holds the mask block at (its own block, the block `hops` back),
    off the diagonal of a layout; only the online softmax's fold relates per-step blocks (as
    all the keys in a per-device order, `rules/kinds/reordered.py`), and a backward reads them step
    by step."""
    found = ring_step_hops(value, ctx)
    if found is None:
        return None
    dim, axes, hops = found
    size = ctx.mesh.group_size(axes)
    return Opaque(f"{name} of the key positions of ring step {hops} (block (me - {hops}) % "
                  f"{size} along dim {dim} over {axes_str(axes)}) with positions split "
                  "another way: one ring step's block of the mask, not folded into the online "
                  "softmax over all the keys (read step by step, as by the ring's backward); "
                  "not supported yet", category="unsupported")


def _diagonal_entry(info: OpInfo, moved: Value, other: Value, ctx: RuleContext
                    ) -> Opaque | None:
    """The reason `x == L*b + i` is not related when x is itself split over the axes of b
    (dense expert parallelism around a ring of token blocks: each device tests its own token
    block against its own experts): entry i of each device's block of one_hot(x) on the
    device's own block of x, a block on the diagonal of two dims split over one axis, which
    no layout holds. None: not such a test."""
    if info.attrs.get("comparison_direction") != "EQ" or not isinstance(moved, Shifted) or \
            not isinstance(other, Rel) or ctx.mesh is None:
        return None
    x = moved.rel
    value = splat_value(other.term)
    k = int(value) if isinstance(value, Fraction) and value.denominator == 1 else None
    unsplit = replace(x, tiling=((),) * len(x.tiling))
    found = device_blocks.block_offsets(moved.offsets, ctx.mesh, unsplit)
    if k is None or found is None or not set(found[0]) <= set(x.tiled_axes):
        return None
    axes, length, start = found
    entry = start + k
    if not 0 <= entry < length:
        return None
    dims = [d for d, t in enumerate(x.tiling) if set(t) & set(axes)]
    names = ", ".join(axes)
    return Opaque(f"the mask tests x == {length}*axis_index({names}) + {entry} where x is "
                  f"split over {axes_str(axes)} along dim {dims[0]}: entry {entry} of each "
                  f"device's block of one_hot(x) on the device's own block of x, a block on "
                  "the diagonal of two dims split over one axis (dense expert parallelism "
                  "around a ring of token blocks); relating such blocks is not supported yet",
                  category="unsupported")


def _converted_offsets(info: OpInfo, x: Shifted) -> tuple | None:
    """The offsets of `convert(x)` as a Shifted of the converted `x.rel`, or None when the
    convert does not commute with adding them. A narrowing (or same-width) integer convert
    is a ring morphism mod 2^N -> mod 2^M: the offsets wrap into the new type. Any other
    convert of integers commutes only where no device's value wraps and every value is exact
    in the new type; float -> float as the plain convert rule decides."""
    source, target = info.operand_types[0], info.result_types[0]
    if source.is_float:
        return x.offsets if target.is_float else None
    if target.is_int and INT_BITS.get(target.dtype, 0) <= INT_BITS.get(source.dtype, 0):
        return tuple(wrap_integer(int(o), target.dtype) for o in x.offsets)
    found = value_range(x.rel.term)
    if found is None or may_wrap(x):
        return None
    low, high = found[0] + min(x.offsets), found[1] + max(x.offsets)
    return x.offsets if fits(low, high, target.dtype) else None


def _exact_shift(value: Shifted) -> bool:
    """Every device's `rel + offset` is computed exactly in the dtype (no wrap, no rounding)."""
    found = value_range(value.rel.term)
    return found is not None and fits(found[0] + min(value.offsets),
                                      found[1] + max(value.offsets), value.rel.term.dtype)


def may_wrap(value: Shifted) -> bool:
    """Some device's `rel + offset` may leave the range of its integer dtype (wrap around):
    an order comparison of it is then not the comparison of the values."""
    dtype = value.rel.term.dtype
    if int_limits(dtype) is None:
        return False
    found = value_range(value.rel.term)
    if found is None:
        return True
    low, high = min(value.offsets), max(value.offsets)
    return not fits(found[0] + low, found[1] + high, dtype)


def _wrap(inner: list[Value], offsets: tuple, ctx: RuleContext) -> list[Value]:
    (value,) = inner
    if not isinstance(value, Rel):
        return inner
    return [normalize(Shifted(value, tuple(offsets)), ctx)]


def moved(info: OpInfo, value: Shifted, rule, ctx: RuleContext) -> list[Value]:
    """Data movement (broadcast, reshape, transpose) carries the per-device offset along."""
    inner = rule(info, [value.rel], ctx)
    return _wrap(inner, value.offsets, ctx)

