"""Device-dependent values passed from one shard_map to the next (issue 18): jax's gradient of a
shard_map'd vocab-parallel embedding returns the forward's clipped local ids and mask as
residuals (out_specs split over 'tp') that the backward's shard_map reads back per device, and
scatter-adds the masked cotangent at the local ids. Both run on simulated CPU devices.

The correct programs compute the reference's numbers and are proven; the nearest wrong twins
(the mask's bound off by one, no mask before the scatter, the residuals read back with other
in_specs) compute other numbers and are not proven. Residuals returned with out_specs that do
not split over an axis they vary along are refused too: the global value would replicate along
that axis what differs between its devices (check_vma rejects it; without the check, this
runtime happens to leave each device its own buffer, so it is not a twin executed to differ).
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
from tests.jax_runs import run_once

V, D = 64, 8
TP4 = (("tp", 4),)
DP_TP = (("dp", 2), ("tp", 4))
AB = (("a", 2), ("b", 2))


def _mesh(axes):
    names = tuple(a for a, _ in axes)
    return jax.make_mesh(tuple(n for _, n in axes), names,
                         axis_types=(AxisType.Auto,) * len(names))


def embed(kind: str, axis="tp"):
    """Megatron's VocabParallelEmbedding (heldout maxtext_style), or one mistake."""
    def body(t, w):
        n = w.shape[0]
        local = t - lax.axis_index(axis) * n
        mask = (local >= 0) & ((local <= n) if kind == "mask_le_n" else (local < n))
        rows = jnp.take(w, jnp.clip(local, 0, n - 1), axis=0)
        if kind != "no_mask":
            rows = jnp.where(mask[..., None], rows, 0.0)
        return lax.psum(rows, axis)
    return body


def _loss_grad(f):
    return jax.grad(lambda t, w: (f(t, w) ** 2).sum(), argnums=1)


def reference(t, w):
    return _loss_grad(lambda t, w: w[t])(t, w)


def _inputs(shape=(2, 8), seed: int = 5):
    """Token ids at every block's first and last row (where an off-by-one shows), and random."""
    rng = np.random.default_rng(seed)
    t = rng.integers(0, V, shape).astype(np.int32)
    edges = np.array([b * 16 + k for b in range(4) for k in (0, 15)], np.int32)
    t.reshape(-1)[:edges.size] = edges
    w = rng.standard_normal((V, D)).astype(np.float32)
    return t, w


def _run(fn, mesh_axes, specs, inputs):
    mesh = _mesh(mesh_axes)
    placed = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(inputs, specs)]
    return np.asarray(run_once(fn, *placed))


def _lower(fn, mesh_axes, specs, inputs) -> tuple[str, str]:
    mesh = _mesh(mesh_axes)
    plain = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
    placed = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))
              for x, s in zip(inputs, specs)]
    return (jax.jit(reference).lower(*plain).as_text(),
            jax.jit(fn).lower(*placed).as_text())


@functools.cache
def _grad_program(kind: str, mesh_axes=TP4):
    tokens = P("dp") if "dp" in dict(mesh_axes) else P()
    fwd = jax.shard_map(embed(kind), mesh=_mesh(mesh_axes), in_specs=(tokens, P("tp", None)),
                        out_specs=tokens, check_vma=kind == "correct")
    return _loss_grad(fwd)


@pytest.mark.parametrize("mesh_axes", [TP4, DP_TP], ids=["tp4", "dp2xtp4"])
@pytest.mark.parametrize("kind", ["correct", "mask_le_n", "no_mask"])
def test_gradient_of_the_vocab_parallel_embedding(kind: str, mesh_axes) -> None:
    """jax.grad of the shard_map'd embedding: the residuals leave over 'tp' (with 'dp' when
    the tokens are split over it) and the backward reads them back likewise."""
    inputs = _inputs((4, 8) if "dp" in dict(mesh_axes) else (2, 8))
    specs = (P("dp") if "dp" in dict(mesh_axes) else P(), P("tp", None))
    program = _grad_program(kind, mesh_axes)
    got = _run(program, mesh_axes, specs, inputs)
    want = np.asarray(run_once(reference, *inputs))
    assert np.allclose(got, want, atol=1e-4) is (kind == "correct")
    report = check_texts(*_lower(program, mesh_axes, specs, inputs))
    assert report.proven is (kind == "correct"), report.render_text()
    assert not report.proven or report.stats["tier"] == "layout"
    reasons = {"mask_le_n": "off-by-one bound", "no_mask": "never zeroed"}
    if kind in reasons:
        assert reasons[kind] in report.render_text(), report.render_text()


