"""Outputs against the reference: ρ when they match, the first diverging op when not.

A failing output is traced to one sharded op (the first opaque op, or the first op on the
output's slice whose term the reference never computes) and, where one exists, the reference
op it should correspond to; both are reported with their source locations.
"""

from __future__ import annotations

from .diagnostics import Diagnostic
from .infer import OpRecord, Walk
from .layout import GLOBAL, DeviceScalar, Opaque, Rel
from .report import NOT_PROVEN, PROVEN, OutputResult, Report
from .terms import (
    Term,
    factor_content,
    linear_parts,
    pretty,
    scale,
    single_scaled,
    structural_diff,
)

_LEAF_OPS = ("splat", "dense", "iota", "arg", "loopvar")
_BOUNDARY_OPS = ("sdy.manual_computation", "func.func", "func.return")


class _Reference:
    """Every term the reference computes, and the first op computing it."""

    def __init__(self, walk: Walk):
        self.walk = walk
        self.by_term: dict[int, OpRecord] = {}
        self.terms: dict[int, Term] = {}
        self.scaled: dict[int, Term] = {}
        for value in walk.values.values():
            if isinstance(value, Rel):
                self.terms[value.term.serial] = value.term
                self.scaled.setdefault(factor_content(value.term)[1].serial, value.term)
        for record in walk.records:
            for value in record.outputs:
                if isinstance(value, Rel):
                    self.by_term.setdefault(value.term.serial, record)

    def has(self, term: Term) -> bool:
        return term.serial in self.terms

    def ratio(self, term: Term) -> tuple[object, Term] | None:
        """(r, t) when the reference computes t and term == r * t (scalars are pulled out of
        products, so a mis-scaled value differs from the reference's by its coefficient)."""
        k, base = factor_content(term)
        known = self.scaled.get(base.serial)
        if known is None:
            return None
        kr, _ = factor_content(known)
        return k / kr, known

    def counterpart(self, record: OpRecord) -> OpRecord | None:
        """The reference op a sharded op should correspond to, if one can be found."""
        for value in record.outputs:
            if isinstance(value, Rel):
                found = self._lookup(value.term)
                if found:
                    return found
        hypothetical = _global_result(record)
        if hypothetical is not None:
            found = self._lookup(hypothetical)
            if found:
                return found
        same_inputs = self._by_inputs(record)
        if same_inputs is not None:
            return same_inputs
        for value in record.inputs:
            if isinstance(value, Rel) and value.term.op not in _LEAF_OPS:
                found = self._lookup(value.term)
                if found:
                    return found
        return None

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
        return found


def _global_result(record: OpRecord) -> Term | None:
    """The term the op would compute on whole (unsharded) operands."""
    from .rules import RULES, RuleContext

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


def compare(ref: Walk, sharded: Walk) -> Report:
    """The verdict for every output; diagnostics point at the first op that went wrong."""
    outputs, diagnostics = [], []
    reference = _Reference(ref)
    for i, (want, got) in enumerate(zip(ref.outputs, sharded.outputs)):
        rho = sharded.output_rho[i] if i < len(sharded.output_rho) else ""
        if isinstance(want, Opaque):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(_opaque_diagnostic(want, None, prefix="in the reference: "))
            continue
        if isinstance(got, Opaque):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(_opaque_diagnostic(got, reference))
            continue
        if not isinstance(got, Rel) or not isinstance(want, Rel):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(Diagnostic("error", f"result #{i} is not a tensor value",
                                          category="unrelated"))
            continue
        if got.term is want.term:
            outputs.append(OutputResult(i, True, rho, pretty(want.term, 3)))
            continue
        outputs.append(OutputResult(i, False, rho))
        diagnostics.append(_mismatch_diagnostic(i, want.term, got.term, sharded, reference))
    seen, unique = set(), []
    for diag in diagnostics:
        key = (diag.message, str(diag.loc))
        if key not in seen:
            seen.add(key)
            unique.append(diag)
    verdict = PROVEN if all(o.proven for o in outputs) else NOT_PROVEN
    if len(ref.outputs) != len(sharded.outputs):
        verdict = NOT_PROVEN
    mesh = sharded.mesh.describe() if sharded.mesh else ""
    report = Report(verdict, outputs, unique, list(dict.fromkeys(ref.notes + sharded.notes)),
                    mesh=mesh)
    report.explainer = lambda: [explain(sharded, i) for i in range(len(sharded.outputs))]
    return report


