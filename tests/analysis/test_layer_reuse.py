"""Reusing a repeated layer's work never hides a changed layer.

The instance checker reuses a planned check for every instance with the same structure (see
`Plan` in analysis/instance/cache.py) and the walk of a 32-layer model is mostly cache hits.
These tests show what the cache must not cost: a bug in layer 17 of 32 is still found and
named (grounded by executing both programs on simulated CPU devices), a rule instance changed
in layer 17 alone is re-checked and refuted, and an instance changed in one term is never a
cache hit.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.analysis.instance.checker import DEFAULT_CHECKER, InstanceChecker, check_instance
from entangle_mlir.core.relations import Rel
from entangle_mlir.core.terms import make_add, make_arg, scale
from entangle_mlir.driver import check_texts
from entangle_mlir.jax import lower_pair
from entangle_mlir.mlir.opinfo import OpInfo, TensorType
from examples import models as m

LAYERS, BUG_LAYER, TP = 32, 17, 2
B, S, D, F = 1, 4, 16, 32
SHAPES = [(D,), (D,), (D, D), (D, D), (D, D), (D, D), (D,), (D,), (D,), (D, F), (F,), (F, D),
          (D,)]
SPECS = [P(), P(), P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp", None), P(), P(), P(),
         P(None, "tp"), P("tp"), P("tp", None), P()]


def _layer(x, p, reduce, bias_before_psum: bool = False):
    ln1_g, ln1_b, wq, wk, wv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2 = p
    x = x + reduce(m.causal_attention(m.layer_norm(x, ln1_g, ln1_b), wq, wk, wv) @ wo) + bo
    h = jax.nn.gelu(m.layer_norm(x, ln2_g, ln2_b) @ w1 + b1)
    if bias_before_psum:
        return x + reduce(h @ w2 + b2)  # the bug: b2 is added once per device
    return x + reduce(h @ w2) + b2


def _programs(bug_layer: int | None, stale_weights: bool = False, stale_input: bool = False):
    """The reference and sharded stacks; in layer `bug_layer` the sharded one adds a bias
    before the psum or, with `stale_weights`, reuses the previous layer's parameters, or with
    `stale_input` reads the previous layer's input instead of its output (the same ops on
    other inputs: whole-layer reuse must not take them for layer 17)."""
    mesh = jax.make_mesh((TP,), ("tp",), axis_types=(AxisType.Auto,))
    count = len(SHAPES)

    def layer_params(params, i):
        if stale_weights and i == bug_layer:
            i -= 1
        return params[i * count:(i + 1) * count]

    def ref(x, *params):
        for i in range(LAYERS):
            with jax.named_scope(f"layer{i}"):
                x = _layer(x, params[i * count:(i + 1) * count], lambda v: v)
        return x

    def body(x, *params):
        previous = x
        for i in range(LAYERS):
            with jax.named_scope(f"layer{i}"):
                source = previous if stale_input and i == bug_layer else x
                previous = x
                x = _layer(source, layer_params(params, i), lambda v: lax.psum(v, "tp"),
                           bias_before_psum=i == bug_layer and not (stale_weights or
                                                                    stale_input))
        return x

    specs = (P(),) + tuple(SPECS) * LAYERS
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P()),
                      keep_unused=True)
    shapes = [(B, S, D)] + SHAPES * LAYERS
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
             for s, spec in zip(shapes, specs)]
    return ref, sharded, avals, _execute(mesh, bug_layer, stale_weights, stale_input)


@functools.cache
def _layer_programs(mesh):
    """The jitted reference layer and the sharded layer by whether it has the bug: one pair a
    mesh, so that the four groundings of a worker compile each once."""
    ref_layer = jax.jit(lambda x, *p: _layer(x, p, lambda v: v))

    def sharded_layer(bug: bool):
        body = lambda x, *p: _layer(x, p, lambda v: lax.psum(v, "tp"), bias_before_psum=bug)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(),) + tuple(SPECS),
                                     out_specs=P()))

    return ref_layer, {False: sharded_layer(False), True: sharded_layer(True)}


def _execute(mesh, bug_layer: int | None, stale_weights: bool = False,
             stale_input: bool = False) -> float:
    """Max |reference - sharded| on random inputs, both run on simulated CPU devices. Each
    layer is run as its own jitted program (the unrolled 32-layer programs compute the same
    thing but take XLA about a minute to compile here)."""
    ref_layer, sharded_layers = _layer_programs(mesh)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, S, D), dtype=np.float32)
    ref_x, sharded_x = x, x
    placed, previous = None, sharded_x
    for i in range(LAYERS):
        params = [rng.standard_normal(s, dtype=np.float32) / (np.sqrt(s[0]) if len(s) == 2
                                                               else 1) for s in SHAPES]
        if not (stale_weights and i == bug_layer):
            placed = [jax.device_put(a, NamedSharding(mesh, spec))
                      for a, spec in zip(params, SPECS)]
        ref_x = ref_layer(ref_x, *params)
        source = previous if stale_input and i == bug_layer else sharded_x
        previous = sharded_x
        buggy = i == bug_layer and not (stale_weights or stale_input)
        sharded_x = sharded_layers[buggy](source, *placed)
    return float(np.max(np.abs(np.asarray(ref_x) - np.asarray(sharded_x))))


@pytest.fixture(scope="module")
def correct():
    ref, sharded, avals, diff = _programs(None)
    return lower_pair(ref, sharded, *avals), diff


@pytest.fixture(scope="module")
def buggy():
    ref, sharded, avals, diff = _programs(BUG_LAYER)
    return lower_pair(ref, sharded, *avals), diff


def _layer_of(op_name: str) -> str:
    parts = [p for p in op_name.split("/") if p.startswith("layer")]
    return parts[0] if parts else ""


def test_correct_32_layers_proven_with_reuse(correct) -> None:
    """Whole layers are summarized in both programs (analysis/layer_reuse.py), and with reuse
    switched off the instance cache makes the 2nd..32nd layers' checks cache hits."""
    (ref_text, sharded_text), diff = correct
    assert diff < 1e-3  # grounded: the sharded program computes the reference
    report = check_texts(ref_text, sharded_text)
    assert report.proven, report.render_text()
    reused = report.stats["layers reused"]
    ref_regions, sharded_regions = reused.split()[0], reused.split()[3]
    assert int(ref_regions) == int(sharded_regions) >= LAYERS - 2, reused
    assert report.stats["ops"] < 4 * 220  # about 3 of the 32 layers walked op by op
    DEFAULT_CHECKER.clear()
    walk, report = _walk_and_report(ref_text, sharded_text)
    assert report.proven
    from entangle_mlir.analysis.verify import verify_walk

    verify_walk(walk, report)
    assert report.proven
    hits = sum(s.cache_hits for s in DEFAULT_CHECKER.stats.values())
    checks = sum(s.checks for s in DEFAULT_CHECKER.stats.values())
    assert hits > checks * 0.9


