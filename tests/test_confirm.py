"""A bug claim is made only when it is shown (entangle_mlir/confirm.py, issue 18 point 3): the
layout tier's claims are confirmed by running both programs, withdrawn when the outputs agree,
and marked "suspected; not confirmed" when the programs cannot be run. Each program here is a
lit test of `lit_tests/diagnostics/`: the claims are real bugs (confirmed), `cannot_relate.mlir`
is a correct program the layout tier misreads (withdrawn; the general tier proves it, so it is
checked here without the general tier)."""

from __future__ import annotations

import json

import pytest

from entangle_mlir import confirm
from entangle_mlir.core.reasons import CLAIMS, REASONS, STOPPED
from entangle_mlir.driver import check_files
from entangle_mlir.evidence import Unavailable
from tests.shared import REPO

DIAGNOSTICS = REPO / "lit_tests" / "diagnostics"
WITHDRAWN = DIAGNOSTICS / "cannot_relate.mlir"
RAW_READING = "all_reduce sums over 'i' of a value split over 'i': it combines different blocks"


def _raw(path, general_tier: bool = True):
    return check_files(str(path), str(path), verify_rules=False, general_tier=general_tier)


def _confirmed(path, general_tier: bool = True):
    return confirm.confirm_files(_raw(path, general_tier), str(path), str(path))


def test_claims_are_reasons_and_cannot_relate_is_none() -> None:
    assert CLAIMS <= set(REASONS)
    assert "cannot_relate" in REASONS and "cannot_relate" not in CLAIMS
    assert not {"unsupported", "internal", "inconclusive", "refuted", "unrelated",
                "wrong_groups"} & CLAIMS
    assert STOPPED <= set(REASONS) and not STOPPED & CLAIMS


def test_correct_program_is_proven_by_the_general_tier() -> None:
    """With the general tier (the default) the misread program is proven, and the layout
    tier's reading is kept as a note, not a claim: nothing is left to confirm."""
    report = _raw(WITHDRAWN)
    assert report.proven and report.exit_code == 0, report.render_text()
    assert report.stats["tier"] == "general" and not report.diagnostics
    assert any(note.endswith(RAW_READING) and "claim was not confirmed" in note
               for note in report.notes), report.notes


def test_correct_program_claim_is_withdrawn() -> None:
    raw = _raw(WITHDRAWN, general_tier=False)
    assert [d.category for d in raw.diagnostics] == ["wrong_axis"]
    assert raw.diagnostics[0].message == RAW_READING
    assert raw.exit_code == 1                   # the raw reading claims a bug
    report = confirm.confirm_files(raw, str(WITHDRAWN), str(WITHDRAWN))
    assert not report.proven and report.exit_code == 3   # withdrawn: inconclusive
    first = report.diagnostics[0]
    assert first.category == "cannot_relate" and not confirm.is_claim(first)
    assert first.message == (
        f"cannot relate the value of all_reduce to the reference (the layout tier's reading "
        f"\"{RAW_READING}\" was not confirmed: result #0 agrees with the reference on 4 random "
        "inputs)")
    assert first.loc is not None and first.loc.line == 56
    confirmation = report.evidence["confirmation"]
    assert confirmation["ran"] and not confirmation["confirmed"]
    assert [o["differs"] for o in confirmation["outputs"]] == [False]
    assert "the layout tier's bug claims are withdrawn" in report.render_text()


@pytest.mark.parametrize("reason", sorted(CLAIMS))
def test_bug_claim_is_confirmed(reason: str) -> None:
    """Every reason's example is a real bug: running both programs confirms its claim, which
    keeps its wording and location and gains the numbers."""
    path = DIAGNOSTICS / f"{reason}.mlir"
    raw = _raw(path).diagnostics[0]
    report = _confirmed(path)
    first = report.diagnostics[0]
    assert (first.category, first.message, first.loc) == (reason, raw.message, raw.loc)
    notes = [n.message for n in first.notes if n.message.startswith("confirmed by running")]
    assert notes and ("differs from the reference" in notes[0] or "inf or NaN" in notes[0])
    assert report.evidence["confirmation"]["confirmed"]


