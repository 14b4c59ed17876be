"""Per-device expansion of a shard_map program (or of XLA's per-device program, whose whole
body every device runs): every device's local value of every SSA value of a manual
computation as a term over the GLOBAL inputs (or, for integers computed from the
device's id and constants alone, as concrete arrays), walked op by op in lockstep over the
devices so that a collective sees its whole group (docs/architecture.md, "General tier").

Outside manual computations the sharded function is walked as the reference is (`Walker` with
global rules); each manual computation's results leave as global terms assembled from the
devices' blocks, with an obligation per device that must agree with its representative.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from jaxlib.mlir import ir

from entangle_mlir.analysis.general import MAX_DEVICES
from entangle_mlir.analysis.general.loops import LoopStats, solve_loop
from entangle_mlir.analysis.general.symmetry import Symmetry, symmetric_axes
from entangle_mlir.analysis.general.values import (  # noqa: F401 - concrete_term: tests import it here
    MAX_CONCRETE,
    DeviceValues,
    Later,
    LaterOp,
    Local,
    NotExpanded,
    concrete_term,
    integral,
)
from entangle_mlir.analysis.infer import Walker, per_device_mesh
from entangle_mlir.core.diagnostics import SourceLoc
from entangle_mlir.core.mesh import Mesh, axes_str
from entangle_mlir.core.normal_form import make_concat, slice_term, update_slice
from entangle_mlir.core.relations import GLOBAL, Rel
from entangle_mlir.core.terms import (
    Term,
    make_add,
    make_arg,
    make_elementwise,
    make_lin,
    make_mul,
    make_op,
    make_reshape,
    make_splat,
)
from entangle_mlir.mlir.opinfo import OpInfo, describe, op_location, scatter_kind, tensor_type
from entangle_mlir.mlir.per_device import DeviceTiles, device_tiles
from entangle_mlir.normalize.unroll import count_ops
from entangle_mlir.rules import RULES, RuleContext
from entangle_mlir.rules.control import CASE, branch_pick
from entangle_mlir.rules.dispatch import REGION_RULE_OPS, TRANSPARENT, apply_rule
from entangle_mlir.semantics.collectives import COLLECTIVE_SEMANTICS, replica_groups
from entangle_mlir.semantics.element import SemanticsError
from entangle_mlir.semantics.groups import GroupError, permute_pairs
from entangle_mlir.semantics.ops import OP_SEMANTICS, dimension_numbers
from entangle_mlir.semantics.tensor import scatter

COMBINING = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
             "stablehlo.all_to_all", "stablehlo.collective_permute")
"""Collectives the expansion combines across a group."""

DEVICE_IDS = ("stablehlo.partition_id", "stablehlo.replica_id")

WHILE = "stablehlo.while"

SYMMETRIC = True
"""Whether a manual computation's devices along its symmetric axes get their representative's
terms renamed where the argument covers them (`symmetry.py`): the rules and their Z3-checked
instances run on the representatives only (dp 2 x pp 4 x tp 8: 11 363 instances instead of
65 134). The terms are still built on every device (by the builders)."""

INVARIANT_ATTR = "entangle.invariant"
"""The attribute holding the invariant a loop was solved by."""

MAX_LOOP_WORK = 20_000
"""The most ops the expansion runs in loops, over the whole program: each trip of a loop
costs the ops of its condition and body (nested regions included). Loops are expanded trip
by trip, so a long loop (or nested loops) would otherwise grow the terms without end."""

_COMBINE = {"add": None, "max": "stablehlo.maximum", "min": "stablehlo.minimum",
            "and": "stablehlo.and", "or": "stablehlo.or", "mul": "mul"}
"""all_reduce reducers the expansion combines: `add` is a `lin` sum, the others n-ary
elementwise ops (associative and commutative)."""


@dataclass
class Instance:
    """A rule instance the expansion used: checked by Z3 like the reference walk's."""

    info: OpInfo
    inputs: list[Rel]
    outputs: list[Rel]


@dataclass
class Obligation:
    """`got` (`what`: a device's value of a result) must equal `want` (`against`: its
    representative's, the device at coordinate 0 of the axes the result is replicated over)."""

    want: Term
    got: Term
    what: str
    loc: SourceLoc | None = None
    against: str = "the reference"


@dataclass
class ExpansionStats:
    devices: int = 0
    ops: int = 0
    computed: int = 0
    """Distinct (op, operands) computations (devices sharing operands share one)."""
    trips: int = 0
    """Loop trips expanded (of every loop, nested ones included)."""
    loop_work: int = 0
    """Ops the loops' trips cost (`MAX_LOOP_WORK` bounds it)."""
    definitional: int = 0
    """Instances not checked because they state an op equals itself (`definitional`)."""
    renamed: int = 0
    """Device-op results obtained as their representative's renamed (`symmetry.py`)."""
    symmetric: tuple[str, ...] = ()
    """The mesh axes the renaming argument was tried on."""


