"""The backward of the online softmax (`online_backward.py`, run by entangle-normalize after the
forward's folds): ring attention's per-step cotangents, rescaled by the later steps'
corrections, telescope to the probabilities shifted by the final max, and the query
gradient's sum over the ring steps becomes one contraction over the concatenated key blocks.

Grounded by execution: XLA runs the partitioned programs before and after the rewrites to the
same numbers. A ring backward written out by hand (the query gradient, as jax's backward
computes it) is proven; its near misses (a cotangent left unrescaled at one step, rescaled by
the wrong step's correction, a step's contribution missing, a step's probabilities shifted
by their own max only, the own block taken last so a first block's row is -inf throughout)
compute other numbers and are not proven. jax's gradients in the models' (b, s, h, d) layout
(the correction applied as `swapaxes(corr, 1, 2)`) are proven too; their near misses (the
correction swapped along the wrong axes, in the whole program or in one backward rescale
only, a step rescaled by the previous step's correction, the reverse ring broken) are not.
The scores are products of unbounded inputs, which may overflow: every check and rewrite here
runs under `--assume-no-overflow` (the strict default refuses the forward's fold,
tests/normalize/test_exact_ring_overflow.py), the near misses not proven even so."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize.idioms import drop_identity_converts
from entangle_mlir.normalize.max_cotangent import zero_max_cotangents
from entangle_mlir.normalize.rewrites import rewrite_idioms
from entangle_mlir.normalize.unroll import unroll_ring_loops
from examples.real.catalog import custom, lower_pair, run_pair
from examples.real.programs import ArgDef
from examples.real.repro import (
    reproducers,
    ring_attention_bshd_grad_ref,
    ring_attention_bshd_grad_stop_max,
    ring_attention_grad_ref,
)
from tests.judging import assert_judged, assuming_no_overflow
from tests.normalize.test_online_softmax import _run_partitioned

CP = "cp"


def _dq_ref(q, k, v, w):
    return ring_attention_grad_ref(q, k, v, w)[0]


def _ring_dq(q, k, v, w, variant: str = "right"):
    """The query gradient of causal ring attention (running max stopped), its backward
    written as jax writes it: cotangents `do = w / l`, `dl = -sum(w / l^2 * o)`, rescaled by
    each step's correction on the way back."""
    n, me, rows = lax.axis_size(CP), lax.axis_index(CP), q.shape[0]
    q_pos = me * rows + jnp.arange(rows)
    m = jnp.full((rows,), -jnp.inf)
    denom = jnp.zeros((rows,))
    o = jnp.zeros(q.shape[:1] + v.shape[1:])
    steps = []
    first = 1 if variant == "own_block_last" else 0
    if first:
        k, v = (lax.ppermute(x, CP, [(j, (j + 1) % n) for j in range(n)]) for x in (k, v))
    for i in range(first, n + first):
        k_pos = ((me - i) % n) * rows + jnp.arange(rows)
        mask = q_pos[:, None] >= k_pos[None, :]
        kt = k.T
        s = jnp.where(mask, q @ kt, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.sum(p, axis=-1)
        o = o * corr[:, None] + p @ v
        steps.append((mask, p, corr, kt, v, s))
        m = m_new
        k, v = (lax.ppermute(x, CP, [(j, (j + 1) % n) for j in range(n)]) for x in (k, v))
    do = w / denom[:, None]
    dl = -jnp.sum(w * (1.0 / (denom * denom))[:, None] * o, axis=-1)
    dq = None
    for i in reversed(range(n)):
        mask, p, corr, kt, v_i, s = steps[i]
        if variant == "own_max" and i == 1:
            p = jnp.exp(s - jnp.max(s, axis=-1)[:, None])
        dp = lax.dot_general(do, v_i, (((1,), (1,)), ((), ())))
        ds = jnp.where(mask, (dp + dl[:, None]) * p, 0.0)
        if not (variant == "missing_step" and i == 2):
            term = lax.dot_general(ds, kt, (((1,), (1,)), ((), ())))
            dq = term if dq is None else dq + term
        if variant == "stale" and i == 2:
            continue
        c = steps[i - 1][2] if variant == "wrong_step" and i > 1 else corr
        do, dl = do * c[:, None], dl * c
    return dq


ARGS = tuple(ArgDef(name, (8, 4), "float32", "data", P(CP, None)) for name in "qkvw")
VARIANTS = {"right": True, "stale": False, "wrong_step": False, "missing_step": False,
            "own_max": False, "own_block_last": False}
"""`own_block_last` takes the own block last: on device 0 the first block's causal mask hides
every row, its max is -inf and exp(-inf - -inf) is NaN; the -inf guards must refuse."""


def _example(variant: str):
    return custom(f"ring_dq_{variant}", ((CP, 4),), _dq_ref,
                  lambda q, k, v, w: _ring_dq(q, k, v, w, variant), ARGS, P(CP, None),
                  f"ring attention's query gradient ({variant})")


def _normalized(text: str) -> str:
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with module.context, assuming_no_overflow():
            unroll_ring_loops(module)
            drop_identity_converts(module)
            zero_max_cotangents(module)
            assert rewrite_idioms(module) > 0
        assert module.operation.verify()
        return str(module)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ring_query_gradient_is_proven_and_its_near_misses_are_not(variant: str) -> None:
    assert_judged(_example(variant), VARIANTS[variant], assume_no_overflow=True)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_backward_rewrites_are_exact_on_the_hand_written_ring(variant: str) -> None:
    ex = _example(variant)
    _, text = lower_pair(ex)
    rewritten = _normalized(text)
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["repro_ring_attention_grad_cp4",
                                  "repro_ring_attention_grad_stop_max_cp4"])
