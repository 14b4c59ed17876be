"""The forward walk: every op's relation from its operands' relations, by its rule.

One walk over the reference (global values, every argument a leaf term) and one over the sharded
function (global outside `sdy.manual_computation`, per-device layouts inside it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from entangle_mlir.analysis.layer_reuse import LayerIndex, LayerReuse
from entangle_mlir.analysis.loop_slices import carry_reads, closure, filled, renumbered
from entangle_mlir.core.diagnostics import InputError, SourceLoc
from entangle_mlir.core.mesh import Mesh, axes_str, too_many_devices
from entangle_mlir.core.progress import Progress
from entangle_mlir.core.relations import (
    DEVICE_BLOCK_VALUES,
    GLOBAL,
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
    Windowed,
)
from entangle_mlir.core.terms import (
    LOOP_BODY_TERMS,
    Term,
    intern,
    make_arg,
    make_loopvar,
    make_splat,
    splat_value,
)
from entangle_mlir.mlir.opinfo import OpInfo, describe, op_location, tensor_type
from entangle_mlir.mlir.per_device import (
    device_count,
    is_per_device,
    layout_of,
    parameter_shardings,
    result_shardings,
    synthesize_mesh,
)
from entangle_mlir.mlir.program import mesh_from_attr, read_meshes
from entangle_mlir.normalize.validate import grid
from entangle_mlir.rules import RuleContext
from entangle_mlir.rules.common import freeze, resize, uniform_rel
from entangle_mlir.rules.control import CASE
from entangle_mlir.rules.dispatch import apply_rule, settle, settle_operands
from entangle_mlir.rules.kinds.device_blocks import varying_axes

_TERMINATORS = ("func.return", "stablehlo.return", "sdy.return")


@dataclass
class OpRecord:
    """One op of a walk: what went in, what came out, and what its rule had to say."""

    index: int
    info: OpInfo
    inputs: list[Value]
    outputs: list[Value]
    hints: list[tuple[str, str]] = field(default_factory=list)
    manual_axes: tuple[str, ...] = ()
    sources: list[OpRecord | None] = field(default_factory=list)

    @property
    def loc(self) -> SourceLoc | None:
        return self.info.loc

    def relation_text(self) -> str:
        return "; ".join(v.describe() for v in self.outputs if v is not None)


@dataclass
class Boundary:
    """How a manual computation's result maps to per-device values (ρ for that result)."""

    rho: str
    record: OpRecord | None


RESIDUAL_VALUES = (InBlock, BlockIndex, Masked, Shifted)
"""Device-dependent values a manual computation may hand to a later one (`Residual`)."""


@dataclass(frozen=True)
class Residual:
    """A device-dependent value (`RESIDUAL_VALUES`) a manual computation returned: jax's
    gradient of a shard_map passes the forward's masks and local indices to the backward's
    manual computation this way. With out_specs that split over every axis the value varies
    along, the global result is the concatenation of the devices' local values, so a manual
    computation of the same mesh and manual axes reading it with the same specs gives every
    device exactly its own value back; `problem` says why it cannot be read back ('' if it
    can). Outside manual computations the result stays opaque."""

    value: Value
    tiling: tuple[tuple[str, ...], ...]
    mesh: Mesh
    manual: tuple[str, ...]
    problem: str = ""


@dataclass
class Walk:
    """The result of walking one function."""

    records: list[OpRecord] = field(default_factory=list)
    values: dict = field(default_factory=dict)
    outputs: list[Value] = field(default_factory=list)
    output_rho: list[str] = field(default_factory=list)
    output_spec: list[str] = field(default_factory=list)
    """Each output's declared layout as a PartitionSpec (`partition_spec_text`; '' where the
    output is computed outside shard_map or its layout is unusable)."""
    notes: list[str] = field(default_factory=list)
    mesh: Mesh | None = None
    return_record: OpRecord | None = None


def per_device_mesh(module: ir.Module, func: ir.Operation, file: str
                    ) -> tuple[Mesh, list[str | None], list[str | None]]:
    """A partitioned program's synthesized mesh (`per_device.synthesize_mesh`; run as replicas,
    device ids are replica ids) and its parameters' and results' sharding strings."""
    shardings = parameter_shardings(module, func)
    result_count = len(ir.FunctionType(
        ir.TypeAttr(func.attributes["function_type"]).value).results)
    results = result_shardings(module, func, result_count)
    everything = [s for s in shardings + results if s]
    try:
        count = device_count(module, everything)
    except InputError as err:
        err.file = err.file or file
        raise
    mesh = synthesize_mesh(count, everything)
    replicas, partitions = grid(module)
    if replicas > 1 and (partitions or 1) == 1 and replicas == mesh.num_devices:
        mesh = replace(mesh, replicas=replicas)  # device ids are replica ids
    return mesh, shardings, results


