"""The one_hot spelling of the vocab-parallel cross-entropy pick, forward and gradient, on
tp=4 and dp=2 x tp=4 (the tokens split over 'dp'), grounded on simulated CPU devices.

References: optax's form with the pick as `sum(shifted * one_hot(labels, V))` (the log-sum-exp
of the max-shifted logits minus it), and `-sum(one_hot(labels, V) * log_softmax(logits))`. The
sharded program is Megatron's (pmax of the local max, psum of the local exp-sums), its pick
the one_hot of the local label `labels - shard * n` against the local vocab shard, psum'd.

What makes it proven: `jax.nn.one_hot(x, n)` is `(x[:, None] == iota).astype(f32)`, the
indicator of the compare in f32 (`terms.indicator`), so the product by it is a select, the
local compare is the global one's block (the offset moves onto the iota), and its cotangent
`c * one_hot` and the select `where(eq, c, 0)` jax's transpose builds are one term
(`terms._select_constants`).

The nearest wrong twins compute other numbers and are not proven: the offset off by one, the
one_hot over the global V sliced to the local shard (every device picks from block 0), the
pick's psum missing. The log_softmax reference against Megatron's `lse - pick` is not proven
either, rightly: a label outside [0, V) (an ignore index, -100) has an all-zero one_hot row,
so the reference's loss there is 0 where Megatron's is the log-sum-exp.
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

from entangle_mlir.driver import check_texts
from tests.examples.test_vocab_parallel_ce_grad import (
    DP_TP,
    TP4,
    P,
    _inputs,
    _lower,
    _mesh,
    _run,
    _run_once,
)


def _optax_one_hot(logits, labels):
    """optax's cross-entropy with the pick as a one_hot product."""
    logits = logits - lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    picked = jnp.sum(logits * jax.nn.one_hot(labels, logits.shape[-1]), axis=-1)
    return jnp.log(jnp.sum(jnp.exp(logits), axis=-1)) - picked


def _log_softmax_one_hot(logits, labels):
    """`-sum(one_hot * log_softmax)`: optax's `softmax_cross_entropy` on one-hot labels."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jax.nn.one_hot(labels, logits.shape[-1]) * logp, axis=-1)


REFERENCES = {"optax_one_hot": _optax_one_hot, "log_softmax_one_hot": _log_softmax_one_hot}


def body(kind: str, dp: bool):
    """Megatron's loss on one device (mean over the tokens), the pick a one_hot of the local
    label against the local shard; `log_softmax`: the loss as `-psum(sum(one_hot * (shifted -
    lse)))`; or a twin."""
    def loss(h, w, labels):
        logits = h @ w
        n = logits.shape[-1]
        m = lax.pmax(lax.stop_gradient(jnp.max(logits, axis=-1)), "tp")
        shifted = logits - m[:, None]
        lse = jnp.log(lax.psum(jnp.sum(jnp.exp(shifted), axis=-1), "tp"))
        local = labels - lax.axis_index("tp") * n + (1 if kind == "off_by_one" else 0)
        if kind == "global_v":
            one_hot = jax.nn.one_hot(labels, n * lax.axis_size("tp"))[:, :n]
        else:
            one_hot = jax.nn.one_hot(local, n)
        if kind == "log_softmax":
            per_token = -lax.psum(jnp.sum(one_hot * (shifted - lse[:, None]), axis=-1), "tp")
        else:
            picked = jnp.sum(shifted * one_hot, axis=-1)
            per_token = lse - (picked if kind == "no_pick_psum" else lax.psum(picked, "tp"))
        total = jnp.mean(per_token)
        return lax.pmean(total, "dp") if dp else total
    return loss


def _programs(spelling: str, kind: str, mesh_axes, grad: bool):
    """(reference, sharded program, in_specs)."""
    dp = "dp" in dict(mesh_axes)
    rows = P("dp") if dp else P()
    specs = (P(*rows, None), P(None, "tp"), rows)
    fwd = jax.shard_map(body(kind, dp), mesh=_mesh(mesh_axes), in_specs=specs, out_specs=P(),
                        check_vma=kind not in ("no_pick_psum", "global_v"))
    per_token = REFERENCES[spelling]

    def ref_loss(h, w, labels):
        return jnp.mean(per_token(h @ w, labels))
    if grad:
        return (jax.grad(ref_loss, argnums=(0, 1)), jax.grad(fwd, argnums=(0, 1)), specs)
    return (lambda *a: (ref_loss(*a),)), (lambda *a: (fwd(*a),)), specs


def _ignored_labels():
    """The inputs with two labels at an ignore index (-100)."""
    h, w, labels = _inputs()
    labels = labels.copy()
    labels[[3, 9]] = -100
    return h, w, labels


@functools.cache
def _verdict(spelling: str, kind: str, mesh_axes, grad: bool, ignored: bool = False):
    """(the sharded program's numbers match the reference's, the report)."""
    ref, fn, specs = _programs(spelling, kind, mesh_axes, grad)
    inputs = _ignored_labels() if ignored else _inputs()
    got = _run(fn, mesh_axes, specs, inputs)
    want = _run_once(ref, inputs)
    close = all(np.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    return close, check_texts(*_lower(ref, fn, mesh_axes, specs, inputs))


PAIRS = {"optax_one_hot": "one_hot", "log_softmax_one_hot": "log_softmax"}
"""Each reference and the sharded spelling that computes it."""

CORRECT = [(spelling, mesh, grad) for spelling in PAIRS for mesh in (TP4, DP_TP)
           for grad in (False, True)]


def _id(spelling, mesh, grad) -> str:
    return f"{spelling}-{'dp2xtp4' if mesh == DP_TP else 'tp4'}-{'grad' if grad else 'fwd'}"


@pytest.mark.parametrize("spelling,mesh_axes,grad", CORRECT, ids=[_id(*c) for c in CORRECT])
def test_the_one_hot_pick_is_proven(spelling: str, mesh_axes, grad: bool) -> None:
    close, report = _verdict(spelling, PAIRS[spelling], mesh_axes, grad)
    assert close
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


TWINS = {
    "off_by_one": ("which the reference never computes",),
    "global_v": ("laid out differently",),
    "no_pick_psum": ("still a partial sum over 'tp'", "1/4 x what the reference computes"),
}
"""The nearest wrong twins, and what the report says of each (forward or gradient)."""


@pytest.mark.parametrize("mesh_axes", [TP4, DP_TP], ids=["tp4", "dp2xtp4"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("kind", sorted(TWINS))
def test_the_nearest_wrong_twins_are_not_proven(kind: str, grad: bool, mesh_axes) -> None:
    close, report = _verdict("optax_one_hot", kind, mesh_axes, grad)
    assert not close
    assert not report.proven, report.render_text()
    assert any(words in report.render_text() for words in TWINS[kind]), report.render_text()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_log_softmax_one_hot_is_not_megatrons_pick_on_ignored_labels(grad: bool) -> None:
    """The log_softmax reference and Megatron's `lse - pick` differ on a label outside
    [0, V) (its one_hot row is zero: loss 0 against lse): not proven."""
    close, report = _verdict("log_softmax_one_hot", "one_hot", TP4, grad, ignored=True)
    assert not close
    assert not report.proven, report.render_text()
