"""Mutation testing over the catalogue's correct examples: every single-site mutant of the
sharded StableHLO text (`mlir_mutate.mutants`) is compiled and executed on simulated devices
and checked; a mutant whose numbers differ must not be proven.

    from fuzz.mutation import run_example
    outcomes = run_example(by_name("megatron_mlp_tp4"))

Statuses are those of `fuzz.run` (`proven`, `false_proof`, `caught`, `rejected`,
`incomplete`, `crash`, `timeout`, `invalid`, `flaky`); an equivalent mutant not proven
whose bug claim survives `entangle check`'s confirmation is a false bug report (`claim`).
Importing this module imports jax.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import jax
import numpy as np

from entangle_mlir.evidence import FAST_COMPILE
from fuzz.mlir_mutate import mutants
from fuzz.run import CHECK_TIMEOUT, compare, confirm_claims, timed_check


@dataclass
class MutantOutcome:
    example: str
    mutation: str
    status: str
    message: str = ""
    error: float = 0.0
    seconds: float = 0.0
    text: str = ""
    claim: str = ""
    """Of an equivalent mutant not proven: what confirmation does to its bug claims
    (`fuzz.run.confirm_claims`; "stands" is a false bug report, "confirmed" a mutant that
    differs on inputs other than the executor's)."""

    def to_json(self) -> dict:
        return asdict(self)


class _Executor:
    """Compiles mutated module text with the example's original lowering (same signature and
    shardings) and runs it."""

    def __init__(self, ex):
        from examples import catalog

        self.ex = ex
        self.lowered = catalog.sharded_fn(ex).lower(*catalog._avals(ex, True))
        self.text = self.lowered.as_text(debug_info=True)
        self.ref_text = catalog.reference_fn(ex).lower(*catalog._avals(ex, False)).as_text(
            debug_info=True)
        self.inputs = {}
        self.ref_outs = {}

    def _args(self, seed: int):
        from jax.sharding import NamedSharding

        from examples import catalog

        if seed not in self.inputs:
            args = catalog.random_inputs(self.ex, seed)
            ref = catalog.reference_fn(self.ex)(*args)
            self.ref_outs[seed] = [np.asarray(o) for o in jax.tree.leaves(ref)]
            mesh = catalog.make_mesh(self.ex)
            self.inputs[seed] = [jax.device_put(a, NamedSharding(mesh, spec))
                                 for a, spec in zip(args, self.ex.in_specs, strict=True)]
        return self.inputs[seed]

    def compile(self, text: str):
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib.mlir import ir

        comp = self.lowered._lowering
        saved = comp._hlo
        try:
            with jmlir.make_ir_context():
                comp._hlo = ir.Module.parse(text)
            comp._executable = None
            return self.lowered.compile(compiler_options=FAST_COMPILE)
        finally:
            comp._hlo = saved
            comp._executable = None

    def run(self, compiled, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
        out = compiled(*self._args(seed))
        return self.ref_outs[seed], [np.asarray(o) for o in jax.tree.leaves(out)]


def _match(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[bool | None, float]:
    if len(ref) != len(got):
        return False, float("inf")
    worst, ok = 0.0, True
    for r, g in zip(ref, got):
        if not np.all(np.isfinite(r)):
            return None, 0.0
        m, err = compare(r, g)
        ok = ok and m
        worst = max(worst, err)
    return ok, worst


def run_example(ex, limit: int | None = None, timeout: int = CHECK_TIMEOUT,
                keep_text: bool = False, select=None) -> list[MutantOutcome]:
    """Every mutant of an example (or the first `limit`, or those `select(desc)` keeps)."""
    exe = _Executor(ex)
    base = exe.compile(exe.text)
    ref, got = exe.run(base)
    ok, err = _match(ref, got)
    assert ok, f"{ex.name}: the unmutated program does not reproduce the reference ({err})"
    results = []
    for desc, text in mutants(exe.text):
        if select is not None and not select(desc):
            continue
        if limit is not None and len(results) >= limit:
            break
        start = time.perf_counter()
        out = MutantOutcome(ex.name, desc, "", text=text if keep_text else "")
        try:
            compiled = exe.compile(text)
            ref, got = exe.run(compiled)
        except Exception as e:  # noqa: BLE001 - the mutant does not verify or compile
            out.status = "invalid"
            out.message = f"{type(e).__name__}: {str(e)[:300]}"
            out.seconds = time.perf_counter() - start
            results.append(out)
            continue
        match, out.error = _match(ref, got)
        report, kind, msg = timed_check(exe.ref_text, text, verify_rules=False, timeout=timeout)
        if report is not None and report.diagnostics:
            out.message = report.diagnostics[0].message
        elif kind:
            out.message = msg
        if kind in ("crash", "timeout"):
            out.status = kind
        elif match is None:
            out.status = "nonfinite"
        elif kind == "input_error":
            out.status = "rejected" if not match else "input_error"
        elif report.proven and not match:
            again = []
            for seed in (1, 2):
                r, g = exe.run(compiled, seed)
                again.append(bool(_match(r, g)[0]))
            out.status = "flaky" if all(again) else "false_proof"
        elif report.proven:
            out.status = "proven"
        elif match:
            out.status = "incomplete"
            out.claim = confirm_claims(report, exe.ref_text, text)
        else:
            out.status = "caught"
        if out.status in ("false_proof", "crash", "timeout", "flaky") or out.claim == "stands":
            out.text = text
        out.seconds = time.perf_counter() - start
        results.append(out)
    return results


def score(outcomes) -> dict:
    """caught / differing mutants, and the other counts."""
    from collections import Counter

    c = Counter(o.status if isinstance(o, MutantOutcome) else o["status"] for o in outcomes)
    claims = Counter(o.claim if isinstance(o, MutantOutcome) else o.get("claim", "")
                     for o in outcomes)
    differing = c["caught"] + c["rejected"] + c["false_proof"]
    return {
        "false_bug_reports": claims["stands"],
        "claims_withdrawn": claims["withdrawn"],
        "shown_different": claims["confirmed"],
        "mutants": sum(c.values()),
        "invalid": c["invalid"],
        "differing": differing,
        "caught": c["caught"] + c["rejected"],
        "false_proofs": c["false_proof"],
        "equivalent_proven": c["proven"],
        "equivalent_not_proven": c["incomplete"],
        "crashes": c["crash"] + c["timeout"],
        "input_errors": c["input_error"],
        "flaky": c["flaky"],
        "nonfinite": c["nonfinite"],
        "score_pct": 100.0 * (c["caught"] + c["rejected"]) / max(1, differing),
    }
