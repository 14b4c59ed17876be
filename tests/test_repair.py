"""Proof-backed repair (`entangle_mlir/repair.py`, issue 19): a pipeline bug is named at the
user's line where one place's nearest alternative (an op changed, or a missing op inserted)
makes the general tier prove the program; a proven program is never repaired, and a program
with two independent bugs gets no single-edit claim.

The programs are the schedules of `examples/pipelines.py` (the same schedule and the same
wrong pieces as its buggy twins) on a tiny stage (one matmul a stage, 4 wide, SGD, two
micro-batches), so that each of the repair's re-checks is cheap; each is grounded by running
it on simulated CPU devices against its reference.

Where a bug is a missing op, its `# BUG` line (`return value`, `return new`, `return total`)
makes no op, so no location in the program holds it; jax records the user's call stack in each
op's location, and the repair names the frame the inserted op belongs to:
* a bubble not masked: the line handing the value to the accumulation (`acc(g, bubble(valid,
  d))`, the unmasked helper's caller): the frame where the value leaves the vjp for the add;
* gradients not accumulated: the same line (what the loop body hands the carry is made there);
* a sum where the reference averages: the loop whose result is the sum (`lax.fori_loop(...,
  backward, ...)`); the caller of the helper (`[scale(g, m) for g in grads]`, the next line)
  makes no op either, so the loop making the value is the nearest line the program holds.
The tests check that those lines indeed hold no op (so the `# BUG` line could not be named).
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
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.repair import MESSAGE_PREFIX
from examples import pipelines
from examples.heldout.corpus import (
    FAST_COMPILE,
    Example,
    f32,
    lower_pair,
    program,
    random_arg,
    run_sharded,
)

WIDTH = 4


def matmul_block(p, x):
    (w,) = p
    return x @ w


def _tiny(bug: str | None = None, **pieces) -> Example:
    args = [f32((4, WIDTH, WIDTH), P("pp"), "weight"), f32((4, 2, WIDTH))]
    return program("repair", "gpipe_tiny", pipelines.PP4,
                   pipelines.reference_fn(matmul_block),
                   pipelines.forward_fn(matmul_block, **pieces), args, P(), "tiny GPipe",
                   bug=bug, bug_fn=next(iter(pieces.values()), None))


def _tiny_train(bug: str | None = None, schedule=pipelines.gpipe_train, **pieces) -> Example:
    args = [f32((4, WIDTH, WIDTH), P("pp"), "weight"), f32((2, 2, WIDTH)), f32((2, 2, WIDTH))]
    return program("repair", f"train_tiny_{schedule.__name__}", pipelines.PP4,
                   pipelines.train_reference_fn(matmul_block, False),
                   pipelines.train_fn(schedule, matmul_block, False, **pieces), args,
                   (P(), (P("pp"),)), "tiny GPipe training step", bug=bug,
                   bug_fn=next(iter(pieces.values()), None))


LOCALIZED = {
    "shift_backwards": {"shift": pipelines.shift_backwards},
    "shift_skips_a_stage": {"shift": pipelines.shift_skipping_a_stage},
    "slot_off_by_one": {"slot": pipelines.output_slot_off_by_one},
    "outputs_from_first_stage": {"collect": pipelines.first_stage},
}


@functools.cache
def _error(ex: Example) -> float:
    rng = np.random.default_rng(0)
    inputs = [random_arg(a, rng) for a in ex.args]
    shapes = [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in ex.args]
    compiled = jax.jit(ex.reference).lower(*shapes).compile(compiler_options=FAST_COMPILE)
    wants = [np.asarray(o) for o in jax.tree.leaves(compiled(*inputs))]
    gots = run_sharded(ex, inputs)
    assert len(gots) == len(wants)
    return max(float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))
               for got, want in zip(gots, wants))


@functools.cache
def _report(ex: Example):
    return check_texts(*lower_pair(ex), verify_rules=False, repair_bugs=True)


def _bug_line(fn) -> tuple[str, int]:
    lines, start = inspect.getsourcelines(fn)
    (at,) = [start + i for i, text in enumerate(lines) if text.rstrip().endswith("# BUG")]
    return os.path.abspath(inspect.getsourcefile(fn)), at


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    (at,) = [start + i for i, line in enumerate(lines) if text in line]
    return at


def _named(report, path: str, line: int):
    """The repair's claim, checked to be first and at `path:line`."""
    assert report.exit_code == 1 and not report.proven
    first = report.diagnostics[0]
    assert first.message.startswith(MESSAGE_PREFIX), report.render_text()
    assert "the program is proven when" in first.message
    assert first.loc is not None and (os.path.abspath(first.loc.file), first.loc.line) == \
        (path, line), first.render()
    stats = report.stats["repair"]
    assert "bounded" not in stats and len(stats["proven_by"]) == 1
    return first


