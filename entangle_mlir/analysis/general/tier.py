"""The general tier's run (docs/architecture.md, "General tier").

`run_general_tier(program, reference_walk)` expands the sharded function (`expand.py`),
decides every per-device agreement and every output against the reference (`decide.py`) and
has Z3 check every rule instance the expansion used (for a proof, and for a refutation: both
rest on the terms the instances built). Its `GeneralResult` says whether every output is
proven, and if not, why (and, where inputs on which they differ were found, a counterexample
naming the device).
"""

from __future__ import annotations

import contextvars
import ctypes
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from entangle_mlir.analysis.budget import Budget
from entangle_mlir.analysis.general import MAX_DEVICES
from entangle_mlir.analysis.general.backward_templates import prove_backward_template
from entangle_mlir.analysis.general.decide import Decider, Decision
from entangle_mlir.analysis.general.expand import Expansion, Instance, NotExpanded
from entangle_mlir.analysis.general.gradient_templates import prove_gradient_templates
from entangle_mlir.analysis.general.layer_templates import (
    Applications,
    TemplateExpansion,
    TemplateWalker,
    prove_layer_template,
)
from entangle_mlir.analysis.infer import Walk, Walker, describe_type
from entangle_mlir.core import memos
from entangle_mlir.core.diagnostics import SourceLoc
from entangle_mlir.core.normal_form import slice_term
from entangle_mlir.core.relations import Rel
from entangle_mlir.core.report import UncheckedInstance
from entangle_mlir.core.terms import HOLE_BASE, Term, subterms
from entangle_mlir.mlir.program import Program

T = TypeVar("T")
_SUMMARIES = ("region_result",)
_NOT_INSTANCES = ("sdy.manual_computation", "func.return", "func.func", "stablehlo.return",
                  "sdy.return")
"""Records of the walk outside manual computations that are no rule instance."""
PIECE_BUDGET_SHARE = 5
"""A device's block, decided only to name it where the whole value is not proven, gets this
share (1/5) of a decision's Z3 budget."""


@dataclass
class GeneralResult:
    """What the general tier decided.

    `proven`: every output (and every per-device agreement) proven; else `reason` says the
    first thing that was not, at `loc` (an op of the sharded program, when one is to blame),
    and `refuted` whether inputs were found where the sharded program's value differs (then
    `counterexample` names some of them): only where every rule instance the terms rest on
    was checked, when `verify_rules` (as for a proof)."""

    proven: bool
    devices: int = 0
    reason: str = ""
    loc: SourceLoc | None = None
    refuted: bool = False
    counterexample: dict[str, str] | None = None
    assumptions: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    inputs: dict[int, np.ndarray] | None = field(default=None, repr=False)
    """Of a refutation: the inputs it was found on (argument index -> exact values), on which
    the terms as built differ; what running both programs confirms it on (`confirm.py`)."""
    output: int | None = None
    """Of a refutation: the program result it is about (None: a per-device agreement of a
    manual computation's result, which may reach any)."""
    unchecked: list[UncheckedInstance] = field(default_factory=list)
    """The rule instances of a proof that Z3 did not check (too large, no Z3 semantics)."""
    internal: bool = False
    """Whether the tier stopped on a limit or defect of its own (Python's recursion limit, an
    exception), not on anything it decided about the program: the report says so in a note
    (`passes/general_tier.apply_result`), since the verdict then says nothing the tier found."""


def run_general_tier(program: Program, reference: Walk | None = None, **options
                     ) -> GeneralResult:
    """`general_tier` (below), where terms nesting too deeply for the recursive parts of the
    term builders, or an error of the tier itself, is "not proven" (with the reason) rather
    than bad input or a crash: the layout tier's verdict stands."""
    try:
        with _recursion_limit(RECURSION_LIMIT):
            return _on_deep_stack(lambda: general_tier(program, reference, **options))
    except RecursionError:
        return GeneralResult(False, reason="the terms nest too deeply for the general tier",
                             internal=True)
    except Exception as err:  # noqa: BLE001 - a defect of the tier is "not proven", not a crash
        return GeneralResult(False, reason=f"internal error of the general tier: {err!r}",
                             internal=True)


