"""Every example in the catalogue: correct programs are proven, buggy twins are flagged at the
line marked `# BUG` (the numbers of each pair are compared in test_examples_grounded.py)."""

from __future__ import annotations

import functools

import pytest

from entangle_mlir.driver import check_texts
from examples.catalog import EXAMPLES, Example, bug_line, lower_pair
from tests.shared import confirmed, confirmed_claim, per_example


@functools.cache
def _report(name: str):
    ex = next(e for e in EXAMPLES if e.name == name)
    ref, sharded = lower_pair(ex)
    return check_texts(ref, sharded, verify_rules=False)


CORRECT = [e for e in EXAMPLES if e.bug is None]
BUGGY = [e for e in EXAMPLES if e.bug is not None]


@pytest.mark.parametrize("ex", per_example(CORRECT))
def test_correct_example_is_proven(ex: Example) -> None:
    report = _report(ex.name)
    assert report.proven, report.render_text()
    assert all(o.rho for o in report.outputs)


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_example_is_flagged_at_its_line(ex: Example) -> None:
    report = _report(ex.name)
    assert not report.proven
    assert report.exit_code == 1
    first = report.diagnostics[0]
    path, line = bug_line(ex)
    assert first.loc is not None, report.render_text()
    assert first.loc.file.endswith("models.py") and path.endswith("models.py")
    assert first.loc.line == line, report.render_text()


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_example_claim_is_confirmed(ex: Example) -> None:
    """`entangle check` runs both programs before claiming a bug: every buggy twin's claim is
    confirmed and keeps its wording and its line."""
    raw = _report(ex.name)
    report = confirmed(raw, *lower_pair(ex))
    assert confirmed_claim(report), report.render_text()
    first, before = report.diagnostics[0], raw.diagnostics[0]
    assert (first.message, first.loc) == (before.message, before.loc)


_REASONS = {
    "missing_psum": ["partial sum over 'tp'", "missing all_reduce/psum"],
    "pmean": ["1/"],
    "bias_before_psum": ["partial sum over 'tp'", "counted"],
    "gelu_before_psum": ["nonlinear op", "partial sum over 'tp'"],
    "all_gather_wrong_dim": ["all_gather concatenates along dim"],
    "local_stats": ["partial sum over 'tp'"],
    "psum_wrong_axis": ["'dp'"],
}


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_example_reason_names_the_axis(ex: Example) -> None:
    message = _report(ex.name).diagnostics[0].message
    for fragment in _REASONS[ex.bug]:
        assert fragment in message, message


def test_jax_front_end_check_and_assert_refines() -> None:
    import jax
    from jax.sharding import NamedSharding

    from entangle_mlir.jax import assert_refines, check
    from examples.catalog import by_name, make_mesh, reference_fn, sharded_fn

    good, bad = by_name("megatron_mlp_tp4"), by_name("megatron_mlp_missing_psum_tp4")
    mesh = make_mesh(good)
    avals = [jax.ShapeDtypeStruct(s, "float32", sharding=NamedSharding(mesh, spec))
             for s, spec in zip(good.arg_shapes, good.in_specs)]
    report = check(reference_fn(good), sharded_fn(good), *avals, verify_rules=False)
    assert report.proven and report.outputs[0].rho == "replicated on every device"
    flagged = check(reference_fn(bad), sharded_fn(bad), *avals, verify_rules=False)
    assert not flagged.proven and flagged.evidence["max_abs_diff"][0] > 1e-3
    assert "differ by up to" in flagged.render_text()
    with pytest.raises(AssertionError, match="missing all_reduce/psum"):
        assert_refines(reference_fn(bad), sharded_fn(bad), *avals, verify_rules=False)
