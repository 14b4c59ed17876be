"""The claim's conjuncts: each checked device's local operands derived from the input
relations (a partial value split every possible way), the op run on them, and the results
compared with the blocks of the output terms (reduced over the output's partial axes)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from entangle_mlir.analysis.instance.common import rels_of, value_key
from entangle_mlir.analysis.instance.devices import (
    UNREAD,
    block_index,
    chunk_reads,
    distinct_devices,
    needed_devices,
    one_block,
    run_devices,
)
from entangle_mlir.analysis.instance.local_values import (
    block_local,
    block_region,
    derived_local,
    operand_window_dims,
    region_value,
    window_info,
)
from entangle_mlir.analysis.instance.sources import Failure, LazyLeaves, leaf_args, opaque_resolver
from entangle_mlir.analysis.instance.symbolic_device import defined_claims, symbolic_claims
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    DeviceScalar,
    Opaque,
    Permuted,
    Rel,
    Reordered,
    Returning,
    Shifted,
    Value,
    Windowed,
)
from entangle_mlir.core.terms import DENSE_VALUES, Term
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules.base import RuleContext
from entangle_mlir.semantics.collectives import run_op
from entangle_mlir.semantics.element import (
    collect_divisors,
    collect_roundings,
    combine,
    equal,
    is_bool_dtype,
    is_int_dtype,
    is_z3,
    monotone_hypotheses,
    sum_list,
    sum_periods,
    to_z3,
    wrap_shift,
)
from entangle_mlir.semantics.evaluate import evaluate_term
from entangle_mlir.semantics.ops import OP_SEMANTICS
from entangle_mlir.semantics.tensor import apply, full, obj_array, wrap_array


def _local_claims(results: dict, j: int, expected: dict) -> list:
    """Result `j` on each device of `expected` equals its expected local value, element for
    element (a local shape that differs refutes the claim outright)."""
    claims = []
    for d, expect in expected.items():
        if tuple(results[d][j].shape) != tuple(expect.shape):
            raise Failure("refuted", f"result {j} has local shape {results[d][j].shape} on "
                          f"device {d}")
        claims.extend(equal(x, y) for x, y in zip(results[d][j].reshape(-1),
                                                  expect.reshape(-1)))
    return claims


def _partial_groups(rel: Rel, mesh: Mesh | None, single: bool,
                    devices: Iterable[int] | None = None) -> list[list[int]]:
    """The groups of devices whose pieces of `rel` add up to its block (one device each when
    it is not partial: of `devices` alone when given, the ones the claim reads or checks, so
    a claim on a few devices of a large mesh does not enumerate the rest)."""
    if single:
        return [[0]]
    if not rel.partial:
        return [[d] for d in (sorted(devices) if devices is not None
                              else range(mesh.num_devices))]
    if set(rel.partial) & set(rel.tiled_axes):
        raise Failure("unknown", "a relation is both split and partial over the same axis")
    return mesh.groups_for(tuple(rel.partial))


def build(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
          ctx: RuleContext, source, symbolic: tuple[str, ...] = ()) -> list:
    """The claim's conjuncts (z3 BoolRefs or Python bools), hypotheses go to `source`.
    `symbolic`: the mesh axes along which the devices' coordinates are z3 integers
    (`symbolic_device.symbolic_axes` gave them), else every checked device on its own."""
    single = ctx.is_global or mesh is None
    devices = 1 if single else mesh.num_devices
    terms = [r.term for v in list(ins) + list(outs) for r in rels_of(v)]
    env: dict = LazyLeaves(source, leaf_args(terms))
    dense: dict[bytes, np.ndarray] = {}
    if info.name == "stablehlo.constant":
        for v in outs:
            if not isinstance(v, Rel):
                continue
            value = OP_SEMANTICS["stablehlo.constant"](info, [])[0]
            if v.term.op == "dense":
                dense[v.term.attrs[0]] = value
            elif v.term.op == "broadcast" and v.term.args[0].op == "dense" and value.size:
                scalar = v.term.args[0]  # a splat kept whole, e.g. -0.0 (rules/movement.py)
                dense[scalar.attrs[0]] = value.reshape(-1)[:1].reshape(scalar.shape)

    def resolve(term: Term) -> np.ndarray:
        key = term.attrs[0]
        if key not in dense:
            known = DENSE_VALUES.get(key)
            dense[key] = (obj_array([int(v) for v in np.asarray(known).reshape(-1)],
                                    term.shape) if known is not None else
                          source.tensor(f"dense{key.hex()[:8]}", term.shape, term.dtype))
        return dense[key].reshape(term.shape)

    env["dense"] = resolve
    env["opaque"] = opaque_resolver(source)
    memo: dict[int, np.ndarray] = {}
    with collect_divisors() as divisors, collect_roundings() as roundings:
        claims = (symbolic_claims(info, ins, outs, mesh, symbolic, env, memo, source)
                  if symbolic else
                  _build_claims(info, ins, outs, mesh, single, devices, env, memo, source))
    if any(not is_z3(d) for d in divisors):
        raise Failure("skip-trial", "a division by zero")
    source.hypotheses.extend(to_z3(d) != 0 for d in divisors if is_z3(d))
    source.hypotheses.extend(monotone_hypotheses(roundings))
    return claims


def _build_claims(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh | None,
                  single: bool, devices: int, env: dict, memo: dict, source) -> list:

    checked = distinct_devices(info, ins, outs, mesh, single, devices)
    needed = needed_devices(info, checked, mesh, single)
    first_block = bool(one_block(ins, outs, mesh)) if not single else False
    regions: dict[tuple, np.ndarray] = {}

    def block_of(rel: Rel, device: int) -> np.ndarray:
        """Device `device`'s block of `rel`'s global value, computed on that block only."""
        if single:
            return evaluate_term(rel.term, env, memo)
        return region_value(rel.term, block_region(rel, mesh, device), env, memo, regions)

    pieces: dict[object, _Pieces] = {}

    def pieces_of(value: Reordered | Returning, name: str, dtype: str) -> _Pieces:
        """Every device's piece of the partial value `value.pieces` names (one symbolic split
        per partial value, shared by every operand and result of the instance naming it)."""
        key = _pieces_key(value) if value.pieces is not None else ("fresh", name)
        if key not in pieces:
            pieces[key] = _Pieces(value, name, dtype, mesh, single, source, regions_of,
                                  needed, first_block)
        found = pieces[key]
        if found.count != _block_count(value, mesh):
            raise Failure("unknown", "pieces of a partial sum cut into different blocks")
        return found

    def regions_of(rel: Rel, group: list[int], dim: int, b: int, count: int) -> np.ndarray:
        """Block `b` of `count` along `dim` of the block of `rel` that `group` holds."""
        region = list(block_region(rel, mesh, group[0]))
        lo, hi = region[dim]
        size = (hi - lo) // count
        region[dim] = (lo + b * size, lo + (b + 1) * size)
        return region_value(rel.term, tuple(region), env, memo, regions)

    def derived(value: Permuted | Windowed | Shifted | Reordered, device: int) -> np.ndarray:
        """Device `device`'s local value of a value derived from a relation: computed from
        the one block it reads (`derived_local` on the global value for a halo window)."""
        if isinstance(value, Permuted):
            return block_of(value.rel, value.sources[device])
        if isinstance(value, Reordered):
            whole = block_of(value.rel, device)
            blocks = np.split(whole, len(value.orders[device]), axis=value.dim)
            return np.concatenate([blocks[b] for b in value.orders[device]], axis=value.dim)
        if isinstance(value, Shifted):  # the device adds in its dtype: integers wrap around
            return apply(lambda x, o=value.offsets[device]: wrap_shift(x, o, value.rel.term.dtype),
                         block_of(value.rel, device))
        return derived_local(evaluate_term(value.rel.term, env, memo), value, mesh, device)

    if not single:  # what the claim reads of pieces of partial sums (`_Pieces.declare`)
        for i, value in enumerate(ins):
            if isinstance(value, Reordered | Returning) and value.rel.partial:
                dtype = info.operand_types[i].dtype if i < len(info.operand_types) else "f32"
                _declare(pieces_of(value, f"p{i}", dtype), value, needed)
        for value in outs:
            if isinstance(value, Returning) and value.pieces is not None and \
                    _pieces_key(value) in pieces:
                _declare(pieces[_pieces_key(value)], value, checked)

    if first_block:
        claims = _first_block_claims(info, ins, outs, mesh, checked, block_of, regions_of,
                                     derived, pieces_of)
        if claims is not None:
            for found in pieces.values():
                source.hypotheses.extend(found.hypotheses())
            return claims

    local: list[list[np.ndarray]] = [[None] * len(ins) for _ in range(devices)]
    reads = chunk_reads(info, checked, mesh, single)
    for i, value in enumerate(ins):
        want = tuple(info.operand_types[i].shape) if i < len(info.operand_types) else None
        dtype = info.operand_types[i].dtype if i < len(info.operand_types) else "f32"
        if reads is not None:
            if not isinstance(value, Rel) or value.partial or value.poly:
                raise Failure("unknown", "an all_to_all on part of its group reads a "
                              "partial or device-dependent operand")
            for d, (positions, count) in reads.items():
                local[d][i] = _received_chunks(value, d, positions, count, want,
                                               info.attrs["split_dimension"], regions_of)
        elif isinstance(value, Rel):
            for g, group in enumerate(_partial_groups(value, mesh, single, needed)):
                if needed.isdisjoint(group):
                    continue  # no device of this group is checked
                block = block_of(value, group[0])
                if value.partial:
                    parts = source.split(value.kind, block, len(group), f"p{i}.g{g}", dtype)
                    for device, part in zip(group, parts):
                        local[device][i] = part
                else:
                    local[group[0]][i] = block
        elif isinstance(value, DeviceScalar):
            for d in sorted(needed):
                local[d][i] = full(tuple(value.shape), value.values[d] if not single
                                   else value.values[0])
        elif isinstance(value, Reordered | Returning) and value.rel.partial and not single:
            parts = pieces_of(value, f"p{i}", dtype)
            for d in sorted(needed):
                local[d][i] = _piece_local(value, parts, d, mesh)
        elif isinstance(value, Permuted | Windowed | Shifted | Reordered) and \
                not value.rel.partial and not single:
            for d in sorted(needed):  # run_devices reads these devices' operands only
                local[d][i] = derived(value, d)
        elif isinstance(value, DEVICE_BLOCK_VALUES) and not value.rel.partial and not single:
            for d in sorted(needed):
                junk = source.tensor(f"o{i}.d{d}", want or (), dtype)
                local[d][i], _ = block_local(value, env, memo, mesh, d, junk, regions)
        else:
            for d in sorted(needed):
                local[d][i] = source.tensor(f"o{i}.d{d}", want or (), dtype)
        for d in sorted(needed):
            if want is not None and tuple(local[d][i].shape) != want:
                raise Failure("unknown", f"operand {i}'s relation gives local shape "
                              f"{local[d][i].shape}, the op's type is {want}")

    results = run_devices(info, local, checked, mesh, single)

    claims: list = []
    for j, value in enumerate(outs):
        if isinstance(value, Opaque):
            continue
        if isinstance(value, DeviceScalar):
            for d in checked:
                got = results[d][j]
                if tuple(got.shape) != tuple(value.shape):
                    raise Failure("refuted", f"result {j} has shape {got.shape}, the device "
                                  f"scalar {value.shape}")
                expect = value.values[d] if not single else value.values[0]
                claims.extend(equal(x, expect) for x in got.reshape(-1))
            continue
        if isinstance(value, DEVICE_BLOCK_VALUES):
            if value.rel.partial or single:
                raise Failure("unknown", "a partial device mask cannot be checked")
            for d in checked:
                expect, defined = block_local(value, env, memo, mesh, d, None, regions)
                got = results[d][j]
                if tuple(got.shape) != tuple(expect.shape):
                    raise Failure("refuted", f"result {j} has local shape {got.shape} on "
                                  f"device {d}")
                claims.extend(defined_claims(got, expect, defined))
            continue
        if isinstance(value, Reordered) and value.rel.partial and not single:
            def expected(group: list[int], value: Reordered = value) -> np.ndarray:
                if first_block:
                    return regions_of(value.rel, group, value.dim, 0,
                                      len(value.orders[group[0]]))
                return block_of(value.rel, group[0])

            claims.extend(_reordered_partial_claims(value, j, results, mesh, expected,
                                                    first_block))
            continue
        if isinstance(value, Returning):
            if single:
                raise Failure("unknown", "pieces of a partial sum outside a mesh")
            if value.pieces is None or _pieces_key(value) not in pieces:
                raise Failure("unknown", "pieces of a partial sum that no operand holds")
            split = pieces[_pieces_key(value)]
            claims.extend(_local_claims(results, j, {
                d: _piece_local(value, split, d, mesh) for d in checked}))
            continue
        if isinstance(value, Permuted | Windowed | Shifted | Reordered):
            if value.rel.partial or single:
                raise Failure("unknown", f"a {type(value).__name__.lower()} partial value "
                              "cannot be checked")
            claims.extend(_local_claims(results, j, {d: derived(value, d) for d in checked}))
            continue
        for group in _partial_groups(value, mesh, single, results):
            if group[0] not in results:
                if any(m in results for m in group):
                    raise Failure("unknown", "a partial group is checked in part")
                continue  # a device with the same claim as one checked
            block = block_of(value, group[0])
            for device in group:
                if not single and block_index(value, mesh, device) != block_index(
                        value, mesh, group[0]):
                    raise Failure("unknown", "devices of one partial group hold different "
                                  "blocks")
                if tuple(results[device][j].shape) != tuple(block.shape):
                    raise Failure("refuted", f"result {j} has local shape "
                                  f"{results[device][j].shape} on device {device}, the "
                                  f"relation says {block.shape}")
            if value.partial:
                kind = value.kind
                reduced = apply(lambda *xs, kind=kind: combine(kind, list(xs)),
                                *(results[m][j] for m in group))
                if kind == "sum":  # the all_reduce that completes it sums in the dtype
                    reduced = wrap_array(reduced, value.term.dtype,
                                         sum_periods(value.term.dtype, len(group)))
            else:
                reduced = results[group[0]][j]
            claims.extend(equal(x, y) for x, y in zip(reduced.reshape(-1),
                                                      block.reshape(-1)))
    for found in pieces.values():
        source.hypotheses.extend(found.hypotheses())
    return claims


def _received_chunks(rel: Rel, device: int, positions: list[int], count: int,
                     shape: tuple[int, ...] | None, split: int, regions_of) -> np.ndarray:
    """`device`'s operand of an all_to_all checked on part of its group (`chunk_reads`):
    of its block of `rel`, the chunks (of `count` along the split dim) at `positions`, the
    chunks the checked devices receive; UNREAD everywhere else."""
    if shape is None or shape[split] % count:
        raise Failure("unknown", "an all_to_all's split dim is not a whole number of chunks")
    out = full(shape, UNREAD)
    part = shape[split] // count
    for p in positions:
        chunk = regions_of(rel, [device], split, p, count)
        if tuple(chunk.shape) != tuple(part if d == split else n for d, n in enumerate(shape)):
            raise Failure("unknown", f"operand chunk of shape {chunk.shape}, the op's type "
                          f"is {shape}")
        index = tuple(slice(p * part, (p + 1) * part) if d == split else slice(None)
                      for d in range(len(shape)))
        out[index] = chunk
    return out


def _first_block_claims(info: OpInfo, ins: list[Value], outs: list[Value], mesh: Mesh,
                        checked: list[int], block_of, regions_of, derived, pieces_of
                        ) -> list | None:
    """A sum over the group checked on block 0 of its dim (`devices.one_block`), each device
    computing only its window of the result that holds block 0: where the op maps the
    result's dim to its operands' position for position (`local_values.operand_window_dims`)
    and every operand's window is at hand (one block of a reordered value, a window of a
    relation's block); None otherwise (the whole op is then run on every device)."""
    if len(outs) != 1 or not isinstance(outs[0], Reordered) or not info.result_types:
        return None
    out = outs[0]
    dims = operand_window_dims(info, out.dim)
    count = len(out.orders[0])
    length = tuple(info.result_types[0].shape)[out.dim]
    if dims is None or length % count or len(dims) != len(ins):
        return None
    size = length // count
    w_info = window_info(info, dims, out.dim, size)

    def operand(i: int, value: Value, dim: int | None, device: int, at: int):
        """Operand `i` of `device` (its window at position `at` along `dim`), else None."""
        if isinstance(value, DeviceScalar) and dim is None:
            return full(tuple(info.operand_types[i].shape), value.values[device])
        if isinstance(value, Rel) and not value.partial:
            if dim is None:
                return block_of(value, device)
            lo, hi = block_region(value, mesh, device)[dim]
            return regions_of(value, [device], dim, at, count) if hi - lo == length else None
        if not isinstance(value, Reordered):
            return None
        dtype = info.operand_types[i].dtype
        if dim is not None and dim == value.dim:
            if len(value.orders[device]) != count:
                return None
            block = value.orders[device][at]
            if value.rel.partial:
                return pieces_of(value, f"p{i}", dtype).block(device, block)
            return regions_of(value.rel, [device], dim, block, count)
        whole = (_piece_local(value, pieces_of(value, f"p{i}", dtype), device, mesh)
                 if value.rel.partial else derived(value, device))
        if dim is None:
            return whole
        return np.take(whole, range(at * size, (at + 1) * size), axis=dim)

    natural: dict[int, np.ndarray] = {}
    for device in checked:
        at = out.orders[device].index(0)
        operands = []
        for i, (value, dim) in enumerate(zip(ins, dims)):
            found = operand(i, value, dim, device, at)
            if found is None:
                return None
            if tuple(found.shape) != tuple(w_info.operand_types[i].shape):
                raise Failure("unknown", f"operand {i}'s window has shape {found.shape}, the "
                              f"op's {w_info.operand_types[i].shape}")
            operands.append(found)
        (natural[device],) = run_op(w_info, [operands], None)[0][:1]
    claims = []
    for group in _partial_groups(out.rel, mesh, False):
        if any(m not in natural for m in group):
            raise Failure("unknown", "a partial group is checked in part")
        block = regions_of(out.rel, group, out.dim, 0, count)
        for m in group:
            if tuple(natural[m].shape) != tuple(block.shape):
                raise Failure("refuted", f"the result's window has shape {natural[m].shape} "
                              f"on device {m}, the relation's block {block.shape}")
        reduced = apply(lambda *xs, kind=out.rel.kind: combine(kind, list(xs)),
                        *(natural[m] for m in group))
        claims.extend(equal(x, y) for x, y in zip(reduced.reshape(-1), block.reshape(-1)))
    return claims


