"""Diagnostics in the user's vocabulary (issue 20): a scale factor spelled with the program's
own constant (`0.1 (float32)`, not 13421773/134217728), grounded by running both programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import examples.catalog  # noqa: F401 - sets XLA_FLAGS (8 CPU devices) before jax starts
from entangle_mlir.jax import check

MESH = jax.make_mesh((4,), ("tp",))
SPECS = (P(None, "tp"), P("tp", None))
AVALS = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(MESH, p))
         for s, p in zip(((8, 16), (16, 8)), SPECS)]


def _reference(x, w):
    return x @ w


def _body(x, w):
    return 0.1 * jax.lax.psum(x @ w, "tp")   # BUG: a scale the reference does not have


def _sharded():
    return jax.jit(jax.shard_map(_body, mesh=MESH, in_specs=SPECS, out_specs=P()))


def test_grounding() -> None:
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(a.shape).astype(np.float32) for a in AVALS)
    want = np.asarray(jax.jit(_reference)(x, w), np.float64)
    got = np.asarray(_sharded()(*(jax.device_put(v, a.sharding) for v, a in zip((x, w), AVALS))),
                     np.float64)
    assert not np.allclose(want, got, rtol=1e-3)
    assert np.allclose(got, want * float(np.float32(0.1)), rtol=1e-5)


def test_factor_is_spelled_with_the_programs_constant() -> None:
    report = check(_reference, _sharded(), *AVALS, verify_rules=False)
    assert not report.proven
    message = report.diagnostics[0].message
    assert "value is 0.1 (float32) x what the reference computes here" in message, message
    assert "13421773" not in report.render_text()


MESH2 = jax.make_mesh((2, 4), ("dp", "tp"))


def _aval(shape, spec):
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(MESH2, spec))


PARAM_SPECS = {"w1": P(None, "tp"), "w2": P(None, "tp")}
TREE_AVALS = ({k: _aval((16, 8), s) for k, s in PARAM_SPECS.items()}, _aval((8, 16), P("dp")))


def _tree_reference(params, x):
    return {"loss": (x @ params["w1"]).sum(), "y": x @ params["w2"]}


def _tree_body(params, x):
    return {"loss": jax.lax.psum((x @ params["w1"]).sum(), ("dp", "tp")), "y": x @ params["w2"]}


def _tree_sharded():
    return jax.jit(jax.shard_map(_tree_body, mesh=MESH2, in_specs=(PARAM_SPECS, P("dp", None)),
                                 out_specs={"loss": P(), "y": P("dp", "tp")}))


def test_tree_grounding() -> None:
    rng = np.random.default_rng(1)
    params = {k: rng.standard_normal((16, 8)).astype(np.float32) for k in PARAM_SPECS}
    x = rng.standard_normal((8, 16)).astype(np.float32)
    want = jax.jit(_tree_reference)(params, x)
    placed = jax.device_put((params, x), jax.tree.map(lambda a: a.sharding, TREE_AVALS))
    got = _tree_sharded()(*placed)
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]), rtol=1e-4,
                                   atol=1e-4)


def test_outputs_are_named_by_their_pytree_path_and_partition_spec() -> None:
    report = check(_tree_reference, _tree_sharded(), *TREE_AVALS, verify_rules=False)
    assert report.proven, report.render_text()
    text = report.render_text()
    assert "  result['loss'] (result#0) = replicated on every device  [P()]" in text
    assert ("  result['y'] (result#1) = concat over 'dp' along dim 0, then concat over 'tp' "
            "along dim 1  [P('dp', 'tp')]") in text
    outputs = report.to_json()["outputs"]
    assert [(o["name"], o["partition_spec"]) for o in outputs] == [
        ("result['loss']", "P()"), ("result['y']", "P('dp', 'tp')")]


def test_partition_spec_text_spells_what_jax_users_write() -> None:
    from entangle_mlir.analysis.infer import partition_spec_text

    assert partition_spec_text(((), ("tp",))) == "P(None, 'tp')"
    assert partition_spec_text((("dp", "tp"), ())) == "P(('dp', 'tp'), None)"
    assert partition_spec_text((("dp", "tp"),)) == "P(('dp', 'tp'),)"
    assert partition_spec_text(()) == "P()"
    assert eval(partition_spec_text((("dp", "tp"), ())), {"P": P}) == P(("dp", "tp"), None)


def _tree_body_missing_dp(params, x):
    return {"loss": jax.lax.psum((x @ params["w1"]).sum(), "tp"),   # BUG: not over 'dp'
            "y": x @ params["w2"]}


def test_missing_dp_grounding() -> None:
    rng = np.random.default_rng(2)
    params = {k: rng.standard_normal((16, 8)).astype(np.float32) for k in PARAM_SPECS}
    x = rng.standard_normal((8, 16)).astype(np.float32)
    want = jax.jit(_tree_reference)(params, x)
    sharded = jax.jit(jax.shard_map(_tree_body_missing_dp, mesh=MESH2,
                                    in_specs=(PARAM_SPECS, P("dp", None)),
                                    out_specs={"loss": P(), "y": P("dp", "tp")}, check_vma=False))
    got = sharded(*jax.device_put((params, x), jax.tree.map(lambda a: a.sharding, TREE_AVALS)))
    assert not np.allclose(np.asarray(got["loss"]), np.asarray(want["loss"]), rtol=1e-3)


def test_terms_name_the_arguments_by_their_pytree_path() -> None:
    sharded = jax.jit(jax.shard_map(_tree_body_missing_dp, mesh=MESH2,
                                    in_specs=(PARAM_SPECS, P("dp", None)),
                                    out_specs={"loss": P(), "y": P("dp", "tp")}, check_vma=False))
    report = check(_tree_reference, sharded, *TREE_AVALS, verify_rules=False)
    assert not report.proven
    text = report.render_text()
    assert "reduce_sum(dot_general(x, params['w1']))" in text, text
    assert "%arg" not in text
    assert "dot_general(x, params['w2'])" in report.to_json()["outputs"][1]["term"]


def _rms_reference(x, g):
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + 1e-6) * g


def _rms_body(x, g):
    ms = jax.lax.psum(jnp.mean(x * x, axis=-1, keepdims=True), "tp")   # BUG: pmean
    return x * jax.lax.rsqrt(ms + 1e-6) * g


RMS_AVALS = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(MESH, p))
             for s, p in (((8, 16), P(None, "tp")), ((16,), P("tp")))]


def _rms_sharded():
    return jax.jit(jax.shard_map(_rms_body, mesh=MESH, in_specs=(P(None, "tp"), P("tp")),
                                 out_specs=P(None, "tp")))


def test_rms_grounding() -> None:
    rng = np.random.default_rng(3)
    x, g = (rng.standard_normal(a.shape).astype(np.float32) for a in RMS_AVALS)
    want = np.asarray(jax.jit(_rms_reference)(x, g))
    got = np.asarray(_rms_sharded()(*(jax.device_put(v, a.sharding)
                                      for v, a in zip((x, g), RMS_AVALS))))
    assert not np.allclose(want, got, rtol=1e-3)
    ms = np.mean(x * x, axis=-1, keepdims=True)          # the statistic is 4 x the mean
    np.testing.assert_allclose(got, x / np.sqrt(4 * ms + 1e-6) * g, rtol=1e-4)


def test_scale_bug_under_a_nonlinear_op_is_reported_where_the_scale_goes_wrong() -> None:
    """A psum where an RMSNorm's mean needed a pmean: the statistic is 4 x the reference's
    under rsqrt, so the output's term no longer shows the factor; the diagnostic names the
    psum's line and the factor, not the multiply after the rsqrt."""
    import inspect

    report = check(_rms_reference, _rms_sharded(), *RMS_AVALS, verify_rules=False)
    assert not report.proven
    first = report.diagnostics[0]
    lines, start = inspect.getsourcelines(_rms_body)
    bug_line = start + next(i for i, text in enumerate(lines) if "BUG" in text)
    assert first.loc is not None and first.loc.line == bug_line, report.render_text()
    assert first.message == ("all_reduce sums over 'tp', so the value is 4 x what the "
                             "reference computes here (the reference averages: pmean was "
                             "needed)"), first.message


