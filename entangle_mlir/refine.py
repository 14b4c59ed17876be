"""Outputs against the reference: ρ when they match, the first diverging op when not."""

from __future__ import annotations

from .diagnostics import Diagnostic
from .infer import OpRecord, Walk, reference_terms
from .layout import DeviceScalar, Opaque, Rel
from .report import NOT_PROVEN, PROVEN, OutputResult, Report
from .terms import Term, pretty, single_scaled, structural_diff

_LEAF_OPS = ("splat", "dense", "iota", "arg")


def compare(ref: Walk, sharded: Walk) -> Report:
    """The verdict for every output; diagnostics point at the first op that went wrong."""
    outputs, diagnostics = [], []
    ref_terms = reference_terms(ref)
    for i, (want, got) in enumerate(zip(ref.outputs, sharded.outputs)):
        rho = sharded.output_rho[i] if i < len(sharded.output_rho) else ""
        if isinstance(want, Opaque):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(_opaque_diagnostic(want, prefix="in the reference: "))
            continue
        if isinstance(got, Opaque):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(_opaque_diagnostic(got))
            continue
        if not isinstance(got, Rel) or not isinstance(want, Rel):
            outputs.append(OutputResult(i, False, rho))
            diagnostics.append(Diagnostic("error", f"result #{i} is not a tensor value"))
            continue
        if got.term is want.term:
            outputs.append(OutputResult(i, True, rho, pretty(want.term, 3)))
            continue
        outputs.append(OutputResult(i, False, rho))
        diagnostics.append(_mismatch_diagnostic(i, want.term, got.term, sharded, ref_terms))
    seen, unique = set(), []
    for diag in diagnostics:
        key = (diag.message, str(diag.loc))
        if key not in seen:
            seen.add(key)
            unique.append(diag)
    verdict = PROVEN if all(o.proven for o in outputs) and outputs is not None else NOT_PROVEN
    if len(ref.outputs) != len(sharded.outputs):
        verdict = NOT_PROVEN
    mesh = sharded.mesh.describe() if sharded.mesh else ""
    return Report(verdict, outputs, unique, list(dict.fromkeys(ref.notes + sharded.notes)),
                  mesh=mesh)


def _opaque_diagnostic(value: Opaque, prefix: str = "") -> Diagnostic:
    record, blame = value.origin if isinstance(value.origin, tuple) else (None, None)
    notes = []
    primary = record
    message = prefix + value.reason
    if isinstance(blame, OpRecord) and blame is not record:
        primary = blame
        if record is not None and value.category == "missing_reduction":
            notes.append(Diagnostic("note", "the partial sum leaves shard_map here",
                                    record.loc))
        elif record is not None:
            notes.append(Diagnostic("note", f"the partial sum is used here by "
                                            f"{record.info.name}", record.loc))
    loc = primary.loc if primary else None
    return Diagnostic("error", message, loc, tuple(notes))


def _mismatch_diagnostic(index: int, want: Term, got: Term, sharded: Walk,
                         ref_terms: dict[int, Term]) -> Diagnostic:
    k, base = single_scaled(got)
    if base is want:
        message = f"result #{index} is {k} x the reference"
    else:
        message = f"result #{index} differs from the reference: " + (
            structural_diff(want, got) or "different terms")
    culprit = _first_divergence(got, sharded, ref_terms)
    if culprit is None:
        return Diagnostic("error", message, sharded.return_record.loc
                          if sharded.return_record else None)
    record, term = culprit
    if record.hints:
        reason = record.hints[0]
    else:
        k2, base2 = single_scaled(term)
        if base2.serial in ref_terms and k2 != 1:
            reason = f"value is {k2} x what the reference computes here ({pretty(base2, 3)})"
        else:
            reason = (f"{record.info.name.split('.')[-1]} computes {pretty(term, 3)}, which the "
                      "reference never computes")
    note = Diagnostic("note", message, sharded.return_record.loc if sharded.return_record
                      else None)
    return Diagnostic("error", reason, record.loc, (note,))


def _first_divergence(out: Term, sharded: Walk, ref_terms: dict[int, Term]):
    """The first op, in program order, on the output's slice whose term the reference lacks."""
    needed = _subterms(out)
    for record in sharded.records:
        if record.info.name == "sdy.manual_computation":
            continue
        for value in record.outputs:
            if not isinstance(value, Rel) or isinstance(value, DeviceScalar):
                continue
            term = value.term
            if term.op in _LEAF_OPS or term.serial in ref_terms:
                continue
            if term.serial in needed or _feeds(term, needed):
                return record, term
    return None


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


def _feeds(term: Term, needed: set[int]) -> bool:
    k, base = single_scaled(term)
    return base.serial in needed
