"""Proof-backed repair: where the general tier does not prove a program the report claims is
wrong, the one place whose nearest alternative makes it proven names the bug (issue 19).

The layout tier stops at the first op it cannot relate, and the general tier says proven or
not: neither names the place where a pipeline schedule goes wrong (a ppermute in the wrong
direction, an off-by-one step index, the outputs taken from the wrong stage, a bubble step
not masked, gradients not accumulated or summed where the reference averages). The places
that carry a schedule's decisions are few, and each has few near alternatives. So, on the
program as the user wrote it (calls inlined, nothing else rewritten), the repair lists the
places in the backward cone of the failing output (`repair_sites.find_sites`): ops carrying a
decision (a permute's pairs, an integer constant in step or device index arithmetic, a
select's branches), each changed, and places in a loop where an op may be missing (a mask on
a value added to a carry, an accumulation of a carry replaced on every step, a division of a
carried sum), each inserted.

Each alternative is applied alone to a fresh copy of the program, which is normalized and
decided by the general tier again (without the Z3 rule-instance checks; the winner is
re-decided with them where the check had them). A claim is made only where the report
already claims the program is wrong (exit code 1), every alternative was decided within the
bounds and the alternatives of exactly one place make the program proven: the report's first
diagnostic then names that place, says what the program does there and what makes it proven
("the program is proven when it moves them by +1", "... when that value is masked by ..."):
that is what was shown, no more (other edits elsewhere may prove it as well; none at one
place does). Otherwise nothing is said beyond `stats["repair"]` (bounded, no edit proves it,
several do). A proven program is never repaired.

The bounds are work, not time, so the claim is the same on a loaded machine: at most
`MAX_CANDIDATES` alternatives are decided, each with `CANDIDATE_WORK_MS` of Z3 work per query
(`analysis/solver.WORK_PER_MS` units a millisecond). `CANDIDATE_WALL_SECONDS` is only a safety
net: an alternative that runs into it makes the search bounded (no claim), never another one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from jaxlib.mlir import ir

from entangle_mlir.analysis.refine import EvidenceFocus
from entangle_mlir.core.diagnostics import Diagnostic
from entangle_mlir.core.report import Report
from entangle_mlir.mlir.ir import context, ops_in_order, parse_module
from entangle_mlir.mlir.program import Program, find_function, func_name, inline_calls
from entangle_mlir.passes import PASSES
from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline
from entangle_mlir.repair_sites import Alternative, Site, find_sites

MAX_CANDIDATES = 48
"""The most alternatives decided (over all places); beyond it the search is bounded: no
claim."""
CANDIDATE_WORK_MS = 5_000
"""One alternative's Z3 budget per query, in work (the check's own general-tier budget)."""
CANDIDATE_WALL_SECONDS = 120.0
"""A safety net in wall time for one alternative's general tier (a machine so loaded, or an
edit so costly, that the work bounds take too long): out of it the search is bounded."""

MESSAGE_PREFIX = "repair ("
"""How a repair's diagnostic begins."""


@dataclass
class Snapshot:
    """The pair as given, before normalization rewrites it in place: clones of its modules
    (the reference's, and the sharded one's when it is another module) and the functions'
    names."""

    ref: ir.Operation
    sharded: ir.Operation | None
    ref_name: str
    sharded_name: str
    ref_file: str
    sharded_file: str


def snapshot(program: Program) -> Snapshot:
    """Clone the pair before the pipeline normalizes it (cheap: no text is printed)."""
    same = program.sharded_module is program.ref_module
    return Snapshot(program.ref_module.operation.clone(),
                    None if same else program.sharded_module.operation.clone(),
                    func_name(program.ref_func), func_name(program.sharded_func),
                    program.ref_file, program.sharded_file)


def restored(snap: Snapshot) -> Program:
    """The pair as it was snapshotted, parsed anew (within a `context()`): for a second check
    of it (`driver.check_program`'s check under `--assume-no-overflow`)."""
    ref = parse_module(snap.ref.get_asm(enable_debug_info=True), snap.ref_file)
    sharded = ref if snap.sharded is None else parse_module(
        snap.sharded.get_asm(enable_debug_info=True), snap.sharded_file)
    return Program(ref, sharded, find_function(ref, snap.ref_name),
                   find_function(sharded, snap.sharded_name), snap.ref_file,
                   snap.sharded_file)


def wants_repair(report: Report) -> bool:
    """Whether the repair may run: not proven, the general tier ran and did not prove it, and
    the report claims the program is wrong (a repair relocates a claim, never makes one)."""
    tier = report.stats.get("general_tier")
    return (not report.proven and report.exit_code == 1 and isinstance(tier, dict)
            and not tier.get("proven"))


