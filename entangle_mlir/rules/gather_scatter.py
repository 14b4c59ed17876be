"""Indexed data movement: gather, scatter (add / replace) and dynamic_update_slice.

Terms: the op name is the term op (`stablehlo.gather`, `stablehlo.scatter`,
`stablehlo.dynamic_update_slice`) and the term's attrs are the op's normalized attributes as
sorted `(name, value)` pairs (`offset_dims`, `slice_sizes`, `reducer`, ...), so a term can be
evaluated by the op's own semantics (`semantics.OP_SEMANTICS[op]` on an OpInfo built from the
pairs, see `term_info`). Canonical forms: gather is linear in its operand; a scatter-add
`scatter_add(X, I, U)` is `X + scatter_add(0, I, U)` with the second term linear in `U`; a
dynamic_update_slice with constant offsets has them clamped into range.

Per-device layouts:

* gather: dims of the operand that are indexed (in `start_index_map`), collapsed or sliced
  partially must not be split; a fully sliced operand dim keeps its split in the result's offset
  dim; the indices' batch dims keep theirs in the result's batch dims; a partial operand stays
  partial (gather only selects elements).
* scatter: the operand's scattered dims must not be split; a fully covered window dim split over
  A must be split the same way in the updates. Updates split along their scatter dims (with the
  indices split alike) each land on every device's copy: for `add` the result is a partial sum
  over those axes, of `scatter_add(|A| * X, I, U)` (the operand is counted once per device, said
  in a hint unless it is zero). Partial sums pass through `add` when operand and updates agree.
* batching dims (`take_along_axis` and its gradient): an operand batching dim and the indices
  dim it pairs with must be split alike; each device then pairs its own rows of both, the
  result keeps the split and a scatter writes into the device's own rows (no partial sum). A
  buffer or cotangent built at the local shape takes the split of the indices.
* dynamic_update_slice: a split dim must be covered fully by an update split the same way at
  offset 0; an unsplit dim takes a device-independent offset; a device-dependent offset that
  places each device's block of the update at `c + block_index * size` into a zero operand
  gives a partial sum over those axes (the zero-buffer + all_reduce form of an all_gather).

Index arithmetic on sharded operands (the masked "index minus my offset" idiom XLA emits for a
table split along the gathered dim) needs device-dependent index tensors, which the relation
domain does not have yet: such gathers and scatters are opaque with that reason.
"""

from __future__ import annotations

import re
from dataclasses import replace
from fractions import Fraction

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.ranges import exact_convert, int_limits
from entangle_mlir.core.relations import BlockIndex, Opaque, Rel, Shifted, Value
from entangle_mlir.core.terms import Term, intern, make_add, make_op, make_splat, scale, splat_value
from entangle_mlir.mlir.opinfo import OpInfo, TensorType, region_problem, scatter_kind
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.rules.common import device_offsets, freeze, is_zero, resize
from entangle_mlir.rules.kinds import device_blocks

GATHER = "stablehlo.gather"
SCATTER = "stablehlo.scatter"
DUS = "stablehlo.dynamic_update_slice"

_GATHER_KEYS = ("offset_dims", "collapsed_slice_dims", "operand_batching_dims",
                "start_indices_batching_dims", "start_index_map")
_SCATTER_KEYS = ("update_window_dims", "inserted_window_dims", "input_batching_dims",
                 "scatter_indices_batching_dims", "scatter_dims_to_operand_dims")
_DIM_LIST = re.compile(r"(\w+)\s*=\s*\[([\d,\s]*)\]")
_DIM_INT = re.compile(r"index_vector_dim\s*=\s*(\d+)")
_KIND = {"add": "sum", "max": "max", "min": "min"}


# ----- attributes -----------------------------------------------------------------------------

