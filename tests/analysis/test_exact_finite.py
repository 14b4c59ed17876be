"""Issue 16, classes 6 and 7, and the assumptions every report states.

Class 6: a proof may assume only that float sums and products are reassociated and that the
inputs hold no NaN/Inf. A sharded program that overflows where the reference cannot is wrong:
the log-sum-exp without its max shift, a per-shard max undone by exp(m) before the psum, a
shift `m * 1e38`. Grounded with chosen inputs (logits of 100 and 1e4, where exp overflows in
float32): the numbers differ (inf/nan against finite) and the pair is not proven; the
max-shifted twin (pmax) computes the reference's numbers on the same inputs and is proven.

Class 7: the reference walk's rule instances are Z3-checked like the sharded walk's; a wrong
rule instance on the reference side is refuted and withdraws the proof.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.core.report import FINITE_INPUTS, REASSOCIATION
from entangle_mlir.driver import check_texts
from examples.real.catalog import Example, custom, lower_pair, make_mesh, run_pair_on, sharded_fn
from examples.real.programs import ArgDef
from tests.shared import REPO

TP = "tp"
MESH = (("tp", 4),)
ARGS = (ArgDef("x", (8, 16), "float32", "data", P(None, TP)),)


def lse_ref(x):
    m = jnp.max(x, axis=-1, keepdims=True)
    return jnp.log(jnp.sum(jnp.exp(x - m), axis=-1)) + m[:, 0]


def lse_pmax(x):
    """The correct twin: the global max (pmax) shifts every shard alike."""
    m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), TP)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m), axis=-1), TP)) + m[:, 0]


def lse_no_max(x):
    """No shift: exp(x) overflows for x above ~88 in float32."""
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x), axis=-1), TP))


def lse_local_max_rescaled(x):
    """Each shard's own max, undone by exp(m) before the psum: exp(m) overflows."""
    m = jnp.max(x, axis=-1, keepdims=True)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x - m), axis=-1) * jnp.exp(m[:, 0]), TP))


def lse_huge_shift(x):
    """A per-shard shift `m * 1e38`, undone by exp(shift): 0 * inf = NaN."""
    shift = jnp.max(x, axis=-1, keepdims=True) * 1e38
    return jnp.log(lax.psum(jnp.sum(jnp.exp(x - shift), axis=-1) * jnp.exp(shift[:, 0]), TP))


def _ex(body) -> Example:
    return custom(f"finite_{body.__name__}", MESH, lse_ref, body, ARGS, P(), body.__name__)


def _inputs(scale: float) -> np.ndarray:
    """Logits around `scale` (exp overflows in float32 from ~88.7 on)."""
    rng = np.random.default_rng(0)
    return (scale + rng.standard_normal((8, 16))).astype(np.float32)