# ----- the residuals passed by hand between two shard_maps ---------------------------------------

def _forward(t, w):
    """The embedding and its residuals: the clipped local ids and the mask."""
    n = w.shape[0]
    local = t - lax.axis_index(("a", "b")) * n
    mask = (local >= 0) & (local < n)
    idx = jnp.clip(local, 0, n - 1)
    rows = jnp.where(mask[..., None], jnp.take(w, idx, axis=0), 0.0)
    return lax.psum(rows, ("a", "b")), idx, mask


def _backward(g, idx, mask):
    n = V // 4
    g = jnp.where(mask[..., None], g, 0.0)
    return jnp.zeros((n, D), g.dtype).at[idx].add(g)


def _forward_local(t, w):
    """The embedding, returning the unclipped local ids `t - start` (device offsets) instead."""
    out, _, _ = _forward(t, w)
    return out, t - lax.axis_index(("a", "b")) * w.shape[0]


def _backward_local(g, local):
    n = V // 4
    mask = (local >= 0) & (local < n)
    return _backward(g, jnp.clip(local, 0, n - 1), mask)


RESIDUALS = {
    "same": (P(("a", "b")), P(("a", "b"))),
    "axes_swapped": (P(("a", "b")), P(("b", "a"))),
    "dims_swapped": (P("a", "b"), P("b", "a")),
    "not_split_over_b": (P("a"), P("a")),
    "local_ids_same": (P(("a", "b")), P(("a", "b"))),
    "local_ids_axes_swapped": (P(("a", "b")), P(("b", "a"))),
}
"""(out_specs of the forward's residuals, in_specs of the backward's) by name."""


@functools.cache
def _by_hand(kind: str):
    out_spec, in_spec = RESIDUALS[kind]
    mesh = _mesh(AB)
    local = kind.startswith("local_ids")
    count = 1 if local else 2
    fwd = jax.shard_map(_forward_local if local else _forward, mesh=mesh,
                        in_specs=(P(None, None), P(("a", "b"), None)),
                        out_specs=(P(),) + (out_spec,) * count, check_vma=False)
    bwd = jax.shard_map(_backward_local if local else _backward, mesh=mesh,
                        in_specs=(P(),) + (in_spec,) * count, out_specs=P(("a", "b"), None),
                        check_vma=False)

    def grad(t, w):
        out, *residuals = fwd(t, w)
        return bwd(2 * out, *residuals)
    return grad


@pytest.mark.parametrize("kind", list(RESIDUALS))
def test_residuals_read_back_by_another_shard_map(kind: str) -> None:
    """Proven only when the backward reads the residuals with the forward's specs, dim by dim
    and axis by axis, and they split over every axis the residuals vary along."""
    inputs = _inputs()
    specs = (P(), P(("a", "b"), None))
    got = _run(_by_hand(kind), AB, specs, inputs)
    want = np.asarray(run_once(reference, *inputs))
    if kind != "not_split_over_b":
        assert np.allclose(got, want, atol=1e-4) is kind.endswith("same")
    report = check_texts(*_lower(_by_hand(kind), AB, specs, inputs))
    assert report.proven is kind.endswith("same"), report.render_text()
    assert not report.proven or report.stats["tier"] == "layout"
    if not kind.endswith("same"):
        text = report.render_text()
        expected = "varies along 'b'" if kind == "not_split_over_b" else "read back with in_specs"
        assert expected in text, text


