"""The verifier on the held-out corpus (examples/heldout/: programs written the way other people
write them, grounded by tests/examples/test_heldout_grounded.py).

A correct program must be proven, with every rule instance proved by Z3, unless it is listed in
`examples/heldout/expected.py` NOT_PROVEN: then the test is a strict xfail whose reason is the
verifier's first diagnostic (regenerate the file with `python -m examples.heldout.survey
--write` when the verifier changes). A buggy program must never be proven: that test has no
xfail, and the expected false proofs (UNSOUND) must stay empty.
"""

from __future__ import annotations

import functools

import pytest

from entangle_mlir.driver import check_texts
from examples.heldout.corpus import Example, examples, lower_pair
from examples.heldout.expected import NOT_PROVEN, UNSOUND

EXAMPLES = examples()
CORRECT = [e for e in EXAMPLES if e.bug is None]
BUGGY = [e for e in EXAMPLES if e.bug is not None]


@functools.cache
def _report(ex: Example, verify_rules: bool):
    return check_texts(*lower_pair(ex), verify_rules=verify_rules)


def _params(items: list[Example], xfails: dict[str, str]) -> list:
    return [pytest.param(ex, id=ex.name, marks=(
        (pytest.mark.xfail(strict=True, reason=xfails[ex.name]),) if ex.name in xfails else ()))
        for ex in items]


@pytest.mark.parametrize("ex", _params(CORRECT, NOT_PROVEN))
def test_correct_is_proven(ex: Example) -> None:
    report = _report(ex, True)
    assert report.proven, report.render_text()
    assert all(o.rho for o in report.outputs)
    counts = report.stats.get("rule_instances", {})
    assert counts.get("refuted", 0) == 0 and counts.get("unknown", 0) == 0, report.mode


@pytest.mark.parametrize("ex", BUGGY, ids=[e.name for e in BUGGY])
def test_buggy_is_never_proven(ex: Example) -> None:
    """Soundness: no xfail here, ever. Without the Z3 rule checks, which can only withdraw a
    proof, so this is the stronger test."""
    report = _report(ex, False)
    assert not report.proven, f"SOUNDNESS: buggy program proven:\n{report.render_text()}"
    assert report.exit_code == 1 and report.diagnostics


def test_no_buggy_program_is_proven_by_expectation() -> None:
    assert UNSOUND == []


def test_expectations_name_correct_programs() -> None:
    assert set(NOT_PROVEN) <= {e.name for e in CORRECT}, set(NOT_PROVEN) - {e.name for e in CORRECT}
