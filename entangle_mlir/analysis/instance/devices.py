"""Which devices' claims are checked, and running the op on them: one device per distinct
claim, and only coordinate 0 along a mesh axis the instance is symmetric in (`_symmetric_axes`
states the argument); a collective runs on whole replica groups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from entangle_mlir.analysis.instance.sources import Failure
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import (
    BlockIndex,
    DeviceScalar,
    InBlock,
    Masked,
    Opaque,
    Rel,
    Shifted,
    Value,
)
from entangle_mlir.core.terms import (
    ARITHMETIC_TERM_OPS,
    ELEMENTWISE_STABLEHLO,
    Term,
    reshape_groups,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS, replica_groups, run_op
from entangle_mlir.semantics.element import SemanticsError
from entangle_mlir.semantics.groups import GROUPED


def _rels_and_device_axes(values: Sequence[Value], mesh: Mesh, inputs: bool
                          ) -> tuple[list[Rel], set[str]] | None:
    """The relations inside `values` and the mesh axes their device-dependent parts depend
    on (a device block's axes, the axes a device offset table varies along); None for a
    value the symmetry argument does not cover. A device mask or local index of blocks over
    axes A, or a tensor plus offsets that vary only along A, is computed alike on devices
    that differ in another axis: the argument of `_symmetric_axes` holds for that axis."""
    rels: list[Rel] = []
    axes: set[str] = set()
    for v in values:
        if isinstance(v, Rel):
            rels.append(v)
        elif isinstance(v, Opaque) and not inputs:
            continue
        elif isinstance(v, Shifted):
            rels.append(v.rel)
            axes |= {a for a, _ in mesh.axes if _varies_along(v.offsets, a, mesh)}
        elif isinstance(v, InBlock | BlockIndex):
            rels.append(v.rel)
            axes |= set(v.axes)
        elif isinstance(v, Masked):
            rels += [v.rel, v.pred.rel]
            axes |= set(v.pred.axes)
        else:
            return None
    return rels, axes


def _varies_along(table, axis: str, mesh: Mesh) -> bool:
    """A per-device table differs between two devices that differ only along `axis`."""
    return any(table[d] != table[mesh.device({**mesh.coords(d), axis: 0})]
               for d in range(mesh.num_devices))


def distinct_devices(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                     single: bool, devices: int) -> list[int]:
    """One device per distinct claim. An op outside the collectives computes each device's
    result from that device's operands alone, so two devices holding the same block of every
    (non-partial) operand and result, and the same device-table entries, make the same claim:
    checking one checks both. Replicated values on 8 devices are one claim, not 8. Along a
    mesh axis the instance is symmetric in (`_symmetric_axes`), only the devices at
    coordinate 0 are checked: every other device's claim is one of theirs with the variables
    renamed."""
    everyone = list(range(devices))
    if single:
        return everyone
    if info.name in COLLECTIVE_SEMANTICS:
        grouped = _collective_axes(info, mesh)
        if grouped is None:
            return everyone
        symmetric = [a for a in _symmetric_axes(ins, outs, mesh) if a not in grouped]
        return [d for d in everyone if not any(mesh.coords(d)[a] for a in symmetric)]
    symmetric = _symmetric_axes(ins, outs, mesh)
    candidates = [d for d in everyone
                  if not any(mesh.coords(d)[a] for a in symmetric)] if symmetric else everyone
    first: dict[tuple, int] = {}
    for d in candidates:
        key = []
        for value in list(ins) + list(outs):
            if isinstance(value, Rel) and not value.partial:
                key.append(block_index(value, mesh, d))
            elif isinstance(value, DeviceScalar):
                key.append(value.values[d])
            elif isinstance(value, Shifted) and not value.rel.partial:
                key.append((block_index(value.rel, mesh, d), value.offsets[d]))
            else:  # partial values and unconstrained operands differ per device
                return candidates
        first.setdefault(tuple(key), d)
    return sorted(first.values())


_GROUP_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.all_gather",
                      "stablehlo.reduce_scatter", "stablehlo.all_to_all")
"""Collectives whose result on a device depends only on its replica group's operands and its
position in the group."""


def _collective_axes(info: OpInfo, mesh: Mesh) -> tuple[str, ...] | None:
    """The mesh axes whose groups (ordered by block index) are exactly the collective's
    replica groups, else None. A symmetric axis outside them maps every group to a group,
    member k to member k, so the renaming argument of `_symmetric_axes` holds for the
    collective too."""
    if info.name not in _GROUP_COLLECTIVES:
        return None
    try:
        groups = replica_groups(info, mesh)
    except SemanticsError:
        return None
    axes = mesh.axes_of_groups(groups)
    if axes is None or sorted(map(tuple, groups)) != sorted(
            map(tuple, mesh.groups_for(axes))):
        return None
    return axes


def run_devices(info: OpInfo, local: list[list[np.ndarray]], checked: list[int],
                mesh: Mesh | None, single: bool) -> dict[int, list[np.ndarray]]:
    """The results of the checked devices. A collective checked on whole replica groups only
    (`distinct_devices`) runs on those groups, renumbered, as a mesh of their own."""
    if single or info.name not in COLLECTIVE_SEMANTICS or len(checked) == mesh.num_devices:
        return dict(zip(checked, run_op(info, [local[d] for d in checked],
                                        None if single else mesh)))
    index = {d: k for k, d in enumerate(checked)}
    groups = [g for g in replica_groups(info, mesh) if g[0] in index]
    if sum(len(g) for g in groups) != len(checked) or any(m not in index for g in groups
                                                           for m in g):
        raise Failure("unknown", "the checked devices are not whole replica groups")
    # the renumbered groups are device ids of a one-replica mesh: read them as such
    # (flattened ids, or partition ids for all_to_all; groups.py)
    attrs = {**info.attrs, "replica_groups": [[index[m] for m in g] for g in groups],
             "channel_handle": "#stablehlo.channel_handle<handle = 1, type = 1>"}
    if GROUPED[info.name][0] is not None:
        attrs["use_global_device_ids"] = True
    renumbered = replace(info, attrs=attrs)
    results = run_op(renumbered, [local[d] for d in checked],
                     Mesh((("checked", len(checked)),)))
    return dict(zip(checked, results))


_ANY = "any"
"""Tag of a dim a term is constant along: any permutation of it leaves the value unchanged."""
_ID = "id"
"""Tag of a dim only the identity is known to act on."""
_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or")


def _symmetric_axes(ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the instance's claim is symmetric in: for such an axis `a`, the claim
    of a device at coordinate i along `a` is the claim of the device at coordinate 0 (same
    other coordinates) with the global variables renamed, so proving the latter proves it.

    The argument. Let sigma permute the coordinates of `a` (the transposition (0 i)). It
    acts on a global tensor dim tiled over axes T containing `a` (and not poly) by moving
    block b to the block whose `a` coordinate is permuted (a fixed permutation of the dim's
    positions, determined by its size and T); on other dims it acts as the identity. Choose
    the renaming pi of the leaf variables as that action on each leaf that is itself an input
    term or that an input broadcasts (with that input's tiling, `_leaf_tags`), the identity on
    other leaves (any choice is sound: what follows checks it). If every input and output
    term t commutes with it, t(pi L) = sigma_T t(L) for its own tiling T, then the block device
    d_0 (coordinate 0) holds of t(pi L) is the block d_i holds of t(L). The op runs the same
    local program on every device (no device-dependent values; a collective only when its
    replica groups are those of mesh axes not containing `a`, `_collective_axes`: sigma then
    maps d_i's group to d_0's, member k to member k, and the collective computes each device's
    result from its group's operands and its position in the group), so device
    d_i's claim `op(blocks of inputs at d_i) == block of output at d_i` over L is exactly
    d_0's claim over pi L; the claim is proved for all values of the variables (and the
    hypotheses it assumes at pi L are those of d_i at L: divisors of d_i's computation and
    the global terms', permuted). Partial values over other axes group devices that differ
    only in those axes, so sigma maps a group to a group and its fresh split variables to
    theirs; a value partial over `a` makes `a` not symmetric.

    Commuting is established per term node by tags (`_dim_tags`): a dim is ANY (the term is
    constant along it), ID (only the identity is known to commute) or (size, T) (sigma_T
    commutes). Leaves take their input's tags; elementwise ops need equal tags (ANY matches
    anything); broadcast, transpose and reshapes that keep a tagged dim whole carry them; a
    dot_general or reduction over permuted dims is invariant (a sum, max or product over
    all positions does not depend on their order); iota is ID along its dim (it is the
    position). Any other node commutes only when its operands are unchanged (every tag ID or
    ANY); otherwise the axis is not symmetric and every device is checked."""
    in_rels = _rels_and_device_axes(ins, mesh, inputs=True)
    out_rels = _rels_and_device_axes(outs, mesh, inputs=False)
    if in_rels is None or out_rels is None:
        return ()
    (in_rels, in_axes), (out_only, out_axes) = in_rels, out_rels
    rels = in_rels + out_only
    symmetric = []
    for axis, size in mesh.axes:
        if size == 1 or any(axis in r.partial for r in rels) or axis in in_axes | out_axes:
            continue
        leaves: dict[int, tuple] = {}
        consistent = True
        for rel in in_rels:
            found = _leaf_tags(rel, axis)
            if found is not None and leaves.setdefault(*found) != found[1]:
                consistent = False
        if not consistent:
            continue
        memo: dict[int, tuple | None] = {}
        try:
            ok = all(_compatible(_dim_tags(r.term, leaves, memo), _expected_tags(r, axis))
                     for r in rels)
        except RecursionError:
            ok = False
        if ok:
            symmetric.append(axis)
    return tuple(symmetric)


def _leaf_tags(rel: Rel, axis: str) -> tuple[int, tuple] | None:
    """(leaf serial, tags) choosing the renaming on a leaf an input is, broadcasts (a poly
    broadcast keeps its operand) or reshapes (a dim it keeps whole): the input's own action on
    the dims the leaf fills. Only a choice: every term is then checked against its own
    tiling."""
    expected = _expected_tags(rel, axis)
    term = rel.term
    if term.op == "arg":
        return term.serial, expected
    if term.op == "broadcast" and term.args[0].op == "arg":
        (dims,) = term.attrs
        operand = term.args[0]
        return operand.serial, tuple(expected[d] if operand.shape[i] == term.shape[d] else _ID
                                     for i, d in enumerate(dims))
    if term.op == "reshape" and term.args[0].op == "arg":
        operand = term.args[0]
        groups = reshape_groups(operand.shape, term.shape)
        if groups is None:
            return None
        tags = [_ID] * len(operand.shape)
        for src_dims, dst_dims in groups:
            real_src = [d for d in src_dims if operand.shape[d] != 1]
            real_dst = [d for d in dst_dims if term.shape[d] != 1]
            if len(real_src) == 1 and len(real_dst) == 1:
                tags[real_src[0]] = expected[real_dst[0]]
            elif any(expected[d] != _ID for d in dst_dims):
                return None
        return operand.serial, tuple(tags)
    return None


def _expected_tags(rel: Rel, axis: str) -> tuple:
    """The action sigma has on `rel`'s global tensor, per dim (see `_symmetric_axes`)."""
    return tuple((n, axes) if axis in axes and d not in rel.poly else _ID
                 for d, (n, axes) in enumerate(zip(rel.term.shape, rel.tiling)))


def _compatible(found: tuple | None, expected: tuple) -> bool:
    return found is not None and len(found) == len(expected) and all(
        f == _ANY or f == e for f, e in zip(found, expected))


def _unify(tags: Sequence) -> object | None:
    """One tag for positions that must move together (None: they do not)."""
    known = {t for t in tags if t != _ANY}
    if not known:
        return _ANY
    return known.pop() if len(known) == 1 else None


def _dim_tags(term: Term, leaves: dict[int, tuple], memo: dict) -> tuple | None:
    """Per dim, how the renaming acts on `term`'s value (see `_symmetric_axes`); None when
    the term is not known to commute with it."""
    if term.serial in memo:
        return memo[term.serial]
    memo[term.serial] = None
    rank = len(term.shape)
    op = term.op
    found: tuple | None
    if op == "arg":
        found = leaves.get(term.serial, (_ID,) * rank)
    elif op == "splat":
        found = (_ANY,) * rank
    elif not term.args:
        found = (_ID,) * rank
    else:
        args = [_dim_tags(a, leaves, memo) for a in term.args]
        found = None if any(a is None for a in args) else _node_tags(term, args)
    memo[term.serial] = found
    return found


def _node_tags(term: Term, args: list[tuple]) -> tuple | None:
    op, rank = term.op, len(term.shape)
    if op in ARITHMETIC_TERM_OPS or (op in ELEMENTWISE_STABLEHLO and all(
            a.shape == term.shape for a in term.args)):
        out = tuple(_unify([a[d] for a in args]) for d in range(rank))
        return None if None in out else out
    if op == "broadcast":
        (dims,) = term.attrs
        operand = term.args[0]
        out = [_ANY] * rank
        for i, d in enumerate(dims):
            if operand.shape[i] == term.shape[d]:
                out[d] = args[0][i]
        return tuple(out)
    if op == "transpose":
        return tuple(args[0][p] for p in term.attrs[0])
    if op == "reshape":
        return _reshape_tags(term.args[0].shape, term.shape, args[0])
    if op == "stablehlo.dot_general" and len(args) == 2:
        lb, rb, lc, rc = term.attrs
        lhs, rhs = args
        batch = [_unify([lhs[x], rhs[y]]) for x, y in zip(lb, rb)]
        if None in batch or any(_unify([lhs[x], rhs[y]]) is None for x, y in zip(lc, rc)):
            return None
        lhs_free = [lhs[d] for d in range(len(lhs)) if d not in lb and d not in lc]
        rhs_free = [rhs[d] for d in range(len(rhs)) if d not in rb and d not in rc]
        return tuple(batch + lhs_free + rhs_free)
    if op in _REDUCTIONS and len(args) == 1:
        dims = term.attrs[0]
        return tuple(t for d, t in enumerate(args[0]) if d not in dims)
    if op == "stablehlo.gather" and len(args) == 2:
        return _gather_tags(term, *args)
    if op == "slice" and len(args) == 1:
        return _slice_tags(term, args[0])
    if op == "concatenate":
        return _concatenate_tags(term, args)
    if all(t in (_ID, _ANY) for a in args for t in a):
        return (_ID,) * rank
    return None


def _slice_tags(term: Term, operand: tuple) -> tuple | None:
    """A slice keeps the tag of a dim it takes whole; a dim it cuts must be one the
    renaming leaves alone (ID), or is constant along (ANY)."""
    starts, limits, strides = term.attrs
    out = []
    for d, size in enumerate(term.args[0].shape):
        if (starts[d], limits[d], strides[d]) == (0, size, 1) or operand[d] in (_ID, _ANY):
            out.append(operand[d])
        else:
            return None
    return tuple(out)


def _concatenate_tags(term: Term, args: list[tuple]) -> tuple | None:
    """A concatenation moves with the renaming when its operands do alike on every other dim
    (as an elementwise op) and the renaming leaves the joined dim alone in each (ID: it then
    holds the operands' positions in order)."""
    (dim,) = term.attrs
    out = []
    for d in range(len(term.shape)):
        if d == dim:
            if any(a[d] not in (_ID, _ANY) for a in args):
                return None
            out.append(_ID)
        else:
            tag = _unify([a[d] for a in args])
            if tag is None:
                return None
            out.append(tag)
    return tuple(out)


def _gather_tags(term: Term, operand: tuple, indices: tuple) -> tuple | None:
    """A gather reads, for each batch position of its indices, the operand at the indexed
    position: permuting the indices' batch positions permutes the result's batch positions
    alike, while the operand is unchanged (ID or ANY) but along an operand batching dim,
    which must move exactly like its paired indices dim (a replicated operand paired with
    split indices is not symmetric: row b would meet another device's index row); the
    index vector itself must be unchanged."""
    dims = dict(term.attrs)
    ivd = dims.get("index_vector_dim", 0)
    rank = len(term.shape)
    offset = list(dims.get("offset_dims", ()))
    pairs = dict(zip(dims.get("operand_batching_dims", ()),
                     dims.get("start_indices_batching_dims", ())))
    if ivd < len(indices) and indices[ivd] not in (_ID, _ANY):
        return None
    indices = list(indices)
    for d, tag in enumerate(operand):
        if d in pairs:  # operand row b is read with index row b: both move alike, or neither
            joint = _unify([tag, indices[pairs[d]]])
            if joint is None:
                return None
            indices[pairs[d]] = joint
        elif tag not in (_ID, _ANY):
            return None
    batch = [t for d, t in enumerate(indices) if d != ivd]
    window = [t for d, t in enumerate(operand) if d not in dims.get("collapsed_slice_dims", ())
              and d not in pairs]
    if len(batch) + len(window) != rank or any(t not in (_ID, _ANY) for t in window):
        return None
    out, b, w = [], iter(batch), iter(window)
    for d in range(rank):
        out.append(next(w) if d in offset else next(b))
    return tuple(out)


def _reshape_tags(src: tuple[int, ...], dst: tuple[int, ...], tags: tuple) -> tuple | None:
    """A reshape carries the tag of a dim it keeps whole; dims it merges or splits must be
    unchanged (ID or ANY)."""
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    out = [_ANY] * len(dst)
    for src_dims, dst_dims in groups:
        real_src = [d for d in src_dims if src[d] != 1]
        real_dst = [d for d in dst_dims if dst[d] != 1]
        if len(real_src) == 1 and len(real_dst) == 1:
            out[real_dst[0]] = tags[real_src[0]]
            continue
        group = [tags[d] for d in real_src]
        if any(t not in (_ID, _ANY) for t in group):
            return None
        for d in real_dst:
            out[d] = _ANY if all(t == _ANY for t in group) else _ID
    return tuple(out)


def block_index(rel: Rel, mesh: Mesh, device: int) -> tuple[int, ...]:
    """Which block of `rel`'s global value `device` holds, per dim (0 along untiled dims)."""
    return tuple(mesh.block_index(axes, device) if axes else 0 for axes in rel.tiling)
