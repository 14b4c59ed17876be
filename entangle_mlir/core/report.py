"""The verdict of a check: ρ per output, diagnostics, notes; as text or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from entangle_mlir.core.diagnostics import Diagnostic, SourceLoc
from entangle_mlir.core.reasons import BUG, INCONCLUSIVE, outcome_of

PROVEN = "proven"
NOT_PROVEN = "not proven"

EXIT_CODES = {PROVEN: 0, BUG: 1, "bad input": 2, INCONCLUSIVE: 3}
"""`entangle check`'s exit code per outcome: proven, not proven because the program is shown or
claimed wrong, input that cannot be used, not proven because the check could not decide."""

INCONCLUSIVE_WORDS = ("the check could not decide; it does not claim the program is wrong "
                      "(exit code 3)")
"""The text report's line for an inconclusive outcome."""

REASSOCIATION = "float sums and products are reassociated and regrouped"
FINITE_INPUTS = "inputs hold no NaN or Inf"
BASE_ASSUMPTIONS = (REASSOCIATION, FINITE_INPUTS)
"""The two liberties every proof takes (DESIGN.md, "Semantics policy"); anything else a proof
rests on is added with `Report.assume` (valid indices, XLA's rounding of constants)."""


UNCHECKED_LINES = 20
"""At most this many unchecked rule instances are listed in the text report (all in JSON)."""


