"""Ground the real-model corpus by execution on 8 simulated CPU devices: every correct program
computes what its reference computes; every buggy twin computes something else."""

from __future__ import annotations

import linecache

import numpy as np
import pytest

from examples.real.bugs import OMISSIONS
from examples.real.catalog import Example, bug_line, examples, lower_pair, run_pair
from tests.shared import per_example

EXAMPLES = examples()
CORRECT = [e for e in EXAMPLES if e.bug is None]
BUGGY = [e for e in EXAMPLES if e.bug is not None]

# The bugs of the issue (each must have a twin in the corpus).
ISSUE_BUGS = {
    "router_grad_not_allreduced", "norm_grads_not_allreduced", "grad_accum_per_microbatch",
    "vocab_ce_on_replicated_logits", "grads_summed_over_sp", "grads_scaled_by_world_size",
    "per_shard_mean_unequal_tokens", "all_gather_wrong_dim", "rope_positions_restart",
    "qk_norm_local_heads", "shared_head_weight_grad_not_psummed", "ring_wrong_direction",
    "embedding_reduce_scatter_then_all_reduce", "grad_norm_counts_replicated",
}


def _max_abs_diff(ex: Example) -> float:
    ref, shd = run_pair(ex)
    assert len(ref) == len(shd)
    for r, s in zip(ref, shd, strict=True):
        assert r.shape == s.shape and r.dtype == s.dtype
    return max(float(np.max(np.abs(r - s))) for r, s in zip(ref, shd, strict=True))


@pytest.mark.parametrize("ex", per_example(CORRECT))
def test_correct_matches_reference(ex: Example) -> None:
    ref, shd = run_pair(ex)
    for r, s in zip(ref, shd, strict=True):
        np.testing.assert_allclose(s, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_buggy_differs_from_reference(ex: Example) -> None:
    assert _max_abs_diff(ex) > 1e-3


def _omission_marks(ex: Example):
    if ex.bug in OMISSIONS:
        return (pytest.mark.xfail(strict=True, reason="omission: the # BUG line skips a "
                                  "gradient in a synchronisation and emits no op of its own"),)
    return ()


@pytest.mark.parametrize("ex", per_example(BUGGY, marks=_omission_marks))
def test_bug_line_in_sharded_locations(ex: Example) -> None:
    path, line = bug_line(ex)
    assert linecache.getline(path, line).rstrip().endswith("# BUG")
    _, shd = lower_pair(ex)
    assert f'"{path}":{line}:' in shd, "BUG line missing from the sharded locations"


def test_corpus_shape() -> None:
    names = [e.name for e in EXAMPLES]
    assert len(set(names)) == len(names)
    assert {e.bug for e in BUGGY} >= ISSUE_BUGS
    assert len(BUGGY) >= 14
    # Every model: forward and a training step at tp 2/4/8 and dp x tp, plus lax.scan.
    for model in ("gpt2", "llama3", "qwen2", "moe"):
        for mesh in ((("tp", 2),), (("tp", 4),), (("tp", 8),), (("dp", 2), ("tp", 4))):
            for task in ("fwd", "adamw"):
                assert any(e.model == model and e.task == task and e.mesh_axes == mesh
                           and e.bug is None and not e.scan for e in EXAMPLES), (model, mesh, task)
        assert any(e.model == model and e.scan and e.task == "fwd" for e in EXAMPLES)
        assert any(e.model == model and e.scan and e.task in ("sgd", "stack_sgd")
                   for e in EXAMPLES)
    styles = {e.style for e in EXAMPLES}
    assert {"tp", "sp", "dp", "fsdp", "ep", "cp", "cp ring", "dp x tp", "dp x tp x sp",
            "tp + vocab"} <= styles
    assert sum(e.tricky for e in EXAMPLES) >= 4


def _reproducer_params() -> list:
    from examples.real.repro import reproducers

    return [pytest.param(r.example, id=f"{r.cause}-{r.example.name}") for r in reproducers()]


@pytest.mark.parametrize("ex", _reproducer_params())
def test_reproducer_matches_reference(ex: Example) -> None:
    """Each reproducer of FAILURES.md is a correct program: it computes its reference."""
    ref, shd = run_pair(ex)
    for r, s in zip(ref, shd, strict=True):
        np.testing.assert_allclose(s, r, rtol=1e-4, atol=1e-4)