def dims_of(info: OpInfo, key: str, names: tuple[str, ...]) -> dict:
    """Dimension numbers as a dict of tuples (normalized attributes win over the text form)."""
    attrs = info.attrs
    out: dict = {}
    text = attrs.get(key)
    if isinstance(text, dict):
        out.update({k: (int(v) if k == "index_vector_dim" else tuple(v))
                    for k, v in text.items()})
    elif isinstance(text, str):
        for name, values in _DIM_LIST.findall(text):
            out[name] = tuple(int(v) for v in values.replace(" ", "").split(",") if v)
        match = _DIM_INT.search(text)
        if match:
            out["index_vector_dim"] = int(match.group(1))
    for name in names:
        if name in attrs:
            out[name] = tuple(attrs[name])
    if "index_vector_dim" in attrs:
        out["index_vector_dim"] = int(attrs["index_vector_dim"])
    for name in names:
        out.setdefault(name, ())
    # StableHLO prints attributes at their default value not at all: no index_vector_dim is 0.
    out.setdefault("index_vector_dim", 0)
    return out


def _pairs(d: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in d.items()))


def term_info(term: Term) -> OpInfo:
    """The OpInfo whose semantics is this term's (for `semantics.OP_SEMANTICS[term.op]`)."""
    return OpInfo(term.op, dict(term.attrs),
                  [TensorType(a.shape, a.dtype) for a in term.args],
                  [TensorType(term.shape, term.dtype)])


# ----- terms ----------------------------------------------------------------------------------

def _index_values(indices: Term) -> Term:
    """Gather/scatter indices by their values: an integer convert that keeps every value
    (int8 ids widened to int32 by jnp.take) selects the same positions, so it is dropped."""
    while indices.op == "stablehlo.convert" and indices.args and exact_convert(
            indices.args[0].dtype, indices.dtype) and int_limits(indices.args[0].dtype):
        indices = indices.args[0]
    return indices


def make_gather(operand: Term, indices: Term, dims: dict, slice_sizes: tuple[int, ...],
                shape: tuple[int, ...], dtype: str) -> Term:
    indices = _index_values(indices)
    attrs = _pairs({**{k: dims[k] for k in _GATHER_KEYS},
                    "index_vector_dim": dims["index_vector_dim"],
                    "slice_sizes": tuple(slice_sizes)})
    return make_op(GATHER, (operand, indices), attrs, tuple(shape), dtype, linear_in=0)


def make_scatter(operand: Term, indices: Term, updates: Term, dims: dict, kind: str) -> Term:
    indices = _index_values(indices)
    attrs = _pairs({**{k: dims[k] for k in _SCATTER_KEYS},
                    "index_vector_dim": dims["index_vector_dim"], "reducer": kind})
    if kind != "add":
        return intern(SCATTER, (operand, indices, updates), attrs, operand.shape, operand.dtype)
    zeros = make_splat(0, operand.shape, operand.dtype)
    placed = make_op(SCATTER, (zeros, indices, updates), attrs, operand.shape, operand.dtype,
                     linear_in=2)
    if splat_value(operand) == 0:
        return placed
    return make_add(operand, placed)


def make_dynamic_update_slice(operand: Term, update: Term, starts: list[Term]) -> Term:
    """Constant offsets are clamped into range (as the op does). Writing back what a
    dynamic_slice of the operand at the same offsets read is the operand (both clamp the
    offsets alike: the window has the update's shape): a masked update's untaken branch,
    `x.at[i].set(where(p, v, x[i]))` where p is false."""
    if update.op == "dynamic_slice" and update.args[0] is operand and len(update.args) == \
            1 + len(starts) and all(a is s for a, s in zip(update.args[1:], starts)):
        return operand
    canonical = []
    for d, start in enumerate(starts):
        value = splat_value(start)
        if isinstance(value, Fraction) and value.denominator == 1:
            clamped = min(max(int(value), 0), operand.shape[d] - update.shape[d])
            start = make_splat(clamped, (), start.dtype)
        canonical.append(start)
    if (update.shape == operand.shape and all(splat_value(s) == 0 for s in canonical)):
        return update
    return intern(DUS, (operand, update, *canonical), (), operand.shape, operand.dtype)


# ----- gather -------------------------------------------------------------------------------

def _gather_maps(dims: dict, operand_rank: int, indices_rank: int, result_rank: int):
    """(result batch dims, indices batch dims, operand window dims) in corresponding order."""
    ivd = dims["index_vector_dim"]
    offset_dims = dims["offset_dims"]
    result_batch = [d for d in range(result_rank) if d not in offset_dims]
    indices_batch = [d for d in range(indices_rank) if d != ivd]
    window = [d for d in range(operand_rank) if d not in dims["collapsed_slice_dims"]
              and d not in dims["operand_batching_dims"]]
    return result_batch, indices_batch, window


