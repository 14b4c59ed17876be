"""entangle-check-refinement: outputs against the reference; ρ or diagnostics.

Attaches `entangle.verdict` and `entangle.rho` to the sharded function so lit can CHECK them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from jaxlib.mlir import ir

from entangle_mlir.analysis.refine import ASSUMING, EvidenceFocus, compare
from entangle_mlir.core.diagnostics import Diagnostic, InputError, parse_location
from entangle_mlir.core.report import Report
from entangle_mlir.mlir.ir import context
from entangle_mlir.normalize.finite import NO_OVERFLOW, Finiteness
from entangle_mlir.passes.pipeline import ModulePass, PassState


@dataclass
class CheckRefinementPass(ModulePass):
    name = "entangle-check-refinement"
    summary = "compare sharded outputs with the reference; emit rho or diagnostics"
    verdict_only_after_reuse: bool = False
    """Where the walk summarized reference layers, diagnose no failing output (the driver
    walks a program so checked again op by op when it is not proven, and diagnoses that)."""

    def apply(self, state: PassState) -> None:
        if state.program is None:
            raise InputError("no function carries `entangle.refines = @reference`",
                             file=state.file)
        if "sharded" not in state.walks:
            raise InputError("entangle-check-refinement needs entangle-infer-relations first",
                             file=state.file)
        diagnose = not (self.verdict_only_after_reuse and state.layers_reused.get("reference"))
        report = compare(state.walks["reference"], state.walks["sharded"], diagnose=diagnose)
        report.notes.extend(note for note in state.notes if note not in report.notes)
        if state.finiteness is not None:
            _judged_finiteness(report, state.finiteness)
        report.stats["ops"] = len(state.walks["sharded"].records)
        report.stats["seconds"] = round(time.perf_counter() - state.started, 4)
        if report.focus is not None:
            # The walked (normalized) modules: op-level evidence runs copies of them.
            report.focus.modules = (state.program.ref_module, state.program.sharded_module)
        state.report = report
        state.diagnostics.extend(report.diagnostics)
        func = state.program.sharded_func
        if state.program.sharded_module is state.module:
            with context():
                func.attributes["entangle.verdict"] = ir.StringAttr.get(report.verdict)
                func.attributes["entangle.rho"] = ir.ArrayAttr.get(
                    [ir.StringAttr.get(f"result#{o.index} = {o.rho}") for o in report.outputs])


def _judged_finiteness(report: Report, finiteness: Finiteness) -> None:
    """What entangle-normalize's finiteness judgement decided, in the report: a proof that
    relied on `--assume-no-overflow` lists it among its assumptions (and where); a program
    not proven where a rewrite was refused only for a possible overflow says so first (the
    root refusal, the others as its notes; the walk's own diagnostics, downstream of it,
    follow). A guard kept (`Refusal.guard`) is left to the driver."""
    if report.proven and finiteness.used:
        where = list(dict.fromkeys(str(parse_location(loc, file) or file)
                                   for file, loc in finiteness.used))
        more = f" and {len(where) - 3} more" if len(where) > 3 else ""
        report.notes.append(f"{ASSUMING}{NO_OVERFLOW}: the rewrites at "
                            f"{', '.join(where[:3])}{more} rely on it")
        report.assume(NO_OVERFLOW)
        return
    refusals = [r for r in finiteness.refusals if not r.guard]
    if not report.proven and refusals:
        first: dict[str, Diagnostic] = {}
        for refusal in sorted(refusals, key=lambda r: not r.root):
            first.setdefault(refusal.message, Diagnostic(
                "error", refusal.message, parse_location(refusal.location, refusal.file),
                category="overflow"))
        main, *others = first.values()
        report.diagnostics.insert(0, replace(main, notes=tuple(
            replace(d, severity="note", message=f"also refused: {d.message}", category="")
            for d in others)))
        report.focus = EvidenceFocus(unavailable="a rewrite was refused for a possible "
                                     "overflow: no op diverges there")
