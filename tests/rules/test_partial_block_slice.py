"""A device slicing its own block of a value that is still a partial sum (ZeRO's shard of a
gradient that was never psum_scatter'd): the diagnostic names the pending reduction
(`rules/index._pending_reduction`), not a wrong offset. Grounded: the program that psums first
computes the reference and is proven; the one that slices the partial sums computes other
numbers, and its claim is the missing reduction."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from tests.jax_runs import run_and_lower


def _shard_of_sum(reduced: bool):
    def body(x, w):
        partial = x.T @ x @ w                    # this device's rows' share of X^T X W
        if reduced:
            partial = lax.psum(partial, "d")
        rows = partial.shape[0] // 4
        return lax.dynamic_slice_in_dim(partial, lax.axis_index("d") * rows, rows)
    return body


@pytest.mark.parametrize("reduced", [True, False])
def test_block_of_a_partial_sum(reduced: bool) -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal(
        (8, 3)).astype(np.float32)
    want, got, texts = run_and_lower(lambda x, w: x.T @ x @ w, _shard_of_sum(reduced), [x, w],
                                     (P("d"), P()), P("d"))
    assert np.allclose(want, got, atol=1e-4) == reduced
    report = check_texts(*texts, verify_rules=reduced)
    assert report.proven == reduced, report.render_text()
    if not reduced:
        first = report.diagnostics[0]
        assert first.category == "missing_reduction", first.message
        assert "still a partial sum over 'd'" in first.message
