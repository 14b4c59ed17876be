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

`prove_layer_template(program)` returns the proven `LayerTemplate` or why there is none.
A layer is its stream output's cone of ops (`cone`: what the output depends on, so jax's
residuals for the backward fall out), its views of the stream at either end trimmed.

Using it (`tier.general_tier` tries it first, unless `--no-layer-templates`): a value is a
site of the template when the template's ops, matched back from it op by op (`match`:
fingerprint, wiring and input types), reach every op of the template: it is the template's
function of the matched inputs. In the reference (`TemplateWalker`) a site's stream output
becomes a fresh leaf naming `R(inputs)` (`Applications`: one leaf per distinct normal forms
of the inputs); on a device (`TemplateExpansion`) it becomes row block b of that leaf where the device's
stream input is row block b of the site's stream input and its weights are its blocks of
the reference's (`device_stream`), so the terms stay linear in depth (the next layer reads
one leaf, not a sum over every layer below). A decision proven with the leaves free holds
for the values they name; nothing is refuted with them: where the try is not proven, the
tier runs again with every layer expanded. Soundness rests on (1) the match (the same ops,
attributes, types and wiring from the matched inputs), (2) the decided template equality,
which holds for every hole value, and (3) the device checks (group, blocks, stream). A layer
differing in one op, constant or input index is no site; a sharded layer whose collectives
do not rebuild the reference's layer (a missing psum) has no proof, nor one that moves data
between devices outside its group (`MOVING`: the equality is proven with every device
reading the same holes).

