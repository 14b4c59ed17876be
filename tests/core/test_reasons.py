"""Every failure category the code can emit is documented in the reasons catalogue."""

from __future__ import annotations

import re

from entangle_mlir.core.reasons import REASONS
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
