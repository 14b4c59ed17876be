"""Run-time rule-instance checks: every op's inferred relation, proved by Z3 as an instance of
its rule (real attributes, reduced shape), cached by signature.

Both walks are checked: the reference walk's instances (each op's term built from its
operands' terms by the term constructors, which fold and canonicalize) are as much a part of
a proof as the sharded walk's; the signature cache makes the reference's repeated layers, and
ops the sharded walk checks with the same terms and layouts, dictionary lookups."""

from __future__ import annotations

import time
from dataclasses import replace

from entangle_mlir.analysis.budget import Budget
from entangle_mlir.analysis.infer import Walk
from entangle_mlir.core.diagnostics import Diagnostic
from entangle_mlir.core.progress import Progress
from entangle_mlir.core.relations import Opaque, Rel
from entangle_mlir.core.report import (
    NOT_PROVEN,
    Report,
    UncheckedInstance,
    unchecked_assumption,
)
from entangle_mlir.core.terms import scale

_SKIP = ("sdy.manual_computation", "func.return", "stablehlo.return", "sdy.return")
_STATUSES = ("proved", "refuted", "unknown", "skipped")


def verify_walk(walk: Walk, report: Report, budget_seconds: float = 60.0,
                inject_fault: str = "", jobs: int | None = None) -> None:
    """Check each rule instance of one walk (see `verify_walks`)."""
    verify_walks({"sharded": walk}, report, budget_seconds, inject_fault, jobs)


def verify_walks(walks: dict[str, Walk], report: Report, budget_seconds: float = 60.0,
                 inject_fault: str = "", jobs: int | None = None) -> None:
    """Check each rule instance of every walk (the reference's first, then the sharded's);
    a refuted or inconclusive one withdraws the verdict. The report's `mode` says what ran,
    with the counts of both walks together; `stats["rule_instances_by_walk"]` splits them.
    Every instance not checked (skipped: too large, over the budget) is listed in
    `report.unchecked`, and a proof that has some lists them among its assumptions.
    `jobs`: worker processes for the Z3 queries (`instance.parallel.check_batch`; None or 0:
    as many as there are free cores, 1: serial); the verdict and counts do not depend on it."""
    from entangle_mlir.analysis.instance.parallel import (
        check_batch,  # lazy: z3 (~40 ms), not needed by --no-verify-rules
    )

    start = time.perf_counter()
    counts = dict.fromkeys(_STATUSES, 0)
    by_walk: dict[str, dict[str, int]] = {name: dict.fromkeys(_STATUSES, 0) for name in walks}
    checked = [(name, record) for name, walk in walks.items() for record in walk.records
               if _checked(record)]
    items = [(record.info, record.inputs, _outputs(record, name, inject_fault),
              walks[name].mesh if record.manual_axes else None) for name, record in checked]
    progress, position = None, 0
    results = check_batch(items, jobs=jobs, budget=Budget(budget_seconds))
    try:
        for (name, record), result in zip(checked, results):
            if progress is None or progress.label != _label(name):
                if progress is not None:
                    progress.close()
                progress, position = Progress(_label(name), len(walks[name].records)), 0
            progress.update(position)
            position += 1
            status = _record(report, name, record, result, budget_seconds)
            by_walk[name][status] += 1
            counts[status] += 1
    finally:
        results.close()
        if progress is not None:
            progress.close()
    report.stats["rule_instances"] = dict(counts)
    if len(walks) > 1:
        report.stats["rule_instances_by_walk"] = by_walk
    report.stats["rule_check_seconds"] = round(time.perf_counter() - start, 4)
    skipped = f", {counts['skipped']} skipped (too large or over budget)" if counts[
        "skipped"] else ""
    total = counts["proved"] + counts["refuted"] + counts["unknown"]
    ref = by_walk.get("reference")
    of_ref = (f"; {ref['proved'] + ref['refuted'] + ref['unknown']} of them in the reference "
              "walk" if ref is not None and len(walks) > 1 else "")
    report.mode = (f"Z3 checked {total} rule instances: {counts['proved']} proved, "
                   f"{counts['refuted']} refuted, {counts['unknown']} inconclusive{skipped}"
                   f"{of_ref}")
    if report.proven and report.unchecked:
        report.assume(unchecked_assumption(len(report.unchecked)))


def _label(walk: str) -> str:
    return f"checking {walk} rule instances with Z3"


def _checked(record) -> bool:
    """Whether an op's record is a rule instance to check (not a terminator, no opaque
    value)."""
    if record.info.name in _SKIP or not record.outputs:
        return False
    return not any(isinstance(v, Opaque) for v in record.inputs + record.outputs)


def _outputs(record, walk: str, inject_fault: str) -> list:
    if not _faulty(inject_fault, walk, record.info.name):
        return record.outputs
    return [replace(v, term=scale(v.term, 2)) if isinstance(v, Rel) else v
            for v in record.outputs]


def _record(report: Report, name: str, record, result, budget_seconds: float) -> str:
    """Count one instance's result into the report (None: over the time budget); its
    status."""
    where = "" if name == "sharded" else f" in the {name} walk"
    if result is None:
        report.unchecked.append(UncheckedInstance(
            name, record.info.name, record.loc,
            f"over the time budget of the rule checks ({budget_seconds:g} CPU s)"))
        return "skipped"
    status = result.status if result.status in _STATUSES else "unknown"
    if status == "skipped":
        report.unchecked.append(UncheckedInstance(
            name, record.info.name, record.loc,
            getattr(result, "reason", "") or "not checked"))
    if status in ("refuted", "unknown"):
        why = f": {result.reason}" if getattr(result, "reason", "") else ""
        what = ("was refuted by Z3 (a rule is wrong: please report this)"
                if status == "refuted" else f"is inconclusive{why or ' (Z3 unknown or timeout)'}")
        report.diagnostics.append(Diagnostic(
            "error", f"proof of the rule instance for {record.info.name}{where} {what}",
            record.loc, category="inconclusive" if status == "unknown" else "refuted"))
        report.verdict = NOT_PROVEN
        for out in report.outputs:
            out.proven = False
    return status


def _faulty(inject_fault: str, walk: str, op_name: str) -> bool:
    """Testing only: `OP` injects the fault into the sharded walk's instances of OP,
    `WALK:OP` into those of the named walk (`reference:stablehlo.add`)."""
    target_walk, _, target_op = inject_fault.rpartition(":")
    return bool(target_op) and op_name == target_op and walk == (target_walk or "sharded")