def test_backward_rewrites_are_exact_on_jax_gradients(name: str) -> None:
    """jax.grad of ring attention (max differentiated or stopped): the partitioned program
    computes the same numbers after the rewrites, and the query gradient is a contraction of
    the score cotangents of all 4 steps against all 4 key blocks."""
    (ex,) = [r.example for r in reproducers() if r.example.name == name]
    _, text = lower_pair(ex)
    rewritten = _normalized(text)
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    if "stop_max" in name:
        assert "(tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>" in rewritten
        # dK, dV: one contraction over all the keys, cut into the ring steps' blocks
        assert rewritten.count("stablehlo.slice") == 8, rewritten


REVERSE = "[[1, 0], [2, 1], [3, 2], [0, 3]]"
FORWARD = "[[0, 1], [1, 2], [2, 3], [3, 0]]"
_ADD = re.compile(r"^(\s*)(%\d+) = stablehlo\.add (%\d+), (%\d+) : (tensor<[^>]*>)(.*)$")


def _reverse_permuted(text: str) -> set[str]:
    return {line.split("=")[0].strip() for line in text.splitlines()
            if "collective_permute" in line and REVERSE in line}


def _mutated(text: str, how: str) -> str:
    """jax's ring backward with one near miss: the cotangents sent the wrong way around the
    ring (every hop, or only the first), one step's contribution counted twice, or missing
    (the accumulator passed on without it)."""
    if how == "forward_permutes":
        return text.replace(REVERSE, FORWARD)
    if how == "one_forward_hop":
        return text.replace(REVERSE, FORWARD, 1)
    permuted = _reverse_permuted(text)
    lines = text.splitlines()
    for n, line in enumerate(lines):
        found = _ADD.match(line)
        if found is None:
            continue
        indent, result, a, b, kind, rest = found.groups()
        if (a in permuted) == (b in permuted):
            continue
        hop, mine = (a, b) if a in permuted else (b, a)
        name = result[1:]
        if how == "counted_twice":
            twice = f"{indent}%twice{name} = stablehlo.add {a}, {b} : {kind}{rest}"
            again = f"{indent}{result} = stablehlo.add %twice{name}, {mine} : {kind}{rest}"
            lines[n:n + 1] = [twice, again]
        else:
            zero = f"{indent}%zero{name} = stablehlo.constant dense<0.000000e+00> : {kind}"
            passed = f"{indent}{result} = stablehlo.add {hop}, %zero{name} : {kind}{rest}"
            lines[n:n + 1] = [zero, passed]
        return "\n".join(lines)
    raise AssertionError("no add of a reverse-permuted accumulator")


@pytest.mark.parametrize("name", ["repro_ring_attention_grad_stop_max_cp4",
                                  "repro_ring_attention_bshd_grad_stop_max_cp4"])
@pytest.mark.parametrize("how", ["forward_permutes", "one_forward_hop", "counted_twice",
                                 "missing_step"])
