"""Ring attention training on the models' (b, s, h, d) layout with one sequence (b = 1).

`examples/ring_loop.py`'s ring (a `fori_loop`, folded by `ring_pair.py`) differentiated: the
backward moves the softmax denominator's division out of `swapaxes` (`_transpose_out`), whose
row vector has the unit batch dim; the vector, transposed to the order of the dims it lands
on, is now taken without its unit dims (before, the rewrite was refused and the pair "not
proven"). Proven at cp 2, 4 and 8; the ring's six wrong twins compute other gradients and
are not proven.

The same ring written as a Python loop (no `while`: nothing to fold, so the online softmax's
backward rewrites meet the unit batch dim directly) is proven at cp 2 and 4, every rule
instance checked; its six twins (`ring_loop.ring(bug, unroll=True)`) compute other gradients
and are not proven.

A factor `exp(a - b)` read without a broadcast chain is placed on all its dims, unit ones
included; `_placed` reshaped it to its non-unit dims all the same and built a
`broadcast_in_dim` whose dims outnumbered its operand's rank: an invalid module, on which the
next rewrite's `index_map` raised an IndexError out of `entangle check`. Now the factor keeps
its dims; a rewrite that builds an invalid module anyway is caught when the rewrites end
(`rewrites.valid`), and any defect of the checker is "not proven" with the error named, never
a traceback (`driver.check_program`). Both programs run on simulated CPU devices.
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
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from entangle_mlir.driver import check_texts
from entangle_mlir.jax import lower_pair
from entangle_mlir.normalize import idioms, online_backward
from examples import ring_loop
from tests.jax_runs import run_once

S_L, H, D = 2, 2, 2


def reference(q, k, v):
    """Causal attention over the whole sequence."""
    pos = jnp.arange(q.shape[1])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(D))
    scores = jnp.where(pos[:, None] >= pos[None, :], scores, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def ring(q, k, v):
    """Causal ring attention over 'cp', the ring a Python loop (each step scores the local
    queries against the K block held, updates the online softmax, passes K and V on)."""
    n, me = lax.axis_size("cp"), lax.axis_index("cp")
    s_l = k.shape[1]
    q_pos = me * s_l + jnp.arange(s_l)
    perm = [(i, (i + 1) % n) for i in range(n)]
    b, _, h, d = q.shape
    o, m = jnp.zeros(q.shape, q.dtype), jnp.full((b, h, s_l), -jnp.inf, q.dtype)
    den = jnp.zeros((b, h, s_l), q.dtype)
    for i in range(n):
        k_pos = (me - i) % n * s_l + jnp.arange(s_l)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(d))
        scores = jnp.where(q_pos[:, None] >= k_pos[None, :], scores, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        p = jnp.exp(scores - m_new[..., None])
        corr = jnp.exp(m - m_new)
        den = den * corr + jnp.sum(p, axis=-1)
        o = o * jnp.swapaxes(corr, 1, 2)[..., None] + jnp.einsum("bhqk,bkhd->bqhd", p, v)
        m = m_new
        k, v = lax.ppermute(k, "cp", perm), lax.ppermute(v, "cp", perm)
    return o / jnp.swapaxes(den, 1, 2)[..., None]


def _grad(attention):
    return lambda q, k, v, w: jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) * w),
                                       argnums=(0, 1, 2))(q, k, v)


@functools.cache
def _program(n: int, batch: int) -> tuple[bool, str, str]:
    """(the sharded gradients match the reference's, reference text, sharded text)."""
    mesh = jax.make_mesh((n,), ("cp",), axis_types=(AxisType.Auto,))
    spec = P(None, "cp")
    fn = jax.jit(jax.shard_map(_grad(ring), mesh=mesh, in_specs=(spec,) * 4,
                               out_specs=(spec,) * 3, check_vma=False))
    shardings = [NamedSharding(mesh, spec)] * 4
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((batch, n * S_L, H, D)).astype(np.float32) for _ in range(4)]
    want = run_once(_grad(reference), *args)
    got = run_once(fn, *(jax.device_put(a, s) for a, s in zip(args, shardings)))
    close = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
                for a, b in zip(want, got))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, shardings)]
    return (close, *lower_pair(_grad(reference), fn, *avals))


def _internal(report) -> list[str]:
    return [d.message for d in report.diagnostics if d.category == "internal"]


@pytest.mark.parametrize("n", [2, 4])
def test_the_unit_batch_ring_runs_without_an_internal_error(n: int) -> None:
    """cp 2 and 4, batch 1: the gradients match, and the check ends without any internal
    error (before: an IndexError traceback out of `online_backward`)."""
    close, ref, sharded = _program(n, 1)
    assert close
    report = check_texts(ref, sharded, assume_no_overflow=True)
    assert not _internal(report), report.render_text()


