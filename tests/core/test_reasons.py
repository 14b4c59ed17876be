"""Every failure category the code can emit is documented in the reasons catalogue."""

from __future__ import annotations

import re

from entangle_mlir.core.reasons import BUG, CLAIMS, INCONCLUSIVE, REASONS, outcome_of
from tests.shared import REPO

SOURCES = REPO / "entangle_mlir"


def test_every_emitted_category_is_catalogued() -> None:
    emitted = set()
    for path in SOURCES.rglob("*.py"):
        emitted |= set(re.findall(r'category="([a-z_]+)"', path.read_text()))
        emitted |= set(re.findall(r'category = "([a-z_]+)"', path.read_text()))
    emitted.discard("")
    assert emitted, "no categories found"
    missing = sorted(emitted - set(REASONS))
    assert not missing, f"categories without a catalogue entry: {missing}"


def test_catalogue_entries_have_titles_and_descriptions() -> None:
    for key, (title, description) in REASONS.items():
        assert re.fullmatch(r"[a-z_]+", key)
        assert title and description and not description.endswith(".")


def test_claims_are_reasons() -> None:
    assert CLAIMS < set(REASONS)
    for key in ("unsupported", "inconclusive", "internal", "refuted", "overflow",
                "cannot_relate"):
        assert key not in CLAIMS, key


def test_outcome_of_diagnostics() -> None:
    assert outcome_of([]) == INCONCLUSIVE
    assert outcome_of([""]) == INCONCLUSIVE             # an error without a reason claims nothing
    assert outcome_of(["unsupported"]) == INCONCLUSIVE
    assert outcome_of(["cannot_relate"]) == INCONCLUSIVE
    assert outcome_of(["missing_reduction"]) == BUG
    # One result not analysable, another wrong: the bug is claimed.
    assert outcome_of(["unsupported", "scale"]) == BUG
    assert outcome_of(["scale", "inconclusive"]) == BUG
    # A rewrite refused for a possible overflow: the mismatches after it are its consequences,
    # unless running both programs confirmed them.
    assert outcome_of(["overflow", "different_function"]) == INCONCLUSIVE
    assert outcome_of(["overflow", "different_function"], confirmed=True) == BUG
