"""The instance on fresh leaves: each input term is replaced by a leaf (splat and iota
constants are kept, a poly broadcast keeps its broadcast), the rule is re-run on the leaves, and
the real outputs must be the abstract outputs with the real terms substituted back. Proving the
abstract instance (for all values of the leaves) then proves the real one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entangle_mlir.analysis.instance.common import ABSTRACT_BASE, rels_of
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.normal_form import update_slice
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
    Windowed,
    is_padded,
    padded_rel,
)
from entangle_mlir.core.terms import (
    ARITHMETIC_TERM_OPS,
    Term,
    make_arg,
    make_broadcast,
    make_roll,
    rebuild,
    roll_parts,
    subterms,
    term_finite,
)
from entangle_mlir.core.traits import ELEMENTWISE_OPS
from entangle_mlir.mlir.opinfo import OpInfo
from entangle_mlir.rules import RULES
from entangle_mlir.rules.base import ReferenceTerms, RuleContext
from entangle_mlir.rules.common import device_offsets
from entangle_mlir.rules.dispatch import TRANSPARENT
from entangle_mlir.rules.kinds.reordered import with_orders
from entangle_mlir.rules.kinds.window import completed_sums


def _rule_for(name: str):
    if name in TRANSPARENT:
        return _identity
    rule = RULES.get(name)
    return None if rule is None else with_orders(rule)


def _identity(info: OpInfo, ins: list[Value], ctx: RuleContext) -> list[Value]:
    """The walk's reading of an op that passes its operands through (`TRANSPARENT`: a copy
    XLA inserts around a shard_map body); the instance check still proves that the op's
    semantics is that identity, on leaves and at a reduced shape like any rule's."""
    return list(ins)


def _placed_update(info: OpInfo, ins: list[Value], ctx: RuleContext) -> list[Value]:
    """A dynamic_update_slice at constant starts outside a manual computation, stated as the
    general tier states it (`expand._placed_instance`): the operand's rows before and after
    the update concatenated around it, dim by dim, as plain slice and concatenate nodes
    (`update_slice(joined=False)`), the starts clamped as the op clamps them."""
    operand, update, *starts = ins
    values = [device_offsets(s, 1) for s in starts]
    if not ctx.is_global or not isinstance(operand, Rel) or not isinstance(update, Rel) or (
            any(v is None for v in values)) or len(values) != len(operand.term.shape):
        return [Opaque("an update at constant starts outside a manual computation only")]
    clamped = [min(max(v[0], 0), n - k)
               for v, n, k in zip(values, operand.term.shape, update.term.shape)]
    return [replace(operand, term=update_slice(operand.term, update.term, clamped,
                                               joined=False))]


STATED = "stated"
"""The abstraction strategy of an instance whose claim is its op's `STATED_FORMS` entry."""

STATED_FORMS = {"stablehlo.dynamic_update_slice": _placed_update}
"""Ops whose instances the general tier states in another exact form than their rule's
output, by op name: the form's builder, run on the leaves (and at a reduced shape) as a rule
is. A claim so stated is proved like a rule's: Z3 proves the form on leaves, and the real
claim must be the form with the real terms substituted."""


def run_rule(info: OpInfo, ins: list[Value], mesh: Mesh | None, ctx: RuleContext,
             claimed: Sequence[Value] = (), strategy: str = "") -> list[Value] | None:
    """The rule's outputs on `ins` (with `strategy` `STATED`: the op's stated form's);
    `claimed` (the outputs the walk claims, possibly at another shape) steer a rule that
    chooses between equally valid global views of a value (`_layout_hint`)."""
    rule = STATED_FORMS.get(info.name) if strategy == STATED else _rule_for(info.name)
    if rule is None:
        return None
    reference = _layout_hint(info, claimed, mesh, ctx) if claimed else None
    try:
        outs = list(rule(info, ins, RuleContext(mesh=mesh, manual_axes=ctx.manual_axes,
                                                reference=reference)))
    except Exception:  # noqa: BLE001 - a crashing rule just disables the abstraction
        return None
    claims = list(claimed) + [None] * (len(outs) - len(claimed))
    return [as_padded_rel(v) if isinstance(c, Rel) else v for v, c in zip(outs, claims)]


