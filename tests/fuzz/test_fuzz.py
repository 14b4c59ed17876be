"""Differential fuzzing with fixed seeds: random shard_map programs (correct by construction,
and one mutant of each) are executed on 8 simulated CPU devices and checked by entangle.

Property: proven => the numbers match (no false proof), and entangle never crashes. Measured:
the share of correct-by-construction programs that are proven (completeness).

The end of the file pins false proofs found by fuzzing, minimised to the smallest jax program,
as strict xfails: each is a program entangle proves although its numbers differ from the
reference (the companion test shows the numbers do differ). When the library is fixed the xfail
turns into an XPASS and fails: remove the marker then.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import collections

import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.driver import check_texts
from fuzz.gen import generate_seed, program_mutations
from fuzz.run import false_bug_report, run_program, run_seed
from fuzz.strategies import mutants

if len(jax.devices()) < 8:
    pytest.skip("needs 8 (simulated) devices: XLA_FLAGS was set before jax was imported",
                allow_module_level=True)

SEEDS = range(200)          # 200 correct-by-construction programs ...
MUTANT_EVERY = 2            # ... and a mutant of every other one (300 programs in all)
BAD = ("false_proof", "crash", "timeout", "input_error", "gen_error")


@pytest.fixture(scope="module")
def sample():
    out = []
    for seed in SEEDS:
        out += run_seed(seed, mutants=1 if seed % MUTANT_EVERY == 0 else 0,
                        verify_rules_every=40)
    return out


def _show(outcomes) -> str:
    return "\n\n".join(f"[{o.status}] seed={o.seed} mutation={o.mutation}\n{o.message}\n{o.source}"
                       for o in outcomes[:5])


def test_sample_has_no_false_proofs(sample) -> None:
    bad = [o for o in sample if o.status == "false_proof"]
    assert not bad, _show(bad)


def test_sample_has_no_false_bug_reports(sample) -> None:
    """A program whose numbers match the reference but is not proven claims no bug once
    `entangle check`'s confirmation ran both programs (issue 18 point 3)."""
    stands = [o for o in sample if false_bug_report(o.to_json())]
    assert not stands, _show(stands)


def test_sample_has_no_crashes(sample) -> None:
    bad = [o for o in sample if o.status in BAD and o.status != "false_proof"]
    assert not bad, _show(bad)


def test_sample_is_mostly_valid(sample) -> None:
    """The generator's programs run and mean something (guards the fuzzer itself)."""
    correct = [o for o in sample if o.correct]
    assert len(correct) == len(SEEDS)
    assert sum(o.status == "nonfinite" for o in correct) <= len(correct) // 20
    assert sum(not o.correct for o in sample) >= len(SEEDS) // MUTANT_EVERY * 0.9
    differing = [o for o in sample if not o.correct and o.status in ("caught", "rejected")]
    assert len(differing) >= len(SEEDS) // MUTANT_EVERY // 2


def _completeness(sample) -> tuple[float, collections.Counter]:
    correct = [o for o in sample if o.correct and o.status != "nonfinite"]
    proven = [o for o in correct if o.status in ("proven", "flaky")]
    why = collections.Counter(o.message.split(":")[0][:60] for o in correct
                              if o.status not in ("proven", "flaky"))
    return 100.0 * len(proven) / len(correct), why


def test_sample_completeness(sample) -> None:
    pct, why = _completeness(sample)
    assert pct >= 95.0, f"completeness {pct:.1f}% < 95%; not proven because: {why.most_common()}"


def test_every_program_has_mutations() -> None:
    for seed in range(30):
        assert program_mutations(generate_seed(seed)), seed


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutants())
def test_hypothesis_proven_implies_equal(prog) -> None:
    out = run_program(prog, same_shape=False)
    assert out.status not in BAD, f"[{out.status}] {out.message}\n{out.source}"


# ---------------------------------------------------------------------------------------------
# False proofs found by fuzzing, minimised.
# ---------------------------------------------------------------------------------------------

def _mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


def _pair(ref, body, mesh, shapes, in_specs, out_specs, seed=0):
    """(report with verify_rules=False, max |reference - sharded|)."""
    sharded = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                    check_vma=False))
    avals = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
             for s, p in zip(shapes, in_specs)]
    ref_text = jax.jit(ref).lower(*[jax.ShapeDtypeStruct(s, jnp.float32)
                                    for s in shapes]).as_text()
    report = check_texts(ref_text, sharded.lower(*avals).as_text(), verify_rules=False)
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.asarray(jax.jit(ref)(*args), dtype=np.float64)
    got = np.asarray(sharded(*[jax.device_put(a, v.sharding) for a, v in zip(args, avals)]),
                     dtype=np.float64)
    return report, float(np.max(np.abs(want - got)))