class Expansion(Walker):
    """The sharded function, walked globally, with each manual computation expanded per
    device (`expand`). `instances` are the rule instances used, `obligations` the per-device
    agreements the outputs rest on."""

    def __init__(self, func, module, file: str, max_devices: int = MAX_DEVICES,
                 deadline: Callable[[], bool] | None = None,
                 reference_args: list[tuple[tuple[int, ...], str]] | None = None):
        """`reference_args`: the reference's argument shapes and element types, which a
        per-device program's parameters' blocks must make up."""
        super().__init__(func, module, file, reference=None, layers=None)
        self.reference_args = reference_args
        self.max_devices = max_devices
        self.instances: list[Instance] = []
        self.obligations: list[Obligation] = []
        self.stats = ExpansionStats()
        self.mesh: Mesh | None = None
        self._seen_instances: set[tuple] = set()
        self.loop_stats = LoopStats()
        """What the loops solved by invariant cost (`loops.py`)."""
        self.blocks: dict[int, str] = {}
        """serial of a device's value of a manual computation's result -> which it is."""
        self._out_of_time = deadline or (lambda: False)
        self.symmetry: Symmetry | None = None
        """The renaming argument of the manual computation being expanded, if any."""
        self.lazy = False
        """Whether ops with float results (no region but a reducer's) are computed on a
        device only when its value there is first read (`Later`): by an output, an op with
        integer results, a region's op, a layer template's site. Values no output depends
        on (a pipeline's masked bubble steps, the inside of a templated layer) are then
        never built, nor their rule instances used."""

    # ----- XLA's per-device program ------------------------------------------------------

    def _per_device(self, block) -> None:
        """A partitioned program (one module every device runs): each parameter's value on
        every device is its block of the global argument by its sharding, the body is
        expanded on every device, and each result is assembled from the devices' blocks by
        its sharding (devices holding the same block must agree)."""
        info = OpInfo("func.func", loc=op_location(self.func, self.file), op=None)
        mesh, shardings, result_texts = per_device_mesh(self.module, self.func, self.file)
        n = mesh.num_devices
        if n > self.max_devices:
            raise NotExpanded(f"general tier limited to {self.max_devices} devices (the "
                              f"program has {n})", info.loc)
        self.mesh = self.walk.mesh = mesh
        self.stats.devices = n
        self.per_device_mode = True
        env: dict = {}
        for i, (arg, text) in enumerate(zip(block.arguments, shardings)):
            local = self.walk.values.pop(arg).term
            tiles, reason = device_tiles(text, len(local.shape), n)
            if tiles is None:
                raise NotExpanded(f"parameter #{i}: {reason}", info.loc)
            shape = tuple(size * count for size, count in zip(local.shape, tiles.counts))
            if self.reference_args is not None and (
                    i >= len(self.reference_args)
                    or self.reference_args[i] != (shape, local.dtype)):
                raise NotExpanded(f"parameter #{i}'s blocks make {shape} x {local.dtype}, not "
                                  "the reference's argument (padded or uneven shards are not "
                                  "expanded)", info.loc)
            env[arg] = _enter_tiles(make_arg(i, shape, local.dtype), tiles)
        outputs = None
        for inner in block.operations:
            inner = inner.operation
            if inner.name == "func.return":
                outputs = [self._operand(v, env, mesh, info) for v in inner.operands]
                self.walk.return_record = self._record(describe(inner, self.file), [], [],
                                                       RuleContext())
                break
            self._device_op(inner, env, mesh)
        if outputs is None:
            raise NotExpanded("a per-device program without func.return", info.loc)
        results = []
        for i, (locals_, text) in enumerate(zip(outputs, result_texts)):
            tiles, reason = device_tiles(text, len(locals_[0].shape), n)
            if tiles is None:
                raise NotExpanded(f"result #{i}: {reason}", info.loc)
            term = self._leave_tiles(locals_, tiles, info, i)
            results.append(Rel(term, ((),) * len(term.shape), scope=GLOBAL))
        self.walk.outputs = results

    def _leave_tiles(self, locals_: list[Local], tiles: DeviceTiles, info: OpInfo,
                     index: int) -> Term:
        """The global value of a per-device program's result from its devices' blocks: every
        device must agree with the first device holding the same tile."""
        terms = [local.as_term() for local in locals_]
        holder: dict[tuple[int, ...], int] = {}
        for d, term in enumerate(terms):
            self.blocks.setdefault(term.serial, f"device {d}'s block of result #{index}")
            rep = holder.setdefault(tiles.index[d], d)
            if rep != d and term is not terms[rep]:
                self.obligations.append(Obligation(
                    terms[rep], term, f"device {d}'s result #{index} (the same block as "
                    f"device {rep}'s)", info.loc, f"device {rep}'s"))
        if len(holder) != math.prod(tiles.counts):
            raise NotExpanded(f"result #{index}: some tile is held by no device", info.loc)

        def assemble(dim: int, index: tuple[int, ...]) -> Term:
            if dim == len(tiles.counts):
                return terms[holder[index]]
            if tiles.counts[dim] == 1:
                return assemble(dim + 1, index + (0,))
            return make_concat([assemble(dim + 1, index + (b,))
                                for b in range(tiles.counts[dim])], dim)

        return assemble(0, ())

    def _while(self, op, ctx) -> None:
        raise NotExpanded("the general tier does not expand loops yet",
                          describe(op, self.file).loc)

    def record_invariant(self, op: ir.Operation, text: str) -> None:
        """Attach a loop's invariant (`loops.LoopSolver.describe`) to the loop as
        `entangle.invariant`, so that entangle-opt prints it (lit CHECKs it)."""
        op.attributes[INVARIANT_ATTR] = ir.StringAttr.get(text, op.context)

    # ----- a manual computation ----------------------------------------------------------

    def _manual(self, op: ir.Operation, ctx) -> None:
        info = describe(op, self.file)
        mesh, in_tilings, out_tilings, manual = self._manual_shardings(op, info)
        if set(manual) != set(mesh.names):
            raise NotExpanded("partially manual computations are not expanded yet", info.loc)
        if _custom_device_order(self.module):
            raise NotExpanded("the mesh lists its devices in a custom order", info.loc)
        n = mesh.num_devices
        if n > self.max_devices:
            raise NotExpanded(f"general tier limited to {self.max_devices} devices (the mesh "
                              f"has {n})", info.loc)
        self.mesh = self.walk.mesh = mesh
        self.stats.devices = n
        block = op.regions[0].blocks[0]
        axes = symmetric_axes(block, mesh) if SYMMETRIC else ()
        self.symmetry = Symmetry(mesh, axes) if axes else None
        self.stats.symmetric = axes
        env: dict = {}
        permuted: set[int] = set()
        for operand, arg, tiling in zip(op.operands, block.arguments, in_tilings):
            value = self.walk.values[operand]
            if not isinstance(value, Rel) or value.partial:
                raise NotExpanded("an input of the manual computation has no term", info.loc)
            if self.symmetry is not None and value.term.op == "arg" \
                    and value.term.serial not in permuted:
                permuted.add(value.term.serial)
                self.symmetry.permute_argument(value.term, tiling)
            env[arg] = self._enter_devices(value.term, tiling, mesh, info)
            if env[arg][0].shape != info_shape(arg.type):
                raise NotExpanded("an input's block does not have the body argument's shape",
                                  info.loc)
        for inner in block.operations:
            inner = inner.operation
            if inner.name == "sdy.return":
                outputs = [self._operand(v, env, mesh, info) for v in inner.operands]
                break
            self._device_op(inner, env, mesh)
        else:
            raise NotExpanded("a manual computation without sdy.return", info.loc)
        self.symmetry = None
        for i, (result, locals_, tiling) in enumerate(zip(op.results, outputs, out_tilings)):
            term = self._leave_devices(locals_, tiling, mesh, info, i)
            if term.shape != info_shape(result.type):
                raise NotExpanded(f"result #{i}'s blocks do not make its global shape",
                                  info.loc)
            self.walk.values[result] = Rel(term, ((),) * len(term.shape), scope=GLOBAL)

    def _enter_devices(self, term: Term, tiling, mesh: Mesh, info: OpInfo) -> list[Local]:
        """Each device's block of a global input, by its in_sharding."""
        locals_ = []
        for d in range(mesh.num_devices):
            local = term
            for dim, axes in enumerate(tiling):
                if not axes:
                    continue
                count = mesh.group_size(axes)
                if term.shape[dim] % count:
                    raise NotExpanded(f"dim {dim} of size {term.shape[dim]} does not divide "
                                      f"over {axes_str(axes)}", info.loc)
                size = term.shape[dim] // count
                b = mesh.block_index(axes, d)
                local = slice_term(local, dim, b * size, (b + 1) * size)
            locals_.append(Local(term.dtype, local.shape, term=local))
        return locals_

    def _leave_devices(self, locals_: list[Local], tiling, mesh: Mesh, info: OpInfo,
                       index: int) -> Term:
        """The global value of a result from its devices' blocks (out_shardings); every device
        must agree with the one holding the same blocks at coordinate 0 of the other axes."""
        used = [a for axes in tiling for a in axes]
        terms = [local.as_term() for local in locals_]
        for d, term in enumerate(terms):
            self.blocks.setdefault(term.serial, f"device {d}'s block of result #{index}")
        for d in range(mesh.num_devices):
            coords = mesh.coords(d)
            rep = mesh.device({a: (c if a in used else 0) for a, c in coords.items()})
            if rep != d and terms[d] is not terms[rep]:
                self.obligations.append(Obligation(
                    terms[rep], terms[d], f"device {d}'s result #{index} (replicated over "
                    f"{axes_str([a for a in mesh.names if a not in used])})", info.loc,
                    f"device {rep}'s"))

        def assemble(dim: int, coords: dict[str, int]) -> Term:
            if dim == len(tiling):
                return terms[mesh.device({a: coords.get(a, 0) for a in mesh.names})]
            axes = tiling[dim]
            if not axes:
                return assemble(dim + 1, coords)
            pieces = []
            for b in range(mesh.group_size(axes)):
                placed, rest = dict(coords), b
                for axis in reversed(axes):
                    placed[axis] = rest % mesh.size(axis)
                    rest //= mesh.size(axis)
                pieces.append(assemble(dim + 1, placed))
            return make_concat(pieces, dim)

        return assemble(0, {})

    # ----- one op on every device --------------------------------------------------------

    def _device_op(self, op: ir.Operation, env: dict, mesh: Mesh) -> None:
        if self._out_of_time():
            raise NotExpanded("out of time")
        info = describe(op, self.file)
        self.stats.ops += 1
        n = mesh.num_devices
        results = list(op.results)
        ins = [self._operand(v, env, mesh, info) for v in op.operands]
        name = info.name
        if name in DEVICE_IDS:
            rtype = info.result_types[0]
            ids = [d // mesh.partitions if name == "stablehlo.replica_id" else
                   d % mesh.partitions for d in range(n)]
            env[results[0]] = [Local(rtype.dtype, rtype.shape,
                                     values=np.full(rtype.shape, i, dtype=object))
                               for i in ids]
            return
        if name in TRANSPARENT:
            for result, values in zip(results, ins):
                env[result] = values
            return
        if name == CASE:
            outs = self._device_case(op, info, ins, env, mesh)
        elif name == WHILE:
            outs = self._device_while(op, info, ins, env, mesh)
        elif name in COMBINING and self._deferrable(info):
            outs = LaterCollective(info, ins, mesh).results()
        elif name in COMBINING:
            outs = collective(info, ins, mesh)
            if self.symmetry is not None:
                self._record_collective(info, ins, outs, mesh)
        elif name == "stablehlo.collective_broadcast" or name.startswith("sdy."):
            raise NotExpanded(f"{name} is not expanded yet", info.loc)
        elif op.regions and name not in REGION_RULE_OPS:
            raise NotExpanded(f"{name} (with regions) is not expanded yet", info.loc)
        elif self._deferrable(info):
            outs = LaterLocal(self, info, ins, self.symmetry, n).results()
        else:
            outs = [[] for _ in results]
            cache: dict[tuple, list[Local]] = {}
            for d in range(n):
                found = self._on_device(info, ins, d, self.symmetry, cache,
                                        lambda rep: [values[rep] for values in outs])
                for k, local in enumerate(found):
                    outs[k].append(local)
        for result, values in zip(results, outs):
            env[result] = values

    def _on_device(self, info: OpInfo, ins: list[list[Local]], d: int, sym: Symmetry | None,
                   cache: dict[tuple, list[Local]],
                   rep_results: Callable[[int], list[Local]]) -> list[Local]:
        """A local op's results on device d: its representative's renamed under `sym`
        (`rep_results`) where every operand there is coherent with the representative's,
        else computed by the rules; once per distinct operands (`cache`), a repeat recorded
        as renamed."""
        operands = [values[d] for values in ins]
        key = tuple(local.key() for local in operands)
        found = cache.get(key)
        if sym is not None and sym.rep[d] != d and all(
                sym.coherent(values[sym.rep[d]], values[d], d) for values in ins):
            rep = rep_results(sym.rep[d])
            if found is None:
                found = cache[key] = [sym.renamed_local(local, d) for local in rep]
                self.stats.renamed += 1
            else:
                for mine, theirs in zip(found, rep):
                    sym.record(theirs, mine, d)
        if found is None:
            found = cache[key] = self._local_op(info, operands)
            self.stats.computed += 1
        return found

    def _deferrable(self, info: OpInfo) -> bool:
        """Whether the op's results are computed only where read (`lazy`): floats (never
        concrete: decisions read integers at once), no region but a reducer's."""
        return self.lazy and all(not integral(t.dtype) for t in info.result_types) and (
            info.op is None or not info.op.regions or info.name in REGION_RULE_OPS)

    def _record_collective(self, info: OpInfo, ins: list[list[Local]],
                           outs: list[list[Local]], mesh: Mesh) -> None:
        """Record each device's result of a collective as its representative's renamed where
        the renaming argument covers it (`symmetry.py`): every operand coherent on every
        device, and every rotation mapping the replica groups to replica groups member by
        member (an all_reduce's as sets) or the permute's pairs to pairs."""
        sym = self.symmetry
        if not all(sym.all_coherent(values) for values in ins):
            return
        try:
            if info.name == "stablehlo.collective_permute":
                moves = sym.pairs_move(permute_pairs(info.attrs, mesh.replicas,
                                                     mesh.partitions))
            else:
                moves = sym.groups_move(replica_groups(info, mesh),
                                        info.name == "stablehlo.all_reduce")
        except (GroupError, SemanticsError):
            return
        if not moves:
            return
        for values in outs:
            for d in range(mesh.num_devices):
                if sym.rep[d] != d:
                    sym.record(values[sym.rep[d]], values[d], d)

    def record_coherent(self, reps: list[list[Local]], outs: list[list[Local]]) -> None:
        """Record every device's `outs` as its representative's renamed, where every value
        of `reps` is coherent on every device (the loop's exit values, `loops.py`, when its
        inputs and its symbolic step's yields are)."""
        sym = self.symmetry
        if sym is None or not all(sym.all_coherent(values) for values in reps):
            return
        for values in outs:
            for d, local in enumerate(values):
                if sym.rep[d] != d:
                    sym.record(values[sym.rep[d]], local, d)

    def pair_leaves(self, leaves: list[Local]) -> None:
        """Fresh per-device leaves (`loops.py`): the renaming maps device d's to gamma . d's."""
        if self.symmetry is not None:
            self.symmetry.pair_leaves(leaves)

    def _device_case(self, op: ir.Operation, info: OpInfo, ins: list[list[Local]], env: dict,
                     mesh: Mesh) -> list[list[Local]]:
        """lax.switch / lax.cond on every device: each branch's region expanded whole on every
        device, then each device's results: the branch its concrete index runs (the last when
        out of range), else the select chain of the branches' terms (`rules/control.py`).
        Collectives in the branches need one index on every device (else the devices would
        run different branches' collectives)."""
        (index,) = ins
        if len({local.key() for local in index}) != 1 and _has_collective(op):
            raise NotExpanded("a case whose index differs between devices runs collectives in "
                              "its branches", info.loc)
        branches, types = [], list(info.operand_types)
        for region in op.regions:
            block = region.blocks[0]
            branches.append(self._expand_block(block, env, mesh, info))
            types.extend(tensor_type(v.type) for v in _terminator(block).operands)
        count = len(info.result_types)
        case_info = replace(info, attrs={**info.attrs, "branches": len(branches)},
                            operand_types=types, op=None)
        outs: list[list[Local]] = [[] for _ in range(count)]
        cache: dict[tuple, list[Local]] = {}
        for d in range(mesh.num_devices):
            local = index[d]
            if local.values is not None:
                (value,) = [int(v) for v in local.values.flat]
                picked = branches[branch_pick(value, len(branches))]
                for j in range(count):
                    outs[j].append(picked[j][d])
                continue
            operands = [local] + [values[d] for branch in branches for values in branch]
            key = tuple(x.key() for x in operands)
            found = cache.get(key)
            if found is None:
                found = cache[key] = [Local(v.term.dtype, v.term.shape, term=v.term)
                                      for v in self._rule(case_info, operands)]
                self.stats.computed += 1
            for j in range(count):
                outs[j].append(found[j])
        return outs

    def _expand_block(self, block, env: dict, mesh: Mesh, info: OpInfo,
                      args: list[list[Local]] | None = None) -> list[list[Local]]:
        """A region's block on every device (its arguments bound to `args`): the values its
        terminator returns, per value per device."""
        for arg, values in zip(block.arguments, args or []):
            env[arg] = values
        for inner in block.operations:
            inner = inner.operation
            if inner.name in ("stablehlo.return", "func.return"):
                return [self._operand(v, env, mesh, info) for v in inner.operands]
            self._device_op(inner, env, mesh)
        raise NotExpanded(f"a region of {info.name} without a return", info.loc)

    def _device_while(self, op: ir.Operation, info: OpInfo, ins: list[list[Local]], env: dict,
                      mesh: Mesh) -> list[list[Local]]:
        """A loop on every device, trip by trip: the condition on each device's carried
        values must be a concrete boolean (a counter from constants and device ids, compared
        with a constant: the trip count is then exactly what the program runs), and each
        device runs the body on its own carried values while its condition holds. A device
        whose loop has ended keeps its values; collectives in the body need every device in
        the same trip. Equal trips give equal terms (hash-consed), and `MAX_LOOP_WORK` bounds
        the trips x ops of every loop together.

        A counted loop is first tried by invariant (`loops.py`): its body expanded once with
        the step index and the carried values symbolic; trip by trip where that fails."""
        solved = solve_loop(self, op, info, ins, env, mesh)
        if solved is not None:
            return solved
        carried, _ = self.expand_trips(op, info, ins, env, mesh)
        return carried

    def expand_trips(self, op: ir.Operation, info: OpInfo, ins: list[list[Local]], env: dict,
                     mesh: Mesh, most: int | None = None) -> tuple[list[list[Local]], int]:
        """`_device_while`'s trips, concretely, from the carried values `ins`: the values after
        the loop ends or after `most` trips, and the number of trips run."""
        cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
        cost = count_ops(op) - 1
        collectives = _has_collective(op)
        carried = ins
        trips = 0
        while most is None or trips < most:
            (test,) = self._expand_block(cond, env, mesh, info, carried)
            running = []
            for local in test:
                if local.values is None:
                    raise NotExpanded("a loop whose trip count depends on data (its "
                                      "condition is not decided by constants and device "
                                      "ids)", info.loc)
                (value,) = [bool(v) for v in local.values.flat]
                running.append(value)
            if not any(running):
                return carried, trips
            if collectives and not all(running):
                raise NotExpanded("devices run a loop a different number of times while its "
                                  "body runs collectives", info.loc)
            self.stats.loop_work += cost
            if self.stats.loop_work > MAX_LOOP_WORK:
                raise NotExpanded(f"loops past the general tier's bound of {MAX_LOOP_WORK} "
                                  f"expanded ops (this loop: {cost} ops a trip, still running "
                                  f"after {trips} trips)", info.loc)
            yields = self._expand_block(body, env, mesh, info, carried)
            if len(yields) != len(carried):
                raise NotExpanded("a loop body returns other values than it carries", info.loc)
            carried = [[new[d] if running[d] else old[d] for d in range(mesh.num_devices)]
                       for new, old in zip(yields, carried)]
            trips += 1
            self.stats.trips += 1
        return carried, trips

    def _operand(self, value, env: dict, mesh: Mesh, info: OpInfo) -> list[Local]:
        """Each device's value of an operand: the body's own, or a global value the body
        reads from outside (the same on every device)."""
        found = env.get(value)
        if found is not None:
            return found
        outer = self.walk.values.get(value)
        if isinstance(outer, Rel) and not outer.partial:
            return [Local(outer.term.dtype, outer.term.shape, term=outer.term)] * \
                mesh.num_devices
        raise NotExpanded("an operand without a value on every device", info.loc)

    def _local_op(self, info: OpInfo, operands: list[Local]) -> list[Local]:
        """One device's results of a local op."""
        name = info.name
        types = info.result_types
        decided = _absorbed(name, operands, types)
        if decided is not None:
            return [decided]
        concrete = all(local.values is not None for local in operands)
        if (concrete and name in OP_SEMANTICS and all(integral(t.dtype) for t in types)
                and all(math.prod(t.shape) <= MAX_CONCRETE for t in types)
                and (operands or name in ("stablehlo.constant", "stablehlo.iota"))):
            try:
                values = OP_SEMANTICS[name](info, [local.values for local in operands])
            except SemanticsError as err:
                raise NotExpanded(f"{name}: {err}", info.loc) from None
            terms = [None] * len(types)
            if all(local.term is not None for local in operands):
                terms = [v.term for v in self._rule(info, operands)]
            return [Local(t.dtype, t.shape, term=term, values=np.asarray(v, dtype=object)
                          .reshape(t.shape))
                    for t, v, term in zip(types, values, terms)]
        if name == "stablehlo.dynamic_slice" and all(
                local.values is not None for local in operands[1:]):
            return [self._static_slice(info, operands)]
        if name == "stablehlo.dynamic_update_slice" and all(
                local.values is not None for local in operands[2:]):
            return [self._static_update(info, operands)]
        if name == "stablehlo.scatter" and len(operands) == 3 and operands[1].values is not None:
            placed = self._static_scatter(info, operands)
            if placed is not None:
                return [placed]
        return [Local(v.term.dtype, v.term.shape, term=v.term) for v in self._rule(info, operands)]

    def _rule(self, info: OpInfo, operands: list[Local]) -> list[Rel]:
        """The op's results by the rule the reference walk uses, on global-scope terms."""
        inputs = [Rel(local.as_term(), ((),) * len(local.shape), scope=GLOBAL)
                  for local in operands]
        if info.name not in RULES:
            raise NotExpanded(f"unsupported op {info.name}", info.loc)
        outputs = apply_rule(info, inputs, RuleContext(), bool(info.op is not None and
                                                                 len(info.op.regions)),
                             len(info.result_types))
        for value in outputs:
            if type(value) is not Rel:
                reason = getattr(value, "reason", type(value).__name__)
                raise NotExpanded(f"{info.name}: {reason}", info.loc)
        self._instance(info, inputs, outputs)
        return outputs

    def _instance(self, info: OpInfo, inputs: list[Rel], outputs: list[Rel]) -> None:
        key = (id(info.op), tuple(v.term.serial for v in inputs),
               tuple(v.term.serial for v in outputs))
        if definitional(info, inputs, outputs):
            self.stats.definitional += 1
            return
        if key not in self._seen_instances:
            self._seen_instances.add(key)
            self.instances.append(Instance(info, inputs, list(outputs)))

    def _starts(self, info: OpInfo, starts: list[Local], sizes, shape) -> list[int]:
        """Concrete start indices, clamped into range as StableHLO clamps them."""
        out = []
        for local, size, n in zip(starts, sizes, shape):
            (value,) = [int(v) for v in local.values.flat]
            out.append(min(max(value, 0), n - size))
        return out

    def _static_slice(self, info: OpInfo, operands: list[Local]) -> Local:
        """dynamic_slice at concrete offsets: a slice."""
        x = operands[0].as_term()
        sizes = tuple(info.attrs["slice_sizes"])
        starts = self._starts(info, operands[1:], sizes, x.shape)
        limits = tuple(s + k for s, k in zip(starts, sizes))
        term = make_op("slice", (x,), (tuple(starts), limits, (1,) * len(sizes)), sizes,
                       x.dtype, linear_in=0)
        inputs = [Rel(local.as_term(), ((),) * len(local.shape), scope=GLOBAL)
                  for local in operands]
        self._instance(info, inputs, [Rel(term, ((),) * len(term.shape), scope=GLOBAL)])
        return Local(term.dtype, term.shape, term=term)

    def _static_update(self, info: OpInfo, operands: list[Local]) -> Local:
        """dynamic_update_slice at concrete offsets: the operand's rows around the update,
        concatenated dim by dim."""
        x, update = operands[0].as_term(), operands[1].as_term()
        starts = self._starts(info, operands[2:], update.shape, x.shape)
        term = update_slice(x, update, starts)
        self._placed_instance(info, operands, update_slice(x, update, starts, joined=False))
        return Local(term.dtype, term.shape, term=term)

    def _placed_instance(self, info: OpInfo, operands: list[Local], placed: Term) -> None:
        """The instance of an update at concrete offsets, stated with its plain structure
        (`update_slice(joined=False)`): the result's normal form equals it by
        `core/normal_form/`'s identities, which the decision trusts alike, while Z3 would
        have to re-derive them (pipeline micro-batches met into one batch computation)."""
        inputs = [Rel(local.as_term(), ((),) * len(local.shape), scope=GLOBAL)
                  for local in operands]
        self._instance(info, inputs, [Rel(placed, ((),) * len(placed.shape), scope=GLOBAL)])

    def _static_scatter(self, info: OpInfo, operands: list[Local]) -> Local | None:
        """A scatter (replace or add) at concrete indices whose updates land, each on its
        own element, on one box of the operand in the updates' row-major order (`x.at[i]`
        with a device-dependent i): the operand with that box replaced by (or added to) the
        updates, as `update_slice` (exact). None where the updates land otherwise (then the
        scatter's own rule)."""
        kind = scatter_kind(info)
        if kind not in ("replace", "add"):
            return None
        x, updates = operands[0], operands[2]
        box = scatter_box(info, x.shape, operands[1].values, updates.shape)
        if box is None:
            return None
        starts, shape = box
        placed = make_reshape(updates.as_term(), shape)
        base = x.as_term()
        if kind == "add":
            window = make_op("slice", (base,), (tuple(starts), tuple(
                s + k for s, k in zip(starts, shape)), (1,) * len(shape)), shape, base.dtype,
                linear_in=0)
            placed = make_add(window, placed)
        term = update_slice(base, placed, starts)
        self._placed_instance(info, operands, update_slice(base, placed, starts, joined=False))
        return Local(term.dtype, term.shape, term=term)


