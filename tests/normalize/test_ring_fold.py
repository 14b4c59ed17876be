"""Ring attention in a `fori_loop`, folded by its invariant (`normalize/ring_fold.py`, issue 19):
the loop's body is read as one generic step (the K/V blocks rotate by collective_permute, the
running max and the accumulators are an online softmax over the blocks of the steps before),
and the loop becomes the softmax over the blocks' concatenation at its trip count.

The programs are `examples/ring_loop.py`'s. Every label is grounded by execution on simulated
CPU devices (cp 4; the fold does not depend on the trip count: `benchmarks/ring.py --loop`
runs cp 16 / 32 / 64, lit_tests/regressions/ring_attention_loop_32_invariant.mlir cp 32): the
correct loop computes the reference's numbers and is proven, with its invariant in the report;
each nearest wrong loop computes other numbers (or NaN) and is not proven: the blocks rotated
the other way, one trip short, the block index off by one, the accumulators rescaled by
exp(m_new - m_old), the weighted values rescaled by another row's max. The last two (and the
off-by-one, whose first block is masked throughout on a device) are not folded at all: their
step is not an online-softmax step. (`ring_loop.BUGS`' last twin, the denominator never
rescaled, is checked at cp 32 and 64 in benchmarks/RING_RESULTS.md, with every twin.)"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import numpy as np
import pytest

from entangle_mlir.driver import check_texts
from entangle_mlir.mlir.ir import context, parse_module
from entangle_mlir.mlir.program import inline_calls
from entangle_mlir.normalize.finite import Finiteness, judging
from entangle_mlir.normalize.ring_fold import fold_ring_loops
from examples import ring_loop
from tests.jax_runs import run_and_lower

N = 4
SPEC = ring_loop.SPEC

FOLDED = {"": True, "direction": True, "short": True, "index": False, "rescale": False,
          "rows": False}
"""Whether the loop is folded: its step is an online-softmax step over rotating blocks (and
its first block holds an element above -inf in every row)."""


@pytest.fixture(scope="module", params=list(FOLDED))
def program(request):
    want, got, texts = run_and_lower(ring_loop.reference, ring_loop.ring(request.param),
                                     ring_loop.inputs(N), (SPEC,) * 3, SPEC, mesh=(("cp", N),))
    return request.param, want, got, texts


def test_the_correct_loop_computes_the_reference_and_each_twin_does_not(program) -> None:
    bug, want, got, _ = program
    if not bug:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert np.isnan(got).any() or not np.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_only_an_online_softmax_step_over_rotating_blocks_is_folded(program) -> None:
    bug, _, _, (_, sharded) = program
    with context():
        module = parse_module(sharded, "ring.mlir")
        inline_calls(module, "ring.mlir")
        with module.context, judging(Finiteness(assume_no_overflow=True)):
            folded = fold_ring_loops(module)
        assert module.operation.verify()
    assert folded == FOLDED[bug]
    assert ("stablehlo.while" in str(module)) != FOLDED[bug]


def _run_text(text: str) -> np.ndarray:
    """The output of a sharded module's text compiled by XLA for N partitions (Shardy) and run
    on `ring_loop.inputs(N)`, the devices' blocks joined along the sequence."""
    import jax  # lazy: jax_runs imported it already; only this grounding needs its internals
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    devices = backend.devices()[:N]
    options = xla_client.CompileOptions()
    build = options.executable_build_options
    options.num_replicas, options.num_partitions = 1, N
    build.num_replicas, build.num_partitions = 1, N
    build.use_spmd_partitioning = build.use_shardy_partitioner = True
    options.device_assignment = xla_client.DeviceAssignment.create(np.arange(N).reshape(1, N))
    executable = backend.compile_and_load(text, xla_client.DeviceList(tuple(devices)), options)
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("cp",)), SPEC)
    arrays = [jax.device_put(a, sharding) for a in ring_loop.inputs(N)]
    (out,) = executable.execute_sharded(arrays).disassemble_into_single_device_arrays()
    return np.concatenate([np.asarray(x) for x in out], axis=1)


@pytest.mark.parametrize("program", ["", "direction"], indirect=True)
def test_the_closed_form_computes_the_loops_numbers(program) -> None:
    """Executed by XLA, the folded module gives the loop's outputs (the fold is exact; the
    wrong twins it folds keep their own wrong numbers): the correct loop and one folded twin."""
    _, _, got, (_, sharded) = program
    with context():
        module = parse_module(sharded, "ring.mlir")
        inline_calls(module, "ring.mlir")
        with module.context, judging(Finiteness(assume_no_overflow=True)):
            assert fold_ring_loops(module) == 1
        folded = str(module)
    np.testing.assert_allclose(_run_text(folded), got, rtol=1e-5, atol=1e-6)


def test_the_correct_loop_is_proven_with_its_invariant_and_no_twin_is(program) -> None:
    bug, _, _, (ref, sharded) = program
    report = check_texts(ref, sharded, verify_rules=not bug, assume_no_overflow=True)
    assert report.proven == (not bug), report.diagnostics
    if not bug:
        (note,) = [n for n in report.notes if "folded by its invariant" in n]
        assert f"over {N} trips" in note
        assert "#8, #9: rotates: collective_permute each step" in note
        assert "#6: the running max over the blocks of steps < i" in note


@pytest.mark.parametrize("program", [""], indirect=True)
def test_without_the_no_overflow_assumption_the_loop_is_left_to_unrolling(program) -> None:
    """q . k may overflow to -inf throughout a row of the first block: strict, the fold is
    refused as the unrolled fold refuses it (which says so: `unroll.py` runs next at cp 4)."""
    _, _, _, (_, sharded) = program
    with context():
        module = parse_module(sharded, "ring.mlir")
        inline_calls(module, "ring.mlir")
        finiteness = Finiteness(assume_no_overflow=False)
        with module.context, judging(finiteness):
            assert fold_ring_loops(module) == 0
        assert module.operation.verify()
    assert "stablehlo.while" in str(module)
    assert not finiteness.refusals and not finiteness.used
