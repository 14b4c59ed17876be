"""JAX front-end: lower a reference function and a sharded one, and check them.

    from entangle_mlir.jax import check, assert_refines
    report = check(reference_fn, sharded_fn, *avals)   # avals: jax.ShapeDtypeStruct with
                                                        # NamedSharding where the program is
                                                        # sharded
    assert report.proven, report.render_text()

`sharded_fn` is a `jax.shard_map` function (jitted or not). The reference is lowered at the same
global shapes without shardings. Importing this module imports jax; nothing else in entangle does.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from .check import check_texts
from .report import Report


def _plain(aval):
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


def lower_pair(reference_fn: Callable, sharded_fn: Callable, *avals) -> tuple[str, str]:
    """The reference and sharded programs as StableHLO text, with source locations."""
    reference = reference_fn if hasattr(reference_fn, "lower") else jax.jit(reference_fn)
    sharded = sharded_fn if hasattr(sharded_fn, "lower") else jax.jit(sharded_fn)
    ref_text = reference.lower(*[_plain(a) for a in avals]).as_text(debug_info=True)
    sharded_text = sharded.lower(*avals).as_text(debug_info=True)
    return ref_text, sharded_text


def check(reference_fn: Callable, sharded_fn: Callable, *avals,
          verify_rules: bool = True) -> Report:
    """Prove that `sharded_fn` refines `reference_fn` on arguments shaped like `avals`."""
    ref_text, sharded_text = lower_pair(reference_fn, sharded_fn, *avals)
    name = getattr(reference_fn, "__name__", "reference")
    return check_texts(ref_text, sharded_text, ref_file=f"<{name}: reference>",
                       sharded_file=f"<{getattr(sharded_fn, '__name__', 'sharded')}>",
                       verify_rules=verify_rules)


def assert_refines(reference_fn: Callable, sharded_fn: Callable, *avals,
                   verify_rules: bool = True) -> Report:
    """For users' test suites: raise AssertionError carrying the diagnostic if not proven."""
    report = check(reference_fn, sharded_fn, *avals, verify_rules=verify_rules)
    if not report.proven:
        raise AssertionError("sharded program does not provably refine the reference:\n"
                             + report.render_text())
    return report
