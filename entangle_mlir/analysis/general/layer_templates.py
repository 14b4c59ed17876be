"""One layer's function proven once for the general tier (issue 21: the pipeline rows).

A layer stack lowered from a Python loop repeats one layer's ops with a fixed period in the
reference's function and in the sharded stage's body (`layer_reuse.find_runs`, the same
fingerprints and signature the layout tier's whole-layer reuse reads). This module proves
that the two layers compute the same function, once, for every value of their inputs:

* the reference's layer is walked with fresh leaves ("holes") for its external inputs:
  `R(x, w_1 .. w_k)`, `x` its residual stream (the one input the next layer reads from this
  layer: `LayerRegion.stream`), the `w_i` its weights (and any other per-layer input);
* the sharded layer is expanded on every device of the mesh (`Expansion._device_op`, its
  collectives combined over their groups) with its own inputs made from the same holes: the
  stream input a hole `x_b` of the sharded block's shape, given to every device; a weight
  whose device block is smaller than the reference's along one dim the block of the
  reference's hole at the device's position in the layer's collective group (Megatron tp);
  one of the reference's shape the hole itself. Every device's stream output must be one
  term `T(x_b, w_1 .. w_k)`;
* the template equality: `R(x, w) == concat_b T(slice_b(x), w)` over the row blocks `b` of
  the stream, decided by the general tier's `Decider` (normal form, then Z3), for all values
  of the holes (no valid-index assumption: holes are not program inputs).

`prove_layer_template(program)` returns the proven `LayerTemplate` (the term `T` over its
holes, how each input slot is tiled, the layers' signatures) or why there is none. A proven
template is what a later step may abstract by: every layer whose region signature equals a
proven one computes `T` of its actual inputs, so its stream output may be named by one opaque
application (`layer_reuse.region_result` of `T`) in both programs, keeping the general tier's
terms linear in depth. Soundness rests on (1) equal signatures: the same ops, attributes,
types and wiring, reading the inputs in the same pattern (`OpFacts.signature`), and (2) the
decided equality, which holds for every hole value. A layer differing in one op, constant or
input index has another signature; a sharded layer whose collectives do not rebuild the
reference's layer (a missing psum) has no proof.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entangle_mlir.analysis.general.decide import Decider
from entangle_mlir.analysis.general.expand import Expansion
from entangle_mlir.analysis.general.values import Local, NotExpanded
from entangle_mlir.analysis.infer import Walker, describe_type
from entangle_mlir.analysis.instance.abstraction import substitute
from entangle_mlir.analysis.layer_reuse import OpFacts, find_runs, fresh_hole, read_ops
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.normal_form import make_concat, slice_term
from entangle_mlir.core.relations import GLOBAL, Rel
from entangle_mlir.core.terms import Term
from entangle_mlir.mlir.opinfo import describe
from entangle_mlir.mlir.program import Program, functions
from entangle_mlir.rules import RuleContext
from entangle_mlir.semantics.collectives import replica_groups
from entangle_mlir.semantics.element import SemanticsError

GROUPED = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter")
"""Collectives whose replica groups give a weight block's position (the tp group)."""


@dataclass
class LayerRegion:
    """One layer of a run: ops [start, start + period) of a block (`facts`), its external
    inputs in first-use order, the slot of its residual stream among them and the value it
    passes to the next layer in that slot."""

    facts: OpFacts
    start: int
    period: int
    inputs: list
    stream: int
    stream_out: object
    signature: tuple

    def ops(self) -> list:
        """The layer's own ops (the prelude's weight slices excluded)."""
        return [self.facts.ops[i] for i in range(self.start, self.start + self.period)
                if i not in self.facts.prelude]


def repeated_layers(func) -> list[LayerRegion]:
    """The layers of `func`'s top block that repeat (at least two, so the stream slot and
    output are read off the second): the first layer of each run, at its layer boundary."""
    facts = read_ops(func.regions[0].blocks[0])
    found = []
    for run in find_runs(facts):
        start = facts.layer_start(run)
        if start + 2 * run.period > run.end:
            continue
        region = _region(facts, start, run.period)
        if region is not None:
            found.append(region)
    return found