# ----- tiled activations returned as residuals ------------------------------------------------

H = 16


def _head_inputs(seed: int = 3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((8, H)).astype(np.float32),
            rng.standard_normal((H, V)).astype(np.float32))


def head_loss_reference(h, w):
    return jax.grad(lambda h, w: jnp.sum(jnp.tanh(h @ w) ** 2), argnums=(0, 1))(h, w)


def _column_parallel_loss(h, w):
    return lax.psum(jnp.sum(jnp.tanh(h @ w) ** 2), "tp")


def test_gradient_keeps_column_parallel_activations_as_residuals() -> None:
    """jax.grad of a column-parallel head: the forward's activations tanh(h @ w[:, block])
    are split along dim 1, and jax returns them as residuals split over 'tp' along dim 0
    (no reference term is that global value); the backward reads them back with the same
    specs, so every device gets its own block: proven by the layout tier (the general tier
    proved it before, expanding every device). Grounded by running both."""
    fwd = jax.shard_map(_column_parallel_loss, mesh=_mesh(TP4),
                        in_specs=(P(), P(None, "tp")), out_specs=P())
    program = jax.grad(fwd, argnums=(0, 1))
    inputs, specs = _head_inputs(), (P(), P(None, "tp"))
    mesh = _mesh(TP4)
    placed = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(inputs, specs)]
    got = run_once(program, *placed)
    want = run_once(head_loss_reference, *inputs)
    assert all(np.allclose(g, w, atol=1e-4) for g, w in zip(got, want))
    plain = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
    shaped = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))
              for x, s in zip(inputs, specs)]
    texts = (jax.jit(head_loss_reference).lower(*plain).as_text(),
             jax.jit(program).lower(*shaped).as_text())
    assert 'out_shardings=[<@mesh, [{"tp"}, {}]>' in texts[1].replace("\n", "")
    report = check_texts(*texts)
    assert report.proven, report.render_text()
    assert report.stats["tier"] == "layout", report.stats


def activations_back_reference(h, w):
    return jnp.tanh(h @ w) @ w.T


@pytest.mark.parametrize("read_back", ["same", "axes_swapped"])
def test_tiled_activations_read_back_by_another_shard_map(read_back: str) -> None:
    """The same by hand on a 2 x 2 mesh: the activations leave split over ('a', 'b') along
    dim 0 (their own split is dim 1) and come back to multiply each device's block of w;
    read back with ('b', 'a'), devices 1 and 2 get each other's activations: other numbers,
    not proven."""
    mesh = _mesh(AB)
    out_spec = P(("a", "b"), None)
    in_spec = out_spec if read_back == "same" else P(("b", "a"), None)
    w_spec = P(None, ("a", "b"))
    fwd = jax.shard_map(lambda h, w: jnp.tanh(h @ w), mesh=mesh, in_specs=(P(), w_spec),
                        out_specs=out_spec, check_vma=False)
    bwd = jax.shard_map(lambda a, w: lax.psum(a @ w.T, ("a", "b")), mesh=mesh,
                        in_specs=(in_spec, w_spec), out_specs=P(), check_vma=False)

    def program(h, w):
        return bwd(fwd(h, w), w)

    inputs, specs = _head_inputs(), (P(), w_spec)
    got = _run(program, AB, specs, inputs)
    want = np.asarray(run_once(activations_back_reference, *inputs))
    assert np.allclose(got, want, atol=1e-4) is (read_back == "same")
    plain = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
    shaped = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))
              for x, s in zip(inputs, specs)]
    report = check_texts(jax.jit(activations_back_reference).lower(*plain).as_text(),
                         jax.jit(program).lower(*shaped).as_text())
    assert report.proven is (read_back == "same"), report.render_text()
    if read_back == "same":
        assert report.stats["tier"] == "layout", report.stats
    else:
        assert "read back with in_specs" in report.render_text(), report.render_text()
