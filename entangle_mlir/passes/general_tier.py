"""entangle-general-tier: where the layout tier did not prove the program, expand it per
device and decide its outputs exactly (`analysis/general/`).

A proof replaces the layout tier's verdict ("verified", with a note naming the tier and, if
the layout tier had blamed an op, that its claim was not confirmed); otherwise the layout
tier's report stands and `stats["general_tier"]` says why the general tier did not prove it.
Where the general tier finds inputs on which the sharded program's output differs, they are
the report's `counterexample`: `confirm.py` also runs both programs on them to confirm a bug
claim. Where the layout tier could only say it cannot relate a value, the refutation
becomes the report's first diagnostic: a bug claim (`different_function`), confirmed by
running both programs before it is made, as the layout tier's are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from entangle_mlir.analysis.general import MAX_DEVICES
from entangle_mlir.analysis.refine import EvidenceFocus
from entangle_mlir.core.diagnostics import Diagnostic
from entangle_mlir.core.reasons import CLAIMS, STOPPED
from entangle_mlir.core.report import PROVEN, Report, unchecked_assumption
from entangle_mlir.passes.pipeline import ModulePass, PassState

if TYPE_CHECKING:
    from entangle_mlir.analysis.general.tier import GeneralResult

TIER_NOTE = "proven by per-device expansion on {n} devices (general tier)"
STOPPED_NOTE = ("the general tier (per-device expansion) stopped before deciding: {reason}; "
                "the verdict is the layout tier's alone")
"""The note of a general tier stopped by its own limit or defect (`GeneralResult.internal`) or
out of its time budget: never silent, since the verdict then rests on the layout tier
alone."""
UNDECIDED_NOTE = "the general tier (per-device expansion) did not decide: {reason}"
"""The note of a general tier that decided nothing for a reason a user can act on
(`decide.FLOAT_TYPES`: the programs round in different float types)."""

MESSAGE_PREFIX = "general tier ("
"""How the general tier's diagnostic (its refutation) begins."""


@dataclass
class GeneralTierPass(ModulePass):
    name = "entangle-general-tier"
    summary = ("where not proven: expand the shard_map program per device and decide its "
               "outputs exactly (the general tier)")
    max_devices: int = MAX_DEVICES
    budget_seconds: int = 30
    verify_rules: bool = True
    jobs: int = 0
    """Worker processes for the Z3 rule-instance checks (0: one per free core; 1: serial)."""
    layer_templates: bool = True
    """Try a proven layer template first (`analysis/general/layer_templates.py`)."""

    def apply(self, state: PassState) -> None:
        report = state.report
        if report is None or state.program is None:
            return
        if report.proven:
            report.stats.setdefault("tier", "layout")
            return
        from entangle_mlir.analysis.general.tier import (
            run_general_tier,  # lazy: z3 and the semantics (~0.2 s); only when not yet proven
        )

        finiteness = state.finiteness
        result = run_general_tier(state.program, state.walks.get("reference"),
                                  max_devices=self.max_devices,
                                  budget_seconds=self.budget_seconds,
                                  verify_rules=self.verify_rules, jobs=self.jobs,
                                  layer_templates=self.layer_templates,
                                  assume_no_overflow=finiteness is not None
                                  and finiteness.assume_no_overflow)
        apply_result(report, result)


def apply_result(report: Report, result: GeneralResult) -> None:
    """Fold the general tier's result into the layout tier's report."""
    from entangle_mlir.analysis.general.decide import FLOAT_TYPES  # lazy: as the tier is

    summary = {"proven": result.proven, **result.stats}
    if not result.proven:
        summary["reason"] = result.reason
        report.stats["general_tier"] = summary
        if result.internal:
            report.notes.append(STOPPED_NOTE.format(reason=result.reason))
        elif result.reason.startswith("out of time"):
            report.notes.append(STOPPED_NOTE.format(
                reason=f"{result.reason} (its budget of CPU seconds ran out: --general-budget)"))
        elif FLOAT_TYPES in result.reason:
            report.notes.append(UNDECIDED_NOTE.format(reason=result.reason))
        if result.refuted:
            report.counterexample = result.inputs
        if result.refuted and report.diagnostics and all(
                d.category in STOPPED for d in report.diagnostics):
            shown = ", ".join(f"{k} = {v}" for k, v in
                              list((result.counterexample or {}).items())[:6])
            notes = tuple(Diagnostic("note", f"the layout tier: {d.message}", d.loc,
                                     category=d.category) for d in report.diagnostics)
            message = (f"{MESSAGE_PREFIX}per-device expansion on {result.devices} devices): "
                       f"{result.reason}" + (f"; Z3 counterexample: {shown}" if shown else ""))
            report.diagnostics.insert(0, Diagnostic("error", message, result.loc, notes,
                                                    category="different_function"))
            # A claim like the layout tier's: `confirm.py` runs both programs (on the
            # counterexample first) and compares the results it is about before it is made.
            report.foci[(message, str(result.loc))] = EvidenceFocus(
                unavailable="the general tier names no op",
                outputs=(tuple(range(len(report.outputs))) if result.output is None
                         else (result.output,)))
        return
    readings = [d for d in report.diagnostics if d.category not in STOPPED]
    report.verdict = PROVEN
    for output in report.outputs:
        output.proven = True
    report.notes.append(TIER_NOTE.format(n=result.devices))
    for invariant in result.stats.get("loops", {}).get("invariants", []):
        report.notes.append(f"{invariant} (general tier)")
    for reading in readings:
        # A claim (`CLAIMS`) the proof refutes; any other reading (a wrong rule of the layout
        # walk included) is kept as what the layout tier said.
        where = f" at {reading.loc}" if reading.loc else ""
        said = "'s claim was not confirmed" if reading.category in CLAIMS else ""
        report.notes.append(f"the layout tier{said}{where}: {reading.message}")
    for assumption in result.assumptions:
        report.notes.append(f"proven assuming {assumption} (general tier)")
        report.assume(assumption)
    report.unchecked = list(result.unchecked)
    if report.unchecked:
        report.assume(unchecked_assumption(len(report.unchecked)))
    report.diagnostics = []
    report.focus = None
    report.stats["tier"] = "general"
    report.stats["general_tier"] = summary
