"""The online-softmax rewrite of entangle-normalize (`idioms._online_max`, `_online_sum`):
a running max and accumulators rescaled by exp(m_old - m_new) as blocks of scores arrive
(flash attention, ring attention) become the max, the exp-sum and the weighted sum over the
blocks' concatenation. Grounded by execution: XLA runs every program before and after the
rewrite to the same numbers (the rewrite is exact), the correct blockwise softmax computes the
plain softmax, and near misses (an inverted rescale, an accumulator left unrescaled) compute
other numbers and are only partly rewritten (never into the softmax). The scores are
products of unbounded inputs, which may overflow: the folds run under `--assume-no-overflow`
(the strict default refuses them, tests/normalize/test_exact_ring_overflow.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entangle_mlir.evidence import FAST_COMPILE, execute_replicas
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize.rewrites import rewrite_idioms
from entangle_mlir.normalize.unroll import unroll_ring_loops
from examples.real.catalog import by_name, lower_pair, random_inputs
from tests.judging import assert_judged, assuming_no_overflow
from tests.shared import REPO

BLOCKS = 4


def _online(q, k, v, rescale: str = "right"):
    """Softmax attention of q over k/v, keys taken BLOCKS at a time (causal within rows)."""
    n, width = q.shape[0], k.shape[0] // BLOCKS
    m = jnp.full((n,), -jnp.inf)
    denom = jnp.zeros((n,))
    o = jnp.zeros((n, v.shape[1]))
    for i in range(BLOCKS):
        s = q @ k[i * width:(i + 1) * width].T
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new) if rescale != "inverted" else jnp.exp(m_new - m)
        denom = denom * corr + jnp.sum(p, axis=-1)
        block = p @ v[i * width:(i + 1) * width]
        o = o * corr[:, None] + block if rescale != "stale" else o + block
        m = m_new
    return o / denom[:, None]


def _reference(q, k, v):
    return jax.nn.softmax(q @ k.T, axis=-1) @ v


CASES = {
    "online": (lambda q, k, v: _online(q, k, v), True),
    "inverted_rescale": (lambda q, k, v: _online(q, k, v, "inverted"), False),
    "stale_accumulator": (lambda q, k, v: _online(q, k, v, "stale"), False),
}
WHOLE = "(tensor<6x16xf32>, tensor<16x3xf32>) -> tensor<6x3xf32>"
"""The probabilities over all 16 keys against all 16 values: one softmax's weighted sum."""


def _args() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(np.float32) for shape in ((6, 4), (16, 4), (16, 3))]