The same machinery serves several templates at once (a list of `Applications`): the
backward layer's (`backward_templates.py`) has two row-blocked slots (the forward input and
the incoming cotangent) and is linear in the cotangent (`LayerTemplate.linear`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction

from entangle_mlir.analysis.general.decide import Decider
from entangle_mlir.analysis.general.expand import Expansion
from entangle_mlir.analysis.general.values import Later, LaterOp, Local, NotExpanded
from entangle_mlir.analysis.infer import Walker, describe_type
from entangle_mlir.analysis.instance.abstraction import substitute
from entangle_mlir.analysis.layer_reuse import (
    OpFacts,
    find_runs,
    fresh_hole,
    read_ops,
)
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.normal_form import make_concat, normal_form, slice_term
from entangle_mlir.core.relations import GLOBAL, Rel
from entangle_mlir.core.terms import Term, factor_content, make_lin, make_reshape, scale
from entangle_mlir.mlir.opinfo import describe
from entangle_mlir.mlir.program import Program, functions
from entangle_mlir.rules import RuleContext
from entangle_mlir.semantics.collectives import replica_groups
from entangle_mlir.semantics.element import SemanticsError

GROUPED = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter")
"""Collectives whose replica groups give a weight block's position (the tp group)."""

MOVING = ("stablehlo.collective_permute", "stablehlo.all_to_all",
          "stablehlo.collective_broadcast")
"""Collectives that move data between devices outside a group whose members are checked to
read the same stream (`device_stream`): a sharded layer holding one has no template (the
template equality is proven with every device reading the same holes, so it says nothing
of a device whose output another device's inputs make)."""


STREAM_NODES = 1024
"""A device's stream input of more distinct subterms than this is not normalized to be
read as a block of a stream whole (`device_stream`): the device keeps its expanded term.
A block's stream input is a few nodes (a leaf's row block, an argument's reshaped slice, a
scaled loss gradient); the larger ones were a pipeline's bubble steps (a layer's backward
on another step's garbage, growing by ~300 nodes a step at 70B attention widths), whose
normal forms took 5 of the 28 CPU seconds of the 8-layer row and never were a block. Only
speed depends on it: a stream input not read as a block keeps its true expanded term."""

LAZY = True
"""Whether the expansion through templates computes a value on a device only where it is
read (`Expansion.lazy`): a site's inner ops, which nothing reads once its output is a
leaf's block, and a pipeline's masked bubble steps are then not computed."""

VIEWS = ("stablehlo.reshape", "stablehlo.transpose")
"""Ops that only rearrange the stream between two layers (jax's `x.reshape` at a block's
ends): trimmed off a layer's ends, so that the first layer (reading the program's input
through a view) and the last (whose output no view follows) have the others' signature."""


@dataclass
class LayerRegion:
    """One layer of a block (`facts`): its own ops (`indices`, no prelude op), its external
    inputs in first-use order, the slot of its residual stream among them and the value
    holding its stream output (what the next layer reads, up to views)."""

    facts: OpFacts
    indices: list[int]
    inputs: list
    stream: int
    stream_out: object
    signature: tuple
    streams: tuple[int, ...] = ()
    """Every slot cut into the stream's row blocks (`stream` alone where empty; a backward
    layer's: its forward input and its incoming cotangent)."""
    roles: tuple = ()
    """What each input is to the layer it belongs to (a backward layer's: the slot of its
    forward layer's inputs it is, or "cotangent"); two layers pair only with equal roles."""

    def ops(self) -> list:
        return [self.facts.ops[i] for i in self.indices]

    def stream_slots(self) -> tuple[int, ...]:
        return self.streams or (self.stream,)


def repeated_layers(func, phases: bool = False) -> list[LayerRegion]:
    """The layers of `func`'s blocks that repeat (at least twice, so the stream slot and
    output are read off the next layer): the first layer of each run, at its layer
    boundary (`phases`: at every phase of the run's period, later ones after), its ends'
    views of the stream trimmed."""
    found, later = [], []
    for block in [func.regions[0].blocks[0], *all_blocks_below(func)]:
        facts = read_ops(block)
        for run in find_runs(facts):
            first = facts.layer_start(run)
            starts = range(first, first + run.period) if phases else (first,)
            for start in starts:
                if start + 2 * run.period > run.end:
                    continue
                region = _region(facts, start, run.period)
                if region is not None:
                    (found if start == first else later).append(region)
    return found + later


def all_blocks_below(func) -> list:
    """The blocks nested in the ops of `func`'s top block (a manual computation's body, a
    loop's)."""
    found = []
    for inner in func.regions[0].blocks[0].operations:
        found.extend(all_blocks(inner.operation))
    return found


def _own_ops(facts: OpFacts, start: int, period: int) -> list[int]:
    return [i for i in range(start, start + period) if i not in facts.prelude]


def _region(facts: OpFacts, start: int, period: int) -> LayerRegion | None:
    """The layer at `start` with its stream: the one input slot the next layer fills with a
    value this layer computes; views of the stream at its ends trimmed off."""
    indices = _own_ops(facts, start, period)
    here = compact_signature(facts, indices)
    after = compact_signature(facts, _own_ops(facts, start + period, period))
    if here[0] != after[0]:
        return None
    mine = set(indices)
    computed = [k for k, v in enumerate(after[1]) if v in facts.position
                and facts.position[v][0] in mine]
    if len(computed) != 1:
        return None
    (stream,) = computed
    x, out = here[1][stream], after[1][stream]
    while len(indices) > 1 and facts.ops[indices[0]].name in VIEWS \
            and list(facts.operands[indices[0]]) == [x]:
        x = facts.ops[indices[0]].results[0]
        indices = indices[1:]
    while len(indices) > 1 and facts.position[out][0] == indices[-1] \
            and facts.ops[indices[-1]].name in VIEWS:
        out = facts.operands[indices[-1]][0]
        indices = indices[:-1]
    if out not in facts.position or facts.position[out][0] not in indices:
        return None
    indices = cone(facts, out, set(indices))
    signature, inputs = compact_signature(facts, indices)
    if x not in inputs:
        return None
    return LayerRegion(facts, indices, inputs, inputs.index(x), out, signature)


def cone(facts: OpFacts, out, among: set[int], constants: bool = False) -> list[int]:
    """The ops of `among` that `out` depends on through ops of `among` (in block order): the
    layer's forward function alone, without what it computes for others (jax's residuals
    for the backward differ between the first layer and the rest). `constants`: constants
    (ops without operands) it reads count as of `among`."""
    found: set[int] = set()
    stack = [facts.position[out][0]]
    while stack:
        i = stack.pop()
        if i in found:
            continue
        found.add(i)
        for v in facts.operands[i]:
            where = facts.position.get(v)
            if where is not None and (where[0] in among or constants and
                                      is_constant(facts, where[0])):
                stack.append(where[0])
    return sorted(found)


def is_constant(facts: OpFacts, i: int) -> bool:
    """Op i of `facts` reads nothing and is no prelude op (a constant, an iota)."""
    return not facts.operands[i] and i not in facts.prelude


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
    groups: list[list[int]] = field(default_factory=list)
    """The sharded layer's collective groups (device ids, in position order)."""
    reference_key: tuple = ()
    sharded_key: tuple = ()
    """`region_key` of each program's layer: what a layer must match to be abstracted."""
    reference_term: Term | None = None
    reference_holes: list[Term] = field(default_factory=list)
    """`R(holes)`: the reference layer's stream output on the reference's holes (the stream
    whole), equal to the concatenation of `term` on its row blocks."""
    linear: int | None = None
    """The slot `term` is linear in (a backward layer's incoming cotangent): a device's
    input there may be k times a block (`device_stream`); None: no such slot."""
    summed: bool = False
    """`reference_term` is the sum of `term` over the stream's row blocks (a weight
    gradient's: `gradient_templates.py`; reshaped to its shape where a device's gradient
    keeps unit dims the reference's drops), not their concatenation."""
    output_cut: tuple[int, int] | None = None
    """Of a summed template: (dim, count) where a device's output is its group position's
    block of `term` along dim; None: all of it."""

    def group_of(self, d: int) -> list[int] | None:
        """Device d's collective group (None: in none)."""
        return next((g for g in self.groups if d in g), None)


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


def reference_layer(program: Program, region: LayerRegion, shared: dict | None = None
                    ) -> tuple[list[Term], Term]:
    """The reference layer walked once on holes: (the holes by slot, its stream output).
    `shared`: the hole of each input value already given one (several layers over the same
    inputs, so their common parts are the same terms), updated."""
    walker = Walker(program.ref_func, program.ref_module, program.ref_file)
    walker.progress = _Quiet()
    holes = []
    for value in region.inputs:
        t = describe_type(value.type)
        hole = _shared_hole(shared, value, tuple(t.shape), t.dtype)
        holes.append(hole)
        walker.walk.values[value] = Rel(hole, ((),) * len(t.shape), scope=GLOBAL)
    for op in region.ops():
        walker._op(op, RuleContext())
    out = walker.walk.values[region.stream_out]
    if type(out) is not Rel:
        raise NotExpanded("the reference layer's stream output has no term")
    return holes, out.term


def _shared_hole(shared: dict | None, value, shape: tuple[int, ...], dtype: str) -> Term:
    """The hole `shared` already gave `value`, else a fresh one (given it there)."""
    hole = None if shared is None else shared.get(value)
    if hole is None:
        hole = fresh_hole(shape, dtype)
        if shared is not None:
            shared[value] = hole
    return hole


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
                  stream_slots: tuple[int, ...], groups: list[list[int]] | None = None,
                  shared: dict | None = None
                  ) -> tuple[dict[int, Term], list, Term, list[Term], list[list[int]]]:
    """The sharded layer expanded on every device on inputs made from `holes` (the
    reference's, by slot): (the block hole of each stream slot, the tiling by slot, device
    0's output, every device's, the collective groups). `groups`: the groups its weights
    are cut over where its own ops hold no grouped collective (a weight gradient's, local
    to a device: its layer's groups); else they must be its collectives'. `shared`: the
    block hole of each stream input value already given one, updated."""
    moving = next((op.name for op in region.ops() if op.name in MOVING), None)
    if moving is not None:
        raise NotExpanded(f"the sharded layer moves data between devices ({moving})")
    expansion = Expansion(program.sharded_func, program.sharded_module, program.sharded_file)
    mesh = _manual_mesh(program, expansion)
    n = mesh.num_devices
    own = _groups(region, mesh)
    if groups is not None and own is not None and own != groups:
        raise NotExpanded("the layer's collectives use other groups than its weights' cut")
    groups = own if groups is None else groups
    position = {d: (p, len(g)) for g in groups or [] for p, d in enumerate(g)}
    env: dict = {}
    tiling: list = []
    block_holes: dict[int, Term] = {}
    for k, (value, hole) in enumerate(zip(region.inputs, holes)):
        t = describe_type(value.type)
        local = tuple(t.shape)
        cut = _tiling(hole.shape, local)
        if cut is False or t.dtype != hole.dtype:
            raise NotExpanded(f"input {k} of the sharded layer ({local}) is no block of the "
                              f"reference's ({hole.shape})")
        if k in stream_slots:
            block_holes[k] = _shared_hole(shared, value, local, t.dtype)
            tiling.append("stream")
            env[value] = [Local(t.dtype, local, term=block_holes[k])] * n
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
    return block_holes, tiling, outs[0], outs, groups or []


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
    groups: list[list[int]]
    reference_holes: list[Term]


