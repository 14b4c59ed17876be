"""The verifier on the real-model corpus: correct programs are proven, buggy twins are flagged at
the line marked `# BUG`.

Where the verifier cannot do that yet, the test is a strict xfail whose reason names the construct
and what the verifier says (the table `examples/real/expected.py`, with one reproducer per cause
in `examples/real/FAILURES.md`). A buggy program must never be proven: that test has no xfail.
"""

from __future__ import annotations

import functools

import pytest

from entangle_mlir.driver import check_texts
from entangle_mlir.normalize.finite import NO_OVERFLOW
from examples.real.bugs import OMISSIONS
from examples.real.catalog import Example, bug_line, examples, lower_pair
from examples.real.expected import MISLOCATED, NOT_PROVEN, UNSOUND
from examples.real.repro import FIXED, NO_OVERFLOW_ASSUMED, Repro, reproducers
from examples.real.survey import CAUSES
from tests.shared import confirmed, confirmed_claim, per_example

EXAMPLES = examples()
CORRECT = [e for e in EXAMPLES if e.bug is None]
BUGGY = [e for e in EXAMPLES if e.bug is not None]


@functools.cache
def _report(ex: Example, assume_no_overflow: bool = False):
    ref, sharded = lower_pair(ex)
    return check_texts(ref, sharded, verify_rules=False, assume_no_overflow=assume_no_overflow)


@pytest.mark.parametrize("ex", per_example(CORRECT, NOT_PROVEN))
def test_correct_is_proven(ex: Example) -> None:
    report = _report(ex)
    assert report.proven, report.render_text()
    assert all(o.rho for o in report.outputs)


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_is_never_proven(ex: Example) -> None:
    """Soundness: no xfail here, ever."""
    report = _report(ex)
    assert not report.proven, f"SOUNDNESS: buggy program proven:\n{report.render_text()}"
    assert report.exit_code in (1, 3) and report.diagnostics


@pytest.mark.parametrize("ex", per_example(BUGGY, MISLOCATED))
def test_buggy_flagged_at_bug_line(ex: Example) -> None:
    report = _report(ex)
    path, line = bug_line(ex)
    first = report.diagnostics[0]
    assert first.loc is not None, report.render_text()
    assert (first.loc.file, first.loc.line) == (path, line), report.render_text()


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_claim_is_confirmed(ex: Example) -> None:
    """`entangle check` runs both programs before claiming a bug: every buggy program's claim
    is confirmed and keeps its wording and its location (under `--assume-no-overflow` where
    the default refuses the online softmax's fold first: a refusal, not a claim)."""
    raw = _report(ex)
    if raw.diagnostics[0].category == "overflow":
        raw = _report(ex, True)
    report = confirmed(raw, *lower_pair(ex))
    assert confirmed_claim(report), report.render_text()
    first, before = report.diagnostics[0], raw.diagnostics[0]
    assert (first.message, first.loc) == (before.message, before.loc)


# One proven program per family: every rule instance the walk used must be proved by Z3 (the
# default mode of `entangle check`); a refuted instance would be a soundness problem of a rule.
# The ring programs are proven under `--assume-no-overflow` only (`RING_OVERFLOW`).
Z3_CHECKED = ["gpt2_stack_sgd_tp4", "llama3_stack_sgd_sp_tp4", "qwen3_stack_sgd_tp4",
              "llama3_stack_scan_tp4", "ce_vocab_parallel_tp4", "gpt2_stack_gatherslice_sp_tp4",
              "moe_stack_sgd_sp_tp4", "gpt2_stack_sgd_b1_dp4", "llama3_stack_ring_cp4",
              "llama3_stack_ringloop_cp4"]


@pytest.mark.parametrize("name", Z3_CHECKED)
def test_rule_instances_of_proven_programs_are_proved_by_z3(name: str) -> None:
    ex = next(e for e in EXAMPLES if e.name == name)
    report = check_texts(*lower_pair(ex), verify_rules=True,
                         assume_no_overflow=name in RING_OVERFLOW)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


_OVERFLOW_CONSTRUCT = next(construct for key, construct, _ in CAUSES if key == "ring_overflow")
RING_OVERFLOW = sorted(name for name, reason in NOT_PROVEN.items()
                       if reason.startswith(_OVERFLOW_CONSTRUCT + ":"))
"""The correct programs not proven only because a block of their ring attention's scores may
overflow (NaN where the reference is finite, tests/normalize/test_exact_ring_overflow.py)."""