def _pieces_key(value: Reordered | Returning) -> tuple:
    """Which partial value's pieces a value holds: the value that made them and its relation
    (values naming one partial value under other relations get unrelated pieces)."""
    return (id(value.pieces), value_key(value.rel))


def _declare(parts: _Pieces, value: Reordered | Returning, devices) -> None:
    """What `devices`' local values of `value` read of its pieces (`_piece_local`)."""
    for d in devices:
        if isinstance(value, Reordered):
            for b in value.orders[d]:
                parts.declare(frozenset({d}), b)
        else:
            parts.declare(value.sources[d], value.blocks[d])


def _block_count(value: Reordered | Returning, mesh: Mesh | None) -> int:
    """The number of equal blocks along `dim` a value's pieces are cut into."""
    if isinstance(value, Reordered):
        return len(value.orders[0])
    return mesh.group_size(tuple(value.rel.partial)) if mesh is not None else 1


class _Pieces:
    """The pieces of a partial value (`layout.Reordered.pieces`, `layout.Returning`): one
    per device of each partial group, adding up (max, min) to the group's block of the
    value's term, cut along `dim` into `count` blocks.

    A float sum's pieces are made block by block, and only as the instance reads them: the
    claim reads block b of pieces only summed over sets of devices (a device's own piece, a
    `Returning` value's sources), declared before (`declare`). Block b's variables are one
    fresh tensor per part of the finest partition of the devices those sets cover (each set
    a union of parts: a sum over a set is the sum of its parts' tensors), and, where the
    sets cover a whole group, the hypothesis that its parts add up to the term's block b.
    That is every split: blocks are independent; the parts' sums range over every value as
    the pieces do (one piece of a part takes its sum, the others zero) and add up to the
    block exactly where all pieces are summed; where some piece's block is not read, any
    values of the others extend to a split (the unread one takes the difference). So a claim
    holding for all values of the parts holds for every split. (A ring's one generic device
    reads a block of a few pieces, summed alike on both sides of a permute: one tensor, not
    one per device of the ring.) `first_block`: only block 0's sums are assumed (a claim
    checked on block 0 alone, `devices.one_block`: it is proved under fewer hypotheses, so
    for every split). Other kinds, integers, concrete trials and instances whose devices
    read every piece whole split the whole block at once (`source.split`: one piece is the
    block minus the others)."""

    def __init__(self, value: Reordered | Returning, name: str, dtype: str, mesh: Mesh | None,
                 single: bool, source, regions_of, needed: set[int],
                 first_block: bool) -> None:
        self.rel, self.dim, self.name, self.dtype = value.rel, value.dim, name, dtype
        self.count = _block_count(value, mesh)
        self.source, self.regions_of = source, regions_of
        self.groups = _partial_groups(value.rel, mesh, single)
        self.group_of = {d: g for g, group in enumerate(self.groups) for d in group}
        self.first_block = first_block
        self.lazy = (value.rel.kind == "sum" and not source.concrete
                     and not is_int_dtype(dtype) and not is_bool_dtype(dtype)
                     and (first_block or not any(needed >= set(g) for g in self.groups)))
        shape = [hi - lo for lo, hi in block_region(value.rel, mesh, self.groups[0][0])] \
            if not single else list(value.rel.term.shape)
        shape[self.dim] //= self.count
        self.block_shape = tuple(shape)
        self.declared: dict[int, set[frozenset[int]]] = {}
        self.parts: dict[int, dict[frozenset[int], np.ndarray]] = {}
        self.whole: dict[int, list[np.ndarray]] = {}

    def declare(self, sources: frozenset[int], b: int) -> None:
        """The claim will read block `b` of the pieces summed over `sources`."""
        if b in self.parts:
            raise Failure("unknown", "pieces of a partial sum declared after they were made")
        self.declared.setdefault(b, set()).add(frozenset(sources))

    def block(self, device: int, b: int) -> np.ndarray:
        """Block `b` of `device`'s piece."""
        return self.sum_of(frozenset({device}), b)

    def sum_of(self, sources: frozenset[int], b: int) -> np.ndarray:
        """Block `b` of the pieces of `sources`, summed."""
        if not sources or any(d not in self.group_of for d in sources):
            raise Failure("unknown", "pieces of a partial sum from no device or no group")
        if not self.lazy:
            chosen = [self._whole(q)[b] for q in sorted(sources)]
            return apply(lambda *xs: sum_list(list(xs)), *chosen) if len(chosen) > 1 \
                else chosen[0].copy()
        parts = self._parts(b)
        chosen = [tensor for part, tensor in parts.items() if part <= sources]
        if frozenset().union(*(part for part, _ in parts.items() if part <= sources)) \
                != sources:
            raise Failure("unknown", "pieces of a partial sum read but not declared")
        return apply(lambda *xs: sum_list(list(xs)), *chosen) if len(chosen) > 1 \
            else chosen[0]

    def _whole(self, device: int) -> list[np.ndarray]:
        if device not in self.whole:
            g = self.group_of[device]
            group = self.groups[g]
            whole = self.regions_of(self.rel, group, self.dim, 0, 1)
            parts = self.source.split(self.rel.kind, whole, len(group), f"{self.name}.g{g}",
                                      self.dtype)
            for member, part in zip(group, parts):
                self.whole[member] = np.split(part, self.count, axis=self.dim)
        return self.whole[device]

    def _parts(self, b: int) -> dict[frozenset[int], np.ndarray]:
        """Block `b`'s parts (the finest partition of the declared sets' devices), each a
        fresh tensor."""
        found = self.parts.get(b)
        if found is None:
            sets = sorted(self.declared.get(b, ()), key=sorted)
            signature: dict[int, tuple[int, ...]] = {}
            for q in sorted(frozenset().union(*sets)):
                signature[q] = tuple(k for k, members in enumerate(sets) if q in members)
            parts: dict[tuple[int, ...], set[int]] = {}
            for q, sig in signature.items():
                parts.setdefault(sig, set()).add(q)
            found = self.parts[b] = {
                frozenset(members): self.source.tensor(
                    f"{self.name}.b{b}.q{'_'.join(map(str, sorted(members)))}",
                    self.block_shape, self.dtype)
                for members in parts.values()}
        return found

    def hypotheses(self) -> list:
        """Where the parts of block b cover a whole group: they add up to the term's block."""
        if not self.lazy:
            return []
        out = []
        for b, parts in sorted(self.parts.items()):
            if self.first_block and b != 0:
                continue
            for group in self.groups:
                members = [tensor for part, tensor in parts.items() if part <= set(group)]
                if frozenset().union(*(p for p in parts if p <= set(group))) != set(group):
                    continue
                total = self.regions_of(self.rel, group, self.dim, b, self.count)
                for idx in np.ndindex(total.shape):
                    out.append(to_z3(equal(sum_list([m[idx] for m in members]), total[idx])))
        return out


