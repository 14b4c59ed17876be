"""A differentiated ring past `MAX_TRIPS` (`unroll.residual_pairs`, issue 19): jax's gradient of
a ring `fori_loop` is a forward loop storing each step's residuals at its counter's row and a
backward loop reading them at n - 1 - i; the pair is unrolled up to `MAX_RESIDUAL_TRIPS`
(benchmarks/ring.py --loop --task stack_sgd proves cp 32; RING_RESULTS.md).

Cheap: the program is `repro_ring_attention_loop_grad_cp4` (cp 4) with `MAX_TRIPS` lowered to
2, so that only the pair rule unrolls its two 4-trip loops. The correct program unrolls to the
very module the 16-trip limit gives (so its verdict, proven: test_unroll_backward.py, is
unchanged). The nearest wrong programs, each executed on 4 simulated devices to other
gradients, are not proven: a buffer written at row i + 1 (not a pair: left a loop), the
backward reading a residual at step i instead of n - 1 - i, dK (or dV) rotated back the wrong
way, the backward one trip short (not a pair: left a loop)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import context, parse_module, while_loops
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize import unroll
from examples.real.catalog import lower_pair
from examples.real.repro import reproducers
from tests.normalize.test_online_softmax import _run_partitioned
from tests.normalize.test_unroll_backward import LOOP, _reads


@pytest.fixture(scope="module")
def lowered():
    (ex,) = [r.example for r in reproducers() if r.example.name == LOOP]
    ref, text = lower_pair(ex)
    return ex, ref, text, _run_partitioned(ex, text)


@pytest.fixture
def two_trips(monkeypatch):
    """Only the pair rule unrolls a loop of more than 2 trips."""
    monkeypatch.setattr(unroll, "MAX_TRIPS", 2)


def _unrolled(text: str) -> tuple[int, str]:
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with module.context:
            count = unroll.unroll_ring_loops(module)
            unroll.forward_residuals(module)
        assert module.operation.verify()
        return count, str(module)


def test_the_pair_unrolls_to_the_module_the_trip_limit_gives(lowered, monkeypatch) -> None:
    _, _, text, _ = lowered
    count, within = _unrolled(text)
    monkeypatch.setattr(unroll, "MAX_TRIPS", 2)
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with module.context:
            found = unroll.residual_pairs(while_loops(module))
        assert sorted(found.values()) == [4, 4]
    assert (count, _unrolled(text)) == (2, (2, within))


def _forward_row_plus_one(text: str) -> str:
    """The first residual buffer written at row i + 1 (clamped: the last step's overwrites
    row n - 1, row 0 keeps its zeros)."""
    helper = text.split("func.func private @dynamic_update_index_in_dim(", 1)[1]
    helper = helper.split("return", 1)[0]
    store = re.search(r"stablehlo\.dynamic_update_slice %arg0, %0, %arg2,", helper)
    assert store is not None
    wrong = helper.replace(
        store.group(0),
        "stablehlo.dynamic_update_slice %arg0, %0, %next,").replace(
        "    %1 =", "    %one = stablehlo.constant dense<1> : tensor<i32>\n"
        "    %next = stablehlo.add %arg2, %one : tensor<i32>\n    %1 =", 1)
    return text.replace(helper, wrong)


def _backward_reads_step_i(text: str) -> str:
    _, counter, index, reads = _reads(text)
    return text.replace(reads[-1], reads[-1].replace(f", {index})", f", {counter})"))


def _rotated_the_wrong_way(text: str) -> str:
    back = "source_target_pairs = dense<[[1, 0], [2, 1], [3, 2], [0, 3]]>"
    assert text.count(back) == 2
    return text.replace(back, "source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]>", 1)


def _backward_one_trip_short(text: str) -> str:
    loops = text.split("stablehlo.while(")
    assert len(loops) == 3
    cond = "cond {\n        %c_56 = stablehlo.constant dense<4>"
    assert cond in loops[2]
    loops[2] = loops[2].replace(cond, cond[:-2] + "3>", 1)
    return "stablehlo.while(".join(loops)


WRONG = {"row_plus_one": (_forward_row_plus_one, False),
         "reads_step_i": (_backward_reads_step_i, True),
         "rotated_wrong_way": (_rotated_the_wrong_way, True),
         "one_trip_short": (_backward_one_trip_short, False)}
"""name -> (the mutation of the correct sharded text, whether it is still a pair)."""


@pytest.mark.parametrize("name", list(WRONG))
def test_the_nearest_wrong_programs_compute_other_gradients_and_are_not_proven(
        lowered, two_trips, name: str) -> None:
    ex, ref, text, right = lowered
    mutate, pair = WRONG[name]
    wrong = mutate(text)
    assert wrong != text
    broken = _run_partitioned(ex, wrong)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(right, broken, strict=True))
    assert _unrolled(wrong)[0] == (2 if pair else 0)
    report = check_texts(ref, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()