def test_two_sequences_are_proven() -> None:
    """The same ring with batch 2 is proven (the rewrites' factors there have a chain)."""
    close, ref, sharded = _program(4, 2)
    assert close
    report = check_texts(ref, sharded, assume_no_overflow=True)
    assert report.proven, report.render_text()


@functools.cache
def _fori_program(n: int, bug: str = "", unroll: bool = False) -> tuple[bool, str, str]:
    """`ring_loop.ring(bug, unroll)` (batch 1) differentiated: (the gradients match the
    reference's, reference text, sharded text)."""
    mesh = jax.make_mesh((n,), ("cp",), axis_types=(AxisType.Auto,))
    spec = ring_loop.SPEC
    fn = jax.jit(jax.shard_map(_grad(ring_loop.ring(bug, unroll)), mesh=mesh,
                               in_specs=(spec,) * 4,
                               out_specs=(spec,) * 3, check_vma=False))
    shardings = [NamedSharding(mesh, spec)] * 4
    rng = np.random.default_rng(0)
    shape = (1, n * ring_loop.S_L, ring_loop.H, ring_loop.D)
    args = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    want = run_once(_grad(ring_loop.reference), *args)
    got = run_once(fn, *(jax.device_put(a, s) for a, s in zip(args, shardings)))
    close = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
                for a, b in zip(want, got))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, shardings)]
    return (close, *lower_pair(_grad(ring_loop.reference), fn, *avals))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_one_sequence_ring_training_is_proven(n: int) -> None:
    close, ref, sharded = _fori_program(n)
    assert close
    report = check_texts(ref, sharded, assume_no_overflow=True)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


@pytest.mark.parametrize("bug", ring_loop.BUGS)
def test_one_sequence_ring_training_twins_are_not_proven(bug: str) -> None:
    close, ref, sharded = _fori_program(4, bug)
    assert not close
    report = check_texts(ref, sharded, assume_no_overflow=True)
    assert not report.proven, report.render_text()


@pytest.mark.parametrize("n", [2, 4])
def test_one_sequence_python_loop_ring_training_is_proven(n: int) -> None:
    """The ring as a Python loop (no `while` to fold: the backward's rewrites meet jax's
    batch-1 spelling directly). A factor's shifts there are read through the unit-dim
    reshape `_unit_dims_dropped` made and a transpose (`online_backward._same_shift`,
    `_below`, `_lifted`, `_in_shape`); before, `_absorb` refused every factor and the program
    was not proven at a dot_general over diagonal blocks."""
    close, ref, sharded = _fori_program(n, unroll=True)
    assert close
    report = check_texts(ref, sharded, assume_no_overflow=True, general_tier=False)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


@pytest.mark.parametrize("bug", ring_loop.BUGS)
def test_one_sequence_python_loop_twins_are_not_proven(bug: str) -> None:
    close, ref, sharded = _fori_program(4, bug, unroll=True)
    assert not close
    report = check_texts(ref, sharded, assume_no_overflow=True, verify_rules=False)
    assert not report.proven, report.render_text()


def _unit_dims_dropped(vector_value, dims, shape, at):
    """`_placed` as it was: the vector reshaped to its non-unit dims whatever `dims` says."""
    element = ir.RankedTensorType(vector_value.type).element_type
    with ir.InsertionPoint(at), at.location:
        sizes = online_backward._vector(vector_value)
        value = stablehlo.ReshapeOp(ir.RankedTensorType.get(sizes, element),
                                    vector_value).result
        return stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(shape, element), value,
                                          list(dims)).result


def test_an_invalid_rewrite_is_not_proven_and_named(monkeypatch) -> None:
    """With the old `_placed`, the rewrites build an invalid broadcast: the check says so
    (inconclusive, exit code 3) instead of reading the malformed op or raising."""
    monkeypatch.setattr(online_backward, "_placed", _unit_dims_dropped)
    _, ref, sharded = _program(4, 1)
    report = check_texts(ref, sharded, assume_no_overflow=True)
    assert not report.proven and report.exit_code == 3
    (message,) = _internal(report)
    assert "invalid module" in message and "broadcast_dimensions" in message


def test_a_failing_rewrite_is_not_proven_and_named(monkeypatch) -> None:
    """An exception inside a rewrite is a defect of the checker: not proven, the error named,
    no traceback."""
    def broken(op):
        raise IndexError("tuple index out of range")

    rewrites = dict(idioms.REWRITES)
    rewrites["stablehlo.multiply"] = broken
    monkeypatch.setattr(idioms, "REWRITES", rewrites)
    _, ref, sharded = _program(2, 2)
    report = check_texts(ref, sharded, assume_no_overflow=True)
    assert not report.proven and report.exit_code == 3
    (message,) = _internal(report)
    assert "IndexError" in message
