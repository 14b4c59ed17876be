"""Audit for false proofs: ring attention whose per-step exp is not shifted by the running max
(it overflows where the max-shifted reference softmax does not). DESIGN.md section 1: overflow
is not assumed away, so each of these is a WRONG program. Grounded with `large` q and k
(100 * N(0, 1): scores ~ 10^4): the sharded outputs are nan/inf where the reference is finite.
Each must not be proven; a proven one is a false proof (xfail strict)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from examples.real.catalog import custom, lower_pair, run_pair
from examples.real.repro import CP, _f, ring_attention_ref

CP4 = ((CP, 4),)


def _ring(q, k, v, shift: str):
    """`repro.ring_attention` with the exp shifted by `shift`: "none" (plain exp(s)), "min"
    (the running min of the unmasked scores), "first" (the first block's max, never updated)."""
    n, me, rows = lax.axis_size(CP), lax.axis_index(CP), q.shape[0]
    q_pos = me * rows + jnp.arange(rows)
    m = jnp.full((rows,), -jnp.inf)
    denom = jnp.zeros((rows,))
    o = jnp.zeros(q.shape[:1] + v.shape[1:])
    for i in range(n):
        k_pos = ((me - i) % n) * rows + jnp.arange(rows)
        mask = q_pos[:, None] >= k_pos[None, :]
        s = jnp.where(mask, q @ k.T, -jnp.inf)
        if shift == "none":
            p = jnp.exp(s)
            denom = denom + jnp.sum(p, axis=-1)
            o = o + p @ v
        elif shift == "first":
            if i == 0:  # the diagonal block: every row has a key
                m = jnp.max(s, axis=-1)
            p = jnp.exp(s - m[:, None])
            denom = denom + jnp.sum(p, axis=-1)
            o = o + p @ v
        elif shift in ("offset", "half"):  # shifted by the running max - 100, or by its half
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            if shift == "offset":
                p = jnp.exp(s - m_new[:, None] + 100.0)
                corr = jnp.exp(m - m_new)
            else:
                p = jnp.exp(s - m_new[:, None] / 2)
                corr = jnp.exp((m - m_new) / 2)
            denom = denom * corr + jnp.sum(p, axis=-1)
            o = o * corr[:, None] + p @ v
            m = m_new
        elif shift == "unmasked":  # the running max of the scores before the causal mask
            m_new = jnp.maximum(m, jnp.max(q @ k.T, axis=-1))
            p = jnp.exp(s - m_new[:, None])
            corr = jnp.exp(m - m_new)
            denom = denom * corr + jnp.sum(p, axis=-1)
            o = o * corr[:, None] + p @ v
            m = m_new
        elif shift in ("split", "max"):  # the running max; "split": exp(s - m) as exp(s) * exp(-m)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            if shift == "split":
                p = jnp.exp(s) * jnp.exp(-m_new)[:, None]
                corr = jnp.exp(m) * jnp.exp(-m_new)
            else:
                p = jnp.exp(s - m_new[:, None])
                corr = jnp.exp(m - m_new)
            denom = denom * corr + jnp.sum(p, axis=-1)
            o = o * corr[:, None] + p @ v
            m = m_new
        else:  # running min of the unmasked scores
            lo = jnp.min(jnp.where(mask, s, jnp.inf), axis=-1)
            m_new = lo if i == 0 else jnp.minimum(m, lo)
            p = jnp.exp(s - m_new[:, None])
            corr = jnp.exp(m - m_new)
            denom = denom * corr + jnp.sum(p, axis=-1)
            o = o * corr[:, None] + p @ v
            m = m_new
        k, v = (lax.ppermute(x, CP, [(j, (j + 1) % n) for j in range(n)]) for x in (k, v))
    return o / denom[:, None]


def _grad_ref(q, k, v, w):
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention_ref(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)


def _example(shift: str, grad: bool):
    qkv = (_f("q", (8, 4), P(CP, None), "large"), _f("k", (8, 4), P(CP, None), "large"),
           _f("v", (8, 4), P(CP, None)))
    if not grad:
        return custom(f"ring_overflow_{shift}", CP4, ring_attention_ref,
                      lambda q, k, v: _ring(q, k, v, shift), qkv, P(CP, None),
                      f"ring attention, exp shifted by {shift}")
    body = lambda q, k, v, w: jax.grad(
        lambda q, k, v: jnp.sum(_ring(q, k, v, shift) * w), argnums=(0, 1, 2))(q, k, v)
    return custom(f"ring_overflow_grad_{shift}", CP4, _grad_ref, body,
                  qkv + (_f("w", (8, 4), P(CP, None)),), (P(CP, None),) * 3,
                  f"ring attention gradients, exp shifted by {shift}")


FALSE_PROOFS: set[tuple[str, bool]] = set()
CASES = [(s, g) for g in (False, True) for s in ("none", "min", "first", "split", "offset", "half", "unmasked")]


def _verdict(shift: str, grad: bool):
    ex = _example(shift, grad)
    ref, shd = run_pair(ex)
    assert all(np.isfinite(r).all() for r in ref)
    assert not all(np.isfinite(x).all() for x in shd)  # overflows where the reference cannot
    ref_text, text = lower_pair(ex)
    return check_texts(ref_text, text, verify_rules=False)


@pytest.mark.parametrize(("shift", "grad"), [
    pytest.param(s, g, marks=[pytest.mark.xfail(strict=True, reason="false proof")]
                 if (s, g) in FALSE_PROOFS else [])
    for s, g in CASES], ids=[f"{'grad' if g else 'fwd'}_{s}" for s, g in CASES])
def test_unshifted_ring_attention_is_not_proven(shift: str, grad: bool) -> None:
    report = _verdict(shift, grad)
    assert not report.proven, report.render_text()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_max_shifted_control_is_proven(grad: bool) -> None:
    """The same harness on the correctly shifted ring (the running max): finite, the
    reference's numbers on the same large inputs, proven."""
    ex = _example("max", grad)
    ref, shd = run_pair(ex)
    assert all(np.isfinite(x).all() for x in shd)
    assert all(np.allclose(a, b, atol=1e-3) for a, b in zip(ref, shd, strict=True))
    ref_text, text = lower_pair(ex)
    report = check_texts(ref_text, text, verify_rules=False)
    assert report.proven, report.render_text()


def _custom_vjp_example(bad: str):
    """The max-shifted ring forward (exact, folded) with a `jax.custom_vjp` backward that is
    the vjp of the ring shifted by `bad`: only the backward's exps can overflow (the leaves
    `online_backward._reassociated` checks with `overflow=False`)."""

    @jax.custom_vjp
    def att(q, k, v):
        return _ring(q, k, v, "max")

    att.defvjp(lambda q, k, v: (_ring(q, k, v, "max"), (q, k, v)),
               lambda res, g: jax.vjp(lambda q, k, v: _ring(q, k, v, bad), *res)[1](g))
    body = lambda q, k, v, w: jax.grad(
        lambda q, k, v: jnp.sum(att(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)
    args = tuple(_f(n, (8, 4), P(CP, None), "large" if n in "qk" else "data") for n in "qkvw")
    return custom(f"ring_overflow_vjp_{bad}", CP4, _grad_ref, body, args, (P(CP, None),) * 3,
                  f"ring attention, backward shifted by {bad}")


@pytest.mark.parametrize("bad", ["split", "half", "max"])
def test_custom_vjp_backward_overflow(bad: str) -> None:
    ex = _custom_vjp_example(bad)
    ref, shd = run_pair(ex)
    assert all(np.isfinite(x).all() for x in ref)
    finite = all(np.isfinite(x).all() for x in shd)
    assert finite == (bad == "max")
    if finite:
        assert all(np.allclose(r, s, rtol=1e-4, atol=1e-4) for r, s in zip(ref, shd, strict=True))
    ref_text, text = lower_pair(ex)
    report = check_texts(ref_text, text, verify_rules=False)
    assert report.proven == (bad == "max"), report.render_text()