def _region(facts: OpFacts, start: int, period: int) -> LayerRegion | None:
    """The layer at `start` with its stream: the one input slot the next layer (same
    signature) fills with a value this layer computes."""
    signature = facts.signature(start, period)
    if facts.signature(start + period, period) != signature:
        return None
    here, after = (facts.external_inputs(start, period),
                   facts.external_inputs(start + period, period))
    computed = [k for k, v in enumerate(after) if v in facts.position
                and start <= facts.position[v][0] < start + period]
    if len(here) != len(after) or len(computed) != 1:
        return None
    (stream,) = computed
    return LayerRegion(facts, start, period, here, stream, after[stream], signature)


@dataclass
class LayerTemplate:
    """A proven layer: `term` is `T(holes)` (the sharded layer's stream output, equal to the
    reference layer's row block by row block); `tiling[k]`: how slot k's sharded input is
    made from the reference's (None: the hole itself; (dim, count): the device's block of
    `count` along `dim`; "stream": the row block)."""

    term: Term
    holes: list[Term]
    tiling: list
    reference_signature: tuple
    sharded_signature: tuple
    blocks: int
    decision: str = ""


@dataclass
class TemplateProof:
    template: LayerTemplate | None
    reason: str = ""
    tried: list[str] = field(default_factory=list)

    @property
    def proven(self) -> bool:
        return self.template is not None


class _Quiet:
    """A walker's progress display that shows nothing (a template walk is a few ops)."""

    def update(self, _index: int) -> None:
        pass


def reference_layer(program: Program, region: LayerRegion) -> tuple[list[Term], Term]:
    """The reference layer walked once on holes: (the holes by slot, its stream output)."""
    walker = Walker(program.ref_func, program.ref_module, program.ref_file)
    walker.progress = _Quiet()
    holes = []
    for value in region.inputs:
        t = describe_type(value.type)
        hole = fresh_hole(tuple(t.shape), t.dtype)
        holes.append(hole)
        walker.walk.values[value] = Rel(hole, ((),) * len(t.shape), scope=GLOBAL)
    for op in region.ops():
        walker._op(op, RuleContext())
    out = walker.walk.values[region.stream_out]
    if type(out) is not Rel:
        raise NotExpanded("the reference layer's stream output has no term")
    return holes, out.term


def _manual_mesh(program: Program, expansion: Expansion) -> Mesh:
    """The mesh of the sharded function's manual computation."""
    block = program.sharded_func.regions[0].blocks[0]
    for op in block.operations:
        op = op.operation
        if op.name == "sdy.manual_computation":
            mesh, *_ = expansion._manual_shardings(op, describe(op, program.sharded_file))
            return mesh
    raise NotExpanded("no manual computation")


def _groups(region: LayerRegion, mesh: Mesh) -> list[list[int]] | None:
    """The replica groups every grouped collective of the layer uses (one partition of the
    devices), or None when they differ or there is none."""
    found = None
    for op in region.ops():
        if op.name not in GROUPED:
            continue
        try:
            groups = [list(g) for g in replica_groups(describe(op, ""), mesh)]
        except SemanticsError:
            return None
        if found is not None and groups != found:
            return None
        found = groups
    return found


def _tiling(ref_shape: tuple[int, ...], local: tuple[int, ...]):
    """(dim, count) when `local` is `ref_shape` cut `count` ways along one dim; None when
    they are equal; False otherwise."""
    if ref_shape == local:
        return None
    if len(ref_shape) != len(local):
        return False
    differ = [d for d, (a, b) in enumerate(zip(ref_shape, local)) if a != b]
    if len(differ) != 1 or ref_shape[differ[0]] % local[differ[0]]:
        return False
    dim = differ[0]
    return dim, ref_shape[dim] // local[dim]


def device_block(hole: Term, dim: int, position: int, size: int) -> Term:
    """The block of `hole` a device at `position` in its collective group holds."""
    return slice_term(hole, dim, position * size, (position + 1) * size)


