"""One layer's weight gradients proven once for the general tier (issue 21: the pipeline rows).

With the forward and backward templates (`layer_templates.py`, `backward_templates.py`) a
layer's stream output and outgoing cotangent are leaves; its weight gradients were not: each
was a term of the layer's recomputed forward and backward on the device's row block, summed
over micro-batches and the data axes, and every decision normalized those sums layer by
layer (a third of the 70B attention row's time). This module names them by leaves too:

* *Where a weight gradient is.* In a layer's backward chunk (`backward_templates.chunks`),
  a weight gradient is a value computed from the layer's stream input x, its weights and
  one incoming cotangent c of x's type alone (its cone within the chunk, the site's primal
  ops, the block's weight-only ops and constants) that an op reading more reads (the
  accumulation over micro-batches, the bubble mask), its hand-offs trimmed
  (`chunk_gradients`). Reference and sharded gradients are paired by proof: each
  reference gradient with the first sharded one of a fitting shape whose equality holds.
* *The template equality*, proven once on holes for each gradient:
  `G(X, W, C) == sum_b F(slice_b X, W, slice_b C)`, `G` the reference's gradient on the
  whole batch, `F(x, W, c)` the sharded one on a row block combined over the layer's
  collective group: the concatenation of the members' outputs in position order along the
  dim the device's gradient is cut along (a tp-cut weight's), or the output every member
  computes alike (a replicated weight's). So the reference's gradient is a sum of leaves,
  one per row block, each naming F on that block; a device's is its group position's
  block of its own row block's leaf.
* *Linearity in c*, as for the backward: a device whose c is k times a block gets k times
  its block of the leaf, where `F(x, W, k c) == k F(x, W, c)` is decided on the holes.

Soundness is the backward template's (its module docstring): the leaf for the same normal
forms of (slice_b X, W, slice_b C) is the same leaf, wherever it occurs; the template
equality and the linearity hold for every hole value; a device's value is its block of the
leaf only where `layer_templates.device_stream`'s checks hold (its x and c the same row
block b of wholes X and C, its weights its group position's blocks, every member of its
group reading the same x, c and uncut weights). Templates are functions, not wirings: a
stage returning gate's gradient for up and up's for gate keeps both templates, and the
decisions, which see which accumulator each leaf is added to, do not prove it. The try
through the templates only answers "proven".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from entangle_mlir.analysis.general.backward_templates import (
    Chunk,
    block_chunks,
    chunk_region,
    middle_first,
)
from entangle_mlir.analysis.general.decide import Decider
from entangle_mlir.analysis.general.layer_templates import (
    LayerRegion,
    LayerTemplate,
    TemplateProof,
    _slots_fit,
    _tiling,
    is_constant,
    reference_layer,
    region_key,
    sharded_layer,
)
from entangle_mlir.analysis.general.values import NotExpanded
from entangle_mlir.analysis.instance.abstraction import substitute
from entangle_mlir.core.normal_form import make_concat, slice_term
from entangle_mlir.core.terms import Term, make_lin, make_reshape
from entangle_mlir.mlir.program import Program, functions

GRADIENT_HAND_OFFS = ("stablehlo.pad", "stablehlo.reshape", "stablehlo.all_reduce")
"""Ops that only hand a layer's weight gradient on: into the stacked parameters' gradient
(jax's transpose of a layer's parameter slice: a reshape, then a pad to the stack), and
summed over the data axes (jax's psum of a gradient of parameters replicated there, one
operand per result): trimmed off a gradient's end, with the broadcasts and reductions that
only add or drop unit dims (`RESHAPING`), so that every layer's gradient has one signature
and the template is one row block's gradient (the sum over the data axes' blocks is the
decisions', over leaves). Trimming only chooses where a gradient's template applies: the
ops trimmed off are expanded as any other."""

RESHAPING = ("stablehlo.broadcast_in_dim", "stablehlo.reduce")
"""Trimmed off a gradient's end where their result has as many elements as their operand."""