@pytest.mark.parametrize("name", list(CASES))
def test_online_softmax_rewrite_is_exact(name: str) -> None:
    fn, correct = CASES[name]
    args = _args()
    text = jax.jit(fn).lower(*args).as_text()
    with context(), assuming_no_overflow():
        module = parse_module(text)
        assert rewrite_idioms(module) > 0
        assert module.operation.verify()
        rewritten = str(module)
    before = execute_replicas(text, [args], fast=True)[0][0]
    after = execute_replicas(rewritten, [args], fast=True)[0][0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    softmax = np.asarray(_reference(*args))
    assert np.allclose(before, softmax, atol=1e-4) == correct
    assert (WHOLE in rewritten) == correct


def test_ring_attention_rewrite_is_exact_on_the_real_program() -> None:
    """llama3_stack_ring_cp4's sharded program (2 layers, 4 ring steps): every layer's
    accumulations fold into one softmax over the 4 K blocks concatenated in arrival order, and
    the partitioned program computes the same numbers after the rewrite."""

    ex = by_name("llama3_stack_ring_cp4")
    _, text = lower_pair(ex)
    with context():
        module = parse_module(text)
        inline_calls(module, "ring.mlir")
        with module.context, assuming_no_overflow():
            assert rewrite_idioms(module) > 0
        assert module.operation.verify()
        rewritten = str(module)
    blocks = "(tensor<8x4x8x4xf32>, tensor<8x4x8x4xf32>, tensor<8x4x8x4xf32>, tensor<8x4x8x4xf32>)"
    assert all(blocks in line for line in rewritten.splitlines()
               if "entangle.blocks" in line and "xf32>" in line)
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_ring_loop_is_unrolled_exactly() -> None:
    """llama3_stack_ringloop_cp4 (`lax.fori_loop` over the 4 ring steps, one loop per layer):
    both loops are unrolled, and the partitioned program computes the same numbers."""
    ex = by_name("llama3_stack_ringloop_cp4")
    _, text = lower_pair(ex)
    with context():
        module = parse_module(text)
        inline_calls(module, "ringloop.mlir")
        with module.context:
            assert unroll_ring_loops(module) == 2
        assert module.operation.verify()
        rewritten = str(module)
    assert "stablehlo.while" in text and "stablehlo.while" not in rewritten
    for b, a in zip(_run_partitioned(ex, text), _run_partitioned(ex, rewritten), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _run_partitioned(ex, program: str) -> list[np.ndarray]:
    """Every device's outputs of a shard_map program over cp=4, compiled by XLA (Shardy),
    without XLA's backend optimisations (`FAST_COMPILE`). Each program runs once a worker:
    many tests compare their mutant with the same unmutated program (read-only arrays)."""
    key = (ex.name, repr(ex.args), program)
    if key not in _PARTITIONED_RUNS:
        if len(_PARTITIONED_RUNS) >= 32:
            del _PARTITIONED_RUNS[next(iter(_PARTITIONED_RUNS))]
        _PARTITIONED_RUNS[key] = _partitioned_outputs(ex, program)
    return list(_PARTITIONED_RUNS[key])


_PARTITIONED_RUNS: dict[tuple[str, str, str], tuple[np.ndarray, ...]] = {}
"""(example name, its arguments, program text) -> `_partitioned_outputs`, the 32 latest."""


def _partitioned_outputs(ex, program: str) -> tuple[np.ndarray, ...]:
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    devices = backend.devices()[:4]
    mesh = jax.sharding.Mesh(np.array(devices), ("cp",))
    options = xla_client.CompileOptions()
    build = options.executable_build_options
    options.num_replicas, options.num_partitions = 1, 4
    build.num_replicas, build.num_partitions = 1, 4
    build.use_spmd_partitioning = build.use_shardy_partitioner = True
    options.device_assignment = xla_client.DeviceAssignment.create(np.arange(4).reshape(1, 4))
    options.env_option_overrides = list(FAST_COMPILE.items())
    executable = backend.compile_and_load(program, xla_client.DeviceList(tuple(devices)),
                                          options)
    arrays = [jax.device_put(np.asarray(a), jax.sharding.NamedSharding(mesh, d.spec))
              for a, d in zip(random_inputs(ex, 0), ex.args, strict=True)]
    outs = executable.execute_sharded(arrays).disassemble_into_single_device_arrays()
    results = tuple(np.array(x) for out in outs for x in out)
    for r in results:
        r.flags.writeable = False
    return results


def test_ring_attention_is_proven_and_its_wrong_direction_flagged_at_the_permute() -> None:
    from entangle_mlir.driver import check_texts
    from examples.real.catalog import custom, run_pair
    from examples.real.repro import reproducers, ring_attention_backwards

    (repro,) = [r.example for r in reproducers() if r.cause == "ring_attention"]
    ref, shd = run_pair(repro)
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(ref, shd, strict=True))
    report = check_texts(*lower_pair(repro), verify_rules=True, assume_no_overflow=True)
    assert report.proven, report.render_text()
    assert " 0 refuted, 0 inconclusive" in report.mode, report.mode
    bug = custom("ring_backwards", repro.mesh_axes, repro.reference, ring_attention_backwards,
                 repro.args, repro.out_specs, "ring turning the wrong way")
    ref, shd = run_pair(bug)
    assert not all(np.allclose(a, b, atol=1e-3) for a, b in zip(ref, shd, strict=True))
    report = check_texts(*lower_pair(bug), verify_rules=False, assume_no_overflow=True)
    assert not report.proven
    first = report.diagnostics[0]
    assert "blocks assembled in different orders" in first.message, first.message
    assert "collective_permute" in first.message
    source = (REPO / "examples/real/repro.py").read_text().splitlines()
    line = next(n for n, text in enumerate(source, 1) if "(j + hop) % n" in text)
    assert f"repro.py:{line}:" in str(first.loc), first.loc


def test_blockwise_attention_per_device_is_proven_and_its_near_misses_are_not() -> None:
    """Flash-style attention on every device (queries split over tp, keys and values
    replicated and taken 4 blocks at a time): the online softmax folds into the softmax over
    the blocks' concatenation, which is the keys themselves. The inverted rescale and the
    unrescaled accumulator compute other numbers and are not proven."""
    from jax.sharding import PartitionSpec as P

    from entangle_mlir.driver import check_texts
    from examples.real.catalog import custom, run_pair
    from examples.real.programs import ArgDef

    args = (ArgDef("q", (8, 4), "float32", "data", P("tp", None)),
            ArgDef("k", (16, 4), "float32", "data", P()),
            ArgDef("v", (16, 3), "float32", "data", P()))
    for name, (fn, correct) in CASES.items():
        ex = custom(f"blockwise_{name}", (("tp", 4),), _reference, fn, args, P("tp", None),
                    name)
        ref, shd = run_pair(ex)
        assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(ref, shd, strict=True)) \
            == correct, name
        report = check_texts(*lower_pair(ex), verify_rules=correct, assume_no_overflow=True)
        assert report.proven == correct, report.render_text()
        if correct:
            assert " 0 refuted, 0 inconclusive" in report.mode, report.mode