def _counterpart_note(record: OpRecord | None, reference: _Reference | None) -> list[Diagnostic]:
    if record is None or reference is None:
        return []
    twin = reference.counterpart(record)
    if twin is None:
        return []
    jax_name = twin.info.loc.op_name if twin.info.loc else ""
    named = f" ({jax_name})" if jax_name and jax_name != twin.info.name else ""
    return [Diagnostic("note", f"corresponds to the reference op {twin.info.name}{named}, "
                               f"which computes {pretty(_first_term(twin), 3)}", twin.loc)]


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
            notes.append(Diagnostic("note", "the partial sum leaves shard_map here",
                                    record.loc))
        elif record is not None:
            notes.append(Diagnostic("note", f"the partial sum is used here by "
                                            f"{record.info.name}", record.loc))
    notes.extend(_counterpart_note(primary, reference))
    loc = primary.loc if primary else None
    return Diagnostic("error", prefix + value.reason, loc, tuple(notes),
                      category=value.category)


def _mismatch_diagnostic(index: int, want: Term, got: Term, sharded: Walk,
                         reference: _Reference) -> Diagnostic:
    k, base = single_scaled(got)
    if base is want:
        message = f"result #{index} is {k} x the reference"
    else:
        message = f"result #{index} differs from the reference: " + (
            structural_diff(want, got) or "different terms")
    where = sharded.return_record.loc if sharded.return_record else None
    culprit = _first_divergence(got, sharded, reference)
    if culprit is None:
        return Diagnostic("error", message, where, category="different_function")
    record, term = culprit
    found = reference.ratio(term)
    k2, base2 = found if found is not None else (1, term)
    category = "different_function"
    if record.hints:
        reason = record.hints[0]
        category = "duplicate_reduction" if "already replicated" in reason else "scale"
    elif found is not None and k2 != 1:
        reason = f"value is {k2} x what the reference computes here ({pretty(base2, 3)})"
        category = "scale"
        mean = _pmean_axes(record, k2, sharded)
        if mean:
            reason = (f"pmean over {mean}: the all_reduce sum is divided by {k2.denominator}, "
                      f"so the value is {k2} x what the reference computes here (psum was "
                      "needed)")
    else:
        reason = (f"{record.info.name.split('.')[-1]} computes {pretty(term, 3)}, which the "
                  "reference never computes")
    notes = [Diagnostic("note", message, where), *_counterpart_note(record, reference)]
    return Diagnostic("error", reason, record.loc, tuple(notes), category=category)


def _pmean_axes(record: OpRecord, factor, walk: Walk) -> str:
    """The axes of an all_reduce feeding this op whose group size is 1/factor (a pmean)."""
    from .mesh import axes_str

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


def _first_divergence(out: Term, sharded: Walk, reference: _Reference):
    """The first op, in program order, on the output's slice whose term the reference lacks.

    Values that are a scaled reference value (a local mean's 1/N_local waiting for its pmean)
    are not divergences by themselves: when every divergent value is such a scaled one, the
    culprit is where the scale last changes to the output's wrong one (the reduction that
    divides by the wrong count)."""
    needed = _subterms(out)
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
            _, base = factor_content(term)
            parts = base.args if base.op == "lin" else ()
            if term.serial in needed or base.serial in needed or any(
                    part.serial in needed for part in parts):
                found = reference.ratio(term)
                if found is None:
                    if scaled and _has_misscaled_part(term, reference):
                        return _scale_change(scaled)
                    return record, term
                scaled.append((record, term, found[0]))
    return _scale_change(scaled) if scaled else None


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
    the division right after it, a pmean), where gradient synchronisation divides by a count;
    without one, the first value at the final scale after the last one at another scale."""
    reductions = [i for i, (record, _, _) in enumerate(scaled)
                  if record.info.name == "stablehlo.all_reduce"]
    if reductions:
        last = reductions[-1]
        if last + 1 < len(scaled) and scaled[last][0] in scaled[last + 1][0].sources:
            last += 1
        return scaled[last][0], scaled[last][1]
    final = scaled[-1][2]
    start = max((i + 1 for i, (_, _, r) in enumerate(scaled) if r != final), default=0)
    record, term, _ = scaled[start]
    return record, term


def _subterms(term: Term) -> set[int]:
    found: set[int] = set()
    stack = [term]
    while stack:
        t = stack.pop()
        if t.serial in found:
            continue
        found.add(t.serial)
        stack.extend(t.args)
    return found


def explain(walk: Walk, index: int) -> list[str]:
    """The chain of relations from the inputs to output `index`, in program order."""
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
    lines = []
    for record in sorted(seen.values(), key=lambda r: r.index):
        where = f"{record.loc}: " if record.loc else ""
        lines.append(f"{where}{record.info.name}: {record.relation_text()}")
    return lines
