"""Programs beyond the catalogue: ops outside shard_map, several mesh axes on one dim, 2-D
meshes. Each is grounded by running both programs on simulated CPU devices."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.jax import check
from tests.jax_runs import run_once

MESH = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def _avals(shapes_specs):
    return [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(MESH, spec))
            for s, spec in shapes_specs]


def _run(fn, avals, seed=0):
    rng = np.random.default_rng(seed)
    args = [jax.device_put(rng.standard_normal(a.shape).astype(np.float32), a.sharding)
            for a in avals]
    return np.asarray(run_once(fn, *args))


def _grounded(ref, sharded, avals) -> float:
    return float(np.max(np.abs(_run(ref, avals) - _run(sharded, avals))))


def _mlp_ref(x, w1, w2):
    return jnp.tanh(jax.nn.relu(2.0 * x @ w1) @ w2) + 1.0


def _mlp_body(x, w1, w2):
    return lax.psum(jax.nn.relu(x @ w1) @ w2, "tp")


MLP_AVALS = [((8, 16), P()), ((16, 32), P(None, "tp")), ((32, 16), P("tp", None))]


def test_ops_outside_shard_map_are_global() -> None:
    inner = jax.shard_map(_mlp_body, mesh=MESH, in_specs=(P(), P(None, "tp"), P("tp", None)),
                          out_specs=P())

    def sharded(x, w1, w2):
        return jnp.tanh(inner(2.0 * x, w1, w2)) + 1.0

    avals = _avals(MLP_AVALS)
    assert _grounded(_mlp_ref, sharded, avals) < 1e-4
    report = check(_mlp_ref, jax.jit(sharded), *avals, verify_rules=False)
    assert report.proven, report.render_text()
    assert report.outputs[0].rho == "computed globally (outside shard_map)"


def test_global_op_bug_outside_shard_map_is_flagged() -> None:
    inner = jax.shard_map(_mlp_body, mesh=MESH, in_specs=(P(), P(None, "tp"), P("tp", None)),
                          out_specs=P())

    def sharded(x, w1, w2):
        return jnp.tanh(inner(x, w1, w2)) + 1.0   # forgot the 2.0 * x before the layer

    avals = _avals(MLP_AVALS)
    assert _grounded(_mlp_ref, sharded, avals) > 1e-3
    report = check(_mlp_ref, jax.jit(sharded), *avals, verify_rules=False)
    assert not report.proven


def _rows_ref(x):
    return jnp.sum(x * x, axis=0, keepdims=True) + x[:3]


def _gather_body(axes):
    def body(x):
        full = lax.all_gather(x, axes, axis=0, tiled=True)
        return jnp.sum(full * full, axis=0, keepdims=True) + full[:3]
    return body


@pytest.mark.parametrize("axes, correct", [(("dp", "tp"), True), (("tp", "dp"), False)])
def test_two_axes_on_one_dim(axes, correct) -> None:
    """x rows split over ('dp', 'tp'); gathering in the other axis order scrambles the rows."""
    sharded = jax.jit(jax.shard_map(_gather_body(axes), mesh=MESH, in_specs=(P(("dp", "tp")),),
                                    out_specs=P(), check_vma=False))
    avals = _avals([((16, 4), P(("dp", "tp")))])
    diff = _grounded(_rows_ref, sharded, avals)
    assert (diff < 1e-4) == correct
    report = check(_rows_ref, sharded, *avals, verify_rules=False)
    assert report.proven == correct, report.render_text()
    if not correct:
        assert "all_gather" in report.diagnostics[0].message


def _norm_ref(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def test_2d_mesh_batch_and_hidden_split() -> None:
    """RMSNorm with batch over 'dp' and hidden over 'tp' (psum of the sum of squares)."""
    def body(x, g):
        ss = lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), "tp")
        return x * lax.rsqrt(ss / 64 + 1e-6) * g

    sharded = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=(P("dp", "tp"), P("tp")),
                                    out_specs=P("dp", "tp")))
    avals = _avals([((4, 64), P("dp", "tp")), ((64,), P("tp"))])
    assert _grounded(_norm_ref, sharded, avals) < 1e-4
    report = check(_norm_ref, sharded, *avals, verify_rules=False)
    assert report.proven, report.render_text()
    assert report.outputs[0].rho == "concat over 'dp' along dim 0, then concat over 'tp' along dim 1"


def test_axis_index_offsets_select_own_block() -> None:
    """x replicated; each device slices its own rows with axis_index (a dynamic_slice)."""
    def body(x):
        i = lax.axis_index("tp")
        return lax.dynamic_slice_in_dim(x, i * 2, 2, axis=0) * 3.0

    def body_bug(x):
        i = lax.axis_index("tp")
        return lax.dynamic_slice_in_dim(x, i, 2, axis=0) * 3.0   # offset i, not i * 2

    ref = lambda x: x * 3.0
    avals = _avals([((8, 4), P())])
    for fn, correct in ((body, True), (body_bug, False)):
        sharded = jax.jit(jax.shard_map(fn, mesh=MESH, in_specs=(P(),), out_specs=P("tp"),
                                        check_vma=False))
        assert (_grounded(ref, sharded, avals) < 1e-4) == correct
        report = check(ref, sharded, *avals, verify_rules=False)
        assert report.proven == correct, report.render_text()
        if not correct:
            assert "device 1 reads" in report.diagnostics[0].message


def _scan_ref(x, w1, w2):
    def layer(h, ws):
        a, b = ws
        return h + jnp.tanh(h @ a) @ b, None
    return lax.scan(layer, x, (w1, w2))[0]


def _scan_body(x, w1, w2):
    def layer(h, ws):
        a, b = ws
        return h + lax.psum(jnp.tanh(h @ a) @ b, "tp"), None
    return lax.scan(layer, x, (w1, w2))[0]


def _scan_body_missing_psum(x, w1, w2):
    def layer(h, ws):
        a, b = ws
        return h + jnp.tanh(h @ a) @ b, None   # the psum is missing inside the loop
    return lax.scan(layer, x, (w1, w2))[0]


SCAN_AVALS = [((8, 16), P()), ((3, 16, 32), P(None, None, "tp")), ((3, 32, 16), P(None, "tp", None))]


@pytest.mark.parametrize("body, correct", [(_scan_body, True), (_scan_body_missing_psum, False)])
def test_scan_over_layers_is_a_loop_fixpoint(body, correct) -> None:
    sharded = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=(P(), P(None, None, "tp"),
                                                                P(None, "tp", None)),
                                    out_specs=P(), check_vma=False))
    avals = _avals(SCAN_AVALS)
    scale = [1.0, 0.25, 0.25]
    rng = np.random.default_rng(0)
    args = [jax.device_put((rng.standard_normal(a.shape) * s).astype(np.float32), a.sharding)
            for a, s in zip(avals, scale)]
    diff = float(np.max(np.abs(np.asarray(run_once(_scan_ref, *args))
                               - np.asarray(run_once(sharded, *args)))))
    assert (diff < 1e-4) == correct
    report = check(_scan_ref, sharded, *avals, verify_rules=False)
    assert report.proven == correct, report.render_text()
    if not correct:
        assert "missing all_reduce/psum inside the loop" in report.diagnostics[0].message
        assert report.diagnostics[0].loc.line == _scan_body_missing_psum.__code__.co_firstlineno + 3


def _take_ref(w, t):
    return jnp.take(w, t, axis=0) * 2.0


def test_take_with_bounds_check_and_nan_fill_is_proven() -> None:
    """jnp.take's default mode checks bounds with a reduce over `and` and fills with NaN."""
    sharded = jax.jit(jax.shard_map(_take_ref, mesh=MESH, in_specs=(P(None, "tp"), P()),
                                    out_specs=P(None, "tp")))
    avals = [jax.ShapeDtypeStruct((16, 8), jnp.float32,
                                  sharding=NamedSharding(MESH, P(None, "tp"))),
             jax.ShapeDtypeStruct((8,), jnp.int32, sharding=NamedSharding(MESH, P()))]
    rng = np.random.default_rng(0)
    w = jax.device_put(rng.standard_normal((16, 8)).astype(np.float32), avals[0].sharding)
    t = jax.device_put(rng.integers(0, 16, 8).astype(np.int32), avals[1].sharding)
    assert np.allclose(np.asarray(run_once(_take_ref, w, t)), np.asarray(run_once(sharded, w, t)))
    report = check(_take_ref, sharded, *avals)
    assert report.proven, report.render_text()
    assert "0 refuted, 0 inconclusive" in report.mode


