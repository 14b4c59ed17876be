"""Fuzzing the per-device path: the generator's reference function jitted with the program's
in/out shardings, partitioned by XLA's SPMD partitioner, checked by entangle, EXECUTED per
device (`entangle_mlir.jax.run_per_device`), then mutated at the StableHLO text level
(`mlir_mutate.mutants`) and executed and checked again.

    from fuzz.partitioned import run_partitioned_seed
    outcomes = run_partitioned_seed(7, mutants=3)

Outcomes use `fuzz.run.Outcome` and its statuses; `correct` is True for XLA's own
partitioning (expected to be proven: completeness of the per-device path). Imports jax.
"""

from __future__ import annotations

import random
import time

import jax
import numpy as np
from jax.sharding import NamedSharding

from fuzz.gen import GenOptions, RandomChooser, generate
from fuzz.mlir_mutate import mutants as text_mutants
from fuzz.run import (
    CHECK_TIMEOUT,
    Outcome,
    build,
    compare,
    confirm_claims,
    inputs,
    jax_mesh,
    pspec,
    sharded_avals,
    timed_check,
)


def _per_device_match(module_text: str, args, ref_out) -> tuple[bool | None, float]:
    from entangle_mlir.jax import expected_per_device, run_per_device

    got = run_per_device(module_text, *args)
    want = expected_per_device(module_text, [ref_out])
    if not np.all(np.isfinite(ref_out)):
        return None, 0.0
    worst, ok = 0.0, True
    for g_dev, w_dev in zip(got, want):
        for g, w in zip(g_dev, w_dev):
            m, err = compare(np.asarray(w), np.asarray(g))
            ok = ok and m
            worst = max(worst, err)
    return ok, worst


def _classify(out: Outcome, report, kind, msg, match, again=None,
              texts: tuple[str, str] | None = None) -> None:
    """The outcome's status; `texts` (reference, per-device program) let a program whose
    numbers match have its bug claims confirmed (`confirm_claims`)."""
    if report is not None and report.diagnostics:
        out.message = report.diagnostics[0].message
    elif kind:
        out.message = msg
    proven = report is not None and report.proven
    if kind in ("crash", "timeout"):
        out.status = kind
    elif match is None:
        out.status = "nonfinite"
    elif kind == "input_error":
        out.status = "rejected" if not match else "input_error"
    elif proven and not match:
        out.status = "flaky" if again is not None and again() else "false_proof"
    elif proven:
        out.status = "proven"
    elif match:
        out.status = "incomplete"
        if texts is not None:
            out.claim = confirm_claims(report, *texts)
    else:
        out.status = "caught"


def run_partitioned_seed(seed: int, mutants: int = 2, opts: GenOptions | None = None,
                         timeout: int = CHECK_TIMEOUT) -> list[Outcome]:
    from entangle_mlir.jax import lower_partitioned
    from entangle_mlir.mlir.ir import context, parse_module

    prog = generate(RandomChooser(seed), opts, seed=seed)
    start = time.perf_counter()
    base = Outcome(seed, True, None, "", prog.mesh.describe(), constructs=prog.constructs,
                   source=prog.source())
    try:
        ref_fn, _ = build(prog)
        mesh = jax_mesh(prog.mesh)
        avals = sharded_avals(prog)
        with jax.set_mesh(mesh):
            ref_text, shd = lower_partitioned(
                ref_fn, *avals, out_shardings=NamedSharding(mesh, pspec(prog.out_spec)))
        module = parse_module(shd)
        with context():
            text = module.operation.get_asm(enable_debug_info=True)
        args = inputs(prog, 0)
        ref_out = np.asarray(jax.jit(ref_fn)(*args))
    except Exception as err:  # noqa: BLE001 - jax / XLA, not entangle
        base.status = "gen_error"
        base.message = f"{type(err).__name__}: {str(err)[:500]}"
        return [base]
    try:
        match, base.error = _per_device_match(text, args, ref_out)
    except Exception as err:  # noqa: BLE001 - the per-device executor cannot run it
        match, executor_error = None, f"{type(err).__name__}: {str(err)[:300]}"
    else:
        executor_error = ""
    t0 = time.perf_counter()
    report, kind, msg = timed_check(ref_text, text, verify_rules=False, timeout=timeout)
    base.check_seconds = time.perf_counter() - t0
    _classify(base, report, kind, msg, match, texts=(ref_text, text))
    if executor_error:
        # numbers unknown: XLA's own partitioning is correct, so judge the verdict alone
        base.status = {"crash": "crash", "timeout": "timeout", "input_error": "input_error"}.get(
            kind or "", "proven" if report is not None and report.proven else "incomplete")
        base.message = (base.message or "") + f" [not executed: {executor_error}]"
        base.seconds = time.perf_counter() - start
        return [base]
    if match is False and base.status not in ("false_proof",):
        base.message = f"[per-device numbers differ from XLA's own program] {base.message}"
    base.seconds = time.perf_counter() - start
    results = [base]
    if not mutants:
        return results
    rng = random.Random(seed * 104729 + 3)
    pool = list(text_mutants(text))
    rng.shuffle(pool)
    # collective / offset mutations first: they are what a partitioner gets wrong
    pool.sort(key=lambda m: not any(w in m[0] for w in (
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
        "partition_id", "dynamic_slice", "constant")))
    made = 0
    for desc, mtext in pool:
        if made >= mutants:
            break
        out = Outcome(seed, False, f"per-device: {desc}", "", prog.mesh.describe(),
                      constructs=prog.constructs, source=prog.source())
        t = time.perf_counter()
        try:
            m_match, out.error = _per_device_match(mtext, args, ref_out)
        except Exception:  # noqa: BLE001, S112 - the mutant does not verify / compile
            continue
        made += 1
        report, kind, msg = timed_check(ref_text, mtext, verify_rules=False, timeout=timeout)

        def again(mtext=mtext):
            oks = []
            for k in (1, 2):
                a = inputs(prog, k)
                r = np.asarray(jax.jit(ref_fn)(*a))
                oks.append(bool(_per_device_match(mtext, a, r)[0]))
            return all(oks)
        _classify(out, report, kind, msg, m_match, again, texts=(ref_text, mtext))
        if out.status in ("false_proof", "crash", "timeout", "flaky"):
            out.source = prog.source() + "\n# --- mutated per-device program:\n" + mtext
        out.seconds = time.perf_counter() - t
        results.append(out)
    return results