def template_equality(program: Program, reference: LayerRegion,
                      sharded: LayerRegion) -> TemplateEquality:
    """The terms of the template equality of `reference` and `sharded` (NotExpanded where the
    sharded layer's inputs are no blocks of the reference's)."""
    streams = reference.stream_slots()
    if len(reference.inputs) != len(sharded.inputs) or streams != sharded.stream_slots():
        raise NotExpanded("the layers read different input lists")
    holes, want = reference_layer(program, reference)
    block_holes, tiling, term, outs, groups = sharded_layer(program, sharded, holes, streams)
    cuts = {_tiling(holes[k].shape, block_holes[k].shape) or (0, 1) for k in streams}
    if len(cuts) != 1:
        raise NotExpanded("the stream slots are cut into different row blocks")
    ((dim, blocks),) = cuts
    size = block_holes[streams[0]].shape[dim]
    pieces = [substitute(term, {block_holes[k].serial: slice_term(holes[k], dim, b * size,
                                                                   (b + 1) * size)
                                for k in streams})
              for b in range(blocks)]
    got = make_concat(pieces, dim) if blocks > 1 else pieces[0]
    sharded_holes = [block_holes.get(k, h) for k, h in enumerate(holes)]
    return TemplateEquality(want, got, term, outs, sharded_holes, tiling, blocks, groups,
                            holes)


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
    return TemplateProof(LayerTemplate(
        eq.term, eq.holes, eq.tiling, reference.signature, sharded.signature, eq.blocks,
        decision.how, eq.groups, region_key(reference), region_key(sharded), eq.want,
        eq.reference_holes))