DP = jax.make_mesh((4,), ("dp",))
VMA_AVALS = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(DP, p))
             for s, p in (((16, 8), P()), ((32, 16), P("dp")))]


def _vma_loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _vma_reference(w, x):
    return jax.grad(_vma_loss)(w, x)


def _vma_body(w, x):
    local = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2) / (32 * 8))(w)
    return jax.lax.psum(local, "dp")   # BUG under check_vma=True: jax already summed it


def _vma_sharded(check_vma: bool):
    return jax.jit(jax.shard_map(_vma_body, mesh=DP, in_specs=(P(), P("dp")), out_specs=P(),
                                 check_vma=check_vma))


def _vma_run(check_vma: bool):
    rng = np.random.default_rng(4)
    w, x = (rng.standard_normal(a.shape).astype(np.float32) for a in VMA_AVALS)
    want = np.asarray(jax.jit(_vma_reference)(w, x))
    got = np.asarray(_vma_sharded(check_vma)(*(jax.device_put(v, a.sharding)
                                               for v, a in zip((w, x), VMA_AVALS))))
    return want, got


def test_vma_grounding() -> None:
    want, got = _vma_run(check_vma=True)
    np.testing.assert_allclose(got, 4 * want, rtol=1e-4, atol=1e-7)   # summed twice
    want, got = _vma_run(check_vma=False)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)       # the psum is needed


def test_jax_implicit_psum_under_check_vma_is_named() -> None:
    report = check(_vma_reference, _vma_sharded(True), *VMA_AVALS, verify_rules=False)
    assert not report.proven
    notes = [n.message for n in report.diagnostics[0].notes]
    assert any("already summed by jax itself" in n and "check_vma=True" in n for n in notes), \
        report.render_text()
    proven = check(_vma_reference, _vma_sharded(False), *VMA_AVALS, verify_rules=False)
    assert proven.proven, proven.render_text()
