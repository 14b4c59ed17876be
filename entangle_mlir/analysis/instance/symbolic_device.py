"""A device-mask instance checked once for every coordinate along its mask's mesh axes: the
device's coordinates there are z3 integers (`symbolic_axes` says when that is exact,
`symbolic_claims` builds the claim).

Why. A vocab-parallel mask or local index (`InBlock`, `BlockIndex`, `Masked`) tests a value
against the device's block `[b*length, (b+1)*length)`: the claims of two devices differ by
the offset b*length, so the renaming argument of `devices._symmetric_axes` (one generic
device) does not apply, and each device's claim was a query of its own: the count grew with
the mesh. Here the block index b is the linear combination of the coordinates the mesh gives
it (`Mesh.block_index`), each coordinate c_a a z3 integer with 0 <= c_a < size(a), and one
query proves the claim for all of them.

The argument. Let A be the mesh axes the instance depends on the device along (the axes of
its masks and local indices, and those along which a table of per-device constants varies).
Fix a device r at coordinate 0 along A; its class is the devices that differ from r only
along A, one for each coordinate vector c in the box. Device d(c)'s claim is built from:
the blocks of the relations it reads (the same on the whole class: no relation is tiled or
partial over an axis of A, `_same_on_class`), its block index along a mask's axes (a linear
function of c, exactly `Mesh.block_index` at d(c)), the entries of its per-device tables (an
affine function of c, the table checked against it on every device of the class,
`_affine_entry`), and the op's local semantics (not a collective: the op runs on each device's
operands alone, the same code everywhere). So the claim built here with c symbolic, at an
integer point c in the box, is device d(c)'s claim, element for element: proving it for every
c in the box (the box a hypothesis) proves every device's of the class, and a counterexample
names the coordinates of a device whose claim fails. Classes are taken at coordinate 0 of the
axes the instance is symmetric in besides A (`devices.symmetric_axes`: every other device's claim is
one of theirs, renamed), else one class per remaining coordinate vector.

Anything else (a relation tiled or partial over A, a table not affine in c, a value of
another kind, a collective) keeps the per-device check; `solve.run_check` also falls back to
it when the symbolic query cannot be built or is inconclusive."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import z3

from entangle_mlir.analysis.instance.devices import symmetric_axes, varies_along
from entangle_mlir.analysis.instance.local_values import block_local, block_region, region_value
from entangle_mlir.analysis.instance.sources import Failure
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    DeviceScalar,
    Masked,
    Opaque,
    Rel,
    Shifted,
    Value,
)
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS, run_op
from entangle_mlir.semantics.element import (
    add,
    equal,
    int_limits,
    range_periods,
    to_z3,
    wrap_int,
)
from entangle_mlir.semantics.tensor import apply, full

TABLE_DEVICES = 16
"""Devices along which per-device tables vary from which an instance of tables alone (no
mask or local index) is checked with symbolic coordinates (`symbolic_axes`)."""


def symbolic_axes(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value],
                  mesh: Mesh | None) -> tuple[str, ...]:
    """The mesh axes A whose coordinates the instance's claim is checked for symbolically
    (see the module's docstring), in mesh order; () when the per-device check is kept: no
    mask or local index, a collective, or a value the argument does not cover. Per-device
    tables alone (a partition id's arithmetic: `pid / n`, `pid % n`) are checked so where
    they vary along `TABLE_DEVICES` devices or more: a few concrete claims cost less than a
    query, a claim per device of a large mesh more."""
    if mesh is None or info.name in COLLECTIVE_SEMANTICS:
        return ()
    values = list(ins) + list(outs)
    masks = any(isinstance(v, DEVICE_BLOCK_VALUES) for v in values)
    if not masks and not any(isinstance(v, Shifted | DeviceScalar) for v in values):
        return ()
    along: set[str] = set()
    for v in values:
        if isinstance(v, Masked):
            along |= set(v.pred.axes)
        elif isinstance(v, DEVICE_BLOCK_VALUES):
            along |= set(v.axes)
        elif isinstance(v, Shifted | DeviceScalar):
            table = v.offsets if isinstance(v, Shifted) else v.values
            along |= {a for a, _ in mesh.axes if varies_along(table, a, mesh)}
    axes = tuple(a for a, size in mesh.axes if a in along and size > 1)
    if not axes or not masks and mesh.group_size(axes) < TABLE_DEVICES:
        return ()
    if not all(_covered(v, axes, mesh) for v in values):
        return ()
    return axes


def _covered(value: Value, axes: tuple[str, ...], mesh: Mesh) -> bool:
    """`value`'s local value on every device of a class is the one `symbolic_claims` builds."""
    if isinstance(value, Opaque):
        return True
    if isinstance(value, Rel):
        return _same_on_class(value, axes)
    if isinstance(value, Shifted):
        return (_same_on_class(value.rel, axes) and int_limits(value.rel.term.dtype) is not None
                and _affine_everywhere(value.offsets, axes, mesh))
    if isinstance(value, DeviceScalar):
        return _affine_everywhere(value.values, axes, mesh)
    if isinstance(value, Masked):
        return _same_on_class(value.rel, axes) and _same_on_class(value.pred.rel, axes)
    if isinstance(value, DEVICE_BLOCK_VALUES):
        return _same_on_class(value.rel, axes)
    return False


def _same_on_class(rel: Rel, axes: tuple[str, ...]) -> bool:
    """Devices differing only along `axes` hold the same block of `rel` and no partial piece
    of it: no dim is tiled over one of `axes` (poly dims are whole on every device)."""
    if rel.partial:
        return False
    return all(d in rel.poly or not set(tiles) & set(axes) for d, tiles in enumerate(rel.tiling))


def classes(mesh: Mesh, axes: tuple[str, ...], symmetric: Sequence[str] = ()) -> list[int]:
    """The device at coordinate 0 along `axes` (and along `symmetric`) of each class."""
    fixed = set(axes) | set(symmetric)
    return [d for d in range(mesh.num_devices)
            if not any(mesh.coords(d)[a] for a in fixed)]


def _members(mesh: Mesh, device: int, axes: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(device, its coordinates along `axes`) for every device of `device`'s class."""
    coords = mesh.coords(device)
    out = []
    for point in itertools.product(*(range(mesh.size(a)) for a in axes)):
        along = dict(zip(axes, point))
        out.append((mesh.device({**coords, **along}), along))
    return out


def _affine_entry(table: Sequence, mesh: Mesh, device: int, axes: tuple[str, ...]
                  ) -> tuple[int, dict[str, int]] | None:
    """(t0, steps) with table[d(c)] = t0 + sum of steps[a] * c[a] on every device d(c) of
    `device`'s class (checked on each), or None: an entry not an integer, or not affine."""
    base = table[device]
    if not isinstance(base, int | np.integer):
        return None
    coords = mesh.coords(device)
    steps = {}
    for a in axes:
        step = table[mesh.device({**coords, a: 1})] - base
        if not isinstance(step, int | np.integer):
            return None
        steps[a] = int(step)
    for d, along in _members(mesh, device, axes):
        if table[d] != base + sum(steps[a] * c for a, c in along.items()):
            return None
    return int(base), steps


def _affine_everywhere(table: Sequence, axes: tuple[str, ...], mesh: Mesh) -> bool:
    return all(_affine_entry(table, mesh, d, axes) is not None for d in classes(mesh, axes))


class SymbolicDevice:
    """Every device of one class at once: `device` (coordinate 0 along `axes`) with its
    coordinates along `axes` the z3 integers `coords`."""

    def __init__(self, mesh: Mesh, device: int, coords: dict[str, z3.ArithRef]) -> None:
        self.mesh, self.device, self.coords = mesh, device, coords

    def block_index(self, axes: tuple[str, ...]):
        """The block index along `axes`, major first (`Mesh.block_index`, symbolic)."""
        fixed = self.mesh.coords(self.device)
        index = 0
        for a in axes:
            index = index * self.mesh.size(a) + self.coords.get(a, fixed[a])
        return index

    def entry(self, table: Sequence):
        """A per-device table's entry, and its least and greatest value over the class."""
        t0, steps = _affine_entry(table, self.mesh, self.device, tuple(self.coords))
        value = t0 + sum(steps[a] * c for a, c in self.coords.items())
        low = t0 + sum(min(0, steps[a] * (self.mesh.size(a) - 1)) for a in self.coords)
        high = t0 + sum(max(0, steps[a] * (self.mesh.size(a) - 1)) for a in self.coords)
        return value, low, high

    def shifted(self, block: np.ndarray, value: Shifted) -> np.ndarray:
        """The device's local value of `value`: its block plus its offset, in the dtype
        (wrapping around exactly as `wrap_shift` does for a concrete offset)."""
        offset, low, high = self.entry(value.offsets)
        dtype = value.rel.term.dtype
        lo, hi = int_limits(dtype)
        periods = range_periods(dtype, lo + low, hi + high)
        return apply(lambda x: wrap_int(add(x, offset), dtype, periods), block)


def symbolic_claims(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh,
                    axes: tuple[str, ...], env: dict, memo: dict, source) -> list:
    """The claim of every device, one class at a time (`symbolic_axes` gave `axes`): the
    coordinates' bounds go to `source.hypotheses`."""
    coords = {a: z3.Int(f"device.{a}") for a in axes}
    for a, c in coords.items():
        source.hypotheses.extend([c >= 0, c < mesh.size(a)])
    symmetric = [a for a in symmetric_axes(ins, outs, mesh) if a not in axes]
    regions: dict = {}

    def block(rel: Rel, device: int) -> np.ndarray:
        return region_value(rel.term, block_region(rel, mesh, device), env, memo, regions)

    claims: list = []
    for device in classes(mesh, axes, symmetric):
        where = SymbolicDevice(mesh, device, coords)
        local = []
        for i, value in enumerate(ins):
            want = tuple(info.operand_types[i].shape)
            dtype = info.operand_types[i].dtype
            if isinstance(value, Rel):
                found = block(value, device)
            elif isinstance(value, DeviceScalar):
                found = full(tuple(value.shape), where.entry(value.values)[0])
            elif isinstance(value, Shifted):
                found = where.shifted(block(value.rel, device), value)
            elif isinstance(value, DEVICE_BLOCK_VALUES):
                junk = source.tensor(f"o{i}.d{device}", want, dtype)
                found, _ = block_local(value, env, memo, mesh, device, junk, regions,
                                       where.block_index)
            else:
                found = source.tensor(f"o{i}.d{device}", want, dtype)
            if tuple(found.shape) != want:
                raise Failure("unknown", f"operand {i}'s relation gives local shape "
                              f"{found.shape}, the op's type is {want}")
            local.append(found)
        results = run_op(info, [local], None)[0]
        for j, value in enumerate(outs):
            if isinstance(value, Opaque):
                continue
            got = results[j]
            if isinstance(value, DeviceScalar):
                expect = full(tuple(value.shape), where.entry(value.values)[0])
                defined = full(expect.shape, True)
            elif isinstance(value, Shifted):
                expect = where.shifted(block(value.rel, device), value)
                defined = full(expect.shape, True)
            elif isinstance(value, DEVICE_BLOCK_VALUES):
                expect, defined = block_local(value, env, memo, mesh, device, None, regions,
                                              where.block_index)
            else:
                expect = block(value, device)
                defined = full(expect.shape, True)
            if tuple(got.shape) != tuple(expect.shape):
                raise Failure("refuted", f"result {j} has local shape {got.shape}, the "
                              f"relation says {expect.shape}")
            claims.extend(defined_claims(got, expect, defined))
    return claims


def defined_claims(got: np.ndarray, expect: np.ndarray, defined: np.ndarray) -> list:
    """`got == expect` wherever `defined` holds (a masked result is claimed only where its
    predicate holds)."""
    return [equal(x, y) if ok is True else z3.Or(z3.Not(to_z3(ok)), to_z3(equal(x, y)))
            for x, y, ok in zip(got.reshape(-1), expect.reshape(-1), defined.reshape(-1))]

