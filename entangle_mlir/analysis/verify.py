"""Run-time rule-instance checks: every op's inferred relation, proved by Z3 as an instance of
its rule (real attributes, reduced shape), cached by signature.

Both walks are checked: the reference walk's instances (each op's term built from its
operands' terms by the term constructors, which fold and canonicalize) are as much a part of
a proof as the sharded walk's; the signature cache makes the reference's repeated layers, and
ops the sharded walk checks with the same terms and layouts, dictionary lookups."""

from __future__ import annotations

import time
from dataclasses import replace

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
                inject_fault: str = "") -> None:
    """Check each rule instance of one walk (see `verify_walks`)."""
    verify_walks({"sharded": walk}, report, budget_seconds, inject_fault)


def verify_walks(walks: dict[str, Walk], report: Report, budget_seconds: float = 60.0,
                 inject_fault: str = "") -> None:
    """Check each rule instance of every walk (the reference's first, then the sharded's);
    a refuted or inconclusive one withdraws the verdict. The report's `mode` says what ran,
    with the counts of both walks together; `stats["rule_instances_by_walk"]` splits them.
    Every instance not checked (skipped: too large, over the budget) is listed in
    `report.unchecked`, and a proof that has some lists them among its assumptions."""
    start = time.perf_counter()
    counts = dict.fromkeys(_STATUSES, 0)
    by_walk: dict[str, dict[str, int]] = {}
    for name, walk in walks.items():
        own = _verify_one(name, walk, report, start, budget_seconds, inject_fault)
        by_walk[name] = own
        for status, n in own.items():
            counts[status] += n
    report.stats["rule_instances"] = dict(counts)
    if len(walks) > 1:
        report.stats["rule_instances_by_walk"] = by_walk
    report.stats["rule_check_seconds"] = round(time.perf_counter() - start, 4)
    skipped = f", {counts['skipped']} skipped (too large or over budget)" if counts[
        "skipped"] else ""
    checked = counts["proved"] + counts["refuted"] + counts["unknown"]
    ref = by_walk.get("reference")
    of_ref = (f"; {ref['proved'] + ref['refuted'] + ref['unknown']} of them in the reference "
              "walk" if ref is not None and len(walks) > 1 else "")
    report.mode = (f"Z3 checked {checked} rule instances: {counts['proved']} proved, "
                   f"{counts['refuted']} refuted, {counts['unknown']} inconclusive{skipped}"
                   f"{of_ref}")
    if report.proven and report.unchecked:
        report.assume(unchecked_assumption(len(report.unchecked)))


def _verify_one(name: str, walk: Walk, report: Report, start: float, budget_seconds: float,
                inject_fault: str) -> dict[str, int]:
    from entangle_mlir.analysis.instance.checker import (
        check_instance,  # lazy: z3 (~40 ms), not needed by --no-verify-rules
    )

    counts = dict.fromkeys(_STATUSES, 0)
    where = "" if name == "sharded" else f" in the {name} walk"
    progress = Progress(f"checking {name} rule instances with Z3", len(walk.records))
    for position, record in enumerate(walk.records):
        progress.update(position)
        if record.info.name in _SKIP or not record.outputs:
            continue
        if any(isinstance(v, Opaque) for v in record.inputs + record.outputs):
            continue
        if time.perf_counter() - start > budget_seconds:
            counts["skipped"] += 1
            report.unchecked.append(UncheckedInstance(
                name, record.info.name, record.loc,
                f"over the time budget of the rule checks ({budget_seconds:g} s)"))
            continue
        mesh = walk.mesh if record.manual_axes else None
        outputs = record.outputs
        if _faulty(inject_fault, name, record.info.name):
            outputs = [replace(v, term=scale(v.term, 2)) if isinstance(v, Rel) else v
                       for v in outputs]
        result = check_instance(record.info, record.inputs, outputs, mesh)
        status = result.status if result.status in counts else "unknown"
        counts[status] += 1
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
    progress.close()
    return counts


def _faulty(inject_fault: str, walk: str, op_name: str) -> bool:
    """Testing only: `OP` injects the fault into the sharded walk's instances of OP,
    `WALK:OP` into those of the named walk (`reference:stablehlo.add`)."""
    target_walk, _, target_op = inject_fault.rpartition(":")
    return bool(target_op) and op_name == target_op and walk == (target_walk or "sharded")
