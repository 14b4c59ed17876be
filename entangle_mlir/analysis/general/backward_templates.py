"""One layer's backward proven once for the general tier (issue 21: the pipeline rows).

The forward layer template (`layer_templates.py`) names each layer's stream output by a
leaf, so the forward terms stay linear in depth; the backward's cotangent stream did not:
each layer's outgoing cotangent was a term over every layer above. This module finds a
layer's backward and proves it once, the same way:

* *Where a layer's backward is.* In a block holding forward sites of the proven forward
  template (`layer_templates.matched`), each site's primal values are its stream input and
  what is computed from it and the weights alone (the site's output excluded: the next layer
  reads it): jax's residuals, a vjp's recomputation. Every other op reading a site's primal
  values, or ops already so placed, belongs to the backward of the lowest such site (a
  layer's backward reads the cotangent the layer above made, and its own residuals): its
  *chunk*. A chunk's outgoing cotangent is the one value of its stream input's type (up to
  views at the end) read outside it; the backward layer is that value's cone of ops
  within the chunk, the site's primal ops and constants: its inputs must be the site's
  stream input x, some of its weights w and one incoming cotangent c of x's type.
* *The template equality*, proven once on holes by `layer_templates.prove_template` with two
  row-blocked slots (x and c): `B(x, w, c) == concat_b B_b(slice_b x, w, slice_b c)`, `B`
  the reference's backward layer (the whole batch), `B_b` the sharded one (its tp psum of
  the cotangent included) on row block b, its weights the blocks of the reference's by its
  collective group. The weight gradients and their micro-batch accumulation and dp psum are
  not in the template: they read the cotangent, which is now a leaf's block, so they stay
  small, and their sums are what the normal form already handles.
* *Linearity in c*: the last stage seeds its cotangent with its micro-batch's loss gradient,
  k times the reference's block of the whole batch's (k = the micro-batches: a micro-batch's
  mean against the batch's, the 1/k applied to the summed gradients). A device whose c is k
  times a block gets k times the leaf's block, where `B_b(x, w, k c) == k B_b(x, w, c)` is
  decided on the holes for that k (`Applications.linear_at`).

Using it is `layer_templates`' machinery (`Applications`, `TemplateWalker`,
`TemplateExpansion`): each backward site's outgoing cotangent becomes a fresh leaf naming
`B(X, W, C)` (one leaf per distinct normal forms of the inputs), a device's its row block.

Soundness. A decision proven with the leaves free holds for every value of them, so for the
values they name. It is a decision about the programs only where each leaf stands for one
value wherever it occurs: the leaf for the same normal forms of (X, W, C) is the same leaf
(`Applications.whole`'s key), and equal normal forms are equal values; different inputs get
different leaves, which the decision treats as unrelated (it may fail to prove, never prove
wrongly). Each leaf occurrence is justified by (1) the match (the same ops, attributes,
types and wiring from the matched inputs compute `B` or `B_b`), (2) the template equality
and the linearity, decided for every hole value, and (3) the device checks of
`device_stream` (its x and c the same row block b of wholes X and C, by normal form; its
weights its group position's blocks; every member of its group reading the same x and c).
Where anything is not so, the value keeps its expanded term. The try through the
templates only answers "proven": where it is not, the tier decides again with every layer
expanded (`tier.general_tier`), so no verdict or diagnostic of a program not proven comes
from the abstraction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from entangle_mlir.analysis.general.layer_templates import (
    VIEWS,
    LayerRegion,
    LayerTemplate,
    TemplateProof,
    _slots_fit,
    all_blocks_below,
    compact_signature,
    cone,
    matched,
    prove_template,
)
from entangle_mlir.analysis.layer_reuse import OpFacts, read_ops
from entangle_mlir.mlir.program import Program, functions

HAND_OFFS = (*VIEWS, "stablehlo.collective_permute")
"""Single-operand ops that only hand a layer's outgoing cotangent on (jax's reshape back to
the stream's shape, the pipeline's shift to the previous stage): trimmed off a backward
layer's end."""


def forward_sites(facts: OpFacts, key: tuple) -> list[tuple[list, int]]:
    """(inputs by slot, op index of the output) of every forward site in `facts`, in block
    order."""
    signature, out_op, _ = key
    last = signature[out_op][0]
    found = []
    for i, fingerprint in enumerate(facts.fingerprints):
        if fingerprint != last:
            continue
        hit = matched(facts, i, signature, out_op)
        if hit is not None:
            found.append((hit[0], i))
    return found


