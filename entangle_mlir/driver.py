"""`check`: the whole pipeline on a reference/sharded pair, returning a `Report`."""

from __future__ import annotations

import os
import time
from functools import partial

from entangle_mlir.analysis.layer_reuse import recheck_op_by_op
from entangle_mlir.analysis.refine import EvidenceFocus
from entangle_mlir.core.diagnostics import Diagnostic, InputError, parse_location
from entangle_mlir.core.memos import start_over
from entangle_mlir.core.report import NOT_PROVEN, Report
from entangle_mlir.html_report import to_html
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.load import load_data, load_file
from entangle_mlir.mlir.program import Program, from_combined, from_two_modules, has_refines
from entangle_mlir.normalize.finite import Refusal
from entangle_mlir.passes import PASSES
from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline
from entangle_mlir.repair import Snapshot, repair, restored, snapshot, wants_repair


def check_program(program: Program, **options) -> Report:
    """`_check_program` (its options), where a defect or limit of the checker itself (an
    exception that is not bad input) is "not proven", inconclusive, with the error named,
    never a traceback: the check decided nothing. Python's recursion limit is such a limit:
    the parser refuses text nesting deeper than `mlir.ir.MAX_NESTING`, so terms nesting too
    deeply for a recursive walk are the checker's limit, not bad input.

    A check starts over with fresh terms and forgets the memos the check before owned
    (`memos.start_over`), so its verdict does not depend on what the process checked before
    and a long-lived process does not keep every check's terms; a check inside a check
    (`_check_assuming_no_overflow`) shares its caller's terms and memos, which the caller's
    repair still compares with."""
    global _DEPTH
    if _DEPTH == 0:
        start_over()
    _DEPTH += 1
    try:
        return _check_program(program, **options)
    except InputError:
        raise
    except RecursionError:
        return _internal("the terms nest too deeply for the checker's recursive walks")
    except Exception as err:  # noqa: BLE001 - a defect of the checker is "not proven"
        return _internal(f"internal error of the checker ({type(err).__name__}: {err})")
    finally:
        _DEPTH -= 1


_DEPTH = 0
"""How many `check_program` calls are running (one inside another)."""


def _internal(what: str) -> Report:
    return Report(NOT_PROVEN, diagnostics=[Diagnostic(
        "error", f"{what}: the check could not decide; please report this",
        category="internal")])


def _check_program(program: Program, *, verify_rules: bool = True,
                   reuse_layers: bool = True, assume_no_overflow: bool = False,
                   general_tier: bool = True, jobs: int | None = None,
                   repair_bugs: bool = False, general_budget: int = 30,
                   layer_templates: bool = True) -> Report:
    """Normalize, walk both functions, compare; optionally Z3-check every rule instance.

    `reuse_layers` walks repeated layers once (`analysis/layer_reuse.py`); without it every
    op gets its relation, which `--explain`, `--json` and `--html` show. `assume_no_overflow`: sums
    and products of finite values are taken as finite (`normalize/finite.py`; listed among
    the assumptions where a proof relies on it). `general_tier`: where the layout tier does
    not prove the program, expand it per device (`analysis/general/`). `jobs`: worker
    processes for the Z3 rule-instance checks (None or 0: one per free core, 1: serial;
    `analysis/instance/parallel.py`): the same verdict either way. `general_budget`: the
    general tier's CPU seconds (`analysis/budget.py`; expansion, decisions and its
    rule-instance checks; out of time: not proven). `repair_bugs`: where the report claims a
    bug the general tier did not prove away, name the one op whose nearest alternative makes
    the program proven (`repair.py`). `layer_templates`: the general tier first tries one
    layer's proof reused for every layer (`analysis/general/layer_templates.py`); where that
    is not proven it expands every layer, so the verdict never rests on the try."""
    start = time.perf_counter()
    pristine = snapshot(program) if (general_tier and repair_bugs) or not assume_no_overflow \
        else None
    verify = f"entangle-verify-rules{{jobs={max(0, jobs or 0)}}}"
    check = ["entangle-check-refinement"] + ([verify] if verify_rules else [])
    state = PassState(program.sharded_module, program.sharded_file, program=program)
    with context():
        normalize = "{assume-no-overflow=true}" if assume_no_overflow else ""
        run_pipeline(parse_pipeline(f"entangle-normalize{normalize},entangle-import-shardings,"
                                    "entangle-infer-relations{annotate=false reuse-layers="
                                    f"{str(reuse_layers).lower()}}},entangle-check-refinement"
                                    "{verdict-only-after-reuse=true}",
                                    PASSES), state)
        reused = dict(state.layers_reused)
        if verify_rules and not recheck_op_by_op(state.report.proven, reused):
            run_pipeline(parse_pipeline(verify, PASSES), state)
        if recheck_op_by_op(state.report.proven, reused):
            state.walks, state.diagnostics = {}, []
            run_pipeline(parse_pipeline(",".join(
                ["entangle-infer-relations{annotate=false}"] + check), PASSES), state)
            reused = {}
        if general_tier:
            run_pipeline(parse_pipeline("entangle-general-tier{verify-rules="
                                        f"{str(verify_rules).lower()} jobs={max(0, jobs or 0)} "
                                        f"budget-seconds={general_budget} layer-templates="
                                        f"{str(layer_templates).lower()}}}", PASSES), state)
    report = state.report
    if report.proven:
        report.stats.setdefault("tier", "layout")
    guards = [r for r in (state.finiteness.refusals if state.finiteness else []) if r.guard]
    if pristine is not None and guards and not report.proven:
        _check_assuming_no_overflow(report, pristine, guards[0], verify_rules=verify_rules,
                                    reuse_layers=reuse_layers, general_tier=general_tier,
                                    jobs=jobs, general_budget=general_budget,
                                    layer_templates=layer_templates)
    if pristine is not None and general_tier and repair_bugs and wants_repair(report):
        with context():
            reference = (program.ref_func.get_asm(), state.walks.get("reference"))
            repair(report, pristine, reference, verify_rules=verify_rules,
                   assume_no_overflow=assume_no_overflow, jobs=jobs)
    if reused.get("reference"):
        report.stats["layers reused"] = (f"{reused['reference']} reference and "
                                         f"{reused.get('sharded', 0)} sharded regions "
                                         "summarized")
    if not verify_rules:
        report.mode = "skipped (--no-verify-rules): rule instances were not checked by Z3"
    report.stats["seconds"] = round(time.perf_counter() - start, 4)
    report.html_page = partial(to_html, report, dict(state.walks), program)
    return report


