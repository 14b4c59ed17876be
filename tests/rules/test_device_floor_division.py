"""Device-dependent integers through jnp's floor division (`//` lowers to a truncating divide
corrected by `sign`s): `stablehlo.sign` on the per-device tables (`rules/elementwise.py`).
Grounded: each device slicing its own rows of a replicated value at `((2 * i - 1) // 2 + 1) *
rows` (floor: i * rows) computes the reference and is proven by the layout tier alone; the
same offset by truncating division (`lax.div`: device 0 reads device 1's rows) differs by
execution and is not proven."""

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


def _sliced(divide):
    def body(x):
        rows = x.shape[0] // 4
        block = divide(2 * lax.axis_index("i") - 1, 2) + 1
        return lax.dynamic_slice_in_dim(x, block * rows, rows)
    return body


CASES = {"floor": (lambda a, b: a // b, True), "truncated": (lax.div, False)}


@pytest.mark.parametrize("name", list(CASES))
def test_floor_division_of_axis_index(name: str) -> None:
    divide, correct = CASES[name]
    x = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    want, got, texts = run_and_lower(lambda x: x, _sliced(divide),
                                     [x], (P(),), P("i"), mesh=(("i", 4),))
    assert np.allclose(want, got) == correct
    assert ("stablehlo.sign" in texts[1]) == correct
    report = check_texts(*texts, verify_rules=correct, general_tier=False)
    assert report.proven == correct, report.render_text()
    if correct:
        assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