@pytest.mark.parametrize("stale", ["weights", "input"])
def test_layer_17_reading_layer_16s_inputs_is_not_taken_for_layer_17(stale: str) -> None:
    """The same ops as every other layer, on the previous layer's parameters or input:
    whole-layer reuse must not give it layer 17's summary. Found and named in layer 17
    (grounded)."""
    ref, sharded, avals, diff = _programs(BUG_LAYER, stale_weights=stale == "weights",
                                          stale_input=stale == "input")
    assert diff > 1e-2  # grounded: the numbers differ
    report = check_texts(*lower_pair(ref, sharded, *avals))
    assert not report.proven
    assert "layers reused" not in report.stats  # the verdict is the op-by-op walk's
    errors = [d for d in report.diagnostics if d.severity == "error"]
    layers = {_layer_of(d.loc.op_name) for d in errors if d.loc}
    assert layers == {f"layer{BUG_LAYER}"}, report.render_text()


def test_bug_in_layer_17_of_32_found_and_named(buggy) -> None:
    (ref_text, sharded_text), diff = buggy
    assert diff > 1e-2  # grounded: the bug changes the numbers
    DEFAULT_CHECKER.clear()
    report = check_texts(ref_text, sharded_text)
    assert not report.proven
    errors = [d for d in report.diagnostics if d.severity == "error"]
    assert errors, report.render_text()
    layers = {_layer_of(d.loc.op_name) for d in errors if d.loc}
    assert layers == {f"layer{BUG_LAYER}"}, report.render_text()


def test_rule_instance_changed_in_layer_17_is_rechecked(correct) -> None:
    """A wrong relation on one op of layer 17 (as a rule bug there would give) is refuted and
    located, though layers 0..16 made the same op's check a cache hit."""
    from entangle_mlir.analysis.verify import verify_walk

    (ref_text, sharded_text), _ = correct
    DEFAULT_CHECKER.clear()
    walk, report = _walk_and_report(ref_text, sharded_text)
    assert report.proven
    targets = [r for r in walk.records if r.info.name == "stablehlo.broadcast_in_dim"
               and r.loc is not None and _layer_of(r.loc.op_name) == f"layer{BUG_LAYER}"
               and isinstance(r.outputs[0], Rel) and r.outputs[0].term.args
               and r.outputs[0].term.args[0].op == "arg"]
    assert targets
    victim = targets[0]
    victim.outputs = [replace(victim.outputs[0], term=scale(victim.outputs[0].term, 2))]
    verify_walk(walk, report)
    refuted = [d for d in report.diagnostics if d.category == "refuted"]
    assert [_layer_of(d.loc.op_name) for d in refuted] == [f"layer{BUG_LAYER}"]
    assert report.stats["rule_instances"]["refuted"] == 1
    assert not report.proven
    hits = DEFAULT_CHECKER.stats["stablehlo.broadcast_in_dim"].cache_hits
    assert hits > BUG_LAYER  # earlier layers' instances of the same op were reused


