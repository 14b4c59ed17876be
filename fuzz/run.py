"""Lower, execute and check fuzz programs; classify the outcome.

    from fuzz.run import run_seed
    outcomes = run_seed(7)            # the program of seed 7 and its mutants

Classification of one program (reference vs sharded, numbers compared at rtol/atol 1e-4, the
atol scaled by the reference's largest magnitude):

* ``proven``: proven and the numbers match (good);
* ``false_proof``: proven although the numbers differ (the worst bug);
* ``caught``: not proven and the numbers differ;
* ``incomplete``: not proven although the numbers match (fine for an equivalent mutant; counts
  against completeness for a correct-by-construction program);
* ``rejected``: entangle's InputError (exit 2) on a mutant whose numbers differ (counts as caught);
* ``input_error``: InputError on a program jax lowered fine and whose numbers match;
* ``crash``: any other exception from entangle (with its traceback);
* ``timeout``: the check did not finish in time;
* ``invalid``: jax cannot build the (mutated) program: not counted;
* ``nonfinite``: the reference produced inf/nan: numbers not compared, verdict still recorded;
* ``flaky``: proven, numbers differ on the first input but match on two others (a float tie at a
  comparison or max): listed for inspection, never silently dropped.

Importing this module imports jax with 8 simulated CPU devices.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import functools
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from entangle_mlir.confirm import confirm_texts, is_claim, is_confirmed
from entangle_mlir.core.diagnostics import InputError
from entangle_mlir.driver import check_texts
from entangle_mlir.evidence import FAST_COMPILE
from fuzz.gen import GenOptions, MeshSpec, Program, RandomChooser, generate, mutate

RTOL = 1e-4
ATOL = 1e-4
CHECK_TIMEOUT = 60


@functools.cache
def jax_mesh(mesh: MeshSpec):
    return jax.make_mesh(mesh.sizes, mesh.names, axis_types=(AxisType.Auto,) * len(mesh.names))


def pspec(spec) -> P:
    return P(*[None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))
               for axes in spec])


def build(prog: Program):
    """(reference function, jitted shard_map function) of a program, from its source."""
    src = prog.source()
    ns: dict = {"jax": jax, "jnp": jnp, "lax": lax, "P": P}
    exec(compile(src, "fuzz_program.py", "exec"), ns)  # noqa: S102 - the generated program
    mesh = jax_mesh(prog.mesh)
    sharded = jax.jit(jax.shard_map(
        ns["body"], mesh=mesh, in_specs=tuple(pspec(s) for s in prog.in_specs("shard")),
        out_specs=pspec(prog.out("shard")), check_vma=False))
    return ns["reference"], sharded


def inputs(prog: Program, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for a in prog.args:
        if a.init == "positive":
            x = rng.uniform(0.5, 1.5, a.shape)
        elif a.init == "weight":
            x = rng.standard_normal(a.shape) / np.sqrt(max(a.fan, 1))
        else:
            x = rng.standard_normal(a.shape)
        out.append(np.asarray(x, dtype=np.float32))
    return out


def sharded_avals(prog: Program):
    mesh = jax_mesh(prog.mesh)
    return [jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=NamedSharding(mesh, pspec(s)))
            for a, s in zip(prog.args, prog.in_specs("shard"))]


def reference_avals(prog: Program):
    return [jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in prog.args]


def lower_reference(ref_fn, prog: Program) -> str:
    return jax.jit(ref_fn).lower(*reference_avals(prog)).as_text(debug_info=True)


def fast_compiled(jitted, avals):
    """`jitted` compiled for `avals` without XLA's backend optimisations (`FAST_COMPILE`: the
    programs run a few times on small inputs; XLA's optimising takes most of a run's time)."""
    return jitted.lower(*avals).compile(compiler_options=FAST_COMPILE)


def run_sharded(sharded, prog: Program, args, compiled=None) -> np.ndarray:
    """The sharded program's result on `args` (`compiled`: its `fast_compiled` form, if made)."""
    mesh = jax_mesh(prog.mesh)
    placed = [jax.device_put(x, NamedSharding(mesh, pspec(s)))
              for x, s in zip(args, prog.in_specs("shard"))]
    if compiled is None:
        compiled = fast_compiled(sharded, sharded_avals(prog))
    return np.asarray(compiled(*placed))


def compare(ref: np.ndarray, shd: np.ndarray) -> tuple[bool, float]:
    """(match, max abs error / scale)."""
    if ref.shape != shd.shape:
        return False, float("inf")
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    err = float(np.max(np.abs(ref - shd))) / scale if ref.size else 0.0
    ok = bool(np.allclose(shd, ref, rtol=RTOL, atol=ATOL * scale))
    return ok, err


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    """Stop the check. Python swallows an exception raised inside a callback it runs for a C
    library (jax's GC callback prints "Exception ignored"), so the alarm re-arms itself every
    second until `timed_check` cancels it."""
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    raise _Timeout()