def test_near_misses_of_the_reverse_ring_compute_other_numbers_and_are_not_proven(
        how: str, name: str) -> None:
    """jax's gradients of ring attention (max stopped; proven,
    tests/normalize/test_online_softmax.py; in the rows x d layout and the models' (b, s, h, d)
    one) with the key/value cotangents' return around the ring broken: the partitioned programs
    compute other gradients, and the verifier does not prove them."""
    (ex,) = [r.example for r in reproducers() if r.example.name == name]
    ref_text, text = lower_pair(ex)
    assert len(_reverse_permuted(text)) == 6
    wrong = _mutated(text, how)
    assert wrong != text
    right = _run_partitioned(ex, text)
    broken = _run_partitioned(ex, wrong)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(right, broken, strict=True))
    report = check_texts(ref_text, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()
    if "forward" in how:
        assert "contributions sent back to the wrong devices" in report.diagnostics[0].message


BSHD = "repro_ring_attention_bshd_grad_stop_max_cp4"
"""The models' layout (`layers.ring_attention`): q, k, v of shape (b, s, h, d), the correction
applied to the output as `swapaxes(corr, 1, 2)[..., None]`."""


def _bshd_example(variant: str):
    (right,) = [r.example for r in reproducers() if r.example.name == BSHD]
    return custom(f"ring_bshd_{variant}", ((CP, 4),), ring_attention_bshd_grad_ref,
                  lambda q, k, v, w: ring_attention_bshd_grad_stop_max(q, k, v, w, variant),
                  right.args, right.out_specs, f"ring attention (b, s, h, d) gradients ({variant})")


def test_backward_rewrites_are_exact_in_the_models_layout() -> None:
    """jax.grad of ring attention in the (b, s, h, d) layout, max stopped: the partitioned
    program computes the same numbers after the rewrites (the corrections moved out of the
    transposes and through the dots' batch and contracted dims, the delta read over the keys).
    The key and value gradients are each one contraction over all 8 keys cut into the 4 ring
    steps' blocks, the query gradient one contraction against all the key blocks."""
    (ex,) = [r.example for r in reproducers() if r.example.name == BSHD]
    _, text = lower_pair(ex)
    rewritten = _normalized(text)
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert rewritten.count("stablehlo.slice") == 8, rewritten
    # dV: the cotangent against the probabilities over all the keys, shifted by the final max
    assert "(tensor<2x2x4x2xf32>, tensor<2x2x2x8xf32>) -> tensor<2x2x4x8xf32>" in rewritten
    # dQ: the score cotangents of all steps against all the key blocks
    assert "(tensor<2x2x2x8xf32>, tensor<2x8x2x4xf32>) -> tensor<2x2x2x4xf32>" in rewritten


def test_ring_training_in_the_models_layout_is_proven() -> None:
    (ex,) = [r.example for r in reproducers() if r.example.name == BSHD]
    assert_judged(ex, True, atol=1e-5, assume_no_overflow=True)


@pytest.mark.parametrize("variant", ["swapped_wrong", "previous_correction"])
def test_near_misses_of_the_models_layout_compute_other_numbers_and_are_not_proven(
        variant: str) -> None:
    """The correction swapped along the wrong axes (the same shape: b = h = rows), or one
    step's accumulator rescaled by the previous step's correction: the gradients differ from
    the reference's, the rewrites stay exact on them, and the verifier does not prove them."""
    ex = _bshd_example(variant)
    ref, shd = run_pair(ex)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(ref, shd, strict=True))
    ref_text, text = lower_pair(ex)
    rewritten = _normalized(text)
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    report = check_texts(ref_text, text, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()


_CORRECTION = re.compile(r"^(\s*%\d+ = stablehlo\.broadcast_in_dim %\d+, dims = )\[0, 1, 2, 3\]"
                         r"( : \(tensor<2x2x2x1xf32>\) -> tensor<2x2x2x4xf32>) (loc\(#loc\d+\))$")


def _backward_correction_swapped(text: str, which: int) -> str:
    """The models'-layout gradient with one backward rescale of the output cotangent by a
    step's correction (`swapaxes(corr, 1, 2)[..., None]` read by the backward: the same
    broadcast as the forward's, at another location) spread along the wrong dims (query and
    head swapped): a bug in the backward only."""
    lines = text.splitlines()
    names = dict(re.findall(r"^(#loc\d+) = (.*)$", text, re.MULTILINE))
    found = [(n, m, names[m.group(3)[4:-1]]) for n, line in enumerate(lines)
             if (m := _CORRECTION.match(line))]
    forward = found[0][2]  # loc("jvp()/mul"(#locN)): the forward's rescale at the source line
    assert forward.startswith('loc("jvp()/mul"'), forward
    backward = [(n, m) for n, m, name in found
                if name == forward.replace("jvp()/mul", "transpose(jvp())/mul")]
    assert len(backward) == 3, backward
    n, m = backward[which]
    lines[n] = f"{m.group(1)}[0, 2, 1, 3]{m.group(2)} {m.group(3)}"
    return "\n".join(lines)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_correction_swapped_wrongly_in_the_backward_only_is_not_proven(which: int) -> None:
    """jax's gradient in the models' layout (proven) with one backward rescale by a correction
    spread with its query and head dims swapped (the same shape, b = h = rows): other
    gradients, the rewrites stay exact on it, and the layout rewrites (a factor moved out of
    transposes, onto the probabilities) do not prove it."""
    (ex,) = [r.example for r in reproducers() if r.example.name == BSHD]
    ref_text, text = lower_pair(ex)
    wrong = _backward_correction_swapped(text, which)
    assert wrong != text
    right = _run_partitioned(ex, text)
    broken = _run_partitioned(ex, wrong)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(right, broken, strict=True))
    rewritten = _run_partitioned(ex, _normalized(wrong))
    for b, a in zip(broken, rewritten, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    report = check_texts(ref_text, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()
