"""Run-time rule-instance checks: every op's inferred relation, proved by Z3 as an instance of
its rule (real attributes, reduced shape), cached by signature."""

from __future__ import annotations

import time
from dataclasses import replace

from .diagnostics import Diagnostic
from .infer import Walk
from .layout import Opaque, Rel
from .report import NOT_PROVEN, Report
from .terms import scale

_SKIP = ("sdy.manual_computation", "func.return", "stablehlo.return", "sdy.return")


def verify_walk(walk: Walk, report: Report, budget_seconds: float = 60.0,
                inject_fault: str = "") -> None:
    """Check each rule instance of the sharded walk; a refuted or inconclusive one withdraws
    the verdict. The report's `mode` says what ran."""
    from .instance import check_instance
    from .progress import Progress

    start = time.perf_counter()
    counts = {"proved": 0, "refuted": 0, "unknown": 0, "skipped": 0}
    progress = Progress("checking rule instances with Z3", len(walk.records))
    for position, record in enumerate(walk.records):
        progress.update(position)
        if record.info.name in _SKIP or not record.outputs:
            continue
        if any(isinstance(v, Opaque) for v in record.inputs + record.outputs):
            continue
        if time.perf_counter() - start > budget_seconds:
            counts["skipped"] += 1
            continue
        mesh = walk.mesh if record.manual_axes else None
        outputs = record.outputs
        if inject_fault and record.info.name == inject_fault:
            outputs = [replace(v, term=scale(v.term, 2)) if isinstance(v, Rel) else v
                       for v in outputs]
        result = check_instance(record.info, record.inputs, outputs, mesh)
        status = result.status if result.status in counts else "unknown"
        counts[status] += 1
        if status in ("refuted", "unknown"):
            why = f": {result.reason}" if getattr(result, "reason", "") else ""
            what = ("was refuted by Z3 (a rule is wrong: please report this)"
                    if status == "refuted" else f"is inconclusive{why or ' (Z3 unknown or timeout)'}")
            report.diagnostics.append(Diagnostic(
                "error", f"proof of the rule instance for {record.info.name} {what}",
                record.loc, category="inconclusive" if status == "unknown" else "refuted"))
            report.verdict = NOT_PROVEN
            for out in report.outputs:
                out.proven = False
    progress.close()
    report.stats["rule_instances"] = dict(counts)
    report.stats["rule_check_seconds"] = round(time.perf_counter() - start, 4)
    skipped = f", {counts['skipped']} skipped (too large or over budget)" if counts[
        "skipped"] else ""
    report.mode = (f"Z3 checked {counts['proved'] + counts['refuted'] + counts['unknown']} rule "
                   f"instances: {counts['proved']} proved, {counts['refuted']} refuted, "
                   f"{counts['unknown']} inconclusive{skipped}")
