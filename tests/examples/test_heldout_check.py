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

from entangle_mlir.confirm import is_claim
from entangle_mlir.driver import check_texts
from examples.heldout.corpus import Example, bug_line, examples, lower_pair
from examples.heldout.expected import NOT_PROVEN, UNCONFIRMED, UNSOUND
from tests.shared import confirmed, confirmed_claim, per_example

EXAMPLES = examples()
CORRECT = [e for e in EXAMPLES if e.bug is None]
BUGGY = [e for e in EXAMPLES if e.bug is not None]


@functools.cache
def _report(ex: Example, verify_rules: bool):
    return check_texts(*lower_pair(ex), verify_rules=verify_rules)


@pytest.mark.parametrize("ex", per_example(CORRECT, NOT_PROVEN))
def test_correct_is_proven(ex: Example) -> None:
    report = _report(ex, True)
    assert report.proven, report.render_text()
    assert all(o.rho for o in report.outputs)
    counts = report.stats.get("rule_instances", {})
    assert counts.get("refuted", 0) == 0 and counts.get("unknown", 0) == 0, report.mode


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_is_never_proven(ex: Example) -> None:
    """Soundness: no xfail here, ever. Without the Z3 rule checks, which can only withdraw a
    proof, so this is the stronger test."""
    report = _report(ex, False)
    assert not report.proven, f"SOUNDNESS: buggy program proven:\n{report.render_text()}"
    assert report.exit_code in (1, 3) and report.diagnostics


@pytest.mark.parametrize("name", sorted(NOT_PROVEN))
def test_correct_program_gets_no_bug_claim(name: str) -> None:
    """No false bug report: a correct program the verifier does not prove gets no bug claim
    from `entangle check` (the layout tier's claims are withdrawn once both programs ran; issue
    18 point 3)."""
    ex = next(e for e in CORRECT if e.name == name)
    report = confirmed(_report(ex, False), *lower_pair(ex))
    claims = [d.message for d in report.diagnostics if is_claim(d)]
    assert not claims, report.render_text()
    assert report.exit_code == 3 and report.outcome == "inconclusive"   # no bug claimed


@pytest.mark.parametrize("ex", per_example(BUGGY, UNCONFIRMED))
def test_buggy_claim_is_confirmed(ex: Example) -> None:
    """A buggy program whose diagnostic claims a bug keeps a located claim, confirmed by
    running both programs; one flagged at its `# BUG` line stays there. (Its first claim may
    change when running shows the first one wrong and another right.) A strict xfail where
    `expected.py` lists the claim as unconfirmed (confirmation's random inputs do not reach
    the bug: small integers never wrap int8, valid labels are never ignored)."""
    raw = _report(ex, False)
    if not is_claim(raw.diagnostics[0]):
        pytest.skip(f"no claim: {raw.diagnostics[0].message[:80]}")
    report = confirmed(raw, *lower_pair(ex))
    assert confirmed_claim(report), report.render_text()
    first, before = report.diagnostics[0], raw.diagnostics[0]
    path, line = bug_line(ex)
    if before.loc is not None and (before.loc.file, before.loc.line) == (path, line):
        assert first.loc is not None and (first.loc.file, first.loc.line) == (path, line)


def test_no_buggy_program_is_proven_by_expectation() -> None:
    assert UNSOUND == []


def test_expectations_name_correct_programs() -> None:
    assert set(NOT_PROVEN) <= {e.name for e in CORRECT}, set(NOT_PROVEN) - {e.name for e in CORRECT}
    assert set(UNCONFIRMED) <= {e.name for e in BUGGY}, set(UNCONFIRMED) - {e.name for e in BUGGY}
