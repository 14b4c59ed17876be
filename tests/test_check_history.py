"""A check's verdict does not depend on what the process checked before: `check_program`
starts over with fresh terms (`terms.start_over`), since the normal forms order commuting
operands by when a term was first built. A check inside a check keeps its caller's terms."""

from __future__ import annotations

from entangle_mlir import driver
from entangle_mlir.core.terms import make_arg
from tests.shared import REF_ADD, SHARDED_ADD


def test_a_check_builds_its_terms_afresh() -> None:
    before = make_arg(0, (8, 4), "f32")
    assert make_arg(0, (8, 4), "f32") is before
    assert driver.check_texts(REF_ADD, SHARDED_ADD, verify_rules=False).proven
    after = make_arg(0, (8, 4), "f32")
    assert after is not before and after.serial > before.serial


def test_a_check_inside_a_check_keeps_its_callers_terms(monkeypatch) -> None:
    outer = driver._check_program
    seen: list[bool] = []

    def with_a_check_inside(program, **options):
        if not seen:
            seen.append(True)
            mine = make_arg(0, (8, 4), "f32")
            seen.append(driver.check_texts(REF_ADD, SHARDED_ADD, verify_rules=False).proven)
            seen.append(make_arg(0, (8, 4), "f32") is mine)
        return outer(program, **options)

    monkeypatch.setattr(driver, "_check_program", with_a_check_inside)
    assert driver.check_texts(REF_ADD, SHARDED_ADD, verify_rules=False).proven
    assert seen == [True, True, True]
