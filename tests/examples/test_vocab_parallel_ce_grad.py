"""The gradient of Megatron's vocab-parallel cross-entropy (issue 21): logits `h @ w` with `w`
split over 'tp' along the vocabulary, the loss written with pmax of the local row max, psum of
the local exp-sums and the target logit picked with the block mask and psum'd, then `jax.grad`
outside the shard_map (w.r.t. `h` and `w`). It is checked against the references people write:
`log_softmax` + `take_along_axis`, `jax.nn.logsumexp` minus the picked logit (its `is_finite`
guard is proven only under --assume-no-overflow: the sharded program has no such guard), and
optax's `softmax_cross_entropy_with_integer_labels` written out; mean and sum over the
tokens; on tp=4, and on dp=2 x tp=4 with the tokens split over 'dp' (the loss pmean'd or
psum'd over 'dp', so jax sums the weight's cotangent over 'dp'); the sharded side also with
Megatron's `where(mask, local, 0)` for the clip, and traced without check_vma (psum's
transpose a psum). Both programs run on simulated CPU devices.

The correct programs compute the reference's numbers and are proven. The nearest wrong twins
compute other numbers and are not proven: the mask's bound off by one, the local max not
pmax'd (each device shifts by its own max), the exp-sum's psum missing, the mean's 1/N applied
twice, the labels offset by another device's block.
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

from entangle_mlir.driver import check_texts
from entangle_mlir.evidence import run_once

N, D, V = 16, 8, 64
TP4 = (("tp", 4),)
DP_TP = (("dp", 2), ("tp", 4))
GUARDED = {"logsumexp"}
"""References whose own overflow guard needs --assume-no-overflow (`jax.nn.logsumexp`)."""


def _mesh(axes):
    names = tuple(a for a, _ in axes)
    return jax.make_mesh(tuple(n for _, n in axes), names,
                         axis_types=(AxisType.Auto,) * len(names))


# ----- the references -----------------------------------------------------------------------

def _log_softmax(logits, labels):
    """-log p(label): `jax.nn.log_softmax` picked by `take_along_axis`."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]


def _logsumexp(logits, labels):
    """`jax.nn.logsumexp` minus the picked logit."""
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked


def _optax(logits, labels):
    """optax's `softmax_cross_entropy_with_integer_labels`, written out (optax >= 0.2)."""
    logits_max = jnp.max(logits, axis=-1, keepdims=True)
    logits = logits - lax.stop_gradient(logits_max)
    label_logits = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    log_normalizers = jnp.log(jnp.sum(jnp.exp(logits), axis=-1))
    return log_normalizers - label_logits


REFERENCES = {"log_softmax": _log_softmax, "logsumexp": _logsumexp, "optax": _optax}


def reference(spelling: str, reduction: str):
    """The loss's gradient w.r.t. (h, w) as the reference writes it."""
    per_token = REFERENCES[spelling]
    reduce = jnp.mean if reduction == "mean" else jnp.sum

    def loss(h, w, labels):
        return reduce(per_token(h @ w, labels))
    return jax.grad(loss, argnums=(0, 1))


# ----- the sharded program ------------------------------------------------------------------

def body(kind: str, reduction: str, dp: bool):
    """Megatron's vocab-parallel cross-entropy on one device, one of its spellings
    (`where_zero`: the local index zeroed outside the block, as Megatron writes it, not
    clipped), or one mistake."""
    def loss(h, w, labels):
        logits = h @ w
        n = logits.shape[-1]
        m = lax.stop_gradient(jnp.max(logits, axis=-1))
        if kind != "local_max":
            m = lax.pmax(m, "tp")
        shifted = logits - m[:, None]
        sums = jnp.sum(jnp.exp(shifted), axis=-1)
        lse = jnp.log(sums if kind == "no_sum_psum" else lax.psum(sums, "tp"))
        shard = lax.axis_index("tp")
        if kind == "wrong_shard":
            shard = lax.axis_size("tp") - 1 - shard
        local = labels - shard * n
        mask = (local >= 0) & ((local <= n) if kind == "mask_le_n" else (local < n))
        inside = jnp.where(mask, local, 0) if kind == "where_zero" else jnp.clip(local, 0, n - 1)
        picked = jnp.take_along_axis(shifted, inside[:, None], axis=-1)[:, 0]
        picked = lax.psum(jnp.where(mask, picked, 0.0), "tp")
        per_token = lse - picked
        if reduction == "sum":
            total = jnp.sum(per_token)
            return lax.psum(total, "dp") if dp else total
        total = jnp.mean(per_token)
        if kind == "mean_twice":
            total = total / per_token.shape[0]
        return lax.pmean(total, "dp") if dp else total
    return loss


UNCHECKED = {"local_max", "no_sum_psum"}
"""Mistakes that leave the loss varying over 'tp', which shard_map's check_vma rejects: they
are traced without it."""


def sharded(kind: str, reduction: str, mesh_axes, check_vma: bool = True):
    """jax.grad of the shard_map'd loss, and the in_specs. Without check_vma (as code written
    for `check_rep=False` runs), psum's transpose is a psum and the output's cotangent is
    divided over the devices: other collectives, the same numbers."""
    dp = "dp" in dict(mesh_axes)
    rows = P("dp") if dp else P()
    specs = (P(*rows, None), P(None, "tp"), rows)
    fwd = jax.shard_map(body(kind, reduction, dp), mesh=_mesh(mesh_axes), in_specs=specs,
                        out_specs=P(), check_vma=check_vma and kind not in UNCHECKED)
    return jax.grad(fwd, argnums=(0, 1)), specs