def prove_layer_template(program: Program, timeout_ms: int = 5_000) -> TemplateProof:
    """The first pair (reference layer, sharded layer) of `program`'s repeated layers whose
    template equality is proven, or why none is (each pair tried, in `tried`). The
    reference's layers are tried at every phase of its runs whose inputs fit the sharded
    layer's slot by slot (the two programs may cut their layers at other ops: jax's
    residuals move the reference's boundary)."""
    references = repeated_layers(program.ref_func, phases=True)
    if not references:
        return TemplateProof(None, "the reference repeats no layer")
    tried: list[str] = []
    for func in functions(program.sharded_module):
        for sharded in repeated_layers(func):
            for reference in references:
                if not _slots_fit(reference, sharded):
                    continue
                proof = prove_template(program, reference, sharded, timeout_ms)
                if proof.proven:
                    proof.tried = tried
                    return proof
                tried.append(proof.reason)
    return TemplateProof(None, tried[0] if tried else "no repeated layer of the two programs "
                         "reads its inputs alike", tried)


def _slots_fit(reference: LayerRegion, sharded: LayerRegion) -> bool:
    """Whether each input of the sharded layer is, slot by slot, the reference's or a block
    of it along one dim, of the same element type, with the stream in the same slot."""
    if len(reference.inputs) != len(sharded.inputs) \
            or reference.stream_slots() != sharded.stream_slots() \
            or reference.roles != sharded.roles:
        return False
    for r, s in zip(reference.inputs, sharded.inputs):
        rt, st = describe_type(r.type), describe_type(s.type)
        if rt.dtype != st.dtype or _tiling(tuple(rt.shape), tuple(st.shape)) is False:
            return False
    return True


# ----- using a proven template: the stream output of every layer of its signature ----------

def compact_signature(facts: OpFacts, indices: list[int]) -> tuple[tuple, list]:
    """(signature, external inputs in first-use order) of the ops `indices` of `facts` (a
    layer's own ops; weight slices may sit anywhere around them): each op's fingerprint with
    its operands' wiring, ("in", k, type) for the k-th external input (a value none of these
    ops made) and (op number among them, result) for the others. Equal signatures: the same
    function of the input lists."""
    number = {i: k for k, i in enumerate(indices)}
    inputs: dict = {}
    out = []
    for i in indices:
        wiring = []
        for v in facts.operands[i]:
            where = facts.position.get(v)
            if where is not None and where[0] in number:
                wiring.append((number[where[0]], where[1]))
            else:
                k = inputs.setdefault(v, len(inputs))
                wiring.append(("in", k, str(v.type)))
        out.append((facts.fingerprints[i], tuple(wiring)))
    return tuple(out), list(inputs)


def _window(facts: OpFacts, start: int, count: int) -> list[int] | None:
    """The first `count` ops from `start` on that are no prelude op, or None."""
    indices = []
    i = start
    while len(indices) < count and i < len(facts.ops):
        if i not in facts.prelude:
            indices.append(i)
        i += 1
    return indices if len(indices) == count else None


@dataclass
class LayerSite:
    """A layer whose compact signature is a proven template's: its external inputs (in the
    template's slot order) and the value holding its stream output."""

    inputs: list
    out: object


def all_blocks(op) -> list:
    """Every block of `op`'s regions, nested ones included, outermost first."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            found.append(block)
            for inner in block.operations:
                found.extend(all_blocks(inner.operation))
    return found


def region_key(region: LayerRegion) -> tuple[tuple, int, int]:
    """(signature, op number of the stream output among the layer's ops, its result
    number): what another layer must match to be the template's."""
    op, result = region.facts.position[region.stream_out]
    return region.signature, region.indices.index(op), result


def sites_of(func, keys: list[tuple[tuple, int, int]]) -> dict:
    """{output value: (k, LayerSite)} for every value of `func`'s blocks computed by the ops
    of template `keys[k]` from some inputs (`match`), the inputs in the template's slot order
    (a value two templates compute is the first's); each block read once for all of them."""
    wanted: dict[int, list[int]] = {}
    for k, (signature, out_op, _) in enumerate(keys):
        wanted.setdefault(signature[out_op][0], []).append(k)
    sites: dict = {}
    for block in all_blocks(func):
        facts = read_ops(block)
        for i, fingerprint in enumerate(facts.fingerprints):
            for k in wanted.get(fingerprint, ()):
                signature, out_op, out_result = keys[k]
                if out_result >= len(facts.ops[i].results):
                    continue
                inputs = match(facts, i, signature, out_op)
                if inputs is not None:
                    value = facts.ops[i].results[out_result]
                    sites.setdefault(value, (k, LayerSite(inputs, value)))
    return sites


def match(facts: OpFacts, at: int, signature: tuple, out_op: int) -> list | None:
    """The template's inputs (by slot) when op `at` of `facts` is the template's op `out_op`
    computed by the template's ops, wired as in `signature` (`compact_signature`), from
    them: each template op's operand is matched to the candidate op's, back from `at` (a
    template op reads only ops before it). None where an op, a wiring or an input's type
    differs, or an op of the template is not reached."""
    found = matched(facts, at, signature, out_op)
    return None if found is None else found[0]