class Walker:
    """Walks a function body; `file` names the source for locations without one."""

    def __init__(self, func: ir.Operation, module: ir.Module, file: str,
                 reference: set[int] | None = None, layers: LayerIndex | None = None):
        """`reference`: the reference's terms, None when this is the reference's walk.
        `layers`: summarize repeated layers (`layer_reuse.LayerReuse`); the reference's walk
        fills the index, the sharded walk reads it."""
        self.func = func
        self.reference = reference
        self.module = module
        self.file = file
        self.meshes = read_meshes(module)
        self.walk = Walk()
        self.boundary: dict = {}
        self.boundary_spec: dict = {}
        self.residuals: dict = {}
        self.producer: dict = {}
        self.loop_depth = 0
        self.per_device_mode = False
        self.reuse = None if layers is None else LayerReuse(
            layers, reference is None, self._op, self.walk.values, self.walk.records,
            self.producer, self.walk.notes)

    def run(self) -> Walk:
        self.progress = Progress(f"walking {os.path.basename(self.file)}, ops")
        try:
            return self._run()
        finally:
            self.progress.close()

    def _run(self) -> Walk:
        block = self.func.regions[0].blocks[0]
        for i, arg in enumerate(block.arguments):
            t = describe_type(arg.type)
            self.walk.values[arg] = Rel(make_arg(i, t.shape, t.dtype), ((),) * len(t.shape),
                                        scope=GLOBAL)
        if is_per_device(self.module, self.func) and not self._has_manual(block):
            self._per_device(block)
        else:
            self._block(block, RuleContext(reference=self.reference))
        return self.walk

    @staticmethod
    def _has_manual(block) -> bool:
        return any(op.operation.name == "sdy.manual_computation" for op in block.operations)

    def _per_device(self, block) -> None:
        """A partitioned program: parameters are local shards, results are local shards."""
        mesh, shardings, _ = per_device_mesh(self.module, self.func, self.file)
        self.walk.mesh = mesh
        ctx = RuleContext(mesh, mesh.names, reference=self.reference)
        info = OpInfo("func.func", loc=op_location(self.func, self.file), op=None)
        entry = self._record(info, [], [], ctx)
        for arg, text in zip(block.arguments, shardings):
            value = self.walk.values[arg]
            layout = layout_of(text, len(value.term.shape), mesh)
            if layout.tiling is None:
                self.walk.values[arg] = Opaque(f"parameter layout unusable: {layout.reason}",
                                               origin=(entry, None), category="unsupported")
            else:
                local = value.term
                shape = tuple(size * mesh.group_size(axes)
                              for size, axes in zip(local.shape, layout.tiling))
                index = local.attrs[0]
                self.walk.values[arg] = Rel(make_arg(index, shape, local.dtype), layout.tiling)
        self.per_device_mode = True
        self._block(block, ctx)
        outputs = self.walk.outputs
        texts = result_shardings(self.module, self.func, len(outputs))
        results, rhos, specs = [], [], []
        for i, (value, text) in enumerate(zip(outputs, texts)):
            rank = len(value.term.shape) if isinstance(value, Rel) else 0
            layout = layout_of(text, rank, mesh)
            if layout.tiling is None:
                results.append(Opaque(f"result #{i} layout unusable: {layout.reason}",
                                      origin=(self.walk.return_record, None),
                                      category="unsupported"))
                rhos.append("")
                specs.append("")
                continue
            results.append(self._leave(value, layout.tiling, mesh, self.walk.return_record, i))
            rhos.append(rho_text(layout.tiling))
            specs.append(partition_spec_text(layout.tiling))
        self.walk.outputs = results
        self.walk.output_rho = rhos
        self.walk.output_spec = specs

    def _block(self, block, ctx: RuleContext) -> None:
        ops = [op.operation for op in block.operations]
        plan = self.reuse.plan(block) if self.reuse is not None and not self.loop_depth \
            else None
        i = 0
        while i < len(ops):
            if plan is not None:
                i = self.reuse.next_to_walk(plan, i, ctx)
                if i == len(ops):
                    break
            op = ops[i]
            i += 1
            if op.name in _TERMINATORS:
                if op.name == "func.return" and self.walk.return_record is None:
                    self.walk.outputs = [self.walk.values[v] for v in op.operands]
                    self.walk.output_rho = [self.boundary.get(v, "computed globally "
                                                              "(outside shard_map)")
                                            for v in op.operands]
                    self.walk.output_spec = [self.boundary_spec.get(v, "")
                                             for v in op.operands]
                    self.walk.return_record = self._record(describe(op, self.file), [], [], ctx)
                    self.walk.return_record.sources = self._sources(op.operands)
                continue
            if op.name == "sdy.manual_computation":
                self._manual(op, ctx)
                continue
            if op.name == "stablehlo.while":
                self._while(op, ctx)
                continue
            if op.name == CASE:
                self._case(op, ctx)
                continue
            self._op(op, ctx)

    def _sources(self, values) -> list[OpRecord | None]:
        return [self.producer.get(v) for v in values]

    def _record(self, info: OpInfo, inputs, outputs, ctx: RuleContext) -> OpRecord:
        record = OpRecord(len(self.walk.records), info, inputs, outputs, list(ctx.hints),
                          ctx.manual_axes)
        self.walk.records.append(record)
        self.progress.update(record.index)
        return record

    def _op(self, op: ir.Operation, ctx: RuleContext) -> None:
        try:
            info = describe(op, self.file)
        except Exception as err:  # noqa: BLE001 - an unreadable op is "not proven", not a crash
            info = OpInfo(op.name, loc=op_location(op, self.file), op=op)
            self._give_up(op, info, f"cannot read the attributes of {op.name}: {err}", ctx)
            return
        operands, results = list(op.operands), list(op.results)
        values = self.walk.values
        inputs = settle_operands([values[v] for v in operands], info.name)
        local = RuleContext(ctx.mesh, ctx.manual_axes, reference=ctx.reference)
        outputs = apply_rule(info, inputs, local, bool(op.regions), len(results))
        record = self._record(info, inputs, [], local)
        producer = self.producer
        record.sources = [producer.get(v) for v in operands]
        for result in results:
            producer[result] = record
        for note in local.notes:
            if note not in self.walk.notes:
                self.walk.notes.append(note)
        outputs = [v if type(v) is Rel and not v.partial else self._stamp(v, record, inputs)
                   for v in outputs]
        record.outputs = outputs
        for result, value in zip(results, outputs):
            values[result] = value

    def _case(self, op: ir.Operation, ctx: RuleContext) -> None:
        """lax.switch / lax.cond: every branch's region walked whole (each op by its rule, as
        any op), then the results from the index and the branches' results by the case rule
        (`rules/control.py`: the select chain on a device-independent index). Its record's
        inputs are the index and each branch's results, so the instance check sees both."""
        info = describe(op, self.file)
        branches, sources = [], self._sources(op.operands)
        types = list(info.operand_types)
        for region in op.regions:
            block = region.blocks[0]
            self._block(block, ctx)
            terminator = block.operations[len(block.operations) - 1].operation
            branches.append([settle(self.walk.values.get(v)) for v in terminator.operands])
            sources.extend(self._sources(terminator.operands))
            types.extend(tensor_type(v.type) for v in terminator.operands)
        inputs = settle_operands([self.walk.values[op.operands[0]]], CASE) + \
            [v for branch in branches for v in branch]
        case_info = replace(info, attrs={**info.attrs, "branches": len(branches)},
                            operand_types=types)
        local = RuleContext(ctx.mesh, ctx.manual_axes, reference=ctx.reference)
        outputs = apply_rule(case_info, inputs, local, False, len(op.results))
        record = self._record(case_info, inputs, [], local)
        record.sources = sources
        for result in op.results:
            self.producer[result] = record
        outputs = [v if type(v) is Rel and not v.partial else self._stamp(v, record, inputs)
                   for v in outputs]
        record.outputs = outputs
        for result, value in zip(op.results, outputs):
            self.walk.values[result] = value

    def _while(self, op: ir.Operation, ctx: RuleContext) -> None:
        """A loop as a fixpoint over layouts: walk the body once with symbolic loop variables
        (one per carried value) laid out like the inits; if the body yields the same layouts,
        every iteration keeps them, and each result is `while_result(inits, cond, body)`,
        identified by the body's terms. Cost does not depend on the trip count."""
        info = describe(op, self.file)
        inits = [settle(self.walk.values[v]) for v in op.operands]
        record = self._record(info, inits, [], ctx)
        record.sources = self._sources(op.operands)
        for result in op.results:
            self.producer[result] = record
        outputs = self._while_outputs(op, info, inits, record, ctx)
        record.outputs = outputs
        for result, value in zip(op.results, outputs):
            self.walk.values[result] = value

    def _while_outputs(self, op, info: OpInfo, inits, record: OpRecord, ctx: RuleContext):
        count = len(op.results)
        opaque = next((v for v in inits if isinstance(v, Opaque)), None)
        if opaque is not None:
            return [opaque] * count
        if any(isinstance(v, (DeviceScalar, Shifted, Returning, *DEVICE_BLOCK_VALUES))
               for v in inits):
            return [Opaque("a device-dependent integer carried through a loop is not "
                           "supported yet", origin=(record, None), category="unsupported")] * count
        depth = self.loop_depth = self.loop_depth + 1
        try:
            layouts = [freeze(v) for v in inits]
            # A zero buffer built at the local shape (scan's stacked gradients) first enters
            # with its poly dims, so the body's writes can tell its split; that probing walk is
            # never the final one (a carried value is not constant along any dim).
            probing = any(v.poly and splat_value(v.term) == 0 for v in inits)
            # Values the body passes through unchanged are the init on every iteration: they
            # enter as themselves, so a constant jax carries (a cotangent seed) meets the
            # reference's inline constant, and they do not take part in the loop's identity.
            body = op.regions[1].blocks[0]
            body_yields = list(body.operations[len(body.operations) - 1].operation.operands)
            invariant = {k for k, (arg, out) in enumerate(zip(body.arguments, body_yields))
                         if arg == out}
            for _attempt in range(5):
                mark = len(self.walk.records)
                position = {k: i for i, k in enumerate(k for k in range(count)
                                                       if k not in invariant)}
                loopvars = [v if k in invariant or probing and v.poly and splat_value(v.term) == 0
                            else replace(rel, term=make_loopvar(depth, position[k],
                                                                rel.term.shape, rel.term.dtype),
                                         partial_origin=None)
                            for k, (v, rel) in enumerate(zip(inits, layouts))]
                cond = self._region(op.regions[0].blocks[0], loopvars, ctx)
                yields = self._region(op.regions[1].blocks[0], loopvars, ctx)
                inner = next((v for v in list(cond) + list(yields)
                              if isinstance(v, Opaque)), None)
                if inner is not None:
                    return [inner] * count
                problem = self._loop_problem(cond, yields, ctx)
                if problem:
                    return [Opaque(problem, origin=(record, None), category="unsupported")
                            ] * count
                changed, probing = probing, False
                rotation = None
                for k, (layout, out) in enumerate(zip(layouts, yields)):
                    if _same_layout(layout, out):
                        continue
                    moved = _moved_from(body, body_yields[k], k)
                    if moved is not None:
                        rotation = rotation or Opaque(
                            f"the loop moves carried value #{moved} into #{k} unchanged, and "
                            f"they enter with other layouts ({inits[moved].layout_str()}, "
                            f"{layout.layout_str()}): carries that rotate are not supported "
                            "by the layout tier", origin=(record, None), category="unsupported")
                        continue
                    if out.partial and not layout.partial and splat_value(inits[k].term) != 0:
                        origin = out.partial_origin if isinstance(out.partial_origin,
                                                                  OpRecord) else None
                        return [Opaque(f"the loop body yields a partial {out.kind} over "
                                       f"{axes_str(out.partial)} for carried value #{k}: "
                                       "missing all_reduce/psum inside the loop",
                                       origin=(record, origin), category="missing_reduction")
                                ] * count
                    if splat_value(inits[k].term) != 0:
                        return [Opaque(f"loop-carried value #{k} enters as "
                                       f"{layout.layout_str()} but the body yields "
                                       f"{out.layout_str()}", origin=(record, None),
                                       category="layout_mismatch")] * count
                    layouts[k] = replace(layout, term=out.term, tiling=out.tiling,
                                         partial=out.partial, kind=out.kind, poly=frozenset())
                    changed = True
                if rotation is not None:
                    return [rotation] * count
                if not changed:
                    passed = {k for k in range(count) if k not in invariant
                              and yields[k].term is loopvars[k].term}
                    invariant |= passed
                    changed = bool(passed)
                if not changed:
                    break
                del self.walk.records[mark:]
            else:
                return [Opaque("loop-carried layouts do not reach a fixpoint",
                               origin=(record, None), category="unsupported")] * count
        finally:
            self.loop_depth = depth - 1
        live = [k for k in range(count) if k not in invariant]
        init_terms = tuple(
            make_splat(splat_value(v.term), layout.term.shape, v.term.dtype)
            if v.term.op == "splat" else v.term for v, layout in zip(inits, layouts))
        reads_cond, reads = carry_reads(op.regions[0].blocks[0], body)
        results = []
        for k, layout in enumerate(layouts):
            if k in invariant:
                results.append(inits[k])
                continue
            term = _loop_result(k, live, closure(k, reads_cond, reads, live), depth,
                                cond[0].term, [y.term for y in yields], init_terms, layout)
            results.append(replace(layout, term=term, partial_origin=record
                                   if layout.partial else None))
        return results

    def _region(self, block, loopvars, ctx: RuleContext) -> list:
        for arg, value in zip(block.arguments, loopvars):
            self.walk.values[arg] = value
        self._block(block, ctx)
        terminator = block.operations[len(block.operations) - 1].operation
        return [settle(self.walk.values.get(v)) for v in terminator.operands]

    @staticmethod
    def _loop_problem(cond, yields, ctx: RuleContext) -> str:
        for value in list(cond) + list(yields):
            if not isinstance(value, Rel):
                return "a loop body yields a device-dependent integer (not supported yet)"
        if len(cond) != 1 or cond[0].partial or cond[0].tiled_axes:
            return "the loop condition differs between devices"
        return ""

    def _give_up(self, op: ir.Operation, info: OpInfo, reason: str, ctx: RuleContext) -> None:
        inputs = [self.walk.values.get(v) for v in op.operands]
        record = self._record(info, inputs, [], ctx)
        record.sources = self._sources(op.operands)
        for result in op.results:
            self.producer[result] = record
        earlier = next((v for v in inputs if isinstance(v, Opaque)), None)
        value = earlier or Opaque(reason, origin=(record, None), category="internal")
        record.outputs = [value] * len(op.results)
        for result in op.results:
            self.walk.values[result] = value

    def _stamp(self, value: Value, record: OpRecord, inputs: list[Value]) -> Value:
        """Give a fresh Opaque its origin; point partial-sum origins at records."""
        if isinstance(value, Opaque) and value.origin is None:
            blame = None
            if value.category in ("partial_mixed", "nonlinear_partial"):
                blame = next((v.partial_origin for v in inputs
                              if isinstance(v, Rel) and v.partial), None)
            elif value.category in ("wrong_offset", "unrelated", "layout_mismatch"):
                # a mask that is not the block, a lookup never zeroed: where they were made
                blame = next((v.origin for v in inputs if isinstance(v, InBlock) and
                              value.category != "layout_mismatch" or isinstance(v, Masked)
                              and not v.zero and value.category == "layout_mismatch"), None)
            return replace(value, origin=(record, blame))
        if isinstance(value, InBlock | Masked) and value.origin is None:
            return replace(value, origin=record)
        if isinstance(value, Permuted | Windowed) and value.origin is None:
            return replace(value, origin=(record, None))
        if isinstance(value, Reordered) and value.rel.partial:
            value = replace(value, pieces=record)
        if isinstance(value, Reordered) and value.origin is None:
            permute = next((s for s in record.sources if s is not None
                            and s.info.name == "stablehlo.collective_permute"), record)
            return replace(value, origin=(permute, None))
        if isinstance(value, Rel) and value.partial and isinstance(value.partial_origin, OpInfo):
            return replace(value, partial_origin=record)
        return value

    def _manual(self, op: ir.Operation, ctx: RuleContext) -> None:
        info = describe(op, self.file)
        mesh, in_tilings, out_tilings, manual = self._manual_shardings(op, info)
        self.walk.mesh = mesh
        inner = RuleContext(mesh, manual, reference=self.reference)
        block = op.regions[0].blocks[0]
        record = self._record(info, [self.walk.values[v] for v in op.operands], [], inner)
        for value, arg, tiling in zip(op.operands, block.arguments, in_tilings):
            if value in self.producer:
                self.producer[arg] = self.producer[value]
            residual = self.residuals.get(value)
            self.walk.values[arg] = self._enter(self.walk.values[value], tiling, mesh, record,
                                                 manual) if residual is None else \
                self._read_back(residual, tiling, mesh, manual, record)
        self._block(block, inner)
        terminator = block.operations[len(block.operations) - 1].operation
        results, residuals = [], []
        for i, (value, tiling) in enumerate(zip(terminator.operands, out_tilings)):
            inner_value = self.walk.values[value]
            results.append(self._leave(inner_value, tiling, mesh, record, i))
            residuals.append(_residual(settle(inner_value), tiling, mesh, manual, results[-1]))
        record.outputs = results
        record.sources = self._sources(terminator.operands)
        for result in op.results:
            self.producer[result] = record
        for result, value, tiling, residual in zip(op.results, results, out_tilings, residuals):
            if residual is None:
                self.residuals.pop(result, None)
            else:
                self.residuals[result] = residual
            self.walk.values[result] = value
            self.boundary[result] = rho_text(tiling)
            self.boundary_spec[result] = partition_spec_text(tiling)

    def _manual_shardings(self, op: ir.Operation, info: OpInfo):
        manual = tuple(str(a).strip('"') for a in sdy.ManualAxesAttr(op.attributes["manual_axes"]))
        ins = sdy.TensorShardingPerValueAttr(op.attributes["in_shardings"]).shardings
        outs = sdy.TensorShardingPerValueAttr(op.attributes["out_shardings"]).shardings
        meshes = {self._mesh_of(s, info) for s in list(ins) + list(outs)}
        if not meshes:
            if not self.meshes:
                raise InputError("manual computation without a mesh", info.loc, self.file)
            meshes = {next(iter(self.meshes.values()))}
        if len(meshes) != 1:
            raise InputError("manual computation uses several meshes", info.loc, self.file)
        mesh = meshes.pop()
        for axis in manual:
            if axis not in mesh.names:
                raise InputError(f"manual axis '{axis}' is not an axis of the mesh "
                                 f"{mesh.describe()}", info.loc, self.file)
        return (mesh, [self._tiling(s, mesh, info) for s in ins],
                [self._tiling(s, mesh, info) for s in outs], manual)

    def _mesh_of(self, sharding, info: OpInfo) -> Mesh:
        attr = sdy.TensorShardingAttr(sharding).mesh_or_ref
        text = str(attr)
        if text.startswith("@"):
            name = text[1:].strip('"')
            if name not in self.meshes:
                raise InputError(f"sharding refers to mesh @{name}, which is not defined",
                                 info.loc, self.file)
            mesh = self.meshes[name]
        else:
            mesh = mesh_from_attr(attr)
        problem = too_many_devices(mesh.num_devices)
        if problem:
            raise InputError(problem, info.loc, self.file)
        return mesh

    def _tiling(self, sharding, mesh: Mesh, info: OpInfo) -> tuple[tuple[str, ...], ...]:
        tensor = sdy.TensorShardingAttr(sharding)
        tiling = []
        for dim in tensor.dimension_shardings:
            axes = []
            for ref in sdy.DimensionShardingAttr(dim).axes:
                axis = sdy.AxisRefAttr(ref)
                if axis.sub_axis_info is not None:
                    raise InputError("sub-axis shardings are not supported", info.loc, self.file)
                if axis.name not in mesh.names:
                    raise InputError(f"sharding uses axis '{axis.name}', which is not in the "
                                     f"mesh {mesh.describe()}", info.loc, self.file)
                axes.append(axis.name)
            tiling.append(tuple(axes))
        return tuple(tiling)

    def _enter(self, value: Value, tiling, mesh: Mesh, record: OpRecord,
               manual: tuple[str, ...]) -> Value:
        """A manual computation's input as each device sees it under its in_specs. A splat
        split any way is the same splat on every device, at the local shape with every dim
        poly, as a constant built inside would be (jax's gradient hands the forward's local
        divisors to the backward split over 'dp')."""
        if not isinstance(value, Rel):
            return value
        free = [a for axes in tiling for a in axes if a not in manual]
        if free:
            return Opaque(f"input split over non-manual axes {axes_str(free)} (partially manual "
                          "computations are not supported yet)", origin=(record, None),
                          category="unsupported")
        for size, axes in zip(value.term.shape, tiling):
            if size % mesh.group_size(axes):
                return Opaque(f"dim of size {size} does not divide over {axes_str(axes)}",
                              origin=(record, None), category="unsupported")
        constant = splat_value(value.term) if any(tiling) else None
        if constant is not None:
            local = tuple(n // mesh.group_size(axes) for n, axes in zip(value.term.shape, tiling))
            return uniform_rel(make_splat(constant, local, value.term.dtype),
                               RuleContext(mesh, manual))
        return Rel(value.term, tuple(tiling), scope="")

    @staticmethod
    def _read_back(residual: Residual, tiling, mesh: Mesh, manual: tuple[str, ...],
                   record: OpRecord) -> Value:
        """A manual computation's input that an earlier one returned as a device-dependent
        value (`Residual`): that value again on every device when the specs agree dim by dim
        and axis by axis on the same mesh and manual axes; else opaque, with the reason."""
        problem = residual.problem
        if not problem and (mesh != residual.mesh or manual != residual.manual):
            problem = (f"a device-dependent value shard_map returned over manual axes "
                       f"{axes_str(residual.manual)} of the mesh {residual.mesh.describe()} is "
                       f"read by a shard_map over manual axes {axes_str(manual)} of the mesh "
                       f"{mesh.describe()}")
        if not problem and tuple(tiling) != residual.tiling:
            problem = (f"a device-dependent value shard_map returned with out_specs "
                       f"{partition_spec_text(residual.tiling)} is read back with in_specs "
                       f"{partition_spec_text(tiling)}: the devices do not get their own "
                       "values back")
        if problem:
            return Opaque(problem, origin=(record, None), category="wrong_layout")
        return residual.value

    @property
    def _scope_name(self) -> str:
        return "the program" if self.per_device_mode else "shard_map"

    def _leave(self, value: Value, tiling, mesh: Mesh, record: OpRecord, index: int) -> Value:
        value = settle(value)
        if isinstance(value, Opaque):
            return value
        if isinstance(value, Shifted):
            return Opaque("shard_map returns a tensor offset by a device-dependent constant "
                          "(not supported yet)", origin=(record, None), category="unsupported")
        if isinstance(value, DeviceScalar | InBlock | BlockIndex | Masked):
            return Opaque("shard_map returns a device-dependent value", origin=(record, None),
                          category="unrelated")
        if value.partial:
            origin = value.partial_origin if isinstance(value.partial_origin, OpRecord) else None
            verb = "sum" if value.kind == "sum" else value.kind
            return Opaque(f"value is still a partial {verb} over {axes_str(value.partial)} when "
                          f"it leaves {self._scope_name} (result #{index}): missing all_reduce/"
                          f"{'psum' if verb == 'sum' else 'p' + verb}",
                          origin=(record, origin), category="missing_reduction")
        term = value.term
        for dim in sorted(value.poly):
            global_size = term.shape[dim] * mesh.group_size(tiling[dim])
            resized = resize(term, dim, global_size)
            if resized is None:
                return Opaque("cannot widen a broadcast output", origin=(record, None),
                              category="internal")
            term = resized
        if tuple(value.tiling) != tuple(tiling) and not all(
                d in value.poly for d, axes in enumerate(tiling) if axes != value.tiling[d]):
            return Opaque(f"result #{index} is {_layout_words(value.tiling)} but out_specs "
                          f"declares it {_layout_words(tiling)}", origin=(record, None),
                          category="wrong_layout")
        return Rel(term, ((),) * len(term.shape), scope=GLOBAL)


_READ_BACK_LAYOUTS = frozenset({"wrong_layout", "missing_reduction"})
"""Why a relation leaving a manual computation has no global meaning that a later manual
computation may still read back as it was (`_residual`)."""


def _residual(value: Value, tiling, mesh: Mesh, manual: tuple[str, ...],
              left: Value) -> Residual | None:
    """How a device-dependent value leaving a manual computation (as `left`) may be read back
    by a later one (None: not such a value). That is a `RESIDUAL_VALUES` value, or a relation
    whose layout the out_specs do not declare (another split dim, a partial sum: jax's
    gradient of a shard_map returns its residuals split over every manual axis along dim 0):
    the global result then holds the devices' local values in the out_specs' arrangement,
    which no reference term describes, but read back with the same specs each device gets
    its own. Devices that differ only on axes the out_specs do not split over share one block
    of the global result, so the value may vary along none of them."""
    if not isinstance(value, RESIDUAL_VALUES) and not (
            isinstance(value, Rel) and isinstance(left, Opaque)
            and left.category in _READ_BACK_LAYOUTS):
        return None
    split = {a for axes in tiling for a in axes}
    missing = sorted(varying_axes(value, mesh) - split)
    automatic = [a for a in mesh.names if a not in manual and mesh.size(a) > 1]
    problem = ""
    if automatic:
        problem = (f"shard_map returns a device-dependent value from a computation that is "
                   f"not manual over {axes_str(automatic)} (not supported yet)")
    elif missing:
        problem = (f"shard_map returns a device-dependent value that varies along "
                   f"{axes_str(missing)}, which its out_specs {partition_spec_text(tiling)} do "
                   "not split over: the global result holds only some devices' values")
    return Residual(value, tuple(tiling), mesh, tuple(manual), problem)


def _loop_result(k: int, live: list[int], sliced: list[int], depth: int, cond: Term,
                 yields: list[Term], init_terms: tuple[Term, ...], layout: Rel) -> Term:
    """Carry `k`'s value at the loop's exit: `while_result` of the inits, condition and
    yields of the carries it depends on (`loop_slices`), the loop variables numbered within
    that slice; the whole loop where the slice cannot be renumbered."""
    body = None if sliced == live else renumbered(
        [cond] + [yields[j] for j in sliced], depth,
        {live.index(j): i for i, j in enumerate(sliced)})
    if body is None:
        sliced, body = live, [cond] + [yields[j] for j in live]
    x = filled(sliced.index(k), depth, body[0], body[1:], [init_terms[j] for j in sliced])
    if x is not None:
        return x
    summary = (body[0].serial, tuple(t.serial for t in body[1:]))
    for body_term in body:
        LOOP_BODY_TERMS[body_term.serial] = body_term
    return intern("while_result", tuple(init_terms[j] for j in sliced),
                  (sliced.index(k), depth, summary), layout.term.shape, layout.term.dtype)


def _moved_from(body, value, slot: int) -> int | None:
    """The carried value a loop body yields unchanged into `slot` from another slot (its
    block argument), if any: a rotation of carries, whose layouts differ by where each value
    started, not by anything the body computes (no missing psum to claim)."""
    for k, argument in enumerate(body.arguments):
        if argument == value:
            return None if k == slot else k
    return None


def _same_layout(a: Rel, b: Value) -> bool:
    return (isinstance(b, Rel) and a.tiling == b.tiling and a.partial == b.partial
            and a.kind == b.kind and a.term.shape == b.term.shape)


def describe_type(t):
    return tensor_type(t)


def _layout_words(tiling) -> str:
    parts = [f"split along dim {d} over {axes_str(axes)}" for d, axes in enumerate(tiling)
             if axes]
    return " and ".join(parts) or "replicated"


def partition_spec_text(tiling) -> str:
    """A layout as the PartitionSpec a JAX user writes: `P('dp', None)`, `P(('dp', 'tp'),)`
    for a dim split over two axes, `P()` for a scalar."""
    def dim(axes) -> str:
        if not axes:
            return "None"
        if len(axes) == 1:
            return repr(axes[0])
        return "(" + ", ".join(repr(a) for a in axes) + ")"
    parts = [dim(axes) for axes in tiling]
    return f"P({parts[0]},)" if len(parts) == 1 and len(tiling[0]) > 1 else \
        f"P({', '.join(parts)})"


def rho_text(tiling) -> str:
    """ρ for one result, e.g. `concat over 'tp' along dim 1`."""
    parts = [f"concat over {axes_str(axes)} along dim {d}" for d, axes in enumerate(tiling)
             if axes]
    return ", then ".join(parts) if parts else "replicated on every device"


def reference_terms(walk: Walk) -> dict[int, Term]:
    """Every term the reference computes, by serial (for locating a divergence)."""
    found = {}
    for value in walk.values.values():
        if isinstance(value, Rel):
            found[value.term.serial] = value.term
    return found