@pytest.mark.parametrize("bug", LOCALIZED)
def test_a_pipeline_bug_is_named_at_its_line(bug: str) -> None:
    """Grounded (other numbers); the first diagnostic is the repair's, at the `# BUG` line,
    saying what the op does and what makes the program proven."""
    pieces = LOCALIZED[bug]
    ex = _tiny(bug, **pieces)
    assert _error(ex) > 1e-2, ex.name
    path, line = _bug_line(next(iter(pieces.values())))
    assert linecache.getline(path, line).rstrip().endswith("# BUG")
    _named(_report(ex), path, line)


def test_gradients_sent_forward_are_named_at_their_line() -> None:
    """1F1B handing d input to the next stage instead of the previous one."""
    ex = _tiny_train("gradients_sent_forward", pipelines.onef1b_train,
                     back=pipelines.shift_gradients_forward)
    assert _error(ex) > 1e-2
    first = _named(_report(ex), *_bug_line(pipelines.shift_gradients_forward))
    assert "moves them by -1 along 'pp'" in first.message


MISSING = {  # bug: (the helper swapped in, what the claim says is missing, the line named)
    "bubble_unmasked": ({"bubble": pipelines.unmasked}, "is masked by `0 <= i <= 1`",
                        "acc(g, bubble(valid, d))"),
    "grads_not_accumulated": ({"acc": pipelines.keep_last}, "is added to the carried value",
                              "acc(g, bubble(valid, d))"),
    "grads_summed_not_averaged": ({"scale": pipelines.sum_over_microbatches},
                                  "that sum is divided by 2 before it is used",
                                  "lax.fori_loop(0, m + n - 1, backward, carry)"),
}


@pytest.fixture(scope="module")
def correct_train() -> Example:
    ex = _tiny_train()
    assert _error(ex) < 1e-5
    return ex


@pytest.mark.parametrize("bug", MISSING)
def test_a_missing_op_is_named_where_it_goes(bug: str, correct_train: Example) -> None:
    """Grounded (other numbers); the claim inserts the missing op (a mask by the step's
    valid range, an accumulation, a division by the micro-batch count) and names the user's
    line it belongs to in the schedule (module docstring: the `# BUG` line makes no op, which
    is checked here on the lowered program)."""
    pieces, shown, named_text = MISSING[bug]
    ex = _tiny_train(bug, **pieces)
    assert _error(ex) > 1e-2
    path, bug_at = _bug_line(next(iter(pieces.values())))
    named = _line_of(pipelines.gpipe_train, named_text)
    sharded = lower_pair(ex)[1]
    assert f'pipelines.py":{bug_at}:' not in sharded  # the `# BUG` line holds no op
    assert f'pipelines.py":{named}:' in sharded
    if bug == "grads_summed_not_averaged":  # nor does the helper's caller, the next line
        assert f'pipelines.py":{named + 1}:' not in sharded
        assert "scale(g, m)" in linecache.getline(path, named + 1)
    first = _named(_report(ex), path, named)
    assert shown in first.message, first.message
    assert f'pipelines.py":{named}:' in lower_pair(correct_train)[1]


def test_a_correct_pipeline_is_never_repaired(correct_train: Example) -> None:
    """Neither the forward schedule nor the training step (whose loops carry sums: the
    places an inserted op would go)."""
    for ex in (_tiny(), correct_train):
        assert _error(ex) < 1e-5
        report = _report(ex)
        assert report.proven and "repair" not in report.stats
        assert not any(d.message.startswith(MESSAGE_PREFIX) for d in report.diagnostics)


TWO_BUGS = {  # two independent bugs: each single edit fixes one of them
    "shift_backwards_and_slot_off_by_one": (_tiny, {"shift": pipelines.shift_backwards,
                                                    "slot": pipelines.output_slot_off_by_one}),
    "unmasked_and_summed": (_tiny_train, {"bubble": pipelines.unmasked,
                                          "scale": pipelines.sum_over_microbatches}),
}


@pytest.mark.parametrize("bugs", TWO_BUGS)
def test_two_independent_bugs_get_no_single_edit_claim(bugs: str) -> None:
    """Two ops changed, or two ops missing (a mask and a division): no single edit proves the
    program (the nearest wrong fixes are not proven), so the repair says nothing (the tiers'
    diagnostics stand)."""
    make, pieces = TWO_BUGS[bugs]
    ex = make(bugs, **pieces)
    assert _error(ex) > 1e-2
    report = _report(ex)
    assert report.exit_code == 1 and not report.proven
    assert not any(d.message.startswith(MESSAGE_PREFIX) for d in report.diagnostics)
    stats = report.stats["repair"]
    assert "bounded" not in stats and stats["tried"] == stats["candidates"]
    assert stats["proven_by"] == [] and "claimed" not in stats