# 1. A float -> int convert applied to a partial sum (before the psum) was treated as linear:
#    sum_i trunc(a_i) was proven equal to trunc(sum_i a_i). Found by fuzzing (the "trunc"
#    construct moved before a psum); fixed in f2b1fd0, kept as a regression test.

def _convert_ref(x):
    return jnp.sum(x, axis=0).astype(jnp.int32).astype(jnp.float32)


def _convert_body(x):
    return lax.psum(jnp.sum(x, axis=0).astype(jnp.int32), "tp").astype(jnp.float32)


def _convert_case():
    return _pair(_convert_ref, _convert_body, _mesh((4,), ("tp",)), [(8, 4)], (P("tp"),), P())


def test_convert_to_int_before_psum_numbers_differ() -> None:
    _, diff = _convert_case()
    assert diff >= 1.0


def test_convert_to_int_before_psum_is_not_proven() -> None:
    report, _ = _convert_case()
    assert not report.proven, report.render_text()


# 2. Device-scalar tables are evaluated with unbounded Python ints, but the device computes in
#    i32 and wraps: (axis_index + 2**30) * 4 is 4 * axis_index on the device, a huge offset for
#    entangle, clamped to the last block on every device, so the slice looks replicated and
#    equal to x[12:16]; device 0 really returns x[0:4].

def _wrap_ref(x):
    return x[12:16]


def _wrap_body(x):
    return lax.dynamic_slice_in_dim(x, (lax.axis_index("tp") + 2**30) * 4, 4)


def _wrap_case():
    return _pair(_wrap_ref, _wrap_body, _mesh((4,), ("tp",)), [(16,)], (P(),), P())


def test_int32_wrapping_offset_numbers_differ() -> None:
    _, diff = _wrap_case()
    assert diff > 0.1


def test_int32_wrapping_offset_is_not_proven() -> None:
    report, _ = _wrap_case()
    assert not report.proven, report.render_text()


# ---------------------------------------------------------------------------------------------
# The per-device path: the generator's reference jitted with the program's shardings,
# partitioned by XLA, executed per device, mutated as text, executed and checked again.
# ---------------------------------------------------------------------------------------------

def test_partitioned_sample_has_no_false_proofs_or_crashes() -> None:
    from fuzz.partitioned import run_partitioned_seed

    outcomes = []
    for seed in range(10):
        outcomes += run_partitioned_seed(seed, mutants=2)
    bad = [o for o in outcomes if o.status in ("false_proof", "crash", "timeout", "gen_error")]
    assert not bad, _show(bad)
    assert sum(not o.correct for o in outcomes) >= 10
    assert sum(o.correct and o.status == "proven" for o in outcomes) >= 2


# 3. check_partitioned on a valid program whose inputs are all replicated: the per-device
#    program has no mhlo.num_partitions and no tiled parameter sharding (the tiled result
#    sharding is only in mhlo.spmd_output_sharding), and entangle gives up with an InputError.

def _replicated_inputs_case(out_spec):
    from entangle_mlir.jax import check_partitioned

    mesh = _mesh((4,), ("i",))
    aval = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P()))
    with jax.set_mesh(mesh):
        return check_partitioned(lambda x: x * 2.0, aval,
                                 out_shardings=NamedSharding(mesh, out_spec), verify_rules=False)


def test_partitioned_replicated_inputs_split_output() -> None:
    assert _replicated_inputs_case(P("i")).proven


def test_partitioned_everything_replicated() -> None:
    assert _replicated_inputs_case(P()).proven


def test_timed_check_stops_although_the_first_alarm_is_swallowed(monkeypatch) -> None:
    """A check's time limit holds even when its first alarm fires inside a callback that
    swallows the exception (jax's GC callback): the alarm re-arms until it is cancelled."""
    import signal
    import time

    from fuzz import run

    def check_swallowing_one_alarm(*args, **kwargs):
        try:
            time.sleep(5)
        except run._Timeout:
            pass
        time.sleep(5)
        raise AssertionError("the check ran past its time limit")

    monkeypatch.setattr(run, "check_texts", check_swallowing_one_alarm)
    start = time.perf_counter()
    report, kind, _ = run.timed_check("", "", False, timeout=1)
    assert (report, kind) == (None, "timeout")
    assert time.perf_counter() - start < 4
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