_ABSORBING = {"stablehlo.and": False, "stablehlo.or": True}
"""Boolean ops with the value that decides them whatever the other operand is."""


class LaterLocal(LaterOp):
    """A local op computed on each device where read (`Expansion.lazy`), as `_device_op`'s
    loop computes it (`Expansion._on_device`): renamed from the representative's where every
    operand is coherent, else computed (once per distinct operands). A select whose predicate is one concrete
    boolean on a device is its chosen operand there, the other not read (a pipeline's
    masked bubble steps)."""

    def __init__(self, expansion: Expansion, info: OpInfo, ins: list[list[Local]],
                 sym: Symmetry | None, n: int):
        super().__init__()
        self.expansion = expansion
        self.info = info
        self.ins = ins
        self.sym = sym
        self.cache: dict[tuple, list[Local]] = {}
        self.types = result_types(info)
        self.made: list[list[Local] | None] = [None] * n

    def device(self, d: int) -> list[Local]:
        """Device d's results (made when first asked for: `DeviceValues`)."""
        found = self.made[d]
        if found is None:
            chosen = _chosen(self.info, self.ins, d)
            found = self.made[d] = [chosen] if chosen is not None \
                else Later(self, d).locals_(self.types)
        return found

    def results(self) -> list[DeviceValues]:
        return [DeviceValues(len(self.made), functools.partial(self._result, k))
                for k in range(len(self.types))]

    def _result(self, k: int, d: int) -> Local:
        return self.device(d)[k]

    def reads(self, d: int) -> list[Local]:
        own = [values[d] for values in self.ins]
        sym = self.sym
        if sym is None or sym.rep[d] == d:
            return own
        rep = sym.rep[d]
        return [*own, *(values[rep] for values in self.ins), *self.device(rep)]

    def compute(self, d: int) -> list[Local]:
        expansion = self.expansion
        if expansion._out_of_time():
            raise NotExpanded("out of time")
        return expansion._on_device(self.info, self.ins, d, self.sym, self.cache,
                                    self.device)


