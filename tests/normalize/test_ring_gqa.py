"""Ring attention training with grouped-query attention (Llama-3's `layers.ring_attention`):
k and v have fewer heads than q and are repeated inside each ring step
(`jnp.repeat(kb, rep, axis=2)`), so jax's backward sums each step's key and value cotangents
over the repeat (`reduce_add(reshape(transpose(dot)))`, the transpose of the repeat) before
sending them back around the reverse ring, and the query gradient contracts each step's
score cotangent with the repeated key block.

`online_backward._ring_return` moves the views and the sum over the repeat onto the
contraction over all the keys (they keep the ring steps' dim), so every step's contribution is
a slice of one `Reordered` partial value reshaped and summed over the repeat
(`rules/kinds/reordered.py`, `_partial_view_dim`); `_contracted_sum` finds the query gradient's
ring blocks under the repeat's broadcast.

Grounded by execution: XLA runs the partitioned program before and after the rewrites to the
same numbers; the reproducers (max stopped and differentiated) compute the reference's
gradients and are proven with every rule instance proved by Z3. Near misses compute other
numbers and are not proven: the kv heads tiled instead of repeated (forward and backward), the
backward's sum over the repeat taken over the kv-head dim instead (the same shape) or as a max,
and the reverse ring broken (a forward hop, a step counted twice), in the reproducer and in
the corpus program `llama3_stack_sgd_ring_cp4`. All under `--assume-no-overflow` (the scores
may overflow; tests/normalize/test_online_backward.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from examples.real.catalog import custom, lower_pair, run_pair
from examples.real.repro import (
    reproducers,
    ring_attention_gqa_grad_ref,
    ring_attention_gqa_grad_stop_max,
)
from tests.judging import assert_judged
from tests.normalize.test_online_backward import _mutated, _normalized, _reverse_permuted
from tests.normalize.test_online_softmax import _run_partitioned

STOPPED = "repro_ring_attention_gqa_grad_stop_max_cp4"
DIFFERENTIATED = "repro_ring_attention_gqa_grad_cp4"


def _repro(name: str):
    (ex,) = [r.example for r in reproducers() if r.example.name == name]
    return ex


def _close(a: list, b: list, atol: float = 1e-4) -> bool:
    return all(np.allclose(x, y, atol=atol) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", [STOPPED, DIFFERENTIATED])
def test_gqa_ring_training_is_proven(name: str) -> None:
    assert_judged(_repro(name), True, atol=1e-5, assume_no_overflow=True)


@pytest.mark.parametrize("name", [STOPPED, DIFFERENTIATED])
def test_backward_rewrites_are_exact_on_gqa_gradients(name: str) -> None:
    """The partitioned program computes the same numbers after the rewrites. The key and
    value gradients are each one contraction over all 8 keys, reshaped to (kv heads, repeat)
    and summed over the repeat, cut into the 4 ring steps' blocks."""
    ex = _repro(name)
    _, text = lower_pair(ex)
    rewritten = _normalized(text)
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert rewritten.count("stablehlo.slice") == 8, rewritten
    whole_sums = re.findall(r"applies stablehlo\.add across dimensions = \[3\] : "
                            r"\(tensor<2x8x2x2x4xf32>", rewritten)
    assert len(whole_sums) == 2, rewritten
    assert "(tensor<2x2x2x2x4xf32>, tensor<f32>)" not in rewritten


def _example(variant: str):
    right = _repro(STOPPED)
    return custom(f"ring_gqa_{variant}", right.mesh_axes, ring_attention_gqa_grad_ref,
                  lambda q, k, v, w: ring_attention_gqa_grad_stop_max(q, k, v, w, variant),
                  right.args, right.out_specs, f"GQA ring attention gradients ({variant})")