TP4 = jax.make_mesh((4,), ("tp",), axis_types=(AxisType.Auto,))


def _positions_ref(x):
    return x * jnp.arange(16)[:, None].astype(x.dtype)


def _positions_body(x):
    s = x.shape[0]
    pos = lax.axis_index("tp") * s + jnp.arange(s)   # global positions of this sequence shard
    return x * pos.astype(x.dtype)[:, None]


def _positions_restart(x):
    s = x.shape[0]
    pos = jnp.arange(s)   # restarts at 0 on every shard
    return x * pos.astype(x.dtype)[:, None]


def _onehot_ref(w, t):
    return jax.nn.one_hot(t, 16, dtype=w.dtype) @ w


def _onehot_body(w, t):
    vl = w.shape[0]
    start = lax.axis_index("tp") * vl
    hit = (t[:, None] - start) == jnp.arange(vl)[None, :]
    return lax.psum(hit.astype(w.dtype) @ w, "tp")


def _onehot_no_offset(w, t):
    vl = w.shape[0]
    hit = t[:, None] == jnp.arange(vl)[None, :]   # forgot the shard's vocab offset
    return lax.psum(hit.astype(w.dtype) @ w, "tp")


@pytest.mark.parametrize("ref, body, correct, specs, out, shapes", [
    (_positions_ref, _positions_body, True, (P("tp"),), P("tp"), ((16, 4),)),
    (_positions_ref, _positions_restart, False, (P("tp"),), P("tp"), ((16, 4),)),
    (_onehot_ref, _onehot_body, True, (P("tp"), P()), P(), ((16, 4), (8,))),
    (_onehot_ref, _onehot_no_offset, False, (P("tp"), P()), P(), ((16, 4), (8,))),
], ids=["positions", "positions-restart", "vocab-onehot", "vocab-onehot-no-offset"])
def test_device_offset_tensors(ref, body, correct, specs, out, shapes) -> None:
    """axis_index * n broadcast into a tensor: shard positions and vocab ranges."""
    sharded = jax.jit(jax.shard_map(body, mesh=TP4, in_specs=specs, out_specs=out,
                                    check_vma=False))
    dtypes = [jnp.float32, jnp.int32]
    avals = [jax.ShapeDtypeStruct(s, dtypes[i], sharding=NamedSharding(TP4, p))
             for i, (s, p) in enumerate(zip(shapes, specs))]
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal(avals[0].shape).astype(np.float32),
                           avals[0].sharding)]
    if len(avals) > 1:
        args.append(jax.device_put(rng.integers(0, 16, 8).astype(np.int32), avals[1].sharding))
    diff = float(np.max(np.abs(np.asarray(run_once(ref, *args))
                               - np.asarray(run_once(sharded, *args)))))
    assert (diff < 1e-4) == correct
    report = check(ref, sharded, *avals, verify_rules=False)
    assert report.proven == correct, report.render_text()


def _unit_ref(x, b):
    return x - b.reshape(1, -1)


def test_split_dim_of_local_size_one_meets_a_unit_dim() -> None:
    """4 rows over tp=4: each device holds one row; `b.reshape(1, -1)` needs no broadcast op,
    its unit dim broadcasts against the split dim."""
    sharded = jax.jit(jax.shard_map(_unit_ref, mesh=TP4, in_specs=(P("tp"), P()),
                                    out_specs=P("tp")))
    avals = [jax.ShapeDtypeStruct((4, 16), jnp.float32, sharding=NamedSharding(TP4, P("tp"))),
             jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(TP4, P()))]
    assert _grounded(_unit_ref, sharded, avals) < 1e-5
    report = check(_unit_ref, sharded, *avals)
    assert report.proven, report.render_text()
