"""Ground every example by execution: correct programs match, buggy ones differ."""

from __future__ import annotations

import linecache

import numpy as np
import pytest

from examples.catalog import EXAMPLES, Example, bug_line, by_name, lower_pair, run_pair
from tests.shared import EXAMPLES_MLIR, per_example

IDS = [e.name for e in EXAMPLES]
CORRECT = [e for e in EXAMPLES if e.bug is None]
BUGGY = [e for e in EXAMPLES if e.bug is not None]


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


@pytest.mark.parametrize("ex", EXAMPLES, ids=IDS)
def test_lower_pair(ex: Example) -> None:
    ref, shd = lower_pair(ex)
    assert "func.func public @main" in ref and "sdy.manual_computation" not in ref
    assert "sdy.manual_computation" in shd
    assert "loc(" in ref and "loc(" in shd


@pytest.mark.parametrize("ex", per_example(BUGGY))
def test_bug_line(ex: Example) -> None:
    path, line = bug_line(ex)
    assert linecache.getline(path, line).rstrip().endswith("# BUG")
    _, shd = lower_pair(ex)
    assert f'"{path}":{line}:' in shd, "BUG line missing from the sharded locations"


def test_catalogue_shape() -> None:
    assert len(set(IDS)) == len(IDS)
    bugs = {e.bug for e in BUGGY}
    assert bugs >= {
        "missing_psum", "pmean", "bias_before_psum", "gelu_before_psum",
        "all_gather_wrong_dim", "local_stats", "psum_wrong_axis",
    }  # fmt: skip
    at_tp4 = {e.bug for e in BUGGY if dict(e.mesh_axes).get("tp") == 4}
    assert at_tp4 == bugs, "every bug needs a tp=4 variant"
    assert by_name("megatron_mlp_tp4").bug is None
    with pytest.raises(ValueError):
        bug_line(by_name("megatron_mlp_tp4"))


@pytest.mark.parametrize("name", ["megatron_mlp_tp4", "megatron_mlp_missing_psum_tp4"])
def test_committed_mlir_present(name: str) -> None:
    for suffix in ("ref", "sharded"):
        text = (EXAMPLES_MLIR / f"{name}.{suffix}.mlir").read_text()
        assert "func.func public @main" in text and "loc(" in text
    assert "sdy.manual_computation" in (EXAMPLES_MLIR / f"{name}.sharded.mlir").read_text()


def test_committed_mlir_names_bug_line() -> None:
    _, line = bug_line(by_name("megatron_mlp_missing_psum_tp4"))
    text = (EXAMPLES_MLIR / "megatron_mlp_missing_psum_tp4.sharded.mlir").read_text()
    assert f'models.py":{line}:' in text, "committed MLIR is stale: run python -m examples.generate"
