"""The frontier pipeline (issues 19 and 21: examples/frontier.py's `pipeline_step`, Llama
layers with grouped-query attention and SwiGLU, Megatron tp inside each 1F1B stage, Adam-like
update) at test widths, grounded by execution on simulated CPU devices: the correct program
computes its reference's numbers and the general tier proves it; each nearest wrong program
(a bubble step not masked, gradients sent to a wrong stage, the backward's micro-batch off by
one, a stage's MLP without its tp psum, one layer in the middle of the stack multiplying by
the wrong weight) computes other numbers and is not proven.

The twins run with MLP-only stages (what they get wrong is the schedule or the tp sum, not
the attention; small, for CI's budget), the correct program with attention."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from dataclasses import replace

import pytest

from entangle_mlir.driver import check_texts
from examples import frontier as F
from examples.heldout.corpus import input_sets, lower_pair, max_error

CFG = replace(F.tiny(F.LLAMA_70B, 2), batch=2)
"""Two layers (one a stage), two rows a micro-batch (dp 1: the rows of one device)."""


def _step(bug: str | None = None, attention: bool = True):
    return F.pipeline_step(CFG, 1, 2, 2, micro=2, attention=attention, bug=bug)


@pytest.mark.parametrize("layers", [2, 4])
def test_pipeline_with_attention_matches_and_is_proven(layers: int) -> None:
    """One layer a stage, and two (gap 2 of benchmarks/FRONTIER_RESULTS.md: the residual
    stream's contractions join per weight, one grouping whichever stage or micro-batch
    summed them)."""
    ex = F.pipeline_step(replace(CFG, n_layers=layers), 1, 2, 2, micro=2, attention=True)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert report.proven, report.stats.get("general_tier")
    assert report.stats["tier"] == "general"


@pytest.mark.parametrize("bug, attention", [
    ("bubble_unmasked", False), ("gradients_to_a_wrong_stage", False),
    ("backward_microbatch_off_by_one", False), ("stage_mlp_without_psum", False),
    ("middle_layer_up_from_gate", False)])
def test_pipeline_twin_differs_and_is_not_proven(bug: str, attention: bool) -> None:
    ex = _step(bug, attention)
    assert max_error(ex, input_sets(ex)[0]) > 1e-3
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert not report.proven


DEEP = replace(F.tiny(F.LLAMA_70B, 14), batch=2)
"""Fourteen layers, seven a stage, on dp 2 x pp 2 (one row a device): each pass of the normal
form used to move the layers' residual stream one layer (`normal_form._latest`), and 14
layers ran out of its passes."""


def _one_kv_head(bug: str | None = None):
    """One layer on pp 1 x tp 8: Llama-3's 8 kv heads (tiny widths) leave one a device, whose
    computation has the kv-head dim squeezed out (gap 1 of benchmarks/FRONTIER_RESULTS.md)."""
    return F.pipeline_step(replace(F.tiny(F.LLAMA_70B, 1), batch=2), 1, 1, 8, micro=2,
                           attention=True, bug=bug)


def test_one_kv_head_a_device_matches_and_is_proven() -> None:
    """The devices' pieces, each computed without the kv-head dim, meet the reference's heads
    (the unsqueeze lift, `normal_form._stacked_rows`, `_strided_rows`)."""
    ex = _one_kv_head()
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert report.proven, report.stats.get("general_tier")


def test_one_kv_head_a_device_without_the_mlp_psum_is_not_proven() -> None:
    ex = _one_kv_head("stage_mlp_without_psum")
    assert max_error(ex, input_sets(ex)[0]) > 1e-3
    assert not check_texts(*lower_pair(ex), verify_rules=False).proven


def _one_row(layers: int, pp: int, tp: int, bug: str | None = None, micro: int = 2):
    """dp 2 with a batch of 2: one row of each micro-batch a device (gap 1 of
    benchmarks/FRONTIER_RESULTS.md, attention half)."""
    return F.pipeline_step(replace(F.tiny(F.LLAMA_70B, layers), batch=2), 2, pp, tp,
                           micro=micro, attention=True, bug=bug)


@pytest.mark.parametrize("layers, pp, tp, micro", [(1, 1, 1, 2), (1, 1, 1, 1), (2, 2, 2, 2),
                                                   (4, 2, 2, 2), (4, 4, 1, 2)])
def test_one_row_a_device_with_attention_matches_and_is_proven(layers: int, pp: int, tp: int,
                                                               micro: int) -> None:
    """Each device's row, computed with a unit batch dim, meets the reference's batch (on pp 4
    too: a stage's rows joined in part next to one row, their factors and parts paired by
    the weights they read and a concatenation's first piece, tests/core/test_normal_form_pp4.py):
    the rows stack along the unit dim, reshapes regroup (rows, seq) inside reductions and
    contractions group by group, the q and k gradients' contractions meet joined or apart
    (tests/core/test_normal_form_one_row.py); with one micro-batch, the reference's unit
    micro-batch dim is merged into the rows inside the last projection."""
    ex = _one_row(layers, pp, tp, micro=micro)
    assert max_error(ex, input_sets(ex)[0]) <= 10 * ex.atol
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert report.proven, (report.stats.get("general_tier") or {}).get("reason")


@pytest.mark.parametrize("layers, pp", [(2, 2), (4, 4)])
def test_one_row_a_device_with_the_backward_off_by_one_is_not_proven(layers: int,
                                                                     pp: int) -> None:
    ex = _one_row(layers, pp, 1, "backward_microbatch_off_by_one")
    assert max_error(ex, input_sets(ex)[0]) > 1e-3
    assert not check_texts(*lower_pair(ex), verify_rules=False).proven



@pytest.mark.parametrize("bug", [None, "middle_layer_up_from_gate"])
def test_deep_stages_on_dp_and_pp_under_a_low_recursion_limit(bug: str | None) -> None:
    """The correct program computes the reference's numbers and is proven; its twin whose
    layer 7 of 14 (the second stage's first) multiplies by w_gate where w_up belongs
    computes others and is not proven. Both under a Python recursion limit just above what
    the layout tier needs: the normal form nests a rewrite's normal form in its node's (5
    frames a level, about 1.5 levels a layer: 128 layers passed the default limit of 1000,
    the 405B row), so the tier raises the limit while it runs; with `tier.RECURSION_LIMIT`
    lifted to 0 and the tier on this thread (where the limit counts the test's frames too)
    the correct stack's general tier with every layer expanded stops at it: not proven,
    "nest too deeply" (a layer template keeps the terms of these 14 layers shallow)."""
    import inspect
    import sys

    from entangle_mlir.analysis.general import tier

    ex = F.pipeline_step(DEEP, 2, 2, 1, micro=2, attention=False, bug=bug)
    error = max_error(ex, input_sets(ex)[0])
    texts = lower_pair(ex)
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + LOW_LIMIT)
    try:
        report = check_texts(*texts, verify_rules=False, general_budget=UNBOUNDED)
        if bug is None:
            raised, tier.RECURSION_LIMIT, tier.IN_THREAD = tier.RECURSION_LIMIT, 0, False
            try:
                stopped = check_texts(*texts, verify_rules=False, general_budget=UNBOUNDED,
                                      layer_templates=False)
            finally:
                tier.RECURSION_LIMIT, tier.IN_THREAD = raised, True
    finally:
        sys.setrecursionlimit(before)
    if bug is None:
        assert error <= 10 * ex.atol
        assert report.proven, report.stats.get("general_tier")
        assert not stopped.proven
        assert "nest too deeply" in stopped.stats["general_tier"]["reason"]
    else:
        assert error > 1e-3
        assert not report.proven


LOW_LIMIT = 150
"""Frames above the test's own that the recursion limit is set to."""
UNBOUNDED = 3600
"""The general tier's wall budget here: what is tested is the recursion limit, not the
machine's load (the default 30 s runs out on a loaded machine)."""
