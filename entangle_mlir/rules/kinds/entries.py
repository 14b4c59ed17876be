"""One entry of each device's block: device b holds `R[b*B + i]` along one dim of a reference
tensor R split in blocks of B over mesh axes (`Windowed` of one row, summed over that row:
the row, its dim dropped). Dense expert parallelism applies its local experts one at a time:

    first = axis_index('ep') * E_local
    for i in range(E_local):                                  # unrolled by jax
        chosen = sum(w * (ids == first + i), -1)              # entry i of one_hot(ids) . w
        out += chosen[:, None] * mlp(x, wi[i])                # entry i of the expert outputs
    psum_scatter(out)                                         # the sum over every expert

* `ids == b*B + i` (an `InBlock` test of the one value i inside the block) is entry i of the
  block of `one_hot(ids)` over all the blocks (`mask_entry`); `wi[i]` (a slice of one row of
  the local block, then a reshape dropping it) is entry i of wi (`squeezed`);
* elementwise ops, reduces over other dims and dot_generals of entries at the same index (and
  of values that do not depend on it) are that entry of the op applied to the tensors:
  taking one index commutes with all of them, and two entries of one index contracted
  together are that index of the dot_general batching their dims;
* entries at consecutive indices of one tensor add up (`window.add_window_sums`): all B of
  them are the block's sum, a partial sum over the axes (the loop re-rolled into the block).

Every step is an exact identity of each device's local value, which the Z3 instance layer
checks like any window (instance.local_values._window_rows)."""

from __future__ import annotations

from dataclasses import replace

