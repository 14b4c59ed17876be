"""Pipeline parallelism (issue 19): the programs of examples/pipelines.py, grounded by running
them on simulated CPU devices, then checked.

Every correct program (GPipe forward of GPT-2 and Llama stacks, a circular schedule, pp x tp,
GPipe and 1F1B training steps with a hand-written backward, 1F1B on dp x pp x tp) computes
its reference's numbers and is proven by the general tier; one is proven with every rule
instance checked by Z3 (exit 0). A training step by `jax.grad` of the pipelined loss is
proven only under --assume-no-overflow: its bubble steps multiply values computed on garbage
by zero cotangents, NaN where those overflow, and the reason says so. Every buggy twin
computes other numbers, is not proven, and its claim is confirmed by running both programs;
the claim names the first op the layout tier cannot relate (the stage's input feed, a
`where` on the stage index), not the `# BUG` line. With `repair_bugs=True` (`--repair`,
`entangle_mlir/repair.py`) all eight twins' bugs are named on these full-size twins (5-30 s
of CPU each, too slow for this file): the changed ops (ppermutes backwards, skipping a stage,
sending gradients forward, the output slot off by one, the outputs taken from the first
stage) at their `# BUG` line, the missing ones (a bubble not masked, gradients not
accumulated, summed where the reference averages) at their caller's line or the loop making
the sum; tests/test_repair.py shows it on the same schedules with a one-matmul stage.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import functools
import inspect
import linecache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entangle_mlir.confirm import is_confirmed
from entangle_mlir.driver import check_texts
from examples import pipelines
from examples.heldout.corpus import (
    FAST_COMPILE,
    Example,
    bug_line,
    lower_pair,
    random_arg,
    run_sharded,
)
from tests.shared import confirmed

PROGRAMS = pipelines.programs()
AUTODIFF = [e for e in PROGRAMS if e.wrap is not None]
CORRECT = [e for e in PROGRAMS if e.bug is None and e.wrap is None]
BUGGY = [e for e in PROGRAMS if e.bug is not None]
FULLY_VERIFIED = "onef1b_train_gpt2_pp2"
SCHEDULES = {"gpipe_fwd": pipelines.gpipe_forward, "gpipe_train": pipelines.gpipe_train,
             "onef1b": pipelines.onef1b_train}


def _ids(items: list[Example]) -> list[str]:
    return [e.name for e in items]


@functools.cache
def _inputs(ex: Example) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return tuple(random_arg(a, rng) for a in ex.args)


@functools.cache
def _reference_outputs(reference, args: tuple) -> tuple[np.ndarray, ...]:
    """The reference's outputs on the seed-0 inputs; twins share their reference's run."""
    rng = np.random.default_rng(0)
    inputs = [random_arg(a, rng) for a in args]
    shapes = [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in args]
    compiled = jax.jit(reference).lower(*shapes).compile(compiler_options=FAST_COMPILE)
    return tuple(np.asarray(o) for o in jax.tree.leaves(compiled(*inputs)))


def _error(ex: Example) -> float:
    """The sharded program's largest difference from its reference on the seed-0 inputs,
    relative to the reference's magnitude where it exceeds 1."""
    want = _reference_outputs(ex.reference, ex.args)
    got = run_sharded(ex, list(_inputs(ex)))
    assert len(got) == len(want)
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        scale = max(1.0, float(np.max(np.abs(w))))
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))) / scale)
    return worst


@functools.cache
def _report(ex: Example, assume_no_overflow: bool = False):
    return check_texts(*lower_pair(ex), verify_rules=False,
                       assume_no_overflow=assume_no_overflow)


@pytest.mark.parametrize("ex", CORRECT, ids=_ids(CORRECT))
def test_correct_program_computes_its_reference_and_is_proven(ex: Example) -> None:
    assert _error(ex) < 1e-5, ex.name
    report = _report(ex)
    assert report.proven and report.exit_code == 0, report.render_text()
    assert report.stats["general_tier"]["proven"]


