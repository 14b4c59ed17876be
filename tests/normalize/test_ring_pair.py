"""A differentiated ring folded by its invariant (`normalize/ring_pair.py`, issue 19): jax's
gradient of a ring attention `fori_loop` is a forward loop storing each step's residuals at
its counter's row and a backward loop reading them at n - 1 - t; the pair becomes its closed
form at any trip count (the running max's cotangent, the scaled cotangents and each step's
contributions shown for one generic step by `polynomial.is_zero`).

Grounded by execution: the folded module computes the original's numbers (XLA, 4 simulated
devices), and `examples/ring_loop.py`'s training program computes the reference gradients
and is proven at cp 2, 4 and 8 (cp 32: lit_tests/regressions/ring_attention_loop_grad_32_
invariant.mlir; cp 8 to 64 of the Llama-3 stack: benchmarks/RING_RESULTS.md). The nearest
wrong programs each compute other gradients and are not proven: the four of
test_residual_pairs.py (a buffer written at row i + 1, the backward reading step i, dK rotated
back the wrong way, the backward one trip short) and two that only change values: the stored
probabilities shifted by another row's max (the max broadcast along the keys), and the
output's cotangent never rescaled, dV's contribution contracting the probabilities' keys.
The fold refuses all but the wrong rotation (whose invariant holds: it is the ring's
direction the layout tier then finds wrong): the first two at the running max's cotangent
(it no longer cancels), the last at the contributions' check; and the
strict mode (the generic step's sums may overflow) leaves the pair to `unroll.py`."""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import numpy as np
import pytest
from jaxlib.mlir import ir

from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import context, parse_module, while_loops
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize.finite import Finiteness, judging
from entangle_mlir.normalize.ring_pair import (
    _Backward,
    _forward,
    _Known,
    _Pair,
    fold_ring_pairs,
)
from examples import ring_loop
from examples.real.catalog import lower_pair
from examples.real.repro import reproducers
from tests.normalize.test_online_softmax import _run_partitioned
from tests.normalize.test_residual_pairs import WRONG
from tests.normalize.test_unroll_backward import LOOP


@pytest.fixture(scope="module")
def lowered():
    (ex,) = [r.example for r in reproducers() if r.example.name == LOOP]
    ref, text = lower_pair(ex)
    return ex, ref, text, _run_partitioned(ex, text)


def _folded(text: str, assume_no_overflow: bool = True) -> tuple[int, str, list[str]]:
    """(pairs folded, the module after `fold_ring_pairs` alone, its notes)."""
    notes: list[str] = []
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with judging(Finiteness(assume_no_overflow)), module.context:
            count = fold_ring_pairs(module, None, notes)
        assert module.operation.verify()
        return count, str(module), notes


def test_the_fold_leaves_no_loop_and_computes_the_same_numbers(lowered) -> None:
    ex, _, text, right = lowered
    count, folded, notes = _folded(text)
    assert count == 1 and len(notes) == 1
    assert "#16: the running max's cotangent" in notes[0]
    body = folded.split("sdy.manual_computation", 1)[1].split("func.func private", 1)[0]
    for gone in ("stablehlo.while", "dynamic_update_slice", "dynamic_slice"):
        assert gone not in body, gone
    for a, b in zip(right, _run_partitioned(ex, folded), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_the_strict_mode_leaves_the_pair_to_unrolling(lowered) -> None:
    """The generic step's sums and products of carries are finite only under
    `--assume-no-overflow` (the scores may overflow): by default nothing folds."""
    _, _, text, _ = lowered
    assert _folded(text, assume_no_overflow=False)[0] == 0


def test_the_generic_step_refuses_a_wrong_invariant_of_the_max_cotangent(lowered) -> None:
    """The running max's cotangent (#16) is the output's pairing with its cotangent (#15)
    plus the denominator's with its own (#17); paired with dq (#14) instead, the scratch
    step's algebra does not cancel and nothing is zeroed."""
    _, _, text, _ = lowered
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with judging(Finiteness(True)), module.context, ir.Location.unknown():
            first, second = while_loops(module)[:2]
            forward = _forward(first)
            reader = _Backward(second, forward)
            assert reader.read()
            assert (sorted(forward.accs), sorted(reader.accs), sorted(reader.scaled),
                    reader.others) == ([17, 19], [14, 18, 19], [15, 17], [16])
            pair = _Pair(forward, reader, _Known())
            assert not pair._zeroed(16, {17: 14, 19: 17})
            assert not pair.zeroed
            assert pair._zeroed(16, {17: 15, 19: 17})
            assert pair.zeroed == 2


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_attention_training_is_proven_folded_at_each_ring_length(n: int) -> None:
    want, got = ring_loop.run(n, grad=True)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    report = check_texts(*ring_loop.lower(n, grad=True), verify_rules=True,
                         assume_no_overflow=True)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    assert any(f"folded by their invariant over {n} trips" in note for note in report.notes)


def _other_rows_max(text: str) -> str:
    """The stored probabilities shifted by the running max broadcast along the keys (row r,
    key k shifted by m[k]) instead of the rows; the forward's own sums keep the right ones."""
    stored = ", %35, %38, "
    assert text.count(stored) == 1
    text = text.replace(stored, ", %pw, %38, ")
    ret = "    return %0, %46, %21, "
    assert text.count(ret) == 1
    return text.replace(ret, (
        "    %pb = stablehlo.broadcast_in_dim %21, dims = [1] : (tensor<2xf32>) -> "
        "tensor<2x2xf32>\n"
        "    %ps = stablehlo.subtract %13, %pb : tensor<2x2xf32>\n"
        "    %pw = stablehlo.exponential %ps : tensor<2x2xf32>\n") + ret)


def _cotangent_unscaled(text: str) -> str:
    """The backward passes the output's cotangent on without the step's rescale."""
    ret = "return %37, %10, %28, %16, %39, %4 "
    assert text.count(ret) == 1
    return text.replace(ret, "return %37, %arg2, %28, %16, %39, %4 ")


def _values_against_keys(text: str) -> str:
    """dV's step contribution contracts the output's cotangent with the probabilities' key
    dim instead of their rows (p, not p^T: its blocks are square). The running max's
    cotangent does not read it: only the contributions' check can refuse it."""
    dot = "%2 = stablehlo.dot_general %arg2, %arg13, contracting_dims = [0] x [0]"
    assert text.count(dot) == 1
    return text.replace(dot, dot.replace("[0] x [0]", "[0] x [1]"))


TWINS = {name: mutate for name, (mutate, _) in WRONG.items()}
TWINS |= {"other_rows_max": _other_rows_max, "cotangent_unscaled": _cotangent_unscaled,
          "values_against_keys": _values_against_keys}
FOLDS = {"rotated_wrong_way"}
"""The twins whose pair still folds (their invariant holds; the layout tier then refuses)."""


@pytest.mark.parametrize("name", list(TWINS))
def test_the_nearest_wrong_programs_compute_other_gradients_and_are_not_proven(
        lowered, name: str) -> None:
    ex, ref, text, right = lowered
    wrong = TWINS[name](text)
    assert wrong != text
    broken = _run_partitioned(ex, wrong)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(right, broken, strict=True))
    count, folded, _ = _folded(wrong)
    assert count == (1 if name in FOLDS else 0)
    if not count:
        with context():
            assert len(while_loops(parse_module(folded))) == 2
    report = check_texts(ref, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()