def chunks(facts: OpFacts, sites: list[tuple[list, int]], stream: int
           ) -> tuple[dict, dict[int, int], set[int]]:
    """(the site each primal value belongs to, the site each backward op belongs to, the ops
    computing from weights and constants alone). A value is primal of site s when computed
    from s's stream input, weights and constants alone (s's output excluded). An op that is
    not primal belongs to the backward of: the site whose primal values it reads (the lowest
    of several); else, where it reads weights, the last site before it reading them (a
    weight several sites read, a forward and a vjp's recomputation: the backward follows
    the recomputation); else the site of the latest backward op whose results it reads (a
    layer's backward adds its part to the cotangent the layer above made before it)."""
    primal: dict = {}
    weights: dict = {}
    """weight or value computed from weights alone -> the sites reading its weights."""
    free_ops: set[int] = set()
    outputs = {out for _, out in sites}
    for s, (inputs, _) in enumerate(sites):
        for k, v in enumerate(inputs):
            if k == stream:
                primal.setdefault(v, s)
            else:
                weights.setdefault(v, set()).add(s)
    chunk_of_value: dict = {}
    chunk_of_op: dict[int, int] = {}
    for i, op in enumerate(facts.ops):
        if i in outputs:
            continue
        operands = facts.operands[i]
        if i in facts.prelude or all(v in weights for v in operands):
            readers = set().union(*(weights[v] for v in operands if v in weights))
            for r in op.results:
                weights.setdefault(r, set()).update(readers)
            if i not in facts.prelude:
                free_ops.add(i)
            continue
        owners = {primal[v] for v in operands if v in primal}
        below = any(v in chunk_of_value for v in operands)
        other = any(v not in primal and v not in chunk_of_value and v not in weights
                    for v in operands)
        if len(owners) == 1 and not below and not other:
            for r in op.results:
                primal.setdefault(r, next(iter(owners)))
            continue
        read = set().union(*(weights[v] for v in operands if v in weights))
        earlier = [s for s in read if sites[s][1] < i]
        if owners:
            chunk_of_op[i] = min(owners)
        elif earlier:
            chunk_of_op[i] = max(earlier)
        elif below:
            latest = max((facts.position[v][0], chunk_of_value[v]) for v in operands
                         if v in chunk_of_value)
            chunk_of_op[i] = latest[1]
        else:
            continue
        for r in op.results:
            if r not in primal:
                chunk_of_value[r] = chunk_of_op[i]
    return primal, chunk_of_op, free_ops


@dataclass
class Chunk:
    """One forward site's backward chunk in a block (`chunks`): its ops (`mine`), the ops
    computing the site's primal values (its stream input's aside), the block's ops computing
    from weights and constants alone, and each value's readers."""

    facts: OpFacts
    sites: list
    site: int
    mine: set[int]
    primal_ops: set[int]
    free_ops: set[int]
    readers: dict

    @property
    def allowed(self) -> AnyOf:
        """The ops a backward layer's cone may hold (the block's free ops are many: not
        copied per chunk)."""
        return AnyOf(self.mine, self.primal_ops, self.free_ops)


class AnyOf:
    """Membership in any of several sets, none of them copied."""

    def __init__(self, *sets: set[int]):
        self.sets = sets

    def __contains__(self, item: int) -> bool:
        return any(item in s for s in self.sets)


def block_chunks(func, key: tuple, stream: int) -> list[list[Chunk]]:
    """The backward chunks of each of `func`'s blocks holding at least two forward sites of
    the template `key`, in site order."""
    found = []
    for block in [func.regions[0].blocks[0], *all_blocks_below(func)]:
        facts = read_ops(block)
        sites = forward_sites(facts, key)
        if len(sites) < 2:
            continue
        primal, chunk_of_op, free_ops = chunks(facts, sites, stream)
        readers: dict = {}
        for i, operands in enumerate(facts.operands):
            for v in operands:
                readers.setdefault(v, set()).add(i)
        members: dict[int, set[int]] = {}
        for i, c in chunk_of_op.items():
            members.setdefault(c, set()).add(i)
        primal_ops: dict[int, set[int]] = {}
        for v, owner in primal.items():
            if v in facts.position and v != sites[owner][0][stream]:
                primal_ops.setdefault(owner, set()).add(facts.position[v][0])
        found.append([Chunk(facts, sites, s, members[s], primal_ops.get(s, set()), free_ops,
                            readers) for s in sorted(members)])
    return found


