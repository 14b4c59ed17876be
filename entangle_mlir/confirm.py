"""A bug claim is made only when it is shown: the layout tier's claims and the general tier's
refutations are confirmed by running both programs, or withdrawn (issue 18, point 3).

The layout tier reads a mismatch at one op as a bug ("all_reduce sums over 'i' of a value
split over 'i': it combines different blocks", "value is still a partial sum over 'tp' when
it leaves shard_map"). The relation it derived there is exact, but the claim that the program
is wrong is not: the reference may compute the same numbers another way (block sums by design,
a per-device cumsum, the scaling book's collective matmul). So before a report states a claim
(`core.reasons.CLAIMS`), both programs run on seeded random inputs on simulated CPU devices
(`evidence.compare_programs`), and for each claim, on the results it is about:

* some result differs: the claim stands, with a note giving the numbers (and, for the first
  diagnostic, op-level evidence at the op it names). Where the general tier refuted the
  program (its terms differ from the reference's on some inputs: a wrong rule, identity or
  expansion step would make them so too, so that is a claim like the others), both programs
  also run on those inputs (`Report.counterexample`, rounded to the arguments' types): a
  result differing there confirms a claim about it "on the counterexample" (an input random
  draws may never meet: an id equal to one constant). The general tier's own claim is
  confirmed there first, a layout claim on the random inputs first;
* every result agrees on every input it could be compared on (finite, and the reference's
  value not so sensitive to its inputs that float reassociation alone could move it past the
  tolerance): the claim is withdrawn; the diagnostic says "cannot relate ..." quoting the
  tier's reading and that the outputs agree (reason `cannot_relate`);
* the programs cannot be run (too large, jax missing, an op the CPU runtime cannot execute) or
  no finite values met: "cannot relate ... (suspected: <claim>; not confirmed: <why>)", except
  for a claim the relations show exactly (the result is k x the reference's, k != 1).

The verdict stays "not proven" in every case: this step never proves anything. A confirmed
claim (or an exact one) makes the exit code 1 (`Report.outcome` "bug"); a withdrawn or
unconfirmed one, now `cannot_relate`, claims nothing: exit code 3 ("inconclusive").
It runs by default in `entangle check` (`--no-confirm` turns it off) and in the JAX front-end
(`confirm=False`); `entangle-opt` and the driver's `check_*` functions report the tiers' own
wording (the general tier refutes only where the rule instances its terms rest on were
checked, unless `--no-verify-rules`). The fuzzers judge by execution themselves and check
thousands of mutants: they confirm only the claims on programs whose numbers match
(`fuzz.run.confirm_claims`), to count false bug reports. Importing this module does not import jax; confirming a claim does.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from dataclasses import replace

from jaxlib.mlir import ir

from entangle_mlir.core.diagnostics import Diagnostic, InputError
from entangle_mlir.core.reasons import CLAIMS
from entangle_mlir.core.report import Report
from entangle_mlir.driver import load_program
from entangle_mlir.evidence import (
    INPUT_DRAWS,
    MAX_RUN_DEVICES,
    Unavailable,
    claim_limit,
    compare_programs,
    op_evidence,
)
from entangle_mlir.mlir.compat import block_argument
from entangle_mlir.mlir.ir import context, op_key, parse_module
from entangle_mlir.mlir.opinfo import constant_value
from entangle_mlir.mlir.program import from_two_modules
from entangle_mlir.passes.general_tier import MESSAGE_PREFIX as GENERAL_PREFIX

_EXACT_NOTE = re.compile(r"^result #\d+ is .+ x the reference$")

EDGE_DRAW = (4, "edges")
"""The draw added to the random ones where the reference has integer arguments with edge
values (`input_edges`): (seed, kind) for `evidence.random_input`."""

SHOWN_PREFIXES = ("in the reference: ",)
"""Diagnostics that need no confirmation: about the reference alone (no claim on the sharded
program). The general tier's refutation is a claim like the layout tier's: it rests on the
terms the rules built and on the normal forms, and is confirmed by running both programs, on
its counterexample first."""

CONFIRMED_PREFIXES = ("confirmed by running both programs", "confirmed on the counterexample")
"""How the note of a claim running both programs confirmed begins (on random inputs, or on
the general tier's counterexample)."""


def is_claim(diagnostic: Diagnostic) -> bool:
    """Whether the diagnostic states that the program is wrong without having shown it."""
    return diagnostic.category in CLAIMS and not diagnostic.message.startswith(SHOWN_PREFIXES)


def is_confirmed(diagnostic: Diagnostic) -> bool:
    """Whether the diagnostic is a claim that running both programs confirmed."""
    return is_claim(diagnostic) and any(note.message.startswith(CONFIRMED_PREFIXES)
                                        for note in diagnostic.notes)


def exact_claim(diagnostic: Diagnostic) -> bool:
    """A claim the relations show by themselves: the result's term is k x the reference's
    (k != 1), so the values differ wherever the reference's is not zero."""
    return diagnostic.category == "scale" and any(
        _EXACT_NOTE.match(note.message) for note in diagnostic.notes)


def confirm_texts(report: Report, ref_text: str | bytes, sharded_text: str | bytes, *,
                  ref_file: str = "reference.mlir", sharded_file: str = "sharded.mlir",
                  draws=INPUT_DRAWS, at_op: bool = True) -> Report:
    """`confirm` for a report of `driver.check_texts` on the same texts."""
    return confirm(report, lambda: from_two_modules(parse_module(ref_text, ref_file),
                                                    parse_module(sharded_text, sharded_file),
                                                    ref_file, sharded_file),
                   draws=draws, at_op=at_op)


def confirm_files(report: Report, ref_path: str, sharded_path: str, *,
                  draws=INPUT_DRAWS) -> Report:
    """`confirm` for a report of `driver.check_files` on the same files (one combined file may
    be given twice)."""
    return confirm(report, lambda: load_program(ref_path, sharded_path), draws=draws)


def confirm(report: Report, load, *, draws=INPUT_DRAWS, at_op: bool = True) -> Report:
    """Confirm or withdraw every claim of a failing `report` (in place; also returned).
    `load()` gives the checked pair as fresh (not normalized) modules; `at_op`: also run the
    op a confirmed claim names (`evidence.op_evidence`)."""
    claims = [d for d in report.diagnostics if is_claim(d)]
    if report.proven or not claims:
        return report
    start = time.perf_counter()
    given = report.counterexample
    comparisons, why = None, ""
    try:
        _enough_devices(report)
        with context():
            program = load()
            edges = input_edges(program.ref_func, report.index_ranges)
        if edges:
            draws = (*draws, EDGE_DRAW)
        comparisons = compare_programs(program, draws, report.index_ranges, given=given,
                                       edges=edges)
    except ImportError as err:
        why = f"jax is not available ({err})"
    except (Unavailable, InputError) as err:
        why = str(getattr(err, "message", err))
    except Exception as err:  # noqa: BLE001 - confirmation is best effort, never a crash
        why = f"running the programs failed ({type(err).__name__}: {_first_line(err)})"
    confirmed, others = [], []
    for diagnostic in report.diagnostics:
        if not is_claim(diagnostic):
            others.append(diagnostic)
            continue
        focus = report.foci.get(_key(diagnostic))
        outputs = list(getattr(focus, "outputs", ()) or range(len(report.outputs)))
        if comparisons is None:
            others.append(_unconfirmed(diagnostic, focus, why))
            continue
        mine = [c for c in comparisons if c.index in outputs]
        on_counterexample = [c.given for c in mine if c.given is not None]
        shown = [c for c in on_counterexample if c.differs]
        differing = [c for c in mine if c.differs]
        # The general tier's claim on its own counterexample first; a layout claim on the
        # random inputs first (reproducible by their seeds), on the counterexample after.
        if shown and (_reading(diagnostic)[0] == "general" or not differing):
            confirmed.append(_confirmed_on_counterexample(diagnostic, shown[0]))
        elif differing:
            confirmed.append(_confirmed(diagnostic, differing[0], len(draws)))
        elif mine and all(c.compared for c in mine):
            agreed = bool(on_counterexample) and all(c.compared for c in on_counterexample)
            others.append(_withdrawn(diagnostic, focus, mine, len(draws), agreed))
        else:
            others.append(_unconfirmed(diagnostic, focus, f"on none of {len(draws)} random "
                                       f"inputs is the reference's {_results(outputs)} finite "
                                       "and well-conditioned"))
    first = report.diagnostics[0]
    report.diagnostics = confirmed + others
    report.evidence["confirmation"] = _summary(comparisons, why, len(draws), bool(confirmed),
                                               time.perf_counter() - start, _tiers(claims))
    if confirmed and _key(confirmed[0]) != _key(first):
        walked = getattr(report.focus, "modules", ())
        report.focus = report.foci.get(_key(confirmed[0]))
        if report.focus is not None and not report.focus.modules:
            report.focus.modules = walked
    if at_op and confirmed and report.focus is not None and "at_op" not in report.evidence:
        # The numbers at the op the confirmed claim names, when that op can be run alone.
        found = op_evidence(report.focus)
        if found.get("available"):
            report.evidence["at_op"] = found
    report.stats["confirmation seconds"] = round(time.perf_counter() - start, 4)
    return report


def _tiers(claims: list[Diagnostic]) -> str:
    """Whose claims these are, as a possessive: "layout tier's", "general tier's" or "layout
    and general tiers'"."""
    tiers = {_reading(d)[0] for d in claims}
    return f"{tiers.pop()} tier's" if len(tiers) == 1 else "layout and general tiers'"


def _key(diagnostic: Diagnostic) -> tuple[str, str]:
    return diagnostic.message, str(diagnostic.loc)


def _enough_devices(report: Report) -> None:
    """Before jax loads: as many simulated CPU devices as the mesh has (at least 8; a mesh
    larger than `MAX_RUN_DEVICES` is not run)."""
    sizes = [int(size) for size in re.findall(r"=(\d+)", report.mesh)]
    needed = min(max(math.prod(sizes), 8), MAX_RUN_DEVICES)
    flags = os.environ.get("XLA_FLAGS", "")
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={needed}").strip()
        # jax's CPU client lists its devices on stderr unless told before jaxlib loads.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _what(diagnostic: Diagnostic, focus) -> str:
    record = getattr(focus, "sharded", None)
    if record is not None and record.info.op is not None:
        return f"the value of {record.info.name.split('.')[-1]}"
    outputs = getattr(focus, "outputs", ())
    return _results(outputs) if outputs else "a value"


def _results(indices) -> str:
    indices = list(indices)
    if len(indices) == 1:
        return f"result #{indices[0]}"
    return "results " + ", ".join(f"#{i}" for i in indices)


def _confirmed(diagnostic: Diagnostic, comparison, draws: int) -> Diagnostic:
    note = Diagnostic("note", f"confirmed by running both programs on {draws} random inputs: "
                              + _differs(comparison))
    return replace(diagnostic, notes=(*diagnostic.notes, note))


def _confirmed_on_counterexample(diagnostic: Diagnostic, comparison) -> Diagnostic:
    note = Diagnostic("note", "confirmed on the counterexample by running both programs on "
                              "the general tier's inputs (rounded to the arguments' types): "
                              + _differs(comparison, seed=False))
    return replace(diagnostic, notes=(*diagnostic.notes, note))


def _differs(c, seed: bool = True) -> str:
    if c.not_finite is not None and c.max_abs_diff <= claim_limit(c.max_abs_reference):
        return (f"result #{c.index} holds inf or NaN where the reference's values are finite"
                + (f" (seed {c.not_finite})" if seed else ""))
    return (f"result #{c.index} differs from the reference by up to {c.max_abs_diff:.3g} ("
            + (f"seed {c.seed}; " if seed else "")
            + f"the reference's values reach {c.max_abs_reference:.3g})")


def _withdrawn(diagnostic: Diagnostic, focus, comparisons, draws: int,
               on_counterexample: bool = False) -> Diagnostic:
    """A claim running both programs did not confirm, as "cannot relate" quoting the tier's
    reading (`on_counterexample`: the outputs agreed on the general tier's counterexample)."""
    indices = [c.index for c in comparisons]
    agree = "agrees" if len(indices) == 1 else "agree"
    compared = min(c.inputs_compared for c in comparisons)
    inputs = f"{draws}" if compared == draws else f"{compared} of {draws}"
    left_out = "" if compared == draws else (
        "; on the others the reference's value is not finite or too sensitive to its inputs "
        "to compare")
    tier, reading = _reading(diagnostic)
    where = "on the general tier's counterexample and " if on_counterexample else ""
    message = (f"cannot relate {_what(diagnostic, focus)} to the reference (the {tier} tier's "
               f"reading \"{reading}\" was not confirmed: {_results(indices)} "
               f"{agree} with the reference {where}on {inputs} random inputs{left_out})")
    return Diagnostic(diagnostic.severity, message, diagnostic.loc, diagnostic.notes,
                      category="cannot_relate")


def _reading(diagnostic: Diagnostic) -> tuple[str, str]:
    """(which tier made the claim, its reading): the general tier's without the prefix naming
    it."""
    if diagnostic.message.startswith(GENERAL_PREFIX):
        _, _, reading = diagnostic.message.partition("): ")
        return "general", reading or diagnostic.message
    return "layout", diagnostic.message


def _unconfirmed(diagnostic: Diagnostic, focus, why: str) -> Diagnostic:
    if exact_claim(diagnostic):
        note = Diagnostic("note", f"not run ({why}); the relations show it exactly")
        return replace(diagnostic, notes=(*diagnostic.notes, note))
    message = (f"cannot relate {_what(diagnostic, focus)} to the reference (suspected: "
               f"{diagnostic.message}; not confirmed: {why})")
    return Diagnostic(diagnostic.severity, message, diagnostic.loc, diagnostic.notes,
                      category="cannot_relate")


def _summary(comparisons, why: str, draws: int, confirmed: bool, seconds: float,
             tiers: str = "layout tier's") -> dict:
    """The confirmation's record in `report.evidence["confirmation"]` (`tiers`: whose claims
    they were, as the summary names them; `counterexample`: the outputs on the general tier's
    counterexample, where it was run)."""
    out: dict = {"ran": comparisons is not None, "confirmed": confirmed, "inputs": draws,
                 "seconds": round(seconds, 4)}
    if comparisons is None:
        out["reason"] = why
        out["summary"] = f"the programs were not run to confirm the claims: {why}"
        return out
    out["outputs"] = [{"index": c.index, "compared": c.compared, "differs": c.differs,
                       "max_abs_diff": c.max_abs_diff, "max_abs_reference": c.max_abs_reference,
                       "seed": c.seed, "not_finite": c.not_finite,
                       "ill_conditioned": c.ill_conditioned,
                       "inputs_compared": c.inputs_compared} for c in comparisons]
    differing = [c for c in comparisons if c.differs]
    if differing:
        out["summary"] = f"on {draws} random inputs, " + _differs(differing[0])
    else:
        worst = max((c.max_abs_diff for c in comparisons), default=0.0)
        out["summary"] = (f"the outputs agree with the reference on {draws} random inputs "
                          f"(largest difference {worst:.1g}): the {tiers} bug claims are "
                          "withdrawn")
    given = [c.given for c in comparisons if c.given is not None]
    if given:
        out["counterexample"] = [{"index": c.index, "compared": c.compared,
                                  "differs": c.differs, "max_abs_diff": c.max_abs_diff,
                                  "max_abs_reference": c.max_abs_reference,
                                  "not_finite": c.not_finite is not None} for c in given]
    return out


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


# ----- edge values of integer inputs (the "edges" draw) ----------------------------------------

_MOVES = frozenset({"stablehlo.convert", "stablehlo.broadcast_in_dim", "stablehlo.reshape",
                    "stablehlo.transpose", "stablehlo.slice"})
"""Ops through which a compared value is still an argument, or a compared constant a constant."""

_DATA_OPS = frozenset({*_MOVES, "stablehlo.concatenate", "stablehlo.dot_general",
                       "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                       "stablehlo.negate", "stablehlo.reduce", "func.return"})
"""Integer ops that only compute with their operands' values (no index, no comparison): an
argument that meets only these (up to a convert to a float type) is data, such as quantized
int8 weights, whose sums may wrap."""


def input_edges(func: ir.Operation, index_ranges: dict[int, int] | None = None
                ) -> dict[int, tuple[int, ...]]:
    """Integer values worth drawing for the integer arguments of `func` (the reference) beside
    random ones, by argument index: for an argument compared with a constant c (through
    moves and converts, `labels >= 0` against an ignore index), c - 1, c and c + 1; for one
    that is only data (`_DATA_OPS`: int8 matmul operands), the extremes of its type, where a
    narrower sum wraps. Values outside the argument's type are left out, and so are values
    outside `index_ranges` (argument -> n: the proof assumes it indexes a dim of n, in
    [0, n); jax's negative-index wrap compares such ids with 0). An argument used otherwise
    (an index, compared with a computed value) gets no extremes: out-of-range ids are inputs
    no proof admits, not bugs."""
    block = func.regions[0].blocks[0]
    bounds = {i: _int_bounds(a.type) for i, a in enumerate(block.arguments)}
    for i, size in (index_ranges or {}).items():
        if bounds.get(i) is not None:
            bounds[i] = (max(bounds[i][0], 0), min(bounds[i][1], size - 1))
    edges: dict[int, set[int]] = {i: set() for i, b in bounds.items() if b is not None}
    for op in block.operations:
        if op.operation.name != "stablehlo.compare":
            continue
        for value, other in (op.operands[0], op.operands[1]), (op.operands[1], op.operands[0]):
            index, constant = _argument_of(value, block), _constant_of(other)
            if index in edges and constant is not None:
                edges[index] |= {constant - 1, constant, constant + 1}
    for index in edges:
        if _only_data(block.arguments[index]):
            lo, hi = bounds[index]
            edges[index] |= {lo, lo + 1, hi - 1, hi}
    return {i: tuple(sorted(v for v in values if bounds[i][0] <= v <= bounds[i][1]))
            for i, values in edges.items() if values}


def _int_bounds(tensor_type) -> tuple[int, int] | None:
    """(min, max) of an integer tensor type's elements (None for floats, booleans and
    anything but a ranked tensor)."""
    if not isinstance(tensor_type, ir.RankedTensorType):
        return None
    element = tensor_type.element_type
    if not isinstance(element, ir.IntegerType):
        return None
    integer = ir.IntegerType(element)
    width = integer.width
    if width == 1:
        return None
    if integer.is_unsigned:
        return 0, (1 << width) - 1
    return -(1 << (width - 1)), (1 << (width - 1)) - 1


def _argument_of(value, block) -> int | None:
    """The index of the argument of `block` that `value` is, through `_MOVES`."""
    while not isinstance(value.owner, ir.Block):
        op = value.owner.operation
        if op.name not in _MOVES:
            return None
        value = op.operands[0]
    argument = block_argument(value)
    return argument.arg_number if argument.owner == block else None


def _constant_of(value) -> int | None:
    """The integer a splat constant holds, through `_MOVES` (None for anything else)."""
    while not isinstance(value.owner, ir.Block):
        op = value.owner.operation
        if op.name == "stablehlo.constant":
            values, splat = constant_value(op.attributes["value"])
            if splat and values.size and float(values.flat[0]).is_integer():
                return int(values.flat[0])
            return None
        if op.name not in _MOVES:
            return None
        value = op.operands[0]
    return None


def _only_data(argument) -> bool:
    """Whether every op `argument` reaches is a `_DATA_OPS` op, stopping at converts to floats."""
    seen, todo = set(), [argument]
    while todo:
        for use in todo.pop().uses:
            op = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if op.name not in _DATA_OPS:
                return False
            if op_key(op) in seen or op.name == "func.return":
                continue
            seen.add(op_key(op))
            floats = op.name == "stablehlo.convert" and not isinstance(
                ir.RankedTensorType(op.results[0].type).element_type, ir.IntegerType)
            if not floats:
                todo.extend(op.results)
    return True