@dataclass(frozen=True)
class UncheckedInstance:
    """A rule instance a walk used that Z3 did not check (too large to check and not reducible,
    over the time budget, an op without Z3 semantics): the relation it gave rests on its rule
    alone (the rule's lemmas are proved by Z3 at small shapes, this instance is not). `walk`
    is "reference", "sharded", or "general" (the general tier's per-device expansion)."""

    walk: str
    op_name: str
    loc: SourceLoc | None
    reason: str

    def render(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        walk = {"sharded": "", "general": " (general tier)"}.get(self.walk,
                                                               f" ({self.walk} walk)")
        return f"{where}{self.op_name}{walk}: {self.reason}"

    def to_json(self) -> dict:
        loc = None
        if self.loc:
            loc = {"file": self.loc.file, "line": self.loc.line, "col": self.loc.col,
                   "op_name": self.loc.op_name}
        return {"walk": self.walk, "op_name": self.op_name, "location": loc,
                "reason": self.reason}


def unchecked_assumption(count: int) -> str:
    """The assumption a proof with `count` unchecked rule instances rests on."""
    if count == 1:
        return ("the rule instance Z3 did not check (listed after `rule checks:`) is sound: "
                "the relation it gave rests on its rule, not on a proof of this instance")
    return (f"the {count} rule instances Z3 did not check (listed after `rule checks:`) are "
            "sound: the relations they gave rest on their rules, not on proofs of these "
            "instances")


@dataclass
class OutputResult:
    index: int
    proven: bool
    rho: str
    term: str = ""
    name: str = ""
    """The result's pytree path as jax records it (`result['grads']['w1']`), '' when the
    program names none (or only `result`, `result[0]`)."""
    partition_spec: str = ""
    """The declared layout as a PartitionSpec (`P('dp', None)`), '' when there is none."""

    @property
    def label(self) -> str:
        """How the text report names the result: its pytree path, else `result#N`."""
        return f"{self.name} (result#{self.index})" if self.name else f"result#{self.index}"


@dataclass
class Report:
    verdict: str
    outputs: list[OutputResult] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mode: str = ""
    mesh: str = ""
    stats: dict = field(default_factory=dict)
    explainer: object = field(default=None, repr=False)
    evidence: dict = field(default_factory=dict)
    focus: object = field(default=None, repr=False)
    foci: dict = field(default_factory=dict, repr=False)
    """Where each diagnostic points, by (message, location): the `refine.EvidenceFocus` with
    the op it names and the results it is about (what `confirm.py` runs)."""
    index_ranges: dict[int, int] = field(default_factory=dict, repr=False)
    """Of a failing check: integer inputs the reference uses as indices, with the size of the
    dim they index (input #i -> n: valid values are [0, n)); random inputs draw from there."""
    counterexample: dict | None = field(default=None, repr=False)
    """Of a failing check: inputs on which the general tier found an output to differ from the
    reference's (argument index -> exact values), its rule instances checked; `confirm.py`
    runs both programs on them first (not in the JSON: the diagnostic shows some)."""
    unchecked: list[UncheckedInstance] = field(default_factory=list)
    """The rule instances the proof used that Z3 did not check (`analysis/verify.py`, and the
    general tier's when it proves the program)."""
    assumptions: list[str] = field(default_factory=lambda: list(BASE_ASSUMPTIONS))
    """What the verdict rests on, in words: always `BASE_ASSUMPTIONS`, then what the proof
    used (`assume`)."""
    html_page: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    """Renders the HTML page (`html_report.py`): handed in by the driver, which holds the
    walks and programs the page draws (core cannot import the top layer)."""

    def assume(self, assumption: str) -> None:
        """Add an assumption the proof rests on (once)."""
        if assumption not in self.assumptions:
            self.assumptions.append(assumption)

    @property
    def explanations(self) -> list[list[str]]:
        """For each output, the chain of relations that builds it (computed on demand)."""
        if callable(self.explainer):
            self.explainer = self.explainer()
        return self.explainer or []

    @property
    def proven(self) -> bool:
        return self.verdict == PROVEN

    @property
    def outcome(self) -> str:
        """"proven", or why not: "bug" when a diagnostic claims the program is wrong,
        "inconclusive" when the check could not decide (`core/reasons.py`, `outcome_of`)."""
        if self.proven:
            return PROVEN
        confirmed = bool((self.evidence.get("confirmation") or {}).get("confirmed"))
        return outcome_of((d.category for d in self.diagnostics if d.severity == "error"),
                          confirmed)

    @property
    def exit_code(self) -> int:
        """0 proven, 1 shown or claimed wrong, 3 inconclusive (2, bad input, is raised as
        `InputError` before any report exists)."""
        return EXIT_CODES[self.outcome]

    def render_explanation(self) -> str:
        lines = []
        for index, chain in enumerate(self.explanations):
            lines.append(f"result#{index} is built by:")
            lines.extend(f"  {step}" for step in chain)
        return "\n".join(lines)

    def render_failure(self) -> str:
        """A failed check as a test failure: the first diagnostic's own line first (what a
        test runner shows in its summary), then the whole report."""
        first = self.diagnostics[0].render().split("\n")[0] if self.diagnostics else (
            "not proven")
        return f"{first}\n\n{self.render_text()}"

    def render_text(self) -> str:
        lines = [d.render() for d in self.diagnostics]
        if self.proven:
            lines.append(f"verified: the sharded program refines the reference"
                         f"{' on mesh ' + self.mesh if self.mesh else ''}")
        else:
            reason = self.diagnostics[0].message if self.diagnostics else "unknown reason"
            lines.append(f"not proven: {reason}")
        for out in self.outputs:
            mark = "" if out.proven else "  (not proven)"
            spec = f"  [{out.partition_spec}]" if out.partition_spec else ""
            lines.append(f"  {out.label} = {out.rho}{spec}{mark}")
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.outcome == INCONCLUSIVE:
            lines.append(f"inconclusive: {INCONCLUSIVE_WORDS}")
        confirmation = self.evidence.get("confirmation") or {}
        if confirmation.get("summary") and not confirmation.get("confirmed"):
            # (a confirmed claim carries the numbers in its own note)
            lines.append(f"evidence: {confirmation['summary']}")
        at_op = self.evidence.get("at_op") or {}
        if at_op.get("summary"):
            lines.append(f"evidence: {at_op['summary']}")
        if self.evidence.get("summary"):
            lines.append(f"evidence: {self.evidence['summary']}")
        if self.proven:
            lines.append("assumptions:")
            lines.extend(f"  - {assumption}" for assumption in self.assumptions)
        if self.mode:
            lines.append(f"rule checks: {self.mode}")
        lines.extend(self.render_unchecked())
        return "\n".join(lines)

    def render_unchecked(self) -> list[str]:
        """The rule instances Z3 did not check, one line per place (repeats counted), at most
        `UNCHECKED_LINES` of them; none when every instance was checked."""
        if not self.unchecked:
            return []
        count = len(self.unchecked)
        if count == 1:
            head = ("not checked by Z3: 1 rule instance; the relation it gave rests on its "
                    "rule alone (proved by Z3 lemmas at small shapes), not on a proof of this "
                    "instance:")
        else:
            head = (f"not checked by Z3: {count} rule instances; the relations they gave rest "
                    "on their rules alone (proved by Z3 lemmas at small shapes), not on a "
                    "proof of these instances:")
        lines = [head]
        places = dict.fromkeys(u.render() for u in self.unchecked)
        repeats = {place: 0 for place in places}
        for u in self.unchecked:
            repeats[u.render()] += 1
        for place in list(places)[:UNCHECKED_LINES]:
            times = f" (x{repeats[place]})" if repeats[place] > 1 else ""
            lines.append(f"  {place}{times}")
        if len(places) > UNCHECKED_LINES:
            lines.append(f"  ... and {len(places) - UNCHECKED_LINES} more places "
                         "(--json lists every instance)")
        return lines

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "mesh": self.mesh,
            "outputs": [{"index": o.index, "name": o.name, "partition_spec": o.partition_spec,
                         "proven": o.proven, "rho": o.rho, "term": o.term}
                        for o in self.outputs],
            "diagnostics": [d.to_json() for d in self.diagnostics],
            "notes": list(self.notes),
            "assumptions": list(self.assumptions),
            "rule_check_mode": self.mode,
            "unchecked_rule_instances": [u.to_json() for u in self.unchecked],
            "stats": self.stats,
            "explanations": self.explanations,
            "evidence": self.evidence,
        }

    def to_html(self) -> str:
        """The report as one self-contained HTML page: both programs side by side, each op
        coloured by its relation, the diverging op next to its diagnostic, every input and
        output as a device grid (`entangle check --html`)."""
        if self.html_page is None:
            raise ValueError("this report has no HTML page: only reports of entangle_mlir."
                             "driver's checks (and the Python API's) have one")
        return self.html_page()

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)
