"""Grounding a rule on whole programs: a pair (unsharded reference, shard_map body) is run on
simulated CPU devices and checked, so every "proven" and "not proven" a rule test asserts is
backed by the numbers (DESIGN.md's semantics policy: the nearest wrong program must differ when
executed and not be proven; its correct twin must agree and be proven).

Imports jax (through examples/real/catalog); the rule tests that ground programs import it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from entangle_mlir.core.report import Report
from entangle_mlir.driver import check_texts
from examples.real.catalog import Example, custom, lower_pair, run_pair_on
from examples.real.programs import ArgDef

__all__ = ["ArgDef", "Example", "assert_bug", "assert_correct", "difference", "pair"]


def pair(name: str, mesh_axes, reference: Callable, body: Callable, args, out_specs,
         bug: bool = False) -> Example:
    """A program pair (`custom`); `bug` marks the nearest wrong program."""
    return custom(name, mesh_axes, reference, body, args, out_specs,
                  "bug" if bug else "correct", bug="wrong" if bug else None)


def difference(ex: Example, inputs: list[np.ndarray]) -> float:
    """The largest absolute difference between the reference's and the sharded program's
    outputs on `inputs` (integers and booleans compared as numbers)."""
    ref, shd = run_pair_on(ex, inputs)
    assert len(ref) == len(shd)
    worst = 0.0
    for r, s in zip(ref, shd):
        assert r.shape == s.shape, (r.shape, s.shape)
        r, s = np.asarray(r, np.float64), np.asarray(s, np.float64)
        same_inf = np.isinf(r) & np.isinf(s) & (np.sign(r) == np.sign(s))
        gap = np.where(same_inf, 0.0, np.abs(r - s))
        worst = max(worst, float(np.nanmax(gap)) if gap.size else 0.0)
    return worst


def check(ex: Example, verify_rules: bool = True) -> Report:
    return check_texts(*lower_pair(ex), verify_rules=verify_rules)


def assert_correct(ex: Example, inputs: list[list[np.ndarray]], tol: float = 1e-4,
                   verify_rules: bool = True, tier: str = "layout") -> Report:
    """The programs agree on every input set (within `tol`: float sums regroup) and the
    verifier proves it, every rule instance checked by Z3, by the `tier` named ("layout":
    the rules themselves; "general": per-device expansion; "": either)."""
    for values in inputs:
        gap = difference(ex, values)
        assert gap <= tol, f"{ex.name}: the programs differ by {gap}"
    report = check(ex, verify_rules)
    assert report.proven, report.render_text()
    if tier:
        assert report.stats.get("tier") == tier, report.stats
    if verify_rules:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    return report


def assert_bug(ex: Example, inputs: list[list[np.ndarray]], tol: float = 1e-3,
               contains: str = "") -> Report:
    """The programs differ (beyond `tol`) on some input set, and the verifier does not prove
    them equal; `contains`: a phrase the report must hold."""
    gaps = [difference(ex, values) for values in inputs]
    assert max(gaps) > tol, f"{ex.name}: the programs agree ({gaps}): not a bug"
    report = check(ex, verify_rules=False)
    text = report.render_text()
    assert not report.proven, text
    assert contains in text, text
    return report
