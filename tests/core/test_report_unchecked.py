"""How a report lists the rule instances Z3 did not check (issue 20): every one in JSON, at most
`UNCHECKED_LINES` places in the text, repeats at one place counted."""

from __future__ import annotations

from entangle_mlir.core.diagnostics import SourceLoc
from entangle_mlir.core.report import (
    PROVEN,
    UNCHECKED_LINES,
    Report,
    UncheckedInstance,
    unchecked_assumption,
)


def _at(line: int, walk: str = "sharded") -> UncheckedInstance:
    return UncheckedInstance(walk, "stablehlo.slice", SourceLoc("m.py", line, 3), "too large")


def test_one_instance() -> None:
    report = Report(PROVEN, unchecked=[_at(7, "reference")])
    head = ("not checked by Z3: 1 rule instance; the relation it gave rests on its rule alone "
            "(proved by Z3 lemmas at small shapes), not on a proof of this instance:")
    assert report.render_unchecked() == [
        head, "  m.py:7:3: stablehlo.slice (reference walk): too large"]
    assert "the rule instance Z3 did not check" in unchecked_assumption(1)


def test_repeats_are_counted_and_places_capped() -> None:
    many = [_at(line) for line in range(UNCHECKED_LINES + 5)] + [_at(0), _at(0)]
    report = Report(PROVEN, unchecked=many)
    lines = report.render_unchecked()
    assert lines[0].startswith(f"not checked by Z3: {len(many)} rule instances;")
    assert lines[1] == "  m.py:0:3: stablehlo.slice: too large (x3)"
    assert len(lines) == 1 + UNCHECKED_LINES + 1
    assert lines[-1] == "  ... and 5 more places (--json lists every instance)"
    document = report.to_json()["unchecked_rule_instances"]
    assert len(document) == len(many)
    assert document[0] == {"walk": "sharded", "op_name": "stablehlo.slice",
                           "location": {"file": "m.py", "line": 0, "col": 3, "op_name": ""},
                           "reason": "too large"}
    assert Report(PROVEN).render_unchecked() == []


def test_a_general_tier_proof_lists_its_own_unchecked_instances() -> None:
    """When the general tier proves the program, the instances its proof used and Z3 did not
    check replace the layout tier's, and the proof says it rests on them."""
    from entangle_mlir.analysis.general.tier import GeneralResult
    from entangle_mlir.core.report import NOT_PROVEN, OutputResult
    from entangle_mlir.passes.general_tier import apply_result

    report = Report(NOT_PROVEN, outputs=[OutputResult(0, False, "replicated on every device")],
                    unchecked=[_at(3)])
    mine = UncheckedInstance("general", "stablehlo.gather", SourceLoc("m.py", 9, 1), "too large")
    apply_result(report, GeneralResult(True, 4, unchecked=[mine]))
    assert report.proven and report.unchecked == [mine]
    assert unchecked_assumption(1) in report.assumptions
    assert report.render_unchecked()[1] == "  m.py:9:1: stablehlo.gather (general tier): too large"
    assert report.to_json()["unchecked_rule_instances"][0]["walk"] == "general"