def _piece_local(value: Reordered | Returning, parts: _Pieces, device: int,
                 mesh: Mesh) -> np.ndarray:
    """Device `device`'s local value of pieces of a partial sum (`layout.Reordered.pieces`,
    `layout.Returning`): its piece with the blocks in its order, or the sum over its sources
    of the block of their pieces it holds (n blocks, n the partial group's size)."""
    if isinstance(value, Reordered):
        return np.concatenate([parts.block(device, b) for b in value.orders[device]],
                              axis=value.dim)
    return parts.sum_of(value.sources[device], value.blocks[device])


def _reordered_partial_claims(value: Reordered, j: int, results: dict, mesh: Mesh,
                              expected, first_block: bool = False) -> list:
    """Each partial group's un-reordered results add up to the block of the term
    (`expected(group)`; on block 0 of `dim` alone where `first_block`: `devices.one_block`)."""
    claims = []
    for group in _partial_groups(value.rel, mesh, False):
        if any(m not in results for m in group):
            raise Failure("unknown", "a partial group is checked in part")
        block = expected(group)
        natural = []
        for m in group:
            order = value.orders[m]
            got = results[m][j]
            want = list(block.shape)
            want[value.dim] *= len(order) if first_block else 1
            if tuple(got.shape) != tuple(want):
                raise Failure("refuted", f"result {j} has local shape {got.shape} on device "
                              f"{m}, the relation says {tuple(want)}")
            blocks = np.split(got, len(order), axis=value.dim)
            wanted = range(1) if first_block else range(len(order))
            natural.append(np.concatenate([blocks[order.index(b)] for b in wanted],
                                          axis=value.dim))
        reduced = apply(lambda *xs, kind=value.rel.kind: combine(kind, list(xs)), *natural)
        claims.extend(equal(x, y) for x, y in zip(reduced.reshape(-1), block.reshape(-1)))
    return claims