RECURSION_LIMIT = 8_000
"""Python's recursion limit while the tier runs (1000 by default). The normal form
normalizes a rewrite at once (`normal_form._renormal`), and a rewrite's new terms can hold
the next layer's (a reshape pushed through a stack's sums a layer at a time): 5 frames a
level, 1.5 levels a layer, so the default stops at ~130 layers (the 405B 128-layer
pipeline). Normalizing such rewrites later instead (in the fixpoint's next pass, past 48
nested) builds the terms in another order, which the normal form depends on, and was slow:
128 layers at test widths did not finish in 7 CPU minutes (90 s to the recursion error
before). Most frames of that recursion are Python calls, which CPython 3.11 runs without
growing the C stack; where a C function sits in the chain (`sorted`'s key, a C cache
wrapper) each level takes C stack too, and 8000 of them overflow the main thread's 8 MiB (a
segfault, not a RecursionError): the tier runs on a thread with `STACK_BYTES` of stack."""

STACK_BYTES = 256 * 2**20
"""The general tier's thread's stack: room for `RECURSION_LIMIT` frames each entering C
(~1.3 KiB each in CPython 3.11: 8 MiB overflowed below 2000 levels of three), so the limit
is met as a RecursionError. Address space only: untouched pages take no memory."""

IN_THREAD = True
"""Whether the tier runs on its own thread (`STACK_BYTES`); a profiler hooking the calling
thread only (cProfile) needs it False."""


def _on_deep_stack(call: Callable[[], T]) -> T:
    """`call()` on a thread with a `STACK_BYTES` stack (in this thread where `IN_THREAD` is
    off or no such thread can start), its result or its exception. It runs in a copy of the
    caller's context: a new thread starts with every context variable at its default, and the
    tier reads the caller's (the inputs' names, `terms.ARG_NAMES`; the normalizing judge)."""
    if not IN_THREAD:
        return call()
    outcome: dict[str, object] = {}
    done = threading.Event()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome["value"] = context.run(call)
        except BaseException as err:  # noqa: BLE001 - re-raised in the calling thread
            outcome["error"] = err
        finally:
            done.set()

    previous = threading.stack_size()
    try:
        threading.stack_size(STACK_BYTES)
        worker = threading.Thread(target=run, name="entangle-general-tier", daemon=True)
        worker.start()
    except (RuntimeError, ValueError, MemoryError):
        return call()
    finally:
        threading.stack_size(previous)
    interrupted = _joined(worker, done)
    if interrupted is not None:
        raise interrupted
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _joined(worker: threading.Thread, done: threading.Event) -> BaseException | None:
    """Wait for `worker` (`done`: set as it ends). An exception a signal handler raises here
    meanwhile (a caller's time limit, Ctrl-C) is raised in `worker` too, where the tier runs,
    and waited for, so that no tier is left running beside the caller's next work; it is
    returned (the last, if several) for the caller to raise, as it would have been without
    the thread. (`done`, not `join`: an interrupted `join` may take the thread for ended.)"""
    interrupted = None
    while not done.is_set():
        try:
            done.wait()
        except BaseException as err:  # noqa: BLE001 - passed on to the tier, then re-raised
            interrupted = err
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident),
                                                       ctypes.py_object(type(err)))
    worker.join()
    return interrupted


@contextmanager
def _recursion_limit(limit: int) -> Iterator[None]:
    """Python's recursion limit raised to at least `limit` inside the block."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


BACKWARD_TEMPLATES = True
"""Whether the try with a layer template also proves and uses the backward layer's template
(`backward_templates.py`: each layer's outgoing cotangent named by a leaf, so the cotangent
stream stays linear in depth too); only where the layer templates are on."""

GRADIENT_TEMPLATES = True
"""Whether the try with the backward template also proves and uses the weight gradients'
templates (`gradient_templates.py`: each layer's weight gradient on a row block named by a
leaf, the reference's the sum of its blocks' leaves); only where the backward's is proven."""