def repair(report: Report, snap: Snapshot, reference: tuple[str, object] | None = None, *,
           verify_rules: bool = True, assume_no_overflow: bool = False,
           jobs: int | None = None, max_candidates: int = MAX_CANDIDATES,
           work_ms: int = CANDIDATE_WORK_MS) -> None:
    """Search single edits of the program (an op changed or inserted) that make the general
    tier prove it (module docstring); where exactly one place's do, put the claim first in
    `report` (in place). `stats["repair"]` says what was tried either way. `reference`: the
    normalized reference function's text and the check's walk of it, reused where an edited
    pair normalizes the reference to the same text."""
    if not wants_repair(report):
        return
    start = time.perf_counter()
    output = None  # the cone of every result: a training step's results share their loops
    with context():
        base = _inlined_text(snap)
        module = parse_module(base, snap.sharded_file)
        func = find_function(module, snap.sharded_name)
        sites = find_sites(module, func, snap.sharded_file, output)
    stats: dict = {"sites": len(sites), "candidates": sum(len(s.alternatives) for s in sites),
                   "tried": 0, "proven_by": []}
    report.stats["repair"] = stats
    if stats["candidates"] > max_candidates:
        stats["bounded"] = f"more than {max_candidates} alternatives"
        return
    ref_text = None if snap.sharded is None else snap.ref.get_asm(enable_debug_info=True)
    decide = partial(_decide, snap, base, ref_text, reference,
                     assume_no_overflow=assume_no_overflow, jobs=jobs, work_ms=work_ms)
    proving: list[tuple[Site, Alternative]] = []
    for site in sites:
        for alternative in site.alternatives:
            stats["tried"] += 1
            proven, reason = decide(site, alternative, verify=False)
            if _out_of_time(reason):
                stats["bounded"] = (f"an alternative ran past {CANDIDATE_WALL_SECONDS:g} s "
                                    f"(wall-clock safety net): {site.name} at {site.loc}: "
                                    f"{alternative.what}")
                return
            if proven:
                proving.append((site, alternative))
                stats["proven_by"].append(f"{site.name} at {site.loc}: {alternative.what}")
                break  # the site's other alternatives would name the same place
    stats["seconds"] = round(time.perf_counter() - start, 3)
    if len(proving) != 1:
        return
    site, alternative = proving[0]
    if verify_rules:
        proven, reason = decide(site, alternative, verify=True)
        if not proven:
            stats["proven_by"] = []
            stats["not_claimed"] = ("out of time checking the edited program's rule instances"
                                    if _out_of_time(reason) else
                                    "the edited program's rule instances did not all check")
            return
    tried = stats["tried"]
    subject = site.subject or site.name.removeprefix("stablehlo.")
    message = (f"{MESSAGE_PREFIX}{tried} single edits tried at {len(sites)} places): "
               f"{subject} {site.does}; the program is proven when {alternative.what} (the "
               "only place whose edit proves it)")
    notes = tuple(Diagnostic("note", f"before the repair: {d.message}", d.loc,
                             category=d.category) for d in report.diagnostics[:1])
    diagnostic = Diagnostic("error", message, site.loc, notes, category="different_function")
    report.diagnostics.insert(0, diagnostic)
    outputs = (tuple(range(len(report.outputs))) if output is None else (output,))
    report.foci[(message, str(site.loc))] = EvidenceFocus(
        unavailable="a repair names an op of the sharded program alone", outputs=outputs)
    stats["claimed"] = f"{site.name} at {site.loc}"


def _out_of_time(reason: str) -> bool:
    """Whether the general tier stopped at its wall-clock safety net (its reasons say so)."""
    return "out of time" in reason


def _inlined_text(snap: Snapshot) -> str:
    """The sharded module as given with its calls inlined (each source op once, the loop
    bodies in their loops): the program the sites index."""
    source = snap.sharded if snap.sharded is not None else snap.ref
    module = parse_module(source.get_asm(enable_debug_info=True), snap.sharded_file)
    inline_calls(module, snap.sharded_file)
    return module.operation.get_asm(enable_debug_info=True)


def _decide(snap: Snapshot, base: str, ref_text: str | None,
            reference: tuple[str, object] | None, site: Site, alternative: Alternative, *,
            verify: bool, assume_no_overflow: bool, jobs: int | None,
            work_ms: int) -> tuple[bool, str]:
    """(whether the general tier proves the program with `alternative` applied at `site`, its
    reason where not) (`verify`: as the check decides, with its rule instances checked; else
    only whether the outputs are proven)."""
    from entangle_mlir.analysis.general.tier import (
        run_general_tier,  # lazy: z3 and the semantics (~0.2 s); only when a bug is claimed
    )

    with context():
        sharded = parse_module(base, snap.sharded_file)
        ops = [op for _, op in ops_in_order(sharded)]
        for index, position in site.targets:
            alternative.apply(ops[index], position, ops)
        ref = sharded if ref_text is None else parse_module(ref_text, snap.ref_file)
        program = Program(ref, sharded, find_function(ref, snap.ref_name),
                          find_function(sharded, snap.sharded_name), snap.ref_file,
                          snap.sharded_file)
        state = PassState(sharded, snap.sharded_file, program=program)
        normalize = "{assume-no-overflow=true}" if assume_no_overflow else ""
        try:
            run_pipeline(parse_pipeline(f"entangle-normalize{normalize}", PASSES), state)
        except Exception:  # noqa: BLE001 - an edit the normalizer refuses proves nothing
            return False, "the normalizer refused the edited program"
        walk = None
        if reference is not None and program.ref_func.get_asm() == reference[0]:
            walk = reference[1]
        result = run_general_tier(program, walk, budget_seconds=CANDIDATE_WALL_SECONDS,
                                  timeout_ms=work_ms, verify_rules=verify, jobs=jobs,
                                  assume_no_overflow=assume_no_overflow,
                                  prove_only=not verify, layer_templates=False)
    return result.proven, result.reason
