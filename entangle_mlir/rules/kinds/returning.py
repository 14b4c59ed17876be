"""Contributions sent back to the owners of their blocks around a ring (`Returning`): ring
attention's key and value cotangents.

jax's transpose of `k_{i+1} = ppermute(k_i)` is `ct_i = dk_i + ppermute_reverse(ct_{i+1})`:
at step i device d computes the contribution of its own queries to key block (d - i) % n, and
after i reverse hops it reaches the block's owner. Once the backward's per-step contractions
are one contraction over all the keys (`online_backward._ring_return`), step i's contribution
is slice i of a `Reordered` partial value (a partial sum over the ring's axis whose blocks of
the key dim are in the device's arrival order), and:

* a slice of exactly one block j of a `Reordered` partial value is `Returning`: device d holds
  block `orders[d][j]` of its own piece (sources {d});
* a collective_permute moves the pieces: device d holds what its source held (within the
  partial group: pieces never leave their group);
* an add of two `Returning` values of the same partial value, holding the same block on every
  device, from disjoint sources, holds the sum over both sources; the same block counted
  twice (overlapping sources), other blocks or another partial value is the error;
* when every device holds the sum over its whole group of its own block, the value is the
  partial sum's term split along the dim (the owner has every query block's contribution).

Every rule here is checked per instance by Z3 (`instance.claims._build_claims`, the pieces are
shared symbolic splits) and by lemmas in tests/test_returning_lemmas.py.
"""

from __future__ import annotations

from dataclasses import replace

from entangle_mlir.core.mesh import axes_str
from entangle_mlir.core.relations import Opaque, Rel, Reordered, Returning, Value
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.groups import GroupError, permute_pairs

RETURNING_OPS = frozenset({"stablehlo.slice", "stablehlo.collective_permute", "stablehlo.add"})


def unsupported(op_name: str, what: str) -> Opaque:
    return Opaque(f"{op_name} of {what} is not supported (only slices of one block, "
                  "collective_permutes and adds move the pieces of a partial sum back to "
                  "the owners of their blocks)", category="unsupported")


def slice_of_reordered(info: OpInfo, x: Reordered, ctx: RuleContext) -> Value:
    """Block j of a `Reordered` partial value along its reordered dim (every other dim whole,
    unit strides; as many blocks as the partial group has devices): device d's piece's block
    `orders[d][j]`."""
    attrs = info.attrs
    starts, limits = tuple(attrs["start_indices"]), tuple(attrs["limit_indices"])
    strides = tuple(attrs.get("strides") or (1,) * len(starts))
    local = info.operand_types[0].shape
    count = len(x.orders[0])
    size = local[x.dim] // count if count else 0
    for d, (lo, hi) in enumerate(zip(starts, limits)):
        if d != x.dim and (lo, hi) != (0, local[d]):
            return unsupported(info.name, "a reordered partial value cut along another dim")
    lo, hi = starts[x.dim], limits[x.dim]
    if any(s != 1 for s in strides) or not size or lo % size or hi - lo != size or (
            x.pieces is None or x.rel.tiling[x.dim] or x.rel.kind != "sum"
            or count != ctx.mesh.group_size(tuple(x.rel.partial))):
        return unsupported(info.name, "a reordered partial value (not one whole block)")
    j = lo // size
    devices = range(len(x.orders))
    return Returning(x.rel, x.dim, tuple(x.orders[d][j] for d in devices),
                     tuple(frozenset({d}) for d in devices), x.pieces)


def _group(mesh, rel: Rel, device: int) -> frozenset[int]:
    """The devices whose pieces add up with `device`'s (its partial group)."""
    return frozenset(next(g for g in mesh.groups_for(tuple(rel.partial)) if device in g))


def permute(info: OpInfo, x: Returning, ctx: RuleContext) -> Value:
    """Device d takes its source's blocks and sources; every device must receive (a missing
    one would hold zeros), from a device of its own partial group."""
    mesh = ctx.mesh
    try:
        moved_from = {t: s for s, t in permute_pairs(info.attrs, mesh.replicas,
                                                     mesh.partitions)}
    except GroupError as err:
        return Opaque(str(err), category="wrong_groups")
    if len(moved_from) != mesh.num_devices:
        missing = sorted(set(range(mesh.num_devices)) - set(moved_from))
        return Opaque(f"collective_permute leaves devices {missing[:8]} without data (they "
                      "receive zeros)", category="wrong_order")
    for target, source in moved_from.items():
        if source not in _group(mesh, x.rel, target):
            return Opaque(f"collective_permute moves pieces of a partial sum over "
                          f"{axes_str(x.rel.partial)} between groups: device {target} receives "
                          f"device {source}'s", category="wrong_order")
    devices = range(mesh.num_devices)
    return complete(replace(x, blocks=tuple(x.blocks[moved_from[d]] for d in devices),
                            sources=tuple(x.sources[moved_from[d]] for d in devices)), ctx)


def add(info: OpInfo, a: Returning, b: Returning, ctx: RuleContext) -> Value:
    """The sum of two contributions to the same block on every device, from disjoint sources
    of one partial value."""
    if a.pieces is None or a.pieces is not b.pieces or (a.rel, a.dim) != (b.rel, b.dim):
        return Opaque("add of pieces of different partial sums (contributions of one ring "
                      "step joined with another computation's)", category="layout_mismatch")
    for d, (x, y) in enumerate(zip(a.blocks, b.blocks)):
        if x != y:
            return Opaque(f"add of contributions to different blocks: on device {d}, block {x} "
                          f"of dim {a.dim} and block {y} (contributions sent back to the "
                          "wrong devices)", category="wrong_order")
    for d, (x, y) in enumerate(zip(a.sources, b.sources)):
        if x & y:
            return Opaque(f"add counts the contribution of device(s) {sorted(x & y)} to block "
                          f"{a.blocks[d]} of dim {a.dim} twice on device {d}",
                          category="wrong_order")
    return complete(replace(a, sources=tuple(x | y for x, y in zip(a.sources, b.sources))), ctx)


def complete(x: Returning, ctx: RuleContext) -> Value:
    """`x` as the partial sum's term split along its dim when every device holds the sum over
    its whole group of its own block; else `x`."""
    mesh = ctx.mesh
    axes = tuple(x.rel.partial)
    for d in range(mesh.num_devices):
        if x.blocks[d] != mesh.block_index(axes, d) or x.sources[d] != _group(mesh, x.rel, d):
            return x
    tiling = list(x.rel.tiling)
    tiling[x.dim] = axes
    return replace(x.rel, tiling=tuple(tiling), partial=(), kind="", partial_origin=None)


def apply(info: OpInfo, operands: list[Value], ctx: RuleContext) -> list[Value]:
    """An op with a `Returning` operand (or the slice of a `Reordered` partial value)."""
    name = info.name
    if ctx.mesh is None or ctx.is_global:
        return [unsupported(name, "pieces of a partial sum outside a manual computation")]
    if name == "stablehlo.slice" and isinstance(operands[0], Reordered):
        return [slice_of_reordered(info, operands[0], ctx)]
    if name == "stablehlo.collective_permute" and isinstance(operands[0], Returning):
        return [permute(info, operands[0], ctx)]
    if name == "stablehlo.add" and all(isinstance(v, Returning) for v in operands):
        return [add(info, operands[0], operands[1], ctx)]
    return [unsupported(name, "pieces of a partial sum on their way back to their owners")
            ] * len(info.result_types)