def _chosen(info: OpInfo, ins: list[list[Local]], d: int) -> Local | None:
    """A select's chosen operand on device d where its predicate is a concrete boolean of
    one value there, of the result's type; else None."""
    if info.name != "stablehlo.select" or len(ins) != 3:
        return None
    operands = [values[d] for values in ins]
    if operands[0].values is None:
        return None
    found = {bool(v) for v in operands[0].values.flat}
    if len(found) != 1:
        return None
    chosen = operands[1] if found.pop() else operands[2]
    result = info.result_types[0]
    if chosen.dtype != result.dtype or tuple(chosen.shape) != tuple(result.shape):
        return None
    return chosen


def result_types(info: OpInfo) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of each result of the op."""
    return [(t.dtype, tuple(t.shape)) for t in info.result_types]


def _absorbed(name: str, operands: list[Local], types) -> Local | None:
    """`false & x` (`true | x`) is that constant, and `true & x` (`false | x`) is x, when one
    operand is a concrete boolean of one value and the other is not concrete (a mask at a
    loop's symbolic step: `(stage == n - 1) & (i >= n - 1)`); else None."""
    absorbing = _ABSORBING.get(name)
    if absorbing is None or len(operands) != 2 or types[0].dtype != "i1":
        return None
    for own, other in (operands, operands[::-1]):
        if own.values is None or other.values is not None or own.shape != other.shape:
            continue
        found = {bool(v) for v in own.values.flat}
        if len(found) != 1:
            continue
        return own if found.pop() == absorbing else other
    return None


_OWN_TERMS = {"stablehlo.dynamic_slice": "dynamic_slice",
              "stablehlo.dynamic_update_slice": "stablehlo.dynamic_update_slice"}
"""Ops whose term node a term evaluation computes by the op's own array function
(`semantics/evaluate.py`: `tensor.dynamic_slice`, and dynamic_update_slice by its op table
entry), which the op's semantics computes too."""


def definitional(info: OpInfo, inputs: list[Rel], outputs: list[Rel]) -> bool:
    """Whether the rule's result is the op's own term node over its operands' terms (a dynamic
    slice or update at offsets known only as terms: a loop's symbolic step). Its instance
    would state `op(x) == op(x)`, evaluated by one function on both sides; checking it at a
    symbolic offset builds a case split over every offset (minutes for a buffer of a hundred
    micro-batches), so it is not checked."""
    own = _OWN_TERMS.get(info.name)
    if own is None or len(outputs) != 1:
        return False
    term = outputs[0].term
    return term.op == own and len(term.args) == len(inputs) and all(
        a is v.term for a, v in zip(term.args, inputs))


def scatter_box(info: OpInfo, shape: tuple[int, ...], indices: np.ndarray,
                 updates_shape: tuple[int, ...]) -> tuple[list[int], tuple[int, ...]] | None:
    """(starts, shape) of the box of the operand a scatter at concrete `indices` writes, when
    every update element lands on an element of its own and they fill the box in row-major
    order (found by scattering counts and then positions with the op's semantics); else
    None."""
    count = math.prod(updates_shape)
    if not count or count > MAX_CONCRETE or math.prod(shape) > MAX_CONCRETE:
        return None
    dims = dimension_numbers(info.attrs, "scatter_dimension_numbers")
    zeros = np.zeros(shape, dtype=object)
    try:
        hits = scatter(zeros, indices, np.ones(updates_shape, dtype=object), dims, "add")
        order = scatter(zeros, indices, np.arange(1, count + 1, dtype=object)
                        .reshape(updates_shape), dims, "add")
    except (SemanticsError, ValueError, IndexError):
        return None
    hit = np.array([int(v) for v in hits.flat]).reshape(shape)
    if hit.max(initial=0) > 1 or int(hit.sum()) != count:
        return None
    where = np.argwhere(hit == 1)
    lo, hi = where.min(axis=0), where.max(axis=0) + 1
    box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))
    if math.prod(int(b - a) for a, b in zip(lo, hi)) != count:
        return None
    if [int(v) for v in order[box].flat] != list(range(1, count + 1)):
        return None
    return [int(a) for a in lo], tuple(int(b - a) for a, b in zip(lo, hi))


