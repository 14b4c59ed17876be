"""Relations between sharded values and reference terms.

A sharded SSA value gets one of:

* `Rel(term, tiling, partial, kind, poly)`: on device c, reducing the value with `kind` (sum,
  max or min; on booleans max is or and min is and: any / all over a split dim) over the
  devices that differ from c only on the `partial` axes gives block(term, c), where dim i of the
  global `term` is split by the mesh axes `tiling[i]` (major first) and every other axis
  replicates it. `poly` dims were created or widened by a broadcast at the local shape: they take
  the global size and tiling of the value they are combined with.
* `DeviceScalar(values)`: a device-dependent integer scalar, tabulated over all devices.
* `Shifted(rel, offsets)`, `Permuted(rel, sources)`, `Windowed(rel, dim, offset, length)`: a
  Rel plus per-device constants, a Rel with its blocks on other devices, rows of a split dim
  off each device's own block.
* `Reordered(rel, dim, orders)`: a Rel whose blocks along one dim are in a device-dependent
  order (blocks received around a ring, concatenated in arrival order).
* `Returning(rel, dim, blocks, sources)`: pieces of a partial sum on their way back to the
  owners of their blocks (a ring's reverse collective_permutes).
* `InBlock`, `BlockIndex`, `Masked`: a per-device range test of an integer tensor, the index
  inside the device's block, a value defined only where such a test holds (vocab-parallel
  masks, `rules/kinds/device_blocks.py`).
* `Opaque(reason, origin)`: no relation fits; `origin` is the op where the relation was lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from entangle_mlir.core import intervals
from entangle_mlir.core.mesh import Mesh, axes_str
from entangle_mlir.core.ranges import int_limits
from entangle_mlir.core.terms import Term, make_op, make_splat, pretty

GLOBAL = "global"


@dataclass(frozen=True)
class Rel:
    term: Term
    tiling: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    kind: str = ""
    poly: frozenset[int] = field(default=frozenset())
    scope: str = ""
    partial_origin: object = field(default=None, compare=False)

    @property
    def is_global(self) -> bool:
        """A value outside any manual computation: a whole global tensor, no devices."""
        return self.scope == GLOBAL

    @property
    def tiled_axes(self) -> tuple[str, ...]:
        return tuple(a for axes in self.tiling for a in axes)

    @property
    def is_replicated(self) -> bool:
        return not self.tiled_axes and not self.partial

    def used_axes(self) -> set[str]:
        return set(self.tiled_axes) | set(self.partial)

    def local_shape(self, mesh: Mesh) -> tuple[int, ...]:
        return tuple(size // mesh.group_size(axes) for size, axes in zip(self.term.shape,
                                                                          self.tiling))

    def with_term(self, term: Term) -> Rel:
        return replace(self, term=term)

    def layout_str(self) -> str:
        if self.is_global:
            return "global"
        parts = []
        if self.tiled_axes:
            dims = ", ".join("{" + ", ".join(axes) + "}" for axes in self.tiling)
            parts.append(f"tile [{dims}]")
        if self.partial:
            parts.append(f"partial {self.kind} {{{', '.join(self.partial)}}}")
        return " ".join(parts) or "replicated"

    def describe(self) -> str:
        return f"{self.layout_str()} : {pretty(self.term)}"


@dataclass(frozen=True)
class DeviceScalar:
    """An integer scalar whose value depends on the device: `values[d]` on device d."""

    values: tuple[int, ...]
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        shown = list(self.values[:16])
        more = ", ..." if len(self.values) > 16 else ""
        return f"device scalar [{', '.join(map(str, shown))}{more}]"


@dataclass(frozen=True)
class Shifted:
    """A tensor that is `rel` plus a device-dependent constant: on device d the local value is
    local(rel) + offsets[d] (jax's `axis_index(...) * n` broadcast into a tensor). Added to an
    iota whose blocks it offsets, it becomes a split global iota (positions of a sequence shard,
    vocab ranges)."""

    rel: Rel
    offsets: tuple

    def describe(self) -> str:
        shown = ", ".join(str(o) for o in self.offsets[:16])
        more = ", ..." if len(self.offsets) > 16 else ""
        return f"{self.rel.describe()} + device offsets [{shown}{more}]"


@dataclass(frozen=True)
class Permuted:
    """Blocks of a split value moved between devices by collective_permute in an order that is
    not a roll: device d holds the block `rel` places on device `sources[d]`. A further permute
    composes with it (a permute and its inverse give `rel` back); any other use is an error,
    `reason`, at the permute that made it (`origin`)."""

    rel: Rel
    sources: tuple[int, ...]
    reason: str = ""
    origin: object = field(default=None, compare=False)

    def describe(self) -> str:
        shown = ", ".join(str(s) for s in self.sources[:16])
        more = ", ..." if len(self.sources) > 16 else ""
        return f"{self.rel.describe()} with blocks from devices [{shown}{more}]"


@dataclass(frozen=True)
class Windowed:
    """Rows of a split dim at an offset from each device's own block (XLA's halo exchanges):
    along `dim`, device d holds rows `b*B + offset + [0, length)` (modulo the global size) of
    `rel`'s term, b being its block index over `rel.tiling[dim]` and B the block size; the other
    dims are as in `rel`. Slices of the local block make them, collective_permutes move them,
    concatenation joins neighbouring ones; a window of B rows is a roll of the global tensor.
    Any other use is an error, `reason`, at the op that made it (`origin`).

    Zero-extended: rows that are `holes` hold zeros. When exactly the rows outside [0, N) of
    the unwrapped positions are zeros, the window is rows of the tensor zero-padded (a pad
    adds such rows; reading them is a block of the padded tensor). A window along a dim `rel`
    does not split (B = N) is the zero-padded tensor itself on every device (a pad of a
    replicated dim: see rules/kinds/window.py `padded_window`)."""

    rel: Rel
    dim: int
    offset: int
    length: int
    reason: str = ""
    origin: object = field(default=None, compare=False)
    holes: tuple[tuple[int, int, int], ...] = ()
    """(device, start, stop): local rows that hold zeros instead (a collective_permute gave
    that device nothing, as at the ends of a non-cyclic halo exchange)."""
    starts: tuple[int, ...] = ()
    """Per device, the window's first row, when the windows are not one offset from every
    device's block (XLA routes each device's rows from whichever device holds them, point to
    point, and picks them with selects on the device id); `offset` is then unused."""
    summed: tuple[int, ...] = ()
    """Dims of `rel`'s term (`dim` among them) summed out: each device holds the sum of its
    window's rows over these dims (a micro-batch's loss; sums of complementary windows add up
    to the sum of the block, a partial sum)."""

    def describe(self) -> str:
        if is_padded(self):
            return padded_rel(self).describe()
        zeros = f", zeros on devices {sorted({d for d, _, _ in self.holes})}" if self.holes else ""
        rows = (f"rows [b*B + {self.offset}, b*B + {self.offset + self.length}) of dim "
                f"{self.dim}{zeros}")
        if self.starts:
            shown = ", ".join(str(s) for s in self.starts[:16])
            rows = (f"rows [s, s + {self.length}) of dim {self.dim} from s = [{shown}] per "
                    f"device{zeros}")
        if self.summed == (self.dim,) and self.length == 1 and not self.holes and \
                not self.starts:
            return (f"{self.rel.layout_str()} : entry b*B + {self.offset} of dim {self.dim} "
                    f"of {pretty(self.rel.term)}")
        if self.summed:
            return (f"{self.rel.layout_str()} : sum over dims {list(self.summed)} of "
                    f"{pretty(self.rel.term)} {rows}")
        return f"{self.rel.describe()} {rows}"


def is_padded(window: Windowed) -> bool:
    """A window along a dim its relation does not split: the zero-padded tensor on every
    device (`rules/kinds/window.py` `padded_window`)."""
    return not window.rel.tiling[window.dim]


def padded_rel(window: Windowed) -> Rel:
    """The relation a zero-padded window stands for: the padded tensor (as the pad rule
    builds it). Here, not with the window rules, because describing such a window shows it."""
    total = window.rel.term.shape[window.dim]
    low = -window.offset
    high = window.length - total - low
    return replace(window.rel, term=zero_pad(window.rel.term, window.dim, low, high))


def zero_pad(term: Term, dim: int, low: int, high: int) -> Term:
    """`term` padded with zeros along `dim` (as the pad rule builds it)."""
    rank = len(term.shape)
    shape = tuple(n + low + high if d == dim else n for d, n in enumerate(term.shape))
    return make_op("pad", (term, make_splat(0, (), term.dtype)), (
        tuple(low if d == dim else 0 for d in range(rank)),
        tuple(high if d == dim else 0 for d in range(rank)), (0,) * rank), shape, term.dtype,
        linear_in=0)


@dataclass(frozen=True)
class Reordered:
    """`rel` (not split along `dim`) with the blocks of `dim` in a device-dependent order: cut
    along `dim` into `len(orders[d])` equal blocks, device d holds block `orders[d][j]` at
    position j (the other dims as `rel` says). Concatenating the blocks a ring passes around
    in arrival order makes it (ring attention's K, V and key positions). A sum or a max over
    `dim`, and a contraction of `dim` with a value in the same order, do not depend on the
    order (`rules/kinds/reordered.py`); a mismatch of orders is an error, `reason`, at `origin` (the
    collective_permute that brought the blocks)."""

    rel: Rel
    dim: int
    orders: tuple[tuple[int, ...], ...]
    reason: str = ""
    origin: object = field(default=None, compare=False)
    pieces: object = field(default=None, compare=False)
    """A partial `rel` (a contraction of the split dim with a value in this order, ring
    attention's dK/dV over all the steps): device d's local value is its piece of the partial
    sum with the blocks of `dim` in `orders[d]` (un-reordered, the pieces add up over the group
    to the block). `pieces` names the SSA value the pieces are (the walk's record of the op
    that made it: a slice of it keeps them, `Returning`)."""

    def describe(self) -> str:
        shown = "; ".join(str(list(o)) for o in self.orders[:8])
        more = "; ..." if len(self.orders) > 8 else ""
        return (f"{self.rel.describe()} with the blocks of dim {self.dim} in the order "
                f"[{shown}{more}] per device")


@dataclass(frozen=True)
class Returning:
    """Pieces of a partial sum on their way back to the owners of their blocks (ring
    attention's dK/dV around the reverse ring). `rel` is a partial sum over `rel.partial` of T,
    not split along `dim`; device q's piece p_q is its local value of the partial value
    `pieces` names (a `Reordered` partial value, un-reordered), cut along `dim` into n equal
    blocks (n the partial group's size). Device d holds the sum over q in `sources[d]` of
    block `blocks[d]` of p_q. A slice of one block of the partial value makes it (sources
    {d}), a collective_permute moves it (device d takes its source's blocks and sources), an
    add of two with the same blocks and disjoint sources joins them; when every device holds
    the sum over its whole group at its own block index, it is T split along `dim` over the
    partial axes (`rules/kinds/returning.py`)."""

    rel: Rel
    dim: int
    blocks: tuple[int, ...]
    sources: tuple[frozenset[int], ...]
    pieces: object = field(default=None, compare=False)

    def describe(self) -> str:
        shown = "; ".join(f"block {b} of {sorted(s)}" for b, s in zip(self.blocks[:8],
                                                                       self.sources[:8]))
        more = "; ..." if len(self.blocks) > 8 else ""
        return (f"{self.rel.describe()}: pieces of the partial sum along dim {self.dim} per "
                f"device [{shown}{more}] (not every contribution at its owner yet)")


@dataclass(frozen=True)
class InBlock:
    """An integer tensor `rel` (x, the same on every device of `axes`) tested against the
    device's block of a range cut into blocks of `length` along `axes` (a vocab-parallel shard's
    token range): on device d with block index b, the boolean `x - b*length in ranges`, in
    exact integer arithmetic (`core/intervals.py`: a union of intervals [lo, hi), None
    unbounded). `(x < start) | (x >= start + V_local)` is the complement of the block [0,
    length); a test of a difference computed in the dtype, which may wrap around, is stated by
    the exact values it accepts (`rules/kinds/device_blocks.compare_shifted`)."""

    rel: Rel
    axes: tuple[str, ...]
    length: int
    ranges: intervals.Ranges
    origin: object = field(default=None, compare=False)  # the op that built the test

    @classmethod
    def block(cls, rel: Rel, axes: tuple[str, ...], length: int) -> InBlock:
        """'x is in the device's own block'."""
        return cls(rel, axes, length, ((0, length),))

    @property
    def inside(self) -> bool:
        """Exactly 'x is in the device's own block'."""
        return self.ranges == ((0, self.length),)

    @property
    def outside(self) -> bool:
        """Exactly 'x is outside the device's own block'."""
        return self.ranges == intervals.complement(((0, self.length),))

    @property
    def is_block(self) -> bool:
        """Exactly 'x is in the device's own block' or exactly 'outside it'."""
        return self.inside or self.outside

    def describe(self) -> str:
        test = intervals.describe(self.ranges,
                                  f"x - {self.length}*axis_index({', '.join(self.axes)})")
        return f"{test} for x = {self.rel.describe()}"


@dataclass(frozen=True)
class BlockIndex:
    """The index of x (`rel`) inside the device's block of a range cut into blocks of `length`
    along `axes`, or `fill` where x is outside the block, plus `add`: on device d with block
    index b, `(x - b*length if 0 <= x - b*length < length else fill) + add` (Megatron's
    `where(outside, 0, tokens - start)`). With `clamp` = (lo, hi) the value is instead
    `clamp(x - b*length, lo, hi) + add`, the difference computed in x's dtype (it may wrap
    around) and clamped (None: not on that side): `clip(ids - start, 0, V_local - 1)`. The
    clamp never cuts the block (lo <= 0, hi >= length - 1), so inside it both forms are
    `x - b*length + add`."""

    rel: Rel
    axes: tuple[str, ...]
    length: int
    fill: int = 0
    add: int = 0
    clamp: tuple[int | None, int | None] | None = None

    def bounds(self) -> tuple[int, int]:
        """The smallest and largest value on any device."""
        if self.clamp is not None:
            limits = int_limits(self.rel.term.dtype)
            assert limits is not None, "a block index is an integer"
            lo, hi = self.clamp
            return ((int(limits[0]) if lo is None else lo) + self.add,
                    (int(limits[1]) if hi is None else hi) + self.add)
        return min(0, self.fill) + self.add, max(self.length - 1, self.fill) + self.add

    def describe(self) -> str:
        plus = f" + {self.add}" if self.add else ""
        diff = f"x - {self.length}*axis_index({', '.join(self.axes)})"
        if self.clamp is not None:
            lo, hi = ("" if end is None else end for end in self.clamp)
            return f"clamp({diff}, {lo}, {hi}){plus} for x = {self.rel.describe()}"
        return f"({diff} inside the block, else {self.fill}){plus} for x = {self.rel.describe()}"


@dataclass(frozen=True)
class Masked:
    """`rel`'s local value where the device predicate `pred` holds; elsewhere zeros (`zero`)
    or values nothing may depend on (a gather at the clamped local index of a token outside
    the device's vocab block). `pred.rel` has the value's shape."""

    rel: Rel
    pred: InBlock
    zero: bool = False
    origin: object = field(default=None, compare=False)  # the op that made the value

    def describe(self) -> str:
        other = "zeros" if self.zero else "unspecified values"
        return f"{self.rel.describe()} where {self.pred.describe()}, else {other}"


@dataclass(frozen=True)
class Opaque:
    """The relation to the reference is lost: `reason` in a training engineer's words."""

    reason: str
    origin: object = None
    category: str = "unrelated"

    def describe(self) -> str:
        return f"opaque: {self.reason}"


Value = (Rel | DeviceScalar | Shifted | Permuted | Windowed | Reordered | Returning | InBlock
         | BlockIndex | Masked | Opaque)

DEVICE_BLOCK_VALUES = (InBlock, BlockIndex, Masked)
"""Values whose local content depends on the device's block index beyond a tiling."""


def layout_words(rel: Rel) -> str:
    """The layout in words: 'split along dim 1 over 'tp'', 'a partial sum over 'tp''."""
    parts = []
    for dim, axes in enumerate(rel.tiling):
        if axes:
            parts.append(f"split along dim {dim} over {axes_str(axes)}")
    if rel.partial:
        parts.append(f"a partial {rel.kind} over {axes_str(rel.partial)}")
    return " and ".join(parts) or "replicated"