def matched(facts: OpFacts, at: int, signature: tuple, out_op: int
            ) -> tuple[list, dict[int, int]] | None:
    """`match`'s inputs and the op of `facts` each template op was matched to."""
    ops: dict[int, int] = {out_op: at}
    inputs: dict[int, object] = {}
    for j in range(out_op, -1, -1):
        i = ops.get(j)
        if i is None:
            return None
        fingerprint, wiring = signature[j]
        operands = facts.operands[i]
        if facts.fingerprints[i] != fingerprint or len(operands) != len(wiring):
            return None
        for v, wire in zip(operands, wiring):
            if wire[0] == "in":
                _, k, type_text = wire
                if inputs.setdefault(k, v) != v or str(v.type) != type_text:
                    return None
                continue
            jj, r = wire
            where = facts.position.get(v)
            if where is None or where[1] != r or ops.setdefault(jj, where[0]) != where[0]:
                return None
    if len(ops) != len(signature) or sorted(inputs) != list(range(len(inputs))):
        return None
    return [inputs[k] for k in range(len(inputs))], ops


class Applications:
    """The template's applications to actual inputs, each named by one fresh leaf (a cut
    point): `R(inputs)` for a reference layer's inputs, shared by every layer (of either
    program) whose inputs have the same normal forms (`memo`). A decision proven with such
    leaves holds for every value of them, so also for the value `R(inputs)` they stand for;
    nothing is refuted with them (the tier decides again without the template where a
    decision is not proven)."""

    def __init__(self, template: LayerTemplate, memo: dict[int, Term] | None = None):
        self.template = template
        self.memo: dict[int, Term] = {} if memo is None else memo
        self.leaves: dict[tuple[int, ...], Term] = {}
        self.groups: dict[tuple[int, ...], Term | None] = {}
        """Serials of a group's blocks of one weight -> their concatenation, where each
        member's block is its position's block of it (`device_stream`), else None."""
        self.scales: dict[Fraction, bool] = {}
        """Scale k -> whether `T(.., k * c, ..) == k * T(.., c, ..)` is proven for the
        template's `linear` slot (`linear_at`)."""

    def whole(self, inputs: list[Term]) -> Term | None:
        """The leaf naming `R(inputs)` (the reference layer on these inputs, by slot); None
        where an input's shape or type is not the template's."""
        if not self._fits(inputs):
            return None
        return self._leaf(inputs, self.template.reference_term)

    def reference_value(self, inputs: list[Term]) -> Term | None:
        """A reference layer's output on these inputs: the leaf naming `R(inputs)`, or for a
        summed template the sum over the stream's row blocks of the leaves naming the
        template on each block (`block_leaf`)."""
        template = self.template
        if not template.summed:
            return self.whole(inputs)
        if not self._fits(inputs):
            return None
        leaves = [self.block_leaf(block_inputs(template, inputs, b))
                  for b in range(template.blocks)]
        term = template.term
        total = make_lin([(Fraction(1), leaf) for leaf in leaves], Fraction(0), term.shape,
                         term.dtype)
        return make_reshape(total, template.reference_term.shape)

    def block_leaf(self, inputs: list[Term]) -> Term:
        """The leaf naming a summed template's `term` on these inputs (a row block's, by
        slot; the weights whole)."""
        return self._leaf(inputs, self.template.term)

    def _fits(self, inputs: list[Term]) -> bool:
        """Whether every input has its reference hole's shape and type."""
        return all(t.shape == h.shape and t.dtype == h.dtype
                   for t, h in zip(inputs, self.template.reference_holes))

    def _leaf(self, inputs: list[Term], like: Term) -> Term:
        """The one leaf (of `like`'s shape and type) for these inputs' normal forms."""
        key = tuple(normal_form(t, self.memo).serial for t in inputs)
        leaf = self.leaves.get(key)
        if leaf is None:
            leaf = self.leaves[key] = fresh_hole(like.shape, like.dtype)
        return leaf

    def linear_at(self, k: Fraction) -> bool:
        """Whether the sharded layer scales its output by k when its `linear` slot's input is
        scaled by k (a layer's backward is linear in its incoming cotangent), decided once
        per k on the holes (exact; normal form, then Z3)."""
        found = self.scales.get(k)
        if found is None:
            template = self.template
            hole = template.holes[template.linear]
            scaled = substitute(template.term, {hole.serial: scale(hole, k)})
            found = self.scales[k] = Decider([template.term], 5_000).decide(
                scale(template.term, k), scaled, "template.linear", ground=False).proved
        return found


def block_inputs(template: LayerTemplate, inputs: list[Term], b: int) -> list[Term]:
    """`inputs` (a reference layer's, by slot) with each stream slot cut to its row block b."""
    streams = template.tiling.index("stream")
    dim, _ = _tiling(template.reference_holes[streams].shape, template.holes[streams].shape) \
        or (0, 1)
    out = []
    for k, (t, cut) in enumerate(zip(inputs, template.tiling)):
        size = template.holes[k].shape[dim]
        out.append(slice_term(t, dim, b * size, (b + 1) * size) if cut == "stream" else t)
    return out


