"""The general tier's renaming argument on symmetric axes (`analysis/general/symmetry.py`,
issue 21): a device along dp / tp gets its representative's terms renamed where every operand
is coherent. Nearest wrong programs on dp 2 x tp 2, each wrong only on devices that are NOT
the representative (or on every device), computing other numbers when run, are not proven:
a dp rank scaling by its axis_index, a tp shard reading shard 0's columns instead of its own,
a psum over dp where tp belongs. The correct pipeline (dp 2 x pp 2 x tp 2, MLP stages) is
still proven with devices renamed."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from dataclasses import replace

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.analysis.general import expand
from entangle_mlir.driver import check_texts
from tests.jax_runs import run_and_lower

MESH = (("dp", 2), ("tp", 2))
B, D, F = 4, 4, 8
rng = np.random.default_rng(7)
X = rng.standard_normal((B, D)).astype(np.float32)
W1 = rng.standard_normal((D, F)).astype(np.float32)
W2 = rng.standard_normal((F, D)).astype(np.float32)


def reference(x, w1, w2):
    return (x @ w1) @ w2


def dp_rank_scaled(x, w1, w2):
    scale = 1.0 + lax.axis_index("dp").astype(jnp.float32)  # BUG: dp rank 1 doubles
    return lax.psum((x @ w1) @ w2, "tp") * scale


def shard_zero_columns(x, w1, w2):
    k = F // 2
    start = jnp.minimum(lax.axis_index("tp"), 0) * k  # BUG: shard 0's offset everywhere
    cols = lax.dynamic_slice_in_dim(w1, start, k, axis=1)
    return lax.psum((x @ cols) @ w2, "tp")


def psum_over_dp(x, w1, w2):
    return lax.psum((x @ w1) @ w2, "dp")  # BUG: tp's partial sums left unsummed


TWINS = [
    ("dp_rank_scaled", dp_rank_scaled, (P("dp"), P(None, "tp"), P("tp", None))),
    ("shard_zero_columns", shard_zero_columns, (P("dp"), P(), P("tp", None))),
    ("psum_over_dp", psum_over_dp, (P("dp"), P(None, "tp"), P("tp", None))),
]


@pytest.fixture(autouse=True)
def _symmetric(monkeypatch):
    monkeypatch.setattr(expand, "SYMMETRIC", True)


@pytest.mark.parametrize("name,body,specs", TWINS, ids=[t[0] for t in TWINS])
def test_nearest_wrong_programs_are_not_proven_with_renaming(name, body, specs) -> None:
    want, got, (ref_text, sharded_text) = run_and_lower(
        reference, body, (X, W1, W2), specs, P("dp"), MESH, check_vma=False)
    assert not np.allclose(got, want, rtol=1e-4, atol=1e-4)  # grounded: other numbers
    report = check_texts(ref_text, sharded_text, verify_rules=False)
    assert not report.proven, report.render_text()
    general = report.stats["general_tier"]
    assert not general["proven"]
    assert general.get("symmetric_axes") == ["dp", "tp"]


def test_the_pipeline_is_proven_with_devices_renamed() -> None:
    from examples import frontier as fr
    from examples.heldout.corpus import grounded_correct, lower_pair

    example = fr.pipeline_step(replace(fr.tiny(fr.LLAMA_70B, 2), batch=2), 2, 2, 2, micro=2,
                               attention=False)
    assert grounded_correct(example)[0]
    report = check_texts(*lower_pair(example), verify_rules=False)
    assert report.proven, report.render_text()
    general = report.stats["general_tier"]
    assert general["symmetric_axes"] == ["dp", "tp"] and general["renamed"] > 0