def test_ring_attention_training_is_proven() -> None:
    """The gradients through ring attention compute the reference's (run on devices), with or
    without the running max's gradient, and both are proven, every rule instance by Z3. The
    backward's rewrites (`online_backward.py`) fold the query gradient and turn the key and
    value gradients into slices of one contraction sent back around the reverse ring
    (`rules/kinds/returning.py`). With the max differentiated, its cotangent is first shown zero
    (`max_cotangent.py`), which removes the argmax paths and leaves the backward of the
    stopped max."""
    from examples.real.repro import reproducers

    repros = {r.example.name: r.example for r in reproducers()
              if r.example.name.startswith("repro_ring_attention_grad")}
    assert len(repros) == 2
    for repro in repros.values():
        assert_judged(repro, True, atol=1e-5, assume_no_overflow=True)


def test_ring_step_offsets_are_told_from_own_and_wrong_blocks() -> None:
    """`ring_step_hops` names the block `hops` devices back only when every device's offset is
    that block's start: the device's own block (hops 0) and an offset table with one wrong
    entry are not ring steps."""
    from fractions import Fraction

    from entangle_mlir.core.mesh import Mesh
    from entangle_mlir.core.relations import Rel, Shifted
    from entangle_mlir.core.terms import make_iota
    from entangle_mlir.rules.base import RuleContext
    from entangle_mlir.rules.kinds.shifted import ring_step_hops

    mesh = Mesh((("cp", 4),))
    ctx = RuleContext(mesh=mesh, manual_axes=mesh.names)
    iota = Rel(make_iota((4,), 0, "i32"), ((),))

    def hops(offsets):
        return ring_step_hops(Shifted(iota, tuple(Fraction(o) for o in offsets)), ctx)

    assert hops([12, 0, 4, 8]) == (0, ("cp",), 1)
    assert hops([4, 8, 12, 0]) == (0, ("cp",), 3)
    assert hops([0, 4, 8, 12]) is None
    assert hops([12, 0, 4, 4]) is None