def test_kv_heads_tiled_instead_of_repeated_is_not_proven() -> None:
    """`jnp.tile(k, (1, 1, rep, 1))` (heads [0, 1, 0, 1]) where the reference repeats (heads
    [0, 0, 1, 1]): other gradients; the rewrites stay exact on it; not proven."""
    ex = _example("tile")
    assert ex.out_specs == (P(None, "cp", None, None),) * 3
    ref, shd = run_pair(ex)
    assert not _close(ref, shd)
    ref_text, text = lower_pair(ex)
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, _normalized(text)),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    report = check_texts(ref_text, text, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()


_REPEAT_SUM = re.compile(r"applies stablehlo\.add across dimensions = \[3\] : "
                         r"\(tensor<2x2x2x2x4xf32>")


def _repeat_sum_changed(text: str, which: list[int], how: str) -> str:
    """jax's GQA ring backward with the sums over the repeat of the heads (dim 3 of
    (b, s, kv heads, repeat, d); 8 of them: 4 steps, key and value gradients alternating)
    numbered `which` taken over the kv-head dim instead (the same shape: 2 kv heads, repeat
    2), or as a max."""
    found = list(_REPEAT_SUM.finditer(text))
    assert len(found) == 8, len(found)
    for at in sorted((found[w] for w in which), key=lambda m: -m.start()):
        new = at.group(0).replace("[3]", "[2]") if how == "kv_dim" else at.group(0).replace(
            "stablehlo.add", "stablehlo.maximum")
        text = text[:at.start()] + new + text[at.end():]
    return text


@pytest.mark.parametrize("how", ["kv_dim", "max"])
@pytest.mark.parametrize("which", [[0], [5], [0, 2, 4, 6], [1, 3, 5, 7]],
                         ids=["one_step", "another_step", "every_step", "every_step_other"])
def test_backward_sum_over_the_wrong_heads_is_not_proven(which: list[int], how: str) -> None:
    """One step's sum changed: the steps are no longer alike, `_ring_return` leaves them and
    the walk stops at a step's block. Every step's sum of one gradient changed alike: the
    rewrite takes them, and the sum over the kv heads (or the max) is not the reference's."""
    ex = _repro(STOPPED)
    ref_text, text = lower_pair(ex)
    wrong = _repeat_sum_changed(text, which, how)
    right = _run_partitioned(ex, text)
    broken = _run_partitioned(ex, wrong)
    assert not _close(right, broken)
    for b, a in zip(broken, _run_partitioned(ex, _normalized(wrong)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    report = check_texts(ref_text, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()
    if len(which) == 4 and how == "kv_dim":
        assert "reduce_sum(reshape(transpose(" in report.diagnostics[0].message, (
            report.render_text())


@pytest.mark.parametrize("how", ["forward_permutes", "one_forward_hop", "counted_twice",
                                 "missing_step"])
def test_gqa_reverse_ring_broken_is_not_proven(how: str) -> None:
    _assert_broken_ring_not_proven(_repro(STOPPED), how, permutes=6)


def _assert_broken_ring_not_proven(ex, how: str, permutes: int) -> None:
    """jax's gradient program of `ex` with its reverse ring broken (`how`): other numbers,
    not proven, a forward hop named as such."""
    ref_text, text = lower_pair(ex)
    assert len(_reverse_permuted(text)) == permutes
    wrong = _mutated(text, how)
    assert not _close(_run_partitioned(ex, text), _run_partitioned(ex, wrong))
    report = check_texts(ref_text, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()
    if "forward" in how:
        assert "contributions sent back to the wrong devices" in report.diagnostics[0].message


@pytest.mark.parametrize("how", ["forward_permutes", "counted_twice"])
def test_llama_ring_training_with_the_reverse_ring_broken_is_not_proven(how: str) -> None:
    """The corpus program `llama3_stack_sgd_ring_cp4` (2 layers, 16 query heads over 8 kv heads;
    proven, tests/examples/test_real_check.py) with its key/value cotangents' return around the ring
    broken in jax's gradient program: other gradients, not proven."""
    from examples.real.catalog import program
    from examples.real.corpus import RING

    ex = program("llama3", "stack_sgd", RING, (("cp", 4),), "cp ring", "Llama-3 ring training",
                 suffix="_ring")
    _assert_broken_ring_not_proven(ex, how, permutes=12)
