"""Proof-backed repair (`entangle_mlir/repair.py`, issue 19): a pipeline bug is named at the
user's `# BUG` line where one op's nearest alternative makes the general tier prove the
program; a proven program is never repaired, and a program with two independent bugs gets no
single-edit claim.

The programs are GPipe forward schedules of `examples/pipelines.py` (the same schedule and
the same wrong pieces as its buggy twins) on a tiny stage (one matmul a stage, 4 wide), so
that each of the repair's re-checks is cheap; each is grounded by running it on simulated
CPU devices against its reference.
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
    (want,) = [np.asarray(o) for o in jax.tree.leaves(compiled(*inputs))]
    (got,) = run_sharded(ex, inputs)
    return float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))


@functools.cache
def _report(ex: Example):
    return check_texts(*lower_pair(ex), verify_rules=False, repair_bugs=True)


def _bug_line(fn) -> tuple[str, int]:
    lines, start = inspect.getsourcelines(fn)
    (at,) = [start + i for i, text in enumerate(lines) if text.rstrip().endswith("# BUG")]
    return os.path.abspath(inspect.getsourcefile(fn)), at


@pytest.mark.parametrize("bug", LOCALIZED)
def test_a_pipeline_bug_is_named_at_its_line(bug: str) -> None:
    """Grounded (other numbers); the first diagnostic is the repair's, at the `# BUG` line,
    saying what the op does and what makes the program proven."""
    pieces = LOCALIZED[bug]
    ex = _tiny(bug, **pieces)
    assert _error(ex) > 1e-2, ex.name
    report = _report(ex)
    assert report.exit_code == 1 and not report.proven
    first = report.diagnostics[0]
    path, line = _bug_line(next(iter(pieces.values())))
    assert linecache.getline(path, line).rstrip().endswith("# BUG")
    assert first.message.startswith(MESSAGE_PREFIX), report.render_text()
    assert "the program is proven when" in first.message
    assert first.loc is not None and (os.path.abspath(first.loc.file), first.loc.line) == \
        (path, line), first.render()
    stats = report.stats["repair"]
    assert "bounded" not in stats and len(stats["proven_by"]) == 1


def test_a_correct_pipeline_is_never_repaired() -> None:
    ex = _tiny()
    assert _error(ex) < 1e-5
    report = _report(ex)
    assert report.proven and "repair" not in report.stats
    assert not any(d.message.startswith(MESSAGE_PREFIX) for d in report.diagnostics)


def test_two_independent_bugs_get_no_single_edit_claim() -> None:
    """Shift backwards and the output slot off by one: each single edit fixes one of them, so
    none proves the program and the repair says nothing (the tiers' diagnostics stand)."""
    ex = _tiny("two_bugs", shift=pipelines.shift_backwards,
               slot=pipelines.output_slot_off_by_one)
    assert _error(ex) > 1e-2
    report = _report(ex)
    assert report.exit_code == 1 and not report.proven
    assert not any(d.message.startswith(MESSAGE_PREFIX) for d in report.diagnostics)
    stats = report.stats["repair"]
    assert "bounded" not in stats and stats["tried"] == stats["candidates"]
    assert stats["proven_by"] == [] and "claimed" not in stats