def _has_collective(op: ir.Operation) -> bool:
    """Some op nested in `op`'s regions combines values across devices."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name in COMBINING or inner.name == "stablehlo.collective_broadcast" \
                        or _has_collective(inner):
                    return True
    return False


def _terminator(block) -> ir.Operation:
    """The last op of a block (its return)."""
    return block.operations[len(block.operations) - 1].operation


def _enter_tiles(term: Term, tiles: DeviceTiles) -> list[Local]:
    """Each device's block of a global argument of a per-device program: the tile its
    sharding assigns it (the global shape is the local one times the tile counts)."""
    locals_ = []
    for index in tiles.index:
        local = term
        for dim, (b, count) in enumerate(zip(index, tiles.counts)):
            if count > 1:
                size = term.shape[dim] // count
                local = slice_term(local, dim, b * size, (b + 1) * size)
        locals_.append(Local(term.dtype, local.shape, term=local))
    return locals_


def info_shape(mlir_type) -> tuple[int, ...]:
    """The shape of an MLIR tensor type."""
    return tuple(tensor_type(mlir_type).shape)


def _custom_device_order(module) -> bool:
    """A `sdy.mesh` listing its devices (`device_ids`): partition ids are then not the
    row-major positions the expansion gives the devices."""
    return any(op.operation.name == "sdy.mesh" and "device_ids" in str(op)
               for op in module.body.operations)


# ----- collectives -------------------------------------------------------------------

class LaterCollective(LaterOp):
    """`collective`'s term results, each device's computed where read (`Expansion.lazy`)
    from its sources' values only: a permute's from its source's, a grouped collective's
    from its group's."""

    def __init__(self, info: OpInfo, ins: list[list[Local]], mesh: Mesh):
        super().__init__()
        self.info = info
        self.ins = ins
        self.sources = device_sources(info, mesh)
        types = result_types(info)
        self.by_device = [Later(self, d).locals_(types) for d in range(mesh.num_devices)]

    def results(self) -> list[list[Local]]:
        return [list(values) for values in zip(*self.by_device)]

    def reads(self, d: int) -> list[Local]:
        return [values[m] for values in self.ins for m in self.sources[d]]

    def compute(self, d: int) -> list[Local]:
        sources = self.sources[d]
        return [member_result(self.info, t, [self.ins[k][m].as_term() for m in sources],
                              sources, d)
                for k, t in enumerate(self.info.result_types)]


