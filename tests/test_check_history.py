"""A check's verdict does not depend on what the process checked before: `check_program`
starts over with fresh terms (`terms.start_over`), since the normal forms order commuting
operands by when a term was first built. A check inside a check keeps its caller's terms.
A check also forgets the memos keyed by the serials of the check before (`memos.start_over`):
they do not grow with the number of checks, and forgetting them changes no report."""

from __future__ import annotations

import gc
import weakref

from entangle_mlir import driver
from entangle_mlir.core import memos, terms
from entangle_mlir.core.terms import make_arg
from tests.shared import EXAMPLES_MLIR, REF_ADD, SHARDED_ADD


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


def _pair(name: str) -> tuple[str, str]:
    ref = EXAMPLES_MLIR / f"{name}.ref.mlir"
    return ref.read_text(), ref.with_name(f"{name}.sharded.mlir").read_text()


WRONG_AXIS = "gpt2_block_psum_wrong_axis_dp2_tp4"
MISSING_PSUM = "megatron_mlp_missing_psum_tp4"
"""Two bundled twins the layout tier does not prove: the general tier's normal forms fill the
memos (`memos.PER_CHECK`) while it finds them not proven."""


def _report(name: str) -> tuple:
    report = driver.check_texts(*_pair(name), verify_rules=False)
    return report.proven, [(d.severity, d.message) for d in report.diagnostics]


def test_the_memos_do_not_grow_with_the_number_of_checks() -> None:
    """A check forgets the memos the check before it owned (`memos.start_over`): after
    checking a program, another, then the first again, every memo holds what it held after
    the first check alone; and the first check's terms are freed (nothing holds them)."""
    first = _report(WRONG_AXIS)
    after_one = memos.sizes()
    assert after_one["concat._CONCATS"] and after_one["sums._JOIN_KEYS"]
    old = [weakref.ref(t) for t in list(terms._TABLE.values())[::10]]
    assert _report(MISSING_PSUM)[0] is False
    gc.collect()
    assert not any(ref() is not None for ref in old)
    assert _report(WRONG_AXIS) == first
    assert memos.sizes() == after_one


def test_a_forgotten_memo_changes_no_verdict(monkeypatch) -> None:
    """A program checked after another gives the same report whether the memos of the check
    before were forgotten or kept (their keys name only the earlier check's terms), for a
    twin the general tier does not prove and for a program proven."""
    for name in (WRONG_AXIS, "gpt2_block_dp2_tp4"):
        _report(MISSING_PSUM)
        forgotten = _report(name)
        alone = memos.sizes()
        monkeypatch.setattr(driver, "start_over", terms.start_over)  # intern afresh only
        _report(MISSING_PSUM)
        assert _report(name) == forgotten
        kept = memos.sizes()
        assert kept["concat._CONCATS"] > alone["concat._CONCATS"]  # the earlier ones were there
        monkeypatch.undo()
