"""Ring attention training with the ring in `lax.fori_loop` (`unroll.forward_residuals`).

jax's gradient of the loop is two loops: the forward stores each step's residuals into
buffers at the counter (`dynamic_update_slice`), the backward reads them back at `n - 1 - i`
(`dynamic_slice`). entangle-normalize unrolls both (a collective_permute in each body), folds
the counters to constants and forwards every read of a buffer slot to the value stored there;
the backward's zero-started carries (a reverse permute of zeros, `0 + x`) are dropped. The
program is then the Python-unrolled ring's, and `repro_ring_attention_loop_grad` is proven.

Grounded by execution: XLA runs the partitioned program before and after normalizing to the
same numbers, and a hand-written module's reads (slots written at constant indices, clamped
indices, a disjoint later write, a read overlapping a write in part, a read of an unwritten
slot) compute the same values after forwarding. Near misses, the backward reading one step's
residual at another step (one slot off, or in the forward's order), compute other gradients
and are not proven (under `--assume-no-overflow`: the scores may overflow,
tests/normalize/test_online_backward.py)."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize.unroll import forward_residuals, unroll_ring_loops
from examples.real.catalog import lower_pair
from examples.real.repro import reproducers
from tests.judging import assert_judged
from tests.normalize.test_online_softmax import _run_partitioned

LOOP = "repro_ring_attention_loop_grad_cp4"


def _example():
    (ex,) = [r.example for r in reproducers() if r.example.name == LOOP]
    return ex


def _unrolled(text: str) -> str:
    """The module with its ring loops unrolled and their residuals forwarded, nothing else."""
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with module.context:
            assert unroll_ring_loops(module) == 2
            assert forward_residuals(module) > 0
        assert module.operation.verify()
        return str(module)


def _main(text: str) -> str:
    """The text of the shard_map body (the private helpers keep their own buffers)."""
    return text.split("sdy.manual_computation", 1)[1].split("func.func private", 1)[0]


def test_fori_loop_ring_training_is_proven_with_every_rule_instance_proved() -> None:
    assert_judged(_example(), True, atol=1e-5, assume_no_overflow=True)


def test_unrolling_and_forwarding_are_exact_and_leave_no_buffer() -> None:
    ex = _example()
    _, text = lower_pair(ex)
    assert text.count("stablehlo.while") == 2
    rewritten = _unrolled(text)
    body = _main(rewritten)
    for gone in ("stablehlo.while", "dynamic_update_slice", "dynamic_slice"):
        assert gone not in body, gone
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _reads(text: str) -> tuple[str, str, str, list[str]]:
    """(n - i, i, n - 1 - i, the backward loop's residual reads at n - 1 - i)."""
    found = re.search(r"(%\w+) = stablehlo\.subtract %c\w*, (%iterArg\w*) : tensor<i32>", text)
    assert found is not None
    rev, counter = found.groups()
    index = re.search(rf"(%\w+) = stablehlo\.subtract {rev}, %c\w* : tensor<i32>", text)
    assert index is not None
    reads = re.findall(rf"func\.call @dynamic_index_in_dim\w*\(%\w+, {index.group(1)}\)", text)
    return rev, counter, index.group(1), reads


MISREADS = [("off_by_one", 0), ("forward_order", 1), ("off_by_one", 6), ("forward_order", 6),
            ("off_by_one", 11), ("forward_order", 11)]
"""(how, which read): the step's transposed key block, its mask, its probabilities (on which
the online-softmax rewrites used to cycle: `rewrites._cycled` stops them), its value block (jax's
order of the residuals: transposed keys, mask, tie indicator, tie count, the max's two tie
shares, probabilities, correction, previous denominator, correction as a column, previous
output, value block). `off_by_one` reads slot n - i (the first step's clamped back to
n - 1). (The tie residuals read at the wrong step compute the same gradients: the max's
cotangent they scale is zero.)"""


@pytest.mark.parametrize("how,which", MISREADS)
def test_a_residual_read_at_the_wrong_step_computes_other_gradients_and_is_not_proven(
        how: str, which: int) -> None:
    ex = _example()
    ref, text = lower_pair(ex)
    rev, counter, index, reads = _reads(text)
    assert len(reads) == 12
    read, at = reads[which], rev if how == "off_by_one" else counter
    wrong = text.replace(read, read.replace(f", {index})", f", {at})"))
    assert wrong != text
    right, broken = _run_partitioned(ex, text), _run_partitioned(ex, wrong)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(right, broken, strict=True))
    report = check_texts(ref, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()


STORES = """
func.func @main(%buf: tensor<4x3xf32>, %a: tensor<3xf32>, %b: tensor<2x3xf32>,
                %i: tensor<i32>) -> (tensor<3xf32>, tensor<2x3xf32>, tensor<2x3xf32>,
                                     tensor<1x3xf32>, tensor<1x3xf32>, tensor<3xf32>,
                                     tensor<1x3xf32>, tensor<2x3xf32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c3 = stablehlo.constant dense<3> : tensor<i32>
  %c9 = stablehlo.constant dense<9> : tensor<i32>
  %one = stablehlo.add %c0, %c1 : tensor<i32>
  %two = stablehlo.subtract %c3, %one : tensor<i32>
  %a1 = stablehlo.broadcast_in_dim %a, dims = [1] : (tensor<3xf32>) -> tensor<1x3xf32>
  %w1 = stablehlo.dynamic_update_slice %buf, %a1, %one, %c0 : (tensor<4x3xf32>, tensor<1x3xf32>, tensor<i32>, tensor<i32>) -> tensor<4x3xf32>
  %w2 = stablehlo.dynamic_update_slice %w1, %b, %c9, %c0 : (tensor<4x3xf32>, tensor<2x3xf32>, tensor<i32>, tensor<i32>) -> tensor<4x3xf32>
  %r1 = stablehlo.dynamic_slice %w2, %one, %c0, sizes = [1, 3] : (tensor<4x3xf32>, tensor<i32>, tensor<i32>) -> tensor<1x3xf32>
  %v1 = stablehlo.reshape %r1 : (tensor<1x3xf32>) -> tensor<3xf32>
  %r2 = stablehlo.dynamic_slice %w2, %two, %c0, sizes = [2, 3] : (tensor<4x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
  %r3 = stablehlo.dynamic_slice %w2, %one, %c0, sizes = [2, 3] : (tensor<4x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
  %r4 = stablehlo.dynamic_slice %w2, %c0, %c0, sizes = [1, 3] : (tensor<4x3xf32>, tensor<i32>, tensor<i32>) -> tensor<1x3xf32>
  %r5 = stablehlo.dynamic_slice %w2, %i, %c0, sizes = [1, 3] : (tensor<4x3xf32>, tensor<i32>, tensor<i32>) -> tensor<1x3xf32>
  %r6 = stablehlo.slice %w2 [1:2, 0:3] : (tensor<4x3xf32>) -> tensor<1x3xf32>
  %v6 = stablehlo.reshape %r6 : (tensor<1x3xf32>) -> tensor<3xf32>
  %r7 = stablehlo.dynamic_slice %w2, %c9, %c0, sizes = [1, 3] : (tensor<4x3xf32>, tensor<i32>, tensor<i32>) -> tensor<1x3xf32>
  %w3 = stablehlo.dynamic_update_slice %w2, %a1, %two, %c0 : (tensor<4x3xf32>, tensor<1x3xf32>, tensor<i32>, tensor<i32>) -> tensor<4x3xf32>
  %r8 = stablehlo.dynamic_slice %w3, %two, %c0, sizes = [2, 3] : (tensor<4x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
  return %v1, %r2, %r3, %r4, %r5, %v6, %r7, %r8 : tensor<3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<1x3xf32>, tensor<1x3xf32>, tensor<3xf32>, tensor<1x3xf32>, tensor<2x3xf32>
}
"""
"""Row 1 written (index 0 + 1), rows 2-3 written at index 9 (clamped to 2); reads: row 1
(past the disjoint later write: `a`), rows 2-3 at 3 - 1 (`b`), rows 1-2 (overlaps the later
write in part: kept), row 0 (never written: kept), a non-constant row (kept), row 1 by a
static slice (`a`), row 3 at 9 (clamped to 3: inside `b`, not all of it: kept), rows 2-3
after `a` overwrote row 2 (`b` no longer: kept)."""


def _run(text: str, *args: np.ndarray) -> list[np.ndarray]:
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(text, xla_client.DeviceList((device,)),
                                   xla_client.CompileOptions())
    out = exe.execute_sharded([jax.device_put(a, device) for a in args])
    return [np.asarray(x) for x in out.disassemble_into_single_device_arrays()[0]]


def test_reads_at_constant_indices_forward_exactly_the_slot_written() -> None:
    with context():
        module = parse_module(STORES)
        with module.context:
            forwarded = forward_residuals(module)
        assert module.operation.verify()
        after = str(module)
    # two counter folds, three reads forwarded
    assert forwarded == 5
    assert after.count("stablehlo.dynamic_slice") == 5 and "stablehlo.slice" not in after
    assert after.count("stablehlo.reshape") == 0
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((4, 3), dtype=np.float32),
            rng.standard_normal(3, dtype=np.float32),
            rng.standard_normal((2, 3), dtype=np.float32))
    for row in (0, 1, 3, 7):
        inputs = (*args, np.int32(row))
        for b, a in zip(_run(STORES, *inputs), _run(after, *inputs), strict=True):
            np.testing.assert_array_equal(a, b)