def _check_assuming_no_overflow(report: Report, pristine: Snapshot, guard: Refusal,
                                **options) -> None:
    """A pair not proven where the strict mode kept a guard (`finite.Refusal.guard`): check
    it again under `--assume-no-overflow`; where that proves it, the guard is the reason
    (first, in place), and the proof under the assumption a note."""
    with context():
        assumed = check_program(restored(pristine), assume_no_overflow=True, **options)
    report.stats["assuming no overflow"] = assumed.verdict
    if not assumed.proven:
        return
    notes = (Diagnostic("note", "checked again assuming no intermediate overflow "
                        "(--assume-no-overflow): proven", None, category=""),)
    report.diagnostics.insert(0, Diagnostic(
        "error", guard.message, parse_location(guard.location, guard.file), notes,
        category="overflow"))
    report.focus = EvidenceFocus(unavailable="the programs differ only where a value "
                                 "overflows: no op diverges on finite values")


def check_texts(ref_text: str, sharded_text: str, *, ref_file: str = "reference.mlir",
                sharded_file: str = "sharded.mlir", **options) -> Report:
    """The pair given as texts; `options`: `_check_program`'s."""
    ref = parse_module(ref_text, ref_file)
    sharded = parse_module(sharded_text, sharded_file)
    return check_program(from_two_modules(ref, sharded, ref_file, sharded_file), **options)


def check_files(ref_path: str, sharded_path: str, **options) -> Report:
    """`entangle check REF SHARDED`; a single combined file may be given as both.
    `options`: `_check_program`'s."""
    if _same_file(ref_path, sharded_path):
        return check_combined_file(ref_path, **options)
    ref = load_file(ref_path)
    sharded = load_file(sharded_path)
    return check_program(from_two_modules(ref, sharded, ref_path, sharded_path), **options)


def load_program(ref_path: str, sharded_path: str) -> Program:
    """The pair `entangle check REF SHARDED` checks, as loaded (not normalized): what running
    both programs needs (`confirm.py`, `evidence.program_evidence`). One combined file may be
    given as both."""
    with context():
        if _same_file(ref_path, sharded_path):
            return from_combined(load_file(ref_path), ref_path)
        return from_two_modules(load_file(ref_path), load_file(sharded_path), ref_path,
                                sharded_path)


def load_program_data(ref: tuple[str, bytes], sharded: tuple[str, bytes] | None) -> Program:
    """The pair from files' (path, bytes), as `load_program` loads it from the files (the
    bytes travel, for `entangle check-many` on other machines); `sharded` None: `ref` is one
    combined file."""
    if sharded is None:
        module = load_data(ref[1], ref[0])
        if not has_refines(module):
            raise InputError("no function carries `entangle.refines = @reference`", file=ref[0])
        return from_combined(module, ref[0])
    return from_two_modules(load_data(ref[1], ref[0]), load_data(sharded[1], sharded[0]),
                            ref[0], sharded[0])


def _same_file(a: str, b: str) -> bool:
    try:
        return a == b or os.path.samefile(a, b)
    except OSError:
        return False


def check_combined_file(path: str, **options) -> Report:
    """One file holding both functions; `options`: `_check_program`'s."""
    module = load_file(path)
    if not has_refines(module):
        raise InputError("no function carries `entangle.refines = @reference`", file=path)
    return check_program(from_combined(module, path), **options)


def check_with_pipeline(path: str, pipeline: str) -> Report:
    """The report of an explicit entangle-opt pipeline on a combined file (for pass options
    `entangle check` does not expose, such as entangle-verify-rules{inject-fault=...})."""
    state = PassState(load_file(path), path)
    with context():
        run_pipeline(parse_pipeline(pipeline, PASSES), state)
    return state.report