def gather(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    operand, indices = operands
    if isinstance(indices, BlockIndex):
        dims = dims_of(info, "dimension_numbers", _GATHER_KEYS)
        return [device_blocks.gather(info, operand, indices, dims, gather, ctx)]
    if isinstance(indices, Shifted) and isinstance(operand, Rel):
        dims = dims_of(info, "dimension_numbers", _GATHER_KEYS)
        return [device_blocks.gather_shifted(info, operand, indices, dims, gather, ctx)]
    if not isinstance(operand, Rel) or not isinstance(indices, Rel):
        return [Opaque("gather of a device-dependent scalar", category="unsupported")]
    dims = dims_of(info, "dimension_numbers", _GATHER_KEYS)
    batching = list(zip(dims["operand_batching_dims"], dims["start_indices_batching_dims"]))
    operand = _widen_batching(operand, indices, batching, info.operand_types[0].shape,
                              info.operand_types[1].shape)
    operand, indices = freeze(operand), freeze(indices)
    mismatch = _batching_mismatch("gather", operand, indices, batching)
    if mismatch is not None:
        return [mismatch]
    local_sizes = tuple(info.attrs["slice_sizes"])
    local_operand = info.operand_types[0].shape
    result_rank = len(info.result_types[0].shape)
    result_batch, indices_batch, window = _gather_maps(dims, len(local_operand),
                                                       len(info.operand_types[1].shape),
                                                       result_rank)
    if len(result_batch) != len(indices_batch) or len(window) != len(dims["offset_dims"]):
        return [Opaque("gather: inconsistent dimension numbers", category="internal")]
    if indices.partial:
        return [Opaque(f"gather with indices that are a partial {indices.kind} over "
                       f"{axes_str(indices.partial)}: missing all_reduce before it",
                       category="nonlinear_partial")]
    ivd = dims["index_vector_dim"]
    if ivd < len(indices.tiling) and indices.tiling[ivd]:
        return [Opaque(f"gather: the index vector dim {ivd} is split over "
                       f"{axes_str(indices.tiling[ivd])}", category="layout_mismatch")]
    if operand.partial and set(indices.tiled_axes) & set(operand.partial):
        return [Opaque("gather of a partial value with indices split over the same axes",
                       category="partial_mixed")]
    global_sizes = list(local_sizes)
    for d, axes in enumerate(operand.tiling):
        if not axes or d in dims["operand_batching_dims"]:
            continue
        full = local_sizes[d] == local_operand[d]
        if d in dims["start_index_map"] or d not in window or not full:
            return [Opaque(f"gather indexes dim {d} of an operand split over {axes_str(axes)}: "
                           "each device would index its own block (the masked "
                           "'index - my offset' form needs device-dependent index tensors, "
                           "not supported yet)", category="unsupported")]
        global_sizes[d] = operand.term.shape[d]
    shape = [0] * result_rank
    tiling: list[tuple[str, ...]] = [()] * result_rank
    for r, i in zip(result_batch, indices_batch):
        shape[r], tiling[r] = indices.term.shape[i], indices.tiling[i]
    for k, d in enumerate(window):
        r = dims["offset_dims"][k]
        shape[r], tiling[r] = global_sizes[d], operand.tiling[d]
    used = [a for axes in tiling for a in axes] + list(operand.partial)
    repeated = sorted({a for a in used if used.count(a) > 1})
    if repeated:
        return [Opaque(f"gather: mesh axis {axes_str(repeated)} splits both the operand and "
                       "the indices (each device only computes diagonal blocks)",
                       category="layout_mismatch")]
    term = make_gather(operand.term, indices.term, dims, tuple(global_sizes), tuple(shape),
                       info.result_types[0].dtype)
    return [Rel(term, tuple(tiling), operand.partial, operand.kind, frozenset(), operand.scope,
                partial_origin=operand.partial_origin)]


# ----- scatter ------------------------------------------------------------------------------

def scatter(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    if len(operands) != 3:
        return [Opaque("variadic scatter is not supported", category="unsupported")
                ] * len(info.result_types)
    operand, indices, updates = operands
    kind = scatter_kind(info)
    if kind not in ("add", "replace"):
        return [Opaque(region_problem(info) if kind == "other" else
                       f"scatter with a '{kind}' update computation is not supported",
                       category="unsupported")]
    if isinstance(indices, BlockIndex):
        dims = dims_of(info, "scatter_dimension_numbers", _SCATTER_KEYS)
        return [device_blocks.scatter(info, operand, indices, updates, dims, scatter_kind(info),
                              make_scatter, ctx)]
    if isinstance(indices, Shifted) and isinstance(operand, Rel) and isinstance(updates, Rel):
        return [_scatter_into_blocks(info, operand, indices, updates, ctx)]
    if not all(isinstance(v, Rel) for v in operands):
        return [Opaque("scatter of a device-dependent scalar", category="unsupported")]
    dims = dims_of(info, "scatter_dimension_numbers", _SCATTER_KEYS)
    batching = list(zip(dims["input_batching_dims"], dims["scatter_indices_batching_dims"]))
    operand = _widen_batching(operand, indices, batching, info.operand_types[0].shape,
                              info.operand_types[1].shape)
    local_operand = info.operand_types[0].shape
    local_updates = info.operand_types[2].shape
    window_dims = dims["update_window_dims"]
    operand_window = [d for d in range(len(local_operand))
                      if d not in dims["inserted_window_dims"]
                      and d not in dims["input_batching_dims"]]
    # A buffer built at the local shape (a splat, poly dims) takes the split of the updates'
    # window dims that cover it whole.
    for k, d in enumerate(operand_window):
        if k < len(window_dims) and d in operand.poly and updates.tiling[window_dims[k]] \
                and local_updates[window_dims[k]] == local_operand[d]:
            adapted = _widen(operand, d, updates.term.shape[window_dims[k]],
                             updates.tiling[window_dims[k]])
            if adapted is None:
                return [Opaque("scatter: cannot widen the operand built at the local shape",
                               category="internal")]
            operand = adapted
    # Updates built at the local shape (a splat cotangent) take the split of the indices along
    # the scatter dims.
    local_indices = info.operand_types[1].shape
    for u, i in zip([d for d in range(len(local_updates)) if d not in window_dims],
                    [d for d in range(len(local_indices)) if d != dims["index_vector_dim"]]):
        if u in updates.poly and indices.tiling[i] and local_updates[u] == local_indices[i]:
            adapted = _widen(updates, u, indices.term.shape[i], indices.tiling[i])
            if adapted is not None:
                updates = adapted
    operand, indices, updates = freeze(operand), freeze(indices), freeze(updates)
    mismatch = _batching_mismatch("scatter", operand, indices, batching)
    if mismatch is not None:
        return [mismatch]
    update_scatter = [d for d in range(len(local_updates)) if d not in window_dims]
    ivd = dims["index_vector_dim"]
    indices_batch = [d for d in range(len(indices.term.shape)) if d != ivd]
    if len(operand_window) != len(window_dims) or len(update_scatter) != len(indices_batch):
        return [Opaque("scatter: inconsistent dimension numbers", category="internal")]
    if indices.partial:
        return [Opaque(f"scatter with indices that are a partial {indices.kind}: missing "
                       "all_reduce before it", category="nonlinear_partial")]
    if ivd < len(indices.tiling) and indices.tiling[ivd]:
        return [Opaque(f"scatter: the index vector dim {ivd} is split", category="layout_mismatch")]
    # Window dims: operand dim d <-> updates dim window_dims[k].
    for k, d in enumerate(operand_window):
        u = window_dims[k]
        o_axes, u_axes = operand.tiling[d], updates.tiling[u]
        if not o_axes and not u_axes:
            continue
        if d in dims["scatter_dims_to_operand_dims"]:
            return [Opaque(f"scatter into dim {d} of an operand split over "
                           f"{axes_str(o_axes or u_axes)} at computed indices: each device "
                           "would index its own block (the 'index - my offset' form needs "
                           "device-dependent index tensors, not supported yet)",
                           category="unsupported")]
        if o_axes != u_axes or local_updates[u] != local_operand[d]:
            return [Opaque(f"scatter: window dim {d} of the operand is "
                           f"{_split_words(o_axes)} but the updates' dim {u} is "
                           f"{_split_words(u_axes)}", category="layout_mismatch")]
    for d in dims["inserted_window_dims"]:
        if operand.tiling[d]:
            return [Opaque(f"scatter into dim {d}, which is split over "
                           f"{axes_str(operand.tiling[d])}: each device would index its own "
                           "block (needs device-dependent index tensors, not supported yet)",
                           category="unsupported")]
    # Scatter dims: updates dim update_scatter[k] <-> indices dim indices_batch[k].
    # A batching dim split alike in the operand and the indices writes into the device's own
    # block of the operand: its axes do not spread updates over devices.
    own_block = {i for _, i in batching}
    spread: list[str] = []
    for u, i in zip(update_scatter, indices_batch):
        u_axes, i_axes = updates.tiling[u], indices.tiling[i]
        if u_axes != i_axes:
            return [Opaque(f"scatter: updates dim {u} is {_split_words(u_axes)} but the "
                           f"matching indices dim {i} is {_split_words(i_axes)}",
                           category="layout_mismatch")]
        if i not in own_block:
            spread.extend(u_axes)
    if any(a in operand.tiled_axes for a in spread):
        return [Opaque("scatter: the same mesh axis splits the operand and the updates' "
                       "scatter dims", category="layout_mismatch")]
    if kind == "replace":
        if spread:
            return [Opaque("scatter (replace) of updates split along their scatter dims: every "
                           "device overwrites its own copy with its own rows",
                           category="nonlinear_partial")]
        joint = _dus_partial(operand, updates, ctx, "scatter (replace)")
        if isinstance(joint, Opaque):
            return [joint]
        o_term, u_term, axes, partial_kind = joint
        term = make_scatter(o_term, indices.term, u_term, dims, kind)
        ctx.note("scatter (replace) with repeated indices is modelled as 'last update wins' "
                 "(the order is implementation-defined in StableHLO)")
        return [Rel(term, operand.tiling, axes, partial_kind, frozenset(), operand.scope,
                    partial_origin=operand.partial_origin or updates.partial_origin)]
    return [_scatter_add(operand, indices, updates, dims, tuple(spread), ctx)]


def _scatter_into_blocks(info: OpInfo, operand: Rel, indices: Shifted, updates: Rel,
                         ctx: RuleContext) -> Value:
    """XLA's scatter into a table split along the scattered dim d over axes A: every device
    scatters all the (replicated) updates at `ids - offset(device)` into its block of s rows.
    An update window that does not fit is skipped (XLA), so each device applies exactly the
    updates whose row falls in its block, in the same order: when offset(device) is
    block_index(A, device) * s, the result is that block of the global scatter, split over A
    like the operand."""
    unsupported = Opaque("scatter with device-dependent indices that are not the ids shifted "
                         "by the device's block offset along the split scattered dim",
                         category="unsupported")
    kind = scatter_kind(info)
    if kind not in ("add", "replace") or ctx.mesh is None:
        return unsupported
    dims = dims_of(info, "scatter_dimension_numbers", _SCATTER_KEYS)
    to_operand = dims["scatter_dims_to_operand_dims"]
    if (dims["input_batching_dims"] or len(to_operand) != 1
            or to_operand[0] not in dims["inserted_window_dims"]):
        return unsupported
    d = to_operand[0]
    ids = indices.rel
    operand, updates, ids = freeze(operand), freeze(updates), freeze(ids)
    axes = operand.tiling[d]
    if (not axes or ids.tiled_axes or ids.partial or updates.tiled_axes or updates.partial
            or operand.partial or any(t for k, t in enumerate(operand.tiling) if k != d)):
        return unsupported
    block = info.operand_types[0].shape[d]
    mesh = ctx.mesh
    if any(indices.offsets[device] != -mesh.block_index(axes, device) * block
           for device in range(mesh.num_devices)):
        return Opaque(f"scatter indices are shifted by {list(indices.offsets)[:16]}, not by "
                      f"minus each device's block offset along dim {d} ({block} * "
                      f"axis_index({axes_str(axes)}))", category="wrong_offset")
    term = make_scatter(operand.term, ids.term, updates.term, dims, kind)
    return replace(operand, term=term)


def _widen(rel: Rel, dim: int, size: int, axes: tuple[str, ...]) -> Rel | None:
    """A poly dim of `rel` given the global size and split of the value it is combined with."""
    term = resize(rel.term, dim, size)
    if term is None:
        return None
    tiling = list(rel.tiling)
    tiling[dim] = axes
    return replace(rel, term=term, tiling=tuple(tiling), poly=rel.poly - {dim})


def _split_words(axes) -> str:
    return f"split over {axes_str(axes)}" if axes else "not split"


def _scatter_add(operand: Rel, indices: Rel, updates: Rel, dims: dict,
                 spread: tuple[str, ...], ctx: RuleContext) -> Value:
    """Sum over devices: partial operands/updates add up; a replicated side counts once per
    device of the partial group (hinted, as for `add`)."""
    partial_axes = set(operand.partial) | set(updates.partial) | set(spread)
    for rel in (operand, updates):
        if rel.partial and rel.kind != "sum":
            return Opaque(f"scatter-add of a partial {rel.kind}", category="nonlinear_partial")
    if updates.partial and set(indices.tiled_axes) & set(updates.partial):
        return Opaque("scatter-add: partial updates with indices split over the same axes",
                      category="partial_mixed")
    mesh = ctx.mesh
    order = mesh.names if mesh else ()
    axes = tuple(sorted(partial_axes, key=order.index)) if partial_axes else ()
    o_term, u_term = operand.term, updates.term
    if axes:
        missing_o = [a for a in axes if a not in operand.partial]
        missing_u = [a for a in axes if a not in updates.partial and a not in spread]
        if missing_o and not is_zero(operand):
            factor = mesh.group_size(missing_o)
            o_term = scale(o_term, factor)
            ctx.hint(f"scatter-add into an operand replicated over {axes_str(missing_o)} while "
                     f"the updates are a partial sum (or split) over {axes_str(missing_o)}: "
                     f"after the all_reduce the operand is counted {factor} times")
        if missing_u and not is_zero(updates):
            factor = mesh.group_size(missing_u)
            u_term = scale(u_term, factor)
            ctx.hint(f"scatter-add of updates replicated over {axes_str(missing_u)} into a "
                     f"partial sum over {axes_str(missing_u)}: after the all_reduce they are "
                     f"counted {factor} times")
    term = make_scatter(o_term, indices.term, u_term, dims, "add")
    origin = operand.partial_origin or updates.partial_origin
    return Rel(term, operand.tiling, axes, "sum" if axes else "", frozenset(), operand.scope,
               partial_origin=origin)


# ----- batching dims (take_along_axis and its gradient) ----------------------------------------

def _widen_batching(operand: Value, indices: Value, batching: list[tuple[int, int]],
                    local_operand: tuple[int, ...], local_indices: tuple[int, ...]) -> Value:
    """An operand batching dim built at the local shape (a zero buffer for the gradient of
    take_along_axis) takes the size and split of the indices' batching dim it pairs with."""
    if not isinstance(operand, Rel) or not isinstance(indices, Rel):
        return operand
    for d, i in batching:
        if d in operand.poly and indices.tiling[i] and local_operand[d] == local_indices[i]:
            widened = _widen(operand, d, indices.term.shape[i], indices.tiling[i])
            if widened is not None:
                operand = widened
    return operand


def _batching_mismatch(what: str, operand: Rel, indices: Rel,
                       batching: list[tuple[int, int]]) -> Opaque | None:
    """Operand batching dim d is indexed by the position along indices dim i: both must be split
    alike (then each device pairs its own rows of both), else the rows do not line up."""
    for d, i in batching:
        if operand.term.shape[d] != indices.term.shape[i]:
            return Opaque(f"{what}: batching dim {d} of the operand has {operand.term.shape[d]} "
                          f"rows but the indices' dim {i} has {indices.term.shape[i]}",
                          category="layout_mismatch")
        if operand.tiling[d] != indices.tiling[i]:
            return Opaque(f"{what}: batching dim {d} of the operand is "
                          f"{_split_words(operand.tiling[d])} but the matching indices dim "
                          f"{i} is {_split_words(indices.tiling[i])}: each device would pair "
                          "rows of different tokens", category="layout_mismatch")
    return None


# ----- dynamic_update_slice -------------------------------------------------------------------



def dynamic_update_slice(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    operand, update, *starts = operands
    if not isinstance(operand, Rel) or not isinstance(update, Rel):
        return [Opaque("dynamic_update_slice of a device-dependent scalar",
                       category="unsupported")]
    local_operand = info.operand_types[0].shape
    local_update = info.operand_types[1].shape
    # A buffer built at the local shape (a splat, poly dims) that the update covers whole at a
    # constant offset 0 takes the update's split.
    if not ctx.is_global and ctx.mesh is not None:
        for d, axes in enumerate(update.tiling):
            if axes and d in operand.poly and local_update[d] == local_operand[d] \
                    and d < len(starts) and device_offsets(starts[d], ctx.mesh.num_devices) == \
                    (0,) * ctx.mesh.num_devices:
                adapted = _widen(operand, d, update.term.shape[d], axes)
                if adapted is None:
                    return [Opaque("dynamic_update_slice: cannot widen the operand built at "
                                   "the local shape", category="internal")]
                operand = adapted
    operand, update = freeze(operand), freeze(update)
    if ctx.is_global or ctx.mesh is None:
        if not all(isinstance(s, Rel) for s in starts):
            return [Opaque("dynamic_update_slice with a device-dependent offset outside a "
                           "per-device program", category="unsupported")]
        term = make_dynamic_update_slice(operand.term, update.term, [s.term for s in starts])
        return [replace(operand, term=term)]
    mesh = ctx.mesh
    count = mesh.num_devices
    start_terms: list[Term] = []
    placed: list[str] = []
    for d, start in enumerate(starts):
        raw = device_offsets(start, count)
        if raw is None:
            if isinstance(start, Rel) and not start.tiled_axes and not start.partial:
                if operand.tiling[d] or update.tiling[d]:
                    return [Opaque(f"dynamic_update_slice at a data-dependent offset into dim "
                                   f"{d}, which is split", category="unsupported")]
                start_terms.append(start.term)
                continue
            return [Opaque("dynamic_update_slice with an offset that is neither constant nor "
                           "a device table", category="unsupported")]
        high = local_operand[d] - local_update[d]
        offsets = tuple(min(max(o, 0), high) for o in raw)
        o_axes, u_axes = operand.tiling[d], update.tiling[d]
        dtype = info.operand_types[2 + d].dtype if len(info.operand_types) > 2 + d else "i32"
        if len(set(offsets)) == 1:
            if (o_axes or u_axes) and (o_axes != u_axes or offsets[0] != 0
                                       or local_update[d] != local_operand[d]):
                return [Opaque(f"dynamic_update_slice into dim {d}: the operand is "
                               f"{_split_words(o_axes)}, the update {_split_words(u_axes)}, at "
                               f"offset {offsets[0]} (each device writes into its own block)",
                               category="layout_mismatch")]
            start_terms.append(make_splat(offsets[0], (), dtype))
            continue
        # A device-dependent offset: each device's block of the update lands at its own place.
        if o_axes:
            return [Opaque(f"dynamic_update_slice with a device-dependent offset in dim {d}, "
                           f"which is split over {axes_str(o_axes)}", category="wrong_offset")]
        if not u_axes:
            return [Opaque(f"dynamic_update_slice with a device-dependent offset in dim {d} "
                           f"but an update replicated along it: devices write the same rows at "
                           f"different places (offsets {list(offsets)[:16]})",
                           category="wrong_offset")]
        size = local_update[d]
        base = offsets[0] - mesh.block_index(u_axes, 0) * size
        expected = [base + mesh.block_index(u_axes, dev) * size for dev in range(count)]
        bad = [dev for dev in range(count) if offsets[dev] != expected[dev]]
        if bad or base < 0 or base + size * mesh.group_size(u_axes) > local_operand[d]:
            dev = bad[0] if bad else 0
            return [Opaque(f"device-dependent offset is wrong along dim {d}: device {dev} "
                           f"writes its block to [{offsets[dev]}, {offsets[dev] + size}) "
                           f"instead of [{expected[dev]}, {expected[dev] + size}) over "
                           f"{axes_str(u_axes)} (offsets found {list(offsets)[:16]}, "
                           f"expected {expected[:16]})", category="wrong_offset")]
        start_terms.append(make_splat(base, (), dtype))
        placed.extend(u_axes)
    if placed:
        return [_placed_blocks(operand, update, start_terms, tuple(placed), ctx)]
    partial = _dus_partial(operand, update, ctx)
    if isinstance(partial, Opaque):
        return [partial]
    o_term, u_term, axes, kind = partial
    term = make_dynamic_update_slice(o_term, u_term, start_terms)
    origin = operand.partial_origin or update.partial_origin
    return [Rel(term, operand.tiling, axes, kind, frozenset(), operand.scope,
                partial_origin=origin)]


def _dus_partial(operand: Rel, update: Rel, ctx: RuleContext,
                 what: str = "dynamic_update_slice"):
    """Joint linearity of writing `update` over part of `operand` (dynamic_update_slice,
    scatter replace at fixed indices): both partial alike, or one partial and the other
    counted per device (a sum counts it |axes| times; a max or min once)."""
    if not operand.partial and not update.partial:
        return operand.term, update.term, (), ""
    if operand.partial and update.partial:
        if (operand.partial, operand.kind) != (update.partial, update.kind):
            return Opaque(f"{what} of partial values over different axes",
                          category="partial_mixed")
        return operand.term, update.term, operand.partial, operand.kind
    carried, other = (operand, update) if operand.partial else (update, operand)
    if set(other.tiled_axes) & set(carried.partial):
        return Opaque(f"{what} combines a partial {carried.kind} over "
                      f"{axes_str(carried.partial)} with a value split over those axes",
                      category="partial_mixed")
    o_term, u_term = operand.term, update.term
    if carried.kind == "sum" and not is_zero(other):
        factor = ctx.mesh.group_size(carried.partial)
        if other is operand:
            o_term = scale(o_term, factor)
        else:
            u_term = scale(u_term, factor)
        ctx.hint(f"{what} mixes a partial sum over {axes_str(carried.partial)} "
                 f"with a value replicated over {axes_str(carried.partial)}: after the "
                 f"all_reduce the replicated part is counted {factor} times")
    return o_term, u_term, carried.partial, carried.kind


def _placed_blocks(operand: Rel, update: Rel, starts: list[Term], axes: tuple[str, ...],
                   ctx: RuleContext) -> Value:
    """Every device writes its own block of the update into a zero buffer: the sum over the
    placing axes is the whole update at the base offset."""
    if update.partial and (update.kind != "sum" or set(update.partial) & set(axes)):
        return Opaque(f"dynamic_update_slice places each device's piece of a partial "
                      f"{update.kind} over {axes_str(update.partial)} by its block over "
                      f"{axes_str(axes)}: the pieces do not add up", category="partial_mixed")
    if not is_zero(operand) or operand.partial:
        return Opaque(f"dynamic_update_slice places each device's block (over "
                      f"{axes_str(axes)}) into a buffer that is not zero: the devices hold "
                      "different mixtures of the buffer and the update", category="unrelated")
    if set(operand.tiled_axes) & set(axes):
        return Opaque("dynamic_update_slice: the placing axes also split the buffer",
                      category="layout_mismatch")
    global_update = update.term
    tiling = list(operand.tiling)
    for d, u_axes in enumerate(update.tiling):
        if u_axes and not set(u_axes) <= set(axes) and operand.tiling[d] != u_axes:
            return Opaque(f"dynamic_update_slice: update dim {d} split over {axes_str(u_axes)} "
                          "but the buffer is not", category="layout_mismatch")
    zeros = make_splat(0, operand.term.shape, operand.term.dtype)
    term = make_dynamic_update_slice(zeros, global_update, starts)
    order = ctx.mesh.names
    summed = set(axes) | set(update.partial)
    return Rel(term, tuple(tiling), tuple(sorted(summed, key=order.index)), "sum", frozenset(),
               operand.scope, partial_origin=update.partial_origin)


# Ops whose rule reads the update region (the walker must let scatter's region through).
scatter.reads_regions = True  # type: ignore[attr-defined]

GATHER_SCATTER_RULES = {
    GATHER: gather,
    SCATTER: scatter,
    DUS: dynamic_update_slice,
}