# ----- running and checking -----------------------------------------------------------------

def _inputs(seed: int = 3):
    """Labels at every block's first and last id (where an off-by-one shows), and random."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, V, (N,)).astype(np.int32)
    labels[:8] = [b * (V // 4) + k for b in range(4) for k in (0, V // 4 - 1)]
    h = rng.standard_normal((N, D)).astype(np.float32)
    w = rng.standard_normal((D, V)).astype(np.float32)
    return h, w, labels


def _run(fn, mesh_axes, specs, inputs):
    mesh = _mesh(mesh_axes)
    placed = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(inputs, specs)]
    return _run_once(fn, placed)


def _run_once(fn, args) -> list[np.ndarray]:
    """`fn`'s outputs on `args`, run once (`evidence.run_once`: compared within a
    tolerance)."""
    return [np.asarray(g) for g in run_once(fn, *args)]


def _lower(ref, fn, mesh_axes, specs, inputs) -> tuple[str, str]:
    mesh = _mesh(mesh_axes)
    plain = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
    placed = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))
              for x, s in zip(inputs, specs)]
    return jax.jit(ref).lower(*plain).as_text(), jax.jit(fn).lower(*placed).as_text()


@functools.cache
def _verdict(spelling: str, reduction: str, kind: str, mesh_axes, assume_no_overflow: bool,
             check_vma: bool = True):
    """(the sharded gradient matches the reference's numbers, the report)."""
    inputs = _inputs()
    ref = reference(spelling, reduction)
    fn, specs = sharded(kind, reduction, mesh_axes, check_vma)
    got = _run(fn, mesh_axes, specs, inputs)
    want = _run_once(ref, inputs)
    close = all(np.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    report = check_texts(*_lower(ref, fn, mesh_axes, specs, inputs),
                         assume_no_overflow=assume_no_overflow)
    return close, report


CORRECT = [(spelling, reduction, mesh)
           for spelling in REFERENCES for reduction in ("mean", "sum")
           for mesh in (TP4, DP_TP)]


@pytest.mark.parametrize("spelling,reduction,mesh_axes", CORRECT,
                         ids=[f"{s}-{r}-{'dp2xtp4' if m == DP_TP else 'tp4'}"
                              for s, r, m in CORRECT])
def test_the_gradient_is_proven(spelling: str, reduction: str, mesh_axes) -> None:
    """Proven in the layout tier, under the valid-label assumption the report states (and
    --assume-no-overflow for `jax.nn.logsumexp`'s guard)."""
    close, report = _verdict(spelling, reduction, "correct", mesh_axes, spelling in GUARDED)
    assert close
    assert report.proven, report.render_text()
    assert report.stats["tier"] == "layout"
    assert "holds valid indices, 0 <= value < 64" in report.render_text()


@pytest.mark.parametrize("mesh_axes", [TP4, DP_TP], ids=["tp4", "dp2xtp4"])
def test_megatrons_local_index_is_proven(mesh_axes) -> None:
    """Megatron's own spelling of the local index, `where(mask, local, 0)` (not a clip)."""
    close, report = _verdict("log_softmax", "mean", "where_zero", mesh_axes, False)
    assert close
    assert report.proven, report.render_text()
    assert report.stats["tier"] == "layout"


@pytest.mark.parametrize("mesh_axes", [TP4, DP_TP], ids=["tp4", "dp2xtp4"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_gradient_without_check_vma_is_proven(reduction: str, mesh_axes) -> None:
    """Traced without check_vma, the backward psums the loss's cotangent over 'tp' and
    divides the output's over the devices: proven too."""
    close, report = _verdict("log_softmax", reduction, "correct", mesh_axes, False, False)
    assert close
    assert report.proven, report.render_text()
    assert report.stats["tier"] == "layout"


def test_logsumexp_guard_needs_the_overflow_assumption() -> None:
    """Without --assume-no-overflow, `jax.nn.logsumexp`'s `is_finite` guard stays (the max of
    `h @ w` may overflow): the sharded program has none, so the pair is not proven, the guard
    is named as the reason, and the check under the assumption proves it."""
    close, report = _verdict("logsumexp", "mean", "correct", TP4, False)
    assert close
    assert not report.proven, report.render_text()
    assert report.diagnostics[0].category == "overflow", report.render_text()
    assert report.stats["assuming no overflow"] == "proven"


TWINS = {
    "mask_le_n": "an off-by-one bound",
    "local_max": "partial max over 'tp' (missing all_reduce",
    "no_sum_psum": "applied to a partial sum over 'tp': missing all_reduce/psum",
    "mean_twice": "which the reference never computes",
    "wrong_shard": "device-dependent offset tensor",
}
"""The nearest wrong twins, and what the report says of each."""


@pytest.mark.parametrize("mesh_axes", [TP4, DP_TP], ids=["tp4", "dp2xtp4"])
@pytest.mark.parametrize("kind", list(TWINS))
def test_the_nearest_wrong_twins_are_not_proven(kind: str, mesh_axes) -> None:
    """Each twin computes other numbers and is not proven, for its reason."""
    close, report = _verdict("log_softmax", "mean", kind, mesh_axes, False)
    assert not close
    assert not report.proven, report.render_text()
    assert TWINS[kind] in report.render_text(), report.render_text()
