"""Which devices' claims are checked, and running the op on them: one device per distinct
claim, and only coordinate 0 along a mesh axis the instance is symmetric in (`_symmetric_axes`
states the argument); a collective runs on whole replica groups."""

from __future__ import annotations

import functools
import itertools
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
    Permuted,
    Rel,
    Reordered,
    Returning,
    Shifted,
    Value,
)
from entangle_mlir.core.terms import (
    ARITHMETIC_TERM_OPS,
    ELEMENTWISE_STABLEHLO,
    Term,
    reshape_groups,
    roll_parts,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS, replica_groups, run_op
from entangle_mlir.semantics.element import SemanticsError
from entangle_mlir.semantics.groups import GROUPED, GroupError, permute_pairs
from entangle_mlir.semantics.tensor import full


def _value_tags(values: Sequence[Value], axis: str, mesh: Mesh, side: str
                ) -> list[tuple[Rel, tuple]] | None:
    """The relations inside `values`, each with the action the rotation along `axis` has on
    its global tensor (`_expected_tags`); None for a value the symmetry argument of
    `_symmetric_axes` does not cover along `axis`. A device mask or local index of blocks
    over other axes, or a tensor plus offsets that do not vary along `axis`, is computed
    alike on devices that differ only along `axis`; a value whose blocks are in a
    device-dependent order (`Reordered`, `Returning`, `Permuted`) is covered where its table
    moves with the rotation (`_table_action`). `side`: "in" (operands), "out" (results),
    "sums" (results, a partial sum over the group in a ring's order admitted: `one_block`)."""
    found: list[tuple[Rel, tuple]] = []
    for v in values:
        if isinstance(v, Rel):
            if axis in v.partial:
                return None
            found.append((v, _expected_tags(v, axis)))
        elif isinstance(v, Opaque) and side != "in":
            continue
        elif isinstance(v, Shifted):
            if axis in v.rel.partial or varies_along(v.offsets, axis, mesh):
                return None
            found.append((v.rel, _expected_tags(v.rel, axis)))
        elif isinstance(v, InBlock | BlockIndex):
            if axis in v.axes or axis in v.rel.partial:
                return None
            found.append((v.rel, _expected_tags(v.rel, axis)))
        elif isinstance(v, Masked):
            if axis in v.pred.axes or axis in v.rel.partial or axis in v.pred.rel.partial:
                return None
            found += [(v.rel, _expected_tags(v.rel, axis)),
                      (v.pred.rel, _expected_tags(v.pred.rel, axis))]
        elif isinstance(v, Reordered | Returning | Permuted):
            tags = _table_action(v, axis, mesh, side)
            if tags is None:
                return None
            found.append((v.rel, tags))
        else:
            return None
    return found


def _table_action(value: Reordered | Returning | Permuted, axis: str, mesh: Mesh,
                  side: str) -> tuple | None:
    """The rotation's action on the global tensor of a value whose blocks sit in a
    device-dependent order, or None when its table does not move with the rotation rho
    along `axis` (device d to the device one step further, cyclically).

    * `Permuted` (device d holds the block of `sources[d]`): covered when
      `sources[rho d] = rho sources[d]`; the action is its relation's.
    * `Reordered` (device d holds the blocks of `dim` in `orders[d]`): covered when the
      orders do not change along `axis` (`orders[rho d] = orders[d]`; the action is its
      relation's), or when `dim` has one block per coordinate of `axis` and
      `orders[rho d][j] = orders[d][j] + 1 (mod n)` (a ring's arrival order): the rotation
      then moves the blocks of `dim` as it moves a dim split over `axis` alone, and that is
      its action there. A partial value over `axis` only as an input (its pieces are split
      over the group, `claims.pieces_of`); as a result its claim is a sum over the whole
      group, which one device cannot check (`one_block` checks one block of it instead:
      `side` "sums").
    * `Returning` (device d holds the sum over q in `sources[d]` of block `blocks[d]` of q's
      piece): covered when `sources[rho d] = rho sources[d]` and, over its partial axis
      `axis` (the only one), `blocks[rho d] = blocks[d] + 1 (mod n)`, else
      `blocks[rho d] = blocks[d]`; the blocks of `dim` then move as for `Reordered`.

    Why the pieces of a partial value may be renamed too: they are every split of the
    group's block T into one piece p_q per device q; with T commuting with the action sigma
    (`_dim_tags` checks it), p'_q = sigma p_(rho q) is a split of T(pi L) = sigma T(L), and
    device d's local value of it is device rho d's of p (the tables moving with rho)."""
    n = mesh.size(axis)
    rho = _rotation(mesh, axis)
    devices = range(mesh.num_devices)
    rel = value.rel
    expected = list(_expected_tags(rel, axis))
    if isinstance(value, Permuted):
        if axis in rel.partial or any(value.sources[rho[d]] != rho[value.sources[d]]
                                      for d in devices):
            return None
        return tuple(expected)
    if isinstance(value, Reordered):
        orders = value.orders
        if all(orders[rho[d]] == orders[d] for d in devices):
            return None if axis in rel.partial else tuple(expected)
        if axis in rel.partial and (side == "out" or rel.partial != (axis,)):
            return None
        if any(len(o) != n for o in orders) or any(
                orders[rho[d]] != tuple((b + 1) % n for b in orders[d]) for d in devices):
            return None
        expected[value.dim] = (rel.term.shape[value.dim], (axis,))
        return tuple(expected)
    if any(value.sources[rho[d]] != frozenset(rho[q] for q in value.sources[d])
           for d in devices):
        return None
    if axis not in rel.partial:
        return tuple(expected) if all(value.blocks[rho[d]] == value.blocks[d]
                                      for d in devices) else None
    if rel.partial != (axis,) or any(value.blocks[rho[d]] != (value.blocks[d] + 1) % n
                                     for d in devices):
        return None
    expected[value.dim] = (rel.term.shape[value.dim], (axis,))
    return tuple(expected)


@functools.lru_cache(maxsize=64)
def _rotation(mesh: Mesh, axis: str) -> list[int]:
    """rho: each device's neighbour one step further along `axis`, cyclically (the other
    coordinates the same). (Kept per mesh and axis: every ring instance asks.)"""
    n = mesh.size(axis)
    out = []
    for d in range(mesh.num_devices):
        coords = mesh.coords(d)
        out.append(mesh.device({**coords, axis: (coords[axis] + 1) % n}))
    return out


def _permute_moves_with(info: OpInfo, axis: str, mesh: Mesh) -> bool:
    """A collective_permute whose (source, target) pairs the rotation along `axis` maps to
    pairs: device rho d then receives from rho of d's source (or nothing when d does)."""
    try:
        pairs = set(permute_pairs(info.attrs, mesh.replicas, mesh.partitions))
    except GroupError:
        return False
    rho = _rotation(mesh, axis)
    return all((rho[s], rho[t]) in pairs for s, t in pairs)


def varies_along(table, axis: str, mesh: Mesh) -> bool:
    """A per-device table differs between two devices that differ only along `axis`."""
    if len(table) != mesh.num_devices:
        return any(table[d] != table[mesh.device({**mesh.coords(d), axis: 0})]
                   for d in range(mesh.num_devices))
    return axis in _varying_axes(tuple(table), tuple(mesh.axes))


@functools.lru_cache(maxsize=1024)
def _varying_axes(table: tuple, axes: tuple[tuple[str, int], ...]) -> frozenset[str]:
    """The axes along which a table with one entry per device changes: the table laid out
    on the mesh (device ids are row-major over the axes, the first major: `Mesh.device`),
    compared with its slice at coordinate 0 along each axis. Cached: an instance's tables
    are asked about once per axis and per rule, the same tables on every instance."""
    grid = np.array(table, dtype=object).reshape(tuple(size for _, size in axes))
    return frozenset(a for i, (a, _) in enumerate(axes)
                     if bool((grid != np.take(grid, [0], axis=i)).any()))


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
        if info.name == "stablehlo.collective_permute":
            symmetric = [a for a in _symmetric_axes(ins, outs, mesh)
                         if _permute_moves_with(info, a, mesh)]
        else:
            grouped = _collective_axes(info, mesh)
            if grouped is None:
                return everyone
            symmetric = [a for a in _symmetric_axes(ins, outs, mesh) if a not in grouped]
            symmetric += all_to_all_axes(info, ins, outs, mesh, grouped)
        return [d for d in everyone if not any(mesh.coords(d)[a] for a in symmetric)]
    symmetric = set(_symmetric_axes(ins, outs, mesh))
    keyed = _keyed_axes(ins, outs, mesh)
    inert = {a for a, _ in mesh.axes} - keyed if keyed is not None else set()
    candidates = coordinate_zero(mesh, symmetric | inert)
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


def _keyed_axes(ins: list[Value], outs: list[Value], mesh: Mesh) -> set[str] | None:
    """The mesh axes along which some value's part of `distinct_devices`' key (a block index,
    a table entry) can change, or None when a value has no such key (the key is then the
    device itself). Two devices differing only along other axes have equal keys, so those
    axes need checking at coordinate 0 alone: the claims are the same, not enumerated."""
    found: set[str] = set()
    for value in list(ins) + list(outs):
        if isinstance(value, Shifted) and not value.rel.partial:
            found |= {a for axes in value.rel.tiling for a in axes}
            found |= {a for a, _ in mesh.axes if varies_along(value.offsets, a, mesh)}
        elif isinstance(value, Rel) and not value.partial:
            found |= {a for axes in value.tiling for a in axes}
        elif isinstance(value, DeviceScalar):
            found |= {a for a, _ in mesh.axes if varies_along(value.values, a, mesh)}
        else:
            return None
    return found


def coordinate_zero(mesh: Mesh, fixed: set[str]) -> list[int]:
    """The devices at coordinate 0 along the axes `fixed`, in increasing order (enumerated
    over the other axes only)."""
    free = [(a, size) for a, size in mesh.axes if a not in fixed]
    points = itertools.product(*(range(size) for _, size in free))
    return sorted(mesh.device({**{a: 0 for a, _ in mesh.axes},
                               **{a: c for (a, _), c in zip(free, point)}})
                  for point in points)


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


UNREAD = type("Unread", (), {"__repr__": lambda self: "UNREAD"})()
"""What an all_to_all checked on part of its group holds where no checked device reads
(`chunk_reads`); a checked result containing it read what was not computed."""


def chunk_reads(info: OpInfo, checked: list[int], mesh: Mesh | None, single: bool
                ) -> dict[int, tuple[list[int], int]] | None:
    """For an all_to_all checked on part of a replica group (`all_to_all_axes`): each group
    member of a checked device, with the positions in the group of the checked devices
    (the chunks along the split dim the checked devices receive from it) and the group's
    size (the number of chunks). None otherwise."""
    if single or info.name != "stablehlo.all_to_all" or len(checked) == mesh.num_devices:
        return None
    try:
        groups = replica_groups(info, mesh)
    except SemanticsError as err:
        raise Failure("unknown", str(err)) from None
    wanted = set(checked)
    reads: dict[int, tuple[list[int], int]] = {}
    partial = False
    for group in groups:
        positions = [p for p, d in enumerate(group) if d in wanted]
        if positions:
            partial = partial or len(positions) < len(group)
            for m in group:
                reads[m] = (positions, len(group))
    return reads if partial else None


def needed_devices(info: OpInfo, checked: list[int], mesh: Mesh | None, single: bool
                   ) -> set[int]:
    """The devices whose operands the checked devices' results read: themselves, for a
    collective_permute checked on some devices only, their sources, and for an all_to_all
    checked on part of a group, the group (`chunk_reads`)."""
    reads = chunk_reads(info, checked, mesh, single)
    if reads is not None:
        return set(reads)
    if single or info.name != "stablehlo.collective_permute" or len(checked) == \
            mesh.num_devices:
        return set(checked)
    try:
        pairs = permute_pairs(info.attrs, mesh.replicas, mesh.partitions)
    except GroupError as err:
        raise Failure("unknown", str(err)) from None
    source_of = {t: s for s, t in pairs}
    return set(checked) | {source_of[d] for d in checked if d in source_of}


def run_devices(info: OpInfo, local: list[list[np.ndarray]], checked: list[int],
                mesh: Mesh | None, single: bool) -> dict[int, list[np.ndarray]]:
    """The results of the checked devices. A collective checked on whole replica groups only
    (`distinct_devices`) runs on those groups, renumbered, as a mesh of their own."""
    if single or info.name not in COLLECTIVE_SEMANTICS or len(checked) == mesh.num_devices:
        return dict(zip(checked, run_op(info, [local[d] for d in checked],
                                        None if single else mesh)))
    if chunk_reads(info, checked, mesh, single) is not None:
        # the chunks the checked devices receive were filled in; every other position, and
        # every device outside their groups, holds UNREAD (`chunk_reads`)
        unread = [full(tuple(t.shape), UNREAD) for t in info.operand_types]
        results = run_op(info, [local[d] if all(x is not None for x in local[d]) else unread
                                for d in range(mesh.num_devices)], mesh)
        for d in checked:
            if any(x is UNREAD for r in results[d] for x in np.asarray(r).reshape(-1)):
                raise Failure("unknown", "the all_to_all read a chunk the check did not fill")
        return {d: results[d] for d in checked}
    if info.name == "stablehlo.collective_permute":
        read = needed_devices(info, checked, mesh, single)
        zeros = [full(tuple(t.shape), 0) for t in info.operand_types]
        results = run_op(info, [local[d] if d in read else zeros
                                for d in range(mesh.num_devices)], mesh)
        return {d: results[d] for d in checked}
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


def _symmetric_axes(ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh, side: str = "out"
                    ) -> tuple[str, ...]:
    """The mesh axes the instance's claim is symmetric in: for such an axis `a`, the claim
    of a device at coordinate i along `a` is the claim of the device at coordinate 0 (same
    other coordinates) with the global variables renamed, so proving the latter proves it.

    The argument. Let sigma be the rotation of the coordinates of `a` by i (c to c + i mod
    n). It acts on a global tensor dim tiled over axes T containing `a` (and not poly) by
    moving block b to the block whose `a` coordinate is rotated (a fixed permutation of the
    dim's positions, determined by its size and T); on other dims it acts as the identity.
    Choose the renaming pi of the leaf variables as that action on each leaf that is itself
    an input term or that an input broadcasts (with that input's tiling, `_leaf_tags`), the
    identity on other leaves (any choice is sound: what follows checks it). If every input
    and output term t commutes with it, t(pi L) = sigma_T t(L) for its own tiling T, then
    the block device d_0 (coordinate 0) holds of t(pi L) is the block d_i holds of t(L).
    The op runs the same local program on every device (no device-dependent values; a
    collective only when its replica groups are those of mesh axes not containing `a`,
    `_collective_axes`: sigma then maps d_i's group to d_0's, member k to member k, and the
    collective computes each device's result from its group's operands and its position in
    the group; a collective_permute only when sigma maps its pairs to pairs,
    `_permute_moves_with`: d_i then receives from sigma of d_0's source), so device d_i's
    claim `op(blocks of inputs at d_i) == block of output at d_i` over L is exactly d_0's
    claim over pi L; the claim is proved for all values of the variables (and the
    hypotheses it assumes at pi L are those of d_i at L: divisors of d_i's computation and
    the global terms', permuted). Partial values over other axes group devices that differ
    only in those axes, so sigma maps a group to a group and its fresh split variables to
    theirs; a value partial over `a` makes `a` not symmetric, but for the pieces of a ring's
    partial sums, whose tables move with the rotation (`_table_action`: ring attention's
    blocks in arrival order and the key and value gradients going back around the ring).

    Commuting is established per term node by tags (`_dim_tags`): a dim is ANY (the term is
    constant along it), ID (only the identity is known to commute) or (size, T) (sigma_T
    commutes). Leaves take their input's tags; elementwise ops need equal tags (ANY matches
    anything); broadcast, transpose and reshapes that keep a tagged dim whole carry them; a
    dot_general or reduction over permuted dims is invariant (a sum, max or product over
    all positions does not depend on their order); a roll of a dim that sigma rotates as a
    whole (T's major axis is `a`) commutes with it (two cyclic shifts commute); a top_k
    works row by row along its last dim, so it moves its rows as its operand's where that
    last dim is left alone (ID or ANY; its result there is ID: the indices are positions);
    iota is ID along its dim (it is the position). Any other node commutes only when its
    operands are unchanged (every tag ID or ANY); otherwise the axis is not symmetric and
    every device is checked."""
    symmetric = []
    for axis, size in mesh.axes:
        if size == 1:
            continue
        in_rels = _value_tags(ins, axis, mesh, "in")
        out_rels = _value_tags(outs, axis, mesh, side) if in_rels is not None else None
        if out_rels is not None and _commutes(in_rels, out_rels, axis):
            symmetric.append(axis)
    return tuple(symmetric)


def symmetric_axes(ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes the instance's claim is symmetric in (`_symmetric_axes` states the
    argument): checking the devices at coordinate 0 along them checks every device."""
    return _symmetric_axes(ins, outs, mesh)


def _commutes(in_rels: list[tuple[Rel, tuple]], out_rels: list[tuple[Rel, tuple]],
              axis: str) -> bool:
    """Every input and output term commutes with the action its tags name (the renaming of
    the leaves chosen from the inputs, `_leaf_tags`): see `_symmetric_axes`."""
    leaves: dict[int, tuple] = {}
    for rel, expected in in_rels:
        found = _leaf_tags(rel, expected)
        if found is not None and leaves.setdefault(*found) != found[1]:
            return False
    memo: dict[int, tuple | None] = {}
    try:
        return all(_compatible(_dim_tags(r.term, leaves, memo, axis), expected)
                   for r, expected in in_rels + out_rels)
    except RecursionError:
        return False


def all_to_all_axes(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh,
                    grouped: tuple[str, ...]) -> list[str]:
    """The group axis of an all_to_all whose claim is symmetric in it: only the device at
    coordinate 0 along it need be checked (the checked device's operands then hold, of each
    group member's block, only the chunk it receives: `claims`).

    The argument. The all_to_all's groups are those of one mesh axis `a` (n devices, member
    p at coordinate p, `_collective_axes`); member p splits its operand along the split dim
    S into n chunks and receives chunk p of every member m, concatenated along the concat
    dim in the order of m. Let sigma rotate, along dim S of a global tensor, the n chunks of
    each block S is split into by its tiling T_in[S] (which must not contain `a`: every
    member then holds the same range of S) by i: the action a dim tiled over T_in[S] + (a,)
    gets from the rotation of `a`'s coordinates (tag (N_S, T_in[S] + (a,))), the identity
    on every other dim (the concat dim, split over `a` in the operand, included). Choose the
    renaming pi of the leaves from the operands as `_symmetric_axes` does, and require every
    operand term V to commute with it (V(pi L) = sigma V(L), the tags above) and every
    result term U with the rotation of `a` as it acts on U's tiling (`_expected_tags`: only
    dim S tiled over `a`, as T_in[S] + (a,)). Then member m's block of V(pi L) is its block
    of V(L) with its n chunks along S rotated by i (sigma moves positions within each block
    of T_in[S] only, and no other dim), so chunk 0 of it is chunk i of the block at L: the
    result at coordinate 0 over pi L is the result at coordinate i over L. And the block of
    U(pi L) = sigma U(L) at coordinate 0 is the block of U(L) at coordinate i (along S, the
    blocks of T_in[S] + (a,) with `a` minor are the chunks). So the claim of the device at
    coordinate i is that of coordinate 0 with the variables renamed; proving the latter for
    every value of the variables proves both. Only plain relations (not partial, no poly
    dims: a partial value's split is per device) and the untupled form (one operand and
    result per pair) are covered; any other instance keeps every device."""
    if info.name != "stablehlo.all_to_all" or len(grouped) != 1:
        return []
    (axis,) = grouped
    split, concat = info.attrs.get("split_dimension"), info.attrs.get("concat_dimension")
    n = mesh.size(axis)
    if split is None or concat is None or info.attrs.get("split_count", n) != n or \
            len(ins) != len(outs) or not ins:
        return []
    in_rels: list[tuple[Rel, tuple]] = []
    out_rels: list[tuple[Rel, tuple]] = []
    for v, u in zip(ins, outs):
        if not (isinstance(v, Rel) and isinstance(u, Rel)) or v.partial or u.partial or \
                v.poly or u.poly or len(v.tiling) != len(u.tiling) or split >= len(v.tiling):
            return []
        chunked = v.tiling[split] + (axis,)
        if axis in v.tiling[split] or u.tiling[split] != chunked or \
                v.term.shape[split] != u.term.shape[split] or \
                v.term.shape[split] % mesh.group_size(chunked):
            return []
        in_rels.append((v, tuple((size, chunked) if d == split else _ID
                                 for d, size in enumerate(v.term.shape))))
        out_rels.append((u, _expected_tags(u, axis)))
    return [axis] if _commutes(in_rels, out_rels, axis) else []


def one_block(ins: Sequence[Value], outs: Sequence[Value], mesh: Mesh | None) -> tuple[str, ...]:
    """The mesh axes along which a claim that sums over the whole group (a result partial
    over the axis in a ring's order: `Reordered` with pieces, every device of the group
    checked) needs checking at one block of its dim only.

    The argument. With `_table_action`'s renaming (pi on the leaves, p'_q = sigma p_(rho q)
    on the pieces), device d's result at (pi L, p') is device rho d's at (L, p), and
    un-reordering it by d's order is sigma of un-reordering that by rho d's (the orders
    move with rho). The sum over the group is then sigma of the sum at (L, p), and the
    result's term commutes with sigma (checked as for `_symmetric_axes`), so the claim at
    (pi L, p') restricted to block 0 of the dim is the claim at (L, p) restricted to block
    rho^i(0) = i. Proving block 0 for every leaf value and every split proves every block.
    (Proving it under fewer hypotheses, the pieces' sums on block 0 alone, proves more.)"""
    if mesh is None or not outs or not all(isinstance(v, Reordered) and v.rel.partial
                                           for v in outs):
        return ()
    found = []
    for axis in _symmetric_axes(ins, outs, mesh, "sums"):
        if all(v.rel.partial == (axis,) and len(v.orders[0]) == mesh.size(axis) for v in outs):
            found.append(axis)
    return tuple(found)


def _leaf_tags(rel: Rel, expected: tuple) -> tuple[int, tuple] | None:
    """(leaf serial, tags) choosing the renaming on a leaf an input is, broadcasts (a poly
    broadcast keeps its operand) or reshapes (a dim it keeps whole): the input's own action
    (`expected`) on the dims the leaf fills. Only a choice: every term is then checked
    against its own action."""
    term = rel.term
    while term.op == "lin" and len(term.args) == 1 and not term.attrs[0]:
        term = term.args[0]  # k * x moves as x does
    rolled = roll_parts(term, term.attrs[0]) if term.op == "concatenate" else None
    if rolled is not None and rolled[0].op == "arg":  # a ring's block moved: a roll of a leaf
        return rolled[0].serial, expected
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


def _dim_tags(term: Term, leaves: dict[int, tuple], memo: dict, axis: str) -> tuple | None:
    """Per dim, how the renaming acts on `term`'s value (see `_symmetric_axes`); None when
    the term is not known to commute with it."""
    if term.serial in memo:
        return memo[term.serial]
    memo[term.serial] = None
    rank = len(term.shape)
    op = term.op
    found: tuple | None
    rolled = roll_parts(term, term.attrs[0]) if op == "concatenate" else None
    if op == "arg":
        found = leaves.get(term.serial, (_ID,) * rank)
    elif op == "splat":
        found = (_ANY,) * rank
    elif not term.args:
        found = (_ID,) * rank
    elif rolled is not None:
        found = _roll_tags(_dim_tags(rolled[0], leaves, memo, axis), term.attrs[0], axis)
    else:
        args = [_dim_tags(a, leaves, memo, axis) for a in term.args]
        found = None if any(a is None for a in args) else _node_tags(term, args)
    memo[term.serial] = found
    return found


def _roll_tags(base: tuple | None, dim: int, axis: str) -> tuple | None:
    """A cyclic roll of `dim` commutes with the rotation where the rotation moves `dim` by
    a cyclic shift too (two cyclic shifts commute): along a dim it leaves alone (ID, ANY),
    or one split over axes whose major one is `axis` (rotating the major coordinate shifts
    every position by the same number of blocks)."""
    if base is None:
        return None
    tag = base[dim]
    if tag in (_ID, _ANY) or tag[1][:1] == (axis,):
        return base
    return None


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
    if op == "chlo.top_k" and len(args) == 1 and rank:
        # row by row along the last dim: the rows move as the operand's; the selected dim
        # only where the operand's is left alone (its indices are positions)
        *rows, last = args[0]
        return None if last not in (_ID, _ANY) else (*rows, _ID)
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