def general_tier(program: Program, reference: Walk | None = None, *,
                 layer_templates: bool = True, **options) -> GeneralResult:
    """`expanded_tier`, with a proven layer template first where `layer_templates`
    (`layer_templates.py`): each layer of its signature, in both programs, gives its stream
    output as the template applied to its inputs (a leaf naming that application), so the
    terms stay linear in depth. That try only asks whether everything is proven
    (`prove_only`: it stops at the first value not proven); where it is not, the tier runs
    again with every layer expanded, so the verdict and diagnostics of a program not proven
    never come from the abstraction. The fallback runs on the terms and memos as they were
    before the try (`memos.restore`), since the normal form depends on the order terms are
    built in and on what its memos met, so it reaches the forms of a check that never
    tried. The try itself starts from an empty intern table (`memos.start_over`; it walks
    the reference again itself), so it does not depend on what the passes before it built
    (the MLP pipeline at L80 is proven through the template from an empty table, not after
    the layout tier's terms)."""
    note = None
    if layer_templates:
        before = memos.saved()
        memos.start_over()
        note = _with_template(program, options)
        if isinstance(note, GeneralResult):
            return note
        memos.restore(before)
    result = expanded_tier(program, reference, **options)
    if note is not None:
        result.stats["layer_template"] = note
    return result


def _with_template(program: Program, options: dict) -> GeneralResult | dict | None:
    """The tier's try with a proven layer template: its result where proven, else what the
    try did (a note for the stats; None where no template is proven). An error of the try
    is a note too: the tier then runs as without it."""
    start = time.perf_counter()
    try:
        proof = prove_layer_template(program)
        if not proof.proven:
            return None
        templates = [proof.template]
        backward = prove_backward_template(program, proof.template) if BACKWARD_TEMPLATES \
            else None
        gradients = []
        if backward is not None and backward.proven:
            templates.append(backward.template)
            if GRADIENT_TEMPLATES:
                gradients = prove_gradient_templates(program, proof.template)
                templates.extend(gradients)
        result = expanded_tier(program, None, template=templates,
                               **{**options, "prove_only": True})
    except Exception as err:  # noqa: BLE001 - the try is an optimization; the tier runs as before
        return {"error": repr(err), "seconds": round(time.perf_counter() - start, 4)}
    note = {"proof": proof.template.decision,
            "reference_layers": result.stats.pop("reference_layers", 0),
            "sharded_layers": result.stats.pop("sharded_layers", 0),
            "seconds": round(time.perf_counter() - start, 4)}
    if backward is not None:
        note["backward"] = backward.template.decision if backward.proven else backward.reason
        note["backward_layers"] = result.stats.pop("backward_layers", [0, 0])
    if gradients:
        note["gradients"] = len(gradients)
        note["gradient_sites"] = result.stats.pop("gradient_sites", [0, 0])
    if result.proven:
        result.stats["layer_template"] = note
        return result
    note["not_proven"] = result.reason
    return note


