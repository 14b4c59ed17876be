"""A differentiated max shift (`max_cotangent.py`): its cotangent is zero in real arithmetic,
so jax's paths to the argmax vanish. Grounded by execution: the partitioned programs compute
the same numbers before and after the rewrite, the programs it lets the verifier prove match
their references on devices, and the near misses (jax's gradient program with one term of a
max's cotangent doubled or dropped) compute other numbers and are not proven. The ring's
atoms (scores, products of unbounded inputs) may overflow: its cases run under
`--assume-no-overflow`, which the strict default needs (`test_ring_..._kept_strictly`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir

from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize import max_cotangent
from entangle_mlir.normalize.finite import Finiteness, judging
from entangle_mlir.normalize.idioms import drop_identity_converts
from entangle_mlir.normalize.unroll import unroll_ring_loops
from examples.real.catalog import custom, lower_pair
from examples.real.programs import ArgDef
from examples.real.repro import reproducers
from tests.judging import assert_judged, assuming_no_overflow
from tests.normalize.test_online_softmax import _run_partitioned


def _ring_grad():
    (ex,) = [r.example for r in reproducers()
             if r.example.name == "repro_ring_attention_grad_cp4"]
    return ex


def _module(text: str):
    module = parse_module(text)
    inline_calls(module, "grad.mlir")
    with module.context:
        unroll_ring_loops(module)
        drop_identity_converts(module)
    return module


def _candidates(module) -> list:
    found = []

    def collect(op):
        if op.name in ("stablehlo.multiply", "stablehlo.divide") and \
                max_cotangent._candidate(op) is not None:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return found


def test_ring_gradient_max_cotangents_are_zeroed_exactly() -> None:
    """jax.grad of ring attention: every product sending a running max's cotangent to its
    argmax is replaced (4 maxes, each with the tie share of both operands), none is left,
    and XLA computes the same gradients after the rewrite."""
    ex = _ring_grad()
    _, text = lower_pair(ex)
    with context():
        module = _module(text)
        assert len(_candidates(module)) >= 4
        with module.context, assuming_no_overflow():
            replaced = max_cotangent.zero_max_cotangents(module)
        assert replaced >= 4
        assert _candidates(module) == []
        assert module.operation.verify()
        rewritten = str(module)
    for before, after in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten),
                             strict=True):
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def _broken(text: str, how: str) -> str:
    """jax's gradient program with the first max cotangent changed: one of the two terms it
    adds doubled (`a + a`) or dropped (`a + 0`)."""
    with context():
        module = _module(text)
        first = _candidates(module)[0]
        cotangent = max_cotangent._candidate(first)
        add = cotangent.owner
        assert add.name == "stablehlo.add", add
        if how == "term_doubled":
            add.operands[1] = add.operands[0]
        else:
            with module.context:
                add.operands[1] = max_cotangent._zero_like(add.operands[1], add)
        assert module.operation.verify()
        return str(module)


@pytest.mark.parametrize("how", ["term_doubled", "term_dropped"])
def test_a_max_cotangent_that_is_not_zero_is_kept(how: str) -> None:
    ex = _ring_grad()
    ref_text, text = lower_pair(ex)
    wrong = _broken(text, how)
    right = _run_partitioned(ex, text)
    broken = _run_partitioned(ex, wrong)
    assert not all(np.allclose(a, b, atol=1e-4) for a, b in zip(right, broken, strict=True))
    with context():
        module = _module(wrong)
        first = max_cotangent._candidate(_candidates(module)[0])
        with module.context, assuming_no_overflow():
            assert not max_cotangent.polynomial.is_zero(first)
            max_cotangent.zero_max_cotangents(module)
        assert _candidates(module), "the changed cotangent must not be zeroed"
    report = check_texts(ref_text, wrong, verify_rules=False, assume_no_overflow=True)
    assert not report.proven, report.render_text()


def test_ring_gradient_max_cotangents_are_kept_strictly() -> None:
    """By default the ring's atoms (scores, products of unbounded inputs) may overflow, and
    inf - inf is NaN, not 0: no cotangent is zeroed, and the refusal says why (it would be
    zeroed under `--assume-no-overflow`, `test_ring_gradient_max_cotangents_are_zeroed_...`)."""
    _, text = lower_pair(_ring_grad())
    with context():
        module = _module(text)
        with module.context, judging(Finiteness()) as finiteness:
            assert max_cotangent.zero_max_cotangents(module) == 0
        assert len(_candidates(module)) >= 4
    assert finiteness.refusals, "the refusal must be recorded"
    assert all("the running max's cotangent is zero only where" in r.message
               for r in finiteness.refusals)


def _softmax_grad_ref(x, w):
    return jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=-1) * w))(x)


def _softmax_grad_by_hand(x, w, shift: str = "max"):
    """A softmax written out, the max shift not stopped (jax.nn.softmax stops it)."""
    def softmax(x):
        m = jnp.max(x, axis=-1, keepdims=True)
        if shift == "max_of_other_rows":
            m = jnp.max(x, axis=0, keepdims=True)
        e = jnp.exp(x - m)
        if shift == "unnormalized_shift":
            return e / jnp.sum(jnp.exp(x), axis=-1, keepdims=True)
        return e / jnp.sum(e, axis=-1, keepdims=True)

    return jax.grad(lambda x: jnp.sum(softmax(x) * w))(x)


@pytest.mark.parametrize("shift", ["max", "max_of_other_rows", "unnormalized_shift"])
def test_softmax_written_by_hand_is_proven_and_its_near_misses_are_not(shift: str) -> None:
    """Rows split over tp: the gradient of a hand-written softmax (max shift differentiated)
    is proven against jax.nn.softmax's; shifting by a max over the split rows (a per-shard max:
    other numbers) or normalizing by the unshifted sum (other numbers) is not."""
    args = (ArgDef("x", (8, 6), "float32", "data", P("tp", None)),
            ArgDef("w", (8, 6), "float32", "data", P("tp", None)))
    ex = custom(f"softmax_by_hand_{shift}", (("tp", 4),), _softmax_grad_ref,
                lambda x, w: _softmax_grad_by_hand(x, w, shift), args, P("tp", None),
                "softmax gradient, max shift differentiated")
    assert_judged(ex, shift == "max")
