"""pytest plugin: check a model's shardings in its own test suite.

Installed with entangle (entry point `pytest11`), it gives every test the `entangle_check`
fixture:

    def test_mlp_shardings(entangle_check):
        entangle_check.refines(mlp_ref, sharded_mlp, *avals)        # a shard_map program
        entangle_check.partitioned(jitted_f, *avals)               # XLA's partitioning

A check that is not proven fails the test with the first diagnostic as the failure's first
line (`model.py:79:8: error: value is still a partial sum ...`), the whole report after it,
and no entangle frames in the traceback. Importing the plugin imports neither jax nor z3.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


class EntangleCheck:
    """What the `entangle_check` fixture hands a test: the Python API's checks, failing the
    test (not raising a plain AssertionError deep in entangle) when one is not proven."""

    def refines(self, reference_fn: Callable, sharded_fn: Callable, *avals, **options):
        """`entangle_mlir.jax.check`; the test fails unless proven. Returns the report."""
        __tracebackhide__ = True
        from entangle_mlir.jax import check  # lazy: jax loads only in tests that check

        return _proven_or_fail(check(reference_fn, sharded_fn, *avals, **options))

    def partitioned(self, f: Callable, *avals, **options):
        """`entangle_mlir.jax.check_partitioned`; the test fails unless proven."""
        __tracebackhide__ = True
        from entangle_mlir.jax import check_partitioned  # lazy: jax loads only when used

        return _proven_or_fail(check_partitioned(f, *avals, **options))


def _proven_or_fail(report):
    __tracebackhide__ = True
    if not report.proven:
        pytest.fail(report.render_failure(), pytrace=False)
    return report


@pytest.fixture
def entangle_check() -> EntangleCheck:
    """Checks of sharded programs against their references (see the module docstring)."""
    return EntangleCheck()