from entangle_mlir.core.relations import (
    InBlock,
    Masked,
    Opaque,
    Rel,
    Value,
    Windowed,
    is_padded,
)
from entangle_mlir.core.terms import (
    make_broadcast,
    make_elementwise,
    make_iota,
    make_splat,
    make_transpose,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import freeze
from entangle_mlir.rules.kinds.window import block_rows, is_entry, sum_out


def entry_reason(window: Windowed) -> str:
    rel, dim = window.rel, window.dim
    axes = ", ".join(rel.tiling[dim])
    return (f"entry {window.offset} of each device's block of dim {dim} (split over {axes}) "
            "alone: one step of a loop over the block's entries, whose other steps are never "
            "added")


def make_entry(rel: Rel, dim: int, index: int) -> Windowed:
    """Entry `index` of each device's block of `rel`'s dim `dim`."""
    window = Windowed(rel, dim, index, 1, summed=(dim,))
    return replace(window, reason=entry_reason(window))


def mask_entry(pred: InBlock, ctx: RuleContext) -> Windowed | None:
    """`x == b*L + i` with 0 <= i < L (an `InBlock` accepting the one difference i): entry i of
    each device's block of `one_hot(x)`, the compare of x broadcast along a new last dim of
    L * |axes| classes with their iota. None: not such a test."""
    if ctx.mesh is None or len(pred.ranges) != 1:
        return None
    lo, hi = pred.ranges[0]
    if lo is None or hi != lo + 1 or not 0 <= lo < pred.length:
        return None
    x = freeze(pred.rel)
    if x.partial or set(x.tiled_axes) & set(pred.axes):
        return None
    rank = len(x.term.shape)
    shape = (*x.term.shape, pred.length * ctx.mesh.group_size(pred.axes))
    widened = make_broadcast(x.term, tuple(range(rank)), shape)
    term = make_elementwise("stablehlo.compare",
                            (widened, make_iota(shape, rank, x.term.dtype)), ("EQ",), "i1")
    return make_entry(Rel(term, (*x.tiling, pred.axes), (), "", frozenset(), x.scope), rank, lo)


def masked_entry(value: Masked, ctx: RuleContext) -> Windowed | None:
    """`where(x == b*L + i, v, 0)` (a `Masked` value, zeros outside a one-value test; with L
    = 1 the test is the device's whole block): entry i of each device's block of
    `where(one_hot(x), v, 0)`, v broadcast along the classes. None: not such a value."""
    hot = mask_entry(value.pred, ctx) if value.zero else None
    v = freeze(value.rel)
    if hot is None or v.partial or set(v.tiled_axes) & set(value.pred.axes) or \
            v.term.shape != value.pred.rel.term.shape:
        return None
    at, size, axes = hot.dim, hot.rel.term.shape[hot.dim], value.pred.axes
    spread = _spread(v, at, size, axes)
    if spread.tiling != hot.rel.tiling:
        return None
    zero = make_splat(0, spread.term.shape, v.term.dtype)
    term = make_elementwise("stablehlo.select", (hot.rel.term, spread.term, zero), (),
                            v.term.dtype)
    return make_entry(replace(spread, term=term, poly=frozenset()), at, hot.offset)


def lift_masks(operands: list[Value], ctx: RuleContext) -> list[Value] | None:
    """The operands with every one-value block test as its one-hot entry (`mask_entry`) and
    every value masked by one (`masked_entry`), when that leaves only entries and plain
    relations; else None."""
    out = []
    for v in operands:
        if isinstance(v, InBlock):
            v = mask_entry(v, ctx)
        elif isinstance(v, Masked):
            v = masked_entry(v, ctx)
        if not isinstance(v, Rel | Windowed):
            return None
        out.append(v)
    return out if any(isinstance(v, Windowed) for v in out) else None


def squeezed(info: OpInfo, window: Windowed) -> Windowed | None:
    """A reshape that drops the one-row dim of a window of one row (`w[i]`: a slice of the
    local block, then the reshape): entry `offset` of the block. None: another reshape."""
    if info.name != "stablehlo.reshape" or window.length != 1 or window.summed or \
            window.holes or window.starts or window.rel.partial or is_padded(window):
        return None
    local_in, local_out = info.operand_types[0].shape, info.result_types[0].shape
    dim = window.dim
    if tuple(local_in[:dim]) + tuple(local_in[dim + 1:]) != tuple(local_out):
        return None
    entry = make_entry(window.rel, dim, window.offset)
    return replace(entry, reason=window.reason or entry.reason, origin=window.origin)


def _geometry(window: Windowed) -> tuple:
    rel = window.rel
    return window.offset, rel.tiling[window.dim], rel.term.shape[window.dim]


def _entries(operands: list[Value]) -> list[Windowed] | None:
    """The entries among `operands`, when every window is an entry at one index of blocks of
    one size over the same axes and every other operand a plain relation not split over those
    axes (it is broadcast along the entries' dim, which they split); else None."""
    windows = [v for v in operands if isinstance(v, Windowed)]
    if not windows or not all(is_entry(w) for w in windows) or any(
            not isinstance(v, Rel | Windowed) or isinstance(v, Rel) and v.partial
            for v in operands):
        return None
    if len({_geometry(w) for w in windows}) != 1:
        return None
    axes = set(windows[0].rel.tiling[windows[0].dim])
    if any(set(v.tiled_axes) & axes for v in operands if isinstance(v, Rel)):
        return None
    return windows


def _with_dim(shape: tuple[int, ...], at: int, size: int) -> tuple[int, ...]:
    return (*shape[:at], size, *shape[at:])


def _moved(rel: Rel, dim: int, at: int) -> Rel:
    """`rel` with its dim `dim` moved to `at`, the others in order."""
    rest = [k for k in range(len(rel.term.shape)) if k != dim]
    perm = (*rest[:at], dim, *rest[at:])
    return replace(rel, term=make_transpose(rel.term, perm),
                   tiling=tuple(rel.tiling[k] for k in perm),
                   poly=frozenset(perm.index(k) for k in rel.poly))


def _spread(rel: Rel, at: int, size: int, axes: tuple[str, ...]) -> Rel:
    """A value that does not depend on the entry's index, broadcast along a new dim `at` of
    the entry's tensor (split like it: every block of it is the value)."""
    rank = len(rel.term.shape)
    dims = tuple(k if k < at else k + 1 for k in range(rank))
    term = make_broadcast(rel.term, dims, _with_dim(rel.term.shape, at, size))
    return replace(rel, term=term, tiling=(*rel.tiling[:at], axes, *rel.tiling[at:]),
                   poly=frozenset(k if k < at else k + 1 for k in rel.poly))


def _widened(info: OpInfo, operand_dims: list[int | None], out_dim: int, block: int,
             attrs: dict | None = None) -> OpInfo:
    """`info` as if every device held its whole block of `block` rows where it holds one entry
    (operand k's rows at `operand_dims[k]`, the result's at `out_dim`)."""
    operands = [t if d is None else replace(t, shape=_with_dim(t.shape, d, block))
                for t, d in zip(info.operand_types, operand_dims)]
    result = info.result_types[0]
    results = [replace(result, shape=_with_dim(result.shape, out_dim, block)),
               *info.result_types[1:]]
    return replace(info, attrs=attrs if attrs is not None else dict(info.attrs),
                   operand_types=operands, result_types=results)


def _completed(out: Value, at: int, first: Windowed) -> Windowed | None:
    """The op's relation on the widened blocks as the entry of the result: a plain relation
    split at `at` as the entries' dim is."""
    dim_axes, size = first.rel.tiling[first.dim], first.rel.term.shape[first.dim]
    if not isinstance(out, Rel) or out.partial or at in out.poly or out.tiling[at] != dim_axes \
            or out.term.shape[at] != size:
        return None
    return make_entry(freeze(out) if out.poly else out, at, first.offset)


def elementwise(info: OpInfo, operands: list[Value], ctx: RuleContext, plain) -> Value | None:
    """An elementwise op of entries at one index and values that do not depend on it: that
    entry of the op applied to the entries' tensors (their dims moved to the first entry's
    place) and the other values broadcast along it. None: not of this form."""
    windows = _entries(operands)
    if windows is None or ctx.mesh is None or ctx.is_global:
        return None
    first = windows[0]
    at, axes, size = first.dim, first.rel.tiling[first.dim], first.rel.term.shape[first.dim]
    inner = [_moved(v.rel, v.dim, at) if isinstance(v, Windowed) else _spread(v, at, size, axes)
             for v in operands]
    block = block_rows(first.rel, first.dim, ctx.mesh)
    widened = _widened(info, [at] * len(operands), at, block)
    (out,) = plain(widened, inner, ctx)
    return _completed(out, at, first)


def reduce(info: OpInfo, window: Windowed, init: Rel, reducer: str, ctx: RuleContext,
           plain) -> Value | None:
    """A reduce of an entry over other dims: that entry of the reduced tensor (a sum in the
    form the reference computes it, `sum_out`). None: not of this form."""
    if not is_entry(window) or ctx.mesh is None or init.partial:
        return None
    dims = tuple(info.attrs["dimensions"])
    at = window.dim
    kept = [d for d in range(len(window.rel.term.shape)) if d != at]
    mapped = tuple(sorted(kept[d] for d in dims))
    out_at = at - sum(1 for d in mapped if d < at)
    block = block_rows(window.rel, at, ctx.mesh)
    widened = _widened(info, [at, None], out_at, block, {**info.attrs, "dimensions": mapped})
    (out,) = plain(widened, [window.rel, init], ctx)
    done = _completed(out, out_at, window)
    if done is None or reducer != "add":
        return done
    term = sum_out(window.rel.term, mapped, info.result_types[0].dtype, ctx.reference)
    return replace(done, rel=replace(done.rel, term=term))


def dot_general(info: OpInfo, operands: list[Value], ctx: RuleContext, plain
                ) -> list[Value] | None:
    """A dot_general of entries at one index: with one entry, its dim is a free dim of the
    dot_general of its tensor; with two, their dims are the dot_general's first batch dim
    (`A[e] . B[e]` is entry e of the dot batched over e). The entries' dims may be neither
    contracted nor batch dims of the local dot. None: no entry; an entry in another form is
    refused with the reason it stands for."""
    entries = [v for v in operands if is_entry(v)]
    if not entries:
        return None
    refused = [Opaque(entries[0].reason, origin=entries[0].origin, category="layout_mismatch")]
    windows = _entries(operands)
    if windows is None or ctx.mesh is None or ctx.is_global:
        return refused
    first = windows[0]
    a = info.attrs
    batch = [list(a["lhs_batch"]), list(a["rhs_batch"])]
    contract = [list(a["lhs_contract"]), list(a["rhs_contract"])]
    ranks = [len(t.shape) for t in info.operand_types]
    dims = [v.dim if isinstance(v, Windowed) else None for v in operands]
    for k, d in enumerate(dims):
        if d is None:
            continue
        batch[k] = [x + (x >= d) for x in batch[k]]
        contract[k] = [x + (x >= d) for x in contract[k]]
    if all(d is not None for d in dims):
        batch = [[dims[0], *batch[0]], [dims[1], *batch[1]]]
        out_dim = 0
    else:
        k = 0 if dims[0] is not None else 1
        free = [[x for x in range(ranks[j] + (dims[j] is not None))
                 if x not in batch[j] + contract[j]] for j in range(2)]
        out_dim = len(batch[0]) + (len(free[0]) if k == 1 else 0) + free[k].index(dims[k])
    attrs = {**a, "lhs_batch": tuple(batch[0]), "rhs_batch": tuple(batch[1]),
             "lhs_contract": tuple(contract[0]), "rhs_contract": tuple(contract[1])}
    block = block_rows(first.rel, first.dim, ctx.mesh)
    widened = _widened(info, dims, out_dim, block, attrs)
    inner = [v.rel if isinstance(v, Windowed) else v for v in operands]
    (out,) = plain(widened, inner, ctx)
    done = _completed(out, out_dim, first)
    return refused if done is None else [done]