def _run(ex: Example, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reference, sharded) outputs on the chosen input, the sharded one on 4 devices."""
    ref = np.asarray(jax.jit(ex.reference)(x))
    placed = jax.device_put(x, NamedSharding(make_mesh(ex), ex.args[0].spec))
    out = jax.tree.leaves(sharded_fn(ex)(placed))
    return ref, np.asarray(out[0])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(a) == np.isfinite(b))) and np.allclose(
        a[np.isfinite(a)], b[np.isfinite(b)], rtol=1e-5, atol=1e-4)


OVERFLOWING = [lse_no_max, lse_local_max_rescaled, lse_huge_shift]


@pytest.mark.parametrize("body", OVERFLOWING, ids=[b.__name__ for b in OVERFLOWING])
def test_a_sharded_log_sum_exp_that_overflows_is_not_proven(body) -> None:
    ex = _ex(body)
    for scale in (100.0, 1e4):
        ref, shd = _run(ex, _inputs(scale))
        assert np.isfinite(ref).all(), ref
        assert not np.isfinite(shd).all() and not _same(ref, shd), (scale, shd)
    report = check_texts(*lower_pair(ex))
    assert not report.proven, report.render_text()


def test_the_max_shifted_twin_is_proven_and_equal_on_large_inputs() -> None:
    ex = _ex(lse_pmax)
    for scale in (0.0, 100.0, 1e4):
        ref, shd = _run(ex, _inputs(scale))
        assert np.isfinite(ref).all() and _same(ref, shd), (scale, ref, shd)
    report = check_texts(*lower_pair(ex))
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    assert report.assumptions[:2] == [REASSOCIATION, FINITE_INPUTS]


# ----- class 6: the shift a rewrite drops, computed by sums and products -----------------------
# `idioms._shifted_lse` / `_rescaled_exp_sum` drop a shift m from `log(sum(exp(t - m))) + m`
# and `sum(exp(t - m)) * exp(m)` where t is bounded (here tanh(x)). A shift that is a product
# or a sum of two large inputs overflows to +inf (`finite.nonfinite_kinds` reads it as finite),
# and a large finite or bounded shift flushes every term of the shifted sum to zero: log(0) + m
# is -inf or NaN where the reference's log(sum(exp(tanh(x)))) is finite. These were proven
# (the rewrite erased m, and the slices of x it was computed from, from the program); now the
# shifted sum's terms must stay normal (`idioms._unshifted_exact`).

def tanh_lse_ref(x):
    return jnp.log(jnp.sum(jnp.exp(jnp.tanh(x)), axis=-1))


def low_lse_ref(x):
    return jnp.log(jnp.sum(jnp.exp(-83.0 + 3 * jnp.tanh(x)), axis=-1))


def _pair(x):
    """Two columns of each shard's block of x: the factors of a shift."""
    return jnp.abs(x[:, 0:1]), jnp.abs(x[:, 1:2])


def tanh_lse_pmax(x):
    """The correct twin: shifted by the global max of tanh(x), added back."""
    t = jnp.tanh(x)
    m = lax.pmax(jnp.max(t, axis=-1, keepdims=True), TP)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(t - m), axis=-1), TP)) + m[:, 0]


def tanh_lse_product_shift(x):
    """Shifted by pmax(|a| * |b|): +inf when a * b overflows, 1e32 (every term 0) below."""
    a, b = _pair(x)
    m = lax.pmax(a * b, TP)
    t = jnp.tanh(x)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(t - m), axis=-1), TP)) + m[:, 0]


def tanh_lse_sum_shift(x):
    """Shifted by pmax(|a| + |b|): +inf when the sum overflows."""
    a, b = _pair(x)
    m = lax.pmax(a + b, TP)
    t = jnp.tanh(x)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(t - m), axis=-1), TP)) + m[:, 0]


def tanh_lse_bounded_shift(x):
    """A bounded, finite shift 110 + tanh(a): exp(t - m) is 0 in float32 for every term."""
    a, _ = _pair(x)
    m = lax.pmax(110.0 + jnp.tanh(a), TP)
    t = jnp.tanh(x)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(t - m), axis=-1), TP)) + m[:, 0]


def tanh_lse_local_max_rescaled(x):
    """The correct twin of the rescaled form: each shard's own max of tanh(x), undone by
    exp(m) before the psum."""
    t = jnp.tanh(x)
    m = jnp.max(t, axis=-1, keepdims=True)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(t - m), axis=-1) * jnp.exp(m[:, 0]), TP))


def tanh_lse_rescaled_product_shift(x):
    """A per-shard shift |a| * |b| undone by exp(m): exp(m) overflows (never proven: the
    shift's range is unbounded)."""
    a, b = _pair(x)
    m = a * b
    t = jnp.tanh(x)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(t - m), axis=-1) * jnp.exp(m[:, 0]), TP))


def low_lse_rescaled_bounded_shift(x):
    """Terms near exp(-83) (normal in float32) shifted by a per-shard 20 + 3 tanh(a * b):
    exp(t - m) ~ exp(-106) is 0, so the rescaled sum is 0 where the reference's is 1e-35."""
    a, b = _pair(x)
    m = 20.0 + 3 * jnp.tanh(a * b)
    t = -83.0 + 3 * jnp.tanh(x)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(t - m), axis=-1) * jnp.exp(m[:, 0]), TP))