def as_padded_rel(value: Value) -> Value:
    """A zero-padded window as the padded relation it stands for; any other value as is."""
    if not isinstance(value, Windowed):
        return value
    return padded_rel(value) if is_padded(value) else value


def _layout_hint(info: OpInfo, claimed: Sequence[Value], mesh: Mesh | None,
                 ctx: RuleContext) -> ReferenceTerms | None:
    """The global shapes the claimed outputs' layouts give `info`'s local results, as the
    shapes of a (term-less) reference.

    A reshape of a split dim among unit dims has several valid global views (local 1x384 on
    8 devices: 8x384 or 1x3072); the walk picks one by consulting the reference's terms,
    which an instance check on fresh leaves does not have, so without a hint the rule picks
    another view and the instance cannot be abstracted or reduced. The hint only steers which
    claim the rule makes: the claim is still proved by Z3 for all leaf values, and the real
    output must still be an instance of it with the same layout, so a wrong hint can only
    make the check fail, never prove a false claim."""
    shapes = set()
    for value, result in zip(claimed, info.result_types):
        if not isinstance(value, Rel) or len(value.tiling) != len(result.shape):
            continue
        if ctx.is_global or mesh is None:
            shapes.add(tuple(result.shape))
            continue
        shapes.add(tuple(n * mesh.group_size(axes) if axes else n
                         for n, axes in zip(result.shape, value.tiling)))
    if not shapes:
        return None
    hint = ReferenceTerms()
    hint.shapes = frozenset(shapes)
    return hint


def same_layout(a: Value, b: Value) -> bool:
    """Same kind of value with the same layout, shape and dtype; the terms may differ (a
    device scalar: the same table)."""
    if isinstance(a, Rel) and isinstance(b, Rel):
        return (a.tiling, a.partial, a.kind, a.poly, a.scope, a.term.shape, a.term.dtype) == (
            b.tiling, b.partial, b.kind, b.poly, b.scope, b.term.shape, b.term.dtype)
    if isinstance(a, DeviceScalar) and isinstance(b, DeviceScalar):
        return a == b
    if isinstance(a, Permuted) and isinstance(b, Permuted):
        return a.sources == b.sources and same_layout(a.rel, b.rel)
    if isinstance(a, Reordered) and isinstance(b, Reordered):
        return (a.dim, a.orders) == (b.dim, b.orders) and same_layout(a.rel, b.rel)
    if isinstance(a, Returning) and isinstance(b, Returning):
        return (a.dim, a.blocks, a.sources) == (b.dim, b.blocks, b.sources) and (
            a.pieces is b.pieces) and same_layout(a.rel, b.rel)
    if isinstance(a, Windowed) and isinstance(b, Windowed):
        return (a.dim, a.offset, a.length, a.summed, a.starts) == (
            b.dim, b.offset, b.length, b.summed, b.starts) and same_layout(
            a.rel, b.rel)
    if isinstance(a, Shifted) and isinstance(b, Shifted):
        return a.offsets == b.offsets and same_layout(a.rel, b.rel)
    if isinstance(a, InBlock) and isinstance(b, InBlock):
        return replace(a, rel=None) == replace(b, rel=None) and same_layout(a.rel, b.rel)
    if isinstance(a, BlockIndex) and isinstance(b, BlockIndex):
        return replace(a, rel=None) == replace(b, rel=None) and same_layout(a.rel, b.rel)
    if isinstance(a, Masked) and isinstance(b, Masked):
        return a.zero == b.zero and same_layout(a.pred, b.pred) and same_layout(a.rel, b.rel)
    return isinstance(a, Opaque) and isinstance(b, Opaque)


SKELETON_LIMIT = 64
"""The most structural nodes kept above the leaves by the "skeleton" abstraction."""