def first_gradients(func, key: tuple, stream: int) -> list[LayerRegion]:
    """The weight gradients (`chunk_gradients`) of the first backward chunk of `func`'s
    blocks that has any, each block's middle chunk first (the one likeliest to be like the
    others: no stage boundary next to it)."""
    for chunks in block_chunks(func, key, stream):
        for chunk in middle_first(chunks):
            found = chunk_gradients(chunk, stream)
            if found:
                return found
    return []


def chunk_gradients(chunk: Chunk, stream: int) -> list[LayerRegion]:
    """The chunk's weight gradients: each value computed from the site's stream input x, its
    weights and one incoming cotangent alone (`chunk_region`) that some op reading more
    than those reads (a gradient's accumulation, the bubble mask), its hand-offs at the end
    trimmed (`GRADIENT_HAND_OFFS`); the outgoing cotangent (x's type) left out."""
    facts = chunk.facts
    inputs, _ = chunk.sites[chunk.site]
    x = inputs[stream]
    fits = _fitting_ops(chunk, stream)
    found = []
    for i in sorted(chunk.mine):
        if i not in fits:
            continue
        for r in facts.ops[i].results:
            readers = chunk.readers.get(r, set())
            if readers and all(j in fits for j in readers):
                continue
            out = _trimmed(chunk, r, fits)
            if str(out.type) == str(x.type):
                continue
            region = chunk_region(chunk, out, stream)
            if region is not None:
                found.append(region)
    return found


def _fitting_ops(chunk: Chunk, stream: int) -> set[int]:
    """The chunk's own and primal ops computing from x, the weights, constants, the block's
    free ops and one more value of x's type alone, reading that value (an upper bound of
    what `chunk_region` accepts: it checks each gradient's cone again)."""
    facts = chunk.facts
    inputs, _ = chunk.sites[chunk.site]
    x_type = str(inputs[stream].type)
    known = set(inputs)
    own = chunk.mine | chunk.primal_ops
    others: dict[int, frozenset | None] = {}
    for i in sorted(own):
        found: set = set()
        for v in facts.operands[i]:
            where = facts.position.get(v)
            if where is not None and where[0] in own:
                theirs = others.get(where[0])
                if theirs is None:
                    found = None
                    break
                found |= theirs
            elif where is not None and (where[0] in chunk.free_ops
                                        or is_constant(facts, where[0])):
                continue
            elif v not in known:
                found.add(v)
        others[i] = None if found is None or len(found) > 1 or any(
            str(v.type) != x_type for v in found) else frozenset(found)
    return {i for i, found in others.items() if found and i in chunk.mine}


def _trimmed(chunk: Chunk, value, fits: set[int]):
    """`value` with the hand-offs at its end taken off (`GRADIENT_HAND_OFFS`)."""
    facts = chunk.facts
    while True:
        i, result = facts.position[value]
        name = facts.ops[i].name
        source = facts.operands[i][result if name == "stablehlo.all_reduce" else 0]
        if name not in GRADIENT_HAND_OFFS and not (
                name in RESHAPING and _elements(source) == _elements(value)):
            return value
        where = facts.position.get(source)
        if where is None or where[0] not in fits:
            return value
        value = source


@dataclass
class SharedHoles:
    """What the gradients of one pair of chunks are proven on: one hole per input value of
    either program, one decider (its normal forms' memo), so the layer's recomputed forward
    and backward, which every gradient reads, are the same terms, normalized once."""

    decider: Decider = field(default_factory=lambda: Decider([]))
    reference: dict = field(default_factory=dict)
    sharded: dict = field(default_factory=dict)