def test_ring_programs_are_the_ones_refused_for_overflow() -> None:
    assert RING_OVERFLOW == sorted(e.name for e in CORRECT if e.style == "cp ring")


@pytest.mark.parametrize("name", RING_OVERFLOW)
def test_ring_program_is_proven_assuming_no_overflow(name: str) -> None:
    """Refused by default for the overflow, proven under `--assume-no-overflow`, which the
    report lists among the assumptions."""
    ex = next(e for e in CORRECT if e.name == name)
    assert _report(ex).diagnostics[0].category == "overflow", _report(ex).render_text()
    report = _report(ex, True)
    assert report.proven, report.render_text()
    assert NO_OVERFLOW in report.assumptions, report.assumptions


def test_ring_bug_is_flagged_at_its_line_assuming_no_overflow() -> None:
    """The wrong-direction ring is refused for the overflow first by default (MISLOCATED);
    under `--assume-no-overflow` the fold goes through and the permute is flagged."""
    (ex,) = [e for e in BUGGY if e.bug == "ring_wrong_direction"]
    assert _report(ex).diagnostics[0].category == "overflow", _report(ex).render_text()
    report = _report(ex, True)
    path, line = bug_line(ex)
    first = report.diagnostics[0]
    assert not report.proven and (first.loc.file, first.loc.line) == (path, line), \
        report.render_text()


def _repro_params() -> list:
    out = []
    for r in reproducers():
        marks = () if r.cause in FIXED else (
            pytest.mark.xfail(strict=True, reason=f"{r.cause}: {r.title}"),)
        out.append(pytest.param(r, id=f"{r.cause}-{r.example.name}", marks=marks))
    return out


@pytest.mark.parametrize("repro", _repro_params())
def test_reproducer_is_proven(repro: Repro) -> None:
    """One small correct program per failure cause (FAILURES.md): proven once it is fixed
    (under `--assume-no-overflow` for the causes that need it, `repro.NO_OVERFLOW_ASSUMED`)."""
    report = _report(repro.example, repro.cause in NO_OVERFLOW_ASSUMED)
    assert report.proven, (report.render_text()
                           + f"\ngeneral tier: {report.stats.get('general_tier')}")


def test_no_buggy_program_is_proven_by_expectation() -> None:
    assert UNSOUND == []


def test_expectations_name_real_programs() -> None:
    names = {e.name for e in EXAMPLES}
    assert set(NOT_PROVEN) <= {e.name for e in CORRECT}, set(NOT_PROVEN) - names
    assert set(MISLOCATED) <= {e.name for e in BUGGY}, set(MISLOCATED) - names


def test_missing_gradient_sync_names_the_parameter_and_the_sync_it_bypassed() -> None:
    """An omitted psum emits no op: the diagnostic names the parameter (its pytree path, as jax
    records it) and the psum that synchronises the parameters laid out like it."""
    ex = next(e for e in BUGGY if e.name == "moe_stack_sgd_sp_router_grad_not_allreduced_tp4")
    first = _report(ex).diagnostics[0]
    notes = {n.message: n.loc for n in first.notes}
    assert any(m.endswith("is result[1].router") for m in notes), first.render()
    path, line = bug_line(ex)
    sync = [loc for m, loc in notes.items() if "synchronised by this stablehlo.all_reduce" in m]
    assert sync and (sync[0].file, sync[0].line) == (path, line + 1), first.render()


# An omission (a synchronisation that skips some gradients) emits no op, so no diagnostic can
# sit on its `# BUG` line. What it must say instead: the skipped parameter by name, the axis, and
# that its gradient synchronisation is missing.
OMITTED_SYNCS = {
    "router_grad_not_allreduced": ("tp", {"router"}),
    "norm_grads_not_allreduced": ("tp", {"attn_norm", "mlp_norm"}),
    "shared_head_weight_grad_not_psummed": ("tp", {"q_head_norm", "k_head_norm"}),
}


@pytest.mark.parametrize("bug", sorted(OMITTED_SYNCS))
def test_omission_names_the_parameter_and_the_missing_sync(bug: str) -> None:
    assert set(OMITTED_SYNCS) == OMISSIONS
    ex = next(e for e in BUGGY if e.bug == bug)
    axis, params = OMITTED_SYNCS[bug]
    first = _report(ex).diagnostics[0]
    assert f"still a partial sum over '{axis}'" in first.message, first.render()
    assert "gradient synchronisation of this parameter is missing" in first.message
    named = [n.message.rsplit(".", 1)[-1] for n in first.notes
             if n.message.startswith("result #") and " is result[" in n.message]
    assert named and named[0] in params, first.render()
