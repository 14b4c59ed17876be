"""Ring attention training with the ring a Python loop and one sequence (b = 1).

No `while` to fold: the online softmax's backward rewrites (`normalize/online_backward.py`)
meet jax's batch-1 spelling directly. There a row vector of shifts is taken without its unit
batch dim where a factor moves out of a transpose (`_unit_dims_dropped`), and transposed back
through that reshape; the shifts the rewrites then compare are the same elements of one
value read through unit-dim reshapes and transposes (`_same_shift`, `_below`), a transpose
moves under such a reshape (`_lifted`), and an absorbed shift is rechained at the forward's
shape (`_in_shape`). Before, `_absorb` refused every factor (its shift `reshape(m)` is not
`m`) and the program was "not proven" at a dot_general over the diagonal blocks.

Grounded: the gradients match the reference's on simulated CPU devices and the program is
proven at cp 2 and 4 with every rule instance checked; the six wrong twins of
`examples/ring_loop.py`, written as Python loops, compute other gradients and are not
proven.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import lower_pair
from examples import ring_loop


def ring(bug: str = ""):
    """Causal ring attention over 'cp' as a Python loop, or its twin with `bug`
    (`ring_loop.BUGS`: blocks passed the other way, one step short, the key block's index off
    by one, the corrections inverted, rescaled by another row's max, the denominator never
    rescaled)."""
    def body(q, k, v):
        n, me = lax.axis_size("cp"), lax.axis_index("cp")
        s_l = k.shape[1]
        q_pos = me * s_l + jnp.arange(s_l)
        perm = [(i, (i + (-1 if bug == "direction" else 1)) % n) for i in range(n)]
        b, _, h, d = q.shape
        o, m = jnp.zeros(q.shape, q.dtype), jnp.full((b, h, s_l), -jnp.inf, q.dtype)
        den = jnp.zeros((b, h, s_l), q.dtype)
        for i in range(n - 1 if bug == "short" else n):
            k_pos = (me - i + (1 if bug == "index" else 0)) % n * s_l + jnp.arange(s_l)
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(d))
            scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
            p = jnp.exp(scores - m_new[..., None])
            corr = jnp.exp(m_new - m) if bug == "rescale" else jnp.exp(m - m_new)
            den = (den if bug == "unscaled" else den * corr) + jnp.sum(p, axis=-1)
            rows = corr.reshape(b, s_l, h) if bug == "rows" else jnp.swapaxes(corr, 1, 2)
            o = o * rows[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, v)
            m = m_new
            k, v = lax.ppermute(k, "cp", perm), lax.ppermute(v, "cp", perm)
        return o / jnp.swapaxes(den, 1, 2)[..., None]
    return body


def _grad(attention):
    return lambda q, k, v, w: jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) * w),
                                       argnums=(0, 1, 2))(q, k, v)


@functools.cache
def _program(n: int, bug: str = "") -> tuple[bool, str, str]:
    """(the sharded gradients match the reference's, reference text, sharded text)."""
    mesh = jax.make_mesh((n,), ("cp",), axis_types=(AxisType.Auto,))
    spec = ring_loop.SPEC
    fn = jax.jit(jax.shard_map(_grad(ring(bug)), mesh=mesh, in_specs=(spec,) * 4,
                               out_specs=(spec,) * 3, check_vma=False))
    shardings = [NamedSharding(mesh, spec)] * 4
    rng = np.random.default_rng(0)
    shape = (1, n * ring_loop.S_L, ring_loop.H, ring_loop.D)
    args = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    want = jax.jit(_grad(ring_loop.reference))(*args)
    got = fn(*(jax.device_put(a, s) for a, s in zip(args, shardings)))
    close = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
                for a, b in zip(want, got))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, shardings)]
    return (close, *lower_pair(_grad(ring_loop.reference), fn, *avals))


@pytest.mark.parametrize("n", [2, 4])
def test_one_sequence_python_loop_ring_training_is_proven(n: int) -> None:
    close, ref, sharded = _program(n)
    assert close
    report = check_texts(ref, sharded, assume_no_overflow=True, general_tier=False)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


@pytest.mark.parametrize("bug", ring_loop.BUGS)
def test_one_sequence_python_loop_twins_are_not_proven(bug: str) -> None:
    close, ref, sharded = _program(4, bug)
    assert not close
    report = check_texts(ref, sharded, assume_no_overflow=True, verify_rules=False)
    assert not report.proven, report.render_text()