def prove_gradient(program: Program, reference: LayerRegion, sharded: LayerRegion,
                   groups: list[list[int]], shared: SharedHoles | None = None
                   ) -> TemplateProof:
    """Whether the reference's weight gradient `reference` is the sum over the stream's row
    blocks of the sharded one `sharded` combined over its collective groups (`groups`: the
    forward layer's, where the gradient's own ops hold no grouped collective), for every
    value of their inputs (the module docstring). No valid-index assumption: holes are no
    program inputs."""
    shared = shared or SharedHoles()
    streams = reference.stream_slots()
    try:
        if len(reference.inputs) != len(sharded.inputs) or streams != sharded.stream_slots():
            raise NotExpanded("the gradients read different input lists")
        holes, want = reference_layer(program, reference, shared.reference)
        block_holes, tiling, _, outs, groups = sharded_layer(program, sharded, holes, streams,
                                                             groups, shared.sharded)
        cuts = {_tiling(holes[k].shape, block_holes[k].shape) or (0, 1) for k in streams}
        if len(cuts) != 1:
            raise NotExpanded("the stream slots are cut into different row blocks")
        ((dim, blocks),) = cuts
        if not _output_fits(want.shape, outs[0].shape):
            raise NotExpanded(f"a device's gradient ({outs[0].shape}) is no block of the "
                              f"reference's ({want.shape})")
        output_cut = _tiling(want.shape, outs[0].shape) or None
    except NotExpanded as err:
        return TemplateProof(None, err.reason)
    decider = shared.decider
    term = _combined(outs, output_cut, groups, decider)
    if term is None:
        return TemplateProof(None, "the devices' gradients are not one function's blocks")
    size = block_holes[streams[0]].shape[dim]
    pieces = [substitute(term, {block_holes[k].serial: slice_term(holes[k], dim, b * size,
                                                                   (b + 1) * size)
                                for k in streams})
              for b in range(blocks)]
    got = make_reshape(make_lin([(Fraction(1), p) for p in pieces], Fraction(0), term.shape,
                                term.dtype), want.shape)
    decision = decider.decide(want, got, "template.gradient", ground=False)
    if not decision.proved:
        return TemplateProof(None, "the sharded gradient summed over the row blocks is not "
                             f"shown to be the reference's: {decision.status} "
                             f"{decision.reason}".rstrip())
    cotangent = next(k for k in streams if k != reference.stream)
    return TemplateProof(LayerTemplate(
        term, [block_holes.get(k, h) for k, h in enumerate(holes)], tiling,
        reference.signature, sharded.signature, blocks, decision.how, groups,
        region_key(reference), region_key(sharded), want, holes, linear=cotangent,
        summed=True, output_cut=output_cut))


def _combined(outs: list[Term], output_cut, groups: list[list[int]], decider: Decider
              ) -> Term | None:
    """The function every device's gradient is its group position's block of: the one
    output of every device (`output_cut` None), or the concatenation of a group's outputs
    in position order along the cut dim, the same for every group; else None."""
    if output_cut is None:
        candidates = outs
    else:
        dim, count = output_cut
        if not groups or any(len(g) != count for g in groups) \
                or sorted(d for g in groups for d in g) != list(range(len(outs))):
            return None
        candidates = [make_concat([outs[d] for d in g], dim) for g in groups]
    first = candidates[0]
    for other in candidates[1:]:
        if other is not first and not decider.decide(first, other, "template.gradient.device",
                                                     ground=False).proved:
            return None
    return first


def prove_gradient_templates(program: Program, forward: LayerTemplate
                             ) -> list[LayerTemplate]:
    """A proven gradient template for each weight gradient of the reference's middle backward
    chunk that has one: each paired with the sharded chunks' gradients of a fitting type,
    in their order (`prove_gradient`)."""
    stream = forward.tiling.index("stream")
    references = first_gradients(program.ref_func, forward.reference_key, stream)
    candidates = [region for func in functions(program.sharded_module)
                  for region in first_gradients(func, forward.sharded_key, stream)]
    proven = []
    shared = SharedHoles()
    for reference in references:
        for sharded in candidates:
            if not _slots_fit(reference, sharded) or not _output_fits(
                    _shape(reference.stream_out), _shape(sharded.stream_out)):
                continue
            proof = prove_gradient(program, reference, sharded, forward.groups, shared)
            if proof.proven:
                proven.append(proof.template)
                candidates.remove(sharded)
                break
    return proven


def _output_fits(reference: tuple[int, ...], device: tuple[int, ...]) -> bool:
    """Whether a device's gradient of shape `device` may be a block of the reference's (cut
    along one dim) or all of it (the same elements, unit dims aside)."""
    return _tiling(reference, device) is not False or math.prod(reference) == math.prod(device)


def _shape(value) -> tuple[int, ...]:
    return tuple(value.type.shape)


def _elements(value) -> int:
    return math.prod(_shape(value))