def expanded_tier(program: Program, reference: Walk | None = None, *,
                  max_devices: int = MAX_DEVICES, budget_seconds: float = 30.0,
                  timeout_ms: int = 5_000, verify_rules: bool = True,
                  jobs: int | None = None, assume_no_overflow: bool = False,
                  prove_only: bool = False, template=None) -> GeneralResult:
    """Expand `program`'s sharded function per device and decide its outputs against the
    reference (`reference`: the reference's walk, re-walked when it summarized layers).
    `verify_rules`: Z3 checks every rule instance the proof rests on, the reference walk's
    and the expansion's (off only as `--no-verify-rules` turns every check off); `jobs`:
    worker processes for those checks (`instance.parallel.check_batch`).
    `assume_no_overflow`: a product with zero of a value finite unless something overflows
    is zero (`--assume-no-overflow`; listed among the assumptions where a proof uses it).
    `prove_only`: only whether it is proven matters (`repair.py` tries many edits): a value
    not proven is neither decided block by block nor its refutation grounded.
    `template`: proven `layer_templates.LayerTemplate`s (a list, or one) both programs'
    layers of their signatures are abstracted by (`TemplateWalker`, `TemplateExpansion`)."""
    start = time.perf_counter()
    budget = Budget(budget_seconds)
    out_of_time = budget.over
    if template is not None:
        memo: dict = {}
        apps = [Applications(t, memo) for t in (template if isinstance(template, list)
                                                 else [template])]
        walker = TemplateWalker(program, apps)
        reference = walker.run()
    elif reference is None or not _plain(reference):
        reference = Walker(program.ref_func, program.ref_module, program.ref_file).run()
    wants = reference.outputs
    if any(not isinstance(w, Rel) for w in wants):
        return GeneralResult(False, reason="the reference itself is not analysed")
    reference_args = [(tuple(t.shape), t.dtype) for t in (
        describe_type(a.type) for a in program.ref_func.regions[0].blocks[0].arguments)]
    if template is not None:
        expansion = TemplateExpansion(program, apps, walker.wholes, max_devices,
                                      out_of_time, reference_args)
    else:
        expansion = Expansion(program.sharded_func, program.sharded_module,
                              program.sharded_file, max_devices, out_of_time, reference_args)
    try:
        walk = expansion.run()
    except NotExpanded as refusal:
        return GeneralResult(False, expansion.stats.devices, refusal.reason, refusal.loc,
                             stats=_stats(expansion, start))
    if expansion.mesh is None:
        return GeneralResult(False, reason="no manual computation to expand")
    devices = expansion.stats.devices
    gots = walk.outputs
    if len(gots) != len(wants) or any(not isinstance(g, Rel) for g in gots):
        return GeneralResult(False, devices, "an output has no term",
                             stats=_stats(expansion, start))
    for i, (w, g) in enumerate(zip(wants, gots)):
        if expansion.per_device_mode and w.term.shape != g.term.shape:
            return GeneralResult(False, devices, f"result #{i}'s blocks make {g.term.shape}, "
                                 f"the reference's is {w.term.shape} (padded or uneven shards "
                                 "are not expanded)", stats=_stats(expansion, start))
    decider = Decider([w.term for w in wants], timeout_ms, assume_no_overflow)
    assumptions: list[str] = []
    agreements = [(o.want, o.got, o.what, o.against, o.loc, {}, None)
                  for o in expansion.obligations]
    results = [(w.term, g.term, f"result #{i}", "the reference", walk.return_record.loc
                if walk.return_record else None, expansion.blocks, i)
               for i, (w, g) in enumerate(zip(wants, gots))]
    # With a template the results go first: the normal form's memo depends on what it met
    # before, and the results' forms (a weight gradient summed over micro-batches) join
    # where they are normalized before the devices' agreements (the 32-layer pipeline).
    checks = results + agreements if template is not None else agreements + results
    decided = 0
    for want, got, what, against, loc, names, output in checks:
        if out_of_time():
            return GeneralResult(False, devices, "out of time", stats=_stats(expansion, start))
        # The whole value at once (one evaluation of the reference's term); where that is
        # not proven, block by block, to name the device whose block is wrong. A block's
        # decision only names it (the value stays unproven), so it gets a fifth of the Z3
        # budget: enough to find a counterexample, not to spend a proof's search on it.
        decision = decider.decide(want, got, f"general.{decided}", ground=not prove_only)
        decided += 1
        if not decision.proved and template is not None:
            decision = _by_rows(decider, want, got, f"general.{decided}") or decision
        if not decision.proved and prove_only:
            return GeneralResult(False, devices, f"{what} is not proven", loc,
                                 stats=_stats(expansion, start))
        if not decision.proved:
            for piece_want, piece_got, piece_what in _pieces(want, got, what, names):
                if piece_got is got or out_of_time():
                    break  # out of time: the whole value's decision stands
                piece = decider.decide(piece_want, piece_got, f"general.{decided}",
                                       max(1, timeout_ms // PIECE_BUDGET_SHARE))
                decided += 1
                if not piece.proved and (piece.status == "refuted"
                                         or decision.status != "refuted"):
                    decision, what = piece, piece_what
                    break
            result = _not_proven(decision, names.get(got.serial, what), against, loc,
                                 devices, expansion, start)
            if result.refuted:
                result.output = output
                if verify_rules:
                    _trust_refutation(result, expansion, reference, start, budget, jobs)
            return result
        assumptions.extend(a for a in decision.assumptions if a not in assumptions)
    problem = _check_instances(expansion, reference, budget, jobs) if verify_rules else ""
    stats = _stats(expansion, start)
    stats["decisions"] = decided
    if template is not None:
        stats["reference_layers"] = walker.by_template[0]
        stats["sharded_layers"] = expansion.by_template[0]
        if len(apps) > 1:
            stats["backward_layers"] = [walker.by_template[1], expansion.by_template[1]]
        if len(apps) > 2:
            stats["gradient_sites"] = [sum(walker.by_template[2:]),
                                       sum(expansion.by_template[2:])]
    if problem:
        return GeneralResult(False, devices, problem, stats=stats)
    return GeneralResult(True, devices, assumptions=assumptions, stats=stats,
                         unchecked=getattr(expansion, "unchecked", []))


MAX_ROWS = 1024
"""The most rows of dim 0 `_by_rows` decides one by one."""


def _by_rows(decider: Decider, want: Term, got: Term, name: str) -> Decision | None:
    """`want == got` decided row by row along dim 0 (exact: two tensors are equal exactly
    when each row is), proven where every row is (a stack of layers' weights whose rows meet
    in normal form one by one where the whole did not: the normal form's joins depend on
    what it met before); None otherwise."""
    if not want.shape or not 1 < want.shape[0] <= MAX_ROWS or want.shape != got.shape:
        return None
    assumptions: list[str] = []
    for row in range(want.shape[0]):
        decision = decider.decide(slice_term(want, 0, row, row + 1),
                                  slice_term(got, 0, row, row + 1), f"{name}.row{row}",
                                  ground=False)
        if not decision.proved:
            return None
        assumptions.extend(a for a in decision.assumptions if a not in assumptions)
    return Decision("proved", assumptions=assumptions, how="row by row")


def _plain(walk: Walk) -> bool:
    """Whether a walk's outputs are terms over the inputs (no summarized layer in them)."""
    terms = [v.term for v in walk.outputs if isinstance(v, Rel)]
    return not any(t.op in _SUMMARIES or t.op == "arg" and t.attrs[0] >= HOLE_BASE
                   for t in subterms(terms))


def _pieces(want: Term, got: Term, what: str, names: dict[int, str]):
    """The equality `want == got` as equalities of blocks: when `got` is a concatenation (the
    devices' blocks of a result), each piece against the same rows of `want` (exact: a
    concatenation equals a term exactly when each piece equals its rows). `names` says which
    device's block a piece is, where it is one."""
    if got.op != "concatenate" or want is got:
        yield want, got, names.get(got.serial, what)
        return
    (dim,) = got.attrs
    row = 0
    for piece in got.args:
        size = piece.shape[dim]
        yield from _pieces(slice_term(want, dim, row, row + size), piece,
                           f"rows {row}..{row + size - 1} of dim {dim} of {what}", names)
        row += size


def _not_proven(decision: Decision, what: str, against: str, loc, devices: int,
                expansion: Expansion, start: float) -> GeneralResult:
    if decision.status == "refuted":
        reason = (f"{what} differs from {against} for some inputs"
                  + (f" ({decision.reason})" if decision.reason else ""))
    else:
        reason = f"{what} is not shown equal to {against}: {decision.reason}"
    return GeneralResult(False, devices, reason, loc, decision.status == "refuted",
                         decision.counterexample, stats=_stats(expansion, start),
                         inputs=decision.inputs)


def _trust_refutation(result: GeneralResult, expansion: Expansion, reference: Walk,
                      start: float, budget: Budget, jobs: int | None) -> None:
    """A refutation rests on the same terms a proof would: every rule instance they were
    built from is checked (`_check_instances`); where one is refuted or inconclusive, or time
    runs out, the terms may not compute what the programs do, so nothing is refuted (the
    reason says why)."""
    problem = _check_instances(expansion, reference, budget, jobs)
    result.stats = _stats(expansion, start)
    if problem:
        result.refuted, result.counterexample, result.inputs = False, None, None
        result.reason += f"; not claimed: {problem}"


def _check_instances(expansion: Expansion, reference: Walk, budget: Budget,
                     jobs: int | None) -> str:
    """Every rule instance the proof rests on, checked by Z3 (global scope): the reference
    walk's, those of the sharded function outside manual computations, and the expansion's
    (identical ones once: the checker caches them). '' when none is refuted or inconclusive,
    else what went wrong. Those Z3 skips (too large, no Z3 semantics) are kept in
    `expansion.unchecked`: a proof lists them."""
    from entangle_mlir.analysis.instance.parallel import (
        check_batch,  # lazy: z3 (~40 ms); only when the general tier runs
    )

    counts = {"proved": 0, "refuted": 0, "unknown": 0, "skipped": 0}
    problem = ""
    walked = [(walk, Instance(r.info, r.inputs, r.outputs))
              for walk, records in (("reference", reference.records),
                                    ("general", expansion.walk.records))
              for r in records
              if r.info.name not in _NOT_INSTANCES and r.outputs
              and all(type(v) is Rel for v in r.inputs + r.outputs)]
    walked += [("general", i) for i in expansion.instances]
    unchecked: list[UncheckedInstance] = []
    expansion.unchecked = unchecked
    results = check_batch([(i.info, i.inputs, i.outputs, None) for _, i in walked], jobs=jobs,
                          budget=budget)
    try:
        for (walk, instance), result in zip(walked, results):
            if result is None:
                return "out of time checking the rule instances"
            status = result.status if result.status in counts else "unknown"
            counts[status] += 1
            if status == "skipped":
                unchecked.append(UncheckedInstance(walk, instance.info.name, instance.info.loc,
                                                   result.reason or "not checked"))
            if status in ("refuted", "unknown") and not problem:
                problem = (f"the rule instance for {instance.info.name} "
                           f"{'was refuted' if status == 'refuted' else 'is inconclusive'}"
                           f"{': ' + result.reason if result.reason else ''}")
    finally:
        results.close()
    expansion.instance_counts = counts
    return problem


def _stats(expansion: Expansion, start: float) -> dict:
    stats = {"devices": expansion.stats.devices, "ops": expansion.stats.ops,
             "computed": expansion.stats.computed,
             "seconds": round(time.perf_counter() - start, 4)}
    if expansion.stats.symmetric:
        stats["symmetric_axes"] = list(expansion.stats.symmetric)
        stats["renamed"] = expansion.stats.renamed
    counts = getattr(expansion, "instance_counts", None)
    if counts is not None:
        stats["rule_instances"] = dict(counts)
    loops = expansion.loop_stats
    if loops.solved or loops.fallbacks:
        stats["loops"] = {"by_invariant": loops.solved, "trips": loops.trips,
                          "term_work": loops.term_work, "invariants": loops.invariants,
                          "not_by_invariant": loops.fallbacks}
    return stats