def test_claim_not_run_is_suspected(monkeypatch) -> None:
    def unavailable(*args, **kwargs):
        raise Unavailable("the program runs on 512 devices (at most 64 are simulated)")

    monkeypatch.setattr(confirm, "compare_programs", unavailable)
    report = _confirmed(WITHDRAWN, general_tier=False)
    first = report.diagnostics[0]
    assert first.category == "cannot_relate" and report.exit_code == 3
    assert first.message == (
        f"cannot relate the value of all_reduce to the reference (suspected: {RAW_READING}; "
        "not confirmed: the program runs on 512 devices (at most 64 are simulated))")
    confirmation = report.evidence["confirmation"]
    assert not confirmation["ran"] and "512 devices" in confirmation["reason"]
    assert "the programs were not run to confirm the claims" in report.render_text()


def test_claim_without_jax_is_suspected(monkeypatch) -> None:
    def no_jax(*args, **kwargs):
        raise ImportError("No module named 'jax'")

    monkeypatch.setattr(confirm, "compare_programs", no_jax)
    first = _confirmed(DIAGNOSTICS / "missing_reduction.mlir").diagnostics[0]
    assert first.category == "cannot_relate"
    assert "(suspected: value is still a partial sum over 'tp'" in first.message
    assert "not confirmed: jax is not available" in first.message


def test_exact_claim_stands_without_running(monkeypatch) -> None:
    """A result shown to be k x the reference's (k != 1) needs no run: it keeps its claim."""
    def unavailable(*args, **kwargs):
        raise Unavailable("too large")

    monkeypatch.setattr(confirm, "compare_programs", unavailable)
    path = DIAGNOSTICS / "scale.mlir"
    raw = _raw(path).diagnostics[0]
    assert confirm.exact_claim(raw), raw.render()
    first = _confirmed(path).diagnostics[0]
    assert (first.category, first.message) == ("scale", raw.message)
    assert any("the relations show it exactly" in n.message for n in first.notes)


def test_no_claim_no_run(monkeypatch) -> None:
    """Diagnostics that claim no bug (unsupported, ...) are left alone: nothing runs."""
    def fail(*args, **kwargs):
        raise AssertionError("ran the programs without a claim")

    monkeypatch.setattr(confirm, "compare_programs", fail)
    path = DIAGNOSTICS / "unsupported.mlir"
    report = _confirmed(path)
    assert report.diagnostics[0].category == "unsupported"
    assert "confirmation" not in report.evidence


def test_cli_confirms_by_default_and_no_confirm_keeps_the_reading(entangle) -> None:
    run = entangle("check", WITHDRAWN, "--no-general-tier")
    assert run.code == 3, run.text
    assert f"error: cannot relate the value of all_reduce to the reference (the layout tier's " \
           f"reading \"{RAW_READING}\"" in run.out
    raw = entangle("check", WITHDRAWN, "--no-general-tier", "--no-confirm")
    assert raw.code == 1, raw.text
    assert f"error: {RAW_READING}" in raw.out and "evidence:" not in raw.out
    document = json.loads(entangle("check", WITHDRAWN, "--no-general-tier", "--json").out)
    assert document["diagnostics"][0]["reason"] == "cannot_relate"
    assert document["evidence"]["confirmation"]["ran"] is True


def test_confirmed_claim_shows_the_numbers(entangle) -> None:
    run = entangle("check", DIAGNOSTICS / "missing_reduction.mlir", "--no-verify-rules")
    assert run.code == 1, run.text
    assert "note: confirmed by running both programs on 4 random inputs: result #0 differs " \
           "from the reference by up to" in run.out
    assert "not proven: value is still a partial sum over 'tp'" in run.out
