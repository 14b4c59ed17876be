"""Outputs against the reference: ρ when they match, the first diverging op when not.

A failing output is traced to one sharded op (the first opaque op, or the first op on the
output's slice whose term the reference never computes) and, where one exists, the reference
op it should correspond to; both are reported with their source locations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from jaxlib.mlir import ir

from entangle_mlir.analysis.infer import OpRecord, Walk
from entangle_mlir.analysis.valid_indices import ValidIndices, index_ranges
from entangle_mlir.core.diagnostics import Diagnostic
from entangle_mlir.core.mesh import Mesh, axes_str
from entangle_mlir.core.precision import readable_factor
from entangle_mlir.core.relations import GLOBAL, DeviceScalar, Opaque, Rel, layout_words
from entangle_mlir.core.report import NOT_PROVEN, PROVEN, OutputResult, Report
from entangle_mlir.core.rounding import ASSUMPTION as ROUNDING
from entangle_mlir.core.rounding import (
    constant_differences,
    describe_difference,
    describe_rounded,
    equal_up_to_rounding,
)
from entangle_mlir.core.terms import (
    Term,
    factor_content,
    is_zero_multiple,
    linear_parts,
    pretty,
    scale,
    single_scaled,
    structural_diff,
    subterms,
)
from entangle_mlir.mlir.program import result_names
from entangle_mlir.rules import RULES, RuleContext
from entangle_mlir.rules.elementwise import ELEMENTWISE_RULES
from entangle_mlir.rules.kinds.reordered import MIXED_ORDERS

_LEAF_OPS = ("splat", "dense", "iota", "arg", "loopvar")
# Collectives move or combine blocks of one global value: their result stands for their
# operand's term.
_TERM_PRESERVING = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
                    "stablehlo.all_to_all", "stablehlo.collective_permute")
_BOUNDARY_OPS = ("sdy.manual_computation", "func.func", "func.return")


class _Reference:
    """Every term the reference computes, and the first op computing it."""

    def __init__(self, walk: Walk):
        self.walk = walk
        self.by_term: dict[int, OpRecord] = {}
        self.terms: dict[int, Term] = {}
        self._scaled: dict[int, list[Term]] | None = None
        self._simplified: set[int] | None = None
        self._under_valid: dict[int, bool] = {}
        for value in walk.values.values():
            if isinstance(value, Rel):
                self.terms[value.term.serial] = value.term
        for record in walk.records:
            for value in record.outputs:
                if isinstance(value, Rel):
                    self.by_term.setdefault(value.term.serial, record)

    def has(self, term: Term) -> bool:
        return term.serial in self.terms

    def has_under_valid_indices(self, term: Term, valid: ValidIndices) -> bool:
        """Whether the reference computes `term` once the valid-index rewrites are applied to
        both (the vocab-parallel lookup's `select(id in this block, gather, 0)` summed over tp
        is the reference's gather for ids in range): a value the outputs' comparison would
        accept is no divergence. The reference's terms are rewritten on the first ask (a
        diagnostic's; one memo over the DAG)."""
        if not valid.ranges:
            return False
        if self._simplified is None:
            self._simplified = {valid.simplifier.simplify(t).serial
                                for t in self.terms.values()}
        known = self._under_valid.get(term.serial)
        if known is None:
            known = valid.simplifier.simplify(term).serial in self._simplified
            self._under_valid[term.serial] = known
        return known

    @property
    def scaled(self) -> dict[int, list[Term]]:
        """Reference terms by their content-free part (built on the first diagnostic that
        asks: a proven check never needs it, and a residual stream's content is O(depth))."""
        if self._scaled is None:
            self._scaled = {}
            for term in self.terms.values():
                self._scaled.setdefault(factor_content(term)[1].serial, []).append(term)
        return self._scaled

    def ratio(self, term: Term) -> tuple[object, Term] | None:
        """(r, t) when the reference computes t and term == r * t (scalars are pulled out of
        products, so a mis-scaled value differs from the reference's by its coefficient)."""
        found = self.ratios(term)
        return found[0] if found else None

    def ratios(self, term: Term) -> list[tuple[object, Term]]:
        """Every (r, t) of `ratio`: the reference may compute a value at several scales (a sum
        and its mean), the first one first."""
        k, base = factor_content(term)
        return [(k / factor_content(known)[0], known)
                for known in self.scaled.get(base.serial, ())]

    def counterpart(self, record: OpRecord) -> OpRecord | None:
        """The reference op a sharded op should correspond to, if one can be found (at worst
        the op computing one of its operands)."""
        found = self.value_counterpart(record)
        if found is not None:
            return found
        for value in record.inputs:
            if isinstance(value, Rel) and value.term.op not in _LEAF_OPS:
                found = self._lookup(value.term)
                if found:
                    return found
        return None

    def value_counterpart(self, record: OpRecord) -> OpRecord | None:
        """The reference op computing what the sharded op's result stands for: the same term
        (up to a constant factor), the op's result on whole operands, or another function of
        the same operands. None when only an operand has a counterpart."""
        for value in record.outputs:
            if isinstance(value, Rel):
                found = self._lookup(value.term)
                if found:
                    return found
        if record.info.name in _TERM_PRESERVING and record.inputs and isinstance(
                record.inputs[0], Rel):
            found = self._lookup(record.inputs[0].term)
            if found:
                return found
        hypothetical = _global_result(record)
        if hypothetical is not None:
            found = self._lookup(hypothetical)
            if found:
                return found
        return self._by_inputs(record)

    def _by_inputs(self, record: OpRecord) -> OpRecord | None:
        """A reference op applied to exactly the same operand terms (a different function of
        the same values: max where min was meant, ...)."""
        wanted = tuple(v.term.serial if isinstance(v, Rel) else None for v in record.inputs)
        if not wanted or None in wanted:
            return None
        for candidate in self.walk.records:
            got = tuple(v.term.serial if isinstance(v, Rel) else None for v in candidate.inputs)
            if got == wanted:
                return candidate
        return None

    def _lookup(self, term: Term) -> OpRecord | None:
        found = self.by_term.get(term.serial)
        if found is None:
            _, base = single_scaled(term)
            found = self.by_term.get(base.serial)
        if found is None:
            scaled = self.ratio(term)
            found = self.by_term.get(scaled[1].serial) if scaled is not None else None
        return found


def _global_result(record: OpRecord) -> Term | None:
    """The term the op would compute on whole (unsharded) operands."""
    rule = RULES.get(record.info.name)
    if rule is None or not all(isinstance(v, Rel) for v in record.inputs):
        return None
    inputs = [Rel(v.term, ((),) * len(v.term.shape), scope=GLOBAL) for v in record.inputs]
    try:
        results = rule(record.info, inputs, RuleContext())
    except Exception:  # noqa: BLE001 - only a hint for the diagnostic
        return None
    first = results[0] if results else None
    return first.term if isinstance(first, Rel) else None


@dataclass
class EvidenceFocus:
    """Where op-level evidence is taken for a diagnostic: the diverging sharded op's result,
    the reference op it should correspond to, and the relation the per-device values are
    reassembled with (the one the check expected there). `unavailable` says why no op-level
    run is possible (the evidence then falls back to the outputs)."""

    sharded: OpRecord | None = field(default=None, repr=False)
    result: int = 0
    reference: OpRecord | None = field(default=None, repr=False)
    ref_result: int = 0
    relation: Rel | None = field(default=None, repr=False)
    how: str = ""
    mesh: Mesh | None = None
    unavailable: str = ""
    modules: tuple = field(default=(), repr=False)
    outputs: tuple[int, ...] = ()
    """The program's results the diagnostic is about (a claim is confirmed on them)."""


_DROP_PARTIAL = ("missing_reduction", "nonlinear_partial", "partial_mixed", "wrong_axis")


def _focus(record: OpRecord | None, reference: _Reference | None, mesh: Mesh | None,
           category: str) -> EvidenceFocus:
    """The op-level evidence target of a diagnostic at `record`.

    The sharded value is reassembled with the relation the check inferred for it; where the
    mistake is a reduction that never happens (or happens over the wrong axes) the partial
    value is taken as each device holds it, which is what the program goes on to use. An op
    whose result has no relation gets the one its rule gives on operands without their
    partial sums (a nonlinear op on a partial sum: the layout it would have on full values).
    """
    focus = EvidenceFocus(sharded=record, mesh=mesh)
    if record is None or record.info.op is None:
        focus.unavailable = "the diagnostic names no sharded op"
        return focus
    twin = reference.value_counterpart(record) if reference is not None else None
    if twin is not None and not _computes_exactly(record, twin):
        twin = _same_source(record, reference) or twin
    if twin is None or twin.info.op is None:
        focus.unavailable = "the reference computes no value the diverging op's result stands for"
        return focus
    focus.reference = twin
    focus.ref_result = next((i for i, v in enumerate(twin.outputs) if isinstance(v, Rel)), 0)
    if mesh is None:
        focus.unavailable = "the sharded op is outside any shard_map body"
        return focus
    index, rel = next(((i, v) for i, v in enumerate(record.outputs) if isinstance(v, Rel)),
                      (0, None))
    if rel is None:
        rel = _expected_relation(record)
    if rel is not None and rel.is_global:
        focus.unavailable = "the op is outside the shard_map body"
        return focus
    if rel is None:
        focus.unavailable = ("the check found no relation the sharded value should have there, "
                             "so its per-device values cannot be reassembled")
        return focus
    focus.result = index
    if rel.partial and category in _DROP_PARTIAL:
        missing = f"no {rel.kind} over {axes_str(rel.partial)} happens"
        rel = replace(rel, partial=(), kind="")
        focus.how = (f"each device's own value ({missing})" if rel.is_replicated else
                     f"{layout_words(rel)}, each device's block as it is ({missing})")
    else:
        focus.how = layout_words(rel)
    focus.relation = rel
    return focus


def _computes_exactly(record: OpRecord, twin: OpRecord) -> bool:
    """Whether the reference op computes exactly the sharded op's term (not a multiple)."""
    ours = {v.term.serial for v in record.outputs if isinstance(v, Rel)}
    return any(isinstance(v, Rel) and v.term.serial in ours for v in twin.outputs)


def _same_source(record: OpRecord, reference: _Reference) -> OpRecord | None:
    """The reference op of the same kind at the same source position (an XLA-partitioned
    program shares the user's code with its reference): the op the sharded one really is, when
    the terms only match up to a factor (a rounded constant, say). Only when it is unique."""
    if record.loc is None:
        return None
    found = [candidate for candidate in reference.walk.records
             if candidate.info.name == record.info.name and candidate.loc == record.loc
             and candidate.info.op is not None]
    # A line run several times (a layer's helper) is ambiguous: no answer then.
    return found[0] if len(found) == 1 else None


def _expected_relation(record: OpRecord) -> Rel | None:
    """The relation the op's rule gives when its operands are complete (partial sums taken as
    full values): the layout the sharded result would have if the reduction had happened."""
    rule = RULES.get(record.info.name)
    if rule is None or not record.inputs or not all(isinstance(v, Rel) for v in record.inputs):
        return None
    inputs = [replace(v, partial=(), kind="") for v in record.inputs]
    if record.info.name == "stablehlo.all_reduce" and len(inputs) == 1:
        # A reduction over the wrong axes: the value it should have produced is its operand
        # reduced over the axes it was partial over.
        return inputs[0]
    try:
        results = rule(record.info, inputs, RuleContext())
    except Exception:  # noqa: BLE001 - only a hint for the evidence
        return None
    first = results[0] if results else None
    return first if isinstance(first, Rel) else None


ASSUMING = "proven assuming "
"""How a note states an assumption a proof used; each one is also in `Report.assumptions`."""


def compare(ref: Walk, sharded: Walk, diagnose: bool = True) -> Report:
    """The verdict for every output; diagnostics point at the first op that went wrong.
    `diagnose=False`: an output whose term differs gets a one-line diagnostic, without the
    search for the op where it went wrong (for a verdict whose diagnostics are discarded)."""
    outputs, diagnostics, foci = [], [], []
    rounded_for: list[int] = []
    rounded_pairs: list = []
    assumed_for: dict[str, list[int]] = {}
    valid_indices: ValidIndices | None = None
    reference = _Reference(ref)
    for i, (want, got) in enumerate(zip(ref.outputs, sharded.outputs)):
        rho = sharded.output_rho[i] if i < len(sharded.output_rho) else ""
        if isinstance(want, Opaque):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(_opaque_diagnostic(want, None, prefix="in the reference: "))
            foci.append(EvidenceFocus(unavailable="the reference itself is not analysed there"))
            continue
        if isinstance(got, Opaque):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(_opaque_diagnostic(got, reference))
            if MIXED_ORDERS in got.reason:
                foci.append(EvidenceFocus(unavailable="the value at the collective_permute "
                                          "holds other devices' blocks by design (a ring)"))
            else:
                foci.append(_focus(_primary(got), reference, sharded.mesh,
                                   diagnostics[-1].category))
            continue
        if not isinstance(got, Rel) or not isinstance(want, Rel):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(Diagnostic("error", f"result #{i} is not a tensor value",
                                          category="unrelated"))
            foci.append(EvidenceFocus(unavailable="the result is not a tensor value"))
            continue
        if got.term is want.term:
            outputs.append(OutputResult(i, True, rho, pretty(want.term, 3)))
            continue
        rounded = equal_up_to_rounding(want.term, got.term)
        if rounded is not None:
            outputs.append(OutputResult(i, True, rho, pretty(want.term, 3)))
            if rounded:
                rounded_for.append(i)
                rounded_pairs.extend(p for p in rounded if p not in rounded_pairs)
            continue
        if valid_indices is None:
            valid_indices = _valid_indices(ref)
        assumed = valid_indices.equal(want.term, got.term)
        if assumed is None:
            both = valid_indices.equal_up_to_rounding(want.term, got.term)
            if both is not None:
                assumed, rounded = both
                if rounded:
                    rounded_for.append(i)
                    rounded_pairs.extend(p for p in rounded if p not in rounded_pairs)
        if assumed is not None:
            outputs.append(OutputResult(i, True, rho, pretty(want.term, 3)))
            for assumption in assumed:
                assumed_for.setdefault(assumption, []).append(i)
            continue
        outputs.append(OutputResult(i, False, rho))
        if not diagnose:
            diagnostics.append(Diagnostic("error", f"result #{i} differs from the reference",
                                          category="different_function"))
            foci.append(EvidenceFocus(unavailable="not diagnosed"))
            continue
        diagnostic, culprit = _mismatch_diagnostic(i, want.term, got.term, sharded, reference,
                                                   valid_indices)
        diagnostics.append(diagnostic)
        foci.append(_focus(culprit, reference, sharded.mesh, diagnostic.category))
    diagnostics = _name_results(diagnostics, sharded)
    diagnostics = [_implicit_psum_note(d, sharded) for d in diagnostics]
    _label_outputs(outputs, sharded)
    assumption_notes = [f"{ASSUMING}{assumption} ({_results_words(indices)})"
                        for assumption, indices in assumed_for.items()]
    rounding_notes = [(f"proven assuming {ROUNDING} ({_results_words(rounded_for)}: "
                      f"{describe_rounded(rounded_pairs)})")] if rounded_for else []
    failing = [o.index for o in outputs if not o.proven]
    seen: dict[tuple[str, str], EvidenceFocus] = {}
    unique, unique_foci = [], []
    for diag, focus, index in zip(diagnostics, foci, failing):
        key = (diag.message, str(diag.loc))
        if key in seen:
            seen[key].outputs += (index,)
            continue
        focus.outputs = (index,)
        seen[key] = focus
        unique.append(diag)
        unique_foci.append(focus)
    verdict = PROVEN if all(o.proven for o in outputs) else NOT_PROVEN
    if len(ref.outputs) != len(sharded.outputs):
        verdict = NOT_PROVEN
    mesh = sharded.mesh.describe() if sharded.mesh else ""
    report = Report(verdict, outputs, unique,
                    list(dict.fromkeys(ref.notes + sharded.notes + rounding_notes
                                      + assumption_notes)), mesh=mesh)
    for note in report.notes:
        if note.startswith(ASSUMING):
            report.assume(note[len(ASSUMING):])
    report.explainer = lambda: _explain_all(sharded)
    report.focus = unique_foci[0] if unique_foci else None
    report.foci = seen
    if verdict != PROVEN:
        report.index_ranges = {r.arg.attrs[0]: r.size for r in index_ranges(
            [w.term for w in ref.outputs if isinstance(w, Rel)]).values()}
    return report


def _results_words(indices: list[int]) -> str:
    if len(indices) == 1:
        return f"result #{indices[0]}"
    if len(indices) <= 4:
        return "results " + ", ".join(f"#{i}" for i in indices)
    return f"{len(indices)} results, #{indices[0]} to #{indices[-1]}"


_PLAIN_RESULT = re.compile(r"result(\[\d+\])?$")


_ALREADY_REPLICATED = "but the value is already replicated over"


def _implicit_psum_note(diag: Diagnostic, sharded: Walk) -> Diagnostic:
    """A psum of a value already replicated, where jax's own psum made it so: under
    `shard_map(check_vma=True)` the gradient of an input replicated over an axis is summed over
    it by jax (`psum_invariant`, the transpose of the implicit `pvary`); the user's psum of that
    gradient sums it a second time. A note names jax's psum and where it is."""
    if _ALREADY_REPLICATED not in diag.message or diag.loc is None:
        return diag
    record = next((r for r in sharded.records if r.loc == diag.loc
                   and r.info.name == "stablehlo.all_reduce"), None)
    implicit = _implicit_psum_upstream(record) if record is not None else None
    if implicit is None:
        return diag
    note = Diagnostic("note", "the value was already summed by jax itself: under shard_map's "
                              "check_vma=True, the gradient of an input replicated over the "
                              "axis is psum'd by jax (psum_invariant, the transpose of the "
                              "implicit pvary), so this psum sums it again; drop it (the "
                              "gradient jax returns is already the total)", implicit.loc)
    return replace(diag, notes=(*diag.notes, note))


def _implicit_psum_upstream(record: OpRecord) -> OpRecord | None:
    """The nearest all_reduce above `record` that jax inserted for check_vma (its location's
    name says `psum_invariant`), if any."""
    seen: set[int] = set()
    stack = list(record.sources)
    while stack:
        op = stack.pop()
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        if (op.info.name == "stablehlo.all_reduce" and op.loc is not None
                and "psum_invariant" in op.loc.op_name):
            return op
        stack.extend(op.sources)
    return None


def _label_outputs(outputs: list[OutputResult], sharded: Walk) -> None:
    """Each output's pytree path (where jax named it) and declared PartitionSpec."""
    names = _result_names(sharded)
    for out in outputs:
        name = names[out.index] if out.index < len(names) else ""
        out.name = "" if _PLAIN_RESULT.match(name) else name
        if out.index < len(sharded.output_spec):
            out.partition_spec = sharded.output_spec[out.index]


def _name_results(diagnostics: list[Diagnostic], sharded: Walk) -> list[Diagnostic]:
    """A note naming the output a diagnostic is about by its pytree path, as jax records it
    (`jax.result_info = "result['grads']['attn_norm']"`), where the program returns a pytree:
    `result #1` alone does not tell a training engineer which gradient is unsynchronised."""
    names = _result_names(sharded)
    out = []
    for diag in diagnostics:
        index = _RESULT_INDEX.search(diag.message + " ".join(n.message for n in diag.notes))
        name = names[int(index.group(1))] if index and int(index.group(1)) < len(names) else ""
        if name and not _PLAIN_RESULT.match(name):
            note = Diagnostic("note", f"result #{index.group(1)} is {name}")
            diag = replace(diag, notes=(*diag.notes, note))
        out.append(diag)
    return out


_RESULT_INDEX = re.compile(r"result #(\d+)")


def _result_names(walk: Walk) -> list[str]:
    """The `jax.result_info` of each result of the walked function ('' where absent)."""
    record = walk.return_record
    func = getattr(record.info.op, "parent", None) if record is not None else None
    if func is None or func.name != "func.func":
        return []
    return result_names(func)


def _primary(value: Opaque) -> OpRecord | None:
    """The op an Opaque value's diagnostic points at (the blamed op, else where it arose)."""
    record, blame = value.origin if isinstance(value.origin, tuple) else (None, None)
    return blame if isinstance(blame, OpRecord) else record


def _counterpart_note(record: OpRecord | None, reference: _Reference | None) -> list[Diagnostic]:
    if record is None or reference is None:
        return []
    twin = reference.counterpart(record)
    if twin is None:
        return []
    jax_name = twin.info.loc.op_name if twin.info.loc else ""
    named = f" ({jax_name})" if jax_name and jax_name != twin.info.name else ""
    what = (f"moves blocks of the value that the reference op {twin.info.name}{named} "
            f"computes:" if record.info.name == "stablehlo.collective_permute" else
            f"corresponds to the reference op {twin.info.name}{named}, which computes")
    return [Diagnostic("note", f"{what} {pretty(_first_term(twin), 3)}", twin.loc)]


def _first_term(record: OpRecord) -> Term | str:
    for value in record.outputs:
        if isinstance(value, Rel):
            return value.term
    return "?"


def _opaque_diagnostic(value: Opaque, reference: _Reference | None,
                       prefix: str = "") -> Diagnostic:
    record, blame = value.origin if isinstance(value.origin, tuple) else (None, None)
    notes: list[Diagnostic] = []
    primary = record
    if isinstance(blame, OpRecord) and blame is not record:
        primary = blame
        if record is not None and record.info.name == "stablehlo.while":
            notes.append(Diagnostic("note", "the partial sum is carried around this loop",
                                    record.loc))
        elif record is not None and value.category == "missing_reduction":
            carrier = _carrier(record, blame) if _is_backward(blame) else None
            if carrier is not None:
                notes.append(Diagnostic("note", f"the partial sum reaches the output through "
                                                f"{carrier.info.name} here", carrier.loc))
            notes.append(Diagnostic("note", "the partial sum leaves shard_map here",
                                    record.loc))
            notes.extend(_sibling_sync_note(record, value))
        elif record is not None and value.category in ("wrong_offset", "unrelated",
                                                        "layout_mismatch"):
            what = "lookup" if value.category == "layout_mismatch" else "mask"
            notes.append(Diagnostic("note", f"the {what} is used here by {record.info.name}",
                                    record.loc))
        elif record is not None:
            notes.append(Diagnostic("note", f"the partial sum is used here by "
                                            f"{record.info.name}", record.loc))
    restart = _restarted_positions(record, value) if primary is record else None
    if restart is not None:
        iota, message_text = restart
        notes.insert(0, Diagnostic("note", f"where it meets the split values: {value.reason}",
                                   record.loc))
        return Diagnostic("error", prefix + message_text, iota.loc, tuple(notes),
                          category="wrong_offset")
    notes.extend(_counterpart_note(primary, reference))
    loc = primary.loc if primary else None
    message = prefix + value.reason
    if value.category == "missing_reduction" and _is_backward(primary):
        message += (f" (a gradient: jax's {primary.info.loc.op_name} of this line; the "
                    "gradient synchronisation of this parameter is missing)")
    return Diagnostic("error", message, loc, tuple(notes), category=value.category)


_POSITION_DEPTH = 12


def _restarted_positions(record: OpRecord | None, value: Opaque
                         ) -> tuple[OpRecord, str] | None:
    """Positions that restart at 0 on every shard (RoPE under context parallelism): an
    elementwise op meets values split along a dim with a value that is not, and that value is
    built from an iota as long as the local dim. The iota is where the mistake is: global
    positions of a shard are `axis_index * n + iota(n)`."""
    if record is None or value.category != "layout_mismatch" or record.info.name not in (
            ELEMENTWISE_RULES) or record.manual_axes == ():
        return None
    rels = [(v, src) for v, src in zip(record.inputs, record.sources) if isinstance(v, Rel)]
    for split, _ in rels:
        for dim, axes in enumerate(split.tiling):
            if not axes:
                continue
            local = record.info.operand_types[0].shape[dim] if record.info.operand_types else 0
            for other, source in rels:
                if other is split or dim >= len(other.tiling) or other.tiling[dim] or \
                        dim in other.poly:
                    continue
                iota = _iota_source(source, local)
                if iota is not None:
                    return iota, (
                        f"positions restart at 0 on every device: this iota numbers the "
                        f"{local} local rows 0..{local - 1} on each device, but they meet "
                        f"values split over {axes_str(axes)} along dim {dim} (global positions "
                        f"of a shard are axis_index({', '.join(axes)}) * {local} + iota)")
    return None


def _iota_source(record: OpRecord | None, length: int) -> OpRecord | None:
    frontier, seen = [record], set()
    for _ in range(_POSITION_DEPTH):
        nxt = []
        for rec in frontier:
            if rec is None or id(rec) in seen:
                continue
            seen.add(id(rec))
            if rec.info.name == "stablehlo.iota" and rec.info.result_types and \
                    length in rec.info.result_types[0].shape:
                return rec
            nxt.extend(rec.sources)
        frontier = nxt
    return None


_SYNC_OPS = ("stablehlo.all_reduce", "stablehlo.reduce_scatter")
_SYNC_DEPTH = 4


def _sibling_sync_note(exit_record: OpRecord, value: Opaque) -> list[Diagnostic]:
    """Where the program synchronises the results like this one: for each other result split
    over the same axes as this one (none: a replicated parameter, say), the all_reduce / reduce_scatter that made it
    whole, a few ops back (through the optimizer's update), when they all are on one source
    line. An omitted synchronisation emits no op, so no location is the omission's; this points
    at the synchronisation the result bypassed (the `psum` of the gradient-sync loop), named as
    such."""
    index = _RESULT_INDEX.search(value.reason)
    if index is None or int(index.group(1)) >= len(exit_record.inputs):
        return []
    index = int(index.group(1))
    values = [_result_value(source) for source in exit_record.sources]
    mine = values[index] if index < len(values) else None
    if mine is None or not mine.partial:
        return []
    syncs: dict[tuple[str, int], OpRecord] = {}
    for j, (other, source) in enumerate(zip(values, exit_record.sources)):
        if (j == index or other is None or other.partial
                or set(other.tiled_axes) != set(mine.tiled_axes) or not other.term.shape):
            continue
        frontier = [source]
        for _ in range(_SYNC_DEPTH):
            nxt = []
            for rec in frontier:
                if rec is None:
                    continue
                if rec.info.name in _SYNC_OPS and rec.loc is not None and any(
                        isinstance(v, Rel) and set(mine.partial) <= set(v.partial)
                        for v in rec.inputs):
                    syncs[(rec.loc.file, rec.loc.line)] = rec
                    continue
                nxt.extend(rec.sources)
            frontier = nxt
    if len(syncs) != 1:
        return []
    (found,) = syncs.values()
    return [Diagnostic("note", f"results laid out like this one are synchronised by this "
                               f"{found.info.name}; this result does not go through it",
                       found.loc)]


def _result_value(source: OpRecord | None) -> Rel | None:
    """The relation of a single-result op's value (None for other ops)."""
    if source is None or len(source.outputs) != 1 or not isinstance(source.outputs[0], Rel):
        return None
    return source.outputs[0]


def _is_backward(record: OpRecord | None) -> bool:
    """An op jax's autodiff made: its name is `transpose(jvp(...))/...` and its location the
    forward line it differentiates."""
    op_name = record.info.loc.op_name if record is not None and record.info.loc else ""
    return "transpose(" in op_name


def _carrier(exit_record: OpRecord, origin: OpRecord | None) -> OpRecord | None:
    """The last op before a shard_map exit that carries the partial sum `origin` made, when it
    is another op: a gradient is made in the backward pass and leaves through the optimizer's
    update, the line that reads the (unsynchronised) gradients."""
    for source in exit_record.sources:
        if source is None or source is origin:
            continue
        for value in source.outputs:
            if isinstance(value, Rel) and value.partial and value.partial_origin is origin:
                return source
    return None


def _valid_indices(ref: Walk) -> ValidIndices:
    return ValidIndices([w.term for w in ref.outputs if isinstance(w, Rel)])


def _mismatch_diagnostic(index: int, want: Term, got: Term, sharded: Walk,
                         reference: _Reference, valid: ValidIndices | None = None
                         ) -> tuple[Diagnostic, OpRecord | None]:
    """The diagnostic of an output whose term differs, and the op it names (if any)."""
    k, base = single_scaled(got)
    if base is want:
        message = f"result #{index} is {readable_factor(k, want.dtype)} x the reference"
    else:
        message = f"result #{index} differs from the reference: " + (
            structural_diff(want, got) or "different terms")
    where = sharded.return_record.loc if sharded.return_record else None
    culprit = _first_divergence(got, sharded, reference, index,
                                valid if valid is not None else _valid_indices(reference.walk))
    if culprit is None:
        return Diagnostic("error", message, where, category="different_function"), None
    record, term = culprit
    found = _explained_ratio(record, term, sharded, reference)
    k2, base2 = found if found is not None else (1, term)
    category = "different_function"
    if record.hints:
        reason, category = record.hints[0]
    elif found is not None and k2 != 1:
        factor = readable_factor(k2, base2.dtype, _constants(term))
        reason = f"value is {factor} x what the reference computes here ({pretty(base2, 3)})"
        category = "scale"
        mean = _pmean_axes(record, k2, sharded)
        summed = _psum_axes(record, k2, sharded)
        if summed:
            reason = (f"all_reduce sums over {summed}, so the value is {factor} x what the "
                      "reference computes here (the reference averages: pmean was needed)")
        elif mean:
            reason = (f"pmean over {mean}: the all_reduce sum is divided by {k2.denominator}, "
                      f"so the value is {factor} x what the reference computes here (psum was "
                      "needed)")
    else:
        reason = (f"{record.info.name.split('.')[-1]} computes {pretty(term, 3)}, which the "
                  "reference never computes")
    notes = [Diagnostic("note", message, where), *_counterpart_note(record, reference)]
    differing = constant_differences(want, got)
    if differing:
        notes.append(Diagnostic("note", describe_difference(differing[0]), record.loc))
    kept = _kept_zero(want, got)
    if kept is not None:
        notes.append(Diagnostic("note", _kept_zero_text(kept), record.loc))
    return Diagnostic("error", reason, record.loc, tuple(notes), category=category), record


def _constants(term: Term, limit: int = 64) -> tuple:
    """The first `limit` distinct scalar constants under `term` (splats and the coefficients
    of linear combinations): the program's own constants, to spell a scale factor with."""
    found: dict = {}
    for t in subterms([term]):
        if t.op == "splat":
            found.setdefault(t.attrs[0], None)
        elif t.op == "lin":
            constant, coefs = t.attrs
            for value in (constant, *coefs):
                found.setdefault(value, None)
        if len(found) >= limit:
            break
    return tuple(found)


def _kept_zero(want: Term, got: Term) -> Term | None:
    """A zero multiple (`terms.zero_multiple`) in the sharded term that the reference's lacks:
    `0 * t` (or a cancelled `t - t`) with `t` not shown finite, which is NaN where `t`
    overflows."""
    present = {t.serial for t in subterms([want])}
    for term in subterms([got]):
        if term.serial not in present and is_zero_multiple(term):
            return term
    return None


def _kept_zero_text(term: Term) -> str:
    factor = [a for a in term.args if not (a.op == "splat" and a.attrs[0] == 0)]
    shown = pretty(factor[0], 3) if len(factor) == 1 else pretty(term, 3)
    return (f"0 * {shown} (a product with zero, or a difference that cancels) is not 0: "
            f"{shown} is not shown finite, and inf * 0 = inf - inf = NaN; x * 0 and x - x "
            "fold to 0 only where x is shown finite")


def _explained_ratio(record: OpRecord, term: Term, sharded: Walk,
                     reference: _Reference) -> tuple[object, Term] | None:
    """The culprit's ratio to a reference value: one a psum or pmean explains (a psum of
    local means is 4 x the reference's mean, though only 1/4 x its sum), else the first."""
    found = reference.ratios(term)
    for k, base in found:
        if k != 1 and (_psum_axes(record, k, sharded) or _pmean_axes(record, k, sharded)):
            return k, base
    return found[0] if found else None


def _pmean_axes(record: OpRecord, factor, walk: Walk) -> str:
    """The axes of an all_reduce feeding this op whose group size is 1/factor (a pmean)."""
    if walk.mesh is None or getattr(factor, "numerator", 0) != 1:
        return ""
    for source in record.sources:
        if source is None or source.info.name != "stablehlo.all_reduce":
            continue
        groups = source.info.attrs.get("replica_groups")
        axes = walk.mesh.axes_of_groups(groups, ordered=False) if groups else None
        if axes and walk.mesh.group_size(axes) == factor.denominator:
            return axes_str(axes)
    return ""


def _psum_axes(record: OpRecord, factor, walk: Walk) -> str:
    """The axes of this all_reduce when their group size is `factor` (a psum where the
    reference's value is the mean over those devices)."""
    if (walk.mesh is None or record.info.name != "stablehlo.all_reduce"
            or getattr(factor, "denominator", 0) != 1):
        return ""
    groups = record.info.attrs.get("replica_groups")
    axes = walk.mesh.axes_of_groups(groups, ordered=False) if groups else None
    if axes and walk.mesh.group_size(axes) == factor.numerator:
        return axes_str(axes)
    return ""


def _first_divergence(out: Term, sharded: Walk, reference: _Reference, index: int = -1,
                      valid: ValidIndices | None = None):
    """The first op, in program order, on the output's slice whose term the reference lacks
    (also once `valid`'s index-range rewrites are applied to both, where given).

    Values that are a scaled reference value (a local mean's 1/N_local waiting for its pmean)
    are not divergences by themselves: when every divergent value is such a scaled one, the
    culprit is where the scale last changes to the output's wrong one (the reduction that
    divides by the wrong count). The slice is the output term's parts, and for scaled values
    every op the output depends on: a mis-scaled statistic under a nonlinear op (a psum where
    an RMSNorm's mean needed a pmean, under its rsqrt) no longer shows in the output's term
    by itself, but the op that scaled it is still where the value went wrong."""
    needed = _subterms(out)
    upstream = _upstream(sharded, index)
    scaled: list[tuple[OpRecord, Term, object]] = []
    for record in sharded.records:
        if record.info.name in _BOUNDARY_OPS:
            continue
        for value in record.outputs:
            if not isinstance(value, Rel) or isinstance(value, DeviceScalar):
                continue
            term = value.term
            if term.op in _LEAF_OPS or reference.has(term):
                continue
            if valid is not None and reference.has_under_valid_indices(term, valid):
                continue
            _, base = factor_content(term)
            parts = base.args if base.op == "lin" else ()
            on_slice = term.serial in needed or base.serial in needed or any(
                part.serial in needed for part in parts)
            if not on_slice and id(record) not in upstream:
                continue
            found = reference.ratio(term)
            if found is None:
                if scaled and _has_misscaled_part(term, reference):
                    return _scale_change(scaled)
                if on_slice:
                    return record, term
                continue
            scaled.append((record, term, found[0]))
    return _scale_change(scaled) if scaled else None


def _upstream(sharded: Walk, index: int) -> set[int]:
    """The ids of every op output #`index` depends on, empty when the output is unknown.

    Dependencies follow the ops' sources; a shard_map's result follows only the value its body
    returns for that result (its record's sources are its body's results, one per result), so
    that one output's cone does not take in the shard_map's other outputs (a loss's pmean is
    not where a gradient went wrong)."""
    record = sharded.return_record
    if record is None or not 0 <= index < len(record.sources):
        return set()
    operands = _source_values(record)
    value = operands[index] if operands is not None else None
    seen: set[int] = set()
    visited: set[tuple[int, int | None]] = set()
    stack = [(record.sources[index], _result_number(value))]
    while stack:
        op, number = stack.pop()
        if op is None or (id(op), number) in visited:
            continue
        visited.add((id(op), number))
        seen.add(id(op))
        sources, values = op.sources, _source_values(op)
        if op.info.name == "sdy.manual_computation" and number is not None \
                and number < len(sources):
            sources = [sources[number]]
            values = [values[number]] if values is not None else None
        for position, source in enumerate(sources):
            stack.append((source, _result_number(values[position]) if values else None))
    return seen


def _source_values(record: OpRecord) -> list | None:
    """The MLIR values `record.sources` were read from, position by position (a shard_map's:
    its body's returned values), None where they do not line up."""
    op = record.info.op
    if op is None:
        return None
    if record.info.name == "sdy.manual_computation":
        block = op.regions[0].blocks[0]
        values = list(block.operations[len(block.operations) - 1].operation.operands)
    else:
        values = list(op.operands)
    return values if len(values) == len(record.sources) else None


def _result_number(value) -> int | None:
    """Which result of its op `value` is (None for a block argument or no value)."""
    if value is None:
        return None
    try:
        return ir.OpResult(value).result_number
    except ValueError:  # a block argument
        return None


def _has_misscaled_part(term: Term, reference: _Reference) -> bool:
    """A sum with a part, or an op with an operand, the reference computes at another scale
    (a mis-scaled gradient entering an update, a pmean'd value getting its bias, the log of a
    sum counted once per device)."""
    pairs, _ = linear_parts(term)
    if term.op != "lin":
        pairs = pairs + [pair for arg in term.args for pair in linear_parts(arg)[0]]
    for k, part in pairs:
        found = reference.ratio(scale(part, k))
        if found is not None and found[0] != 1:
            return True
    return False


def _scale_change(scaled: list) -> tuple[OpRecord, Term]:
    """Where the scale went wrong: the last reduction over devices among the scaled values (or
    the division right after it, a pmean), where gradient synchronisation divides by a count
    (or forgets to: a psum where the reference averages);
    without one, the first value at the final scale after the last one at another scale."""
    reductions = [i for i, (record, _, _) in enumerate(scaled)
                  if record.info.name == "stablehlo.all_reduce"]
    if reductions:
        last = reductions[-1]
        after = scaled[last + 1][0] if last + 1 < len(scaled) else None
        if (after is not None and after.info.name == "stablehlo.divide"
                and scaled[last][0] in after.sources):
            last += 1
        return scaled[last][0], scaled[last][1]
    final = scaled[-1][2]
    start = max((i + 1 for i, (_, _, r) in enumerate(scaled) if r != final), default=0)
    record, term, _ = scaled[start]
    return record, term


def _subterms(term: Term) -> set[int]:
    return {t.serial for t in subterms([term])}


def _explain_all(walk: Walk) -> list[list[str]]:
    """`explain` for every output, each record's line rendered once (outputs share cones)."""
    lines: dict[int, str] = {}
    return [explain(walk, i, lines) for i in range(len(walk.outputs))]


def explain(walk: Walk, index: int, rendered: dict[int, str] | None = None) -> list[str]:
    """The chain of relations from the inputs to output `index`, in program order
    (`rendered` memoizes each record's line by record index)."""
    ret = walk.return_record
    if ret is None or index >= len(ret.sources):
        return []
    seen: dict[int, OpRecord] = {}
    stack = [ret.sources[index]]
    while stack:
        record = stack.pop()
        if record is None or record.index in seen:
            continue
        seen[record.index] = record
        stack.extend(record.sources)
    rendered = {} if rendered is None else rendered
    lines = []
    for record in sorted(seen.values(), key=lambda r: r.index):
        line = rendered.get(record.index)
        if line is None:
            where = f"{record.loc}: " if record.loc else ""
            line = rendered[record.index] = (f"{where}{record.info.name}: "
                                             f"{record.relation_text()}")
        lines.append(line)
    return lines