def timed_check(ref_text: str, shd_text: str, verify_rules: bool, timeout: int = CHECK_TIMEOUT):
    """(report or None, error kind or None, message). Never raises."""
    use_alarm = timeout and hasattr(signal, "SIGALRM")
    if use_alarm:
        try:
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(timeout)
        except ValueError:   # not the main thread
            use_alarm = False
    try:
        report = check_texts(ref_text, shd_text, ref_file="reference.mlir",
                             sharded_file="sharded.mlir", verify_rules=verify_rules)
        return report, None, ""
    except _Timeout:
        return None, "timeout", f"check did not finish in {timeout}s"
    except InputError as err:
        return None, "input_error", err.render()
    except RecursionError as err:
        return None, "crash", f"RecursionError: {err}"
    except Exception as err:  # noqa: BLE001 - every other exception is a crash to report
        return None, "crash", "".join(traceback.format_exception(err))[-3000:]
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


@dataclass
class Outcome:
    seed: object
    correct: bool
    mutation: str | None
    status: str
    mesh: str
    message: str = ""
    error: float = 0.0
    verify_rules: str = ""          # verdict with verify_rules=True, when sampled
    seconds: float = 0.0
    check_seconds: float = 0.0
    constructs: tuple = ()
    source: str = ""
    diag_op: str = ""
    claim: str = ""
    """Of a program whose numbers match but that is not proven ("incomplete"), when a
    diagnostic claims a bug, what `entangle check`'s confirmation makes of it
    (`confirm_claims`)."""

    def to_json(self) -> dict:
        return asdict(self)


def confirm_claims(report, ref_text: str, shd_text: str) -> str:
    """What becomes of the bug claims of a report whose program computed the reference's
    numbers on the fuzzer's inputs (the fuzzers judge by execution, and check without
    confirmation): "" without a claim; "withdrawn" when `entangle check`'s confirmation
    withdraws every one; "confirmed" when it found inputs on which the outputs differ (a mutant
    the fuzzer's inputs took for equivalent is not; on a correct-by-construction program that
    is a false bug report); "stands" when a claim survives without that (a false bug report)."""
    if report is None or not any(is_claim(d) for d in report.diagnostics):
        return ""
    confirm_texts(report, ref_text, shd_text, at_op=False)
    claims = [d for d in report.diagnostics if is_claim(d)]
    if not claims:
        return "withdrawn"
    shown = any(is_confirmed(d) for d in claims)
    return "confirmed" if shown else "stands"


def false_bug_report(outcome: dict) -> bool:
    """A bug claim `entangle check` would print on a program that computes the reference's
    numbers: any on a correct-by-construction program, one not shown by running on a mutant."""
    claim = outcome.get("claim", "")
    return claim == "stands" or (outcome["correct"] and claim == "confirmed")


@dataclass
class _Base:
    prog: Program
    ref_fn: object
    ref_text: str
    ref_outs: list = field(default_factory=list)   # per input seed
    compiled: object = None                         # the reference, `fast_compiled`


def _ref_out(base: _Base, k: int) -> np.ndarray:
    while len(base.ref_outs) <= k:
        args = inputs(base.prog, len(base.ref_outs))
        if base.compiled is None:
            base.compiled = fast_compiled(jax.jit(base.ref_fn), reference_avals(base.prog))
        base.ref_outs.append(np.asarray(base.compiled(*args)))
    return base.ref_outs[k]


