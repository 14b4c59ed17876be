"""The numerical idioms of entangle-normalize (`entangle_mlir/normalize/idioms.py`), grounded by execution
on 4 simulated CPU devices: psum spelled as all_gather + sum, a log-sum-exp stabilised by a
per-shard max that is pmax'd is proven; the near misses (a shift that is not added
back exactly, a per-shard shift under a psum, the gather of a replicated value, a sum over the
wrong axis) compute other numbers and are not proven."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from examples.real.catalog import Example, custom, lower_pair, run_pair
from examples.real.programs import ArgDef

TP = "tp"
MESH = (("tp", 4),)
SPLIT = P(None, TP)
ARGS = (ArgDef("x", (8, 16), "float32", "data", SPLIT),)


def lse_ref(x):
    m = jnp.max(x, axis=-1, keepdims=True)
    return jnp.log(jnp.sum(jnp.exp(x - m), axis=-1)) + m[:, 0]


def lse_local_max_rescaled(x):
    m = jnp.max(x, axis=-1, keepdims=True)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m), axis=-1) * jnp.exp(m[:, 0]), TP))


def lse_pmax(x):
    m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), TP)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m), axis=-1), TP)) + m[:, 0]


def lse_no_max(x):
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x), axis=-1), TP))


def lse_local_max_not_rescaled(x):
    """Each shard's own max, added back after the psum: a different shift on every shard."""
    m = jnp.max(x, axis=-1, keepdims=True)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m), axis=-1), TP)) + m[:, 0]


def lse_rescaled_by_other_value(x):
    """Rescaled by exp(2 m) instead of exp(m)."""
    m = jnp.max(x, axis=-1, keepdims=True)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m), axis=-1) * jnp.exp(2 * m[:, 0]), TP))


def row_sum_ref(x):
    return jnp.sum(x, axis=-1)


def row_sum_gathered(x):
    return jnp.sum(lax.all_gather(jnp.sum(x, axis=-1), TP, axis=0), axis=0)


def row_sum_gathered_replicated(x):
    """The gathered value is already the full row sum: 4 copies are added."""
    full = lax.psum(jnp.sum(x, axis=-1), TP)
    return jnp.sum(lax.all_gather(full, TP, axis=0), axis=0)


def row_sum_gathered_wrong_axis(x):
    """Summed over the rows instead of the gathered pieces."""
    return jnp.sum(lax.all_gather(jnp.sum(x, axis=-1), TP, axis=0), axis=1)


def _ex(name, ref, body) -> Example:
    return custom(name, MESH, ref, body, ARGS, P(), name)


PROVEN = [
    _ex("lse_pmax", lse_ref, lse_pmax),
    _ex("row_sum_gathered", row_sum_ref, row_sum_gathered),
]
"""`lse_local_max_rescaled` and `lse_no_max` equal the reference in real arithmetic only:
they overflow at x = 100 in float32 where the reference does not, and are not proven
(tests/analysis/test_exact_finite.py grounds both)."""

NOT_PROVEN = [
    _ex("lse_local_max_not_rescaled", lse_ref, lse_local_max_not_rescaled),
    _ex("lse_rescaled_by_other_value", lse_ref, lse_rescaled_by_other_value),
    _ex("row_sum_gathered_replicated", row_sum_ref, row_sum_gathered_replicated),
]


def _outputs_differ(ex: Example) -> bool:
    ref, shd = run_pair(ex)
    return any(r.shape != s.shape or float(np.max(np.abs(r - s))) > 1e-3
               for r, s in zip(ref, shd, strict=True))


@pytest.mark.parametrize("ex", PROVEN, ids=[e.name for e in PROVEN])
def test_idiom_is_proven(ex: Example) -> None:
    assert not _outputs_differ(ex)
    report = check_texts(*lower_pair(ex), verify_rules=True)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


@pytest.mark.parametrize("ex", NOT_PROVEN, ids=[e.name for e in NOT_PROVEN])
def test_near_miss_is_not_proven(ex: Example) -> None:
    assert _outputs_differ(ex)
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert not report.proven, report.render_text()


WIDE = (ArgDef("x", (8, 1 << 20), "float32", "data", SPLIT),)
"""Rows as wide as a large vocabulary: the reference's broadcast max (8M elements) is past the
size whose index map is computed whole; the broadcast's own dims are computed at size 1."""


@pytest.mark.parametrize("body", [lse_pmax, lse_local_max_not_rescaled],
                         ids=["pmax", "local_max_not_rescaled"])
def test_vocab_wide_log_sum_exp(body) -> None:
    ex = custom(f"wide_{body.__name__}", MESH, lse_ref, body, WIDE, P(), "vocab-wide rows")
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert report.proven == (body is lse_pmax), report.render_text()
    assert _outputs_differ(ex) == (body is not lse_pmax)


def test_sum_over_the_wrong_axis_is_not_proven() -> None:
    ex = custom("row_sum_gathered_wrong_axis", MESH, lambda x: jnp.sum(x, axis=-1)[:4],
                row_sum_gathered_wrong_axis, ARGS, P(), "sum over the rows")
    report = check_texts(*lower_pair(ex), verify_rules=False)
    assert not report.proven, report.render_text()




def test_rewritten_training_step_computes_the_same_when_executed() -> None:
    """Llama-3 AdamW step, reference program, run by XLA before and after the rewrites: its
    cross-entropy's max-shifted log-sum-exp is kept (dropping the shift of an unbounded
    value is not exact in float32), so nothing is rewritten."""
    from entangle_mlir.evidence import execute_replicas
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.program import inline_calls
    from entangle_mlir.normalize.rewrites import rewrite_idioms
    from examples.real.catalog import by_name, random_inputs

    ex = by_name("llama3_adamw_tp2")
    ref_text, _ = lower_pair(ex)
    args = random_inputs(ex, 0)
    with context():
        module = parse_module(ref_text)
        inline_calls(module, "reference.mlir")  # as entangle-normalize does first
        assert rewrite_idioms(module) == 0
        assert module.operation.verify()
        rewritten = str(module)
    before = execute_replicas(ref_text, [args], fast=True)[0]
    after = execute_replicas(rewritten, [args], fast=True)[0]
    for b, a in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