def _walk_and_report(ref_text: str, sharded_text: str):
    """The sharded walk and the report of `entangle check` without its rule-instance checks."""
    from entangle_mlir.mlir.ir import context, parse_module
    from entangle_mlir.mlir.program import from_two_modules
    from entangle_mlir.passes import PASSES
    from entangle_mlir.passes.pipeline import PassState, parse_pipeline, run_pipeline

    program = from_two_modules(parse_module(ref_text), parse_module(sharded_text),
                               "reference.mlir", "sharded.mlir")
    state = PassState(program.sharded_module, program.sharded_file, program=program)
    pipeline = ("entangle-normalize,entangle-import-shardings,"
                "entangle-infer-relations{annotate=false},entangle-check-refinement")
    with context():
        run_pipeline(parse_pipeline(pipeline, PASSES), state)
    return state.walks["sharded"], state.report


def test_instance_with_a_changed_term_is_not_a_cache_hit() -> None:
    """Same op, attributes, layouts and sharing pattern: the plan is reused only after the
    new instance's output is shown to be the abstract output of its own inputs."""
    info = OpInfo("stablehlo.add", {}, [TensorType((2, 2), "f32")] * 2,
                  [TensorType((2, 2), "f32")])
    checker = InstanceChecker()
    tiling = ((), ())

    def instance(first: int, wrong: bool):
        x, y = make_arg(first, (2, 2), "f32"), make_arg(first + 1, (2, 2), "f32")
        out = make_add(x, x) if wrong else make_add(x, y)
        return [Rel(x, tiling), Rel(y, tiling)], [Rel(out, tiling)]

    ins, outs = instance(0, wrong=False)
    assert check_instance(info, ins, outs, None, checker=checker).status == "proved"
    ins, outs = instance(10, wrong=False)
    second = check_instance(info, ins, outs, None, checker=checker)
    assert second.status == "proved" and second.cached
    ins, outs = instance(20, wrong=True)
    third = check_instance(info, ins, outs, None, checker=checker)
    assert third.status == "refuted" and not third.cached


def _tiled_add(mesh, in_tiling, out_tiling, shape=(4, 4)):
    """An add of two arguments laid out `in_tiling`, claimed to give `out_tiling`."""
    x, y = make_arg(900_001, shape, "f32"), make_arg(900_002, shape, "f32")
    local = tuple(s // mesh.group_size(a) for s, a in zip(shape, in_tiling))
    out_local = tuple(s // mesh.group_size(a) for s, a in zip(shape, out_tiling))
    info = OpInfo("stablehlo.add", {}, [TensorType(local, "f32")] * 2,
                  [TensorType(out_local, "f32")])
    return info, [Rel(x, in_tiling), Rel(y, in_tiling)], [Rel(make_add(x, y), out_tiling)]


def test_devices_with_the_same_claim_are_checked_once(monkeypatch) -> None:
    """Replicated values: 8 devices, one claim. Split values: one claim per block."""
    from entangle_mlir.analysis.instance import devices
    from entangle_mlir.analysis.instance.checker import default_context
    from entangle_mlir.analysis.instance.solve import run_check
    from entangle_mlir.core.mesh import Mesh
    from entangle_mlir.semantics.collectives import run_op

    mesh = Mesh((("dp", 2), ("tp", 4)))
    seen: list[int] = []
    real_run_op = run_op

    def counting(info, operands, mesh):
        seen.append(len(operands))
        return real_run_op(info, operands, mesh)

    monkeypatch.setattr(devices, "run_op", counting)
    symmetric = devices._symmetric_axes
    for in_tiling, count in ((((), ()), 1), ((("tp",), ()), 4), ((("dp",), ("tp",)), 8)):
        # deduplication by blocks alone (the symmetry of the axes switched off) ...
        monkeypatch.setattr(devices, "_symmetric_axes", lambda *args: ())
        seen.clear()
        info, ins, outs = _tiled_add(mesh, in_tiling, in_tiling)
        result = run_check(info, ins, outs, mesh, default_context(ins, outs, mesh))
        assert result.status == "proved"
        assert seen == [count]
        # ... and with it: an add is symmetric in both axes, one device is checked
        monkeypatch.setattr(devices, "_symmetric_axes", symmetric)
        seen.clear()
        result = run_check(info, ins, outs, mesh, default_context(ins, outs, mesh))
        assert result.status == "proved"
        assert seen == [1]


def test_a_claim_wrong_on_some_devices_only_is_refuted() -> None:
    """Inputs split over 'tp', the sum claimed split over 'dp' along the same dim: devices
    (dp i, tp j) with i == j hold the claimed block, the others do not. Deduplication keeps
    every distinct combination of blocks, so the wrong devices are checked and it is refuted."""
    from entangle_mlir.analysis.instance.checker import default_context
    from entangle_mlir.analysis.instance.solve import run_check
    from entangle_mlir.core.mesh import Mesh

    mesh = Mesh((("dp", 2), ("tp", 2)))
    info, ins, outs = _tiled_add(mesh, (("tp",), ()), (("dp",), ()), shape=(4, 2))
    result = run_check(info, ins, outs, mesh, default_context(ins, outs, mesh))
    assert result.status == "refuted"