class _Abstractor:
    """Replaces input terms by fresh leaves, numbered in order of first appearance; a leaf
    is finite where the term it replaces is shown finite (`terms.make_arg`), so that the rule
    keeps a zero multiple on the leaf where it keeps it on the term.

    Strategy "leaf": each input term (except splat/iota constants) becomes one leaf, a poly
    broadcast keeps its broadcast over a leaf. Strategy "skeleton": poly inputs keep the
    elementwise/linear structure above their broadcasts (what widening a poly dim needs),
    cut into leaves below it.
    """

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.leaf_of: dict[int, Term] = {}
        self.original: dict[int, Term] = {}

    def leaf(self, term: Term) -> Term:
        found = self.leaf_of.get(term.serial)
        if found is None:
            found = make_arg(ABSTRACT_BASE + len(self.leaf_of), term.shape, term.dtype,
                             finite=term_finite(term))
            self.leaf_of[term.serial] = found
            self.original[found.serial] = term
        return found

    def abstract(self, rel: Rel) -> Rel | None:
        term = rel.term
        if term.op in ("splat", "iota"):
            return rel
        if term.op == "broadcast" and rel.poly:
            (dims,) = term.attrs
            return replace(rel, term=make_broadcast(self.leaf(term.args[0]), dims, term.shape))
        rolled = next(((d, parts) for d in range(len(term.shape))
                       if (parts := roll_parts(term, d)) is not None), None)
        if rolled is not None and not rel.poly:
            dim, (base, shift) = rolled
            return replace(rel, term=make_roll(self.leaf(base), dim, shift))
        if self.strategy == "skeleton" and rel.poly:
            cuts: dict[int, Term] = {}
            if not self._cut(term, cuts, [0]):
                return None
            return replace(rel, term=substitute(term, cuts))
        return replace(rel, term=self.leaf(term))

    def abstract_index(self, rel: Rel) -> Rel:
        """An index or mask operand: its data movement kept over a leaf, so that the rule
        still recognises the same index in differently moved operands."""
        base = rel.term
        while base.op in ("broadcast", "reshape", "transpose"):
            base = base.args[0]
        if base.op in ("splat", "iota"):
            return rel
        return replace(rel, term=substitute(rel.term, {base.serial: self.leaf(base)}))

    def _cut(self, term: Term, cuts: dict[int, Term], count: list[int]) -> bool:
        """Choose the leaves under the structural top of a poly term (False: too big)."""
        if term.serial in cuts or term.op in ("splat", "iota"):
            return True
        count[0] += 1
        if count[0] > SKELETON_LIMIT:
            return False
        if term.op == "broadcast":
            operand = term.args[0]
            if operand.op not in ("splat", "iota"):
                cuts[operand.serial] = self.leaf(operand)
            return True
        structural = term.op in ARITHMETIC_TERM_OPS or (
            term.op in ELEMENTWISE_OPS and all(a.shape == term.shape for a in term.args))
        if not structural:
            cuts[term.serial] = self.leaf(term)
            return True
        return all(self._cut(a, cuts, count) for a in term.args)


ABSTRACTION_STRATEGIES = ("leaf", "skeleton")


def abstract_instance(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value],
                      mesh: Mesh | None, ctx: RuleContext
                      ) -> tuple[list[Value], list[Value]] | None:
    """(abstract inputs, abstract outputs) when the rule's output is generic in its inputs.

    The rule is re-run on fresh leaves; the abstraction is valid when substituting the real
    input terms back into the abstract outputs gives exactly the real outputs. Proving the
    abstract instance then proves the real one (it holds for all values of the leaves).
    Strategies are tried in order (see `_Abstractor`).
    """
    return abstract_with_strategy(info, ins, outs, mesh, ctx)[0]


def abstract_with_strategy(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value],
                           mesh: Mesh | None, ctx: RuleContext
                       ) -> tuple[tuple[list[Value], list[Value]] | None, str]:
    """`abstract_instance` and the name of the strategy that found it ("" if none did); an
    op with a stated form (`STATED_FORMS`) is last tried on leaves with that form."""
    for strategy in ABSTRACTION_STRATEGIES:
        if strategy == "skeleton" and not any(isinstance(v, Rel) and v.poly for v in ins):
            break
        found = _try_abstraction(info, ins, outs, mesh, ctx, _Abstractor(strategy))
        if found is not None:
            return found, strategy
    if info.name in STATED_FORMS:
        found = _try_abstraction(info, ins, outs, mesh, ctx, _Abstractor("leaf"), STATED)
        if found is not None:
            return found, STATED
    return None, ""