def collective(info: OpInfo, ins: list[list[Local]], mesh: Mesh) -> list[list[Local]]:
    """Results per result per device of a collective from its operands' values on every
    device (`ins[k][d]`): concrete values by the collective's semantics, terms combined
    over each group (groups as `semantics/groups.py` reads them)."""
    n = mesh.num_devices
    name = info.name
    if all(local.values is not None for values in ins for local in values):
        try:
            per_device = COLLECTIVE_SEMANTICS[name](
                info, mesh, [[values[d].values for values in ins] for d in range(n)])
        except SemanticsError as err:
            raise NotExpanded(f"{name}: {err}", info.loc) from None
        return [[Local(t.dtype, t.shape, values=np.asarray(per_device[d][k], dtype=object)
                       .reshape(t.shape)) for d in range(n)]
                for k, t in enumerate(info.result_types)]
    terms = [[local.as_term() for local in values] for values in ins]
    sources = device_sources(info, mesh)
    return [[member_result(info, t, [terms[k][m] for m in sources[d]], sources[d], d)
             for d in range(n)]
            for k, t in enumerate(info.result_types)]


def device_sources(info: OpInfo, mesh: Mesh) -> list[list[int]]:
    """Per device, the devices whose operands its result of the collective reads: a
    permute's source (none where no pair targets it), a grouped collective's group (in
    group order)."""
    n = mesh.num_devices
    name = info.name
    if name == "stablehlo.collective_permute":
        try:
            pairs = permute_pairs(info.attrs, mesh.replicas, mesh.partitions)
        except GroupError as err:
            raise NotExpanded(f"{name}: {err}", info.loc) from None
        source = {t: s for s, t in pairs}
        return [[source[d]] if d in source else [] for d in range(n)]
    try:
        groups = replica_groups(info, mesh)
    except SemanticsError as err:
        raise NotExpanded(f"{name}: {err}", info.loc) from None
    member_of = {d: list(g) for g in groups for d in g}
    if len(member_of) != n or set(member_of) != set(range(n)):
        raise NotExpanded(f"{name}: a device in no group", info.loc)
    return [member_of[d] for d in range(n)]