def run_program(prog: Program, base: _Base | None = None, verify_rules_sample: bool = False,
                timeout: int = CHECK_TIMEOUT, same_shape: bool = False) -> Outcome:
    """Build, lower, execute and check one program (a mutant reuses its base's reference).
    `same_shape`: a mutant whose global result shape differs from the reference's is `invalid`
    (those are trivially rejected as bad input; the fuzzer keeps only a share of them)."""
    start = time.perf_counter()
    out = Outcome(prog.seed, prog.correct, prog.mutation, "", prog.mesh.describe(),
                  constructs=prog.constructs, source=prog.source())
    try:
        ref_fn, sharded = build(prog)
        if base is None:
            base = _Base(prog, ref_fn, lower_reference(ref_fn, prog))
        lowered = sharded.lower(*sharded_avals(prog))
        if same_shape and tuple(lowered.out_info.shape) != tuple(prog.out_shape):
            raise ValueError(f"mutant changes the result shape to {lowered.out_info.shape}")
        shd_text = lowered.as_text(debug_info=True)
        ref = _ref_out(base, 0)
        compiled = lowered.compile(compiler_options=FAST_COMPILE)
        shd = run_sharded(sharded, prog, inputs(prog, 0), compiled)
    except Exception as err:  # noqa: BLE001 - jax rejects the program: not a checker problem
        out.status = "invalid" if not prog.correct else "gen_error"
        out.message = f"{type(err).__name__}: {str(err)[:500]}"
        out.seconds = time.perf_counter() - start
        return out
    finite = bool(np.all(np.isfinite(ref)))
    match, err = compare(ref, shd) if finite else (None, 0.0)
    out.error = err
    t0 = time.perf_counter()
    report, kind, msg = timed_check(base.ref_text, shd_text, verify_rules=False, timeout=timeout)
    out.check_seconds = time.perf_counter() - t0
    if report is not None and report.diagnostics:
        d = report.diagnostics[0]
        out.message = d.message
        out.diag_op = getattr(getattr(d, "location", None), "op_name", "") or ""
    elif kind:
        out.message = msg
    proven = report is not None and report.proven
    if verify_rules_sample:
        vr, vkind, vmsg = timed_check(base.ref_text, shd_text, verify_rules=True,
                                      timeout=timeout)
        out.verify_rules = (vr.verdict if vr is not None else vkind) or ""
        if vr is not None and vr.mode:
            out.verify_rules += f" ({vr.mode})"
        if vr is not None and vr.proven and match is False:
            proven = True   # a false proof with the Z3 rule checks on is still a false proof
        if vkind in ("crash", "timeout") and not kind:
            kind, msg = vkind, "verify_rules=True: " + vmsg
            out.message = msg
    if kind in ("crash", "timeout"):
        out.status = kind
    elif not finite:
        out.status = "nonfinite"
    elif kind == "input_error":
        out.status = "rejected" if not match else "input_error"
    elif proven and not match:
        # A float tie (a comparison or max on a reordered sum) can flip one element: look again
        # on two other inputs before calling it a false proof; keep it visible either way.
        again = [compare(_ref_out(base, k),
                         run_sharded(sharded, prog, inputs(prog, k), compiled))[0]
                 for k in (1, 2)]
        out.status = "flaky" if all(again) else "false_proof"
    elif proven:
        out.status = "proven"
    elif match:
        out.status = "incomplete"
        out.claim = confirm_claims(report, base.ref_text, shd_text)
    else:
        out.status = "caught"
    if prog.correct and match is False and out.status not in ("false_proof", "flaky"):
        out.message = f"[numbers differ on a correct-by-construction program] {out.message}"
    out.seconds = time.perf_counter() - start
    return out


def run_seed(seed: int, mutants: int = 1, opts: GenOptions | None = None,
             verify_rules_every: int = 10, timeout: int = CHECK_TIMEOUT) -> list[Outcome]:
    """The program of `seed` and up to `mutants` of its (valid) mutants."""
    prog = generate(RandomChooser(seed), opts, seed=seed)
    sample = bool(verify_rules_every) and seed % verify_rules_every == 0
    results = []
    try:
        ref_fn, _ = build(prog)
        base = _Base(prog, ref_fn, lower_reference(ref_fn, prog))
    except Exception as err:  # noqa: BLE001
        return [Outcome(seed, True, None, "gen_error", prog.mesh.describe(),
                        message=f"{type(err).__name__}: {str(err)[:500]}",
                        source=prog.source(), constructs=prog.constructs)]
    results.append(run_program(prog, base, sample, timeout))
    ch = RandomChooser(seed * 7919 + 17)
    made = 0
    for _ in range(8 * mutants):
        if made >= mutants:
            break
        mut = mutate(prog, ch)
        if mut is None:
            break
        o = run_program(mut, base, sample, timeout, same_shape=not ch.chance(0.15))
        if o.status == "invalid":
            continue
        results.append(o)
        made += 1
    return results


def explain_seed(seed: int, mutation: str | None = None, opts: GenOptions | None = None,
                 verify_rules: bool = False) -> str:
    """The program of `seed` (or its mutant whose description is `mutation`, as the benchmark
    prints it), entangle's report and whether the numbers match: reproduces a fuzz finding."""
    from dataclasses import replace as _replace

    from fuzz.gen import program_mutations

    prog = generate(RandomChooser(seed), opts, seed=seed)
    if mutation is not None:
        found = [(d, f) for d, f in program_mutations(prog) if d == mutation] or \
                [(d, f) for d, f in program_mutations(prog) if mutation in d]
        if not found:
            raise SystemExit(f"seed {seed} has no mutation like {mutation!r}")
        desc, apply = found[0]
        prog = _replace(apply(prog), mutation=desc)
    ref_fn, sharded = build(prog)
    ref_text = lower_reference(ref_fn, prog)
    shd_text = sharded.lower(*sharded_avals(prog)).as_text(debug_info=True)
    report = check_texts(ref_text, shd_text, ref_file="reference.mlir",
                         sharded_file="fuzz_program.py", verify_rules=verify_rules)
    args = inputs(prog, 0)
    ref = np.asarray(jax.jit(ref_fn)(*args))
    shd = run_sharded(sharded, prog, args)
    match, err = compare(ref, shd)
    return (f"{prog.source()}\n--- numbers {'match' if match else 'DIFFER'} (error {err:.3g})\n"
            f"--- entangle:\n{report.render_text()}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="reproduce one fuzz program: "
                                 "python -m fuzz.run SEED [--mutation DESC]")
    ap.add_argument("seed", type=int)
    ap.add_argument("--mutation", default=None,
                    help="the mutant's description as the benchmark prints it (or a substring)")
    ap.add_argument("--verify-rules", action="store_true")
    a = ap.parse_args()
    print(explain_seed(a.seed, a.mutation, verify_rules=a.verify_rules))