def _try_abstraction(info: OpInfo, ins: Sequence[Value], outs: Sequence[Value],
                     mesh: Mesh | None, ctx: RuleContext, abstractor: _Abstractor,
                     form: str = "") -> tuple[list[Value], list[Value]] | None:
    if abstractor.strategy == "leaf" and any(isinstance(v, Reordered) for v in ins) and any(
            isinstance(v, Rel) and v.poly and v.term.op != "broadcast" for v in ins):
        return None  # a leaf would lose the constancy along the poly dim the order rule reads
    abstract_ins: list[Value] = []
    for v in ins:
        if isinstance(v, Masked):
            a = abstractor.abstract(v.rel)
            if a is None:
                return None
            abstract_ins.append(replace(v, rel=a, pred=replace(
                v.pred, rel=abstractor.abstract_index(v.pred.rel))))
        elif isinstance(v, InBlock | BlockIndex | Shifted):
            abstract_ins.append(replace(v, rel=abstractor.abstract_index(v.rel)))
        elif isinstance(v, Rel | Permuted | Windowed | Reordered | Returning):
            a = abstractor.abstract(v if isinstance(v, Rel) else v.rel)
            if a is None:
                return None
            abstract_ins.append(a if isinstance(v, Rel) else replace(v, rel=a))
        else:
            abstract_ins.append(v)
    abstract_outs = run_rule(info, abstract_ins, mesh, ctx, outs, form)
    if abstract_outs is None or len(abstract_outs) != len(outs):
        return None
    if not outputs_are_instances(abstract_outs, outs, dict(abstractor.original)):
        return None
    return abstract_ins, abstract_outs


def outputs_are_instances(abstract_outs: Sequence[Value], outs: Sequence[Value],
                          mapping: dict[int, Term]) -> bool:
    """Each real output has the abstract output's layout and its term is the abstract term
    with the leaves replaced per `mapping` (leaf serial -> real input term): literally
    (`_literal_instance`) or after rebuilding with the canonicalizing constructors."""
    memo: dict[int, Term] = {}
    for a, o in zip(abstract_outs, outs):
        if not same_layout(a, o):
            return False
        for a_rel, o_rel in zip(rels_of(a), rels_of(o)):
            if _literal_instance(a_rel.term, o_rel.term, mapping):
                continue
            try:
                rebuilt = substitute(a_rel.term, mapping, memo)
            except Exception:  # noqa: BLE001 - an unexpected term shape disables the abstraction
                return False
            if rebuilt is not o_rel.term and not _completed_sum(rebuilt, o_rel.term):
                return False
    return True


def _completed_sum(rebuilt: Term, real: Term) -> bool:
    """`real` is the sums in `rebuilt` in the form `rules.window.sum_out` gives them (the sum of a
    micro-batch's rows completed over the block, pushed through the movement, constant
    factors and batch dims of the tensor summed: canonical forms, tests/test_lemmas.py)."""
    forms = completed_sums(rebuilt) + completed_sums(rebuilt, frozenset(
        t.serial for t in subterms([real])))
    return any(form is real for form in forms)


def _literal_instance(abstract: Term, real: Term, mapping: dict[int, Term]) -> bool:
    """`real` is `abstract` with each leaf replaced by its `mapping` term, node for node.

    Sound without trusting any constructor: a term's value is a function of its node and its
    arguments' values, so the abstract instance's proof (for all leaf values) covers it."""
    leaf = mapping.get(abstract.serial)
    if leaf is not None:
        return leaf is real
    if abstract is real:
        return True
    if (abstract.op != real.op or abstract.attrs != real.attrs or abstract.shape != real.shape
            or abstract.dtype != real.dtype or len(abstract.args) != len(real.args)
            or not abstract.args):
        return False
    return all(_literal_instance(a, r, mapping) for a, r in zip(abstract.args, real.args))


def substitute(term: Term, mapping: dict[int, Term], memo: dict[int, Term] | None = None
               ) -> Term:
    """Rebuild `term` with the canonicalizing constructors, leaves replaced per `mapping`
    (term serial -> term)."""
    memo = {} if memo is None else memo
    if term.serial in mapping:
        return mapping[term.serial]
    if term.serial in memo:
        return memo[term.serial]
    if not term.args:
        return term
    args = tuple(substitute(a, mapping, memo) for a in term.args)
    out = rebuild(term, args)
    memo[term.serial] = out
    return out