def member_result(info: OpInfo, result, members: list[Term], sources: list[int], d: int
                  ) -> Local:
    """Device d's value of one result (`result`: its type) of a collective from its
    sources' operand terms (`device_sources`): a permute's source's (zero where none), a
    grouped collective's combination at d's position."""
    if info.name == "stablehlo.collective_permute":
        term = members[0] if members else make_splat(0, result.shape, result.dtype)
    else:
        term = _combine(info, members, sources.index(d), len(sources), result.dtype)
    if tuple(term.shape) != tuple(result.shape):
        raise NotExpanded(f"internal: {info.name} result shape differs from its type",
                          info.loc)
    return Local(result.dtype, term.shape, term=term)


def _combine(info: OpInfo, members: list[Term], position: int, count: int,
             dtype: str) -> Term:
    """One member's result of a grouped collective (members in group order, `position` the
    member's place in it; `dtype` the result's element type)."""
    name = info.name
    attrs = info.attrs
    if name in ("stablehlo.all_reduce", "stablehlo.reduce_scatter"):
        total = _reduce(info, members, dtype)
        if name == "stablehlo.all_reduce":
            return total
        dim = attrs["scatter_dimension"]
        part = total.shape[dim] // count
        if total.shape[dim] % count:
            raise NotExpanded("reduce_scatter: dim not divisible by the group size",
                              info.loc)
        return slice_term(total, dim, position * part, (position + 1) * part)
    if name == "stablehlo.all_gather":
        return make_concat(members, attrs["all_gather_dim"])
    if name == "stablehlo.all_to_all":
        split, concat = attrs["split_dimension"], attrs["concat_dimension"]
        if attrs.get("split_count", count) != count:
            raise NotExpanded("all_to_all: split_count differs from the group size",
                              info.loc)
        part = members[0].shape[split] // count
        if members[0].shape[split] % count:
            raise NotExpanded("all_to_all: split dim not divisible by the group size",
                              info.loc)
        return make_concat([slice_term(m, split, position * part, (position + 1) * part)
                            for m in members], concat)
    raise NotExpanded(f"{name} is not expanded yet", info.loc)


def _reduce(info: OpInfo, members: list[Term], dtype: str) -> Term:
    """The reduction of the members' terms by the collective's reducer (exact: the reducers
    are associative and commutative; float sums regroup, liberty 1)."""
    reducer = info.attrs.get("reducer", "other")
    if reducer not in _COMBINE:
        raise NotExpanded(f"{info.name} with a '{reducer}' reducer", info.loc)
    shape = members[0].shape
    if reducer == "add":
        return make_lin([(Fraction(1), m) for m in members], Fraction(0), shape, dtype)
    if reducer == "mul":
        total = members[0]
        for m in members[1:]:
            total = make_mul(total, m)
        return total
    if len(members) == 1:
        return members[0]
    return make_elementwise(_COMBINE[reducer], tuple(members), (), dtype)