def _with_pair(value: float) -> np.ndarray:
    """N(0, 1) inputs whose two shift columns of every shard hold `value`."""
    x = _inputs(0.0)
    x[:, 0::4] = value
    x[:, 1::4] = value
    return x


SHIFTS = [  # (reference, sharded, inputs on which they differ)
    (tanh_lse_ref, tanh_lse_product_shift, [1e20, 1e16]),
    (tanh_lse_ref, tanh_lse_sum_shift, [3e38]),
    (tanh_lse_ref, tanh_lse_bounded_shift, [1.0]),
    (tanh_lse_ref, tanh_lse_rescaled_product_shift, [1e20]),
    (low_lse_ref, low_lse_rescaled_bounded_shift, [1.0]),
]


@pytest.mark.parametrize(("reference", "body", "values"), SHIFTS,
                         ids=[b.__name__ for _, b, _ in SHIFTS])
def test_a_dropped_shift_that_overflows_or_underflows_is_not_proven(reference, body,
                                                                     values) -> None:
    ex = custom(f"finite_{body.__name__}", MESH, reference, body, ARGS, P(), body.__name__)
    for value in values:
        (ref,), (shd,) = run_pair_on(ex, [_with_pair(value)])
        assert np.isfinite(ref).all(), ref
        assert not _same(ref, shd), (value, ref, shd)
    report = check_texts(*lower_pair(ex))
    assert not report.proven, report.render_text()


@pytest.mark.parametrize("body", [tanh_lse_pmax, tanh_lse_local_max_rescaled])
def test_a_dropped_max_shift_of_bounded_values_is_proven(body) -> None:
    """The twins: the shift is the (global or per-shard) max of tanh(x), so every shifted
    term lies in [exp(-2), 1]; the rewrite fires and the pair is proven, and the numbers
    agree on the same inputs, large shift columns included."""
    ex = custom(f"finite_{body.__name__}", MESH, tanh_lse_ref, body, ARGS, P(), body.__name__)
    for value in (1.0, 1e20, 3e38):
        (ref,), (shd,) = run_pair_on(ex, [_with_pair(value)])
        assert np.isfinite(ref).all() and _same(ref, shd), (value, ref, shd)
    report = check_texts(*lower_pair(ex))
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


def test_kinds_take_an_exp_or_a_huge_scaling_of_finite_values_as_overflowing() -> None:
    """`finite.nonfinite_kinds`: exp of an unbounded finite value and `m * 1e38` may be +-inf;
    exp of `x - max(x)` is in (0, 1] and stays finite; tanh stays finite."""
    from jaxlib.mlir import ir

    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.normalize import finite
    from entangle_mlir.normalize.bounds import interval

    text = """
    func.func @main(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>,
        tensor<2x4xf32>, tensor<2x4xf32>) {
      %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %big = stablehlo.constant dense<1.0e38> : tensor<2x4xf32>
      %m = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [1]
        : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
      %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<2xf32>) -> tensor<2x4xf32>
      %d = stablehlo.subtract %x, %mb : tensor<2x4xf32>
      %shifted = stablehlo.exponential %d : tensor<2x4xf32>
      %plain = stablehlo.exponential %x : tensor<2x4xf32>
      %huge = stablehlo.multiply %mb, %big : tensor<2x4xf32>
      %t = stablehlo.tanh %x : tensor<2x4xf32>
      return %shifted, %plain, %huge, %t : tensor<2x4xf32>, tensor<2x4xf32>,
        tensor<2x4xf32>, tensor<2x4xf32>
    }"""
    with context():
        module = parse_module(text)
        func = module.body.operations[0]
        ret = list(func.regions[0].blocks[0].operations)[-1]
        shifted, plain, huge, t = ret.operands
        assert finite.nonfinite_kinds(shifted, {}) == 0 and interval(shifted) == (0.0, 1.0)
        assert finite.nonfinite_kinds(plain, {}) & finite.POS
        assert finite.nonfinite_kinds(huge, {}) & (finite.POS | finite.NEG) == (
            finite.POS | finite.NEG)
        assert finite.nonfinite_kinds(t, {}) == 0
        assert isinstance(ir.RankedTensorType(t.type).element_type, ir.F32Type)