def stream_blocks(template: LayerTemplate, wholes: list[Term], memo: dict[int, Term]
                  ) -> dict[int, tuple[Term, int, Fraction]]:
    """{serial of t: (X, b, k)} where the normal form of row block b of X is k * t (k the
    content of its coefficients, `factor_content`), for each stream whole X (the reference
    layers' stream inputs), so a device's stream input is read as a (scaled) block of a
    whole (`memo`: the normal form's)."""
    streams = [k for k, cut in enumerate(template.tiling) if cut == "stream"]
    block = template.holes[streams[0]]
    found: dict[int, tuple[Term, int, Fraction]] = {}
    for whole in wholes:
        cut = _tiling(whole.shape, block.shape)
        if not cut or cut[1] != template.blocks:
            continue
        dim, _ = cut
        size = block.shape[dim]
        for b in range(template.blocks):
            block_term = slice_term(whole, dim, b * size, (b + 1) * size)
            k, t = factor_content(normal_form(block_term, memo))
            if isinstance(k, Fraction):
                found.setdefault(t.serial, (whole, b, k))
    return found


def device_stream(apps: Applications, inputs: list[list[Term]], d: int,
                  blocks: dict[int, tuple[Term, int, Fraction]]) -> Term | None:
    """Device `d`'s output of a sharded layer from every device's input terms (by slot, then
    device): where each of d's stream inputs is row block b (one b for all) of a stream
    whole X (`blocks`), block b of the leaf naming `R` applied to the wholes and the weights
    (the template equality: R(X) is the concatenation of T on X's blocks, and d computes T
    on block b), the weights being, for each one cut over the collective group, the
    concatenation of the group's blocks in position order, where each member's block is its
    position's block of that concatenation (the same normal form) and every member's stream
    inputs and uncut weights are d's (what the template was proven for: every device read
    the same holes there); else None (d keeps its expanded term). The template's `linear`
    slot may hold k times a block: the output is then k times the block, where `T` is proven
    linear at k (`Applications.linear_at`). A summed template's output (a weight gradient:
    `gradient_templates.py`) is d's group position's block of the leaf naming `T` on the
    inputs' row blocks b (`Applications.block_leaf`)."""
    template, memo = apps.template, apps.memo
    group = template.group_of(d)
    args = []
    for k, cut in enumerate(template.tiling):
        own = inputs[k][d]
        if cut in ("stream", None):
            if group is not None and any(inputs[k][m] is not own for m in group):
                return None
            args.append(own)
        else:
            if group is None:
                return None
            whole = _group_whole(apps, [inputs[k][m] for m in group], cut)
            if whole is None:
                return None
            args.append(whole)
    if any(a.shape != h.shape or a.dtype != h.dtype for a, h in zip(args, template.holes)):
        return None
    if any(cut == "stream" and more_nodes_than(args[k], STREAM_NODES)
           for k, cut in enumerate(template.tiling)):
        return None
    wholes: dict[int, Term] = {}
    position, factor = None, Fraction(1)
    for k, cut in enumerate(template.tiling):
        if cut != "stream":
            continue
        own, t = factor_content(normal_form(args[k], memo))
        found = blocks.get(t.serial)
        if found is None or not isinstance(own, Fraction):
            return None
        whole, b, theirs = found
        if position not in (None, b):
            return None
        position, wholes[k] = b, whole
        if own != theirs:
            if k != template.linear or factor != 1:
                return None
            factor = own / theirs
    if factor != 1 and not apps.linear_at(factor):
        return None
    if template.summed:
        whole_inputs = [wholes.get(k, a) for k, a in enumerate(args)]
        leaf = apps.block_leaf(block_inputs(template, whole_inputs, position))
        if template.output_cut is not None:
            if group is None:
                return None
            dim, count = template.output_cut
            leaf = device_block(leaf, dim, group.index(d), template.term.shape[dim] // count)
        return leaf if factor == 1 else scale(leaf, factor)
    out = apps.whole([wholes.get(k, a) for k, a in enumerate(args)])
    if out is None:
        return None
    x = args[template.tiling.index("stream")]
    dim, _ = _tiling(wholes[template.tiling.index("stream")].shape, x.shape)
    size = x.shape[dim]
    piece = slice_term(out, dim, position * size, (position + 1) * size)
    return piece if factor == 1 else scale(piece, factor)


def device_streams(apps: Applications, inputs: list[list[Term]], count: int,
                   blocks: dict[int, tuple[Term, int, Fraction]]) -> list[Term | None]:
    """`device_stream` of devices 0 .. count-1. Two devices of one collective group (or
    of none) whose own inputs of the slots not cut over the group are the same terms get
    the same output (a function of those, of the group's blocks and of nothing else), so it
    is computed once for them (the tp members of a Megatron layer)."""
    found: dict[tuple, Term | None] = {}
    out = []
    for d in range(count):
        key = stream_key(apps.template, d, [values[d] for values in inputs])
        if key not in found:
            found[key] = device_stream(apps, inputs, d, blocks)
        out.append(found[key])
    return out


def stream_key(template: LayerTemplate, d: int, own: list[Term | None]) -> tuple:
    """What device d's `device_stream` is a function of: its collective group (by its first
    member), its position there where its output is a block of the template's
    (`LayerTemplate.output_cut`), and its own terms (`own`, by slot) of the slots not cut
    over the group."""
    group = template.group_of(d)
    return (None if group is None else group[0],
            group.index(d) if group is not None and template.output_cut is not None else None,
            *(getattr(own[k], "serial", None) for k, cut in enumerate(template.tiling)
              if cut in ("stream", None)))


def more_nodes_than(term: Term, count: int) -> bool:
    """Whether `term` has more than `count` distinct subterms (counted up to count + 1)."""
    seen: set[int] = set()
    stack = [term]
    while stack:
        t = stack.pop()
        if t.serial in seen:
            continue
        seen.add(t.serial)
        if len(seen) > count:
            return True
        stack.extend(a for a in t.args if isinstance(a, Term))
    return False


def _group_whole(apps: Applications, members: list[Term], cut: tuple[int, int]
                 ) -> Term | None:
    """The concatenation of a collective group's blocks of one weight (in position order)
    where each member's block is its position's block of it (the same normal form), else
    None; memoized by the members' terms (every clock step reads the same weights)."""
    key = tuple(m.serial for m in members)
    if key in apps.groups:
        return apps.groups[key]
    dim, count = cut
    whole = make_concat(members, dim)
    size = members[0].shape[dim]
    if len(members) != count or any(
            normal_form(device_block(whole, dim, p, size), apps.memo)
            is not normal_form(m, apps.memo) for p, m in enumerate(members)):
        whole = None
    apps.groups[key] = whole
    return whole


def _sites(func, apps: list[Applications], sharded: bool) -> dict:
    """{output value: (Applications, LayerSite)} for every template's sites in `func`."""
    keys = [app.template.sharded_key if sharded else app.template.reference_key
            for app in apps]
    return {value: (apps[k], site) for value, (k, site) in sites_of(func, keys).items()}


class TemplateWalker(Walker):
    """The reference's walk, each layer of a template's signature giving its output as the
    leaf naming the template applied to its inputs (`Applications.whole`) in place of the
    term its ops built (the ops are walked as usual: their rule instances and the other
    results stay)."""

    def __init__(self, program: Program, apps: list[Applications]):
        super().__init__(program.ref_func, program.ref_module, program.ref_file)
        self.apps = apps
        self.sites = _sites(program.ref_func, apps, sharded=False)
        self.by_template = [0] * len(apps)
        self.wholes: list[Term] = []
        """The stream inputs of the layers abstracted (what a device's stream input may be a
        row block of)."""

    def _op(self, op, ctx: RuleContext) -> None:
        super()._op(op, ctx)
        for result in op.results:
            found = self.sites.get(result)
            if found is None:
                continue
            app, site = found
            values = [self.walk.values.get(v) for v in site.inputs]
            out = self.walk.values[result]
            if type(out) is not Rel or any(type(v) is not Rel or v.partial for v in values):
                continue
            terms = [v.term for v in values]
            term = app.reference_value(terms)
            if term is not None and term.shape == out.term.shape:
                self.wholes.extend(terms[k] for k, cut in enumerate(app.template.tiling)
                                   if cut == "stream")
                self.walk.values[result] = replace(out, term=term)
                self.by_template[self.apps.index(app)] += 1


KEEP_RENAMING = True
"""Whether the templates' leaves are given to the symmetric axes' renaming
(`TemplateExpansion._permute_leaves`), so devices along the data axes stay renamed after a
templated layer instead of computed."""


class TemplateExpansion(Expansion):
    """The sharded function's expansion, each layer of a template's signature giving every
    device whose inputs are what the template was proven for its output as a row block of a
    reference layer's leaf (`device_stream`); other devices keep the expanded term.

    The leaves are given to the symmetric axes' renaming (`symmetry.py`) as arguments are
    (`KEEP_RENAMING`, `Symmetry.permute_rows`): sigma along the data axes rotates a leaf's
    row blocks within each micro-batch, so "block b of V renamed is block b' of V" is a
    fact of substitution, and a device's block of a leaf is its representative's renamed.
    That needs nothing of what V names: the renaming is exact for any substitution that is
    a group action (coherence is checked op by op, by identity of terms, and every device's
    template output is still computed by `device_stream` with its own checks); the
    substitution chosen only makes the devices along dp coherent again after a templated
    layer, so they are renamed instead of computed (session 12 left them computed: a leaf
    the renaming kept whole made no device along dp coherent)."""

    def __init__(self, program: Program, apps: list[Applications], wholes: list[Term], *args,
                 **kwargs):
        super().__init__(program.sharded_func, program.sharded_module, program.sharded_file,
                         *args, **kwargs)
        self.apps = apps
        self.blocks = {id(app): stream_blocks(app.template, wholes, app.memo) for app in apps}
        self.sites = _sites(program.sharded_func, apps, sharded=True)
        self.by_template = [0] * len(apps)
        self._permuted: tuple[object, dict] = (None, {})
        self.lazy = LAZY

    def _device_op(self, op, env: dict, mesh: Mesh) -> None:
        if KEEP_RENAMING and self.symmetry is not None:
            self._permute_leaves()
        super()._device_op(op, env, mesh)
        for result in op.results:
            found = self.sites.get(result)
            if found is None:
                continue
            app, site = found
            locals_ = [env.get(v) for v in site.inputs]
            if any(values is None for values in locals_):
                continue
            if self.lazy:
                env[result] = SiteStreams(self, app, locals_, env[result], self.symmetry,
                                          mesh.num_devices).results()
                continue
            if any(local.term is None for values in locals_ for local in values):
                continue
            inputs = [[local.term for local in values] for values in locals_]
            outs = env[result]
            new = list(outs)
            streams = device_streams(app, inputs, mesh.num_devices, self.blocks[id(app)])
            for d, term in enumerate(streams):
                if term is not None and term.shape == outs[d].shape:
                    new[d] = Local(term.dtype, term.shape, term=term)
            if any(a is not b for a, b in zip(new, outs)):
                env[result] = new
                self.by_template[self.apps.index(app)] += 1

    def _permute_leaves(self, sym=None) -> None:
        """Give the symmetry (`sym`, else the current one) every template leaf not yet given
        (`Symmetry.permute_rows`): its rows in the stream's row blocks, each micro-batch's
        split over the symmetric axes that are not the templates' collective groups' (the
        data axes)."""
        sym = sym or self.symmetry
        owner, given = self._permuted
        if owner is not sym:
            given = {id(app): (_data_axes(app.template, sym), 0) for app in self.apps}
            self._permuted = (sym, given)
        for app in self.apps:
            if app.template.summed:
                continue
            (dim, axes), done = given[id(app)]
            leaves = list(app.leaves.values())
            if axes and len(leaves) > done:
                for leaf in leaves[done:]:
                    sym.permute_rows(leaf, dim, app.template.blocks, axes)
            given[id(app)] = ((dim, axes), len(leaves))


class _Terms:
    """One slot's values on every device, read as terms by device (`device_stream`)."""

    def __init__(self, values: list[Local]):
        self.values = values

    def __getitem__(self, d: int) -> Term | None:
        return self.values[d].term


class SiteStreams(LaterOp):
    """A site's output on each device computed where read (`Expansion.lazy`): the
    template's (`device_stream`) where it applies, else the op's own result there (`outs`),
    so a device whose output is the template's never computes the layer's inner ops, and
    one whose output nothing reads (a masked bubble step) computes nothing."""

    def __init__(self, expansion: TemplateExpansion, app: Applications,
                 inputs: list[list[Local]], outs: list[Local], sym, n: int):
        super().__init__()
        self.expansion = expansion
        self.app = app
        self.inputs = inputs
        self.outs = outs
        self.sym = sym
        self.groups = [app.template.group_of(d) for d in range(n)]
        self.found: dict[tuple, Term | None] = {}
        self.counted = False
        self.by_device = [Later(self, d).locals_([(o.dtype, tuple(o.shape))])
                          for d, o in enumerate(outs)]

    def results(self) -> list[Local]:
        return [values[0] for values in self.by_device]

    def reads(self, d: int) -> list[Local]:
        members = self.groups[d] or [d]
        return [values[m] for values in self.inputs for m in {d, *members}]

    def compute(self, d: int) -> list[Local]:
        group = self.groups[d]
        key = stream_key(self.app.template, d, [values[d].term for values in self.inputs])
        if key not in self.found:
            term = None
            if all(self.inputs[k][m].term is not None for k in range(len(self.inputs))
                   for m in {d, *(group or [])}):
                expansion = self.expansion
                term = device_stream(self.app, [_Terms(v) for v in self.inputs], d,
                                     expansion.blocks[id(self.app)])
                if KEEP_RENAMING and self.sym is not None:
                    expansion._permute_leaves(self.sym)
            self.found[key] = term
        term = self.found[key]
        own = self.outs[d]
        if term is None or term.shape != own.shape or term.dtype != own.dtype:
            return [own]
        if not self.counted:
            self.counted = True
            self.expansion.by_template[self.expansion.apps.index(self.app)] += 1
        return [Local(term.dtype, term.shape, term=term)]


def _data_axes(template: LayerTemplate, sym) -> tuple[int, tuple[str, ...]]:
    """(the dim of a template leaf cut into the stream's row blocks, the symmetric axes that
    are not the template's collective groups' axes: those its rows are split over)."""
    mesh = sym.mesh
    grouped = {a for g in template.groups for m in g for a in mesh.names
               if mesh.coords(m)[a] != mesh.coords(g[0])[a]}
    stream = template.tiling.index("stream")
    dim, _ = _tiling(template.reference_holes[stream].shape,
                     template.holes[stream].shape) or (0, 1)
    return dim, tuple(a for a in sym.axes if a not in grouped)