def middle_first(items: list) -> list:
    """`items` from the middle one on, then the ones before it (a block's middle layer is
    the likeliest to be like the others: no stage boundary next to it)."""
    middle = len(items) // 2
    return items[middle:] + items[:middle]


def backward_regions(func, key: tuple, stream: int) -> list[LayerRegion]:
    """The backward layers of `func`'s blocks (the module docstring), the middle chunk of each
    block first."""
    found = []
    for chunks_ in block_chunks(func, key, stream):
        regions = [r for r in (_region(c, stream) for c in chunks_) if r is not None]
        found.extend(middle_first(regions))
    return found


def _region(chunk: Chunk, stream: int) -> LayerRegion | None:
    """The chunk's backward layer: the cone of its outgoing cotangent (None where there is
    not exactly one, or the cone reads anything but x, weights and one cotangent)."""
    facts, mine, readers = chunk.facts, chunk.mine, chunk.readers
    inputs, _ = chunk.sites[chunk.site]
    x = inputs[stream]
    x_type = str(x.type)
    outs = set()
    for i in mine:
        for r in facts.ops[i].results:
            if str(r.type) != x_type or not (readers.get(r, set()) - mine
                                              or facts.last_use.get(r, -1) >= len(facts.ops)):
                continue
            outs.add(_trimmed(facts, r, mine))
    if len(outs) != 1:
        return None
    (out,) = outs
    return chunk_region(chunk, out, stream)


def chunk_region(chunk: Chunk, out, stream: int) -> LayerRegion | None:
    """The region computing `out` in `chunk`: its cone there (the chunk's ops, the site's
    primal ops, constants), where that reads the site's stream input x, some of its weights
    and one more value of x's type (the incoming cotangent) and nothing else; else None."""
    facts = chunk.facts
    inputs, _ = chunk.sites[chunk.site]
    x = inputs[stream]
    x_type = str(x.type)
    indices = cone(facts, out, chunk.allowed, constants=True)
    signature, region_inputs = compact_signature(facts, indices)
    if x not in region_inputs:
        return None
    weights = set(inputs) - {x}
    others = [k for k, v in enumerate(region_inputs) if v != x and v not in weights]
    if len(others) != 1 or str(region_inputs[others[0]].type) != x_type:
        return None
    slots = tuple(sorted((region_inputs.index(x), others[0])))
    roles = tuple("cotangent" if k == others[0] else inputs.index(v)
                  for k, v in enumerate(region_inputs))
    return LayerRegion(facts, indices, region_inputs, region_inputs.index(x), out, signature,
                       slots, roles)


def _trimmed(facts: OpFacts, value, mine: set[int]):
    """`value` with the chunk's hand-offs at its end taken off (`HAND_OFFS`)."""
    while True:
        i = facts.position[value][0]
        operands = facts.operands[i]
        if facts.ops[i].name not in HAND_OFFS or len(operands) != 1:
            return value
        source = operands[0]
        where = facts.position.get(source)
        if where is None or where[0] not in mine:
            return value
        value = source


def prove_backward_template(program: Program, forward: LayerTemplate,
                            timeout_ms: int = 5_000) -> TemplateProof:
    """The first pair (reference backward layer, sharded backward layer) whose template
    equality is proven (`layer_templates.prove_template`), linear in its cotangent slot, or
    why none is."""
    stream = forward.tiling.index("stream")
    references = backward_regions(program.ref_func, forward.reference_key, stream)
    if not references:
        return TemplateProof(None, "no backward layer found in the reference")
    tried: list[str] = []
    for func in functions(program.sharded_module):
        for sharded in backward_regions(func, forward.sharded_key, stream):
            for reference in references:
                if not _slots_fit(reference, sharded):
                    continue
                proof = prove_template(program, reference, sharded, timeout_ms)
                if proof.proven:
                    cotangent = next(k for k in reference.stream_slots() if k != reference.stream)
                    return TemplateProof(replace(proof.template, linear=cotangent), tried=tried)
                tried.append(proof.reason)
    return TemplateProof(None, tried[0] if tried else "no backward layers of the two programs "
                         "read their inputs alike", tried)