# ----- class 7: the reference walk is checked -------------------------------------------------

def test_reference_rule_instances_are_counted_and_checked() -> None:
    report = check_texts(*lower_pair(_ex(lse_pmax)))
    by_walk = report.stats["rule_instances_by_walk"]
    assert by_walk["reference"]["proved"] > 0 and by_walk["sharded"]["proved"] > 0
    assert report.stats["rule_instances"]["proved"] == (
        by_walk["reference"]["proved"] + by_walk["sharded"]["proved"])
    assert "of them in the reference walk" in report.mode


def _exp_ref(x):
    return jnp.exp(x)


def _tanh_body(x):
    return jnp.tanh(x)


def test_a_wrong_reference_rule_is_refuted_and_the_proof_withdrawn(monkeypatch) -> None:
    """A rule that is wrong on the reference side only (exp read as tanh when the walk has
    no reference to compare with, i.e. in the reference walk) makes a sharded tanh meet the
    reference's exp: without the reference's checks that was "verified". Executed, the
    numbers differ; now the reference instance is refuted and the pair is not proven."""
    from entangle_mlir.core import terms
    from entangle_mlir.core.relations import Rel
    from entangle_mlir.rules import RULES

    ex = custom("finite_wrong_reference_rule", MESH, _exp_ref, _tanh_body, ARGS,
                P(None, TP), "exp vs tanh")
    x = _inputs(0.0)
    ref, shd = _run(ex, x)
    assert not np.allclose(ref, shd, atol=1e-3)

    right = RULES["stablehlo.exponential"]

    def wrong(info, inputs, ctx):
        outputs = right(info, inputs, ctx)
        if ctx.reference is not None or not isinstance(outputs[0], Rel):
            return outputs
        (arg,) = outputs[0].term.args
        return [Rel(terms.make_elementwise("stablehlo.tanh", (arg,)), outputs[0].tiling,
                    outputs[0].partial, scope=outputs[0].scope)]

    monkeypatch.setitem(RULES, "stablehlo.exponential", wrong)
    texts = lower_pair(ex)
    unchecked = check_texts(*texts, verify_rules=False)
    assert unchecked.proven, unchecked.render_text()  # the wrong rule hides the difference
    report = check_texts(*texts)
    assert not report.proven, report.render_text()
    assert report.stats["rule_instances_by_walk"]["reference"]["refuted"] >= 1
    assert any("in the reference walk was refuted" in d.message for d in report.diagnostics)


def test_inject_fault_on_the_reference_walk_is_refuted(tmp_path) -> None:
    """entangle-verify-rules{inject-fault=reference:OP} doubles the reference walk's terms of
    OP before their checks: refuted, not proven."""
    from entangle_mlir.driver import check_with_pipeline

    path = str(REPO / "lit_tests" / "diagnostics" / "scale.mlir")
    pipeline = ("entangle-normalize,entangle-import-shardings,entangle-infer-relations,"
                "entangle-check-refinement,entangle-verify-rules{inject-fault="
                "reference:stablehlo.dot_general}")
    report = check_with_pipeline(path, pipeline)
    assert report.stats["rule_instances_by_walk"]["reference"]["refuted"] == 1, report.stats


# ----- assumptions in every report --------------------------------------------------------------

def test_every_report_states_its_assumptions_in_text_and_json() -> None:
    report = check_texts(*lower_pair(_ex(lse_pmax)))
    text = report.render_text()
    assert "assumptions:\n  - float sums and products are reassociated and regrouped\n" \
           "  - inputs hold no NaN or Inf" in text
    document = report.to_json()
    assert document["assumptions"] == [REASSOCIATION, FINITE_INPUTS]
    report.assume("XLA's exact constant rounding")
    report.assume("XLA's exact constant rounding")
    assert report.to_json()["assumptions"][2:] == ["XLA's exact constant rounding"]
    assert "  - XLA's exact constant rounding" in report.render_text()