def sharded_layer(program: Program, region: LayerRegion, holes: list[Term],
                  stream_slot: int) -> tuple[Term, list, Term, list[Term]]:
    """The sharded layer expanded on every device on inputs made from `holes` (the
    reference's, by slot): (the stream's block hole, the tiling by slot, device 0's stream
    output, every device's)."""
    expansion = Expansion(program.sharded_func, program.sharded_module, program.sharded_file)
    mesh = _manual_mesh(program, expansion)
    n = mesh.num_devices
    groups = _groups(region, mesh)
    position = {d: (p, len(g)) for g in groups or [] for p, d in enumerate(g)}
    env: dict = {}
    tiling: list = []
    block_hole = None
    for k, (value, hole) in enumerate(zip(region.inputs, holes)):
        t = describe_type(value.type)
        local = tuple(t.shape)
        cut = _tiling(hole.shape, local)
        if cut is False or t.dtype != hole.dtype:
            raise NotExpanded(f"input {k} of the sharded layer ({local}) is no block of the "
                              f"reference's ({hole.shape})")
        if k == stream_slot:
            block_hole = fresh_hole(local, t.dtype)
            tiling.append("stream")
            env[value] = [Local(t.dtype, local, term=block_hole)] * n
            continue
        tiling.append(cut)
        if cut is None:
            env[value] = [Local(t.dtype, local, term=hole)] * n
            continue
        dim, count = cut
        if len(position) != n or any(size != count for _, size in position.values()):
            raise NotExpanded(f"input {k} is cut {count} ways, not over the layer's "
                              "collective groups")
        env[value] = [Local(t.dtype, local, term=device_block(hole, dim, position[d][0],
                                                               local[dim]))
                      for d in range(n)]
    expansion.mesh = mesh
    for op in region.ops():
        expansion._device_op(op, env, mesh)
    outs = [local.as_term() for local in env[region.stream_out]]
    return block_hole, tiling, outs[0], outs


@dataclass
class TemplateEquality:
    """The equality a template rests on: `want` (the reference layer on holes) `== got` (the
    sharded layer's term on each row block of the stream hole, concatenated); `outs`: every
    device's term, each to equal `term` (the sharded layer on the block hole)."""

    want: Term
    got: Term
    term: Term
    outs: list[Term]
    holes: list[Term]
    tiling: list
    blocks: int


def template_equality(program: Program, reference: LayerRegion,
                      sharded: LayerRegion) -> TemplateEquality:
    """The terms of the template equality of `reference` and `sharded` (NotExpanded where the
    sharded layer's inputs are no blocks of the reference's)."""
    if len(reference.inputs) != len(sharded.inputs) or reference.stream != sharded.stream:
        raise NotExpanded("the layers read different input lists")
    holes, want = reference_layer(program, reference)
    block, tiling, term, outs = sharded_layer(program, sharded, holes, reference.stream)
    stream_hole = holes[reference.stream]
    dim, blocks = _tiling(stream_hole.shape, block.shape) or (0, 1)
    size = block.shape[dim]
    pieces = [substitute(term, {block.serial: slice_term(stream_hole, dim, b * size,
                                                          (b + 1) * size)})
              for b in range(blocks)]
    got = make_concat(pieces, dim) if blocks > 1 else pieces[0]
    holes = [block if k == reference.stream else h for k, h in enumerate(holes)]
    return TemplateEquality(want, got, term, outs, holes, tiling, blocks)


def prove_template(program: Program, reference: LayerRegion, sharded: LayerRegion,
                   timeout_ms: int = 5_000) -> TemplateProof:
    """Whether the sharded layer `sharded` computes the reference layer `reference` row block
    by row block, for every value of their inputs (the module docstring)."""
    try:
        eq = template_equality(program, reference, sharded)
    except NotExpanded as err:
        return TemplateProof(None, err.reason)
    decider = Decider([eq.want], timeout_ms)
    for d, other in enumerate(eq.outs):
        if other is not eq.term and not decider.decide(eq.term, other, f"template.device{d}",
                                                       ground=False).proved:
            return TemplateProof(None, f"device {d}'s layer output is not device 0's")
    decision = decider.decide(eq.want, eq.got, "template", ground=False)
    if not decision.proved:
        return TemplateProof(None, "the sharded layer is not shown to compute the reference "
                             f"layer: {decision.status} {decision.reason}".rstrip())
    return TemplateProof(LayerTemplate(eq.term, eq.holes, eq.tiling, reference.signature,
                                       sharded.signature, eq.blocks, decision.how))


def prove_layer_template(program: Program, timeout_ms: int = 5_000) -> TemplateProof:
    """The first pair (reference layer, sharded layer) of `program`'s repeated layers whose
    template equality is proven, or why none is (each pair tried, in `tried`)."""
    references = repeated_layers(program.ref_func)
    if not references:
        return TemplateProof(None, "the reference repeats no layer")
    tried: list[str] = []
    for func in functions(program.sharded_module):
        for sharded in repeated_layers(func):
            for reference in references:
                proof = prove_template(program, reference, sharded, timeout_ms)
                if proof.proven:
                    proof.tried = tried
                    return proof
                tried.append(proof.reason)
    return TemplateProof(None, tried[0] if tried else "the sharded program repeats no layer",
                         tried)
