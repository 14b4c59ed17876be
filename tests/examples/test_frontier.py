"""The frontier programs of issue 21 (examples/frontier.py) at test widths, grounded by
execution: Llama-3 (70B / 405B structure: grouped-query attention, vocab-parallel embedding
and loss, AdamW) on dp x tp and the DeepSeek-V3-like MoE (multi-head latent attention, top-k
routed experts over ep with all_to_all, a shared expert) with one sequence a device compute
their references' numbers and are proven; the 405B-structured twin whose middle layer
multiplies by w_gate where w_up belongs computes other numbers and is flagged at that line.
benchmarks/frontier.py runs the same programs at the real widths."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import inspect

import numpy as np
import pytest

from entangle_mlir.driver import check_texts
from examples import frontier as F
from examples.real.catalog import lower_pair, run_pair


def _max_difference(ex) -> float:
    want, got = run_pair(ex)
    return max(float(np.max(np.abs(a - b))) for a, b in zip(want, got, strict=True))


CORRECT = {
    "llama70b_dp2_tp2": lambda: F.dense_step(F.tiny(F.LLAMA_70B, 2), 2, 2),
    "deepseek_ep4_one_sequence": lambda: F.deepseek_step(
        F.replace(F.tiny(F.DEEPSEEK_V3, 2), batch=4), F.TINY_MLA, 4),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_frontier_program_matches_and_is_proven(name: str) -> None:
    ex = CORRECT[name]()
    assert _max_difference(ex) < 1e-4
    report = check_texts(*lower_pair(ex))
    assert report.proven, report.render_text()


def test_changed_middle_layer_differs_and_is_flagged_at_its_line() -> None:
    cfg = F.tiny(F.LLAMA_405B, 3)
    ex = F.dense_step(cfg, 2, 2, changed_layer=1)
    assert _max_difference(ex) > 1e-3
    report = check_texts(*lower_pair(ex), general_tier=False)
    assert not report.proven
    lines, start = inspect.getsourcelines(F.changed_mlp)
    bug = next(start + i for i, text in enumerate(lines) if text.rstrip().endswith("# BUG"))
    first = report.diagnostics[0]
    assert first.loc is not None and first.loc.file.endswith("examples/frontier.py")
    assert first.loc.line == bug, report.render_text()