def test_a_pipeline_is_proven_with_every_rule_instance_checked() -> None:
    ex = next(e for e in CORRECT if e.name == FULLY_VERIFIED)
    report = check_texts(*lower_pair(ex))
    assert report.proven and report.exit_code == 0, report.render_text()
    counts = report.stats["general_tier"]["rule_instances"]
    assert counts["proved"] > 0 and counts["refuted"] == counts["unknown"] == 0


@pytest.mark.parametrize("ex", AUTODIFF, ids=_ids(AUTODIFF))
def test_jax_grad_of_a_pipelined_loss_needs_no_overflow(ex: Example) -> None:
    """The bubble steps' cotangents are zeros times values computed on garbage (NaN where
    those overflow): not proven by default, with that reason and no bug claimed; proven
    under --assume-no-overflow, which the report lists."""
    assert _error(ex) < 1e-5, ex.name
    strict = _report(ex)
    assert not strict.proven
    reason = strict.stats["general_tier"]["reason"]
    assert "is kept" in reason and "--assume-no-overflow" in reason, reason
    loose = _report(ex, True)
    assert loose.proven, loose.render_text()
    assert any("overflow" in a for a in loose.assumptions), loose.assumptions


@pytest.mark.parametrize("ex", BUGGY, ids=_ids(BUGGY))
def test_bug_computes_other_numbers_and_is_flagged(ex: Example) -> None:
    """Grounded (other numbers), never proven, a bug claimed; the claim names the stage's
    input feed in the schedule the bug sits in (the `# BUG` line is elsewhere)."""
    assert _error(ex) > 1e-2, ex.name
    path, line = bug_line(ex)
    assert linecache.getline(path, line).rstrip().endswith("# BUG")
    report = _report(ex)
    assert not report.proven and report.exit_code == 1 and report.diagnostics
    first = report.diagnostics[0]
    assert first.loc is not None and os.path.abspath(first.loc.file) == path
    assert first.loc.line == _feed_line(ex) != line, (first.loc.line, first.message)


def test_a_bug_claim_is_confirmed_by_running_both_programs() -> None:
    """`entangle check`'s confirmation: the claim stands, the outputs differing."""
    ex = next(e for e in BUGGY if e.bug == "shift_backwards")
    report = confirmed(_report(ex), *lower_pair(ex))
    assert report.exit_code == 1 and is_confirmed(report.diagnostics[0]), \
        report.render_text()


def _feed_line(ex: Example) -> int:
    """The line of the schedule `ex` runs where stage 0 takes a micro-batch in."""
    schedule = next(fn for prefix, fn in SCHEDULES.items() if ex.name.startswith(prefix))
    lines, start = inspect.getsourcelines(schedule)
    (at,) = [i for i, text in enumerate(lines) if "jnp.where(stage == 0, x[" in text]
    return start + at


def test_every_pipeline_asked_for_is_here() -> None:
    """Issue 19's list: GPipe forward (GPT-2, Llama) and training steps, 1F1B, circular,
    pp x tp, dp x pp x tp; the seven kinds of pipeline bugs."""
    names = {e.name for e in PROGRAMS}
    for needed in ("gpipe_fwd_gpt2_pp4", "gpipe_fwd_llama_pp4", "gpipe_train_llama_pp4",
                   "gpipe_grad_gpt2_pp4", "onef1b_train_gpt2_pp2",
                   "circular_fwd_gpt2_pp4", "gpipe_fwd_gpt2_pp4_tp2",
                   "onef1b_train_gpt2_dp2_pp2_tp2"):
        assert needed in names, needed
    assert {e.bug for e in BUGGY} >= {
        "shift_backwards", "shift_skips_a_stage", "slot_off_by_one", "bubble_unmasked",
        "outputs_from_first_stage", "grads_not_accumulated", "grads_summed_not_averaged"}
