"""jax.nn.logsumexp guards its max (`select(is_finite(m), m, 0)`); a vocab-parallel
log-sum-exp over a column-parallel head shifts by the pmax of the devices' maxima, unguarded.
The two agree on every finite logit, and differ where a logit overflows (the guarded shift is
0 there, the unguarded one inf: inf against NaN). The policy does not assume overflow away, so
the pair is not proven by default; the driver checks it again under `--assume-no-overflow`
and, where that proves it, says the guard is the only reason (exit 3, inconclusive), not a
"cannot relate" or a bug. A wrong twin (the devices' exp sums not summed) is not proven
under the assumption either, and keeps its own diagnostic first.

The gradient adds the jvp of `abs` (`select(s >= 0, g / |s|, 0) - select(s >= 0, 0, g / |s|)`
over `s = sum(exp(x - m))`): `idioms._decided_select` takes the branch the ranges decide
(`s >= 0` for every value s may hold, and s not NaN). It must not fire where the ranges
overlap, where the operand may be NaN (`|exp(x) - exp(y)|` is NaN where both overflow, and
NaN >= 0 is false), or on a TOTALORDER compare.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.normalize.finite import NO_OVERFLOW, Finiteness, judging
from entangle_mlir.normalize.rewrites import rewrite_idioms
from examples.real.catalog import lower_pair, run_pair_on
from tests.rules.grounding import ArgDef, difference, pair

MESH = (("tp", 4),)
ARGS = (ArgDef("hidden", (8, 16), "float32", "data", P()),
        ArgDef("w_out", (16, 64), "float32", "weight", P(None, "tp")))
GUARD = "select(is_finite(m), m, 0)"


def reference(hidden, w_out):
    return jax.nn.logsumexp(hidden @ w_out, axis=-1)


def _vocab_parallel(summed: bool):
    def body(hidden, w_out):
        logits = hidden @ w_out
        m = lax.pmax(lax.stop_gradient(jnp.max(logits, axis=-1)), "tp")
        total = jnp.sum(jnp.exp(logits - m[:, None]), axis=-1)
        return jnp.log(lax.psum(total, "tp") if summed else total) + m

    return body


def _inputs(scale: float, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(scale * rng.standard_normal((8, 16))).astype(np.float32),
            rng.standard_normal((16, 64)).astype(np.float32)]


def test_unguarded_shift_is_equal_unless_a_logit_overflows_and_says_so():
    ex = pair("vocab_parallel_lse", MESH, reference, _vocab_parallel(True), ARGS, P())
    assert difference(ex, _inputs(1.0)) <= 1e-5
    ref, got = run_pair_on(ex, _inputs(1e38))
    overflowed = np.isposinf(ref[0]) & np.isnan(got[0])
    assert overflowed.any(), (ref, got)
    texts = lower_pair(ex)
    report = check_texts(*texts, verify_rules=False)
    assert not report.proven
    assert GUARD in report.diagnostics[0].message, report.render_text()
    assert report.diagnostics[0].category == "overflow"
    assert report.exit_code == 3
    assert report.stats["assuming no overflow"] == "proven"
    assumed = check_texts(*texts, verify_rules=False, assume_no_overflow=True)
    assert assumed.proven and NO_OVERFLOW in assumed.assumptions, assumed.render_text()


def test_exp_sums_not_summed_over_devices_keep_their_own_diagnostic():
    ex = pair("vocab_parallel_lse_unsummed", MESH, reference, _vocab_parallel(False), ARGS,
              P(), bug=True)
    assert difference(ex, _inputs(1.0)) > 0.1
    texts = lower_pair(ex)
    report = check_texts(*texts, verify_rules=False)
    assert not report.proven
    assert report.stats["assuming no overflow"] != "proven"
    assert GUARD not in report.diagnostics[0].message, report.render_text()
    assert not check_texts(*texts, verify_rules=False, assume_no_overflow=True).proven


def test_gradient_through_the_guard_and_the_jvp_of_abs():
    """jax.grad of both (the shard_map's gradient taken outside it): equal by execution;
    proven under the assumption (the guard dropped, the jvp of abs decided by
    `sum(exp(x - m)) >= 0`), and by default the guard is said to be the reason."""
    mesh = jax.make_mesh((4,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
    specs = (P(), P(None, "tp"))
    sharded = jax.shard_map(_vocab_parallel(True), mesh=mesh, in_specs=specs, out_specs=P())
    program = jax.grad(lambda h, w: sharded(h, w).sum(), argnums=(0, 1))
    want_fn = jax.grad(lambda h, w: reference(h, w).sum(), argnums=(0, 1))
    inputs = _inputs(1.0)
    placed = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(inputs, specs)]
    got, want = jax.jit(program)(*placed), jax.jit(want_fn)(*inputs)
    assert all(np.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    texts = (jax.jit(want_fn).lower(*[jax.ShapeDtypeStruct(x.shape, x.dtype)
                                      for x in inputs]).as_text(),
             jax.jit(program).lower(*[jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                           sharding=NamedSharding(mesh, s))
                                      for x, s in zip(inputs, specs)]).as_text())
    assumed = check_texts(*texts, verify_rules=False, assume_no_overflow=True)
    assert assumed.proven, assumed.render_text()
    report = check_texts(*texts, verify_rules=False)
    assert GUARD in report.diagnostics[0].message, report.render_text()


SELECT = """
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %a: tensor<4xf32>,
                %b: tensor<4xf32>) -> tensor<4xf32> {{
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %m = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [1]
      : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %shifted = stablehlo.subtract %x, %mb : tensor<4x8xf32>
  %e = stablehlo.exponential %shifted : tensor<4x8xf32>
  %ex = stablehlo.exponential %x : tensor<4x8xf32>
  %ey = stablehlo.exponential %y : tensor<4x8xf32>
  %diff = stablehlo.subtract %ex, %ey : tensor<4x8xf32>
  %gap = stablehlo.abs %diff : tensor<4x8xf32>
  %v = {value} : tensor<4x8xf32>
  %s = stablehlo.reduce(%v init: %zero) applies stablehlo.add across dimensions = [1]
      : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<4xf32>
  %p = stablehlo.compare {direction}, %s, %z, {kind} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  %r = stablehlo.select %p, %a, %b : tensor<4xi1>, tensor<4xf32>
  return %r : tensor<4xf32>
}}
"""


def _selects_left(value: str, direction: str = "GE", kind: str = "FLOAT",
                  assume_no_overflow: bool = False) -> int:
    text = SELECT.format(value=f"stablehlo.add {value}, {value}" if value != "%x" else
                         "stablehlo.add %x, %x", direction=direction, kind=kind)
    with context():
        module = parse_module(text)
        with judging(Finiteness(assume_no_overflow)):
            rewrite_idioms(module)
        return str(module).count("stablehlo.select")


@pytest.mark.parametrize("direction, decided", [("GE", True), ("GT", False), ("LT", True),
                                                ("NE", False)])
def test_a_compare_the_ranges_decide_picks_its_branch(direction: str, decided: bool):
    """2 * sum(exp(x - max x)) lies in [0, 16]: >= 0 is always true, < 0 always false; > 0
    and != 0 are not decided by the range (an underflow makes it 0)."""
    assert _selects_left("%e", direction) == (0 if decided else 1)


@pytest.mark.parametrize("value, assume", [("%x", True), ("%gap", False), ("%gap", True)])
def test_a_compare_the_ranges_leave_open_or_a_nan_may_reach_stays(value: str, assume: bool):
    """A sum of inputs may be negative; |exp(x) - exp(y)| >= 0 by its range, but it is NaN
    where both exps overflow (inf - inf), and NaN >= 0 is false: the select stays, also under
    --assume-no-overflow (an exp overflows whatever is assumed of sums and products)."""
    assert _selects_left(value, assume_no_overflow=assume) == 1


def test_a_totalorder_compare_stays():
    assert _selects_left("%e", kind="TOTALORDER") == 1
